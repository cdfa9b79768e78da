# SPDX-License-Identifier: Apache-2.0
"""Crash safety with real processes, real signals and real mounts.

* SIGKILL at random points of a child that withdraws, rebuilds and re-marks the cache in a loop:
  afterwards the gate is cold, or the cache is truly complete (deep verify clean, every tensorbin
  loads with the checkpoint's values, host weights exact).
* Several seeders racing on one empty cache dir: afterwards warm, intact, no temp files.
* A read-only bind mount and an unwritable (chmod) dir: marking warns, never raises; a warm
  cache on read-only media still serves warm builds.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import ttnn

from models.common import weight_cache as wc
from models.testing.fixtures import NOBODY_UID, REPO_ROOT, run_helper
from models.testing import weight_cache_seeder as seeder

HELPER = [sys.executable, "-m", "models.testing.weight_cache_seeder"]


def gate(root: Path) -> wc.CacheStatus:
    return wc.weight_cache_status(wc.VariantPaths(root), **seeder.gate_kwargs())


def assert_warm_means_complete(root: Path) -> bool:
    """The invariant: warm only when the cache is complete and correct. Returns the gate's answer."""
    result = gate(root)
    if result.warm:
        assert wc.verify_weight_cache(wc.VariantPaths(root)) == [], "gate warm but deep verify found damaged files"
        assert seeder.cache_mismatches(root) == [], "gate warm but a tensorbin does not load or differs"
        sd = wc.build_cached_state_dict(root)
        expected = seeder.make_state_dict()
        for key in seeder.HOST_KEYS:
            assert torch.equal(sd[key], expected[key])
    return result.warm


def temp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if ".tmp." in p.name or p.name.endswith(".tmp")]


# --------------------------------------------------------------------------------------------
# SIGKILL at random points
# --------------------------------------------------------------------------------------------


