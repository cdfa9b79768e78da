# SPDX-License-Identifier: Apache-2.0
"""The main job (``python -m models.demos.real_models.demo``, what ``scripts/run_demo.sh`` runs) on a
real model other than the default: prepare (already done), cold build, warm build in a fresh
process, verify, and the completion from the warm cache next to transformers'. ``slow`` (about a
minute; the parity tests cover the same loads): it runs with the rest of ``-m real_models``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from models.demos.real_models.known import KNOWN_MODELS
from models.demos.real_models.prepare import prepare_model
from models.testing import REPO_ROOT
from tests.ttnn.real_models.conftest import model_params


def _demo(*args: str, cache: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO_ROOT), TT_CACHE_PATH=str(cache))
    env.pop("TT_TRANSFORMERS_FORCE_MODEL_LOAD", None)
    return subprocess.run([sys.executable, "-m", "models.demos.real_models.demo", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=1800)


@pytest.mark.parametrize("model", model_params(names=("smollm2-135m",), marks=(pytest.mark.slow,)))
def test_demo_runs_the_main_job_on_a_chat_model(model, scratch: Path) -> None:
    snapshot = prepare_model(model.name)
    done = _demo("--model", model.name, "--precision", "bfloat16", "--mesh", "N300", "--steps", "6",
                 cache=scratch / "cache")
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert f"{model.name} ({model.repo_id}, llama; bfloat16, mesh N300) from {snapshot}" in out
    assert "| cold build |" in out and "| warm build |" in out and "prepare (first run only)" not in out
    assert "verify: every file matches its recorded digest" in out
    assert "(chat template applied)" in out
    ours = next(line for line in out.splitlines() if "from the warm cache (host reference forward):" in line)
    theirs = next(line for line in out.splitlines() if line.strip().startswith("transformers:"))
    assert ours.split(":", 1)[1].strip() == theirs.split(":", 1)[1].strip() != "''"
    assert str(scratch / "cache") in out  # the cache went where TT_CACHE_PATH points


def test_demo_refuses_an_unknown_model(tmp_path: Path) -> None:
    done = _demo("--model", "llama-7b", cache=tmp_path / "cache")
    assert done.returncode == 2
    assert "invalid choice: 'llama-7b'" in done.stderr and all(name in done.stderr for name in KNOWN_MODELS)
    assert "Traceback" not in done.stderr and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("model", model_params(names=("smollm2-135m",)))
def test_demo_refuses_a_mesh_the_model_cannot_be_laid_over_before_building(model, tmp_path: Path) -> None:
    """SmolLM2's MLP (1536 hidden units) does not split over 7 columns: refused from its config.json."""
    prepare_model(model.name)
    done = _demo("--model", model.name, "--mesh", "1x7", cache=tmp_path / "cache")
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        "demo: smollm2-135m cannot be built on mesh 1x7: its MLP hidden size 1536 cannot be split over 7 mesh columns"]
    assert not (tmp_path / "cache").exists()
