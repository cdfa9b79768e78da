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
bytes"). Torch-free and ttnn-free.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Iterator
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
    name = f"snapshot:{file.source[-240:]}"  # what /proc/PID/maps shows (a memfd name has <= 249 bytes)
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        copied = _copy(file.fd, fd, file.info.st_size)
        check_unchanged(file, copied)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return SealedSnapshot(fd, file.source)


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
