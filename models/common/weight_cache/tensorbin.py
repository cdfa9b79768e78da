# SPDX-License-Identifier: Apache-2.0
"""A large weight written to its ``.tensorbin`` block by block, so that no full converted copy of it
ever exists in host memory.

``ttnn.dump_tensor`` needs the whole converted tensor, and ``ttnn.from_torch`` needs the whole source:
for a 70B model's 2 GiB LM head that is source, tiles and block floats side by side (4-6 GiB). But the
file is simple: an 8-byte header length, a flatbuffer header (shape, dtype, layout, one entry per
device shard with its data offset and size), then each shard's data in turn, and in TILE and
ROW_MAJOR layouts rows ``[a, b)`` of a shard (``a``, ``b`` multiples of 32 for TILE) are one
contiguous byte range of that data (tiles go row of tiles by row of tiles, and a block float's shared
exponents stay inside their tile). So:

* **the header** is ttnn's own: three small templates (the same weight cut to ``k`` rows, for three
  ``k``) are dumped, and every header word that changes with ``k`` changes linearly with it (a
  dimension, a data size, an offset); the full header is that line at the full row count.
  Anything else (another header length, a word that is not linear) is refused and the caller
  converts the weight whole;
* **the data**: each block of rows of each shard is converted by ``ttnn.from_torch`` (so ttnn
  packs every byte) and its packed bytes, taken from ttnn's host buffer through DLPack (no copy),
  are written at their place in the output. The first template proves that these bytes are the
  ones ``dump_tensor`` writes; where they are not (or a ttnn build has no DLPack export), each
  block goes through a scratch ``dump_tensor`` instead.

The file is byte-for-byte what ``ttnn.dump_tensor`` writes for the whole weight
(``tests/ttnn/weight_cache/test_tensorbin.py`` holds every format and mesh to that), and the writer
checks what it wrote by loading it back (lazily: the header only) before it is published.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import struct
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import torch
import ttnn

from models.common.weight_cache.chunk_board import ChunkBoard

TILE = 32
BLOCK_BYTES = 32 << 20  # source bytes per converted chunk
_TEMPLATE_ROWS = {True: (TILE, 2 * TILE, 3 * TILE), False: (1, 2, 3)}  # TILE layout or not


class SourcePages(Protocol):
    """Where a chunk's source bytes live (a mapped checkpoint): mapped just before the chunk is
    converted, dropped just after, so a large weight never holds all its pages at once."""

    def map_view(self, view: torch.Tensor) -> None: ...

    def release_view(self, view: torch.Tensor) -> None: ...


class TensorbinError(RuntimeError):
    """The header could not be derived (not linear in the rows): convert the weight whole instead."""


def streamable(shards: Sequence[torch.Tensor], layout: Any) -> bool:
    """Whether :func:`write_blocks` can write these shards: at least 2-D, one shape, and for TILE a
    row count (first dim of a 2-D shard) that is whole tiles, so blocks end on tile rows."""
    shape = tuple(shards[0].shape)
    if len(shape) < 2 or any(tuple(s.shape) != shape for s in shards):
        return False
    tiled = layout == ttnn.TILE_LAYOUT
    if tiled and (shape[-1] < TILE or (len(shape) == 2 and shape[0] % TILE)):
        return False
    return shape[0] >= max(_TEMPLATE_ROWS[tiled and len(shape) == 2])


def _convert(tensor: torch.Tensor, fmt: Any) -> Any:
    return ttnn.from_torch(tensor, dtype=fmt.dtype, layout=fmt.layout)


def _packed(tensor: Any) -> torch.Tensor:
    """A one-device host tensor's packed bytes as ``uint8``: ttnn's own buffer, not a copy (it lives
    as long as the returned tensor)."""
    raw = torch.from_dlpack(tensor.host_buffer().get_shard(ttnn.MeshCoordinate(0, 0)))
    return raw.reshape(-1).view(torch.uint8)


def _join(converted: list[Any], mesh: tuple[int, int]) -> Any:
    return converted[0] if len(converted) == 1 else ttnn.from_host_shards(converted, ttnn.MeshShape(*mesh))


class _Scratch:
    """A small file that ttnn dumps one block (or template) into, read back by offset, in a private
    directory beside the output (ttnn writes a temp file next to the name, then renames it over): in
    a build generation, so a killed build's scratch goes with the generation."""

    def __init__(self, near: str) -> None:
        self.directory = tempfile.mkdtemp(prefix=".tensorbin-blocks-", dir=near)
        self.path = os.path.join(self.directory, "block.tensorbin")
        self.direct = False  # blocks' bytes straight from ttnn's buffer (proven on the first template)

    def prove_direct(self, shape: Sequence[int], dtype: torch.dtype, fmt: Any) -> None:
        """Take blocks' bytes from ttnn's buffer from now on if, for a block of ``shape`` holding a
        pattern of distinct values, they are exactly the data ``dump_tensor`` writes."""
        count = int(torch.Size(shape).numel())
        pattern = ((torch.arange(count) % 509 - 254) / 64).reshape(tuple(shape)).to(dtype)
        converted = _convert(pattern, fmt)
        _, dumped = self.dump(converted)
        with contextlib.suppress(Exception):  # no DLPack export in this ttnn build: dump each block
            self.direct = bytes(memoryview(_packed(converted).numpy())) == dumped

    def dump(self, tensor: Any) -> tuple[bytes, bytes]:
        """Dump ``tensor``: (the file's header, its data). The file is gone again before the next
        dump: ttnn's rename over an existing file would make ext4 write its data back at once."""
        # ttnn.dump_tensor's own writer (dump_tensor insists on a ``.tensorbin`` name), its default mode
        ttnn._ttnn.tensor.dump_tensor_flatbuffer(self.path, tensor, ttnn.DumpTensorMode.DISTRIBUTED_GATHER)
        fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.unlink(self.path)
            size = os.fstat(fd).st_size
            (length,) = struct.unpack("<Q", os.pread(fd, 8, 0))
            return os.pread(fd, 8 + length, 0), _read_all(fd, 8 + length, size - 8 - length)
        finally:
            os.close(fd)

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def _extrapolate(templates: dict[int, bytes], rows: int) -> bytes:
    """The header at ``rows`` from headers at three smaller row counts: each 8-byte word (flatbuffer
    scalars are aligned to their size) must be constant or linear in the rows."""
    (k1, h1), (k2, h2), (k3, h3) = sorted(templates.items())
    if not len(h1) == len(h2) == len(h3) or len(h1) % 8:
        raise TensorbinError(f"template headers of {len(h1)}, {len(h2)} and {len(h3)} bytes")
    count = len(h1) // 8
    words = [struct.unpack(f"<{count}Q", h) for h in (h1, h2, h3)]
    out = []
    for w1, w2, w3 in zip(*words, strict=True):
        slope, rest = divmod(w2 - w1, k2 - k1)
        if rest or w3 - w2 != slope * (k3 - k2):
            raise TensorbinError("a header word is not linear in the row count")
        value = w1 + slope * (rows - k1)
        if not 0 <= value < 1 << 64:
            raise TensorbinError("a header word out of range")
        out.append(value)
    return struct.pack(f"<{count}Q", *out)


