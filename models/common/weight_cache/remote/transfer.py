# SPDX-License-Identifier: Apache-2.0
"""Moving one object between a cache dir and a store, each way proved against the object's name.

**The rule**: no byte moves under a digest it was not checked against. An upload reads the local
file once, hashing as it reads, and raises before the store is handed its last part when the bytes
are not the digest's (:func:`verified_parts`); a download hashes as it writes and names the file
by its digest only once the whole of it matched (:func:`fetch_object`). A local file is read as it
is now, not as the marker remembers it: a cache file changed since its build is never pushed.

Each download strategy is one function, read top to bottom (after huggingface_hub's
``_download_to_tmp_and_move``).

**Large objects in ranges**: one stream per object left the largest (an embedding, 1 GB) alone at
the end of a pull, on one connection. An object of more than two :data:`RANGE_BYTES` is fetched as
ranged reads, :data:`RANGE_THREADS` in flight; the ranges are hashed and written in order as they
arrive, so the part file is always a hashed prefix (a kill resumes from it, as from one stream).
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Protocol, TypeVar

import blake3

from models.common.fileio import HASH_READ_BYTES, fsync_dir, write_all
from models.common.weight_cache.remote.store_layout import object_key
from models.common.weight_cache.remote.stores import Store, StoreIntegrityError, read_range_into

PART_SUFFIX = ".part"
RANGE_BYTES = 16 << 20  # one ranged read of a large object
RANGE_THREADS = 4  # ranges of one object in flight (memory: RANGE_THREADS + 2 ranges per object)
_STAGED_NAME = re.compile(r"[0-9a-f]{64}(?:\.part)?")
T = TypeVar("T")


class TransferProgress(Protocol):
    """The seeding progress protocol (:class:`models.seeding.progress.ProgressTracker` shows it):
    ``start`` once, ``weight_done`` per object moved, ``finish`` once."""

    def start(self, total_weights: int, total_bytes: int) -> None: ...

    def weight_done(self, name: str, nbytes: int) -> None: ...

    def finish(self) -> None: ...


class DigestMismatch(StoreIntegrityError):
    """Bytes that are not what their name says (the message names the object and where it was read)."""


def verified_parts(path: Path, digest: str, size: int) -> Iterator[bytes]:
    """A local file's bytes in chunks, hashed as they are read; raises :class:`DigestMismatch`
    (after the last chunk, before the generator ends) when they are not ``size`` bytes hashing
    to ``digest``. A consumer publishes only once the generator ended without error."""
    hasher = blake3.blake3(max_threads=1)
    seen = 0
    with open(path, "rb", buffering=0) as stream:
        while chunk := stream.read(HASH_READ_BYTES):
            seen += len(chunk)
            if seen > size:
                break
            hasher.update(chunk)
            yield chunk
    if seen != size or hasher.hexdigest() != digest:
        raise DigestMismatch(f"{path} is not the file its marker recorded (size or digest changed since the build)")


def staged_path(staging: Path, digest: str) -> Path:
    """Where a verified object waits in a cache dir for its pull's generation."""
    return staging / digest


def is_staged_name(name: str) -> bool:
    """A name a pull gives a file in its staging dir (a verified object or a partial one)."""
    return _STAGED_NAME.fullmatch(name) is not None


