# SPDX-License-Identifier: Apache-2.0
"""vLLM's ``optimizations="performance"`` selects the real performance policy: the very cache
``scripts/run_demo.sh --precision performance`` builds, started warm from it.

A real model (SmolLM2-135M-Instruct, prepared from its PyPI package into a private model root), the
demo run as a user runs it, then the offline example in a fresh vLLM process on the same hub and
cache root."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from models.testing import REPO_ROOT
from models.testing.environments import EnvironmentMissing, environment_python
from tests.ttnn.vllm.engines import run_offline

pytestmark = [pytest.mark.slow, pytest.mark.real_models("smollm2-135m")]


def default_venv_view(directory: Path) -> Path:
    """The default environment as ``scripts/run_demo.sh`` finds it ready: a venv over its packages
    whose setup stamp is this tree's (the shared venv may be stamped by another tree; run_demo.sh
    would then reinstall it under every other engineer's feet)."""
    try:
        python = environment_python("default")
    except EnvironmentMissing as error:
        pytest.skip(str(error))
    venv = python.parent.parent
    (directory / "bin").mkdir(parents=True)
    shutil.copy(venv / "pyvenv.cfg", directory / "pyvenv.cfg")
    (directory / "bin" / "python").symlink_to(python.resolve())
    (directory / "lib").symlink_to(venv / "lib")
    want = subprocess.run("cat requirements.txt setup.py | sha256sum", shell=True, cwd=REPO_ROOT, text=True,
                          capture_output=True, check=True).stdout.split()[0]
    (directory / ".setup-stamp").write_text(want + "\n")
    return directory


def test_vllm_performance_starts_warm_from_the_cache_run_demo_built(tmp_path_factory) -> None:
    work = tmp_path_factory.mktemp("policy-vllm")
    venv = default_venv_view(work / "venv")
    cache, model_data = work / "cache", work / "model_data"
    try:
        env = {"TT_VENV": str(venv), "TT_MODEL_DATA": str(model_data), "TT_CACHE_PATH": str(cache),
               "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO_ROOT)}
        demo = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "run_demo.sh"), "--model", "smollm2-135m",
                               "--precision", "performance", "--steps", "2"], cwd=REPO_ROOT, capture_output=True,
                              text=True, timeout=1500, env={**os.environ, **env, "TT_TRANSFORMERS_FORCE_MODEL_LOAD": ""})
        assert demo.returncode == 0, demo.stderr[-4000:]
        built = Path(re.search(r"tensors, in (\S+)\n", demo.stdout).group(1))
        assert built.parent.name == "performance", built
        assert any("BFLOAT4_B" in p.name for p in built.rglob("*feed_forward.w1_*.tensorbin"))  # the real policy

        proc, report = run_offline("--model", "HuggingFaceTB/SmolLM2-135M-Instruct", "--optimizations", "performance",
                                   "--greedy_sampling", "--max_tokens", "2", "--max_model_len", "256",
                                   env={"HF_HUB_CACHE": str(model_data / "hub"), "HF_HUB_OFFLINE": "1",
                                        "TT_CACHE_PATH": str(cache), "TT_TRANSFORMERS_FORCE_MODEL_LOAD": ""},
                                   report=work / "report.json")
        assert proc.returncode == 0 and report is not None, proc.stderr[-4000:]
        startup = report["startup"]
        assert startup["warm"] and Path(startup["cache_dir"]) == built, startup
        variants = [p.parent for p in cache.rglob(".weights_complete.*")]
        assert variants == [built]  # one cache, shared
    finally:
        shutil.rmtree(work, ignore_errors=True)

