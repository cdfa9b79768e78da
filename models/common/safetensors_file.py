# SPDX-License-Identifier: Apache-2.0
"""Read a checkpoint's safetensors files lazily, under the loader's names (torch).

Each file is memory-mapped and each tensor is a zero-copy view of the mapping
(:class:`SafetensorsFile`); which files make the checkpoint is :func:`models.common.checkpoint.checkpoint_files`'
business. The transformers model object is never built just to read weights. A build reads through
a :class:`~models.common.weight_cache.checkpoint_proof.ProvenCheckpoint`: every file from the
descriptor proved to hold the bytes the build's content id names.
"""

from __future__ import annotations

import contextlib
import json
import math
import mmap
import os
import struct
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from models.common.checkpoint import CheckpointError, KeyRule, checkpoint_files, remap_key
from models.common.fileio import write_all

if TYPE_CHECKING:
    from models.common.weight_cache.checkpoint_proof import ProvenCheckpoint


def safetensors_files(checkpoint_dir: Path) -> dict[str, Path]:
    """Map every tensor name of the checkpoint to the file holding it."""
    files = checkpoint_files(checkpoint_dir)
    if files.weight_map is not None:
        return {name: checkpoint_dir / shard for name, shard in files.weight_map.items()}
    single = checkpoint_dir / files.shards[0]
    return {name: single for name in SafetensorsFile(single).names()}


_SAFETENSORS_DTYPES = {
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F64": torch.float64,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


_MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)
# Tensors from this size are left to fault in as read: a streaming build converts them a chunk at a
# time and releases each chunk's pages (tensor_cache.STREAM_BLOCKS_FROM), so mapping all at once would
# hold the whole tensor.
POPULATE_BELOW_BYTES = 64 << 20
_DTYPE_NAMES = {dtype: name for name, dtype in _SAFETENSORS_DTYPES.items()}


def safetensors_header(specs: Mapping[str, tuple[Sequence[int], torch.dtype]]) -> tuple[bytes, dict[str, int]]:
    """The bytes a safetensors file starts with for tensors of these shapes and dtypes (the data in
    name order, 8-byte aligned), and each tensor's data offset after them."""
    header: dict[str, Any] = {}
    offsets: dict[str, int] = {}
    offset = 0
    for name in sorted(specs):
        shape, dtype = specs[name]
        size = math.prod(shape) * dtype.itemsize
        header[name] = {"dtype": _DTYPE_NAMES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
        offsets[name] = offset
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    return struct.pack("<Q", len(raw)) + raw, offsets


def _file_identity(stat: os.stat_result) -> tuple[int, int, int, int]:
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


def write_safetensors(path: Path, tensors: Mapping[str, torch.Tensor]) -> None:
    """Write ``tensors`` in the format :class:`SafetensorsFile` reads (the ``safetensors``
    package reads it too), straight from each tensor's memory: no staging copy, and tensors that
    share storage (tied weights, views of one mapped file) are simply written twice."""
    header, _ = safetensors_header({name: (tensor.shape, tensor.dtype) for name, tensor in tensors.items()})
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, header)
        for name in sorted(tensors):
            tensor = tensors[name].detach().cpu().contiguous()
            if tensor.numel():
                write_all(fd, tensor.reshape(-1).view(torch.uint8).numpy())
    finally:
        os.close(fd)


