# SPDX-License-Identifier: Apache-2.0
"""What a seed or check run found, per combination, as lines, JSON and JUnit XML for dashboards.

Every run writes the reports it was asked for, whatever ends it: a plan that cannot be used (an
unreadable file, bad YAML, an unknown mesh, a duplicate) is a report with no case and an
``error`` (JUnit: one ``error`` test case naming the problem), so a CI artifact step always has
something to upload; a cancelled run reports the cases it finished and the interruption.
"""

from __future__ import annotations

import json
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.common.fileio import atomic_write_bytes
from models.common.units import format_bytes
from models.seeding.plan import Combination

SCHEMA_VERSION = 1  # of the JSON report (``--report``, ``--json``); bumped when a key changes meaning

# outcomes: already warm (stat-only skip), built now and warm, cold under --check, or why not
# (``partial``: a ``tt-cache build --num-layers`` build, which is never marked complete)
WARM, SEEDED, PARTIAL, COLD, FAILED, STALLED = "warm", "seeded", "partial", "cold", "failed", "stalled"
PULLED = "pulled"  # cold here, made warm from the shared store ($TT_CACHE_REMOTE): nothing built
SKIPPED = "skipped"  # not run: the run was interrupted before it came to this case
OK_OUTCOMES = frozenset({WARM, SEEDED, PARTIAL, PULLED})
# why a run stopped before its plan was done (the JUnit error type, the JSON ``error_type``); an
# interrupted run's case that was running (or next) when the signal came has the outcome INTERRUPTED
BAD_INPUT, INTERRUPTED, INTERNAL_ERROR = "bad_input", "interrupted", "internal_error"


def signal_name(interrupt: KeyboardInterrupt) -> str:
    """The signal behind a ``KeyboardInterrupt`` (``tt-cache seed`` raises it with the name)."""
    return interrupt.args[0] if interrupt.args and isinstance(interrupt.args[0], str) else "SIGINT"


@dataclass(frozen=True)
class CaseResult:
    """One variant's outcome. ``merged``: other plan entries that name the same variant (one case
    for all); ``cache_bytes`` and ``build_seconds`` (the cold build's, from its marker) describe
    the variant when it is warm. ``store``: what the shared store answered the seed of a cold
    variant (``hit``: pulled, ``miss``: built, ``unavailable``: it could not be used; empty: not
    asked), with the bytes pulled from it and pushed to it."""

    combination: Combination
    outcome: str
    reason: str = ""
    seconds: float = 0.0
    cache_dir: str | None = None
    weights_written: int = 0
    bytes_written: int = 0
    merged: tuple[Combination, ...] = ()
    cache_bytes: int = 0
    build_seconds: float | None = None
    use: dict[str, Any] | None = None  # a warm hit: where and when, for the writer's gc (gc --uses)
    store: str = ""
    bytes_pulled: int = 0
    bytes_pushed: int = 0

    @property
    def ok(self) -> bool:
        return self.outcome in OK_OUTCOMES

    @property
    def seconds_saved(self) -> float:
        """A warm hit (or a variant pulled from the shared store) saves the cold build its marker
        recorded, less the time the check (or the pull) took."""
        if self.outcome not in (WARM, PULLED) or self.build_seconds is None:
            return 0.0
        return max(0.0, self.build_seconds - self.seconds)

    def summary(self) -> str:
        where = f" -> {self.cache_dir}" if self.cache_dir else ""
        why = f": {self.reason}" if self.reason else ""
        also = f" (also {', '.join(c.where for c in self.merged)})" if self.merged else ""
        store = f" [{self.store_traffic()}]" if self.store else ""
        return f"{self.combination.case_name}{also}: {self.outcome}{why}{store} ({self.seconds:.1f} s){where}"

    def store_traffic(self) -> str:
        """The shared store's part, in words: ``store hit, 1.2 MiB pulled``."""
        moved = [f"{format_bytes(n)} {what}"
                 for n, what in ((self.bytes_pulled, "pulled"), (self.bytes_pushed, "pushed")) if n]
        return ", ".join([f"store {self.store}", *moved])

    def as_json(self) -> dict[str, Any]:
        return {**self.combination.as_json(), "case": self.combination.case_name, "outcome": self.outcome,
                "ok": self.ok, "reason": self.reason, "seconds": round(self.seconds, 3), "cache_dir": self.cache_dir,
                "weights_written": self.weights_written, "bytes_written": self.bytes_written,
                "cache_bytes": self.cache_bytes, "build_seconds": self.build_seconds,
                "seconds_saved": round(self.seconds_saved, 3), "store": self.store,
                "bytes_pulled": self.bytes_pulled, "bytes_pushed": self.bytes_pushed,
                "merged": [{"entry": c.entry_name, "case": c.case_name} for c in self.merged]}


@dataclass(frozen=True)
class Statistics:
    """What a CI engineer reads off a cache run (the job summary, the step outputs)."""

    variants: int
    warm: int
    cold: int
    built: int
    failed: int
    skipped: int
    cache_bytes: int
    bytes_written: int
    seconds: float
    seconds_saved: float
    pulled: int = 0  # variants made warm from the shared store
    bytes_pulled: int = 0
    bytes_pushed: int = 0

    @property
    def cache_hit(self) -> bool:
        """Every variant of the plan was warm (``actions/cache``'s ``cache-hit``)."""
        return self.variants > 0 and self.warm == self.variants


