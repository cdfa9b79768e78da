# SPDX-License-Identifier: Apache-2.0
"""Serve a checked cache file as bytes nobody can change: open it once, check the open file,
copy its bytes out through that descriptor, and check it again.

The rule (one home for both caches): **a reader takes a cache file's bytes only through the
descriptor it checked, and only as a copy in memory of its own, made while the file stayed as
checked; never as a mapping of the file.** A check by name, then a read by name, reads whatever
was renamed over the file in between. And a mapping is lazy: its pages are read when first
touched, possibly long after every check; a file truncated in place under it kills the process
with SIGBUS at that touch, and one rewritten in place at the same size shows its new bytes
through the mapping.

So a reader opens a file once (:func:`open_once`), compares the open file's ``fstat`` with what
it verified (the caller's stamp, digest or proof), then copies it out: into its own buffer
(:func:`read_snapshot`), or, for code that only takes a path (ttnn maps the file it is given and
keeps the mapping as the tensor's storage; a safetensors map), into a sealed ``memfd``
(:func:`sealed_snapshot`): anonymous memory that no one can shrink, grow or write once sealed,
named by a ``/proc/self/fd`` path. After the copy the descriptor's ``fstat`` must be what it was
at the open and the copy whole, else :class:`FileChanged`: a copy taken while the file was being
truncated or rewritten is never served.

The cost is a copy of every byte served at read time (figures: docs/weight-cache.md, "Warm
bytes"). One copy is made ahead of the read: a writer that proves the bytes it writes (a pull
hashes each object against its name as it receives it) can write them into a new ``memfd`` as
well as into the file (:class:`MirroredWrite`), and **keep** that copy for a read later in the
same process (:func:`keeping_snapshots`: a load that pulls, then reads warm). :func:`sealed_snapshot`
serves a kept copy, in place of copying again, only for the very file it was written to (the same
inode, held open while kept, so its number cannot be reused) with the size and mtime the writer
left; the caller has compared the open file's full stamp with what it verified, as for any copy.
The new memory is then filled once (the file is written around the page cache where the file
system allows): on this project's VM a warm read after a pull spent 7-9 s filling 4.8 GB of new
memory for its copies, the pull having just filled as much page cache. Torch-free and ttnn-free.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

FD_DIR = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"
# O_NONBLOCK: a FIFO renamed over a cache file would block a plain open forever (cleared once the
# open file is known to be a regular file)
_OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL
_COPY_BYTES = 1 << 30  # one sendfile call at most (the kernel caps a call near 2 GiB anyway)
_NO_SENDFILE = (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP)
_READ_BYTES = 8 << 20


class FileChanged(OSError):
    """The open file is not a regular file, or changed (truncated, rewritten, extended) while its
    bytes were being copied out."""


@dataclass(frozen=True)
class OpenFile:
    """One open regular file: ``info`` is its ``fstat`` at the open, what the caller checks."""

    fd: int
    source: str
    info: os.stat_result


def _state(info: os.stat_result) -> tuple[int, int, int]:
    """What any write, truncate or extension of an open file changes."""
    return info.st_size, info.st_mtime_ns, info.st_ctime_ns


@contextlib.contextmanager
def open_once(path: str | os.PathLike) -> Iterator[OpenFile]:
    """Open ``path`` once, read-only; raise :class:`FileChanged` if it is not a regular file (a
    FIFO, a directory renamed over it), ``OSError`` if it cannot be opened. Closed on exit."""
    source = os.fspath(path)
    fd = os.open(source, _OPEN_FLAGS)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FileChanged(errno.EINVAL, "replaced by something not a regular file", source)
        os.set_blocking(fd, True)
        yield OpenFile(fd, source, info)
    finally:
        os.close(fd)


def check_unchanged(file: OpenFile, copied: int) -> None:
    """Raise :class:`FileChanged` unless ``copied`` is the whole file and its ``fstat`` still says
    what it said at the open (the copy is then the bytes of the file that was checked)."""
    now = os.fstat(file.fd)
    if copied != file.info.st_size or _state(now) != _state(file.info):
        what = "truncated" if now.st_size < file.info.st_size or copied < file.info.st_size else "changed"
        raise FileChanged(errno.ESTALE, f"{what} while it was being read", file.source)


def read_snapshot(file: OpenFile, into: memoryview) -> None:
    """Fill ``into`` (exactly the file's size in bytes) with the file's bytes, read through its
    descriptor; :class:`FileChanged` if the file changed meanwhile."""
    into = into.cast("B")
    if len(into) != file.info.st_size:
        raise FileChanged(errno.EINVAL, f"holds {file.info.st_size} bytes, {len(into)} expected", file.source)
    offset = 0
    while offset < len(into):
        count = os.preadv(file.fd, [into[offset: offset + _READ_BYTES]], offset)
        if count == 0:
            break
        offset += count
    check_unchanged(file, offset)


class SealedSnapshot:
    """A sealed ``memfd`` holding a copy of an open file: :attr:`path` names it for code that
    only takes a path (valid while open); a mapping of it outlives :meth:`close`."""

    def __init__(self, fd: int, source: str) -> None:
        self.fd = fd
        self.source = source

    @property
    def path(self) -> str:
        return f"{FD_DIR}/{self.fd}"

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> SealedSnapshot:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def sealed_snapshot(file: OpenFile) -> SealedSnapshot:
    """Copy the open ``file`` into a new ``memfd`` (in the kernel: ``sendfile``, no user-space
    copy), seal it against any change, and check the file did not change meanwhile
    (:func:`check_unchanged`). The caller closes it (a ``with`` block)."""
    kept = _kept.serve(file)
    if kept is not None:
        return kept
    fd = _new_memfd(file.source)
    try:
        copied = _copy(file.fd, fd, file.info.st_size)
        check_unchanged(file, copied)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return SealedSnapshot(fd, file.source)


def _new_memfd(source: str) -> int:
    name = f"snapshot:{source[-240:]}"  # what /proc/PID/maps shows (a memfd name has <= 249 bytes)
    return os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)


def _copy(source: int, target: int, size: int) -> int:
    """Copy up to ``size`` bytes of ``source`` from its start to ``target``; how many there were."""
    if size:
        os.ftruncate(target, size)  # the shmem file's size at once: no growth per call
    offset = 0
    while offset < size:
        try:
            sent = os.sendfile(target, source, offset, min(_COPY_BYTES, size - offset))
        except OSError as error:
            if error.errno not in _NO_SENDFILE:
                raise
            return _copy_by_reads(source, target, offset, size)
        if sent == 0:  # the file got shorter
            break
        offset += sent
    return offset


def _copy_by_reads(source: int, target: int, offset: int, size: int) -> int:
    """The plain-read fallback of :func:`_copy` (a file system that cannot splice)."""
    buffer = memoryview(bytearray(min(_READ_BYTES, size - offset)))
    while offset < size:
        count = os.preadv(source, [buffer[: size - offset]], offset)
        if count == 0:
            break
        written = 0
        while written < count:
            written += os.pwrite(target, buffer[written:count], offset + written)
        offset += count
    return offset


# --------------------------------------------------------------------------------------------
# A copy made while the file is written, kept for a read later in the process
# --------------------------------------------------------------------------------------------

_ALIGN = 4096  # O_DIRECT's alignment of offsets, lengths and memory (a page: every Linux file system's)
_DIRECT_BYTES = 1 << 20  # written around the page cache in runs of this much


class MirroredWrite:
    """A file of a known ``size`` written from a new ``memfd`` holding the same bytes: the caller
    :meth:`write` s the file's bytes in order (after :meth:`take_prefix` of what the file already
    holds), then :meth:`keep` s the memfd, sealed, for :func:`sealed_snapshot` to serve.

    The file is written from the memfd's pages through a second descriptor opened ``O_DIRECT``
    (the same inode, through ``/proc/self/fd``), so its bytes do not also fill the page cache;
    where the file system refuses ``O_DIRECT``, through the file's own descriptor."""

    def __init__(self, fd: int, size: int, source: str) -> None:
        self.fd = fd
        self.size = size
        self.source = source
        self.filled = 0  # bytes in the memfd
        self.written = 0  # of them, bytes written to the file
        self.memfd = _new_memfd(source)
        try:
            os.ftruncate(self.memfd, size)
            self._map = mmap.mmap(self.memfd, size) if size else None
        except BaseException:
            os.close(self.memfd)
            raise
        self._view = memoryview(self._map) if self._map is not None else memoryview(b"")
        self._direct = _open_direct(fd)

    def take_prefix(self, count: int, update: Callable[[memoryview], object]) -> None:
        """The file's first ``count`` bytes (written by an earlier, interrupted writer) into the
        memfd, each piece passed to ``update`` (a hasher) as read; they are not written again."""
        while self.filled < count:
            piece = self._view[self.filled: min(count, self.filled + _READ_BYTES)]
            got = os.preadv(self.fd, [piece], self.filled)
            if got == 0:
                raise FileChanged(errno.ESTALE, "shorter than it was a moment ago", self.source)
            update(piece[:got])
            self.filled += got
        self.written = self.filled

    def write(self, data: bytes | memoryview) -> None:
        """The file's next bytes (at most :attr:`size` in all)."""
        data = memoryview(data).cast("B")
        self._view[self.filled: self.filled + len(data)] = data
        self.filled += len(data)
        if self.filled - self.written >= _DIRECT_BYTES:
            self._flush(self.filled - self.filled % _ALIGN)

    def finish(self) -> None:
        """Every byte received written to the file (the caller then fsyncs it)."""
        self._flush(self.filled)

    def _flush(self, end: int) -> None:
        """The bytes ``[written, end)`` to the file: the aligned middle around the page cache,
        a misaligned head or tail through it."""
        if self.written % _ALIGN:
            self._write_through(self.fd, min(end, self.written + _ALIGN - self.written % _ALIGN))
        aligned_end = end - end % _ALIGN
        if self._direct is not None and self.written < aligned_end:
            try:
                self._write_through(self._direct, aligned_end)
            except OSError as error:
                if error.errno != errno.EINVAL:
                    raise
                os.close(self._direct)  # O_DIRECT opened but refused: through the page cache
                self._direct = None
        self._write_through(self.fd, end)

    def _write_through(self, fd: int, end: int) -> None:
        while self.written < end:
            self.written += os.pwrite(fd, self._view[self.written: min(end, self.written + _DIRECT_BYTES)],
                                      self.written)

    def keep(self) -> None:
        """Seal the memfd (every byte written) and keep it for this file (see :func:`keeping_snapshots`)."""
        if self.filled != self.size or self.written != self.size:
            raise FileChanged(errno.EINVAL, f"{self.filled} of {self.size} bytes written", self.source)
        self._unmap()
        fcntl.fcntl(self.memfd, fcntl.F_ADD_SEALS, _SEALS)
        _kept.add(self.fd, SealedSnapshot(self.memfd, self.source))
        self.memfd = -1

    def close(self) -> None:
        """Drop whatever was not kept."""
        self._unmap()
        if self._direct is not None:
            os.close(self._direct)
            self._direct = None
        if self.memfd >= 0:
            os.close(self.memfd)
            self.memfd = -1

    def _unmap(self) -> None:
        self._view.release()
        if self._map is not None:
            with contextlib.suppress(BufferError):  # a piece still referenced (an error's traceback): freed with it
                self._map.close()
            self._map = None

    def __enter__(self) -> MirroredWrite:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _open_direct(fd: int) -> int | None:
    """The open file ``fd`` again, for writing around the page cache; None where it cannot be."""
    direct = getattr(os, "O_DIRECT", 0)
    if not direct:
        return None
    try:
        return os.open(f"{FD_DIR}/{fd}", os.O_WRONLY | os.O_CLOEXEC | direct)
    except OSError:  # a file system without O_DIRECT (EINVAL)
        return None


