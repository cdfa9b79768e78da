# SPDX-License-Identifier: Apache-2.0
"""A seed or check run as GitHub Actions sees it: a Markdown job summary and step outputs.

When the runner sets ``$GITHUB_STEP_SUMMARY``, the run appends its statistics there (variants
warm / cold / built / failed / skipped (not run: the run was interrupted), the plan's cache size,
bytes written, seconds, and the seconds warm hits saved: the cold build time each variant's marker
recorded, less the time its check took) and one row per variant. When it sets ``$GITHUB_OUTPUT``,
the run appends step outputs a later step can test, after ``actions/cache``: ``cache-hit``
(``true`` when every variant of the plan was warm), ``variants``, ``warm``, ``cold``, ``built``,
``failed``, ``skipped``, ``pulled``, ``bytes-pulled``, ``bytes-pushed``. A seed that asked the shared
store (``$TT_CACHE_REMOTE``) adds a table of it: per variant hit (pulled warm) or miss (built),
bytes pulled and pushed. Outside Actions nothing is written. With ``--history FILE`` the summary
ends with the trend over the last runs (:mod:`models.seeding.history`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from models.common import envs
from models.common.units import format_bytes
from models.seeding.history import RunRecord, trend_markdown
from models.common.weight_cache.remote.after_build import HIT
from models.seeding.report import WARM, CaseResult, SeedReport

SUMMARY_HEADER = ("| variants | warm | cold | built | failed | skipped | cache size | bytes written | seconds saved |\n"
                  "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
MODELS_HEADER = ("| model | variants | warm | cache size |\n"
                 "| --- | ---: | ---: | ---: |")
CASES_HEADER = ("| variant | outcome | seconds | cold build seconds | size | reason |\n"
                "| --- | --- | ---: | ---: | ---: | --- |")
STORE_HEADER = ("| variant | store | pulled | pushed |\n"
                "| --- | --- | ---: | ---: |")


def _cell(text: str) -> str:
    """Text safe inside one Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def verdict(report: SeedReport) -> str:
    stats = report.statistics()
    if report.error is not None:
        return f"error ({report.error_type})"
    if stats.cache_hit:
        return "cache hit"
    return "ok" if report.ok else "FAILED"


def model_rows(report: SeedReport) -> list[str]:
    """One row per model of the plan, in plan order: its variants, how many were warm, and their
    size on disk (the file sizes their markers recorded; the rows add up to the cache size)."""
    models: dict[str, list[CaseResult]] = {}
    for case in report.cases:
        models.setdefault(case.combination.model, []).append(case)
    return [f"| `{_cell(model)}` | {len(cases)} | {sum(case.outcome == WARM for case in cases)} | "
            f"{format_bytes(sum(case.cache_bytes for case in cases))} |" for model, cases in models.items()]


def step_summary(report: SeedReport, history: Sequence[RunRecord] = ()) -> str:
    """The Markdown appended to ``$GITHUB_STEP_SUMMARY`` (ends with a blank line); with the runs of
    a ``--history`` file (this one last), their trend too."""
    stats = report.statistics()
    lines = [f"### {report.command}: {verdict(report)}", "",
             f"Plan `{report.plan}`: {stats.variants} variant(s) in {report.seconds:.2f} s.", ""]
    if report.error is not None:
        lines += [f"> **{report.error_type}**: {_cell(report.error)}", ""]
    lines += [SUMMARY_HEADER,
              f"| {stats.variants} | {stats.warm} | {stats.cold} | {stats.built} | {stats.failed} | {stats.skipped} | "
              f"{format_bytes(stats.cache_bytes)} | {format_bytes(stats.bytes_written)} | {stats.seconds_saved:.2f} |", ""]
    if report.cases:
        lines += [MODELS_HEADER, *model_rows(report), ""]
        lines.append(CASES_HEADER)
        for case in report.cases:
            name = f"`{case.combination.case_name}`"
            if case.merged:
                name += " (also " + ", ".join(f"`{c.where}`" for c in case.merged) + ")"
            built = "-" if case.build_seconds is None else f"{case.build_seconds:.3f}"
            size = format_bytes(case.cache_bytes) if case.cache_bytes else "-"
            lines.append(f"| {_cell(name)} | {case.outcome} | {case.seconds:.3f} | {built} | {size} | "
                         f"{_cell(case.reason)} |")
        lines.append("")
    lines += store_rows(report)
    lines += trend_markdown(history)
    return "\n".join(lines) + "\n"


def store_rows(report: SeedReport) -> list[str]:
    """The shared store's part of the run (when a seed asked it): the totals, then per variant
    whether it came warm from the store (``hit``) or was built (``miss``) and the bytes each way."""
    asked = [case for case in report.cases if case.store]
    if not asked:
        return []
    stats = report.statistics()
    hits = sum(case.store == HIT for case in asked)
    lines = [f"Shared store: {hits} hit(s), {len(asked) - hits} miss(es); {format_bytes(stats.bytes_pulled)} pulled, "
             f"{format_bytes(stats.bytes_pushed)} pushed.", "", STORE_HEADER]
    lines += [f"| `{_cell(case.combination.case_name)}` | {case.store} | {format_bytes(case.bytes_pulled)} | "
              f"{format_bytes(case.bytes_pushed)} |" for case in asked]
    return lines + [""]


def step_outputs(report: SeedReport) -> str:
    """The ``name=value`` lines appended to ``$GITHUB_OUTPUT``."""
    stats = report.statistics()
    hit = stats.cache_hit and report.error is None
    values = {"cache-hit": "true" if hit else "false", "variants": stats.variants, "warm": stats.warm,
              "cold": stats.cold, "built": stats.built, "failed": stats.failed, "skipped": stats.skipped,
              "pulled": stats.pulled, "bytes-pulled": stats.bytes_pulled, "bytes-pushed": stats.bytes_pushed}
    return "".join(f"{name}={value}\n" for name, value in values.items())


def append_github_files(report: SeedReport, history: Sequence[RunRecord] = ()) -> list[Path]:
    """Append the summary (with the trend of ``history``) and the outputs to the files GitHub
    Actions named (if it named them); returns the files written. ``OSError`` when one cannot be written."""
    written = []
    for path, text in ((envs.GITHUB_STEP_SUMMARY, step_summary(report, history)),
                       (envs.GITHUB_OUTPUT, step_outputs(report))):
        if path:
            with open(path, "a", encoding="utf-8") as stream:
                stream.write(text)
            written.append(Path(path))
    return written
