# SPDX-License-Identifier: Apache-2.0
"""Fidelity on real weights: each known model from a warm cache, through its family's loader and the
host reference forward (``models.common.reference``), against transformers on the same checkpoint.

* bfloat16 cache: 16 greedy tokens equal transformers' on every prompt (an instruct model's prompt
  through its chat template). Checked in one forward over the prompt and transformers' 16 tokens:
  the argmax at each position must be the next of those tokens. That is the same check as 16
  greedy steps (each step sees exactly the tokens the previous ones chose), 16 times cheaper;
* bfloat8_b cache: logits PCC >= 0.99 on every prompt, and the first greedy token equal;
* on meshes 1x1, 1x2 (N300), 1x8 (T3K) and 8x4 (Galaxy), and every warm tensor bit-identical to the cold build's (built
  in a child process, ``cold_build``, which reports a digest of every tensor it built).

transformers runs in float32 on the bf16 checkpoint (the reference forward is float32 too), once
per model, in a process of its own (``transformers_side``): the 1.5B model's float32 copy alone is
7 GB, which must be gone before the caches are built and read.
The default suite keeps one bfloat16 and one bfloat8_b case of the models ``requirements.txt``
installs; the rest are ``slow`` (all run under ``scripts/run_real_model_tests.sh``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from models.common.reference import ReferenceDecoder
from models.common.weight_cache import DEFAULT_FORCE_ENV
from models.demos.real_models.known import KnownModel
from models.demos.real_models.prepare import prepare_model
from models.registry import loader_class
from models.testing import REPO_ROOT
from tests.ttnn.real_models.cold_build import model_digests
from tests.ttnn.real_models.conftest import model_params

STEPS = 16
PROMPTS = {
    False: ["The capital of France is", "def fibonacci(n):", "Water boils at"],
    True: ["What is the capital of France?", "Write a Python function that reverses a string.",
           "Explain in one sentence what a hash table is."],
}
# Models whose float32 copy of every weight the reference forward keeps; bigger ones read each weight
# back per use (three forwards per case: cheaper than holding 4 bytes a parameter).
KEEP_FP32_BELOW_BYTES = 600 << 20
CASES = [
    pytest.param("bfloat16", (1, 1), id="bfloat16-1x1"),
    pytest.param("bfloat16", (1, 2), id="bfloat16-1x2", marks=pytest.mark.slow),
    pytest.param("bfloat8_b", (1, 1), id="bfloat8_b-1x1", marks=pytest.mark.slow),
    pytest.param("bfloat8_b", (1, 2), id="bfloat8_b-1x2"),
    # a T3K and a Galaxy: heads that do not divide their columns, padded with zero heads
    pytest.param("bfloat16", (1, 8), id="bfloat16-1x8", marks=pytest.mark.slow),
    pytest.param("bfloat16", (8, 4), id="bfloat16-8x4", marks=pytest.mark.slow),
]


@dataclass
class Expected:
    """transformers' results on one model's prompts."""

    prompts: list[list[int]]
    logits: list[torch.Tensor]  # [T, vocab] of each prompt
    greedy: list[list[int]]  # STEPS tokens after each prompt


@pytest.fixture(scope="module")
def snapshot(model: KnownModel) -> Path:
    return prepare_model(model.name)


@pytest.fixture(scope="module")
def expected(model: KnownModel, snapshot: Path, tmp_path_factory) -> Expected:
    return Expected(**transformers_reference(model, snapshot, tmp_path_factory.mktemp("transformers"), STEPS))


def transformers_reference(model: KnownModel, snapshot: Path, scratch: Path, steps: int) -> dict:
    """transformers' logits and ``steps`` greedy tokens for each of the model's prompts, computed
    in a child process (its own float32 torch, no hub)."""
    out = scratch / "expected.pt"
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO_ROOT))
    subprocess.run([sys.executable, "-m", "tests.ttnn.real_models.transformers_side", str(snapshot), model.name, str(out),
                    str(steps), *PROMPTS[model.chat]], cwd=REPO_ROOT, env=env, check=True, timeout=1800)
    return torch.load(out)


def warm_after_cold(model: KnownModel, snapshot: Path, cache_root: Path, precision: str, mesh: tuple[int, int]):
    """Cold-build a fresh cache in a child process, load it warm here; every warm tensor must have the
    digest of the cold build's. Returns the warm load."""
    report = cache_root.parent / "cold.json"
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO_ROOT))
    env.pop(DEFAULT_FORCE_ENV, None)
    subprocess.run([sys.executable, "-m", "tests.ttnn.real_models.cold_build", str(snapshot), model.family, precision,
                    f"{mesh[0]}x{mesh[1]}", str(cache_root), str(report)], cwd=REPO_ROOT, env=env, check=True,
                   timeout=1800)
    cold = json.loads(report.read_text())
    assert not cold["warm"], cold["reason"]
    os.environ.pop(DEFAULT_FORCE_ENV, None)
    warm = loader_class(model.family)(str(snapshot), precision=precision, mesh_shape=mesh, cache_root=cache_root).load()
    assert warm.warm, warm.reason
    digests = model_digests(warm)
    assert sorted(digests) == sorted(cold["digests"])
    different = [name for name, digest in digests.items() if digest != cold["digests"][name]]
    assert not different, f"{len(different)} warm tensors differ from the cold build's, e.g. {different[0]}"
    return warm


def pcc(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.corrcoef(torch.stack([a.flatten().double(), b.flatten().double()]))[0, 1].item()


@pytest.mark.parametrize("model", model_params(), scope="module")
@pytest.mark.parametrize(("precision", "mesh"), CASES)
def test_warm_cache_matches_transformers(model, precision, mesh, snapshot, expected, scratch):
    warm = warm_after_cold(model, snapshot, scratch / "cache", precision, mesh)
    reference = ReferenceDecoder(warm, keep_fp32=model.size < KEEP_FP32_BELOW_BYTES)
    report = []
    for ids, theirs, tokens in zip(expected.prompts, expected.logits, expected.greedy, strict=True):
        forced = reference.logits(ids + tokens[:-1])  # the prompt, then transformers' greedy tokens
        ours, chosen = forced[: len(ids)], forced[len(ids) - 1 :].argmax(-1).tolist()
        report.append(f"pcc {pcc(ours, theirs):.6f} max|d| {(ours - theirs).abs().max().item():.2e} "
                      f"greedy {sum(a == b for a, b in zip(chosen, tokens))}/{STEPS}")
        if precision == "bfloat16":
            assert chosen == tokens, f"{len(ids)}-token prompt: {report[-1]}"
        else:
            assert pcc(ours, theirs) >= 0.99, report[-1]
            assert chosen[0] == tokens[0], report[-1]
    print(f"{model.name} {precision} {mesh[0]}x{mesh[1]}: " + "; ".join(report))
