# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures of the ttnn tests: real tensorbin caches, real mounts, real processes.

Generic on purpose (the loader tests reuse them): a cache here is a directory of ``.tensorbin``
files written by ``ttnn.as_tensor`` / ``ttnn.dump_tensor`` on the mock cluster, for the tiny
model of :mod:`models.testing.weight_cache_seeder`.
"""

from __future__ import annotations

import gc
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from loguru import logger

from models.testing import weight_cache_seeder as seeder

REPO_ROOT = Path(__file__).resolve().parents[2]
NOBODY_UID = 65534  # owner of files that must look like another user's


@dataclass
class TensorbinCache:
    """A real ttnn weight cache of the tiny model: ``files`` maps checkpoint key -> relative tensorbin."""

    root: Path
    state_dict: dict[str, torch.Tensor]
    files: dict[str, str]

    def path(self, key: str) -> Path:
        return self.root / self.files[key]

    def mark(self, **overrides) -> bool:
        return seeder.mark(self.root, self.state_dict, **overrides)

    def gate_kwargs(self, **overrides) -> dict:
        return seeder.gate_kwargs(**overrides)


@pytest.fixture(scope="session")
def tiny_state_dict() -> dict[str, torch.Tensor]:
    """The tiny model's deterministic bfloat16 checkpoint (do not mutate)."""
    return seeder.make_state_dict()


@pytest.fixture(scope="session")
def tiny_expected(tiny_state_dict) -> dict[str, torch.Tensor]:
    """What every cached weight must read back as (after its ttnn dtype round trip)."""
    return seeder.expected_values(tiny_state_dict)


@pytest.fixture
def built_cache(tmp_path: Path, tiny_state_dict) -> TensorbinCache:
    """A cache whose tensorbins are all written (bfloat16 and bfloat8_b TILE, mesh-sharded ones) but not marked."""
    root = tmp_path / "cache"
    root.mkdir()
    files = seeder.build_cache(root, tiny_state_dict)
    return TensorbinCache(root, dict(tiny_state_dict), files)


@pytest.fixture
def seeded_cache(built_cache: TensorbinCache) -> TensorbinCache:
    """A built cache marked complete (with the host sidecar, model_config and model_info)."""
    assert built_cache.mark(), "marking a freshly built cache failed"
    return built_cache


@pytest.fixture
def captured_warnings() -> Iterator[Callable[[], str]]:
    """A callable returning the WARNING+ loguru output logged so far in the test."""
    stream = io.StringIO()
    sink = logger.add(stream, level="WARNING", format="{level}: {message}")
    yield stream.getvalue
    logger.remove(sink)


@pytest.fixture
def readonly_view() -> Iterator[Callable[[Path], Path]]:
    """Make a real read-only bind mount of a directory: ``view = readonly_view(src)``.

    Needs mount privileges (root with CAP_SYS_ADMIN); otherwise the test is skipped with the reason.
    Every mount is undone in teardown."""
    mounts: list[Path] = []
    holder = Path(tempfile.mkdtemp(prefix="wc-ro-"))

    def make(source: Path) -> Path:
        target = holder / f"view{len(mounts)}"
        target.mkdir()
        bind = subprocess.run(["mount", "--bind", str(source), str(target)], capture_output=True, text=True)
        if bind.returncode != 0:
            pytest.skip(f"cannot bind-mount here (needs root with CAP_SYS_ADMIN): {bind.stderr.strip()}")
        mounts.append(target)
        remount = subprocess.run(["mount", "-o", "remount,ro,bind", str(target)], capture_output=True, text=True)
        if remount.returncode != 0:
            pytest.skip(f"cannot remount the bind mount read-only: {remount.stderr.strip()}")
        return target

    yield make
    gc.collect()  # drop mappings of files under the mount (ttnn and safetensors map lazily)
    for target in reversed(mounts):
        if subprocess.run(["umount", str(target)], capture_output=True).returncode != 0:
            # still busy (a module-level memo may map a file): detach now, the kernel frees it later
            subprocess.run(["umount", "--lazy", str(target)], check=True)
    shutil.rmtree(holder)


