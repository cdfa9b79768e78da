# SPDX-License-Identifier: Apache-2.0
"""The one home of durable file writes, file locks and content hashing.

Every cache in this package (the ttnn weight cache, the prefill-feature cache) publishes files
the same way, so the rules live here once:

* **Atomic publish.** A file is written to a temp name unique to the writer (pid, thread and a
  random token, in the destination's directory so the rename never crosses a file system), its
  data is fsynced, then ``os.replace`` moves it into place and the directory entry is fsynced.
  A reader sees either the old file or the complete new one, never a torn one, and a SIGKILL
  leaves at most a stray ``*.tmp.*`` file that no reader ever opens.
* **Locks** are ``flock`` on a dedicated lock file: released by the kernel when the holder dies,
  so a killed writer never wedges the next one.
* **Hashing** reads files in large blocks (never maps them: a file truncated under a mapping kills
  the process): SHA-256 where a format promises SHA-256, and the much faster, multi-threaded
  BLAKE3 for content digests of weight files.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import secrets
import stat
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import blake3

from models.common.cpus import usable_cpus

T = TypeVar("T")
R = TypeVar("R")

TEMP_MARK = ".tmp."


_TEMP_NAME = re.compile(r"^\.(?P<name>.+)\.tmp\.(?P<pid>\d+)\.(?P<thread>[0-9a-f]+)\.(?P<token>[0-9a-f]{8})(?:\.[A-Za-z0-9_]+)?$")


def unique_temp_path(path: Path, suffix: str = "") -> Path:
    """A sibling of ``path`` that no other writer (process or thread) will ever pick:
    ``.<name>.tmp.<pid>.<thread>.<token>[suffix]``.

    ``suffix`` is appended for writers that insist on a file extension (``ttnn.dump_tensor``)."""
    path = Path(path)
    token = f"{os.getpid()}.{threading.get_ident() & 0xFFFFFF:x}.{secrets.token_hex(4)}"
    return path.with_name(f".{path.name}{TEMP_MARK}{token}{suffix}")


def is_temp_path(path: Path) -> bool:
    """True exactly for names made by :func:`unique_temp_path` (debris of a killed writer);
    a user's ``.env.tmp.2024`` or ``.zshrc.tmp.orig`` is not one."""
    return _TEMP_NAME.match(Path(path).name) is not None


def try_flock(fd: int, *, exclusive: bool) -> bool:
    """Take an ``flock`` on ``fd`` without waiting: True when taken, False when another holder
    has a conflicting lock; any other failure (no ``flock`` on this file system) raises."""
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        raise
    return True


@contextlib.contextmanager
def writing_into(directory: Path) -> Iterator[None]:
    """Announce a writer in ``directory`` for the block: a shared ``flock`` on the directory.

    Liveness is decided by this lock, not by a pid (a pid means nothing across PID namespaces
    or hosts): :func:`temp_writer_alive` asks for the exclusive lock, which the kernel refuses
    while any writer is inside the block, and grants as soon as the writer died."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        yield  # the write below reports the real problem
        return
    try:
        with contextlib.suppress(OSError):  # a file system without flock: temps are then never cleaned
            fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


def temp_writer_alive(path: Path) -> bool:
    """Whether a writer may still be writing the :func:`unique_temp_path` temp file ``path``.

    True while any writer holds its :func:`writing_into` lock on the file's directory (or when
    that cannot be told: a file system without ``flock``); False once none does, so the temp is
    debris of a dead writer and safe to delete."""
    try:
        fd = os.open(Path(path).parent, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return True
    return held_by_others(fd)


def held_by_others(fd: int) -> bool:
    """Whether anyone else holds a ``flock`` (shared or exclusive) on ``fd``'s file: an exclusive
    probe, released at once (``fd`` is closed). Where ``flock`` fails it cannot be told: held."""
    try:
        return not try_flock(fd, exclusive=True)
    except OSError:
        return True
    finally:
        os.close(fd)


def open_regular(path: str | os.PathLike, *, follow_symlinks: bool = True) -> int:
    """A read-only fd of ``path`` if it is a regular file, else ``OSError`` (EINVAL).

    Opened ``O_NONBLOCK``, so a FIFO swapped in where a file is expected neither blocks the open
    (waiting for a writer) nor a read, and checked with ``fstat`` on the opened file (a check by
    name could be raced); ``follow_symlinks=False`` also refuses a symlink (ELOOP)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        mode = os.fstat(fd).st_mode
    except BaseException:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
    return fd


