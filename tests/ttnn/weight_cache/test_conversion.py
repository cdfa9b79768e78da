# SPDX-License-Identifier: Apache-2.0
"""A cold build's conversion of one shard: the staged path for large block-float weights writes
the very bytes ``ttnn.from_torch`` writes, for every shape and view a family hands it."""

from __future__ import annotations

import threading

import pytest
import torch
import ttnn

from models.common.mesh import Placement, parse_mesh_shape
from models.common.weight_cache.tensor_cache import TensorCache, TensorFormat, convert_shards


def _bytes(tensor: ttnn.Tensor, path) -> bytes:
    ttnn.dump_tensor(path, tensor)
    return path.read_bytes()


@pytest.mark.parametrize("dtype", ["bfloat8_b", "bfloat4_b"])
@pytest.mark.parametrize("shape, view", [((256, 96), "plain"), ((96, 256), "transposed"), ((333, 70), "transposed"),
                                         ((1000, 45), "plain"), ((2, 40, 72), "plain")])
def test_staged_block_float_conversion_writes_the_same_bytes(tmp_path, dtype, shape, view):
    generator = torch.Generator().manual_seed(sum(shape))
    weight = (torch.randn(*shape, generator=generator) * 0.05).to(torch.bfloat16)
    weight[0, ..., 0] = 3e4  # one large value per block row: shared exponents differ across blocks
    if view == "transposed":
        weight = weight.transpose(-2, -1)
    fmt = TensorFormat(getattr(ttnn, dtype), ttnn.TILE_LAYOUT, Placement())
    direct = ttnn.from_torch(weight, dtype=fmt.dtype, layout=fmt.layout)
    released = []
    (staged,) = convert_shards([weight], fmt, staged_from=0, release_source=lambda: released.append(True))
    assert staged.dtype == direct.dtype and staged.layout == direct.layout
    assert tuple(staged.shape) == tuple(direct.shape) == tuple(weight.shape)
    assert _bytes(staged, tmp_path / "staged.tensorbin") == _bytes(direct, tmp_path / "direct.tensorbin")
    assert released == [True]  # once, between the two steps


def test_only_bf16_weights_bound_for_a_block_float_are_staged(tmp_path):
    """A float32 weight is rounded once, straight to the block float (through bf16 it could round
    twice); bf16 and row-major targets are plain conversions already."""
    weight32 = torch.randn(64, 64, generator=torch.Generator().manual_seed(1)) * 0.05
    for tensor, fmt in ((weight32, TensorFormat(ttnn.bfloat8_b, ttnn.TILE_LAYOUT, Placement())),
                        (weight32.to(torch.bfloat16), TensorFormat(ttnn.bfloat16, ttnn.TILE_LAYOUT, Placement())),
                        (weight32.to(torch.bfloat16), TensorFormat(ttnn.bfloat16, ttnn.ROW_MAJOR_LAYOUT, Placement()))):
        direct = ttnn.from_torch(tensor, dtype=fmt.dtype, layout=fmt.layout)
        released = []
        (converted,) = convert_shards([tensor], fmt, staged_from=0, release_source=lambda: released.append(True))
        assert not released
        assert _bytes(converted, tmp_path / "a.tensorbin") == _bytes(direct, tmp_path / "b.tensorbin")


@pytest.mark.parametrize("dtype", ["bfloat16", "bfloat8_b"])
def test_a_large_strided_weight_is_copied_and_its_source_released_before_tiling(tmp_path, dtype):
    """A transposed weight (an LM head) is made contiguous and its checkpoint pages released before
    ttnn tiles it, for bf16 targets as for block floats: the same bytes as the direct conversion."""
    weight = (torch.randn(96, 160, generator=torch.Generator().manual_seed(7)) * 0.05).to(torch.bfloat16).T
    fmt = TensorFormat(getattr(ttnn, dtype), ttnn.TILE_LAYOUT, Placement())
    direct = ttnn.from_torch(weight, dtype=fmt.dtype, layout=fmt.layout)
    released = []
    (converted,) = convert_shards([weight], fmt, staged_from=0, release_source=lambda: released.append(True))
    assert released == [True]
    assert _bytes(converted, tmp_path / "a.tensorbin") == _bytes(direct, tmp_path / "b.tensorbin")


@pytest.mark.parametrize("precision", ["bfloat8_b", "bfloat16"])
def test_a_streaming_seed_that_stages_and_releases_every_weight_writes_a_direct_builds_files(tmp_path, monkeypatch,
                                                                                            precision):
    """Staging every weight (threshold 0) makes a streaming seed drop the checkpoint pages of all
    it has read after each weight's first step, a weight read but not yet put (MLP up beside gate)
    included: its put reads the bytes from the file again, and the cache is the direct build's."""
    import models.common.weight_cache.tensor_cache as tensor_cache
    from models.common.conversion import LazyStateDict
    from models.llama import LlamaLoader
    from models.testing.seed_child import assert_same_cache
    from models.testing.tiny_models import make_checkpoint

    checkpoint = make_checkpoint("llama", tmp_path / "tiny-llama")
    direct = LlamaLoader(checkpoint, precision=precision, mesh_shape="1x2", cache_root=tmp_path / "direct")
    assert not direct.load().warm
    released = []
    original = LazyStateDict.release_read

    def recording_release(self, keep=(), *, now=False):
        if now:
            released.append(1)
        original(self, keep, now=now)

    monkeypatch.setattr(LazyStateDict, "release_read", recording_release)
    monkeypatch.setattr(tensor_cache, "STAGED_CONVERT_BYTES", 0)
    staged = LlamaLoader(checkpoint, precision=precision, mesh_shape="1x2", cache_root=tmp_path / "staged")
    result = staged.seed()
    assert result.complete and not result.warm and len(released) > 10
    assert_same_cache(direct.cache_dir, staged.cache_dir, direct.build_variant)


