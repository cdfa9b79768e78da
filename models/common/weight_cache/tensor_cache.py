# SPDX-License-Identifier: Apache-2.0
"""Turn host weights into ttnn tensors through the ``.tensorbin`` cache: the one place a loader
calls instead of ``ttnn.as_tensor``.

File names follow ``ttnn.as_tensor`` (``<prefix>_dtype_<DTYPE>_layout_<LAYOUT>.tensorbin``) so the
cache stays readable by plain ttnn code. What this adds:

* **Mesh placement on host**: a sharded weight becomes one host tensor per device, joined with
  ``ttnn.from_host_shards``; a replicated one is stored once and replicated on upload.
* **Atomic, overlapped writes**: converting (CPU-bound, inside ttnn) and writing the previous
  weight (I/O) run side by side on a writer thread; every file is published by atomic rename, so
  concurrent seeders and crashes never leave a torn tensorbin. Files are hashed once the build is
  done (:func:`~models.common.weight_cache.build.seal_files`), when their stamps have settled.
* **Placeholders never persist**: a cache miss, or an unreadable file, on a storage-free
  placeholder raises :class:`~models.common.weight_cache.WeightCacheError` (the loader then builds
  cold) instead of writing it to disk as a weight.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import ttnn
from loguru import logger

from models.common.fileio import atomic_output, fsync_dir, fsync_file, publish, unique_temp_path, writing_into
from models.common.mesh import MeshShape, Placement, shard_shape
from models.common.sharding import shard
from models.common.weight_cache.chunk_board import ChunkBoard
from models.common.weight_cache.layout import PRECISIONS as PRECISION_NAMES
from models.common.weight_cache.marker import WeightCacheError
from models.common.weight_cache.placeholders import is_placeholder_tensor
from models.common.weight_cache.stamps import FileStamp
from models.common.weight_cache.tensorbin import SourcePages, TensorbinError, check_written, streamable, write_blocks
from models.common.weight_cache.verified_open import open_verified

PRECISIONS: dict[str, Any] = {name: getattr(ttnn, name) for name in PRECISION_NAMES}  # name -> ttnn dtype


@dataclass(frozen=True)
class TensorFormat:
    """How the device model consumes one weight: ttnn dtype, layout and mesh placement."""

    dtype: Any
    layout: Any
    placement: Placement


# bytes per element of each ttnn dtype as stored (block floats: 16 mantissas share an exponent byte)
_STORED_BYTES = {"BFLOAT8_B": 1 + 1 / 16, "BFLOAT4_B": 0.5 + 1 / 16, "BFLOAT16": 2, "FLOAT32": 4}


def stored_bytes(fmt: TensorFormat, elements: int) -> int:
    """About what ``elements`` take converted to ``fmt`` (tile padding aside)."""
    return int(elements * _STORED_BYTES.get(fmt.dtype.name, 2))


def tensorbin_name(name: str, fmt: TensorFormat) -> str:
    """``ttnn.as_tensor``'s file name for weight ``name``, relative to the cache dir
    (``layers.3.attention.wqkv`` nests as ``layers.3/attention.wqkv_...``: one directory per
    layer keeps directories small)."""
    parts = name.split(".")
    stem = name
    if len(parts) > 2 and parts[0] == "layers" and parts[1].isdigit():
        stem = f"layers.{parts[1]}/{'.'.join(parts[2:])}"
    return f"{stem}_dtype_{fmt.dtype.name}_layout_{fmt.layout.name}.tensorbin"


BLOCK_FLOATS = frozenset({"BFLOAT8_B", "BFLOAT4_B"})
STAGED_CONVERT_BYTES = 64 << 20  # bf16 weights from this size convert to a block float in two steps
STREAM_BLOCKS_FROM = 64 << 20  # a cold build writes weights from this size block by block (tensorbin.py)


def convert_shards(shards: list[torch.Tensor], fmt: TensorFormat, *, staged_from: int | None = None,
                   release_source: Callable[[], None] | None = None) -> list[ttnn.Tensor]:
    """``ttnn.from_torch`` of each shard of one weight.

    A large bf16 weight bound for a block float (bfloat8_b, bfloat4_b) goes through bf16 tiles
    first, then ``ttnn.to_dtype``: the same bytes (bf16 to bf16 tiles is exact), but the direct call
    holds a float32 copy and, for a strided view, a contiguous one too: about a tensor's size more
    at its peak, and an LM head's conversion is a streaming seed's peak RSS. Between the two steps
    ``release_source`` (a streaming seed's) drops the checkpoint pages the shards view: the tiles
    hold the bytes now; a strided view (a transposed head) is first copied contiguous, so that
    its pages go before the tiling (figures: docs/scale.md)."""
    staged_from = STAGED_CONVERT_BYTES if staged_from is None else staged_from
    large = sum(s.numel() * s.element_size() for s in shards) >= staged_from
    staged = (fmt.layout == ttnn.TILE_LAYOUT and fmt.dtype.name in BLOCK_FLOATS
              and all(s.dtype == torch.bfloat16 for s in shards) and large)
    pending = list(shards)
    if (release_source is not None and large and fmt.layout == ttnn.TILE_LAYOUT
            and not all(s.is_contiguous() for s in pending)):
        # tiling a strided view (a transposed head) makes a contiguous copy inside ttnn while the
        # source pages stay: make it here, so they can go first (bf16 targets too)
        pending = [s.contiguous() for s in pending]
        release_source()
        release_source = None
    if not staged:
        converted = []
        while pending:  # each copy goes as soon as its conversion exists
            converted.append(ttnn.from_torch(pending.pop(0), dtype=fmt.dtype, layout=fmt.layout))
        return converted
    tiles = []
    while pending:  # each copy goes as soon as its tiles exist
        tiles.append(ttnn.from_torch(pending.pop(0), dtype=ttnn.bfloat16, layout=ttnn.TILE_LAYOUT))
    if release_source is not None:
        release_source()
    converted = []
    while tiles:  # each shard's bf16 tiles go as soon as its block floats exist
        converted.append(ttnn.to_dtype(tiles.pop(0), fmt.dtype))
    return converted


def to_host_ttnn(shards: list[torch.Tensor], fmt: TensorFormat, mesh: MeshShape, *,
                 release_source: Callable[[], None] | None = None) -> ttnn.Tensor:
    """Convert on host: one ttnn tensor per device shard, joined for the mesh."""
    converted = convert_shards(shards, fmt, release_source=release_source)
    if len(converted) == 1:
        return converted[0]
    return ttnn.from_host_shards(converted, ttnn.MeshShape(*mesh))


def layout_mismatch(loaded: ttnn.Tensor, expected: torch.Tensor, fmt: TensorFormat, mesh: MeshShape) -> str | None:
    """How a loaded tensor differs from what the loader expects (dtype, layout, shard count,
    per-device shape), or None. ``expected`` may be a placeholder: only its shape is used."""
    if loaded.dtype != fmt.dtype:
        return f"has dtype {loaded.dtype}, expected {fmt.dtype}"
    if loaded.layout != fmt.layout:
        return f"has layout {loaded.layout}, expected {fmt.layout}"
    try:
        want_count, want_shape = shard_shape(expected.shape, fmt.placement, mesh)
    except ValueError as error:
        return f"cannot be placed: {error}"
    try:
        count = len(ttnn.get_device_tensors(loaded))
    except Exception:  # noqa: BLE001 - a single-device tensor on some ttnn builds
        count = 1
    if count != want_count:
        return f"holds {count} device tensors, expected {want_count}"
    if tuple(loaded.shape) != want_shape:
        return f"has shape {tuple(loaded.shape)}, expected {want_shape}"
    return None


def host_shards(tensor: ttnn.Tensor) -> list[torch.Tensor]:
    """The per-device torch tensors of a host ttnn tensor (one for a replicated weight)."""
    devices = ttnn.get_device_tensors(tensor)
    return [ttnn.to_torch(t) for t in devices] if len(devices) > 1 else [ttnn.to_torch(tensor)]


@contextlib.contextmanager
def conversion_threads() -> Iterator[None]:
    """Run a cold build's torch ops on one thread.

    The host transforms (a QKV concat, an fp32 norm) are copies of a few MiB; with torch's
    default intra-op pool, its OpenMP workers spin after every op and take the cores that
    ``ttnn.from_torch`` (itself multi-threaded) needs, and a small cat becomes hundreds of times
    slower than on one thread (figures: docs/weight-cache.md)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


class TensorCache:
    """Loads cached weights and, on a cold build, converts and persists the missing ones.

    ``rebuild=True`` (a cold build) converts every weight even when its file exists, so files of
    an older checkpoint are never mixed into a new build; with ``cache_dir=None`` it converts
    without writing (a cache that cannot be written). ``mesh_device`` (a real card's mesh) is
    where tensors go after load; None keeps them on host.

    Used as a context manager it aborts unless :meth:`finish` returned: an error (or a signal's
    exception) inside the block cancels the writes still queued, and the writer thread is gone
    when the block is left::

        with TensorCache(root, mesh, rebuild=True) as cache:
            family.convert(sink, args)  # cache.as_tensor(...) per weight
            written = cache.finish()
    """

    def __init__(
        self,
        cache_dir: Path | None,
        mesh: MeshShape,
        *,
        rebuild: bool,
        mesh_device: Any = None,
        memory_config: Any = None,
        recorded: Mapping[str, FileStamp | None] | None = None,
        max_pending_bytes: int | None = None,
        on_written: Callable[[str, int], None] | None = None,
        chunk_board: ChunkBoard | None = None,
    ) -> None:
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self._root = os.fspath(cache_dir) if cache_dir is not None else ""
        self.mesh = mesh
        self.rebuild = rebuild
        self.mesh_device = mesh_device
        self.memory_config = memory_config
        self.files: list[str] = []
        self.convert_seconds = 0.0  # time inside ttnn.from_torch (the conversion proper)
        self.wait_seconds = 0.0  # time the converter waited for the writer (a streaming seed)
        self.dump_seconds = 0.0  # writer thread: ttnn.dump_tensor into the temp file
        self.fsync_seconds = 0.0  # writer thread: making each file's data durable
        self._pending: list[tuple[str, Future, int]] = []  # (weight name, future [relative paths written], bytes)
        self.written: list[str] = []  # relative paths of the files written so far
        # A streaming seed bounds the converted tensors waiting for the writer (memory flat in
        # model size; a byte budget, not a count, so small weights rarely wait on an fsync) and
        # reports each weight once its file is written (``on_written(name, bytes)``).
        self.max_pending_bytes = max_pending_bytes
        self.on_written = on_written
        self.chunk_board = chunk_board  # a build's conversion workers: large weights' chunks shared among them
        self.write_errors: list[str] = []  # a read-only or full cache dir: the build goes on in memory
        self.recorded = recorded  # warm: {file: stamp the gate verified} of the marker (None: any)
        writes = rebuild and cache_dir is not None
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tensorbin-writer") if writes else None
        self.finished = False  # finish() returned: every write done, or reported in write_errors
        self._unpublished: dict[Path, contextlib.ExitStack] = {}  # block-written temps the writer has not published

    def as_tensor(self, name: str, tensor: torch.Tensor, fmt: TensorFormat, *,
                  release_source: Callable[[], None] | None = None,
                  pages: SourcePages | None = None) -> ttnn.Tensor:
        """The cached weight (warm), or ``tensor`` converted and queued to be written (cold).
        ``release_source``: see :func:`convert_shards`; ``pages``: maps and drops the checkpoint pages
        under each chunk of a large weight around its conversion (see :meth:`_write_blocks`)."""
        relative = tensorbin_name(name, fmt)
        self.files.append(relative)
        if not self.rebuild:
            result = self._load(relative, name, tensor, fmt)
        else:
            if is_placeholder_tensor(tensor):
                raise WeightCacheError(f"cold build of {name} was handed a placeholder, not a weight")
            # TILE conversions read strided views themselves: no torch copy of a transposed weight
            # first: faster, and the files are bit-identical (figures: docs/weight-cache.md)
            if self.max_pending_bytes is not None:
                # before converting, too: a large weight still waiting for the writer and the next
                # one's conversion (source, tiles, block floats) would add up to a seed's peak
                start = time.perf_counter()
                self._drain(self.max_pending_bytes)
                self.wait_seconds += time.perf_counter() - start
            shards = shard(tensor, fmt.placement, self.mesh, copy=fmt.layout != ttnn.TILE_LAYOUT)
            start = time.perf_counter()
            if (self._writer is not None and tensor.numel() * tensor.element_size() >= STREAM_BLOCKS_FROM
                    and streamable(shards, fmt.layout)):
                result = self._write_blocks(name, relative, shards, fmt, release_source, pages)
                self.convert_seconds += time.perf_counter() - start
                if result is not None:
                    return self._to_device(result)
                start = time.perf_counter()
            result = to_host_ttnn(shards, fmt, self.mesh, release_source=release_source)
            self.convert_seconds += time.perf_counter() - start
            if self._writer is None:  # converting only
                return self._to_device(result)
            nbytes = stored_bytes(fmt, sum(s.numel() for s in shards))
            self._pending.append((name, self._writer.submit(self._guarded, self._write, relative, result), nbytes))
            if self.max_pending_bytes is not None:
                start = time.perf_counter()
                # the newest always waits its turn; the ones before it may hold at most the budget
                while len(self._pending) > 1 and sum(p[2] for p in self._pending[:-1]) > self.max_pending_bytes:
                    self._collect(*self._pending.pop(0)[:2])
                self.wait_seconds += time.perf_counter() - start
        return self._to_device(result)

    def _write_blocks(self, name: str, relative: str, shards: list[torch.Tensor], fmt: TensorFormat,
                      release_source: Callable[[], None] | None, pages: SourcePages | None) -> ttnn.Tensor | None:
        """Write a large weight's file block by block (:mod:`~models.common.weight_cache.tensorbin`:
        no full converted copy in memory, the same bytes as a whole conversion) into a temp file,
        then release its source; the writer thread makes it durable and publishes it, overlapped
        with the next conversions. Returns the file, mapped lazily; None: convert it whole instead
        (its header cannot be derived, or the cache cannot be written: the build goes on in memory)."""
        if self.write_errors:
            return None
        path = self.cache_dir / relative
        temp = unique_temp_path(path, ".tensorbin")
        with contextlib.ExitStack() as writing:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                writing.enter_context(writing_into(path.parent))  # held until published: clean keeps the temp
                fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
                try:
                    write_blocks(fd, os.fspath(path.parent), shards, fmt, self.mesh, pages=pages, board=self.chunk_board)
                finally:
                    os.close(fd)
                problem = check_written(os.fspath(temp), shards, fmt, self.mesh)
                if problem:
                    raise TensorbinError(f"the file written block by block {problem}")
                loaded = ttnn._ttnn.tensor.load_tensor_flatbuffer(os.fspath(temp), None)  # mapped: the inode stays
            except TensorbinError as error:
                temp.unlink(missing_ok=True)
                logger.warning(f"{name}: converting it whole ({error})")
                return None
            except (OSError, RuntimeError) as error:
                temp.unlink(missing_ok=True)
                self.write_errors.append(str(error))
                logger.warning(f"Cannot write the weight cache {self.cache_dir} ({error}); building in memory only")
                return None
            except BaseException:  # the build stopped (an interrupt, another worker's failure): no temp stays
                temp.unlink(missing_ok=True)
                raise
            self._unpublished[temp] = writing.pop_all()
        if release_source is not None:
            release_source()
        future = self._writer.submit(self._guarded, self._publish, temp, path, relative)
        self._pending.append((name, future, 0))
        return loaded

    def _publish(self, temp: Path, path: Path, relative: str) -> list[str]:
        """The writer thread's part of a block-by-block write: data durable, then renamed in."""
        with self._unpublished.pop(temp):
            try:
                start = time.perf_counter()
                fsync_file(temp)  # data durable now; the directory entries are synced in finish()
                self.fsync_seconds += time.perf_counter() - start
                publish(temp, path, durable=False)
            except BaseException:
                temp.unlink(missing_ok=True)
                raise
        return [relative]

    def _drain(self, budget: int) -> None:
        """Wait for the oldest writes until at most ``budget`` bytes of converted weights wait."""
        while self._pending and sum(p[2] for p in self._pending) > budget:
            self._collect(*self._pending.pop(0)[:2])

    def _to_device(self, result: ttnn.Tensor) -> ttnn.Tensor:
        if self.mesh_device is not None:
            result = ttnn.to_device(result, self.mesh_device, memory_config=self.memory_config)
        return result

    def _load(self, relative: str, name: str, tensor: torch.Tensor, fmt: TensorFormat) -> ttnn.Tensor:
        """Load a cached file, opened once, proved to be the one the gate verified (ttnn may
        crash the process on a forged file, so one replaced since the gate is never handed to it)
        and copied into sealed memory that ttnn maps instead of the file (one truncated or
        rewritten later cannot reach the tensor), and check it is the tensor asked for. Any failure (a torn or forged file can make ttnn raise
        anything, ``MemoryError`` included) is a :class:`WeightCacheError` naming the file: the
        loader then builds cold, or reports it without a checkpoint."""
        path = os.path.join(self._root, relative)
        if self.recorded is not None and relative not in self.recorded:
            raise WeightCacheError(f"{relative} (weight {name}) is not among the files the marker vouches for")
        verified = self.recorded.get(relative) if self.recorded is not None else None
        with open_verified(path, verified, what=f"cached file of {name}") as opened:
            try:  # ttnn.load_tensor's own loader: load_tensor insists on a ``.tensorbin`` name
                loaded = ttnn._ttnn.tensor.load_tensor_flatbuffer(opened.path, None)
            except Exception as error:  # noqa: BLE001 - whatever a bad file makes ttnn raise
                raise WeightCacheError(
                    f"cached {path} of {name} is unreadable ({type(error).__name__}: {error})") from None
        problem = layout_mismatch(loaded, tensor, fmt, self.mesh)
        if problem:
            raise WeightCacheError(f"cached {path} of {name} {problem}")
        return loaded

    def _write(self, relative: str, tensor: ttnn.Tensor) -> list[str]:
        path = self.cache_dir / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_output(path, durable=False, suffix=".tensorbin") as temp:
            start = time.perf_counter()
            ttnn.dump_tensor(temp, tensor)
            dumped = time.perf_counter()
            fsync_file(temp)  # data durable now; the directory entries are synced in finish()
            self.dump_seconds += dumped - start
            self.fsync_seconds += time.perf_counter() - dumped
        return [relative]

    def submit_file(self, write: Callable[..., list[str]], *args: Any) -> Future:
        """Run another file writer (returning the relative paths it wrote) on the writer thread,
        overlapped with conversion like the tensorbins; its future."""
        future = self._writer.submit(self._guarded, write, *args)
        self._pending.append(("", future, 0))
        return future

    def _guarded(self, write: Callable[..., list[str]], *args: Any) -> list[str]:
        """Run a writer; a cache dir that cannot be written is reported once, not fatal: the
        tensors are already converted, so the build succeeds and only the caching is lost."""
        if self.write_errors:
            return []
        try:
            return write(*args)
        except (OSError, RuntimeError) as error:
            self.write_errors.append(str(error))
            logger.warning(f"Cannot write the weight cache {self.cache_dir} ({error}); building in memory only")
            return []

    def finish(self) -> list[str]:
        """Wait for every write; return the relative paths of the files written."""
        for name, future, _ in self._pending:
            self._collect(name, future)
        self._pending.clear()
        if not self.write_errors:
            for directory in {(self.cache_dir / relative).parent for relative in self.written}:
                fsync_dir(directory)
        if self._writer is not None:
            self._writer.shutdown(wait=True)
        self._drop_unpublished()
        self.finished = True
        return list(self.written)

    def _collect(self, name: str, future: Future) -> None:
        """Wait for one write; report a weight's file to ``on_written``."""
        written = future.result()
        self.written.extend(written)
        if self.on_written is not None and name:
            for relative in written:
                self.on_written(name, os.stat(os.path.join(self._root, relative)).st_size)

    def __enter__(self) -> TensorCache:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if not self.finished:
            self.abort()

    def abort(self) -> None:
        """Cancel the writes not yet started, wait for the one running, stop the writer thread."""
        for _, future, _ in self._pending:
            future.cancel()
        if self._writer is not None:
            self._writer.shutdown(wait=True, cancel_futures=True)
        self._pending.clear()
        self._drop_unpublished()

    def _drop_unpublished(self) -> None:
        """Block-written temps the writer never published (cancelled, or skipped after a write error):
        removed, and their directory locks let go."""
        for temp, writing in list(self._unpublished.items()):
            with writing:
                temp.unlink(missing_ok=True)
        self._unpublished.clear()