class FileTooLarge(OSError):
    """A file holds more bytes than its reader accepts."""


def read_regular(path: str | os.PathLike, max_bytes: int, *, follow_symlinks: bool = True) -> bytes:
    """The bytes of the regular file ``path`` (:func:`open_regular`), at most ``max_bytes``:
    a longer one raises :class:`FileTooLarge`; any other problem raises ``OSError``."""
    fd = open_regular(path, follow_symlinks=follow_symlinks)
    try:
        chunks, total = [], 0
        while total <= max_bytes:
            chunk = os.read(fd, max_bytes + 1 - total)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    finally:
        os.close(fd)
    if total > max_bytes:
        raise FileTooLarge(errno.EFBIG, f"more than {max_bytes:,} bytes", os.fspath(path))
    return b"".join(chunks)


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (a rename, a new file) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    """Flush a closed file's data to stable storage."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# A write is at most this many bytes. The page cache takes a write in folios as large as the write,
# and on this machine's kernel (6.18 in a VM that hands its free memory back to the host) a folio
# larger than 32 KiB (order 3, the largest a CPU's own free list keeps) cost 5-10x the system time:
# 4.8 GB written took 7-12 s of system time in 16 MiB writes and 1.2-1.3 s in 32 KiB writes or
# through sendfile (64 KiB at a time), side by side (``scripts/bench_remote.py``'s pull found it).
WRITE_BYTES = 32 << 10


def write_all(fd: int, data: bytes | memoryview) -> None:
    """``os.write`` until every byte is written (a single write may be short), at most
    :data:`WRITE_BYTES` per call."""
    view = memoryview(data).cast("B")
    while view:
        written = os.write(fd, view[:WRITE_BYTES])
        view = view[written:]


def publish(temp: Path, dest: Path, *, durable: bool = True) -> None:
    """Atomically move a fully written ``temp`` onto ``dest``."""
    os.replace(temp, dest)
    if durable:
        fsync_dir(Path(dest).parent)


@contextlib.contextmanager
def atomic_output(path: Path, *, durable: bool = True, suffix: str = "") -> Iterator[Path]:
    """Yield a temp path for a writer that needs a file name (``ttnn.dump_tensor``,
    ``safetensors.save_file``); publish it atomically when the block succeeds."""
    path = Path(path)
    temp = unique_temp_path(path, suffix)
    with writing_into(path.parent):
        try:
            yield temp
            if durable:
                fsync_file(temp)
            publish(temp, path, durable=durable)
        except BaseException:
            with contextlib.suppress(OSError):
                temp.unlink()
            raise


def atomic_write_bytes(path: Path, data: bytes | memoryview, *, durable: bool = True) -> None:
    """Write ``data`` to ``path`` so that readers see all of it or none of it."""
    with atomic_output(path, durable=durable) as temp:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            write_all(fd, data)
        finally:
            os.close(fd)


def create_whole(path: Path, data: bytes) -> None:
    """Create ``path`` holding ``data``, appearing whole or not at all, with no temp name left by
    a kill: written into an unnamed ``O_TMPFILE`` and linked in (``FileExistsError`` if ``path``
    exists). Where the file system has no ``O_TMPFILE``, a temp file hard-linked in (a kill may then
    leave a stray temp, as :func:`atomic_write_bytes` does)."""
    path = Path(path)
    try:
        fd = os.open(path.parent, os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o644)
    except (AttributeError, OSError) as error:
        if isinstance(error, OSError) and error.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            raise
        temp = unique_temp_path(path)
        with writing_into(path.parent):
            try:
                temp.write_bytes(data)
                fsync_file(temp)
                os.link(temp, path)  # refuses an existing path
            finally:
                with contextlib.suppress(OSError):
                    temp.unlink()
        fsync_dir(path.parent)
        return
    try:
        write_all(fd, data)
        os.fsync(fd)
        parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:  # a dir fd makes Python call linkat(AT_SYMLINK_FOLLOW): the open file, not the /proc link
            os.link(f"/proc/self/fd/{fd}", path.name, dst_dir_fd=parent, follow_symlinks=True)
            os.fsync(parent)
        finally:
            os.close(parent)
    finally:
        os.close(fd)


def open_lock_file(lock_path: Path, *, create: bool = True) -> int:
    """Open a lock file for ``flock``: read-write where possible, because NFSv4 grants an exclusive
    lock only on a descriptor open for writing (and refuses it on a read-only one with EBADF);
    read-only where the file is another user's (a local file system locks it just the same).
    Raises ``OSError`` when neither works."""
    try:
        return os.open(lock_path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
    except PermissionError:
        return os.open(lock_path, os.O_RDONLY)


@contextlib.contextmanager
def file_lock(lock_path: Path, *, blocking: bool = True) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on ``lock_path`` for the block.

    Yields True when the lock is held; with ``blocking=False`` yields False instead of waiting
    when another holder has it."""
    fd = open_lock_file(lock_path)
    try:
        if blocking:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield True if blocking else try_flock(fd, exclusive=True)
    finally:
        os.close(fd)


