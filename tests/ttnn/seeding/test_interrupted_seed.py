# SPDX-License-Identifier: Apache-2.0
"""A cancelled CI job (a real SIGTERM or SIGINT of a real ``tt-cache seed`` mid-plan) still reports
every planned variant: the finished ones as they ended, the one running as interrupted, the rest
as skipped with the reason, in the JUnit XML, the JSON report and the GitHub job summary."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import psutil
import pytest

from models.testing.tt_cache import REPO_ROOT, cli_env, seed_workers


@pytest.fixture(scope="module")
def plan(tmp_path_factory, tiny_checkpoints) -> dict:
    """Four variants of two tiny checkpoints; the first one already warm, so it finishes at once."""
    from models.registry import loader_class

    root = tmp_path_factory.mktemp("interrupted")
    llama, qwen = tiny_checkpoints["llama"], tiny_checkpoints["qwen3"]
    loader_class("llama")(llama, cache_root=root / "cache", precision="bfloat16").seed()
    path = root / "plan.yaml"
    path.write_text(json.dumps({"models": [
        {"model": str(llama), "meshes": ["N150", "N300"], "precisions": ["bfloat16"]},
        {"model": str(qwen), "meshes": ["N150"], "precisions": ["bfloat16"]},
        {"model": str(llama), "meshes": ["N150"], "precisions": ["bfloat8_b"]},
    ]}))
    return {"root": root, "path": path, "llama": llama, "qwen": qwen}


def _has_open(pid: int, path: Path) -> bool:
    """Whether process ``pid`` holds ``path`` open (its /proc fd table)."""
    try:
        return any(Path(fd).resolve() == path for fd in Path(f"/proc/{pid}/fd").iterdir())
    except OSError:  # the process ended, or one fd closed while being read
        return False


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_an_interrupted_seed_reports_every_planned_variant(plan, tmp_path, signum):
    name, llama = signum.name, plan["llama"]
    files = {kind: tmp_path / f"seed.{kind}" for kind in ("xml", "json", "md", "out", "jsonl")}
    env = {**cli_env(plan["root"] / "cache"), "PYTHONUNBUFFERED": "1",
           "GITHUB_STEP_SUMMARY": str(files["md"]), "GITHUB_OUTPUT": str(files["out"])}
    seed = subprocess.Popen([sys.executable, "-m", "models.tt_cache.cli", "seed", "--plan", str(plan["path"]),
                             "--junit", str(files["xml"]), "--report", str(files["json"]),
                             "--history", str(files["jsonl"])],
                            cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = []
    for line in seed.stdout:  # stderr merged in, as a CI log has it
        log.append(line)
        if line.startswith(f"{llama} [N150 bfloat16]: warm"):
            break
    deadline, workers = time.monotonic() + 120, []
    while not workers and time.monotonic() < deadline and seed.poll() is None:
        workers = seed_workers(seed.pid)
        time.sleep(0.05)
    assert workers, "the second variant's seed never started:\n" + "".join(log[-30:])
    seed.send_signal(signum)
    rest, _ = seed.communicate(timeout=120)
    log = "".join(log) + rest
    assert seed.returncode == 130 and "tt-cache seed: interrupted" in log and "Traceback" not in log, log[-3000:]
    assert not psutil.wait_procs(workers, timeout=10)[1], "a seed worker outlived the interrupted seed"
    assert log.count(f"{llama} [N150 bfloat16]: warm") == 1, log[-3000:]

    suite = ET.parse(files["xml"]).getroot().find("testsuite")
    cases = suite.findall("testcase")
    assert [(case.get("classname"), case.get("name")) for case in cases] == [
        (str(llama), "N150 bfloat16"), (str(llama), "N300 bfloat16"), (str(plan["qwen"]), "N150 bfloat16"),
        (str(llama), "N150 bfloat8_b")]  # every planned variant, no other case
    assert [suite.get(key) for key in ("tests", "failures", "errors", "skipped")] == ["4", "0", "1", "2"]
    assert cases[0].find("system-out") is not None and len(cases[0]) == 1
    error = cases[1].find("error")
    assert error.get("type") == "interrupted" and error.get("message").startswith(
        f"interrupted by {name} while it ran, "), error.get("message")
    for case in cases[2:]:
        (skipped,) = case
        assert skipped.tag == "skipped" and skipped.get("message") == f"not run: tt-cache seed was interrupted by {name}"

    report = json.loads(files["json"].read_text())
    assert [case["outcome"] for case in report["cases"]] == ["warm", "interrupted", "skipped", "skipped"]
    assert (report["error"], report["error_type"]) == (f"interrupted by {name}", "interrupted")
    assert report["counts"] == {"warm": 1, "interrupted": 1, "skipped": 2}
    assert (report["statistics"]["skipped"], report["statistics"]["failed"]) == (2, 1)
    assert all(case["reason"] == f"not run: tt-cache seed was interrupted by {name}" for case in report["cases"][2:])

    summary = files["md"].read_text()
    assert summary.startswith("### tt-cache seed: error (interrupted)\n")
    assert "| 4 | 1 | 0 | 0 | 1 | 2 |" in summary and summary.count("` | skipped | ") == 2
    assert files["out"].read_text().endswith("failed=1\nskipped=2\npulled=0\nbytes-pulled=0\nbytes-pushed=0\n")
    (record,) = [json.loads(line) for line in files["jsonl"].read_text().splitlines()]  # the run's history line
    assert record["outcomes"] == {"interrupted": 1, "skipped": 2, "warm": 1} and record["hit_rate"] == 0.25
    assert record["error_type"] == "interrupted" and "#### Trend over the last 1 run(s)" in summary
    assert not list((plan["root"] / "cache").glob("tiny-llama--*/bfloat16/mesh_1x2/.weights_complete.*"))


def test_a_run_interrupted_while_opening_its_plan_reports_every_combination(plan, tmp_path):
    """The signal comes while the plan's variants are being opened (the first model's weights are a
    sparse 4 GiB file: its content id takes the run a minute of hashing): every combination of the
    plan is still a case."""
    model = tmp_path / "blocked"
    model.mkdir()
    (model / "config.json").write_bytes((plan["llama"] / "config.json").read_bytes())
    weights = model / "model.safetensors"
    with open(weights, "wb") as stream:
        stream.truncate(4 << 30)
    path = tmp_path / "plan.yaml"
    path.write_text(json.dumps({"models": [
        {"model": str(model), "meshes": ["N150", "N300"], "precisions": ["bfloat16"]},
        {"model": str(plan["llama"]), "meshes": ["N150"], "precisions": ["bfloat16"]},
    ]}))
    junit, report = tmp_path / "check.xml", tmp_path / "check.json"
    check = subprocess.Popen([sys.executable, "-m", "models.tt_cache.cli", "seed", "--plan", str(path), "--check",
                              "--junit", str(junit), "--report", str(report)],
                             cwd=REPO_ROOT, env=cli_env(plan["root"] / "cache"), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not _has_open(check.pid, weights) and time.monotonic() < deadline:
        assert check.poll() is None, check.communicate()
        time.sleep(0.05)
    assert _has_open(check.pid, weights), "the check never started hashing the weights"
    check.send_signal(signal.SIGTERM)
    _, err = check.communicate(timeout=60)
    assert check.returncode == 130 and "Traceback" not in err, err[-3000:]
    suite = ET.parse(junit).getroot().find("testsuite")
    cases = suite.findall("testcase")
    assert [(case.get("classname"), case.get("name")) for case in cases] == [
        (str(model), "N150 bfloat16"), (str(model), "N300 bfloat16"), (str(plan["llama"]), "N150 bfloat16")]
    assert [suite.get(key) for key in ("tests", "failures", "errors", "skipped")] == ["3", "0", "1", "2"]
    assert cases[0].find("error").get("message") == "interrupted by SIGTERM before it started"
    assert [case.find("skipped").get("message") for case in cases[1:]] == [
        "not run: tt-cache check was interrupted by SIGTERM"] * 2
    assert [case["outcome"] for case in json.loads(report.read_text())["cases"]] == ["interrupted", "skipped", "skipped"]
