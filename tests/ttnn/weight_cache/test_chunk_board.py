# SPDX-License-Identifier: Apache-2.0
"""The chunk board: every posted chunk runs once, on the poster or on a helper, results in order; the
first error is raised in the poster once nothing of its weight runs; helpers leave when no worker
converts any more, or when the build stops."""

from __future__ import annotations

import threading

import pytest

from models.common.weight_cache.chunk_board import BuildStopped, ChunkBoard
from tests.ttnn.weight_cache.idle_workers import idle_workers


def meeting(board: ChunkBoard, threads: int) -> list[str]:
    """Post ``threads`` chunks that each wait for all the others to run at once: they complete only if
    that many threads (the poster and its helpers) take one each. The names of the threads that ran them."""
    everyone = threading.Barrier(threads, timeout=30)

    def run() -> str:
        everyone.wait()
        return threading.current_thread().name
    return board.run([run] * threads)


def test_every_chunk_runs_once_and_helpers_leave_with_the_last_worker():
    board = ChunkBoard(workers=3)
    ran: list[tuple[int, str]] = []
    first_chunks = threading.Barrier(3, timeout=30)  # the poster and both helpers, each on its first chunk

    def job(index: int):
        def run() -> int:
            name = threading.current_thread().name
            if name not in {n for _, n in ran}:
                ran.append((index, name))
                first_chunks.wait()  # every thread takes its share before any runs a second chunk
            else:
                ran.append((index, name))
            return index * index
        return run

    helpers = idle_workers(board, 2)
    with board.worker():
        results = board.run([job(i) for i in range(40)])
        # a worker still converts (it may post more): both helpers are still there to take a chunk
        assert sorted(meeting(board, 3)) == ["MainThread", "helper-0", "helper-1"]
    assert results == [i * i for i in range(40)]
    assert sorted(i for i, _ in ran) == list(range(40)), "each chunk once"
    assert {name for _, name in ran} == {"MainThread", "helper-0", "helper-1"}, "the helpers converted some"
    for helper in helpers:
        helper.join(timeout=5)
        assert not helper.is_alive()


def test_the_first_error_is_raised_in_the_poster_once_none_of_its_chunks_runs():
    board = ChunkBoard(workers=2)
    started: list[tuple[int, str]] = []
    finished: list[int] = []
    helper_took, poster_failed, poster_raised = threading.Event(), threading.Event(), threading.Event()
    raised_while_the_helper_ran: list[bool] = []

    def job(index: int):
        def run() -> int:
            started.append((index, threading.current_thread().name))
            if threading.current_thread().name != "MainThread":
                helper_took.set()
                assert poster_failed.wait(30)  # still running when the poster's own chunk fails
                if not raised_while_the_helper_ran:
                    # the poster must not raise while this chunk runs: give it the chance to
                    raised_while_the_helper_ran.append(poster_raised.wait(0.2))
                finished.append(index)
                return index
            assert helper_took.wait(30)
            poster_failed.set()
            raise OSError(f"chunk {index}: disk full")
        return run

    helpers = idle_workers(board, 1)
    with board.worker():
        with pytest.raises(OSError, match="disk full"):
            board.run([job(i) for i in range(20)])
        poster_raised.set()
        started_before_the_raise = list(started)
        assert raised_while_the_helper_ran == [False], "the poster waited for the helper's chunk"
        assert len(finished) == len(started) - 1, "every chunk the helper started had finished"
        assert [i for i, name in started if name == "MainThread"] == [0], "the poster took no chunk after its failure"
    helpers[0].join(timeout=5)
    assert not helpers[0].is_alive()
    assert started == started_before_the_raise and len(started) < 20, "no chunk started after the failure"


def test_a_waiting_helper_leaves_when_the_build_stops():
    stop = threading.Event()
    board = ChunkBoard(workers=2, stop=stop)
    helpers = idle_workers(board, 1)  # the other worker never leaves its conversion
    assert sorted(meeting(board, 2)) == ["MainThread", "helper-0"], "the helper waits for chunks, not for nothing"
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
