# SPDX-License-Identifier: Apache-2.0
"""A cold ``load()`` costs what a seed costs: it builds streaming, keeping no converted weight, and
hands back the new generation's tensors as a warm start reads them. Its tensors are the ones an
in-memory build makes (the path taken where the cache cannot be written), with one conversion
worker or two, and its peak memory in a fresh process stays within the imports, the largest tensor
and half a GiB (plus one unit's working set per further worker)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from models.common.fileio import TEMP_MARK
from models.common.weight_cache import verify_weight_cache
from models.common.weight_cache.layout import GENERATION_PREFIX
from models.registry import loader_class
from models.testing.llama_shaped import make_in_child
from models.testing.seed_child import REPO_ROOT, assert_same_cache, child_env, run_seed_child, seed_command
from models.testing.tiny_models import make_checkpoint, tensors_of

MiB = 1 << 20
LARGEST_WEIGHT = 32000 * 2048 * 2  # the llama-shaped embedding / LM head, bf16
# the bound at any model size: the imports, the largest tensor once, and half a GiB
PEAK_ALLOWANCE = LARGEST_WEIGHT + 512 * MiB
WORKER_ALLOWANCE = 256 * MiB  # what each further conversion worker may add at this shape (one unit at a time)


@pytest.mark.parametrize("family", ["llama", "gemma3", "qwen3_moe"])
@pytest.mark.parametrize("precision", ["bfloat16", "bfloat8_b", "bfloat4_b"])
def test_a_cold_load_hands_back_the_tensors_an_in_memory_build_makes(family, precision, tmp_path):
    checkpoint = make_checkpoint(family, tmp_path / f"tiny-{family}")
    cls = loader_class(family)
    streamed = cls(checkpoint, precision=precision, cache_root=tmp_path / "cache", mesh_shape=(1, 2)).load()
    assert not streamed.warm and streamed.cached and "read_back" in streamed.timings
    _assert_same_tensors(streamed, _in_memory(cls, checkpoint, precision, (1, 2), tmp_path))


def _in_memory(cls, checkpoint: Path, precision: str, mesh, tmp_path: Path):
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the cache root would be: nothing can be cached")
    in_memory = cls(checkpoint, precision=precision, cache_root=blocked, mesh_shape=mesh).load()
    assert not in_memory.cached and not in_memory.streamed
    return in_memory


def _assert_same_tensors(ours, theirs) -> None:
    ours_t, theirs_t = tensors_of(ours), tensors_of(theirs)
    assert ours_t.keys() == theirs_t.keys()
    for name, shards in ours_t.items():
        assert all(torch.equal(a, b) for a, b in zip(shards, theirs_t[name], strict=True)), name
    assert ours.host_weights.keys() == theirs.host_weights.keys()
    for name, tensor in ours.host_weights.items():
        assert torch.equal(tensor, theirs.host_weights[name]), name


@pytest.mark.parametrize("family", ["llama", "gemma3", "qwen3_moe", "qwen2"])
def test_two_conversion_workers_write_the_files_one_writes(family, tmp_path):
    checkpoint = make_checkpoint(family, tmp_path / f"tiny-{family}")
    cls = loader_class(family)
    one = cls(checkpoint, precision="bfloat8_b", cache_root=tmp_path / "one", mesh_shape=(1, 2), workers=1)
    two = cls(checkpoint, precision="bfloat8_b", cache_root=tmp_path / "two", mesh_shape=(1, 2), workers=2)
    assert one.seed().complete
    result = two.seed()
    assert result.complete and not result.warm
    assert_same_cache(one.cache_dir, two.cache_dir, one.build_variant)


def test_a_failing_worker_stops_the_build_and_leaves_nothing(tmp_path, monkeypatch):
    """One worker's error (a full disk, a bad tensor) fails the whole build: the other worker stops at
    its next unit, the error is the first worker's, and the build transaction removes every file."""
    from models.common.weight_cache import tensor_cache

    checkpoint = make_checkpoint("llama", tmp_path / "tiny-llama")
    original = tensor_cache.TensorCache.as_tensor

    def failing(self, name, *args, **kwargs):
        if name == "layers.1.feed_forward.w2":
            raise OSError(28, "No space left on device (injected)")
        return original(self, name, *args, **kwargs)

    monkeypatch.setattr(tensor_cache.TensorCache, "as_tensor", failing)
    loader = loader_class("llama")(checkpoint, cache_root=tmp_path / "cache", mesh_shape=(1, 2), workers=2)
    with pytest.raises(OSError, match="injected"):
        loader.seed()
    assert not loader.status().warm
    left = [p.relative_to(loader.cache_dir) for p in loader.cache_dir.rglob("*") if p.is_file()]
    assert all(p.parts[0].startswith(".") and "tensorbin" not in p.name for p in left), left


