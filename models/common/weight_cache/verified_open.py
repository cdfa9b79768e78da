# SPDX-License-Identifier: Apache-2.0
"""Open a cache file once, prove it is the file that was verified, and serve a sealed copy of it.

Checking a path and then opening it again leaves a window in which the path can be renamed over
(a re-seed, a user's copy, a hostile writer): the check vouches for one file and another is read.
And ttnn maps the file it loads lazily, keeping the mapping as the tensor's storage: a tensorbin
truncated in place after every check would kill the process (SIGBUS) at the tensor's first use,
and one rewritten in place at the same size would be served. So a warm read opens each file
exactly once, compares the open descriptor's identity (``fstat``: inode, size, mtime, ctime, the
:class:`~models.common.weight_cache.stamps.FileStamp` the build or the gate recorded) with what
was verified, and copies it through that descriptor into a sealed ``memfd``
(:mod:`models.common.file_snapshot`, the rule's home), refused if the file changed meanwhile.
:attr:`VerifiedFile.path` names that copy (``/proc/self/fd/N``), so code that only takes a path
(ttnn, a safetensors map) maps bytes nobody can change, whatever happens to the cache file.

Torch-free and ttnn-free.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

from models.common.file_snapshot import FD_DIR, FileChanged, open_once, sealed_snapshot
from models.common.fileio import digest_fd
from models.common.weight_cache.marker import WeightCacheError
from models.common.weight_cache.stamps import FileStamp

__all__ = ["FD_DIR", "VerifiedFile", "open_verified"]


@dataclass(frozen=True)
class VerifiedFile:
    """A sealed copy of one cache file whose identity matched what was verified. ``path`` names
    the copy (valid while the block runs; a mapping of it stays valid after); ``source`` is the
    file's name in the cache, for messages; ``stamp`` the file's identity when it was copied."""

    fd: int
    source: str
    stamp: FileStamp

    @property
    def path(self) -> str:
        return f"{FD_DIR}/{self.fd}"


@contextlib.contextmanager
def open_verified(path: str | os.PathLike, verified: FileStamp | None, *, what: str,
                  digest: str | None = None) -> Iterator[VerifiedFile]:
    """Open ``path`` once and yield a sealed copy of it if it is the file ``verified`` describes;
    else raise :class:`WeightCacheError` (the loader then builds cold, or reports it).

    ``digest``: a file whose stamp differs is still accepted when the bytes of the copy hash to
    it (a reader with no gate verdict of its own: the seed API). ``verified=None`` with no digest
    vouches for nothing but a consistent copy (a file no stamp was ever recorded for)."""
    source = os.fspath(path)
    try:
        with open_once(source) as opened:
            stamp = FileStamp.of(opened.info)
            stamp_matches = verified is not None and stamp == verified
            if verified is not None and not stamp_matches and digest is None:
                raise WeightCacheError(f"{what} {source} changed after the gate verified it")
            hash_copy = not stamp_matches and digest is not None
            snapshot = sealed_snapshot(opened)
    except FileChanged as error:  # not a regular file, or truncated or rewritten while copied
        raise WeightCacheError(f"{what} {source} changed after the gate verified it: {error.strerror}") from None
    except FileNotFoundError as error:
        raise WeightCacheError(f"{what} {source} vanished after the gate ({error.strerror})") from None
    except OSError as error:  # EIO, or no memory for the copy
        raise WeightCacheError(f"{what} {source} cannot be read after the gate ({error.strerror or error})") from None
    with snapshot:
        if hash_copy and digest_fd(snapshot.fd) != digest:
            raise WeightCacheError(f"{what} {source} content differs from the digest recorded at build time")
        yield VerifiedFile(snapshot.fd, source, stamp)
