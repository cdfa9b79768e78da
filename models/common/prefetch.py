# SPDX-License-Identifier: Apache-2.0
"""Warm starts at disk speed from a cold page cache: read the cache's files ahead of the loader.

``ttnn.load_tensor`` maps a tensorbin lazily, so a warm build returns in milliseconds and the
bytes are read later, when the tensors are used (uploaded to a device, or read on host). On a
page cache that is cold (a fresh node, a shared mount, after ``drop_caches``) those reads fault
in one page range at a time, in the consumer's order, on one thread: far below what the disk
gives to several readers at once. The prefetcher hands the disk that parallelism: a few daemon
threads take the files in the order the loader asked for them, chunk by chunk, and queue each
chunk's reads with ``posix_fadvise(WILLNEED)`` (readahead into the page cache, no copy to user
space), so the disk always has the next few chunks in flight, in the consumer's order. The
consumer then finds its pages resident or already being read.

It is **off by default** (``prefetch=4`` or ``TT_PREFETCH_THREADS=4`` turns it on): measured
side by side (``scripts/bench_prefetch.py``, figures in docs/weight-cache.md), the kernel's own
readahead already serves a sequential consumer nearly as well on an evicted cache, and on a warm
page cache the threads slow the consumer down (each chunk's ``open``/``fadvise`` takes the GIL).
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Iterable

from loguru import logger

from models.common import envs

DEFAULT_THREADS = 0  # off unless asked for: see the measurements in the module doc
CHUNK_BYTES = 8 << 20


def prefetch_threads(requested: int | None) -> int:
    """Threads to prefetch with: ``requested``, else ``$TT_PREFETCH_THREADS``, else 0 (off)."""
    if requested is None:
        text = envs.TT_PREFETCH_THREADS
        requested = int(text) if text.strip().isdigit() else DEFAULT_THREADS
    if requested < 0:
        raise ValueError(f"prefetch threads must be >= 0, got {requested}")
    return requested


def read_ahead(path: str, offset: int, length: int) -> None:
    """Ask the kernel to read ``length`` bytes of ``path`` at ``offset`` into the page cache
    (``POSIX_FADV_WILLNEED``: the reads are queued at once and run asynchronously; pages already
    cached are skipped by a lookup, with no copy and no page-table work)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)
    finally:
        os.close(fd)


class Prefetcher:
    """Reads files into the page cache on ``threads`` daemon threads, in the order they are added.

    ``add`` queues a file (its chunks are issued in order, by whichever thread is free); ``wait``
    blocks until every chunk added so far was issued (the reads themselves finish in the
    background; a loader never waits).
    A file that cannot be read is skipped: prefetching is only ever an optimisation, the loader
    reports real read errors itself."""

    def __init__(self, threads: int = DEFAULT_THREADS, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.threads = max(1, threads)
        self.chunk_bytes = chunk_bytes
        self._queue: deque[tuple[str, int, int]] = deque()
        self._ready = threading.Condition()
        self._outstanding = 0
        self._workers: list[threading.Thread] = []
        self.bytes_read = 0
        self.errors: list[str] = []

    def add(self, paths: Iterable[str | os.PathLike]) -> None:
        chunks = []
        for path in paths:
            try:
                size = os.stat(path).st_size
            except OSError as error:
                self.errors.append(str(error))
                continue
            path = os.fspath(path)
            chunks += [(path, offset, min(self.chunk_bytes, size - offset)) for offset in range(0, size, self.chunk_bytes)]
        with self._ready:
            self._queue.extend(chunks)
            self._outstanding += len(chunks)
            while len(self._workers) < min(self.threads, len(self._queue)):
                worker = threading.Thread(target=self._run, name="tt-prefetch", daemon=True)
                self._workers.append(worker)
                worker.start()

    def _run(self) -> None:
        """Read chunks until the queue is empty, then end (``add`` starts threads again)."""
        while True:
            with self._ready:
                if not self._queue:
                    self._workers.remove(threading.current_thread())
                    return
                path, offset, length = self._queue.popleft()
            try:
                read_ahead(path, offset, length)
            except (OSError, ValueError) as error:
                self.errors.append(f"{path}: {error}")
                length = 0
            with self._ready:
                self.bytes_read += length
                self._outstanding -= 1
                self._ready.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every chunk added so far was issued; False on timeout."""
        with self._ready:
            done = self._ready.wait_for(lambda: self._outstanding == 0, timeout)
        if self.errors:
            logger.debug(f"prefetch skipped {len(self.errors)} chunk(s): {self.errors[0]}")
        return done
