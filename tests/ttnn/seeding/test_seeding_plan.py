# SPDX-License-Identifier: Apache-2.0
"""``tt-cache seed --plan``: a CI warm-cache job end to end, with real checkpoints, real worker
processes, a real read-only bind mount, a real truncated file and a real hung seed."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import psutil
import pytest

from models.seeding.plan import Combination, parse_plan
from models.testing.llama_shaped import make_llama_shaped
from models.testing.terminal import terminal_output
from models.testing.tiny_models import as_hub_snapshot, make_checkpoint
from models.testing.tt_cache import REPO_ROOT, cli_env, json_out, seed_workers, tt_cache


def _junit_cases(path: Path) -> dict[tuple[str, str], ET.Element]:
    suite = ET.parse(path).getroot().find("testsuite")
    return {(case.get("classname"), case.get("name")): case for case in suite.findall("testcase")}


@pytest.fixture(scope="module")
def ci(tmp_path_factory) -> dict:
    """Three models (an HF id served from a hub cache, a local dir, a missing checkpoint) seeded once."""
    root = tmp_path_factory.mktemp("plan")
    hub = root / "hub"
    as_hub_snapshot(make_checkpoint("qwen3", root / "q"), hub, "tiny-org/tiny-qwen3")
    llama = make_checkpoint("llama", root / "tiny-llama")
    present = [
        {"model": "tiny-org/tiny-qwen3", "meshes": ["N150", "N300"], "precisions": ["bfloat16"]},
        {"model": str(llama), "family": "llama", "meshes": ["N300"], "precisions": ["bfloat8_b", "bfloat16"],
         "components": ["text"]},
    ]
    missing = {"model": str(root / "gone" / "tiny-llama"), "family": "llama", "meshes": ["N150"],
               "precisions": ["bfloat16"]}
    (root / "plan.yaml").write_text(json.dumps({"models": present + [missing]}))
    (root / "plan-present.yaml").write_text(json.dumps({"models": present}))
    env = cli_env(root / "cache", HF_HUB_CACHE=str(hub))
    seed = tt_cache("seed", "--plan", str(root / "plan.yaml"), "--junit", str(root / "seed.xml"),
                    "--report", str(root / "seed.json"), env=env)
    return {"root": root, "env": env, "seed": seed, "llama": llama, "missing": missing["model"]}


def test_one_missing_checkpoint_fails_only_its_cases(ci):
    seed, root = ci["seed"], ci["root"]
    assert seed.returncode == 1, seed.stderr[-3000:]
    cases = _junit_cases(root / "seed.xml")
    assert set(cases) == {("tiny-org/tiny-qwen3", "N150 bfloat16"), ("tiny-org/tiny-qwen3", "N300 bfloat16"),
                          (str(ci["llama"]), "N300 bfloat8_b text"), (str(ci["llama"]), "N300 bfloat16 text"),
                          (ci["missing"], "N150 bfloat16")}
    failed = {key for key, case in cases.items() if case.find("failure") is not None}
    assert failed == {(ci["missing"], "N150 bfloat16")}
    assert "no checkpoint" in cases[(ci["missing"], "N150 bfloat16")].find("failure").get("message")
    report = json.loads((root / "seed.json").read_text())
    assert report["counts"] == {"seeded": 4, "failed": 1} and not report["ok"]
    assert all(case["weights_written"] > 0 for case in report["cases"] if case["outcome"] == "seeded")
    check = tt_cache("check", str(root / "cache"), "--json", env=ci["env"])
    assert check.returncode == 0 and len(json_out(check)["variants"]) == 4


def test_check_of_the_seeded_plan_passes_and_starts_no_seed(ci):
    root = ci["root"]
    start = time.monotonic()
    out = tt_cache("seed", "--plan", str(root / "plan-present.yaml"), "--check", "--junit", str(root / "check.xml"),
                   "--json", env=ci["env"])
    assert out.returncode == 0, out.stderr[-3000:]
    assert json_out(out)["counts"] == {"warm": 4}
    assert all(case.find("failure") is None for case in _junit_cases(root / "check.xml").values())
    assert "models.seeding.worker" not in out.stderr and time.monotonic() - start < 120


# ``tt-cache`` with torch and ttnn made unimportable: what a light install (no torch, no ttnn) sees
WITHOUT_TORCH = """
import sys
class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "ttnn", "transformers"):
            raise ImportError(f"{name} is not installed here")