def fetch_object(store: Store, digest: str, size: int, staging: Path,
                 buffers: RangeBuffers | None = None) -> tuple[Path, int]:
    """One object into ``staging/<digest>``, verified; returns (its path, bytes fetched now).

    1. Staged already (a pull killed after it): hashed again, kept when it is still the object.
    2. A partial ``<digest>.part`` of a killed pull: hashed, and only the rest asked for (a range).
    3. The rest streamed into the part file, hashed as written, never beyond ``size``.
    4. Size and digest checked; a mismatch removes the part file and raises. Then fsync, and the
       part file is renamed to the digest: only a verified object ever has that name.
    """
    staging.mkdir(parents=True, exist_ok=True)
    final = staged_path(staging, digest)
    if final.is_file() and final.stat().st_size == size:
        if _digest_of(final) == digest:
            return final, 0
    with contextlib.suppress(FileNotFoundError):
        final.unlink()  # not the object (damaged since it was staged): fetch it again

    part = final.with_name(digest + PART_SUFFIX)
    hasher = blake3.blake3(max_threads=1)
    fd = os.open(part, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        have = _hash_prefix(fd, hasher, size)
        os.ftruncate(fd, have)  # a torn tail beyond what was hashed is dropped
        os.lseek(fd, have, os.SEEK_SET)
        fetched = 0
        for chunk in _pieces(store, digest, have, size, part, buffers or RangeBuffers()):
            if have + fetched + len(chunk) > size:
                raise _mismatch(part, store, digest, f"is longer than the manifest's {size:,} bytes")
            hasher.update(chunk)
            write_all(fd, chunk)
            fetched += len(chunk)
        if have + fetched != size:
            raise _mismatch(part, store, digest, f"is {have + fetched:,} bytes, the manifest says {size:,}")
        if hasher.hexdigest() != digest:
            raise _mismatch(part, store, digest, "does not hash to its name")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(part, final)
    fsync_dir(staging)
    return final, fetched


def _pieces(store: Store, digest: str, start: int, size: int, part: Path,
            buffers: RangeBuffers) -> Iterator[bytes | memoryview]:
    """The object's bytes from ``start`` on, in order: one stream, or (more than two ranges left)
    ranged reads, :data:`RANGE_THREADS` in flight, each read straight into a buffer of ``buffers``
    and yielded whole once it arrived (the buffer is reused once the consumer asks for the next)."""
    key = object_key(digest)
    if size - start <= 2 * RANGE_BYTES:
        yield from store.read(key, start=start) if start < size else ()
        return

    def fetch(first: int) -> bytearray:
        want = min(first + RANGE_BYTES, size) - first
        buffer = buffers.take()
        try:
            filled = read_range_into(store, key, first, memoryview(buffer)[:want])
        except BaseException:
            buffers.give(buffer)
            raise
        if filled != want:
            buffers.give(buffer)
            raise _mismatch(part, store, digest, f"is shorter than the manifest's {size:,} bytes")
        return buffer

    firsts = iter(range(start, size, RANGE_BYTES))
    with ThreadPoolExecutor(RANGE_THREADS, thread_name_prefix="range") as pool:
        pending = deque(pool.submit(fetch, first) for _, first in zip(range(RANGE_THREADS + 1), firsts))
        held: bytearray | None = None
        try:
            first = start
            while pending:
                data = pending.popleft().result()
                if held is not None:
                    buffers.give(held)
                held = data
                if (following := next(firsts, None)) is not None:
                    pending.append(pool.submit(fetch, following))
                yield memoryview(data)[:min(RANGE_BYTES, size - first)]
                first += RANGE_BYTES
        finally:
            for future in pending:
                future.cancel()
            for future in pending:  # a range read under way still holds its buffer: back once it ends
                with contextlib.suppress(BaseException):
                    if not future.cancelled():
                        buffers.give(future.result())
            if held is not None:
                buffers.give(held)


class RangeBuffers:
    """Buffers of :data:`RANGE_BYTES` for ranged reads, reused for the whole of one pull: a range is
    received straight into one (no ``bytes`` per read, no copy, no fresh pages to fault in). Never
    more than one large object has at once: ``RANGE_THREADS + 1`` read or queued, one being written."""

    def __init__(self) -> None:
        self._free: list[bytearray] = []
        self._lock = threading.Lock()

    def take(self) -> bytearray:
        with self._lock:
            if self._free:
                return self._free.pop()
        return bytearray(RANGE_BYTES)

    def give(self, buffer: bytearray) -> None:
        with self._lock:
            self._free.append(buffer)


def _hash_prefix(fd: int, hasher: blake3.blake3, size: int) -> int:
    """Feed what a part file already holds (at most ``size`` bytes) to ``hasher``; its length."""
    have = 0
    while have < size and (chunk := os.pread(fd, min(HASH_READ_BYTES, size - have), have)):
        hasher.update(chunk)
        have += len(chunk)
    return have


def _digest_of(path: Path) -> str:
    hasher = blake3.blake3(max_threads=1)
    with open(path, "rb", buffering=0) as stream:
        while chunk := stream.read(HASH_READ_BYTES):
            hasher.update(chunk)
    return hasher.hexdigest()


def _mismatch(part: Path, store: Store, digest: str, problem: str) -> DigestMismatch:
    """Drop a part file whose bytes are wrong (resuming it would only repeat them)."""
    with contextlib.suppress(FileNotFoundError):
        part.unlink()
    return DigestMismatch(f"{store.url}: object {object_key(digest)} {problem}; nothing was kept")


def run_all(function: Callable[[T], Any], items: Iterable[T], threads: int) -> list[Any]:
    """``function`` over ``items`` on ``threads`` threads; the first error is raised once the
    transfers under way ended, and no new one starts after it."""
    items = list(items)
    if not items:
        return []
    with ThreadPoolExecutor(max(1, min(threads, len(items))), thread_name_prefix="transfer") as pool:
        futures = [pool.submit(function, item) for item in items]
        wait(futures, return_when=FIRST_EXCEPTION)
        failed = next((f for f in futures if f.done() and f.exception() is not None), None)
        if failed is not None:
            for future in futures:
                future.cancel()
            raise failed.exception()  # type: ignore[misc]
        return [future.result() for future in futures]
