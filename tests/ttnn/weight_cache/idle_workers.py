# SPDX-License-Identifier: Apache-2.0
"""Conversion workers with no unit of their own, as threads: they help with the chunks others post
on a :class:`~models.common.weight_cache.chunk_board.ChunkBoard`."""

from __future__ import annotations

import threading

from models.common.weight_cache.chunk_board import ChunkBoard


def _idle_worker(board: ChunkBoard) -> None:
    with board.worker():
        pass  # no unit of its own
    board.help()


def idle_workers(board: ChunkBoard, count: int, name: str = "helper") -> list[threading.Thread]:
    """``count`` workers with no unit left, started: they help."""
    threads = [threading.Thread(target=_idle_worker, args=(board,), name=f"{name}-{i}") for i in range(count)]
    for thread in threads:
        thread.start()
    return threads
