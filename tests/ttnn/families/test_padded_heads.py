# SPDX-License-Identifier: Apache-2.0
"""Attention heads that do not divide the mesh: KV heads padded with zero heads (SmolLM2-135M's
9 query / 3 KV heads on an N300's 2 columns).

Tiny random-weight checkpoints made with transformers' own config classes; the host reference
forward reads the cached tensors and must give transformers' logits. The padding heads' weights,
biases and ``wo`` rows must be exactly zero, so they add nothing to the sum over columns."""

from __future__ import annotations

from pathlib import Path

import pytest

from models.common.heads import column_heads
from models.common.reference import ReferenceDecoder
from models.common.weight_cache.tensor_cache import host_shards
from models.registry import loader_class
from models.testing.tiny_models import hf_greedy, hf_logits, make_checkpoint, pcc

PROMPT = [3, 17, 99, 250, 7, 42, 300, 11]
# (family, query heads, KV heads): GQA groups of 3 (SmolLM2) and 2, Qwen2 with its q/k/v biases
MODELS = [("llama", 9, 3), ("llama", 10, 5), ("qwen2", 6, 3)]
# (model, mesh columns): 5 KV heads on 4 columns pad to 8, so the last column holds padding only
CASES = [(MODELS[0], 2), (MODELS[1], 2), (MODELS[1], 4), (MODELS[2], 2)]
# SmolLM2-135M's heads on a T3K and a Galaxy: query heads padded too (fewer KV heads than columns)
MESH_CASES = [(MODELS[0], (1, 8)), (MODELS[0], (8, 4)), (MODELS[2], (1, 8)), (MODELS[2], (8, 4))]


def test_column_heads_pad_kv_heads_to_a_multiple_of_the_columns() -> None:
    columns = column_heads(9, 3, 2)
    assert [c.kv for c in columns] == [(0, 1), (2, None)]
    assert [c.q for c in columns] == [(0, 1, 2, 3, 4, 5), (6, 7, 8, None, None, None)]
    assert [c.q_to_kv for c in columns] == [(0, 0, 0, 1, 1, 1)] * 2
    even = column_heads(8, 2, 2)  # divisible: consecutive heads, no padding
    assert [c.q for c in even] == [(0, 1, 2, 3), (4, 5, 6, 7)] and not any(c.padded for c in even)
    with pytest.raises(ValueError, match="9 attention heads are not a whole number of groups of 2 KV heads"):
        column_heads(9, 2, 4)


def test_column_heads_pad_query_heads_when_kv_heads_are_fewer_than_the_columns() -> None:
    t3k = column_heads(9, 3, 8)  # SmolLM2-135M on a T3K: 3 KV heads as 4, each over 2 columns
    assert [c.kv for c in t3k] == [(0,), (0,), (1,), (1,), (2,), (2,), (None,), (None,)]
    assert [c.q for c in t3k] == [(0, 1), (2, None), (3, 4), (5, None), (6, 7), (8, None), (None, None),
                                  (None, None)]
    assert all(c.q_to_kv == (0, 0) for c in t3k)
    galaxy = column_heads(9, 3, 4)  # on a Galaxy's 4 columns: one KV head each, the last padding
    assert [c.q for c in galaxy] == [(0, 1, 2), (3, 4, 5), (6, 7, 8), (None, None, None)]
    assert [c.kv for c in galaxy] == [(0,), (1,), (2,), (None,)]
    gemma = column_heads(4, 1, 8)  # Gemma 3 270M on a T3K: one KV head on every column
    assert [c.q for c in gemma] == [(0,), (1,), (2,), (3,)] + [(None,)] * 4 and {c.kv for c in gemma} == {(0,)}
    # the even layouts are the plain ones (caches built before padding existed keep their layout)
    assert [c.q for c in column_heads(8, 2, 4)] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert [c.kv for c in column_heads(8, 2, 4)] == [(0,), (0,), (1,), (1,)]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[tuple, Path]:
    root = tmp_path_factory.mktemp("padded")
    # Qwen2's width stays 256 (head_dim 42, not a multiple of the tile)
    return {(family, heads, kv): make_checkpoint(family, root / f"{family}-{heads}-{kv}", num_attention_heads=heads,
                                                 num_key_value_heads=kv, head_dim=32,
                                                 hidden_size=256 if family == "qwen2" else 32 * heads)
            for family, heads, kv in MODELS}


