# SPDX-License-Identifier: Apache-2.0
"""The chunks of a large weight, shared by the conversion workers of one build.

Workers claim whole units, so the build's last large weight (a Llama-70B-shaped LM head: 2 GiB of
source) would be converted by one core while every other worker idles; on a host with dozens of
workers that tail is as long as the rest of the build. Instead, the worker that writes a weight
block by block (:func:`~models.common.weight_cache.tensorbin.write_blocks`) posts its chunks here and
converts them itself, and a worker with no unit left converts them beside it. Each chunk is written
at its own offset of the file, so the file is the same, byte for byte, whoever converts which
chunk; the poster returns only once every chunk it posted is written, and raises the first error
any of them raised.

The rule of a stop: once the build stops (``stop`` is set: another worker failed, or an interrupt
reached the build's thread), no chunk starts, on the poster or on a helper; the poster waits for
the chunks running (one each at most) and raises :class:`BuildStopped`. So every worker ends within
a chunk of the stop, not after the rest of a large weight converted alone::

    board = ChunkBoard(workers)          # one per build
    # in each worker:
    with board.worker():                 # while it may still post chunks
        loader.convert(...)              #   write_blocks(..., board=board): posts and runs its chunks
    board.help()                         # converts others' chunks until no worker converts any more

Memory: a helper holds one chunk at a time (about ``BLOCK_BYTES`` of source and its converted
bytes), less than the unit it would otherwise hold.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Generic, TypeVar

R = TypeVar("R")

_POLL_SECONDS = 0.2  # how often a waiting helper looks at the stop event


class BuildStopped(Exception):
    """The build stopped before this worker's work was done (another worker failed, or an
    interrupt). Not a ``RuntimeError``: no one mistakes it for a write error and goes on."""


class _Posted(Generic[R]):
    """One weight's chunks: taken one at a time, by the poster and by helpers."""

    def __init__(self, jobs: Sequence[Callable[[], R]]) -> None:
        self.jobs = list(jobs)
        self.results: list[R | None] = [None] * len(self.jobs)
        self.next = 0  # the first chunk nobody has taken
        self.running = 0  # chunks being converted now
        self.done = 0  # chunks converted
        self.error: BaseException | None = None

    @property
    def open(self) -> bool:
        return self.next < len(self.jobs)


class ChunkBoard:
    """Where workers post the chunks of their large weights and idle workers take them (see the
    module doc). ``stop``: once set (another worker failed), helpers stop taking chunks."""

    def __init__(self, workers: int, stop: threading.Event | None = None) -> None:
        self._changed = threading.Condition()
        self._posted: list[_Posted] = []
        self._converting = workers  # workers that may still post chunks
        self._stop = stop if stop is not None else threading.Event()

    @contextlib.contextmanager
    def worker(self) -> Iterator[None]:
        """Around a worker's own conversion: once every worker has left it, helpers stop waiting."""
        try:
            yield
        finally:
            with self._changed:
                self._converting -= 1
                self._changed.notify_all()

    def run(self, jobs: Sequence[Callable[[], R]]) -> list[R]:
        """Run ``jobs`` here and on any helper; their results in order. The first error raised by any
        of them is raised here, once none of them is running any more (and no other starts)."""
        posted = _Posted(jobs)
        with self._changed:
            self._posted.append(posted)
            self._changed.notify_all()
        try:
            while (index := self._take(posted)) is not None:
                self._run(posted, index)
            stopped = self._stop.is_set()
        finally:
            with self._changed:
                posted.next = len(posted.jobs)  # nobody starts another chunk of it
                self._posted.remove(posted)
                while posted.running:
                    self._changed.wait()
        if posted.error is not None:
            raise posted.error
        if stopped and posted.done < len(posted.jobs):
            raise BuildStopped("the build stopped while this weight was written block by block")
        return posted.results  # type: ignore[return-value]  # every one filled in: no error

    def help(self) -> None:
        """Convert posted chunks until no worker converts any more, or the build stops."""
        while (taken := self._next_posted()) is not None:
            self._run(*taken)

    def _next_posted(self) -> tuple[_Posted, int] | None:
        """The next chunk anyone posted, waited for while a worker may still post one; None when
        none will come or the build stops."""
        with self._changed:
            while not self._stop.is_set():
                posted = next((p for p in self._posted if p.open), None)
                if posted is not None:
                    return posted, self._take_locked(posted)
                if self._converting == 0:
                    return None
                self._changed.wait(_POLL_SECONDS)
            return None

    def _take(self, posted: _Posted) -> int | None:
        """The poster's next chunk of its own weight; None once all are taken or the build stops."""
        with self._changed:
            return self._take_locked(posted) if posted.open and not self._stop.is_set() else None

    @staticmethod
    def _take_locked(posted: _Posted) -> int:
        index = posted.next
        posted.next += 1
        posted.running += 1
        return index

    def _run(self, posted: _Posted, index: int) -> None:
        try:
            posted.results[index] = posted.jobs[index]()
            with self._changed:
                posted.done += 1
        except BaseException as error:  # noqa: BLE001 - raised in the poster, whoever ran the chunk
            with self._changed:
                if posted.error is None:
                    posted.error = error
                posted.next = len(posted.jobs)  # the rest is not started: the poster fails anyway
        finally:
            with self._changed:
                posted.running -= 1
                self._changed.notify_all()