@pytest.fixture
def world_readable_dir() -> Iterator[Path]:
    """A fresh directory that other users can traverse (pytest's tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="wc-shared-"))
    path.chmod(0o755)
    yield path
    for directory, subdirs, _ in os.walk(path):
        for name in subdirs:
            Path(directory, name).chmod(0o755)
    path.chmod(0o755)
    shutil.rmtree(path)


DROP_FILE_PERMISSION_BYPASS = [
    "setpriv",
    "--bounding-set=-dac_override,-dac_read_search",
    "--inh-caps=-dac_override,-dac_read_search",
    "--",
]


def run_helper(*args: str, prefix: list[str] | None = None, timeout: float = 120) -> dict:
    """Run ``models.testing.weight_cache_seeder`` in a child process (``prefix``: a wrapper
    command such as :data:`DROP_FILE_PERMISSION_BYPASS`); return the JSON report it prints."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    result = subprocess.run(
        [*(prefix or []), sys.executable, "-m", "models.testing.weight_cache_seeder", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, f"helper {args} failed:\n{result.stderr[-3000:]}"
    # ttnn's C++ logger may print to stdout at exit (after the report), so take the last JSON line
    reports = [line for line in result.stdout.splitlines() if line.startswith("{")]
    assert reports, f"helper {args} printed no report:\n{result.stdout[-3000:]}"
    return json.loads(reports[-1])


@pytest.fixture
def as_unprivileged() -> Callable[..., dict]:
    """Run the seeder helper with file permissions enforced on it.

    Root ignores permission bits (CAP_DAC_OVERRIDE), so a chmod-ed directory stops nothing. The
    child here stays uid 0 but loses CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH (``setpriv``), so
    the kernel applies mode bits to it like to any user: owner bits on root's files, "other" bits
    on files owned by someone else. (Switching to ``nobody`` is no option here: the interpreter
    lives under /root, mode 0700.) When not root, permissions are enforced already."""
    if os.geteuid() != 0:
        return lambda *args: run_helper(*args)
    if shutil.which("setpriv") is None:
        pytest.skip("running as root and setpriv (util-linux) is missing: cannot drop CAP_DAC_OVERRIDE")

    def run(*args: str) -> dict:
        return run_helper(*args, prefix=DROP_FILE_PERMISSION_BYPASS)

    return run


@pytest.fixture
def as_unprivileged_python() -> Callable[..., str]:
    """Run a Python snippet (``python -c CODE ARGS...``) with file permissions enforced, as
    :func:`as_unprivileged` does for the seeder helper; returns its stdout (it must exit 0)."""
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("running as root and setpriv (util-linux) is missing: cannot drop CAP_DAC_OVERRIDE")
    prefix = DROP_FILE_PERMISSION_BYPASS if os.geteuid() == 0 else []

    def run(code: str, *args: str) -> str:
        result = subprocess.run([*prefix, sys.executable, "-c", code, *args], cwd=REPO_ROOT, capture_output=True,
                                text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout

    return run


@pytest.fixture
def cache_root(tmp_path, monkeypatch) -> Path:
    """A fresh ``$TT_CACHE_PATH`` for loader tests, with no forced cold builds."""
    root = tmp_path / "tt-cache"
    monkeypatch.setenv("TT_CACHE_PATH", str(root))
    monkeypatch.delenv("TT_TRANSFORMERS_FORCE_MODEL_LOAD", raising=False)
    return root


@pytest.fixture
def cli_in_process() -> Iterator[None]:
    """``tt-cache``'s ``main`` run inside the test process sets the quiet-output variables for
    its process and children (``device_env.set_output``): put the environment back afterwards, so
    that a later test's subprocess starts as the user's would."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