CONTENT_DIGEST_ALGORITHM = "blake3"
# Files are hashed one per core, each read in blocks that stay in the CPU's cache between the copy
# out of the page cache and the hash. Large blocks hashed by BLAKE3's own threads sent every byte
# to memory and back once more: on a 2-core VM whose memory bandwidth is the limit, 8 MiB blocks
# with BLAKE3's threads hashed 2.2 GB/s of cached files, 1 MiB blocks one file per core 3.8 GB/s.
HASH_READ_BYTES = 1 << 20


HASH_THREADS = min(8, usable_cpus())  # files hashed at once: hashing is CPU-bound, one per core


def _hasher(algorithm: str) -> Any:
    if algorithm == "blake3":
        return blake3.blake3(max_threads=1)  # callers hash several files at once instead
    return hashlib.new(algorithm)


def map_largest_first(function: Callable[[T], R], items: Sequence[T], sizes: Sequence[int],
                      threads: int = HASH_THREADS) -> list[R]:
    """``[function(item) for item in items]`` on ``threads`` threads, the largest items started
    first (a pool that starts the big files last ends waiting on one hashed alone)."""
    results: list[Any] = [None] * len(items)
    order = sorted(range(len(items)), key=lambda index: -sizes[index])
    if threads <= 1 or len(items) < 2:
        for index in order:
            results[index] = function(items[index])
        return results
    with ThreadPoolExecutor(min(threads, len(items)), thread_name_prefix="hash") as pool:
        futures = {index: pool.submit(function, items[index]) for index in order}
        for index, future in futures.items():
            results[index] = future.result()
    return results


def digest_fd(fd: int, algorithm: str = CONTENT_DIGEST_ALGORITHM) -> str:
    """Hex digest of everything readable from an open file, read (not mapped: a file truncated
    under a mapping would kill the process with SIGBUS) in cache-sized blocks on this thread."""
    size = os.fstat(fd).st_size
    hasher = _hasher(algorithm)
    buffer = bytearray(min(HASH_READ_BYTES, max(size, 1 << 16)))
    view = memoryview(buffer)
    with open(fd, "rb", buffering=0, closefd=False) as stream:
        while count := stream.readinto(buffer):
            hasher.update(view[:count])
    return hasher.hexdigest()