@pytest.mark.parametrize(("model", "cols"), CASES, ids=[f"{f}-{h}q-{k}kv-1x{c}" for (f, h, k), c in CASES])
def test_padded_layout_reproduces_transformers_logits(model, cols, checkpoints, tmp_path) -> None:
    family, heads, kv = model
    mesh = (1, cols)
    checkpoint = checkpoints[model]
    loader = loader_class(family)
    loader(checkpoint, precision="bfloat16", mesh_shape=mesh, cache_root=tmp_path).load()
    warm = loader(checkpoint, precision="bfloat16", mesh_shape=mesh, cache_root=tmp_path).load()
    assert warm.warm
    error = (ReferenceDecoder(warm).logits(PROMPT) - hf_logits(checkpoint, PROMPT)).abs().max().item()
    assert error < 1e-4, error

    columns = column_heads(heads, kv, mesh[1])
    head_dim, width = warm.args.head_dim, warm.args.dim
    for c, (column, wqkv, wo) in enumerate(zip(columns, host_shards(warm.weights["layers.0.attention.wqkv"]),
                                               host_shards(warm.weights["layers.0.attention.wo"]))):
        slots = [*column.q, *column.kv, *column.kv]
        assert wqkv.shape[-1] == len(slots) * head_dim and wo.shape[-2] == len(column.q) * head_dim
        for i, head in enumerate(slots):
            block = wqkv[..., i * head_dim:(i + 1) * head_dim]
            assert (head is None) == bool((block == 0).all()), (c, i, head)
        for i, head in enumerate(column.q):
            rows = wo[..., i * head_dim:(i + 1) * head_dim, :width]
            assert (head is None) == bool((rows == 0).all()), (c, i, head)
        if family == "qwen2":
            bias = host_shards(warm.weights["layers.0.attention.bqkv"])[c].reshape(-1)[: len(slots) * head_dim]
            for i, head in enumerate(slots):
                if head is None:
                    assert bool((bias[i * head_dim:(i + 1) * head_dim] == 0).all())


def test_bfloat8_b_padded_layout_pcc(checkpoints, tmp_path) -> None:
    checkpoint = checkpoints[("llama", 9, 3)]
    loader = loader_class("llama")
    loader(checkpoint, precision="bfloat8_b", mesh_shape=(1, 2), cache_root=tmp_path).load()
    warm = loader(checkpoint, precision="bfloat8_b", mesh_shape=(1, 2), cache_root=tmp_path).load()
    assert warm.warm and pcc(ReferenceDecoder(warm).logits(PROMPT), hf_logits(checkpoint, PROMPT)) >= 0.999


@pytest.mark.parametrize(("model", "mesh"), MESH_CASES, ids=[f"{f}-{h}q-{k}kv-{r}x{c}" for (f, h, k), (r, c) in MESH_CASES])
def test_t3k_and_galaxy_layouts_give_transformers_greedy_tokens(model, mesh, checkpoints, tmp_path) -> None:
    """The fast form of the real-model T3K / Galaxy parity (tests/ttnn/real_models/test_parity.py)."""
    family, heads, kv = model
    checkpoint = checkpoints[model]
    loaded = loader_class(family)(checkpoint, precision="bfloat16", mesh_shape=mesh, cache_root=tmp_path).load()
    assert any(c.padded and None in c.q for c in column_heads(heads, kv, mesh[1]))
    reference = ReferenceDecoder(loaded)
    error = (reference.logits(PROMPT) - hf_logits(checkpoint, PROMPT)).abs().max().item()
    assert error < 1e-4, error
    assert reference.greedy(PROMPT, 4) == hf_greedy(checkpoint, PROMPT, 4)
