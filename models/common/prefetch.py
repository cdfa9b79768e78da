# SPDX-License-Identifier: Apache-2.0
"""Warm starts at disk speed from a cold page cache: read the cache's files ahead of the loader.

A warm read copies each tensorbin, file after file, into sealed memory that ttnn maps
(:mod:`models.common.file_snapshot`). On a page cache that is cold (a fresh node, a shared mount,
after ``drop_caches``) that copy reads one file at a time, one readahead window after another, on
one thread: on this machine a single sequential reader of a 2 GiB cache takes 1.4x as long as 4
parallel ``cat`` of the same files (``scripts/bench_readers.py``).

The prefetcher reads the variant's files into the page cache ahead of the consumer, in the order
the marker records them (the order the loader maps them, the host sidecar last), on a few daemon
threads. Each piece is a ``sendfile`` to ``/dev/null``: the kernel's own sequential readahead
fills the page cache and nothing is copied to user space, one system call per 16 MiB with the
GIL released (``posix_fadvise(WILLNEED)`` reads at most one readahead window per call, which is
why the first prefetcher, built on it, gained nothing). A piece whose first and last pages are
already cached (an ``RWF_NOWAIT`` read of one page each) is skipped, so a warm page cache costs
two probes per piece. Measured side by side (``scripts/bench_readers.py``, ``scripts/bench_prefetch.py``,
docs/seeding.md).

On by default with ``DEFAULT_THREADS``; ``prefetch=0`` or ``TT_PREFETCH_THREADS=0`` turns it off.
Only regular files are read, and no symlink is followed.
A file that cannot be read is skipped: prefetching is only ever an optimisation, the loader
reports real read errors itself.
"""

from __future__ import annotations

import errno
import os
import threading
from collections import deque
from collections.abc import Iterable

from loguru import logger

from models.common import envs
from models.common.fileio import open_regular

DEFAULT_THREADS = envs.PREFETCH_THREADS.default  # 4: as many streams as the parallel-read floor's readers (docs/seeding.md)
PIECE_BYTES = 16 << 20  # pieces near the consumer: 64 MiB ones let it overtake them (docs/seeding.md)
HEAD_BYTES = 256 << 10  # more than a tensorbin's header and the first pages a mapping touches
READ_BYTES = 1 << 20  # the buffer of the plain-read fallback
_SMALLEST_WINDOW = 128 << 10  # a device's default readahead window, the most one WILLNEED reads
_PAGE = os.sysconf("SC_PAGE_SIZE")
_NO_SENDFILE = (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP)


def prefetch_threads(requested: int | None) -> int:
    """Threads to prefetch with: ``requested``, else ``$TT_PREFETCH_THREADS``, else ``DEFAULT_THREADS``
    (both accept what the ``envs`` table declares; a bad value is a ``ValueError`` naming it)."""
    if requested is not None:
        return envs.PREFETCH_THREADS.check("prefetch=", requested)
    return envs.TT_PREFETCH_THREADS


def is_cached(fd: int, offset: int, length: int) -> bool:
    """Whether the first and last page of the range are in the page cache: a one-page
    ``RWF_NOWAIT`` read each, which fails with EAGAIN instead of starting a read."""
    page = bytearray(1)
    try:
        for position in {offset, offset + length - 1}:
            os.preadv(fd, [page], position - position % _PAGE, os.RWF_NOWAIT)
    except OSError:  # EAGAIN: not cached; any other error (RWF_NOWAIT unsupported): read it anyway
        return False
    return True


def _open_regular(path: str) -> int:
    """An fd of ``path`` if it is a regular file: no symlink followed, and never a FIFO or a
    device a swapped-in name could block or stream on (the loader reports such a file itself)."""
    return open_regular(path, follow_symlinks=False)


