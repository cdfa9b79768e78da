# SPDX-License-Identifier: Apache-2.0
"""``tt-cache seed --history FILE``: each run appends one JSON line; the job summary shows the trend
of the last runs; a corrupt or partial line is skipped with a warning and never costs a run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from models.seeding.history import SCHEMA_VERSION, TREND_RUNS, RunRecord, append_record, read_records, sparkline
from models.testing.tt_cache import cli_env, error_line, tt_cache


@pytest.fixture(scope="module")
def half_warm(tmp_path_factory, tiny_checkpoints) -> dict:
    """A plan of two variants of a tiny llama, one of them seeded: a check is a 50% hit."""
    from models.registry import loader_class

    root = tmp_path_factory.mktemp("history")
    llama = tiny_checkpoints["llama"]
    loader_class("llama")(llama, cache_root=root / "cache", precision="bfloat16").seed()
    plan = root / "plan.yaml"
    plan.write_text(json.dumps({"models": [{"model": str(llama), "meshes": ["N150", "N300"],
                                            "precisions": ["bfloat16"]}]}))
    return {"root": root, "plan": plan, "env": cli_env(root / "cache")}


def _check(half_warm: dict, history: Path, summary: Path, *extra: str):
    env = {**half_warm["env"], "GITHUB_STEP_SUMMARY": str(summary)}
    return tt_cache("seed", "--plan", str(half_warm["plan"]), "--check", "--history", str(history), *extra, env=env)


def _trend(summary: str) -> tuple[list[list[str]], str]:
    """The last summary's trend rows (cells) and its sparkline line."""
    text = summary[summary.rindex("#### Trend over the last "):]
    lines = text.split("\n")
    assert lines[2:4] == ["| run (UTC) | command | variants | hit rate | bytes written | seconds saved | outcomes |",
                          "| --- | --- | ---: | ---: | ---: | ---: | --- |"], text
    rows = []
    for line in lines[4:]:
        if not line.startswith("| "):
            break
        rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return rows, lines[4 + len(rows) + 1]


def test_each_run_appends_one_record_and_the_summary_shows_the_trend(half_warm, tmp_path):
    history, summary = tmp_path / "ci" / "history.jsonl", tmp_path / "summary.md"
    for run in range(2):
        out = _check(half_warm, history, summary)
        assert out.returncode == 1, out.stderr[-3000:]  # one variant cold
        assert "WARNING" not in out.stderr, out.stderr[-3000:]
    lines = history.read_text().splitlines()
    assert len(lines) == 2
    records = [json.loads(line) for line in lines]
    for record in records:
        assert record["schema_version"] == SCHEMA_VERSION and record["command"] == "tt-cache check"
        assert record["variants"] == 2 and record["hit_rate"] == 0.5 and record["outcomes"] == {"cold": 1, "warm": 1}
        assert record["bytes_written"] == 0 and record["seconds_saved"] >= 0 and record["error_type"] is None
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", record["time"])
    text = summary.read_text()
    assert text.count("#### Trend over the last ") == 2 and "#### Trend over the last 2 run(s)" in text
    rows, spark = _trend(text)
    assert [row[:4] for row in rows] == [[records[i]["time"], "tt-cache check", "2", "50%"] for i in range(2)]
    assert all(row[6] == "1 cold, 1 warm" for row in rows)
    assert spark.startswith("hit rate `▅▅` (0-100%) · bytes written `▁▁` · seconds saved `")


