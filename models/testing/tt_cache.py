# SPDX-License-Identifier: Apache-2.0
"""Run ``tt-cache`` as a user would (a fresh process) and read what it said."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil

REPO_ROOT = Path(__file__).resolve().parents[2]


def cli_env(cache_root: Path | None = None, **extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), HF_HUB_OFFLINE="1", **extra)
    env.pop("TT_TRANSFORMERS_FORCE_MODEL_LOAD", None)
    if cache_root is not None:
        env["TT_CACHE_PATH"] = str(cache_root)
    return env


def seed_workers(pid: int) -> list[psutil.Process]:
    """The seed worker processes (``models.seeding.worker``) that process ``pid`` started and that
    are still running; a child that ends (or is a zombie) while it is looked at is left out."""
    workers = []
    for child in psutil.Process(pid).children():
        try:
            if "models.seeding.worker" in child.cmdline():
                workers.append(child)
        except psutil.Error:
            continue
    return workers


def tt_cache(*args: str, env: dict[str, str], prefix: list[str] | None = None,
             timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*(prefix or []), sys.executable, "-m", "models.tt_cache.cli", *args], env=env,
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)


def json_out(result: subprocess.CompletedProcess) -> Any:
    """The JSON document a ``--json`` run printed: its whole stdout, nothing before or after it."""
    return json.loads(result.stdout)


def error_line(result: subprocess.CompletedProcess, command: str) -> str:
    """The one ``tt-cache <command>: ...`` line of a failed run; asserts there is no traceback."""
    assert "Traceback" not in result.stderr + result.stdout, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith(f"tt-cache {command}: ")]
    assert len(lines) == 1, f"expected one error line, got {lines}; stderr:\n{result.stderr[-3000:]}"
    return lines[0]


def built_tiny_llama(base: Path) -> tuple[Path, Path]:
    """(checkpoint, cache root) of a tiny llama under ``base`` whose cache ``tt-cache build`` made."""
    from models.testing.tiny_models import make_checkpoint

    checkpoint = make_checkpoint("llama", base / "tiny-llama")
    out = tt_cache("build", str(checkpoint), "--precision", "bfloat16", env=cli_env(base / "cache"))
    assert out.returncode == 0, out.stderr[-2000:]
    return checkpoint, base / "cache"