def read_head(path: str) -> int:
    """Queue the read of ``path``'s first ``HEAD_BYTES`` (``posix_fadvise(WILLNEED)`` returns once
    the reads are queued) and return its size. The warm read's copy of a tensorbin starts at its
    head; with every head in flight together, that copy never waits behind the pieces the
    threads read, nor starts a readahead window of its own for each file."""
    fd = _open_regular(path)
    try:
        for offset in range(0, HEAD_BYTES, _SMALLEST_WINDOW):  # the kernel reads one window per call
            os.posix_fadvise(fd, offset, _SMALLEST_WINDOW, os.POSIX_FADV_WILLNEED)
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def read_ahead(path: str, offset: int, length: int, sink: int) -> None:
    """Read ``length`` bytes of ``path`` at ``offset`` into the page cache without copying them
    to user space (``sendfile`` to ``sink``, an open ``/dev/null``); a file system that cannot
    splice gets plain reads (``posix_fadvise(WILLNEED)`` would read one readahead window of the
    piece, 128 KiB on a default device, and return before even that is read)."""
    fd = _open_regular(path)
    try:
        if is_cached(fd, offset, length):
            return
        end = offset + length
        while offset < end:
            try:
                sent = os.sendfile(sink, fd, offset, end - offset)
            except OSError as error:
                if error.errno not in _NO_SENDFILE:
                    raise
                _read_through(fd, offset, end)
                return
            if sent == 0:  # the file got shorter: nothing left to read
                return
            offset += sent
    finally:
        os.close(fd)


def _read_through(fd: int, offset: int, end: int) -> None:
    """Read ``[offset, end)`` of ``fd`` into one reused buffer: the bytes are thrown away, the
    page cache keeps them."""
    buffer = memoryview(bytearray(min(READ_BYTES, end - offset)))
    while offset < end:
        count = os.preadv(fd, [buffer[: end - offset]], offset)
        if count == 0:  # the file got shorter: nothing left to read
            return
        offset += count


class Prefetcher:
    """Reads files into the page cache on ``threads`` daemon threads, in the order they are added.

    ``add`` queues files, split into pieces taken in order by whichever thread is free; ``wait``
    blocks until every piece added so far was read."""

    def __init__(self, threads: int = DEFAULT_THREADS, piece_bytes: int = PIECE_BYTES) -> None:
        self.threads = max(1, threads)
        self.piece_bytes = piece_bytes
        self._queue: deque[tuple[str, int, int]] = deque()
        self._ready = threading.Condition()
        self._outstanding = 0
        self._workers: list[threading.Thread] = []
        self.bytes_read = 0  # bytes of the pieces done (read now or found cached)
        self.errors: list[str] = []

    def add(self, paths: Iterable[str | os.PathLike]) -> None:
        """Queue ``paths``; first, on the calling thread, ask for every file's head at once."""
        pieces = []
        for path in paths:
            path = os.fspath(path)
            try:
                size = read_head(path)
            except OSError as error:
                self.errors.append(str(error))
                continue
            pieces += [(path, offset, min(self.piece_bytes, size - offset)) for offset in range(0, size, self.piece_bytes)]
        with self._ready:
            self._queue.extend(pieces)
            self._outstanding += len(pieces)
            while len(self._workers) < min(self.threads, len(self._queue)):
                worker = threading.Thread(target=self._run, name="tt-prefetch", daemon=True)
                self._workers.append(worker)
                worker.start()

    def _run(self) -> None:
        """Read pieces until the queue is empty, then end (``add`` starts threads again)."""
        sink = os.open(os.devnull, os.O_WRONLY)
        try:
            while True:
                with self._ready:
                    if not self._queue:
                        self._workers.remove(threading.current_thread())
                        return
                    path, offset, length = self._queue.popleft()
                try:
                    read_ahead(path, offset, length, sink)
                except OSError as error:
                    self.errors.append(f"{path}: {error}")
                    length = 0
                with self._ready:
                    self.bytes_read += length
                    self._outstanding -= 1
                    self._ready.notify_all()
        finally:
            os.close(sink)

    def cancel(self) -> int:
        """Drop the pieces not yet started (a warm load that failed: the cold build that follows
        must not share the disk with reads of files it replaces); returns how many were dropped.
        Pieces being read finish; ``wait`` then returns as soon as they have."""
        with self._ready:
            dropped = len(self._queue)
            self._queue.clear()
            self._outstanding -= dropped
            self._ready.notify_all()
        return dropped

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every piece added so far was read; False on timeout."""
        with self._ready:
            done = self._ready.wait_for(lambda: self._outstanding == 0, timeout)
        if self.errors:
            logger.debug(f"prefetch skipped {len(self.errors)} piece(s): {self.errors[0]}")
        return done