@pytest.fixture(scope="module")
def one_layer_llama_shape(tmp_path_factory) -> Path:
    """A Llama-shaped checkpoint (hidden 2048, vocabulary 32000, untied head) of one layer, 0.45 GB:
    its embedding and head dominate, as at every model size."""
    return make_in_child(tmp_path_factory.mktemp("llama-shaped-1") / "llama-1-layer", 1)


@pytest.mark.parametrize("precision", ["bfloat8_b", "bfloat4_b"])
def test_a_streamed_build_of_large_weights_on_two_workers_is_the_in_memory_build(one_layer_llama_shape, tmp_path,
                                                                                 precision):
    """The embedding and the LM head (125 MiB each) are written block by block, on two workers: the
    tensors read back equal those a whole conversion in memory makes."""
    cls = loader_class("llama")
    streamed = cls(one_layer_llama_shape, precision=precision, cache_root=tmp_path / "cache", mesh_shape=(1, 2),
                   workers=2).load()
    assert streamed.cached and streamed.timings.get("workers") == 2
    _assert_same_tensors(streamed, _in_memory(cls, one_layer_llama_shape, precision, (1, 2), tmp_path))


@pytest.mark.parametrize("mode, mesh, workers, precision", [
    ("seed", "1x1", 1, "bfloat16"), ("load", "1x1", 1, "bfloat16"), ("load", "1x8", 2, "bfloat16"),
    pytest.param("seed", "1x1", 1, "bfloat4_b", marks=pytest.mark.slow),  # 35-40 s each
    pytest.param("load", "1x8", 2, "bfloat4_b", marks=pytest.mark.slow),
])
def test_a_cold_build_peaks_within_the_largest_tensor_and_half_a_gib(one_layer_llama_shape, tmp_path, mode, mesh,
                                                                      workers, precision):
    rc, report, err = run_seed_child(mode, one_layer_llama_shape, tmp_path / mode, mesh=mesh, workers=workers,
                                     precision=precision)
    assert rc == 0 and report and report["complete"] and report["workers"] == workers, err
    added = report["peak"] - report["import_peak"]
    bound = PEAK_ALLOWANCE + (workers - 1) * WORKER_ALLOWANCE
    assert added <= bound, (f"{mode} {precision} on {mesh} added {added / MiB:.0f} MiB over its imports "
                            f"(bound {bound / MiB:.0f})")


def _kill_while_writing_blocks(checkpoint: Path, root: Path, delay: float) -> None:
    """SIGKILL a seed on two workers ``delay`` seconds after it began writing a large weight block by
    block; the cache is cold then, and the next seed (the next lock holder) removes the killed
    build's generation, scratch and temps with it, and leaves a warm cache whose files verify."""
    env = child_env() | {"TT_CONVERT_WORKERS": "2"}
    child = subprocess.Popen(seed_command("seed", checkpoint, root, "bfloat8_b"), cwd=REPO_ROOT, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not any(root.rglob(".tensorbin-blocks-*")):  # a large weight is being written block by block
            assert child.poll() is None and time.monotonic() < deadline, "the seed never wrote a block"
            time.sleep(0.005)
        time.sleep(delay)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL, "the seed ended before it was killed"
    loader = loader_class("llama")(checkpoint, precision="bfloat8_b", cache_root=root, workers=2)
    assert not loader.status().warm
    assert loader.seed().complete
    debris = [p for p in root.rglob("*") if ".tensorbin-blocks-" in str(p) or TEMP_MARK in p.name]
    assert not debris, debris
    assert verify_weight_cache(loader.paths) == []
    generations = [p for p in loader.cache_dir.iterdir() if p.is_dir() and p.name.startswith(GENERATION_PREFIX)]
    assert len(generations) == 1, generations


def test_a_seed_killed_while_writing_blocks_leaves_nothing_the_next_seed_keeps(one_layer_llama_shape, tmp_path):
    _kill_while_writing_blocks(one_layer_llama_shape, tmp_path / "cache", 0.0)


@pytest.mark.slow
def test_seeds_killed_at_random_points_of_their_block_writes_leave_nothing(one_layer_llama_shape, tmp_path):
    rng = random.Random(7)
    for trial in range(6):  # within the half second after the first block: the blocks of both large weights
        _kill_while_writing_blocks(one_layer_llama_shape, tmp_path / f"cache-{trial}", rng.uniform(0.0, 0.5))
