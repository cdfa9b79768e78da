# SPDX-License-Identifier: Apache-2.0
"""How many conversion workers and prefetch threads: every bad value of an argument is refused in
one line naming it (a ``ValueError`` from the loaders; a bad variable is refused in
``tests/ttnn/common/test_envs.py``); one per CPU honours a real cgroup's CPU quota; a build never
starts more workers than its plan has units of work (so 256 requested under a real pids limit of
64 build)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from models.common.build_plan import plan_weights
from models.common.convert_workers import units_of_work
from models.registry import loader_class
from models.testing.tiny_models import make_checkpoint
from models.testing.tt_cache import REPO_ROOT, cli_env

CGROUP_V1_CPU = Path("/sys/fs/cgroup/cpu")
CGROUP_V1_PIDS = Path("/sys/fs/cgroup/pids")

BAD_ARGUMENTS = [
    ("workers", value, "a whole number from 0 to 256") for value in (True, 2.5, -1, 257, 30000, "2")
] + [
    ("prefetch", value, "a whole number from 0 to 64") for value in (True, 2.5, -1, 65, "4")
]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    return make_checkpoint("llama", tmp_path_factory.mktemp("worker-counts") / "tiny-llama")


@pytest.mark.parametrize("name, value, accepts", BAD_ARGUMENTS)
def test_a_bad_argument_is_a_value_error_naming_it(tiny_llama, tmp_path, name, value, accepts):
    with pytest.raises(ValueError, match=f"^{name}={value!r}: expected {accepts}"):
        loader_class("llama")(tiny_llama, precision="bfloat16", cache_root=tmp_path, **{name: value})


def _in_cgroup(group: Path, code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh Python that first moves itself into ``group`` (cgroup.procs)."""
    script = f"import os; open({str(group / 'cgroup.procs')!r}, 'w').write(str(os.getpid()))\n" + code
    return subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def _writable_v1(controller: Path) -> str | None:
    """Why a v1 cgroup of ``controller`` cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root to make a cgroup"
    if not controller.is_dir() or not os.access(controller, os.W_OK):
        return f"{controller} is not a writable cgroup v1 hierarchy"
    return None


@pytest.fixture
def v1_group(request):
    """A fresh cgroup under a v1 hierarchy (``request.param``), removed after the test."""
    controller = request.param
    if why := _writable_v1(controller):
        pytest.skip(why)
    group = controller / f"tt-worker-counts-{os.getpid()}"
    group.mkdir()
    yield group
    group.rmdir()  # its processes ended with the test


@pytest.mark.parametrize("v1_group", [CGROUP_V1_CPU], indirect=True)
def test_one_per_cpu_honours_a_v1_cpu_quota(tiny_llama, tmp_path, v1_group):
    """A quota of one CPU on a host whose affinity mask has more: the loader's default is one worker."""
    affinity = len(os.sched_getaffinity(0))
    if affinity < 2:
        pytest.skip("one CPU in the affinity mask: a quota of one could not show")
    (v1_group / "cpu.cfs_period_us").write_text("100000")
    (v1_group / "cpu.cfs_quota_us").write_text("100000")
    code = ("from models.registry import loader_class\n"
            f"loader = loader_class('llama')({str(tiny_llama)!r}, precision='bfloat16', cache_root={str(tmp_path)!r})\n"
            "print('COUNTS', loader.workers, len(__import__('os').sched_getaffinity(0)))\n")
    env = cli_env()
    env.pop("TT_CONVERT_WORKERS", None)
    out = _in_cgroup(v1_group, code, env)
    assert out.returncode == 0, out.stderr[-3000:]
    [line] = [line for line in out.stdout.splitlines() if line.startswith("COUNTS ")]
    assert line.split()[1:] == ["1", str(affinity)], line


def test_one_per_cpu_honours_a_v2_cpu_max():
    """``cpu.max`` of a cgroup v2 the cpu controller is enabled in, where this host has one."""
    from models.common.cpus import _mounts

    mounts = [point for point, _ in _mounts("cgroup2", None)]
    usable = [m for m in mounts if "cpu" in (m / "cgroup.controllers").read_text().split()]
    if not usable:
        pytest.skip(f"no cgroup v2 hierarchy here has the cpu controller ({mounts or 'none mounted'}): "
                    "it is bound to v1; the v1 quota test covers the rule")
    root = usable[0]
    if "cpu" not in (root / "cgroup.subtree_control").read_text().split():
        (root / "cgroup.subtree_control").write_text("+cpu")
    group = root / f"tt-worker-counts-{os.getpid()}"
    group.mkdir()
    try:
        (group / "cpu.max").write_text("100000 100000")
        out = _in_cgroup(group, "from models.common.cpus import usable_cpus; print('COUNTS', usable_cpus())\n",
                         cli_env())
        assert out.returncode == 0 and "COUNTS 1" in out.stdout, out.stderr[-2000:]
    finally:
        group.rmdir()


@pytest.mark.parametrize("v1_group", [CGROUP_V1_PIDS], indirect=True)
def test_workers_are_fitted_to_the_plan_under_a_pids_limit(tiny_llama, tmp_path, v1_group):
    """256 workers asked for a tiny model under a pids limit of 64: it builds on as many workers as
    the plan has units of work (each more would only wait), the cache complete."""
    loader = loader_class("llama")(tiny_llama, precision="bfloat16", cache_root=tmp_path)
    units = units_of_work(plan_weights(loader, loader.make_args(loader.model_config(), None)))
    assert 1 < units < 40, units
    (v1_group / "pids.max").write_text("64")
    code = ("from models.registry import loader_class\n"
            f"loader = loader_class('llama')({str(tiny_llama)!r}, precision='bfloat16', cache_root={str(tmp_path)!r},"
            " workers=256)\n"
            "loaded = loader.load()\n"
            "print('BUILT', loaded.timings.get('workers'), loader.status().warm)\n")
    out = _in_cgroup(v1_group, code, cli_env())
    assert out.returncode == 0, out.stderr[-3000:]
    [line] = [line for line in out.stdout.splitlines() if line.startswith("BUILT ")]
    assert line.split()[1:] == [str(units), "True"], line
