# SPDX-License-Identifier: Apache-2.0
"""A CI runner without the shared mount: the workflow's store job's seed step (``tt-cache seed --plan``
with ``$TT_CACHE_REMOTE``), run by bash against a real S3 server. The first seed (a fresh cache root)
builds cold and pushes (a store miss), the second (another fresh root) pulls and builds nothing (a
hit); the job summary and the JSON report show both. A push that fails leaves the build warm here,
with one warning; a cold load pushes only when asked."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from loguru import logger

from models.common.weight_cache.marker import iter_markers
from models.common.weight_cache.remote.after_build import recording
from models.common.weight_cache.remote.pull import trusted_manifest
from models.common.weight_cache.remote.urls import open_store
from models.testing import REPO_ROOT
from models.testing.object_store import free_ports
from models.testing.tiny_models import make_checkpoint
from models.testing.tt_cache import cli_env, tt_cache

PUSH_FAILED = "built and warm here, but pushing it to"
WORKFLOW = REPO_ROOT / ".github" / "workflows" / "warm-cache.yaml"
STEP_GIVES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_REGION")  # the step's own env


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    return make_checkpoint("llama", tmp_path_factory.mktemp("seed-store") / "tiny-llama")


def _store_step() -> tuple[dict, dict, dict]:
    """(workflow env, job env, step) of the workflow's store job's seed step."""
    workflow = yaml.safe_load(WORKFLOW.read_text())
    job = workflow["jobs"]["seed-store"]
    (step,) = [step for step in job["steps"] if step.get("id") == "seed"]
    return workflow["env"], job["env"], step


def _resolved(env: dict[str, str], expressions: dict[str, str]) -> dict[str, str]:
    """``env`` with each ``${{ expression }}`` as GitHub would give it here (an unknown one fails)."""
    def value(text: str) -> str:
        match = re.fullmatch(r"\$\{\{ (.+) \}\}", text)
        return expressions[match[1]] if match else text

    return {name: value(str(text)) for name, text in env.items()}


def _seed(tiny_llama: Path, root: Path, seaweed, url: str):
    """The workflow's store seed step, run by bash as the runner runs it (the repository's plan file
    a one-variant plan of the tiny llama, the job's cache dir the fresh root ``root``, its secrets
    the test server's key pair); returns (run, JSON report, summary, outputs)."""
    workspace = root / "workspace"
    (workspace / ".github").mkdir(parents=True)
    (workspace / ".venv").symlink_to(sys.prefix)  # the step activates the runner's environment
    plan = {"models": [{"model": str(tiny_llama), "meshes": ["N150"], "precisions": ["bfloat16"]}]}
    workflow_env, job_env, step = _store_step()
    (workspace / workflow_env["PLAN"]).write_text(json.dumps(plan))
    server = seaweed.client_env({})
    env = _resolved({**workflow_env, **job_env, **step["env"]}, {
        "inputs.cache-store || vars.TT_CACHE_REMOTE": url, "inputs.stall-timeout || '900'": "900",
        "secrets.TT_CACHE_AWS_ACCESS_KEY_ID": server["AWS_ACCESS_KEY_ID"],
        "secrets.TT_CACHE_AWS_SECRET_ACCESS_KEY": server["AWS_SECRET_ACCESS_KEY"],
        "vars.TT_CACHE_AWS_ENDPOINT_URL": server["AWS_ENDPOINT_URL"], "vars.TT_CACHE_AWS_REGION || 'us-east-1'": "us-east-1"})
    isolated = {name: value for name, value in server.items() if name not in STEP_GIVES}  # no ~/.aws, no IMDS
    env = {**{name: value for name, value in cli_env().items() if not name.startswith("AWS_")}, **isolated, **env,
           "TT_CACHE_PATH": str(root / "cache"), "GITHUB_STEP_SUMMARY": str(root / "summary.md"),
           "GITHUB_OUTPUT": str(root / "output")}
    env.pop("LOGURU_LEVEL", None)
    run = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=workspace, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    outputs = dict(line.split("=", 1) for line in (root / "output").read_text().splitlines())
    report = json.loads((workspace / "reports" / "seed-store.json").read_text())
    return run, report, (root / "summary.md").read_text(), outputs


def _check(root: Path) -> subprocess.CompletedProcess:
    """``seed --check`` of the step's plan in the step's cache: is it warm by the local gate."""
    return tt_cache("seed", "--plan", str(root / "workspace" / ".github" / "warm-cache-plan.yaml"), "--check",
                    env=cli_env(root / "cache"))


def _store_row(summary: str) -> re.Match:
    (row,) = [match for line in summary.splitlines()
              if (match := re.fullmatch(r"\| `(.+?)` \| (\w+) \| (.+) \| (.+) \|", line)) and match[2] in ("hit", "miss")]
    return row


