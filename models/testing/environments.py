# SPDX-License-Identifier: Apache-2.0
"""The project's two Python environments, for tests that hold one against the other: the default
one (``TT_VENV``) and the vLLM one (``TT_VLLM_VENV``, another transformers). A tokenizer or config
fault of one environment shows only when the other one is the reference."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path
from typing import Any, Literal

from models.common import envs
from models.testing import REPO_ROOT

Environment = Literal["default", "vllm"]


class EnvironmentMissing(RuntimeError):
    """The other environment is not built here (its variable names where it was looked for)."""


def this_environment() -> Environment:
    return "vllm" if importlib.util.find_spec("vllm") is not None else "default"


def other_environment() -> Environment:
    return "default" if this_environment() == "vllm" else "vllm"


def environment_python(name: Environment) -> Path:
    """``bin/python`` of the environment ``name``; an error naming the variable when it is missing."""
    variable = "TT_VLLM_VENV" if name == "vllm" else "TT_VENV"
    python = getattr(envs, variable) / "bin" / "python"
    if not python.exists():
        raise EnvironmentMissing(f"the {name} environment is not at {python.parent.parent}: set {variable}"
                                 + (" or run scripts/setup_vllm_env.sh" if name == "vllm" else ""))
    return python


def run_python(name: Environment, *args: str, timeout: float = 1800,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python args`` in environment ``name``, this checkout first on the path, the hub offline."""
    return subprocess.run([str(environment_python(name)), *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1", **(env or {})})


def run_module(name: Environment, module: str, *args: str, timeout: float = 1800,
               env: dict[str, str] | None = None) -> dict[str, Any]:
    """``python -m module args`` in environment ``name``; returns the JSON object its last stdout
    line prints (a failure raises with its stderr)."""
    proc = run_python(name, "-m", module, *args, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{module} in the {name} environment exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
