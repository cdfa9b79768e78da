# SPDX-License-Identifier: Apache-2.0
"""What ``tt-cache seed`` leaves for a CI job, with real seeds of tiny checkpoints: reports for every
exit (a bad plan, a cancelled run), one case per cache variant whatever the spelling, no ttnn
banner in the log, and the statistics GitHub Actions shows (job summary, step outputs)."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from models.testing.tiny_models import as_hub_snapshot, make_checkpoint
from models.testing.tt_cache import cli_env, error_line, json_out, tt_cache

BANNER = "Initial ttnn.CONFIG"


def _env(cache: Path, **extra: str) -> dict[str, str]:
    """A CI step's environment: no LOGURU_LEVEL of the test process (conftest's own import of
    ``models`` set it), so the commands decide the log level themselves."""
    env = cli_env(cache, **extra)
    env.pop("LOGURU_LEVEL", None)
    return env


def _suite(path: Path) -> ET.Element:
    return ET.parse(path).getroot().find("testsuite")


def _markers(cache: Path) -> dict[str, dict]:
    return {str(path.parent): json.loads(path.read_text()) for path in cache.rglob(".weights_complete.*")}


@pytest.fixture(scope="module")
def seeded(tmp_path_factory) -> dict:
    """One tiny llama named three ways (an HF id served from a hub cache, its local dir with the
    family and components written out, a mesh spelled as rows,cols): two variants, seeded once,
    inside a GitHub Actions-like environment."""
    root = tmp_path_factory.mktemp("reports")
    llama = make_checkpoint("llama", root / "tiny-llama")
    hub = root / "hub"
    as_hub_snapshot(llama, hub, "tiny-org/tiny-llama")
    plan = root / "plan.yaml"
    plan.write_text(json.dumps({"models": [
        {"model": "tiny-org/tiny-llama", "meshes": ["N150", "N300"], "precisions": ["bfloat16"]},
        {"model": str(llama), "family": "llama", "meshes": ["1x1"], "precisions": ["bfloat16"], "components": ["text"]},
        {"model": str(llama), "meshes": ["1,2"], "precisions": ["bfloat16"]},
    ]}))
    files = {"summary": root / "seed-summary.md", "output": root / "seed-output"}
    env = _env(root / "cache", HF_HUB_CACHE=str(hub))
    seed = tt_cache("seed", "--plan", str(plan), "--report", str(root / "seed.json"), "--junit", str(root / "seed.xml"),
                    env={**env, "GITHUB_STEP_SUMMARY": str(files["summary"]), "GITHUB_OUTPUT": str(files["output"])})
    assert seed.returncode == 0, seed.stderr[-3000:]
    return {"root": root, "llama": llama, "plan": plan, "env": env, "seed": seed, "files": files}


# -- one case per variant ---------------------------------------------------------------------------


def test_spellings_of_one_variant_are_one_case_naming_the_entries_merged(seeded):
    root, llama = seeded["root"], seeded["llama"]
    cases = _suite(root / "seed.xml").findall("testcase")
    assert [(case.get("classname"), case.get("name")) for case in cases] == [
        ("tiny-org/tiny-llama", "N150 bfloat16"), ("tiny-org/tiny-llama", "N300 bfloat16")]
    report = json.loads((root / "seed.json").read_text())
    assert report["counts"] == {"seeded": 2}
    merged = {case["mesh"]: case["merged"] for case in report["cases"]}
    assert merged == {
        "N150": [{"entry": "models[1]", "case": f"{llama} [1x1 bfloat16 text]"}],
        "N300": [{"entry": "models[2]", "case": f"{llama} [1,2 bfloat16]"}],
    }
    log = seeded["seed"].stderr
    assert f"models[1] {llama} [1x1 bfloat16 text]: the same variant as models[0] tiny-org/tiny-llama [N150 bfloat16]; " \
           "merged into one case" in log
    assert f"models[2] {llama} [1,2 bfloat16]: the same variant as models[0] tiny-org/tiny-llama [N300 bfloat16]" in log
    assert len(_markers(root / "cache")) == 2  # two variants built, no more


def test_literal_duplicates_stay_an_error(tmp_path):
    plan = tmp_path / "plan.yaml"
    plan.write_text("models:\n  - {model: a, meshes: [N150], precisions: [bfloat16]}\n"
                    "  - {model: a, meshes: [N150, N300], precisions: [bfloat16]}\n")
    out = tt_cache("seed", "--plan", str(plan), "--check", env=cli_env(tmp_path / "cache"))
    assert out.returncode == 2
    assert "a [N150 bfloat16] is listed twice (models[0] and models[1])" in error_line(out, "seed")


# -- no ttnn banner -------------------------------------------------------------------------------


def test_no_ttnn_config_banner_in_seed_or_build_logs(seeded, tmp_path):
    """The seed above built two variants in worker processes, each importing ttnn: its DEBUG CONFIG
    dump must be in no log. LOGURU_LEVEL=DEBUG (the user's choice) shows it: the check can see it."""
    seed = seeded["seed"]
    assert BANNER not in seed.stdout + seed.stderr and "| DEBUG " not in seed.stderr
    cache = tmp_path / "cache"
    quiet = tt_cache("build", str(seeded["llama"]), "--precision", "bfloat16", env=_env(cache))
    assert quiet.returncode == 0 and BANNER not in quiet.stdout + quiet.stderr, quiet.stderr[-2000:]
    loud = tt_cache("build", str(seeded["llama"]), "--precision", "bfloat16", "--force",
                    env={**_env(cache), "LOGURU_LEVEL": "DEBUG"})
    assert loud.returncode == 0 and BANNER in loud.stderr, loud.stderr[-2000:]


# -- GitHub Actions: job summary and step outputs --------------------------------------------------

FLOAT = r"(\d+\.\d+)"


def _summary_lines(text: str, command: str, verdict: str, plan: Path, cases: int,
                   models: int = 1) -> list[re.Match]:
    """Check the summary's fixed lines; return the matches of the totals row, each model row and
    each case row."""
    lines = text.split("\n")
    assert lines[:4] == [f"### {command}: {verdict}", "", lines[2], ""], text
    assert re.fullmatch(rf"Plan `{re.escape(str(plan))}`: {cases} variant\(s\) in {FLOAT} s\.", lines[2]), lines[2]
    assert lines[4:6] == ["| variants | warm | cold | built | failed | skipped | cache size | bytes written | "
                          "seconds saved |",
                          "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"], text
    totals = re.fullmatch(rf"\| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (.+) \| (.+) \| {FLOAT} \|",
                          lines[6])
    assert totals and lines[7] == "", text
    assert lines[8:10] == ["| model | variants | warm | cache size |", "| --- | ---: | ---: | ---: |"], text
    per_model = [re.fullmatch(r"\| `(.+?)` \| (\d+) \| (\d+) \| (.+) \|", line) for line in lines[10:10 + models]]
    assert all(per_model) and lines[10 + models] == "", text
    at = 11 + models
    assert lines[at:at + 2] == ["| variant | outcome | seconds | cold build seconds | size | reason |",
                                "| --- | --- | ---: | ---: | ---: | --- |"], text
    rows = [re.fullmatch(rf"\| `(.+?)`(?: \(also (.+)\))? \| (\w+) \| {FLOAT} \| (-|{FLOAT}) \| (.+) \| (.*) \|", line)
            for line in lines[at + 2:at + 2 + cases]]
    assert all(rows) and lines[at + 2 + cases:] == ["", ""], text
    return [totals, *per_model, *rows]


def _size(nbytes: int) -> str:
    return f"{nbytes} B" if nbytes < 1024 else f"{nbytes / 1024:.1f} KiB" if nbytes < 1 << 20 else \
        f"{nbytes / (1 << 20):.1f} MiB"


def test_seed_writes_the_job_summary_and_step_outputs(seeded):
    files, report = seeded["files"], json.loads((seeded["root"] / "seed.json").read_text())
    assert files["output"].read_text() == "cache-hit=false\nvariants=2\nwarm=0\ncold=0\nbuilt=2\nfailed=0\nskipped=0\npulled=0\nbytes-pulled=0\nbytes-pushed=0\n"
    totals, model, *rows = _summary_lines(files["summary"].read_text(), "tt-cache seed", "ok", seeded["plan"], 2)
    written = sum(case["bytes_written"] for case in report["cases"])
    markers = _markers(seeded["root"] / "cache")
    size = sum(record["bytes"] for marker in markers.values() for record in marker["files"] + [marker["host_sidecar"]]
               if record)
    on_disk = sum(path.stat().st_size for marker in markers for path in Path(marker).rglob("*")
                  if path.is_file() and not path.name.startswith("."))
    assert size == on_disk  # what the markers recorded is what is on disk
    assert totals.groups() == ("2", "0", "0", "2", "0", "0", _size(size), _size(written), "0.00")
    assert model.groups() == ("tiny-org/tiny-llama", "2", "0", _size(size))  # the one model: all of the cache
    for row, case in zip(rows, report["cases"]):
        assert row.group(1) == case["case"] and row.group(2) == f"`{case['merged'][0]['entry']} {case['merged'][0]['case']}`"
        assert row.group(3) == "seeded" and row.group(5) == f"{markers[case['cache_dir']]['build_seconds']:.3f}"


def test_check_of_a_warm_plan_is_a_cache_hit_and_says_what_it_saved(seeded, tmp_path):
    summary, output, report_file = tmp_path / "summary.md", tmp_path / "output", tmp_path / "check.json"
    summary.write_text("# earlier step\n")  # GitHub's files are appended to, never replaced
    env = {**seeded["env"], "GITHUB_STEP_SUMMARY": str(summary), "GITHUB_OUTPUT": str(output)}
    check = tt_cache("seed", "--plan", str(seeded["plan"]), "--check", "--report", str(report_file), env=env)
    assert check.returncode == 0, check.stderr[-2000:]
    assert output.read_text() == "cache-hit=true\nvariants=2\nwarm=2\ncold=0\nbuilt=0\nfailed=0\nskipped=0\npulled=0\nbytes-pulled=0\nbytes-pushed=0\n"
    text = summary.read_text()
    assert text.startswith("# earlier step\n")
    totals, model, *rows = _summary_lines(text.removeprefix("# earlier step\n"), "tt-cache check", "cache hit",
                                          seeded["plan"], 2)
    report, markers = json.loads(report_file.read_text()), _markers(seeded["root"] / "cache")
    saved = 0.0
    for row, case in zip(rows, report["cases"]):
        build = markers[case["cache_dir"]]["build_seconds"]
        assert case["outcome"] == "warm" and case["build_seconds"] == build > 0
        assert case["seconds_saved"] == pytest.approx(max(0.0, build - case["seconds"]), abs=2e-3)
        assert row.group(3) == "warm" and row.group(5) == f"{build:.3f}"
        assert float(row.group(4)) == pytest.approx(case["seconds"], abs=1e-3)
        saved += case["seconds_saved"]
    assert totals.groups()[:6] == ("2", "2", "0", "0", "0", "0") and totals.group(8) == "0 B"
    assert float(totals.group(9)) == pytest.approx(saved, abs=0.011) and report["statistics"]["cache_hit"]
    assert model.groups() == ("tiny-org/tiny-llama", "2", "2", totals.group(7))

    cold_plan = tmp_path / "plan.yaml"  # one more precision, never seeded: a miss
    cold_plan.write_text(json.dumps({"models": [{"model": "tiny-org/tiny-llama", "meshes": ["N150"],
                                                 "precisions": ["bfloat16", "bfloat8_b"]}]}))
    output.unlink()
    miss = tt_cache("seed", "--plan", str(cold_plan), "--check", env=env)
    assert miss.returncode == 1
    assert output.read_text() == "cache-hit=false\nvariants=2\nwarm=1\ncold=1\nbuilt=0\nfailed=0\nskipped=0\npulled=0\nbytes-pulled=0\nbytes-pushed=0\n"
    text = summary.read_text()
    assert text.count("### tt-cache check: ") == 2  # appended after the first check's summary
    totals, model, warm, cold = _summary_lines(text[text.rindex("### "):], "tt-cache check", "FAILED", cold_plan, 2)
    assert totals.groups()[:6] == ("2", "1", "1", "0", "0", "0")
    assert model.groups() == ("tiny-org/tiny-llama", "2", "1", totals.group(7))  # the cold variant has no size
    assert (warm.group(3), cold.group(3), cold.group(5), cold.group(7)) == ("warm", "cold", "-", "-")
    assert json_out(tt_cache("seed", "--plan", str(cold_plan), "--check", "--json", env=seeded["env"]))[
        "cases"][1]["reason"] == cold.group(8).replace("\\|", "|")


# -- every exit writes the reports -----------------------------------------------------------------

BAD_PLANS = {
    "unreadable": (None, "cannot read the plan"),
    "bad YAML": ("models: [\n", "not valid YAML"),
    "bad JSON": ('{"models": [{"model": "a", "meshes": ["N150"],}', "not valid YAML"),
    "unknown family": ("models:\n  - {model: a, family: gpt9, meshes: [N150], precisions: [bfloat16]}\n",
                       "unknown family 'gpt9'"),
    "bad mesh": ("models:\n  - {model: a, meshes: [N3000], precisions: [bfloat16]}\n", "unknown mesh 'N3000'"),
    "duplicate": ("models:\n  - {model: a, meshes: [N150, N150], precisions: [bfloat16]}\n", "listed twice"),
}


@pytest.mark.parametrize("kind", list(BAD_PLANS))
def test_a_bad_plan_still_writes_every_report_asked_for(tmp_path, kind):
    text, problem = BAD_PLANS[kind]
    plan = tmp_path / "plan.yaml"
    if text is not None:
        plan.write_text(text)
    reports = tmp_path / "reports"
    env = {**cli_env(tmp_path / "cache"), "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"),
           "GITHUB_OUTPUT": str(tmp_path / "output")}
    out = tt_cache("seed", "--plan", str(plan), "--check", "--json", "--report", str(reports / "check.json"),
                   "--junit", str(reports / "check.xml"), env=env)
    assert out.returncode == 2
    line = error_line(out, "seed")
    assert str(plan) in line and problem in line, line

    suite = _suite(reports / "check.xml")
    (case,) = suite.findall("testcase")
    assert (suite.get("tests"), suite.get("errors"), suite.get("failures")) == ("1", "1", "0")
    assert (case.get("classname"), case.get("name")) == ("tt-cache check", f"plan {plan}")
    error = case.find("error")
    assert error.get("type") == "bad_input" and problem in error.get("message") and str(plan) in error.get("message")

    report = json.loads((reports / "check.json").read_text())
    assert report["schema_version"] == 1 and report["cases"] == [] and not report["ok"]
    assert report["error_type"] == "bad_input" and problem in report["error"]
    printed = json_out(out)
    assert printed["exit_code"] == 2 and printed["error"] == line.removeprefix("tt-cache seed: ")
    assert printed["schema_version"] == 1 and printed["error_type"] == "bad_input"

    assert (tmp_path / "output").read_text() == "cache-hit=false\nvariants=0\nwarm=0\ncold=0\nbuilt=0\nfailed=0\nskipped=0\npulled=0\nbytes-pulled=0\nbytes-pushed=0\n"
    summary = (tmp_path / "summary.md").read_text()
    assert summary.startswith("### tt-cache check: error (bad_input)\n") and f"> **bad_input**: {plan}" in summary
    assert not (tmp_path / "cache").exists()
