# SPDX-License-Identifier: Apache-2.0
"""A cold ``load()`` costs what a seed costs: it builds streaming, keeping no converted weight, and
hands back the new generation's tensors as a warm start reads them. Its tensors are the ones an
in-memory build makes (the path taken where the cache cannot be written), and its peak memory in
a fresh process stays within the seed's bound over the imports."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from models.registry import loader_class
from models.testing.llama_shaped import make_in_child
from models.testing.seed_child import run_seed_child
from models.testing.tiny_models import make_checkpoint, tensors_of

MiB = 1 << 20
LARGEST_WEIGHT = 32000 * 2048 * 2  # the llama-shaped embedding / LM head, bf16
PEAK_ALLOWANCE = 4 * LARGEST_WEIGHT + 128 * MiB  # the streaming seed's bound (tests/ttnn/seeding/test_seeding.py)


@pytest.mark.parametrize("family", ["llama", "gemma3", "qwen3_moe"])
@pytest.mark.parametrize("precision", ["bfloat16", "bfloat8_b"])
def test_a_cold_load_hands_back_the_tensors_an_in_memory_build_makes(family, precision, tmp_path):
    checkpoint = make_checkpoint(family, tmp_path / f"tiny-{family}")
    cls = loader_class(family)
    streamed = cls(checkpoint, precision=precision, cache_root=tmp_path / "cache", mesh_shape=(1, 2)).load()
    assert not streamed.warm and streamed.cached and "read_back" in streamed.timings
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the cache root would be: nothing can be cached")
    in_memory = cls(checkpoint, precision=precision, cache_root=blocked, mesh_shape=(1, 2)).load()
    assert not in_memory.cached and not in_memory.streamed
    ours, theirs = tensors_of(streamed), tensors_of(in_memory)
    assert ours.keys() == theirs.keys()
    for name, shards in ours.items():
        assert all(torch.equal(a, b) for a, b in zip(shards, theirs[name], strict=True)), name
    assert streamed.host_weights.keys() == in_memory.host_weights.keys()
    for name, tensor in streamed.host_weights.items():
        assert torch.equal(tensor, in_memory.host_weights[name]), name


@pytest.fixture(scope="module")
def one_layer_llama_shape(tmp_path_factory) -> Path:
    """A Llama-shaped checkpoint (hidden 2048, vocabulary 32000, untied head) of one layer, 0.45 GB:
    its embedding and head dominate, as at every model size."""
    return make_in_child(tmp_path_factory.mktemp("llama-shaped-1") / "llama-1-layer", 1)


def test_a_cold_load_peaks_within_the_seeds_bound(one_layer_llama_shape, tmp_path):
    for mode in ("seed", "load"):
        rc, report, err = run_seed_child(mode, one_layer_llama_shape, tmp_path / mode)
        assert rc == 0 and report and report["complete"], err
        added = report["peak"] - report["import_peak"]
        assert added <= PEAK_ALLOWANCE, (f"{mode} added {added / MiB:.0f} MiB over its imports "
                                         f"(bound {PEAK_ALLOWANCE / MiB:.0f})")
