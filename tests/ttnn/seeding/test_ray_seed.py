# SPDX-License-Identifier: Apache-2.0
"""Distributed seeding on a real local Ray instance (2 workers): bit-identical to a single-process
seed, several variants in one job, a failed variant left cold, and a worker SIGKILLed mid-task
(one worker in the short form)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from models.common.weight_cache import VariantPaths, verify_weight_cache
from models.registry import loader_class
from models.testing.llama_shaped import make_in_child, make_llama_shaped
from models.testing.seed_child import REPO_ROOT, assert_same_cache, child_env, run_seed_child
from models.testing.tiny_models import make_checkpoint

pytest.importorskip("ray")

TASK_TITLE = "ray::convert_part"


def ray_child(workers: int, cache_root: Path, *jobs: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "models.testing.ray_child", str(workers), str(cache_root), *jobs],
                            cwd=REPO_ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def report_of(proc: subprocess.Popen, timeout: float = 600) -> dict:
    out, err = proc.communicate(timeout=timeout)
    lines = [line for line in out.splitlines() if line.startswith("RAY_REPORT ")]
    assert proc.returncode == 0 and lines, f"Ray driver failed ({proc.returncode}):\n{err[-4000:]}"
    return json.loads(lines[-1].split(" ", 1)[1])


@pytest.mark.slow  # a Ray cluster and five variants: 30-48 s; the killed-worker case keeps Ray in the default suite
def test_ray_seed_of_several_variants_matches_single_process_seeds_and_a_failed_one_stays_cold(tmp_path):
    llama = make_checkpoint("llama", tmp_path / "llama")
    gemma = make_checkpoint("gemma3", tmp_path / "gemma")
    broken = tmp_path / "broken"
    shutil.copytree(llama, broken)
    config = json.loads((broken / "config.json").read_text())
    config["num_hidden_layers"] += 1  # the checkpoint lacks this layer: its task fails every try
    (broken / "config.json").write_text(json.dumps(config))
    jobs = [(llama, "bfloat8_b", "1x2"), (gemma, "bfloat16", "1x2"), (gemma, "bfloat8_b", "1x1"),
            (broken, "bfloat16", "1x1"),  # fails in the driver's plan
            (llama, "bfloat16", "3x1")]  # plans, then fails in the workers: 128 features over 3 mesh rows
    report = report_of(ray_child(2, tmp_path / "ray", *[f"{c},{p},{m}" for c, p, m in jobs]))
    assert report["error"] and "no tensor for" in report["error"] and "cannot split" in report["error"]
    assert [job["complete"] for job in report["jobs"]] == [True, True, True, False, False]
    for (checkpoint, precision, mesh), job in zip(jobs[:3], report["jobs"]):
        family = "llama" if checkpoint == llama else "gemma3"
        single = loader_class(family)(checkpoint, precision=precision, mesh_shape=mesh, cache_root=tmp_path / "one")
        assert single.seed().complete
        ray_dir = Path(job["cache_dir"])
        assert ray_dir.relative_to(tmp_path / "ray") == single.cache_dir.relative_to(tmp_path / "one")
        assert_same_cache(single.cache_dir, ray_dir, single.build_variant)  # markers too: files, digests, manifest
        assert verify_weight_cache(VariantPaths(ray_dir, single.build_variant)) == []


def kill_a_worker_mid_task(workers: int, checkpoint: Path, cache_root: Path,
                           while_waiting: Callable[[], None] = lambda: None) -> dict:
    """Seed ``checkpoint`` (bfloat8_b) on Ray and SIGKILL the first worker seen running a task, 0.3 s
    into it; return the driver's report. ``while_waiting`` runs while Ray starts."""
    driver = ray_child(workers, cache_root, f"{checkpoint},bfloat8_b,1x1")
    while_waiting()
    victim = None
    deadline = time.monotonic() + 300
    while victim is None and driver.poll() is None and time.monotonic() < deadline:
        for proc in psutil.Process(driver.pid).children(recursive=True):
            try:
                title = " ".join(proc.cmdline())
            except psutil.Error:
                continue
            if title.startswith(TASK_TITLE):
                victim = proc
                break
        time.sleep(0.02)
    assert victim is not None, f"no worker ever ran {TASK_TITLE}: {report_of(driver)}"
    time.sleep(0.3)  # mid-task: a part converts for a second or more
    still_running = " ".join(victim.cmdline()).startswith(TASK_TITLE)
    os.kill(victim.pid, signal.SIGKILL)
    report = report_of(driver)
    assert still_running, "the worker had finished its task before the kill: nothing was tested"
    return report


def assert_warm_and_identical(report: dict, reference: Path, checkpoint: Path) -> None:
    """The Ray seed finished, holds what a single-process seed wrote, and left one generation."""
    assert report["error"] is None and report["jobs"][0]["complete"]
    ray_dir = Path(report["jobs"][0]["cache_dir"])
    variant = loader_class("llama")(checkpoint, precision="bfloat8_b").build_variant
    assert_same_cache(reference, ray_dir, variant)
    assert verify_weight_cache(VariantPaths(ray_dir, variant)) == []
    generations = [p.name for p in ray_dir.iterdir() if p.is_dir()]
    assert len(generations) == 1, f"old or failed generations left behind: {generations}"


def test_ray_worker_killed_mid_task_is_retried_and_the_seed_ends_warm_and_identical(tmp_path):
    """The short form: one worker (each worker process imports torch and ttnn), a one-layer Llama
    shape (0.34 GB) made in this process, and its single-process reference seeded here while Ray
    starts: about one Ray start, one worker and its replacement."""
    checkpoint = make_llama_shaped(tmp_path / "llama-1-layer", 1)
    reference = loader_class("llama")(checkpoint, precision="bfloat8_b", cache_root=tmp_path / "single")
    seeded = []
    report = kill_a_worker_mid_task(1, checkpoint, tmp_path / "ray", lambda: seeded.append(reference.seed()))
    assert seeded[0].complete
    assert_warm_and_identical(report, reference.cache_dir, checkpoint)


@pytest.fixture
def llama_06(tmp_path) -> Iterator[Path]:
    directory = make_in_child(tmp_path / "llama-0.6gb", 4)
    yield directory
    shutil.rmtree(directory)


@pytest.mark.slow  # 35-82 s: the short form above keeps the case in the default suite
def test_ray_worker_killed_mid_task_of_two_is_retried_on_a_06_gb_llama_shape(llama_06, tmp_path):
    """The long form: two workers (the other keeps converting), four layers (longer parts), the
    reference seeded in its own process."""
    report = kill_a_worker_mid_task(2, llama_06, tmp_path / "ray")
    rc, single, err = run_seed_child("seed", llama_06, tmp_path / "single", precision="bfloat8_b")
    assert rc == 0 and single["complete"], err
    assert_warm_and_identical(report, Path(single["cache_dir"]), llama_06)
