# SPDX-License-Identifier: Apache-2.0
"""A large weight written block by block is the file ``ttnn.dump_tensor`` writes for the whole weight,
byte for byte, for every format, placement and mesh a family uses; each chunk's source pages are mapped
only around its conversion; and where the block writer cannot derive a header the weight is converted
whole, with nothing left behind; chunks shared with an idle conversion worker make the same file."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import torch
import ttnn

from models.common.mesh import COLUMN_PARALLEL, EXPERT_PARALLEL, REPLICATED, ROW_PARALLEL
from models.common.sharding import shard
from models.common.weight_cache import tensor_cache, tensorbin
from models.common.weight_cache.chunk_board import ChunkBoard
from models.common.weight_cache.tensor_cache import TensorCache, TensorFormat, to_host_ttnn
from models.registry import loader_class
from models.testing.tiny_models import make_checkpoint, tensors_of
from tests.ttnn.weight_cache.idle_workers import idle_workers

CASES = [  # dtype, layout, placement, mesh, stored shape, a transposed view of it (as a family hands over)
    ("bfloat8_b", "TILE", COLUMN_PARALLEL, (1, 1), (320, 256), True),
    ("bfloat8_b", "TILE", COLUMN_PARALLEL, (1, 1), (256, 320), False),
    ("bfloat16", "TILE", COLUMN_PARALLEL, (1, 1), (330, 256), True),
    ("bfloat8_b", "TILE", COLUMN_PARALLEL, (1, 8), (1024, 256), True),
    ("bfloat16", "TILE", ROW_PARALLEL, (1, 8), (256, 1024), True),
    ("bfloat8_b", "TILE", COLUMN_PARALLEL, (8, 4), (512, 1024), True),
    ("bfloat8_b", "TILE", ROW_PARALLEL, (8, 4), (1024, 1024), True),
    ("bfloat4_b", "TILE", COLUMN_PARALLEL, (1, 1), (320, 256), True),
    ("bfloat4_b", "TILE", COLUMN_PARALLEL, (1, 2), (320, 256), True),
    ("bfloat4_b", "TILE", ROW_PARALLEL, (1, 8), (256, 1024), True),
    ("bfloat4_b", "TILE", COLUMN_PARALLEL, (8, 4), (512, 1024), True),
    ("bfloat16", "ROW_MAJOR", REPLICATED, (1, 1), (1000, 64), False),
    ("bfloat16", "ROW_MAJOR", REPLICATED, (8, 4), (1000, 64), False),
    ("bfloat8_b", "TILE", EXPERT_PARALLEL, (1, 2), (8, 64, 96), False),
    ("bfloat4_b", "TILE", EXPERT_PARALLEL, (1, 2), (8, 64, 96), False),
]


class RecordedPages:
    """The pages a block writer asks to map and to drop (a stand-in for the checkpoint's mapping:
    here the source is in memory, so there is nothing to map)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []

    def map_view(self, view: torch.Tensor) -> None:
        self.events.append(("map", view.data_ptr()))

    def release_view(self, view: torch.Tensor) -> None:
        self.events.append(("drop", view.data_ptr()))


class PagesSharedWithAHelper(RecordedPages):
    """Recorded pages whose poster (the main thread) converts its first chunk only once an idle worker
    has taken a chunk of the same weight: chunks are shared, whatever the machine's timing."""

    def __init__(self) -> None:
        super().__init__()
        self.converted_by: list[str] = []
        self._helper_took = threading.Event()

    def map_view(self, view: torch.Tensor) -> None:
        name = threading.current_thread().name
        if name != "MainThread":
            self._helper_took.set()
        elif not self.converted_by:
            assert self._helper_took.wait(30), "the idle worker took no chunk"
        self.converted_by.append(name)
        super().map_view(view)


def _shards(dtype, layout, placement, mesh, shape, transposed):
    generator = torch.Generator().manual_seed(sum(shape))
    stored = (torch.randn(*shape, generator=generator) * 0.05).to(torch.bfloat16)
    stored.view(-1)[::97] = 3e4  # large values here and there: shared exponents differ between blocks
    weight = stored.transpose(-2, -1) if transposed else stored
    fmt = TensorFormat(getattr(ttnn, dtype), getattr(ttnn, f"{layout}_LAYOUT"), placement)
    return shard(weight, placement, mesh, copy=fmt.layout != ttnn.TILE_LAYOUT), fmt


def _no_dlpack(_tensor):
    raise AttributeError("host_buffer")  # a ttnn build without a DLPack export: each block is dumped


