# SPDX-License-Identifier: Apache-2.0
"""Fidelity on real weights: each known model from a warm cache, through its family's loader and the
host reference forward (``models.common.reference``), against transformers on the same checkpoint.

* bfloat16 cache: 16 greedy tokens equal transformers' on every prompt (an instruct model's prompt
  through its chat template). Checked in one forward over the prompt and transformers' 16 tokens:
  the argmax at each position must be the next of those tokens. That is the same check as 16
  greedy steps (each step sees exactly the tokens the previous ones chose), 16 times cheaper;
* bfloat8_b cache: logits PCC >= 0.99 on every prompt, and the first greedy token equal;
* on meshes 1x1 and 1x2 (N300), and every warm tensor bit-identical to the cold build's.

transformers runs in float32 on the bf16 checkpoint (the reference forward is float32 too), once
per model, and is freed before the caches are built: the 1.5B model's float32 copy alone is 7 GB.
The default suite keeps one bfloat16 and one bfloat8_b case of the models ``requirements.txt``
installs; the rest are ``slow`` (all run under ``scripts/run_real_model_tests.sh``).
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from models.common.reference import ReferenceDecoder
from models.common.tensor_cache import host_shards
from models.common.weight_cache import DEFAULT_FORCE_ENV
from models.demos.real_models.known import KnownModel
from models.demos.real_models.prepare import prepare_model
from models.registry import loader_class
from tests.real_models.conftest import model_params

STEPS = 16
PROMPTS = {
    False: ["The capital of France is", "def fibonacci(n):", "Water boils at"],
    True: ["What is the capital of France?", "Write a Python function that reverses a string.",
           "Explain in one sentence what a hash table is."],
}
# Models whose float32 copy of every weight is kept by the reference forward; bigger ones widen
# each weight to float32 per use (half the memory, somewhat slower).
KEEP_FP32_BELOW_BYTES = 600 << 20
CASES = [
    pytest.param("bfloat16", (1, 1), id="bfloat16-1x1"),
    pytest.param("bfloat16", (1, 2), id="bfloat16-1x2", marks=pytest.mark.slow),
    pytest.param("bfloat8_b", (1, 1), id="bfloat8_b-1x1", marks=pytest.mark.slow),
    pytest.param("bfloat8_b", (1, 2), id="bfloat8_b-1x2"),
]


@dataclass
class Expected:
    """transformers' results on one model's prompts."""

    prompts: list[list[int]]
    logits: list[torch.Tensor]  # [T, vocab] of each prompt
    greedy: list[list[int]]  # STEPS tokens after each prompt


def prompt_ids(tokenizer, model: KnownModel, text: str) -> list[int]:
    if model.chat:
        encoded = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                tokenize=True, return_dict=True)
        return list(encoded["input_ids"])
    return list(tokenizer(text).input_ids)


@torch.no_grad()
def hf_greedy(hf, ids: list[int], steps: int) -> list[int]:
    """transformers' greedy decoding (its KV cache, as ``generate`` does), never stopping at EOS."""
    out = hf(torch.tensor([ids]), use_cache=True)
    tokens = []
    for step in range(steps):
        tokens.append(int(out.logits[0, -1].argmax()))
        if step + 1 < steps:
            out = hf(torch.tensor([tokens[-1:]]), cache=out.cache, use_cache=True)
    return tokens


@pytest.fixture(scope="module")
def snapshot(model: KnownModel) -> Path:
    return prepare_model(model.name)


@pytest.fixture(scope="module")
def expected(model: KnownModel, snapshot: Path) -> Expected:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(snapshot)
    prompts = [prompt_ids(tokenizer, model, text) for text in PROMPTS[model.chat]]
    hf = AutoModelForCausalLM.from_pretrained(snapshot, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = [hf(torch.tensor([ids])).logits[0] for ids in prompts]
    greedy = [hf_greedy(hf, ids, STEPS) for ids in prompts]
    del hf
    gc.collect()
    return Expected(prompts, logits, greedy)


def warm_after_cold(model: KnownModel, snapshot: Path, cache_root: Path, precision: str, mesh: tuple[int, int]):
    """Cold-build a fresh cache, load it warm, check every warm tensor against the cold one; the warm load."""
    os.environ.pop(DEFAULT_FORCE_ENV, None)
    loader = loader_class(model.family)
    cold = loader(str(snapshot), precision=precision, mesh_shape=mesh, cache_root=cache_root).load()
    warm = loader(str(snapshot), precision=precision, mesh_shape=mesh, cache_root=cache_root).load()
    assert not cold.warm and warm.warm, (cold.reason, warm.reason)
    assert set(warm.weights) == set(cold.weights) and set(warm.host_weights) == set(cold.host_weights)
    for name in cold.weights:
        for ours, theirs in zip(host_shards(warm.weights[name]), host_shards(cold.weights[name]), strict=True):
            assert torch.equal(ours, theirs), f"{name}: the warm tensor differs from the cold build's"
    for name, value in cold.host_weights.items():
        assert torch.equal(warm.host_weights[name], value), f"host weight {name} differs from the cold build's"
    del cold
    gc.collect()
    return warm


def pcc(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.corrcoef(torch.stack([a.flatten().double(), b.flatten().double()]))[0, 1].item()


@pytest.mark.parametrize("model", model_params(), scope="module")
@pytest.mark.parametrize(("precision", "mesh"), CASES)
def test_warm_cache_matches_transformers(model, precision, mesh, snapshot, expected, tmp_path):
    warm = warm_after_cold(model, snapshot, tmp_path / "cache", precision, mesh)
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
