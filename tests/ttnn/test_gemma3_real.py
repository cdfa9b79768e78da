# SPDX-License-Identifier: Apache-2.0
"""The real Gemma 3 270M through the loader: the cached tensors, read back, run the model.

The host reference forward reads every weight from the ttnn cache and must match transformers on
the same checkpoint: bfloat16 cache -> same greedy tokens and logit error within bf16 noise;
bfloat8_b -> PCC >= 0.99. The default run keeps one case of each; the rest are ``slow``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"

from models.common.reference import ReferenceDecoder  # noqa: E402
from models.common.weight_cache import DEFAULT_FORCE_ENV  # noqa: E402
from models.demos.gemma3_270m.prepare import prepare_gemma3_270m  # noqa: E402
from models.gemma import Gemma3Loader  # noqa: E402

pytestmark = pytest.mark.real_model
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at"]


@pytest.fixture(scope="module")
def snapshot() -> Path:
    return prepare_gemma3_270m()


@pytest.fixture(scope="module")
def hf(snapshot):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(snapshot, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(snapshot)


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("gemma3-cache")


def load(snapshot: Path, cache_root: Path, precision: str, mesh: tuple[int, int]):
    os.environ.pop(DEFAULT_FORCE_ENV, None)
    Gemma3Loader(snapshot, precision=precision, mesh_shape=mesh, cache_root=cache_root).load()
    warm = Gemma3Loader(snapshot, precision=precision, mesh_shape=mesh, cache_root=cache_root).load()
    assert warm.warm
    assert set(warm.host_weights) == {"tok_embeddings.weight"}  # served real from the sidecar
    return warm


def hf_logits(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf[0](torch.tensor([ids])).logits[0]


def hf_greedy(hf, ids: list[int], steps: int) -> list[int]:
    with torch.no_grad():
        out = hf[0].generate(torch.tensor([ids]), max_new_tokens=steps, do_sample=False)
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("mesh", [(1, 1), pytest.param((1, 2), marks=pytest.mark.slow)])
def test_bfloat16_warm_cache_matches_transformers(mesh, snapshot, hf, cache_root):
    reference = ReferenceDecoder(load(snapshot, cache_root, "bfloat16", mesh))
    tokenizer = hf[1]
    for prompt in PROMPTS:
        ids = tokenizer(prompt).input_ids
        error = (reference.logits(ids) - hf_logits(hf, ids)).abs().max().item()
        assert error < 0.05, f"{prompt!r}: max abs logit error {error}"
        assert reference.greedy(ids, 5) == hf_greedy(hf, ids, 5), prompt


@pytest.mark.parametrize("mesh", [pytest.param((1, 1), marks=pytest.mark.slow), (1, 2)])
def test_bfloat8_b_warm_cache_pcc(mesh, snapshot, hf, cache_root):
    reference = ReferenceDecoder(load(snapshot, cache_root, "bfloat8_b", mesh))
    ids = hf[1](PROMPTS[0]).input_ids
    ours, theirs = reference.logits(ids), hf_logits(hf, ids)
    pcc = torch.corrcoef(torch.stack([ours.flatten().double(), theirs.flatten().double()]))[0, 1].item()
    assert pcc >= 0.99