def digest_file(path: Path, algorithm: str = CONTENT_DIGEST_ALGORITHM) -> str:
    fd = os.open(path, os.O_RDONLY)
    try:
        return digest_fd(fd, algorithm)
    finally:
        os.close(fd)


def sha256_file(path: Path) -> str:
    """SHA-256 hex digest of a file's bytes."""
    return digest_file(path, "sha256")


def sha256_bytes(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def content_digest_file(path: Path) -> str:
    """Fast content digest (BLAKE3, several GB/s) of a large file."""
    return digest_file(path, CONTENT_DIGEST_ALGORITHM)


FLUSH_THREADS = 8


def _run_concurrently(function, items: list) -> None:
    """Call ``function`` on every item from a few threads (flushes release the GIL)."""
    if len(items) < 2:
        for item in items:
            function(item)
        return
    with ThreadPoolExecutor(min(FLUSH_THREADS, len(items)), thread_name_prefix="fsync") as pool:
        for _ in pool.map(function, items):
            pass


def fsync_fds(fds: Iterable[int], *, data_only: bool = True) -> None:
    """Flush several already-written files together.

    Writing every file first and then flushing them concurrently lets the file system group
    the flushes into a few journal commits instead of one commit per file."""
    _run_concurrently(os.fdatasync if data_only else os.fsync, list(fds))


def fsync_dirs(paths: Iterable[Path]) -> None:
    """fsync each distinct directory once; deeper levels finish before their parents start."""
    by_depth: dict[int, list[Path]] = {}
    for path in {Path(path) for path in paths}:
        by_depth.setdefault(len(path.parts), []).append(path)
    for depth in sorted(by_depth, reverse=True):
        _run_concurrently(fsync_dir, sorted(by_depth[depth]))


@contextlib.contextmanager
def file_locks(lock_paths: Iterable[Path]) -> Iterator[None]:
    """Hold exclusive ``flock``s on several lock files for the block.

    The locks are taken in one global order (sorted paths), so any number of processes
    locking overlapping sets can never deadlock; they are released in reverse order."""
    with contextlib.ExitStack() as stack:
        for lock_path in sorted({Path(path) for path in lock_paths}, key=str):
            stack.enter_context(file_lock(lock_path))
        yield


def lock_held_elsewhere(lock_path: Path) -> bool:
    """Whether some process holds an exclusive ``flock`` on ``lock_path`` right now.

    The liveness test of a writer that holds its lock for as long as it writes: unlike a pid it
    works across PID namespaces (containers) and never mistakes a recycled pid for the writer.
    Opens read-only and never creates the file (a missing lock file has no holder)."""
    try:
        fd = os.open(lock_path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO would block a plain open
    except FileNotFoundError:
        return False
    try:
        return not try_flock(fd, exclusive=False)
    finally:
        os.close(fd)  # closing releases a shared lock we may have taken


def unlink_beneath(root: Path, relative: str) -> bool:
    """Delete the regular file ``root/relative``, reaching it without following any symlink below
    ``root`` (each directory is opened ``O_NOFOLLOW`` relative to the one before, so a symlink
    swapped in meanwhile cannot redirect the unlink). False when it is absent or not a regular
    file reached that way; other errors raise."""
    parts = [part for part in relative.split("/") if part]
    if not parts or any(part in (".", "..") for part in parts):
        return False
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except (FileNotFoundError, NotADirectoryError):
                return False
            except OSError as error:
                if error.errno == errno.ELOOP:  # a symlinked directory: not ours to follow
                    return False
                raise
            os.close(fd)
            fd = child
        try:
            info = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if not stat.S_ISREG(info.st_mode):
            return False
        try:
            os.unlink(parts[-1], dir_fd=fd)
        except FileNotFoundError:
            return False
        return True
    finally:
        os.close(fd)