def _transposed(source: torch.Tensor) -> bool:
    """A 2-D view whose columns are contiguous (a transposed weight): read in column chunks, which
    are whole rows of the checkpoint tensor underneath."""
    return source.dim() == 2 and source.stride(0) == 1 and source.stride(1) != 1


def _chunks(count: int, unit_bytes: int, align: int) -> Iterator[tuple[int, int]]:
    """``[start, end)`` ranges of ``count`` rows (or columns) of ``unit_bytes`` each, about
    ``BLOCK_BYTES`` a chunk, starts on multiples of ``align``. ``unit_bytes`` is what one row spans in
    the source's memory (its stride), not what it holds: a shard of a few columns of a wide tensor
    (Galaxy's row-split heads) maps the whole width of every row it reads."""
    step = max(align, BLOCK_BYTES // max(unit_bytes, 1) // align * align)
    for start in range(0, count, step):
        yield start, min(count, start + step)


def write_blocks(fd: int, near: str, shards: Sequence[torch.Tensor], fmt: Any, mesh: tuple[int, int], *,
                 pages: SourcePages | None = None, board: ChunkBoard | None = None) -> int:
    """Write the ``.tensorbin`` of ``shards`` (one per device, as for ``ttnn.from_host_shards``; one
    for a replicated weight) into the empty file ``fd`` (``near``: a directory beside it), converting
    about ``BLOCK_BYTES`` of source at a time; ``pages`` maps each chunk's source before it is
    converted and drops it once written; ``board`` shares the chunks with idle conversion workers
    (:mod:`~models.common.weight_cache.chunk_board`). Returns the bytes written.
    :class:`TensorbinError` before anything is written if the header cannot be derived.

    A chunk is a block of rows (its bytes are one range of the shard's data), or, for a transposed
    view in TILE layout, a block of columns: whole rows of the tensor underneath, so its pages are
    read once and can be dropped; each row of tiles of such a chunk is one range of the output."""
    by_tile_rows = fmt.layout == ttnn.TILE_LAYOUT and shards[0].dim() == 2
    scratch = _Scratch(near)
    try:
        templates, data_bytes = {}, {}
        for k in _TEMPLATE_ROWS[by_tile_rows]:
            # a template's values do not matter, only its spec: zeros, so no source page is touched
            joined = _join([_convert(torch.zeros((k, *s.shape[1:]), dtype=s.dtype), fmt) for s in shards], mesh)
            templates[k], data = scratch.dump(joined)
            data_bytes[k] = len(data)
        header = _extrapolate(templates, shards[0].shape[0])
        scratch.prove_direct((min(templates), *shards[0].shape[1:]), shards[0].dtype, fmt)
        small, next_up = sorted(data_bytes)[:2]
        step = next_up - small  # rows: one row of tiles in TILE layout, else one row (or expert)
        step_bytes = (data_bytes[next_up] - data_bytes[small]) // len(shards)
        shard_bytes = data_bytes[small] // len(shards) + (shards[0].shape[0] - small) // step * step_bytes
        jobs: list[Callable[[], int]] = []
        for index, source in enumerate(shards):
            base = len(header) + index * shard_bytes
            if by_tile_rows and _transposed(source):
                jobs += _column_chunk_jobs(fd, base, source, fmt, step_bytes, scratch, pages)
                continue
            row_bytes = max(source[0].numel(), source.stride(0)) * source.element_size()
            for start, end in _chunks(source.shape[0], row_bytes, TILE if by_tile_rows else 1):
                jobs.append(functools.partial(_write_row_chunk, fd, base + start // step * step_bytes,
                                              source[start:end], fmt, scratch, pages))
        written = _write_at(fd, header, 0)
        # the scratch dump is one file: without DLPack's bytes, chunks go one at a time
        shared = board is not None and scratch.direct and len(jobs) > 1
        return written + sum(board.run(jobs) if shared else [job() for job in jobs])
    finally:
        scratch.close()


def _write_row_chunk(fd: int, offset: int, chunk: torch.Tensor, fmt: Any, scratch: _Scratch,
                     pages: SourcePages | None) -> int:
    """A block of rows of a shard: one range of the output."""
    with _converted_bytes(chunk, fmt, scratch, pages) as data:
        return _write_at(fd, data, offset)


def _column_chunk_jobs(fd: int, base: int, source: torch.Tensor, fmt: Any, tile_row_bytes: int,
                       scratch: _Scratch, pages: SourcePages | None) -> list[Callable[[], int]]:
    """One shard of a transposed TILE weight, converted ``[rows, c0:c1]`` at a time; tile row ``i``
    of a chunk goes to tile row ``i``'s range at tile column ``c0 / 32``."""
    rows, columns = source.shape
    tile_columns = -(-columns // TILE)
    tile_bytes, rest = divmod(tile_row_bytes, tile_columns)
    if rest:
        raise TensorbinError(f"a row of tiles of {tile_row_bytes} bytes is not {tile_columns} whole tiles")

    def write(start: int, end: int) -> int:
        run = -(-(end - start) // TILE) * tile_bytes  # one row of tiles of the chunk
        written = 0
        with _converted_bytes(source[:, start:end], fmt, scratch, pages) as data:
            if len(data) != run * (rows // TILE):
                raise TensorbinError(f"a chunk of {len(data)} bytes is not {rows // TILE} rows of {run}")
            for i in range(rows // TILE):
                offset = base + i * tile_row_bytes + start // TILE * tile_bytes
                written += _write_at(fd, data[i * run:(i + 1) * run], offset)
        return written

    return [functools.partial(write, start, end)
            for start, end in _chunks(columns, max(rows, source.stride(1)) * source.element_size(), TILE)]


@contextlib.contextmanager
def _converted_bytes(chunk: torch.Tensor, fmt: Any, scratch: _Scratch,
                     pages: SourcePages | None) -> Iterator[memoryview]:
    """The file bytes of one chunk, valid inside the ``with``; its source pages are mapped only
    while it converts."""
    if pages is not None:
        pages.map_view(chunk)
    converted = _convert(chunk, fmt)
    if pages is not None:
        pages.release_view(chunk)
    if scratch.direct:
        packed = _packed(converted)  # ttnn's buffer: ``converted`` keeps it alive until the block is written
        yield memoryview(packed.numpy())
    else:
        yield memoryview(scratch.dump(converted)[1])


def _read_all(fd: int, offset: int, size: int) -> bytes:
    data = os.pread(fd, size, offset)
    while len(data) < size:  # a short read: only at the end of a file that shrank
        more = os.pread(fd, size - len(data), offset + len(data))
        if not more:
            raise TensorbinError(f"a dumped block ended at {len(data)} of {size} bytes")
        data += more
    return data


def _write_at(fd: int, data: bytes | memoryview, offset: int) -> int:
    view = memoryview(data)
    while view:
        done = os.pwrite(fd, view, offset)
        view, offset = view[done:], offset + done
    return len(data)


def check_written(path: str, shards: Sequence[torch.Tensor], fmt: Any, mesh: tuple[int, int]) -> str | None:
    """Load a written file back (ttnn maps it lazily: only the header is read) and say how it differs
    from the weight it was written for, or None."""
    with contextlib.suppress(Exception):
        loaded = ttnn._ttnn.tensor.load_tensor_flatbuffer(path, None)
        try:
            devices = ttnn.get_device_tensors(loaded)
        except Exception:  # noqa: BLE001 - a single-device tensor on some ttnn builds
            devices = [loaded]
        if len(devices) != len(shards) and not (len(shards) == 1 and len(devices) == 1):
            return f"holds {len(devices)} device tensors, expected {len(shards)}"
        if loaded.dtype != fmt.dtype or loaded.layout != fmt.layout:
            return f"is {loaded.dtype} {loaded.layout}, expected {fmt.dtype} {fmt.layout}"
        if tuple(devices[0].shape) != tuple(shards[0].shape):
            return f"has shards of {tuple(devices[0].shape)}, expected {tuple(shards[0].shape)}"
        return None
    return "cannot be loaded back"
