# SPDX-License-Identifier: Apache-2.0
"""Open a cache file once, prove it is the file that was verified, and read it through that open.

Checking a path and then opening it again leaves a window in which the path can be renamed over
(a re-seed, a user's copy, a hostile writer): the check vouches for one file and another is read.
So a warm read opens each file exactly once, compares the open descriptor's identity (``fstat``:
inode, size, mtime, ctime, the :class:`~models.common.weight_cache.stamps.FileStamp` the build or
the gate recorded) with what was verified, and every reader then goes through that descriptor:
:attr:`VerifiedFile.path` names it (``/proc/self/fd/N``), so code that only takes a path (ttnn,
a safetensors map) opens the same inode whatever the directory entry points at by then.

Torch-free and ttnn-free.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from models.common.fileio import digest_fd
from models.common.weight_cache.marker import WeightCacheError
from models.common.weight_cache.stamps import FileStamp

FD_DIR = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"
# O_NONBLOCK: a FIFO renamed over a cache file would block a plain open forever; regular files ignore it
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)


@dataclass(frozen=True)
class VerifiedFile:
    """One open cache file whose identity matched what was verified. ``path`` reopens this very
    file (valid while the block runs); ``source`` is its name in the cache, for messages."""

    fd: int
    source: str
    stamp: FileStamp

    @property
    def path(self) -> str:
        return f"{FD_DIR}/{self.fd}"


@contextlib.contextmanager
def open_verified(path: str | os.PathLike, verified: FileStamp | None, *, what: str,
                  digest: str | None = None) -> Iterator[VerifiedFile]:
    """Open ``path`` once and yield it if it is the file ``verified`` describes; else raise
    :class:`WeightCacheError` (the loader then builds cold, or reports it).

    ``digest``: a file whose stamp differs is still accepted when the bytes of this open file hash
    to it (a reader with no gate verdict of its own: the seed API). ``verified=None`` with no
    digest vouches for nothing and only opens (a file no stamp was ever recorded for)."""
    source = os.fspath(path)
    try:
        fd = os.open(source, _OPEN_FLAGS)
    except OSError as error:
        raise WeightCacheError(f"{what} {source} vanished after the gate ({error.strerror or error})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise WeightCacheError(f"{what} {source} was replaced after the gate by something not a regular file")
        stamp = FileStamp.of(info)
        if verified is not None and stamp == verified:
            pass
        elif digest is not None:
            if digest_fd(fd) != digest:
                raise WeightCacheError(f"{what} {source} content differs from the digest recorded at build time")
        elif verified is not None:
            raise WeightCacheError(f"{what} {source} changed after the gate verified it")
        yield VerifiedFile(fd, source, stamp)
    finally:
        os.close(fd)