@pytest.mark.parametrize("bytes_from", ["buffer", "dump"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[3][0]}x{c[3][1]}-{'T' if c[5] else 'N'}-{len(c[4])}d")
def test_a_weight_written_block_by_block_is_the_file_ttnn_dumps(case, bytes_from, tmp_path, monkeypatch):
    monkeypatch.setattr(tensorbin, "BLOCK_BYTES", 32 << 10)  # several chunks of every shard
    dumps = []
    monkeypatch.setattr(tensorbin._Scratch, "dump", lambda self, t, dump=tensorbin._Scratch.dump: dumps.append(1) or dump(self, t))
    if bytes_from == "dump":
        monkeypatch.setattr(tensorbin, "_packed", _no_dlpack)
    shards, fmt = _shards(*case)
    mesh = case[3]
    assert tensorbin.streamable(shards, fmt.layout)
    ttnn.dump_tensor(tmp_path / "whole.tensorbin", to_host_ttnn(shards, fmt, mesh))
    pages = RecordedPages()
    fd = os.open(tmp_path / "blocks.tensorbin", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        written = tensorbin.write_blocks(fd, os.fspath(tmp_path), shards, fmt, mesh, pages=pages)
    finally:
        os.close(fd)
    whole = (tmp_path / "whole.tensorbin").read_bytes()
    assert (tmp_path / "blocks.tensorbin").read_bytes() == whole and written == len(whole)
    assert tensorbin.check_written(os.fspath(tmp_path / "blocks.tensorbin"), shards, fmt, mesh) is None
    kinds = [kind for kind, _ in pages.events]
    assert kinds == ["map", "drop"] * (len(kinds) // 2) and len(kinds) >= 2 * len(shards), "a chunk at a time"
    # three header templates and the proof of the buffer's bytes are dumped; the blocks only without DLPack
    assert len(dumps) == 4 + (len(kinds) // 2 if bytes_from == "dump" else 0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocks.tensorbin", "whole.tensorbin"], "no scratch left"


def test_small_or_ragged_shards_are_left_to_a_whole_conversion():
    tile = ttnn.TILE_LAYOUT
    assert not tensorbin.streamable([torch.zeros(64, 256)], tile)  # fewer rows than the three templates
    assert not tensorbin.streamable([torch.zeros(100, 256)], tile)  # rows not whole tiles
    assert not tensorbin.streamable([torch.zeros(4096)], tile)  # 1-D
    assert not tensorbin.streamable([torch.zeros(128, 64), torch.zeros(96, 64)], tile)  # unequal shards
    assert tensorbin.streamable([torch.zeros(100, 8)], ttnn.ROW_MAJOR_LAYOUT)


def _cold_cache(root: Path, weight: torch.Tensor, fmt: TensorFormat) -> list[str]:
    with TensorCache(root, (1, 1), rebuild=True) as cache:
        cache.as_tensor("output", weight, fmt)
        return cache.finish()


@pytest.mark.parametrize("dtype", ["bfloat8_b", "bfloat4_b"])
def test_a_cold_build_writes_large_weights_block_by_block_and_falls_back_whole(dtype, tmp_path, monkeypatch):
    monkeypatch.setattr(tensor_cache, "STREAM_BLOCKS_FROM", 0)
    monkeypatch.setattr(tensorbin, "BLOCK_BYTES", 32 << 10)
    weight = (torch.randn(512, 320, generator=torch.Generator().manual_seed(3)) * 0.05).to(torch.bfloat16).T
    fmt = TensorFormat(getattr(ttnn, dtype), ttnn.TILE_LAYOUT, COLUMN_PARALLEL)
    ttnn.dump_tensor(tmp_path / "whole.tensorbin", ttnn.from_torch(weight, dtype=fmt.dtype, layout=fmt.layout))
    whole = (tmp_path / "whole.tensorbin").read_bytes()

    blocks = _cold_cache(tmp_path / "blocks", weight, fmt)
    assert [(tmp_path / "blocks" / f).read_bytes() == whole for f in blocks] == [True]

    def refuse(*_):
        raise tensorbin.TensorbinError("a header word is not linear in the row count")

    monkeypatch.setattr(tensorbin, "_extrapolate", refuse)  # a ttnn whose header the writer cannot derive
    fallback = _cold_cache(tmp_path / "fallback", weight, fmt)
    assert [(tmp_path / "fallback" / f).read_bytes() == whole for f in fallback] == [True]
    for root in ("blocks", "fallback"):  # the published file only: no temp, no scratch directory
        assert [p.name for p in (tmp_path / root).rglob("*")] == blocks, root


@pytest.mark.parametrize("case", [CASES[0], CASES[4], CASES[11]], ids=["transposed", "row-parallel-1x8", "row-major"])
def test_chunks_shared_with_an_idle_worker_make_the_same_file(case, tmp_path, monkeypatch):
    """An idle worker converts some of the chunks (the poster's first chunk waits until the idle
    worker has taken one): the file is still the one ttnn dumps, and every chunk's pages were mapped
    and dropped once."""
    monkeypatch.setattr(tensorbin, "BLOCK_BYTES", 32 << 10)
    shards, fmt = _shards(*case)
    mesh = case[3]
    ttnn.dump_tensor(tmp_path / "whole.tensorbin", to_host_ttnn(shards, fmt, mesh))
    board = ChunkBoard(workers=2)
    [helper] = idle_workers(board, 1, name="idle-worker")
    pages = PagesSharedWithAHelper()
    fd = os.open(tmp_path / "blocks.tensorbin", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        with board.worker():
            written = tensorbin.write_blocks(fd, os.fspath(tmp_path), shards, fmt, mesh, pages=pages, board=board)
    finally:
        os.close(fd)
        helper.join(timeout=30)
    whole = (tmp_path / "whole.tensorbin").read_bytes()
    assert (tmp_path / "blocks.tensorbin").read_bytes() == whole and written == len(whole)
    assert "idle-worker-0" in pages.converted_by, "the idle worker converted chunks"
    mapped = [ptr for kind, ptr in pages.events if kind == "map"]
    assert sorted(mapped) == sorted(ptr for kind, ptr in pages.events if kind == "drop") and len(mapped) >= 2


@pytest.mark.parametrize("mesh", [(1, 1), (1, 8)], ids=["1x1", "1x8"])
def test_a_bfloat4_b_build_writes_each_file_as_ttnn_writes_it(mesh, tmp_path, monkeypatch):
    """A tiny Llama built cold in bfloat4_b, every weight that can stream written block by block (a
    few KiB a chunk): each file is what ``ttnn.as_tensor`` writes for the weight the build handed
    over (on a mesh: ``ttnn.dump_tensor`` of its shards joined, as ``as_tensor`` with a mapper),
    and the warm load reads back the cold build's tensors."""
    monkeypatch.setattr(tensor_cache, "STREAM_BLOCKS_FROM", 0)
    monkeypatch.setattr(tensorbin, "BLOCK_BYTES", 8 << 10)
    handed: dict[str, tuple[torch.Tensor, TensorFormat]] = {}
    streamed: list[str] = []
    as_tensor, write_blocks = TensorCache.as_tensor, TensorCache._write_blocks

    def recording(self, name, tensor, fmt, **kwargs):
        if self.rebuild:  # the build's weight (the read that follows it hands over placeholders)
            # a copy (a streamed chunk's checkpoint pages are dropped), contiguous (as_tensor takes no view)
            handed[tensor_cache.tensorbin_name(name, fmt)] = (tensor.contiguous().clone(), fmt)
        return as_tensor(self, name, tensor, fmt, **kwargs)

    def recording_blocks(self, name, relative, *args, **kwargs):
        streamed.append(relative)
        return write_blocks(self, name, relative, *args, **kwargs)

    monkeypatch.setattr(TensorCache, "as_tensor", recording)
    monkeypatch.setattr(TensorCache, "_write_blocks", recording_blocks)
    checkpoint = make_checkpoint("llama", tmp_path / "tiny-llama")
    cache_root = tmp_path / "cache"
    cold = loader_class("llama")(checkpoint, precision="bfloat4_b", cache_root=cache_root, mesh_shape=mesh).load()
    assert not cold.warm and cold.cached
    block_floats = sorted(r for r, (_, fmt) in handed.items() if fmt.dtype == ttnn.bfloat4_b)
    # the LM head and the column-parallel weights: their shards are tile rows enough to stream
    assert len(set(block_floats) & set(streamed)) >= 7, "bfloat4_b weights written block by block"
    files = {p.relative_to(p.parents[len(Path(r).parts) - 1]).as_posix(): p
             for r in handed for p in cache_root.rglob(Path(r).name) if p.as_posix().endswith("/" + r)}
    for relative in block_floats:
        tensor, fmt = handed[relative]
        expected = tmp_path / "expected" / relative
        expected.parent.mkdir(parents=True, exist_ok=True)
        if mesh == (1, 1):
            ttnn.as_tensor(tensor, dtype=ttnn.bfloat4_b, layout=ttnn.TILE_LAYOUT,
                           cache_file_name=str(expected).removesuffix("_dtype_BFLOAT4_B_layout_TILE.tensorbin"))
        else:
            joined = ttnn.from_host_shards([ttnn.from_torch(s, dtype=ttnn.bfloat4_b, layout=ttnn.TILE_LAYOUT)
                                            for s in shard(tensor, fmt.placement, mesh)], ttnn.MeshShape(*mesh))
            ttnn.dump_tensor(expected, joined)
        assert files[relative].read_bytes() == expected.read_bytes(), relative
    warm = loader_class("llama")(checkpoint, precision="bfloat4_b", cache_root=cache_root, mesh_shape=mesh).load()
    assert warm.warm, warm.reason
    cold_tensors, warm_tensors = tensors_of(cold), tensors_of(warm)
    assert cold_tensors.keys() == warm_tensors.keys()
    for name, shards in cold_tensors.items():
        assert all(torch.equal(a, b) for a, b in zip(shards, warm_tensors[name], strict=True)), name