@contextlib.contextmanager
def keeping_snapshots() -> Iterator[None]:
    """Within the block, :meth:`MirroredWrite.keep` keeps copies (up to half of the memory this
    process may still fill when the first is kept, its cgroup's limit included: :func:`reserve_kept`);
    at its end, the ones not served are dropped (served ones live on as their readers' mappings). Nests."""
    _kept.enter()
    try:
        yield
    finally:
        _kept.exit()


def reserve_kept(nbytes: int) -> bool:
    """Whether a writer may keep a copy of ``nbytes`` (inside :func:`keeping_snapshots`, within
    its budget); the bytes count against the budget until the block ends."""
    return _kept.reserve(nbytes)


def has_kept_copy(path: str | os.PathLike) -> bool:
    """Whether a copy of the file at ``path`` is kept (a hint, for a read-ahead that can skip it:
    serving one is :func:`sealed_snapshot`'s decision, on the file it opened)."""
    if not _kept.any():  # every load asks for each of its files: no stat when nothing is kept
        return False
    try:
        info = os.stat(path)
    except OSError:
        return False
    return _kept.holds(info)


class _KeptSnapshots:
    """The process's kept copies by file identity: (device, inode) -> (the file held open, the copy)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._budget: int | None = None
        self._copies: dict[tuple[int, int], tuple[int, os.stat_result, SealedSnapshot]] = {}

    def enter(self) -> None:
        with self._lock:
            self._depth += 1

    def exit(self) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth:
                return
            copies, self._copies, self._budget = self._copies, {}, None
        for held, _, snapshot in copies.values():
            os.close(held)
            snapshot.close()

    def reserve(self, nbytes: int) -> bool:
        with self._lock:
            if not self._depth:
                return False
            if self._budget is None:
                self._budget = _available_memory() // 2
            if nbytes > self._budget:
                return False
            self._budget -= nbytes
            return True

    def add(self, fd: int, snapshot: SealedSnapshot) -> None:
        held = os.dup(fd)  # the inode stays this file's while its copy is kept
        info = os.fstat(held)
        with self._lock:
            if self._depth:
                dropped = self._copies.pop((info.st_dev, info.st_ino), None)
                self._copies[(info.st_dev, info.st_ino)] = (held, info, snapshot)
            else:
                dropped = (held, info, snapshot)
        if dropped is not None:
            os.close(dropped[0])
            dropped[2].close()

    def any(self) -> bool:
        return bool(self._copies)

    def holds(self, info: os.stat_result) -> bool:
        with self._lock:
            return self.holds_locked(info)

    def holds_locked(self, info: os.stat_result) -> bool:
        """A copy of this inode is kept, written when it had this size and mtime (any write
        since moves the mtime). The lock held."""
        entry = self._copies.get((info.st_dev, info.st_ino))
        return entry is not None and (entry[1].st_size, entry[1].st_mtime_ns) == (info.st_size, info.st_mtime_ns)

    def serve(self, file: OpenFile) -> SealedSnapshot | None:
        """A new descriptor of the copy kept for ``file``'s inode, if its size and mtime are what
        its writer left (any write since moves the mtime)."""
        with self._lock:
            if not self.holds_locked(file.info):
                return None
            return SealedSnapshot(os.dup(self._copies[(file.info.st_dev, file.info.st_ino)][2].fd), file.source)


def _available_memory() -> int:
    """The memory this process may still fill: ``MemAvailable``, or less where its memory cgroup or
    one above it allows less (a container's limit, which ``/proc/meminfo`` does not show: a copy
    kept beyond it would have the container killed). 0 where ``/proc/meminfo`` cannot be read."""
    try:
        with open("/proc/meminfo") as meminfo:
            available = next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemAvailable:"))
    except (OSError, ValueError, IndexError, StopIteration):
        return 0
    for limit, usage in _cgroup_memory():
        available = min(available, max(0, limit - usage))
    return available


_CGROUP_ROOT = "/sys/fs/cgroup"


def _cgroup_memory() -> Iterator[tuple[int, int]]:
    """(limit, usage) in bytes of each memory cgroup this process is in, and of each above it that
    has a limit: cgroup v2 (``memory.max``, ``memory.current``) and v1 (``memory.limit_in_bytes``,
    ``memory.usage_in_bytes``)."""
    try:
        with open("/proc/self/cgroup") as cgroups:
            lines = [line.rstrip("\n").split(":", 2) for line in cgroups]
    except OSError:
        return
    for fields in lines:
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if controllers == "":
            base, limit_name, usage_name = _CGROUP_ROOT, "memory.max", "memory.current"
        elif "memory" in controllers.split(","):
            base, limit_name, usage_name = f"{_CGROUP_ROOT}/memory", "memory.limit_in_bytes", "memory.usage_in_bytes"
        else:
            continue
        parts = [part for part in path.split("/") if part]
        for depth in range(len(parts), -1, -1):
            group = os.path.join(base, *parts[:depth])
            try:
                with open(os.path.join(group, limit_name)) as limit, open(os.path.join(group, usage_name)) as usage:
                    text = limit.read().strip()
                    if text != "max":
                        yield int(text), int(usage.read())
            except (OSError, ValueError):
                continue


_kept = _KeptSnapshots()
