# SPDX-License-Identifier: Apache-2.0
"""Seed progress never reads past 100%: a progress total is an estimate made before anything is
written, and what a real seed writes may exceed it (a multi-device tensorbin's larger header)."""

from __future__ import annotations

import re

import pytest

from models.seeding.progress import ProgressTracker
from models.testing.terminal import terminal_output

MiB = 1 << 20


def test_a_line_never_reads_more_done_than_its_total(tmp_path):
    log = tmp_path / "seed.log"
    with open(log, "w") as stream:
        tracker = ProgressTracker("tiny [N150 bfloat16]", stream=stream, log_every=0)
        tracker.start(2, int(190.3 * MiB))
        tracker.weight_done("tok_embeddings", 100 * MiB)
        tracker.weight_done("output", int(90.4 * MiB))
        tracker.weight_done("norm", 1)  # a weight more than planned, too
        tracker.tick()
    snapshot = tracker.snapshot()
    assert (snapshot.bytes_done, snapshot.total_bytes) == (int(190.4 * MiB) + 1, int(190.4 * MiB) + 1)
    assert (snapshot.weights_done, snapshot.total_weights) == (3, 3) and snapshot.eta == 0.0
    (line,) = log.read_text().splitlines()
    assert re.fullmatch(r"tiny \[N150 bfloat16\]: 3/3 weights, 190\.4 of 190\.4 MiB, [\d.,]+ MiB/s, ETA 0 s, "
                        r"last norm", line), line


def test_a_bar_never_reads_past_100_percent(tmp_path):
    def write(tty):
        bar = ProgressTracker("tiny [N150 bfloat16]", stream=tty)
        bar.start(2, 4 * MiB)
        bar.weight_done("a", 3 * MiB)
        bar.weight_done("b", 2 * MiB)  # 5 MiB of an estimated 4
        bar.close()

    shown = terminal_output(write)
    percents = [int(p) for p in re.findall(r"(\d+)%\|", shown)]
    assert percents and max(percents) == 100, shown
    counts = re.findall(r"(\d+(?:\.\d+)?)M/(\d+(?:\.\d+)?)M", shown)
    assert ("5.00", "5.00") in counts and all(float(n) <= float(total) for n, total in counts), shown
    assert "2/2 weights" in shown


@pytest.mark.parametrize("mesh", [(1, 1), (1, 2)])
def test_a_real_seed_stays_within_its_total(mesh, tiny_checkpoints, tmp_path):
    """One device: the estimate is what is written, headers counted. Two: the estimate is short by
    the larger headers of the sharded files; the counts still end at 100%."""
    from models.registry import loader_class

    checkpoint = tiny_checkpoints["llama"]
    seen = []

    class Watching(ProgressTracker):
        def weight_done(self, name: str, nbytes: int) -> None:
            super().weight_done(name, nbytes)
            seen.append(self.snapshot())

    with open(tmp_path / "seed.log", "w") as stream:
        tracker = Watching("tiny", stream=stream, log_every=0)
        result = loader_class("llama")(checkpoint, cache_root=tmp_path / "cache", mesh_shape=mesh).seed(tracker)
    assert result.complete and seen
    assert all(s.bytes_done <= s.total_bytes and s.weights_done <= s.total_weights for s in seen)
    last = seen[-1]
    assert last.weights_done == last.total_weights and last.bytes_done == last.total_bytes
    if mesh == (1, 1):
        assert tracker.total_bytes == last.bytes_done, "the estimate of a one-device build is what it writes"
    else:
        assert tracker.total_bytes < last.bytes_done
