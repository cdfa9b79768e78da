# SPDX-License-Identifier: Apache-2.0
"""One cold build for every entry (``load()``, ``seed()``, the Ray seed): the gate runs once before the build lock
and once under it, never a third time after the commit, and the checkpoint is planned once.

Counted through the family's own hooks: a loader subclass counts its ``status`` (the gate's one
door) and its ``tensor_shape_problem`` (asked once per tensor each time a build is planned)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from models.common.cold_build import ColdBuild
from models.common.weight_cache.layout import GENERATION_PREFIX
from models.registry import loader_class
from models.testing.seed_child import REPO_ROOT, child_env
from models.testing.tiny_models import make_checkpoint

LLAMA = loader_class("llama")


class CountingLoader(LLAMA):
    """The llama loader, counting the gate's verdicts and the plans' shape checks."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gates = 0
        self.shape_checks: Counter[str] = Counter()

    def status(self, args=None):
        self.gates += 1
        return super().status(args)

    def tensor_shape_problem(self, key, shape, args):
        self.shape_checks[key] += 1
        return super().tensor_shape_problem(key, shape, args)

    @property
    def plans(self) -> int:
        return max(self.shape_checks.values(), default=0)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return make_checkpoint("llama", tmp_path_factory.mktemp("tiny") / "llama")


@pytest.mark.parametrize("workers", [1, 2])
def test_a_cold_load_asks_the_gate_twice_and_plans_once(checkpoint, tmp_path, workers):
    loader = CountingLoader(checkpoint, cache_root=tmp_path / "cache", workers=workers)
    loaded = loader.load()
    assert loaded.cached and loaded.streamed is False and "read_back" in loaded.timings
    assert (loader.gates, loader.plans) == (2, 1)
    warm = CountingLoader(checkpoint, cache_root=tmp_path / "cache", workers=workers)
    assert warm.load().warm and (warm.gates, warm.plans) == (1, 0)


def test_a_seed_asks_the_gate_twice_plans_once_and_reports_what_it_committed(checkpoint, tmp_path):
    loader = CountingLoader(checkpoint, cache_root=tmp_path / "cache", workers=2)
    seeded = loader.seed()
    assert seeded.complete and not seeded.warm and (loader.gates, loader.plans) == (2, 1)
    marker = loader.status().marker
    assert seeded.files == len(marker.files) + (marker.host_sidecar is not None)
    assert seeded.bytes_written == sum(r.bytes for r in marker.all_files())
    again = CountingLoader(checkpoint, cache_root=tmp_path / "cache")
    assert again.seed().warm and (again.gates, again.plans) == (1, 0)


def test_a_build_that_finds_the_cache_warm_under_the_lock_converts_nothing(checkpoint, tmp_path):
    """A second builder that waited for the lock: its gate under the lock finds the first one's
    build, and it neither opens a generation nor converts."""
    first = CountingLoader(checkpoint, cache_root=tmp_path / "cache")
    args = first.make_args(first.model_config(), None)
    with ColdBuild(first, args, cold="told cold") as build:  # the caller's gate said cold: one more, under the lock
        assert not build.warm and build.plan and first.gates == 1
        build.run()
    second = CountingLoader(checkpoint, cache_root=tmp_path / "cache")
    with ColdBuild(second, args, cold="told cold") as build:
        assert build.warm and build.root is None
    generations = [p.name for p in first.cache_dir.iterdir() if p.name.startswith(GENERATION_PREFIX)]
    assert second.gates == 1 and generations == [first.status().marker.generation]


RAY_DRIVER = r"""
import json, sys
from collections import Counter
from models.common.device_env import ensure_host_cluster
ensure_host_cluster()
from models.llama import LlamaLoader
from models.seeding.ray_seed import seed_on_ray

loader = LlamaLoader(sys.argv[1], cache_root=sys.argv[2])
gates, checks = [0], Counter()
status, shape_problem = loader.status, loader.tensor_shape_problem

def counted_status(args=None):  # the loader's own gate, counted (tasks rebuild a plain LlamaLoader)
    gates[0] += 1
    return status(args)

def counted_shape_problem(key, shape, args):
    checks[key] += 1
    return shape_problem(key, shape, args)

loader.status, loader.tensor_shape_problem = counted_status, counted_shape_problem
[seeded] = seed_on_ray([loader], workers=1)
print("COUNTS " + json.dumps({"gates": gates[0], "plans": max(checks.values()), "complete": seeded.complete}))
"""


@pytest.mark.slow  # a Ray instance: 60-170 s here; the load and seed counts above are the short form
def test_a_ray_seed_asks_the_gate_twice_and_the_driver_plans_once(checkpoint, tmp_path):
    pytest.importorskip("ray")
    driver = subprocess.run([sys.executable, "-c", RAY_DRIVER, str(checkpoint), str(tmp_path / "cache")],
                            cwd=REPO_ROOT, env=child_env(), capture_output=True, text=True, timeout=600)
    lines = [line for line in driver.stdout.splitlines() if line.startswith("COUNTS ")]
    assert driver.returncode == 0 and lines, driver.stderr[-4000:]
    assert json.loads(lines[-1].split(" ", 1)[1]) == {"gates": 2, "plans": 1, "complete": True}