@pytest.mark.parametrize("precision", ["bfloat8_b", "bfloat16"])
def test_a_tied_head_releases_the_embedding_once_the_sidecar_is_written(tmp_path, monkeypatch, precision):
    """A streaming seed keeps the host weights' checkpoint pages while the sidecar writer reads
    them; the tied LM head, made from the embedding, waits for that write and then releases the
    embedding too, so a seed's peak never holds the embedding, its copy and its tiles at once.
    The cache is byte for byte a direct build's."""
    import models.common.weight_cache.tensor_cache as tensor_cache
    from models.common.conversion import LazyStateDict, WeightSink
    from models.registry import loader_class
    from models.testing.seed_child import assert_same_cache
    from models.testing.tiny_models import make_checkpoint

    checkpoint = make_checkpoint("gemma3", tmp_path / "tiny-gemma3", vocab_size=4096)
    cls = loader_class("gemma3")
    direct = cls(checkpoint, precision=precision, cache_root=tmp_path / "direct")
    assert not direct.load().warm
    calls: list[tuple[list[str], set[str], bool]] = []
    original = LazyStateDict.release_read
    sinks: list[WeightSink] = []
    original_init = WeightSink.__init__

    def recording_init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        if type(self) is WeightSink:  # not the plan's (it converts nothing)
            sinks.append(self)

    def recording_release(self, keep=(), *, now=False):
        if now:  # a large weight's source, released at once
            (sink,) = sinks
            calls.append((self.recent_keys(), set(keep), sink.sidecar is not None and sink.sidecar.done()))
        original(self, keep, now=now)

    monkeypatch.setattr(WeightSink, "__init__", recording_init)
    monkeypatch.setattr(LazyStateDict, "release_read", recording_release)
    monkeypatch.setattr(tensor_cache, "STAGED_CONVERT_BYTES", 1 << 20)  # the head (4096 x hidden) is large
    # one conversion worker: the sink that converts is the one that writes the sidecar
    seeded = cls(checkpoint, precision=precision, cache_root=tmp_path / "seeded", workers=1)
    result = seeded.seed()
    assert result.complete and not result.warm
    (sink,) = sinks
    (embedding,) = sink.host
    from_embedding = [call for call in calls if embedding in call[0]]
    assert from_embedding, "the tied head was never released early"
    for recent, keep, sidecar_written in from_embedding:
        assert sidecar_written and embedding not in keep, (recent, keep)
    assert_same_cache(direct.cache_dir, seeded.cache_dir, direct.build_variant)


def _writers() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith("tensorbin-writer")]


def test_an_error_inside_a_cold_build_cancels_the_queued_writes_and_stops_the_writer(tmp_path):
    """Leaving the block without ``finish`` (a family's convert raising, or Ctrl-C) writes none
    of the weights still queued behind the one being written, and leaves no writer thread."""
    fmt = TensorFormat(ttnn.bfloat16, ttnn.TILE_LAYOUT, Placement())
    started, release = threading.Event(), threading.Event()

    def slow_writer() -> list[str]:
        started.set()
        release.wait(10)
        return []

    with pytest.raises(ValueError, match="a weight the family cannot convert"):
        with TensorCache(tmp_path, parse_mesh_shape((1, 1)), rebuild=True) as cache:
            cache.submit_file(slow_writer)
            assert started.wait(10)
            for index in range(3):
                cache.as_tensor(f"layers.{index}.weight", torch.ones(64, 64, dtype=torch.bfloat16), fmt)
            threading.Timer(0.2, release.set).start()  # the running write ends; abort waits for it
            raise ValueError("a weight the family cannot convert")
    assert not cache.finished and not _writers()
    assert not list(tmp_path.rglob("*.tensorbin")), "a weight queued before the error was written"


def test_a_finished_cold_build_keeps_its_files_when_the_block_ends(tmp_path):
    fmt = TensorFormat(ttnn.bfloat16, ttnn.TILE_LAYOUT, Placement())
    with TensorCache(tmp_path, parse_mesh_shape((1, 1)), rebuild=True) as cache:
        cache.as_tensor("norm.weight", torch.ones(64, 64, dtype=torch.bfloat16), fmt)
        written = cache.finish()
    assert cache.finished and not _writers()
    assert [tmp_path / relative for relative in written] == list(tmp_path.rglob("*.tensorbin"))