class SafetensorsFile:
    """One safetensors file, memory-mapped; tensors are zero-copy views of the mapping.

    Format: an 8-byte little-endian header length ``N``, ``N`` bytes of JSON mapping each tensor
    name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets relative to the byte
    after the header), then the data. The mapping is private copy-on-write: the pages are the
    page cache's (no copy, reclaimable under memory pressure), and an in-place op on a tensor
    writes to a private copy, never to the checkpoint.

    ``fd``: read the file through this open descriptor (the caller's, kept open while this is
    used: a build's proof), not by ``path`` (then only named in messages). ``map_now=False``:
    mapped when a tensor is first asked for (a mapping holds a descriptor of its own), through
    ``fd``, or by ``path`` only if the file there is still the one whose header was read."""

    MAX_HEADER_BYTES = 100 << 20

    def __init__(self, path: Path, fd: int | None = None, *, map_now: bool = True) -> None:
        self.path = Path(path)
        self._fd = fd
        self._mapping_lock = threading.Lock()
        try:
            if fd is None:
                with open(self.path, "rb") as stream:
                    header, length, size = self._read(stream.fileno(), map_now)
            else:
                header, length, size = self._read(fd, map_now)
        except OSError as error:
            raise CheckpointError(f"cannot read {self.path}: {error.strerror or error}") from None
        if not isinstance(header, dict):
            raise CheckpointError(f"{self.path}: the safetensors header is not a JSON object")
        header.pop("__metadata__", None)
        self._base = 8 + length
        self._address: int | None = None  # where the mapping starts in memory, once asked
        self._entries = {name: self._entry(name, info, size - self._base) for name, info in header.items()}

    def _read(self, fd: int, map_now: bool) -> tuple[Any, int, int]:
        """Header (and the mapping, ``map_now``), both through ``fd`` (``pread``: its offset is not touched)."""
        stat = os.fstat(fd)
        size = stat.st_size
        raw = os.pread(fd, 8, 0)
        length = struct.unpack("<Q", raw)[0] if len(raw) == 8 else -1
        if not 0 < length <= min(self.MAX_HEADER_BYTES, size - 8):
            raise CheckpointError(f"{self.path} is not a safetensors file (header length {length})")
        try:
            header = json.loads(os.pread(fd, length, 8))
        except ValueError as error:
            raise CheckpointError(f"{self.path}: unreadable safetensors header ({error})") from None
        self._identity = _file_identity(stat)
        self._mapped = size <= 8 + length  # nothing to map: no data
        self._mmap: mmap.mmap | None = None
        if map_now:
            self._map(fd)
        return header, length, size

    def _map(self, fd: int) -> None:
        """Map the file (a mapping holds a descriptor of its own: Python's ``mmap`` keeps a dup)."""
        if not self._mapped:
            self._mmap = mmap.mmap(fd, 0, access=mmap.ACCESS_COPY)
            self._mapped = True

    def _mapping(self) -> mmap.mmap | None:
        """The mapping, made on first use (``map_now=False``): a checkpoint of hundreds of shards
        holds a descriptor only for the shards read so far. The file mapped is the one whose header
        was read (same inode, size and mtime), else a :class:`CheckpointError`."""
        if self._mapped:
            return self._mmap
        with self._mapping_lock:
            if not self._mapped:
                try:
                    if self._fd is not None:  # the proof's open: what the header was read through
                        self._map(self._fd)
                        return self._mmap
                    with open(self.path, "rb") as stream:
                        if _file_identity(os.fstat(stream.fileno())) != self._identity:
                            raise CheckpointError(f"{self.path} changed since its header was read")
                        self._map(stream.fileno())
                except OSError as error:
                    raise CheckpointError(f"cannot read {self.path}: {error.strerror or error}") from None
        return self._mmap

    def _entry(self, name: str, info: Any, data_bytes: int) -> tuple[list[int], torch.dtype, int, int]:
        try:
            dtype = _SAFETENSORS_DTYPES[info["dtype"]]
            shape = [int(d) for d in info["shape"]]
            begin, end = (int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{self.path}: bad header entry for {name!r}: {info!r}") from None
        count = math.prod(shape)
        if not 0 <= begin <= end <= data_bytes or end - begin != count * dtype.itemsize:
            raise CheckpointError(f"{self.path}: {name!r} offsets {begin}..{end} do not fit its shape or the file")
        return shape, dtype, begin, count

    def names(self) -> list[str]:
        return list(self._entries)

    def spec(self, name: str) -> tuple[list[int], torch.dtype]:
        shape, dtype, _, _ = self._entries[name]
        return shape, dtype

    def tensor(self, name: str, *, populate: bool = False) -> torch.Tensor:
        """A view of ``name``'s bytes; ``populate`` maps its pages now (the caller is about to
        read all of them), else they fault in when touched (lazy: warm starts)."""
        shape, dtype, begin, count = self._entries[name]
        if count == 0:
            return torch.empty(shape, dtype=dtype)
        mapping = self._mapping()
        if populate:
            self._populate(self._base + begin, count * dtype.itemsize)
        flat = torch.frombuffer(mapping, dtype=dtype, count=count, offset=self._base + begin)
        return flat.reshape(shape)

    def _span(self, view: torch.Tensor) -> tuple[int, int] | None:
        """The page-aligned byte range of the mapping under ``view``, or None if it is not in it."""
        if self._mmap is None or view.numel() == 0 or min(view.stride(), default=0) < 0:
            return None
        if self._address is None:
            self._address = torch.frombuffer(self._mmap, dtype=torch.uint8, count=1).data_ptr()
        first = view.data_ptr() - self._address
        span = sum((size - 1) * stride for size, stride in zip(view.shape, view.stride(), strict=True))
        end = first + (span + 1) * view.element_size()
        if first < 0 or end > len(self._mmap):
            return None
        start = first - first % mmap.PAGESIZE
        return start, end - start

    def map_view(self, view: torch.Tensor) -> bool:
        """Map the pages under ``view`` now (:meth:`_populate`); False if ``view`` is not in this file."""
        span = self._span(view)
        if span is not None:
            with contextlib.suppress(OSError, ValueError):
                self._mmap.madvise(_MADV_POPULATE_READ, *span)
        return span is not None

    def release_view(self, view: torch.Tensor) -> bool:
        """Release from this process the pages under ``view`` (a chunk of a tensor of this file, just
        converted); False if ``view`` is not in this file. The page cache keeps them, and a later
        touch maps them again (the mapping is private and unmodified)."""
        span = self._span(view)
        if span is not None:
            with contextlib.suppress(OSError, ValueError):
                self._mmap.madvise(mmap.MADV_DONTNEED, *span)
        return span is not None

    def release_tensor(self, name: str) -> None:
        """Release ``name``'s pages from this process and from the page cache (a streaming seed reads
        each tensor once). Safe while views of it live: the mapping is private and unmodified,
        so a later touch reads the bytes from the file again."""
        _, dtype, begin, count = self._entries[name]
        if count == 0 or self._mmap is None:
            return
        offset = self._base + begin
        start = offset - offset % mmap.PAGESIZE
        length = offset + count * dtype.itemsize - start
        try:
            self._mmap.madvise(mmap.MADV_DONTNEED, start, length)
            if self._fd is not None:
                os.posix_fadvise(self._fd, start, length, os.POSIX_FADV_DONTNEED)
            else:
                with open(self.path, "rb") as stream:
                    os.posix_fadvise(stream.fileno(), start, length, os.POSIX_FADV_DONTNEED)
        except (OSError, ValueError):
            pass  # only memory is at stake: the pages then stay until the mapping is closed

    def _populate(self, offset: int, length: int) -> None:
        """Map the tensor's pages in one call (``MADV_POPULATE_READ``, Linux 5.14+): a third
        faster than taking one page fault per 4 KiB while the loader transposes it."""
        start = offset - offset % mmap.PAGESIZE
        try:
            self._mmap.madvise(_MADV_POPULATE_READ, start, offset + length - start)
        except (OSError, ValueError):
            pass  # older kernel: the pages fault in on first touch instead


class CheckpointReader:
    """Lazy, renamed view of a safetensors checkpoint: ``keys()``, ``spec(key)`` and ``get(key)``.

    Files are memory-mapped once, each when a tensor of it is first read (a mapping holds a
    descriptor: a checkpoint of hundreds of shards holds one per shard read); a tensor is a view of
    the mapping whose bytes are read when the loader touches them, so peak host memory is what is
    being converted, not the model. :meth:`sharing_maps` gives each conversion worker of a build a
    reader of its own over the same mappings: one descriptor per shard, whatever the workers.

    ``proof``: a build's reader; every file (and the weight map) comes through it, proved to be
    what the build's content id names (it must outlive this reader). Without one, by path (tools)."""

    def __init__(self, checkpoint_dir: Path, rules: Sequence[KeyRule], proof: ProvenCheckpoint | None = None) -> None:
        self.checkpoint_dir = checkpoint_dir
        files = proof.checkpoint_files() if proof is not None else checkpoint_files(checkpoint_dir)

        def opened(shard: str) -> SafetensorsFile:
            return SafetensorsFile(checkpoint_dir / shard, proof.open(shard) if proof is not None else None,
                                   map_now=False)

        self._open: dict[str, SafetensorsFile] = {}
        if files.weight_map is None:
            self._open[files.shards[0]] = opened(files.shards[0])
            weight_map = {name: files.shards[0] for name in self._open[files.shards[0]].names()}
        else:
            weight_map = files.weight_map
        self._location: dict[str, tuple[str, str]] = {}
        for name, shard in weight_map.items():
            key = remap_key(name, rules)
            if key is not None:
                self._location[key] = (shard, name)
        for shard in sorted({shard for shard, _ in self._location.values()} - set(self._open)):
            self._open[shard] = opened(shard)
        self._owns_maps = True
        self._reset_reads()

    def sharing_maps(self) -> CheckpointReader:
        """A reader over this one's files and mappings with its own record of what it read and
        releases (one per thread: the mappings are shared, the streaming state is not). Closing it
        leaves the mappings to this reader."""
        sibling = object.__new__(CheckpointReader)
        sibling.checkpoint_dir = self.checkpoint_dir
        sibling._location = self._location
        sibling._open = self._open
        sibling._owns_maps = False
        sibling._reset_reads()
        return sibling

    def _reset_reads(self) -> None:
        self._read: list[str] = []  # keys read and not released yet (a streaming seed)
        self._recent: list[str] = []  # keys read since the last release: what the next put is made from
        self._keep: set[str] = set()
        self._release_due = False

    def keys(self) -> list[str]:
        return list(self._location)

    def __contains__(self, key: str) -> bool:
        return key in self._location

    def source_name(self, key: str) -> str:
        """The tensor's own name in the checkpoint (``key`` is the loader's)."""
        return self._location[key][1]

    def spec(self, key: str) -> tuple[list[int], torch.dtype]:
        """Shape and dtype from the safetensors header, without reading the tensor."""
        file, name = self._location[key]
        return self._open[file].spec(name)

    def get(self, key: str) -> torch.Tensor:
        try:
            file, name = self._location[key]
        except KeyError:
            raise CheckpointError(f"checkpoint {self.checkpoint_dir} has no tensor for {key!r}") from None
        if self._release_due:
            self._release_read()
        self._read.append(key)
        self._recent.append(key)
        shape, dtype = self._open[file].spec(name)
        return self._open[file].tensor(name, populate=math.prod(shape) * dtype.itemsize < POPULATE_BELOW_BYTES)

    def map_view(self, view: torch.Tensor) -> None:
        """Map the pages under ``view``, a chunk of a tensor read here, about to be converted."""
        any(opened.map_view(view) for opened in self._open.values())

    def release_view(self, view: torch.Tensor) -> None:
        """Release the pages under ``view``, a chunk of a tensor read here (see :meth:`SafetensorsFile.release_view`)."""
        any(opened.release_view(view) for opened in self._open.values())

    def release_read(self, keep: Iterable[str] = (), *, now: bool = False) -> None:
        """Release the pages of every tensor read so far but those in ``keep`` (see
        :meth:`SafetensorsFile.release_tensor`) when the next read begins: until then a weight may
        still be put from a tensor read before an earlier put (a family reads gate and up, then
        puts both). ``now``: at once (their bytes were copied out; a later touch reads them from
        the file again)."""
        self._keep = set(keep)
        if now:
            self._release_read()
        else:
            self._release_due = True

    def recent_keys(self) -> list[str]:
        """The tensors read since the last release (those the weight being put was made from)."""
        return list(self._recent)

    def _release_read(self) -> None:
        kept = []
        for key in self._read:
            if key in self._keep:
                kept.append(key)  # still tracked: a later release without it in ``keep`` releases it
            else:
                file, name = self._location[key]
                self._open[file].release_tensor(name)
        self._read = kept
        self._recent = []
        self._release_due = False

    def items(self) -> Iterator[tuple[str, torch.Tensor]]:
        for key in self._location:
            yield key, self.get(key)

    def close(self) -> None:
        if self._owns_maps:
            self._open.clear()