def test_the_trend_shows_the_last_runs_only(half_warm, tmp_path):
    history, summary = tmp_path / "history.jsonl", tmp_path / "summary.md"
    for index in range(TREND_RUNS + 2):  # earlier runs: a cold start, then ever more warm
        append_record(history, RunRecord(f"2026-01-{index + 1:02d}T00:00:00Z", "tt-cache seed", "plan.yaml", 4,
                                         index / (TREND_RUNS + 1), (TREND_RUNS + 1 - index) << 20, float(index),
                                         10.0, {"seeded": 1, "warm": 3}))
    out = _check(half_warm, history, summary)
    assert out.returncode == 1, out.stderr[-3000:]
    assert len(read_records(history)) == TREND_RUNS + 3
    rows, spark = _trend(summary.read_text())
    assert f"#### Trend over the last {TREND_RUNS} run(s)" in summary.read_text()
    assert [row[0] for row in rows[:-1]] == [f"2026-01-{day:02d}T00:00:00Z" for day in range(4, TREND_RUNS + 3)]
    assert rows[-1][1:4] == ["tt-cache check", "2", "50%"]  # this run, last
    hit_rate = re.search(r"hit rate `(.+?)`", spark).group(1)
    assert len(hit_rate) == TREND_RUNS and hit_rate[-2] == "█" and hit_rate[-1] == "▅"


def test_corrupt_and_partial_lines_are_skipped_with_a_warning(half_warm, tmp_path):
    history, summary = tmp_path / "history.jsonl", tmp_path / "summary.md"
    assert _check(half_warm, history, summary).returncode == 1
    good = history.read_bytes()
    history.write_bytes(good + b"not json at all\n" + b'{"schema_version": 1, "time": 5}\n' + b"\xff\xfe\n"
                        + b'{"schema_version": 99}\n' + good + b'{"schema_version": 1, "time": "2026-')  # no newline
    out = _check(half_warm, history, summary)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    warnings = [line for line in out.stderr.splitlines() if "WARNING" in line]
    assert [re.search(rf"{re.escape(str(history))}:(\d+): not a history record", line).group(1)
            for line in warnings] == ["2", "3", "4", "5", "7"], out.stderr[-3000:]
    assert "(not UTF-8)" in warnings[2] and "schema_version 99" in warnings[3] and "'time' missing" in warnings[1]
    lines = history.read_bytes().split(b"\n")
    assert lines[6] == b'{"schema_version": 1, "time": "2026-' and json.loads(lines[7])["variants"] == 2
    assert len(read_records(history)) == 3  # the first run, its copy and this run; the partial line cost only itself
    rows, _ = _trend(summary.read_text())
    assert len(rows) == 3


def test_a_history_that_cannot_be_written_is_one_error_line_and_the_other_reports_are_written(half_warm, tmp_path):
    history, summary, junit = tmp_path / "history.jsonl", tmp_path / "summary.md", tmp_path / "check.xml"
    history.mkdir()  # a directory where the file should be
    out = _check(half_warm, history, summary, "--junit", str(junit))
    assert out.returncode == 2
    assert f"{history}: cannot append to the history" in error_line(out, "seed")
    assert junit.exists() and summary.read_text().startswith("### tt-cache check: FAILED")
    assert "#### Trend" not in summary.read_text()


def test_sparkline_scales_between_its_bounds():
    assert sparkline([0.0, 0.5, 1.0], 0.0, 1.0) == "▁▅█"
    assert sparkline([3, 3, 3]) == "▁▁▁"  # no range: the lowest block
    assert sparkline([None, 2.0, 7.0], 0) == " ▃█"
    assert sparkline([-1.0, 2.0], 0.0, 1.0) == "▁█"  # clamped to the bounds
    assert sparkline([None]) == " "


def test_a_bad_plan_is_a_run_of_the_history_too(tmp_path):
    history, summary, plan = tmp_path / "history.jsonl", tmp_path / "summary.md", tmp_path / "plan.yaml"
    plan.write_text("models: [\n")
    env = {**cli_env(tmp_path / "cache"), "GITHUB_STEP_SUMMARY": str(summary)}
    out = tt_cache("seed", "--plan", str(plan), "--check", "--history", str(history), env=env)
    assert out.returncode == 2 and "not valid YAML" in error_line(out, "seed")
    (record,) = read_records(history)
    assert (record.variants, record.hit_rate, record.outcomes, record.error_type) == (0, None, {}, "bad_input")
    rows, spark = _trend(summary.read_text())
    assert [row[2:4] + row[6:] for row in rows] == [["0", "-", "- (stopped: bad_input)"]]
    assert spark.startswith("hit rate ` ` (0-100%)")