@dataclass
class SeedReport:
    plan: str
    check_only: bool
    cases: list[CaseResult] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    seconds: float = 0.0
    error: str | None = None  # why the run stopped before its plan was done
    error_type: str | None = None  # BAD_INPUT, INTERRUPTED or INTERNAL_ERROR

    @property
    def ok(self) -> bool:
        return self.error is None and all(case.ok for case in self.cases)

    @property
    def command(self) -> str:
        return "tt-cache check" if self.check_only else "tt-cache seed"

    def stop(self, error: str, error_type: str) -> None:
        self.error, self.error_type = error, error_type
        self.seconds = self.seconds or time.time() - self.started

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for case in self.cases:
            counts[case.outcome] = counts.get(case.outcome, 0) + 1
        return counts

    def statistics(self) -> Statistics:
        counts = self.counts()
        return Statistics(
            variants=len(self.cases), warm=counts.get(WARM, 0), cold=counts.get(COLD, 0),
            built=counts.get(SEEDED, 0) + counts.get(PARTIAL, 0),
            failed=counts.get(FAILED, 0) + counts.get(STALLED, 0) + counts.get(INTERRUPTED, 0),
            skipped=counts.get(SKIPPED, 0),
            cache_bytes=sum(case.cache_bytes for case in self.cases),
            bytes_written=sum(case.bytes_written for case in self.cases),
            seconds=self.seconds, seconds_saved=sum(case.seconds_saved for case in self.cases),
            pulled=counts.get(PULLED, 0), bytes_pulled=sum(case.bytes_pulled for case in self.cases),
            bytes_pushed=sum(case.bytes_pushed for case in self.cases))

    def summary_lines(self, cases: bool = True) -> list[str]:
        """Each case's line (unless ``cases`` is false: printed as they finished), then the verdict."""
        counts = ", ".join(f"{n} {outcome}" for outcome, n in sorted(self.counts().items())) or "none run"
        verdict = "ok" if self.ok else "FAILED"
        stopped = [f"stopped ({self.error_type}): {self.error}"] if self.error else []
        return [case.summary() for case in self.cases if cases] + stopped + [
            f"{verdict}: {len(self.cases)} combination(s) of {self.plan}: {counts} in {self.seconds:.1f} s"
        ]

    def as_json(self) -> dict[str, Any]:
        stats = self.statistics()
        return {"schema_version": SCHEMA_VERSION, "plan": self.plan, "check_only": self.check_only, "ok": self.ok,
                "error": self.error, "error_type": self.error_type, "counts": self.counts(),
                "statistics": {"variants": stats.variants, "warm": stats.warm, "cold": stats.cold,
                               "built": stats.built, "failed": stats.failed, "skipped": stats.skipped,
                               "cache_hit": stats.cache_hit,
                               "cache_bytes": stats.cache_bytes, "bytes_written": stats.bytes_written,
                               "seconds_saved": round(stats.seconds_saved, 3), "pulled": stats.pulled,
                               "bytes_pulled": stats.bytes_pulled, "bytes_pushed": stats.bytes_pushed},
                "started": self.started, "seconds": round(self.seconds, 3),
                "cases": [case.as_json() for case in self.cases],
                "uses": [case.use for case in self.cases if case.use is not None]}


def write_json_report(report: SeedReport, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, (json.dumps(report.as_json(), indent=2) + "\n").encode(), durable=False)


def junit_xml(report: SeedReport) -> bytes:
    """One ``testcase`` per combination (``classname`` the model), a ``failure`` with the reason.
    An interrupted run still has one per planned combination: the one running when the signal
    came has an ``error``, those after it are ``skipped`` with the reason. A run that stopped
    early otherwise adds one ``testcase`` (``classname`` the command, ``name`` the plan) with an
    ``error`` naming the problem."""
    counts = report.counts()
    skipped, case_errors = counts.get(SKIPPED, 0), counts.get(INTERRUPTED, 0)
    failures = sum(not case.ok for case in report.cases) - skipped - case_errors
    plan_error = report.error is not None and not case_errors
    errors = case_errors + plan_error
    tests = len(report.cases) + plan_error
    suites = ET.Element("testsuites", tests=str(tests), failures=str(failures), errors=str(errors),
                        skipped=str(skipped), time=f"{report.seconds:.3f}")
    suite = ET.SubElement(suites, "testsuite", name=report.command, tests=str(tests), failures=str(failures),
                          errors=str(errors), skipped=str(skipped), time=f"{report.seconds:.3f}",
                          timestamp=time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(report.started)))
    for case in report.cases:
        combination = case.combination
        name = " ".join([combination.mesh, combination.precision] + list(combination.components or ()))
        element = ET.SubElement(suite, "testcase", classname=combination.model, name=name, time=f"{case.seconds:.3f}")
        if case.outcome == SKIPPED:
            ET.SubElement(element, "skipped", message=case.reason)
        elif case.outcome == INTERRUPTED:
            ET.SubElement(element, "error", message=case.reason, type=INTERRUPTED).text = case.summary()
        elif not case.ok:
            failure = ET.SubElement(element, "failure", message=f"{case.outcome}: {case.reason}", type=case.outcome)
            failure.text = case.summary()
        else:
            ET.SubElement(element, "system-out").text = case.summary()
    if plan_error:
        element = ET.SubElement(suite, "testcase", classname=report.command, name=f"plan {report.plan}", time="0.000")
        ET.SubElement(element, "error", message=report.error, type=report.error_type or INTERNAL_ERROR).text = (
            f"{report.command} stopped ({report.error_type}) after {len(report.cases)} case(s): {report.error}")
    ET.indent(suites)
    return ET.tostring(suites, encoding="utf-8", xml_declaration=True) + b"\n"


def write_junit(report: SeedReport, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, junit_xml(report), durable=False)
