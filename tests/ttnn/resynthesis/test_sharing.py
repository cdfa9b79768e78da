# SPDX-License-Identifier: Apache-2.0
"""Two trainers at once share the CPUs and the prefills.

* Threads never oversubscribe: two real trainer processes computing at the same time keep the
  sum of their torch threads within the CPUs they may use, at every moment of their merged
  decision histories (how many a trainer takes alone depends on the machine's other load, which
  the tests do not control); ``--threads``, ``OMP_NUM_THREADS`` and ``sched_getaffinity`` are
  honoured.
* One producer per object: a second trainer on the same cache waits for the features the first
  one is computing (a real process held with SIGSTOP while it holds its claims) instead of
  computing them; together they compute each prefill once.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from models.common.fileio import lock_held_elsewhere
from models.common.prefill_cache.layout import PRODUCER_LOCK_NAME, object_dirs
from models.resynthesis.threads import MEMBER_SUFFIX, WAITING, affinity_cpus
from models.testing.resynthesis_world import World, losses, report

CPUS = len(affinity_cpus())


def _finish(process, timeout: float = 600) -> tuple[int, str]:
    try:
        out, err = process.communicate(timeout=timeout)
    except BaseException:
        process.kill()
        process.communicate()
        raise
    assert "Traceback" not in err, err[-4000:]
    return process.returncode, out + err[-3000:]


def _timeline(*histories: list[list[float]]) -> list[tuple[float, tuple[int, ...]]]:
    """Every moment a process changed its threads: (time, threads of every process then)."""
    events = sorted((at, index, threads) for index, history in enumerate(histories) for at, threads in history)
    current = [0] * len(histories)
    moments = []
    for at, index, threads in events:
        current[index] = threads
        moments.append((at, tuple(current)))
    return moments


@pytest.mark.skipif(CPUS < 2, reason="sharing CPUs needs at least two")
def test_two_trainers_at_once_never_oversubscribe_the_cpus(world: World, tmp_path):
    env = world.env(TT_CPU_SHARE_DIR=str(tmp_path / "share"))
    args = ("--prompts", "160", "--min-tokens", "150", "--max-tokens", "250", "--epochs", "2", "--no-cache",
            "--batch-size", "8")
    trainers = [world.popen(*args, "--json", tmp_path / f"{name}.json", env=env) for name in ("a", "b")]
    for trainer in trainers:
        code, output = _finish(trainer)
        assert code == 0, output
    histories = [report(tmp_path / f"{name}.json")["threads"]["history"] for name in ("a", "b")]
    timeline = _timeline(*histories)
    assert all(sum(threads) <= CPUS for _, threads in timeline), timeline
    assert any(min(threads) >= 1 for _, threads in timeline), f"the trainers never computed at once: {timeline}"
    assert not list((tmp_path / "share").glob(f"*{MEMBER_SUFFIX}"))  # both left the share


def test_threads_option_omp_num_threads_and_affinity_are_honoured(world: World, tmp_path):
    base = ("--prompts", "4", "--min-tokens", "4", "--max-tokens", "12", "--epochs", "1", "--batch-size", "4",
            "--no-cache")

    def used(name: str, *extra: str, **env: str) -> dict:
        done = world.main(*base, *extra, "--json", tmp_path / f"{name}.json", TT_CPU_SHARE_DIR=str(tmp_path / name),
                          **env)
        assert done.returncode == 0, done.stdout
        return report(tmp_path / f"{name}.json")["threads"]

    fixed = used("fixed", "--threads", "3")
    assert fixed["setting"] == 3 and {threads for _, threads in fixed["history"]} == {0, 3}
    omp = used("omp", OMP_NUM_THREADS="1")
    assert omp["cap"] == 1 and {threads for _, threads in omp["history"]} == {0, 1}
    saved = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(saved)})
    try:
        pinned = used("pinned")
    finally:
        os.sched_setaffinity(0, saved)
    assert pinned["cpus"] == [min(saved)] and {threads for _, threads in pinned["history"]} == {0, 1}
    from models.demos.resynthesis.__main__ import parse_args

    for bad in ("0", "-1", "many"):
        with pytest.raises(SystemExit) as exit_:
            parse_args(["--threads", bad])
        assert exit_.value.code == 2
    done = world.demo(*base, "--threads", "0")
    assert done.returncode == 2 and "Traceback" not in done.stderr and "--threads" in done.stderr


def _held_claims(root: Path) -> list[Path]:
    if not (root / "objects").exists():
        return []
    return [d for d in object_dirs(root) if lock_held_elsewhere(d / PRODUCER_LOCK_NAME)]


def _stop_while_claiming(process, root: Path, deadline: float) -> list[Path]:
    """SIGSTOP ``process`` at a moment it holds claims; returns the claimed objects."""
    while time.monotonic() < deadline:
        assert process.poll() is None, "the first trainer finished before it was caught claiming"
        if _held_claims(root):
            os.kill(process.pid, signal.SIGSTOP)
            held = _held_claims(root)  # a stopped process cannot release them any more
            if held:
                return held
            os.kill(process.pid, signal.SIGCONT)
        time.sleep(0.002)
    raise AssertionError("the first trainer never held a claim")


def _waiting(share_dir: Path, deadline: float) -> None:
    """Until the trainer of ``share_dir`` waits (it gives its CPU share back while it waits)."""
    while time.monotonic() < deadline:
        for member in share_dir.glob(f"*{MEMBER_SUFFIX}"):
            try:
                state = json.loads(member.read_text() or "{}")
            except (OSError, ValueError):
                continue
            if state.get("state") == WAITING:
                return
        time.sleep(0.01)
    raise AssertionError("the second trainer never waited for the first one's features")


def test_two_trainers_on_one_cache_compute_each_prefill_once(world: World, tmp_path):
    root = tmp_path / "prefill"
    args = ("--prompts", "40", "--min-tokens", "100", "--max-tokens", "250", "--epochs", "2", "--batch-size", "8",
            "--prefill-cache", root)
    first = world.popen(*args, "--threads", "1", "--json", tmp_path / "first.json",
                        env=world.env(TT_CPU_SHARE_DIR=str(tmp_path / "share-first")))
    try:
        claimed = _stop_while_claiming(first, root, time.monotonic() + 300)
        # One thread each (the second through OMP_NUM_THREADS, so it shares automatically and shows
        # its waits): the same arithmetic in both, so their curves must match bit for bit.
        second = world.popen(*args, "--json", tmp_path / "second.json",
                             env=world.env(TT_CPU_SHARE_DIR=str(tmp_path / "share-second"), OMP_NUM_THREADS="1"))
        _waiting(tmp_path / "share-second", time.monotonic() + 300)  # blocked on the stopped trainer's claims
    finally:
        os.kill(first.pid, signal.SIGCONT)
    for trainer in (first, second):
        code, output = _finish(trainer)
        assert code == 0, output
    reports = [report(tmp_path / f"{name}.json") for name in ("first", "second")]
    computed = [sum(epoch["prefills"] for epoch in r["epochs"]) for r in reports]
    assert sum(computed) == 40, computed  # each prefill once, in all
    assert reports[1]["epochs"][0]["waited"] >= len(claimed), reports[1]["epochs"][0]
    assert losses(tmp_path / "first.json") == losses(tmp_path / "second.json")  # the same features, the same curve
    assert not _held_claims(root)


def test_cpus_busy_with_other_work_are_not_taken(tmp_path):
    """A real CPU-bound process on a CPU makes that CPU busy for the share (whatever else runs)."""
    import subprocess
    import sys

    from models.resynthesis.threads import ForeignLoad

    cpu = min(affinity_cpus())
    spin = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"
    burner = subprocess.Popen([sys.executable, "-c", spin])
    try:
        time.sleep(0.5)
        load = ForeignLoad(frozenset({cpu}), interval_s=0.0)
        time.sleep(1.0)
        assert load.update() >= 0.7
    finally:
        burner.kill()
        burner.wait()