def _wait_for_line(path: Path, text: str, child: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in path.read_text():
            return
        if child.poll() is not None:
            raise AssertionError(f"crash-loop child exited early with {child.returncode}")
        time.sleep(0.01)
    raise AssertionError(f"crash-loop child never printed {text!r}")


def run_kill_trials(root: Path, logs: Path, trials: int, seed: int) -> list[tuple[int, bool]]:
    """Start a marking loop, SIGKILL it after a random delay, check the invariant; ``trials`` times.

    Returns (rounds the child completed, gate warm afterwards) per trial."""
    rng = random.Random(seed)
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    outcomes = []
    for trial in range(trials):
        out, err = logs / f"loop{trial}.out", logs / f"loop{trial}.err"
        with open(out, "w") as stdout, open(err, "w") as stderr:
            child = subprocess.Popen(
                [*HELPER, "loop", str(root), "--seed", str(seed * 1000 + trial)],
                cwd=REPO_ROOT, env=env, stdout=stdout, stderr=stderr,
            )
            try:
                _wait_for_line(out, "ready", child)
                time.sleep(rng.uniform(0.0, 0.5))
                os.kill(child.pid, signal.SIGKILL)
            finally:
                child.kill()
                child.wait()
        assert child.returncode == -signal.SIGKILL, err.read_text()[-2000:]
        rounds = out.read_text().count("round ")
        outcomes.append((rounds, assert_warm_means_complete(root)))
    return outcomes


def _kill_then_reseed(tmp_path: Path, trials: int, seed: int) -> None:
    """Kill seeders at random points; whatever that left behind, one uninterrupted seed then
    makes the cache warm and correct."""
    root, logs = tmp_path / "cache", tmp_path / "logs"
    root.mkdir()
    logs.mkdir()
    outcomes = run_kill_trials(root, logs, trials=trials, seed=seed)
    print(f"kill trials (rounds completed, warm after kill): {outcomes}")
    report = run_helper("seed", str(root))
    assert report["marked"] == [True]
    assert assert_warm_means_complete(root)


def test_sigkill_at_random_points_never_leaves_a_warm_incomplete_cache(tmp_path: Path) -> None:
    _kill_then_reseed(tmp_path, trials=4, seed=1)


@pytest.mark.slow
def test_sigkill_at_random_points_many_trials(tmp_path: Path) -> None:
    _kill_then_reseed(tmp_path, trials=40, seed=2)


def test_debris_of_a_killed_writer_is_never_listed_or_read(seeded_cache) -> None:
    """What a SIGKILL mid-publish leaves (a unique temp file) is invisible to the gate and the lister."""
    root = seeded_cache.root
    stray_marker = root / f".{wc.marker_path(root).name}.tmp.999.1.deadbeef"
    stray_marker.write_bytes(b'{"format_version": 4, "torn')
    stray_bin = root / "layers.0" / ".attention.wq_dtype_BFLOAT8_B_layout_TILE.tensorbin.tmp.999.1.deadbeef"
    stray_bin.write_bytes(b"torn")
    assert wc.list_cache_files(root) == sorted(seeded_cache.files.values())
    assert gate(root).warm


# --------------------------------------------------------------------------------------------
# concurrent seeders
# --------------------------------------------------------------------------------------------


def test_four_concurrent_seeders_leave_a_warm_intact_cache(tmp_path: Path) -> None:
    root, barrier = tmp_path / "cache", tmp_path / "barrier"
    root.mkdir()
    barrier.mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    seeders = [
        subprocess.Popen(
            [*HELPER, "seed", str(root), "--rounds", "3", "--barrier", str(barrier)],
            cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        for _ in range(4)
    ]
    try:
        deadline = time.monotonic() + 180
        while len(list(barrier.glob("ready.*"))) < len(seeders):
            assert time.monotonic() < deadline, "seeders never became ready"
            assert all(s.poll() is None for s in seeders), "a seeder died before the race"
            time.sleep(0.01)
        (barrier / "go").touch()
        outputs = [s.communicate(timeout=180)[0] for s in seeders]
    finally:
        for s in seeders:
            s.kill()
            s.wait()
    assert [s.returncode for s in seeders] == [0] * len(seeders)
    for output in outputs:
        assert '"marked": [true, true, true]' in output
    assert gate(root).warm
    assert assert_warm_means_complete(root)
    assert temp_files(root) == []


def test_temp_paths_are_unique_per_writer(tmp_path: Path) -> None:
    from models.common.fileio import unique_temp_path

    names = {unique_temp_path(wc.marker_path(tmp_path)) for _ in range(1000)}
    assert len(names) == 1000
    assert all(p.parent == tmp_path and str(os.getpid()) in p.name for p in names)


# --------------------------------------------------------------------------------------------
# read-only and unwritable cache dirs
# --------------------------------------------------------------------------------------------


def test_a_warm_cache_on_a_read_only_mount_serves_warm_builds(seeded_cache, readonly_view, tiny_expected) -> None:
    view = readonly_view(seeded_cache.root)
    with pytest.raises(OSError):
        (view / "probe").touch()
    assert gate(view).warm
    sd = wc.build_cached_state_dict(view)
    key = "layers.0.attention.wq.weight"
    prefix = str(view / seeded_cache.files[key]).removesuffix("_dtype_BFLOAT8_B_layout_TILE.tensorbin")
    loaded = ttnn.as_tensor(sd[key], dtype=ttnn.bfloat8_b, layout=ttnn.TILE_LAYOUT, device=None, cache_file_name=prefix)
    assert torch.equal(ttnn.to_torch(loaded), tiny_expected[key])


def test_marking_on_a_read_only_mount_warns_and_the_build_still_succeeds(
    built_cache, readonly_view, captured_warnings
) -> None:
    view = readonly_view(built_cache.root)
    files = seeder.build_cache(view, built_cache.state_dict)  # every as_tensor hits: the build works read-only
    assert set(files.values()) == set(built_cache.files.values())
    assert seeder.mark(view, built_cache.state_dict) is False
    assert "Could not mark" in captured_warnings() and "Read-only file system" in captured_warnings()
    assert not wc.marker_path(view).exists() and temp_files(built_cache.root) == []
    assert not gate(view).warm


def test_invalidating_on_a_read_only_mount_warns_and_keeps_the_marker(
    seeded_cache, readonly_view, captured_warnings
) -> None:
    view = readonly_view(seeded_cache.root)
    wc.invalidate_weight_cache(view)
    assert "Could not withdraw" in captured_warnings()
    assert gate(view).warm


def _make_unwritable(root: Path) -> None:
    for directory, _, _ in os.walk(root):
        Path(directory).chmod(0o555)


def test_marking_an_unwritable_dir_as_an_unprivileged_user_warns_and_returns_false(
    world_readable_dir, tiny_state_dict, as_unprivileged
) -> None:
    root = world_readable_dir / "cache"
    root.mkdir()
    seeder.build_cache(root, tiny_state_dict)
    _make_unwritable(root)
    report = as_unprivileged("mark", str(root))
    assert report["marked"] is False
    assert "Could not mark" in report["warnings"] and "Permission denied" in report["warnings"]
    assert not wc.marker_path(root).exists() and temp_files(root) == []


def test_a_cache_seeded_by_one_user_is_warm_for_another(world_readable_dir, tiny_state_dict, as_unprivileged) -> None:
    root = world_readable_dir / "cache"
    root.mkdir()
    seeder.build_cache(root, tiny_state_dict)
    assert seeder.mark(root, tiny_state_dict)
    for path in [root, *root.rglob("*")]:
        os.chown(path, NOBODY_UID, NOBODY_UID)  # now the seeder was "nobody"; the reader is someone else
    _make_unwritable(root)
    report = as_unprivileged("gate", str(root))
    assert report["warm"] is True, report["reason"]
    assert report["host_ok"] is True
