# SPDX-License-Identifier: Apache-2.0
"""Quiet by default, ``--verbose`` for everything: a real ``tt-cache build`` that opens ttnn's
(mock) cluster prints its one result line and no ttnn/UMD log line; with ``--verbose`` the native
lines are back; a level the user set wins either way. The real-model demo (``slow``): no
``Loading weights`` progress bar unless ``--verbose``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from models.common.device_env import PROJECT_SET_ENV
from models.testing import REPO_ROOT
from models.testing.tiny_models import make_checkpoint
from models.testing.tt_cache import cli_env, tt_cache

NATIVE = ("Currently using mock cluster descriptor", "| UMD |", "Opening user mode device driver", "Cluster destructor")


def _native_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if any(mark in " ".join(line.split()) for mark in NATIVE)]


def _env(cache: Path, **extra: str) -> dict[str, str]:
    """A shell's environment: none of the output variables the test process itself set."""
    env = cli_env(cache, **extra)
    for name in ("LOGURU_LEVEL", PROJECT_SET_ENV):
        if name not in extra:
            env.pop(name, None)
    return env


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return make_checkpoint("llama", tmp_path_factory.mktemp("output") / "tiny-llama")


def test_build_is_quiet_by_default_and_verbose_shows_the_native_lines(checkpoint, tmp_path):
    cache = tmp_path / "cache"
    quiet = tt_cache("build", str(checkpoint), "--precision", "bfloat8_b", env=_env(cache))
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    assert quiet.stdout.count("\n") == 1 and ": seeded: cold (" in quiet.stdout
    assert quiet.stderr == "", quiet.stderr[-3000:]  # no mock-cluster lines, no INFO logs, nothing after the result
    verbose = tt_cache("build", str(checkpoint), "--precision", "bfloat8_b", "--force", "--verbose", env=_env(cache))
    assert verbose.returncode == 0, verbose.stderr[-3000:]
    assert verbose.stdout.count("\n") == 1 and ": seeded: cold (" in verbose.stdout
    native = _native_lines(verbose.stderr)
    assert any("mock cluster" in line for line in native) and any("Cluster destructor" in line for line in native)
    assert "| INFO " in verbose.stderr and "cold build in" in verbose.stderr


def test_a_log_level_the_user_set_wins_over_quiet(checkpoint, tmp_path):
    """TT_LOGGER_LEVEL=info is the user's: the native lines show. LOGURU_LEVEL=INFO came from a
    parent process of the project (TT_OUTPUT_DEFAULTS says so): quiet replaces it."""
    env = _env(tmp_path / "cache", TT_LOGGER_LEVEL="info", LOGURU_LEVEL="INFO",
               **{PROJECT_SET_ENV: "LOGURU_LEVEL=INFO"})
    out = tt_cache("build", str(checkpoint), "--precision", "bfloat8_b", env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert any("mock cluster" in line for line in _native_lines(out.stderr))
    assert "| INFO " not in out.stderr, out.stderr[-3000:]


@pytest.mark.slow
def test_the_demo_shows_no_progress_bar_unless_verbose(tmp_path):
    from models.demos.real_models.prepare import prepare_model

    prepare_model("smollm2-135m")
    runs = {}
    for flag in ("", "--verbose"):
        env = _env(tmp_path / "cache")
        runs[flag] = subprocess.run([sys.executable, "-m", "models.demos.real_models.demo", "--model", "smollm2-135m",
                                     "--precision", "bfloat16", "--steps", "2", *([flag] if flag else [])],
                                    cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1200)
        assert runs[flag].returncode == 0, runs[flag].stderr[-3000:]
    quiet, verbose = runs[""], runs["--verbose"]
    assert "Loading weights" not in quiet.stdout + quiet.stderr and not _native_lines(quiet.stdout + quiet.stderr)
    assert "| INFO " not in quiet.stderr and "whole demo:" in quiet.stdout
    assert "Loading weights" in verbose.stderr and "| INFO " in verbose.stderr
