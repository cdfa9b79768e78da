# SPDX-License-Identifier: Apache-2.0
"""The chunk board: every posted chunk runs once, on the poster or on a helper, results in order; the
first error is raised in the poster once nothing of its weight runs; helpers leave when no worker
converts any more, or when the build stops."""

from __future__ import annotations

import threading
import time

import pytest

from models.common.weight_cache.chunk_board import BuildStopped, ChunkBoard
from tests.ttnn.weight_cache.idle_workers import idle_workers


def test_every_chunk_runs_once_and_helpers_leave_with_the_last_worker():
    board = ChunkBoard(workers=3)
    ran: list[tuple[int, str]] = []

    def job(index: int):
        def run() -> int:
            ran.append((index, threading.current_thread().name))
            time.sleep(0.01)  # long enough for the helpers to take their share
            return index * index
        return run

    helpers = idle_workers(board, 2)
    with board.worker():
        results = board.run([job(i) for i in range(40)])
        time.sleep(0.1)
        assert all(h.is_alive() for h in helpers), "a worker still converts: it may post more"
    assert results == [i * i for i in range(40)]
    assert sorted(i for i, _ in ran) == list(range(40)), "each chunk once"
    assert {name for _, name in ran} > {"MainThread"}, "the helpers converted some"
    for helper in helpers:
        helper.join(timeout=5)
        assert not helper.is_alive()


def test_the_first_error_is_raised_in_the_poster_once_none_of_its_chunks_runs():
    board = ChunkBoard(workers=2)
    started: list[int] = []
    finished: list[int] = []
    helper_took = threading.Event()

    def job(index: int):
        def run() -> int:
            started.append(index)
            if threading.current_thread().name != "MainThread":
                helper_took.set()
                time.sleep(0.2)  # still running when the poster's own chunk fails
                finished.append(index)
                return index
            helper_took.wait(5)
            raise OSError(f"chunk {index}: disk full")
        return run

    helpers = idle_workers(board, 1)
    with board.worker():
        with pytest.raises(OSError, match="disk full"):
            board.run([job(i) for i in range(20)])
        assert len(finished) == len(started) - 1, "the poster waited for the helper's chunk"
        assert len(started) <= 3, "no chunk started after the failure"
    helpers[0].join(timeout=5)
    assert not helpers[0].is_alive()


def test_a_waiting_helper_leaves_when_the_build_stops():
    stop = threading.Event()
    board = ChunkBoard(workers=2, stop=stop)
    helpers = idle_workers(board, 1)  # the other worker never leaves its conversion
    time.sleep(0.1)
    assert helpers[0].is_alive()
    stop.set()  # another worker failed: its chunks, if any, are its own to finish or drop
    helpers[0].join(timeout=5)
    assert not helpers[0].is_alive()


def test_the_poster_stops_taking_its_own_chunks_once_the_build_stops():
    """An interrupt or another worker's failure: the poster finishes the chunk it runs, starts no
    other, and raises ``BuildStopped`` (not an error anyone takes for a write error)."""
    stop = threading.Event()
    board = ChunkBoard(workers=1, stop=stop)
    ran: list[int] = []

    def job(index: int):
        def run() -> int:
            ran.append(index)
            if index == 2:
                stop.set()
            return index
        return run

    with board.worker():
        with pytest.raises(BuildStopped):
            board.run([job(i) for i in range(20)])
    assert ran == [0, 1, 2] and not issubclass(BuildStopped, RuntimeError)