def test_the_first_seed_builds_and_pushes_the_second_pulls_and_builds_nothing(tiny_llama, seaweed, s3_url, tmp_path):
    run, report, summary, outputs = _seed(tiny_llama, tmp_path / "first", seaweed, s3_url)
    (case,) = report["cases"]
    assert (case["outcome"], case["store"], case["bytes_pulled"]) == ("seeded", "miss", 0), case
    assert case["bytes_pushed"] > 0 and case["weights_written"] > 0
    assert report["statistics"]["built"] == 1 and report["statistics"]["bytes_pushed"] == case["bytes_pushed"]
    assert (outputs["built"], outputs["pulled"], outputs["bytes-pushed"]) == ("1", "0", str(case["bytes_pushed"]))
    assert PUSH_FAILED not in run.stderr
    pushed = case["bytes_pushed"]
    assert "Shared store: 0 hit(s), 1 miss(es); 0 B pulled" in summary, summary
    assert _store_row(summary)[2] == "miss" and _store_row(summary)[3] == "0 B", summary

    run, report, summary, outputs = _seed(tiny_llama, tmp_path / "second", seaweed, s3_url)
    (case,) = report["cases"]
    assert (case["outcome"], case["store"], case["bytes_pushed"], case["weights_written"]) == ("pulled", "hit", 0, 0)
    assert case["bytes_pulled"] == pushed  # every object, once
    stats = report["statistics"]
    assert (stats["built"], stats["pulled"], stats["bytes_pulled"]) == (0, 1, pushed), stats
    assert (outputs["built"], outputs["pulled"], outputs["bytes-pulled"]) == ("0", "1", str(pushed))
    assert "Shared store: 1 hit(s), 0 miss(es)" in summary and "| pulled |" in summary, summary
    assert _store_row(summary)[2] == "hit" and _store_row(summary)[4] == "0 B", summary
    check = _check(tmp_path / "second")
    assert check.returncode == 0, check.stderr[-2000:]  # what was pulled is warm by the local gate


def test_a_push_to_a_bucket_that_does_not_exist_warns_once_and_the_build_stays_warm(tiny_llama, seaweed, tmp_path):
    run, report, summary, _ = _seed(tiny_llama, tmp_path / "seed", seaweed, "s3://no-such-bucket/ci")
    (case,) = report["cases"]
    assert case["outcome"] == "seeded" and case["ok"] and case["bytes_pushed"] == 0, case
    assert case["reason"].startswith("built and warm here, but the push to the shared store failed: "), case
    assert "no-such-bucket" in case["reason"]
    assert len([line for line in run.stderr.splitlines() if PUSH_FAILED in line]) == 1, run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    check = _check(tmp_path / "seed")
    assert check.returncode == 0, check.stderr[-2000:]


def _load(checkpoint: Path, root: Path):
    from models.registry import loader_class

    return loader_class("llama")(checkpoint, precision="bfloat16", cache_root=root).load()


def test_a_cold_load_with_the_store_stopped_warns_once_and_is_warm_here(tiny_llama, seaweed, s3_url, tmp_path,
                                                                         monkeypatch):
    """The store's server is not there (a dead port): the pull, then the push, each fail with one warning."""
    (dead_port,) = free_ports(1)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{dead_port}")
    monkeypatch.setenv("TT_CACHE_REMOTE", s3_url)
    monkeypatch.setenv("TT_CACHE_REMOTE_PUSH", "1")
    warnings: list[str] = []
    sink = logger.add(lambda message: warnings.append(str(message)), level="WARNING", format="{message}")
    try:
        with recording() as ledger:
            loaded = _load(tiny_llama, tmp_path / "cache")
    finally:
        logger.remove(sink)
    assert not loaded.warm and loaded.cached
    assert len([line for line in warnings if PUSH_FAILED in line]) == 1, warnings
    assert ledger.store == "unavailable" and ledger.pushes == 0 and len(ledger.push_errors) == 1
    again = _load(tiny_llama, tmp_path / "cache")
    assert again.warm


def test_a_cold_load_pushes_what_it_built_only_when_asked(tiny_llama, seaweed, s3_url, tmp_path, monkeypatch):
    monkeypatch.setenv("TT_CACHE_REMOTE", s3_url)
    with recording() as ledger:
        assert not _load(tiny_llama, tmp_path / "off").warm
    assert (ledger.store, ledger.pushes, ledger.bytes_pushed) == ("miss", 0, 0)
    store = open_store(s3_url)
    assert not store.list_sizes("")
    monkeypatch.setenv("TT_CACHE_REMOTE_PUSH", "1")
    with recording() as ledger:
        loaded = _load(tiny_llama, tmp_path / "on")
    assert not loaded.warm and ledger.pushes == 1 and ledger.bytes_pushed > 0
    ((_, marker, _),) = iter_markers(loaded.cache_dir)
    (variant_key,) = {key.split("/")[1] for key in store.list_sizes("variants/")}
    assert trusted_manifest(store, variant_key)[1].marker.content_id == marker.content_id


@pytest.mark.slow
def test_a_ray_seed_pushes_what_it_built_and_the_next_pulls(tiny_llama, seaweed, s3_url, tmp_path):
    """``--workers 2``: the variant is built by Ray tasks, committed by the driver, pushed; a Ray seed
    into a fresh root then pulls it and builds nothing."""
    plan = tmp_path / "plan.yaml"
    plan.write_text(json.dumps({"models": [{"model": str(tiny_llama), "meshes": ["N150"], "precisions": ["bfloat16"]}]}))
    cases = []
    for root in ("first", "second"):
        env = seaweed.client_env(cli_env(tmp_path / root), TT_CACHE_REMOTE=s3_url, TT_CACHE_REMOTE_PUSH="1")
        run = tt_cache("seed", "--plan", str(plan), "--workers", "2", "--json", env=env, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        (case,) = json.loads(run.stdout)["cases"]
        cases.append((case["outcome"], case["store"], case["bytes_pulled"] > 0, case["bytes_pushed"] > 0))
    assert cases == [("seeded", "miss", False, True), ("pulled", "hit", True, False)]