sys.meta_path.insert(0, Absent())
from models.tt_cache.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_check_runs_without_torch_and_ttnn(ci):
    """The validate job's ``seed --check`` needs neither torch nor ttnn: the gate, the content id
    and the cache lookup are torch-free."""
    out = subprocess.run([sys.executable, "-c", WITHOUT_TORCH, "seed", "--plan", str(ci["root"] / "plan-present.yaml"),
                          "--check", "--json"], env=ci["env"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert {case["outcome"] for case in json_out(out)["cases"]} == {"warm"}


def test_check_through_a_read_only_bind_mount(ci, readonly_view):
    view = readonly_view(ci["root"] / "cache")
    env = {**ci["env"], "TT_CACHE_PATH": str(view)}
    out = tt_cache("seed", "--plan", str(ci["root"] / "plan-present.yaml"), "--check", "--json", env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert {case["outcome"] for case in json_out(out)["cases"]} == {"warm"}
    assert all(case["cache_dir"].startswith(str(view)) for case in json_out(out)["cases"])


def test_a_truncated_tensorbin_fails_check_naming_it(ci, tmp_path):
    copy = tmp_path / "cache"
    subprocess.run(["cp", "-a", str(ci["root"] / "cache"), str(copy)], check=True)
    llama_bf8 = next(copy.glob("tiny-llama--*/bfloat8_b/mesh_1x2"))
    victim = sorted(llama_bf8.rglob("*.tensorbin"))[3]
    os.truncate(victim, victim.stat().st_size // 2)
    junit = tmp_path / "check.xml"
    out = tt_cache("seed", "--plan", str(ci["root"] / "plan-present.yaml"), "--check", "--cache-root", str(copy),
                   "--junit", str(junit), env=ci["env"])
    assert out.returncode == 1
    failures = {key: case.find("failure") for key, case in _junit_cases(junit).items()
                if case.find("failure") is not None}
    assert list(failures) == [(str(ci["llama"]), "N300 bfloat8_b text")]
    message = failures[(str(ci["llama"]), "N300 bfloat8_b text")].get("message")
    assert message.startswith("cold: ") and victim.name in message and "marker says" in message


def test_stall_timeout_aborts_a_hung_seed_naming_the_last_weight(ci, tmp_path):
    """The seed's worker is stopped (SIGSTOP: a process stuck like one on a dead NFS server) after
    it wrote its first weights; the watchdog must end it and name the last weight, and the plan's
    other model must still be seeded."""
    big = make_llama_shaped(tmp_path / "llama-1layer", 1)
    plan = tmp_path / "plan.yaml"
    plan.write_text(json.dumps({"models": [
        {"model": str(big), "meshes": ["N150"], "precisions": ["bfloat8_b"]},
        {"model": str(ci["llama"]), "meshes": ["N150"], "precisions": ["bfloat16"]},
    ]}))
    env = {**cli_env(tmp_path / "cache"), "PYTHONUNBUFFERED": "1"}
    seed = subprocess.Popen([sys.executable, "-m", "models.tt_cache.cli", "seed", "--plan", str(plan), "--json",
                             "--stall-timeout", "15", "--progress-every", "0.05", "--report", str(tmp_path / "r.json")],
                            cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stopped, seen = None, []
    for line in seed.stderr:
        seen.append(line)
        if stopped is None and re.search(r"\[N150 bfloat8_b\]: [1-9]\d*/\d+ weights.*, last \S+", line):
            (worker,) = seed_workers(seed.pid)
            worker.send_signal(signal.SIGSTOP)
            stopped = time.monotonic()
    seed.wait(timeout=600)
    assert stopped is not None, "the seed finished before it could be stopped:\n" + "".join(seen[-30:])
    report = json.loads((tmp_path / "r.json").read_text())
    hung, other = report["cases"]
    assert seed.returncode == 1 and hung["outcome"] == "stalled" and other["outcome"] == "seeded"
    assert re.search(r"nothing written for \d+ s .*last weight written: \S+ \([1-9]\d*/\d+ weights\)",
                     hung["reason"]), hung["reason"]
    assert hung["weights_written"] >= 1 and hung["seconds"] < 300


def test_plan_parsing_expands_every_combination():
    plan = parse_plan("models:\n  - model: org/m\n    meshes: [N150, N300]\n    precisions: [bfloat16, bfloat8_b]\n"
                      "  - model: /d/x\n    family: llama\n    meshes: T3K\n    precisions: [bfloat16]\n"
                      "    components: [text]\n", Path("p.yaml"))
    assert len(plan.combinations) == 5
    assert plan.combinations[-1] == Combination("/d/x", "T3K", "bfloat16", "llama", ("text",))


def test_progress_is_a_bar_with_rate_and_eta_on_a_terminal_and_log_lines_elsewhere(tmp_path):
    from models.seeding.progress import ProgressTracker

    def write(tty) -> None:
        bar = ProgressTracker("tiny [N150 bfloat16]", stream=tty)
        bar.start(4, 4 << 20)
        for index in range(3):
            time.sleep(0.05)
            bar.weight_done(f"layers.{index}.wq", 1 << 20)
        bar.close()

    shown = terminal_output(write)
    assert "tiny [N150 bfloat16]" in shown and "3.00M/4.00M" in shown and "3/4 weights" in shown
    assert re.search(r"\d+(\.\d+)?[kM]?B/s", shown) and re.search(r"<\d\d:\d\d", shown), shown  # rate and ETA

    log = tmp_path / "seed.log"
    with open(log, "w") as stream:
        lines = ProgressTracker("tiny [N150 bfloat16]", stream=stream, log_every=0)
        lines.tick()  # nothing before the seed starts writing
        lines.start(4, 4 << 20)
        time.sleep(0.01)
        lines.weight_done("layers.0.wq", 1 << 20)
        lines.tick()
    (line,) = log.read_text().splitlines()
    assert re.fullmatch(r"tiny \[N150 bfloat16\]: 1/4 weights, 1\.0 of 4\.0 MiB, [\d.,]+ MiB/s, ETA \d+ s, "
                        r"last layers\.0\.wq", line), line


def test_check_after_the_checkpoint_changed_is_cold(ci, tmp_path):
    """``seed --check`` asks the loader's own gate, so changed weights are cold there, while
    ``check DIR`` still vouches for the old cache dir, which is intact for the weights it was built from."""
    checkpoint = tmp_path / "tiny-llama"
    shutil.copytree(ci["llama"], checkpoint)
    plan = tmp_path / "plan.yaml"
    plan.write_text(json.dumps({"models": [{"model": str(checkpoint), "meshes": ["N300"],
                                            "precisions": ["bfloat8_b"], "components": ["text"]}]}))
    env = {**ci["env"], "TT_CACHE_PATH": str(ci["root"] / "cache")}  # same weights: already warm there
    before = tt_cache("seed", "--plan", str(plan), "--check", "--json", env=env)
    assert before.returncode == 0, before.stderr[-2000:]
    (case,) = json_out(before)["cases"]
    weights = checkpoint / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-64:] = bytes(255 - b for b in data[-64:])  # same size, other values
    weights.write_bytes(bytes(data))
    after = tt_cache("seed", "--plan", str(plan), "--check", "--json", env=env)
    assert after.returncode == 1
    (changed,) = json_out(after)["cases"]
    assert changed["outcome"] == "cold" and changed["cache_dir"] != case["cache_dir"]
    assert tt_cache("check", case["cache_dir"], env=env).returncode == 0


def test_a_cancelled_seed_leaves_no_worker_behind_and_reports_the_interruption(tmp_path):
    """CI cancels a job with SIGTERM: the seed's worker (its own session) ends with it, exit 130, and
    the JUnit and JSON reports say so."""
    big = make_llama_shaped(tmp_path / "llama-1layer", 1)
    plan = tmp_path / "plan.yaml"
    plan.write_text(json.dumps({"models": [{"model": str(big), "meshes": ["N150"], "precisions": ["bfloat8_b"]}]}))
    seed = subprocess.Popen([sys.executable, "-m", "models.tt_cache.cli", "seed", "--plan", str(plan),
                             "--junit", str(tmp_path / "seed.xml"), "--report", str(tmp_path / "seed.json")],
                            cwd=REPO_ROOT, env=cli_env(tmp_path / "cache"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline, workers = time.monotonic() + 120, []
    while not workers and time.monotonic() < deadline and seed.poll() is None:
        workers = seed_workers(seed.pid)
        time.sleep(0.1)
    assert workers, "no seed worker started"
    seed.send_signal(signal.SIGTERM)
    _, err = seed.communicate(timeout=60)
    assert seed.returncode == 130 and "tt-cache seed: interrupted" in err and "Traceback" not in err
    gone, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive, f"worker {alive} outlived the cancelled seed"
    report = json.loads((tmp_path / "seed.json").read_text())
    assert (report["error"], report["error_type"], report["ok"]) == ("interrupted by SIGTERM", "interrupted", False)
    (case,) = ET.parse(tmp_path / "seed.xml").getroot().iter("testcase")
    assert case.find("error").get("type") == "interrupted"
