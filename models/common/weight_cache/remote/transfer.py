# SPDX-License-Identifier: Apache-2.0
"""Moving one object between a cache dir and a store, each way proved against the object's name.

**The rule**: no byte moves under a digest it was not checked against. An upload reads the local
file once, hashing as it reads, and raises before the store is handed its last part when the bytes
are not the digest's (:func:`verified_parts`); a download hashes as it writes and names the file
by its digest only once the whole of it matched (:func:`fetch_object`). A local file is read as it
is now, not as the marker remembers it: a cache file changed since its build is never pushed.

Each download strategy is one function, read top to bottom (after huggingface_hub's
``_download_to_tmp_and_move``).

**One stream per object, through one small buffer.** A download is one GET received piece by
piece into a buffer of :data:`PIECE_BYTES`, each piece hashed and written while it is still in the
CPU's cache, in order, so the part file is always a hashed prefix (a kill resumes from it with a
range request). The ranged reads this replaced (16 MiB ranges, four in flight per object, each
received into a 16 MiB buffer, then hashed and written in order) took 13.4 s for a 4.8 GB variant
where this takes 6.9 s and ``s5cmd`` 6.9 s (five interleaved rounds, page cache dropped): a 16 MiB
buffer leaves the CPU's cache between its receive, its hash and its write. A pull moves
:data:`~.stores.TRANSFER_THREADS` objects at once, the largest first, so the largest is never
alone at the end.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Protocol, TypeVar

import blake3

from models.common.file_snapshot import MirroredWrite, reserve_kept
from models.common.fileio import HASH_READ_BYTES, fsync_dir, write_all
from models.common.weight_cache.remote.store_layout import object_key
from models.common.weight_cache.remote.stores import Store, StoreIntegrityError, read_through

PART_SUFFIX = ".part"
PIECE_BYTES = 1 << 20  # a download's buffer: one receive, hashed and written while in the CPU's cache
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


def fetch_object(store: Store, digest: str, size: int, staging: Path) -> tuple[Path, int]:
    """One object into ``staging/<digest>``, verified; returns (its path, bytes fetched now).

    1. Staged already (a pull killed after it): hashed again, kept when it is still the object.
    2. A partial ``<digest>.part`` of a killed pull: hashed, and only the rest asked for (a range).
    3. The rest streamed into the part file, hashed as written, never beyond ``size``.
    4. Size and digest checked; a mismatch removes the part file and raises. Then fsync, and the
       part file is renamed to the digest: only a verified object ever has that name.

    Inside :func:`~models.common.file_snapshot.keeping_snapshots` (a load that pulls, then reads
    warm) the object's bytes also go into a memfd kept for that read, within its memory budget
    (:class:`~models.common.file_snapshot.MirroredWrite`)."""
    staging.mkdir(parents=True, exist_ok=True)
    final = staged_path(staging, digest)
    keep = reserve_kept(size)
    if final.is_file() and final.stat().st_size == size:
        fd = os.open(final, os.O_RDONLY)
        try:
            with _mirror(fd, size, final, keep) as mirror:
                hasher = blake3.blake3(max_threads=1)
                if _hash_prefix(fd, hasher, size, mirror) == size and hasher.hexdigest() == digest:
                    if mirror is not None:
                        mirror.keep()
                    return final, 0
        finally:
            os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        final.unlink()  # not the object (damaged since it was staged): fetch it again

    part = final.with_name(digest + PART_SUFFIX)
    hasher = blake3.blake3(max_threads=1)
    fd = os.open(part, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        with _mirror(fd, size, part, keep) as mirror:
            have = _hash_prefix(fd, hasher, size, mirror)
            os.ftruncate(fd, have)  # a torn tail beyond what was hashed is dropped
            os.lseek(fd, have, os.SEEK_SET)
            fetched = 0
            buffer = memoryview(bytearray(PIECE_BYTES))
            for chunk in read_through(store, object_key(digest), have, buffer) if have < size else ():
                if have + fetched + len(chunk) > size:
                    raise _mismatch(part, store, digest, f"is longer than the manifest's {size:,} bytes")
                hasher.update(chunk)
                if mirror is None:
                    write_all(fd, chunk)
                else:
                    mirror.write(chunk)
                fetched += len(chunk)
            if have + fetched != size:
                raise _mismatch(part, store, digest, f"is {have + fetched:,} bytes, the manifest says {size:,}")
            if hasher.hexdigest() != digest:
                raise _mismatch(part, store, digest, "does not hash to its name")
            if mirror is not None:
                mirror.finish()
            os.fsync(fd)
            if mirror is not None:
                mirror.keep()
    finally:
        os.close(fd)
    os.replace(part, final)
    fsync_dir(staging)
    return final, fetched


def _mirror(fd: int, size: int, path: Path, keep: bool) -> contextlib.AbstractContextManager[MirroredWrite | None]:
    return MirroredWrite(fd, size, str(path)) if keep else contextlib.nullcontext()


def _hash_prefix(fd: int, hasher: blake3.blake3, size: int, mirror: MirroredWrite | None = None) -> int:
    """Feed what a file already holds (at most ``size`` bytes) to ``hasher`` (and ``mirror``); its length."""
    if mirror is not None:
        have = min(os.fstat(fd).st_size, size)
        mirror.take_prefix(have, hasher.update)
        return have
    have = 0
    while have < size and (chunk := os.pread(fd, min(HASH_READ_BYTES, size - have), have)):
        hasher.update(chunk)
        have += len(chunk)
    return have


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
