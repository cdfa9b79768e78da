# SPDX-License-Identifier: Apache-2.0
"""What a seed or check run found, per combination, as lines, JSON and JUnit XML for dashboards."""

from __future__ import annotations

import json
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.common.fileio import atomic_write_bytes
from models.seeding.plan import Combination

# outcomes: already warm (stat-only skip), built now and warm, cold under --check, or why not
# (``partial``: a ``tt-cache build --num-layers`` build, which is never marked complete)
WARM, SEEDED, PARTIAL, COLD, FAILED, STALLED = "warm", "seeded", "partial", "cold", "failed", "stalled"
OK_OUTCOMES = frozenset({WARM, SEEDED, PARTIAL})


@dataclass(frozen=True)
class CaseResult:
    combination: Combination
    outcome: str
    reason: str = ""
    seconds: float = 0.0
    cache_dir: str | None = None
    weights_written: int = 0
    bytes_written: int = 0

    @property
    def ok(self) -> bool:
        return self.outcome in OK_OUTCOMES

    def summary(self) -> str:
        where = f" -> {self.cache_dir}" if self.cache_dir else ""
        why = f": {self.reason}" if self.reason else ""
        return f"{self.combination.case_name}: {self.outcome}{why} ({self.seconds:.1f} s){where}"

    def as_json(self) -> dict[str, Any]:
        return {**self.combination.as_json(), "case": self.combination.case_name, "outcome": self.outcome,
                "ok": self.ok, "reason": self.reason, "seconds": round(self.seconds, 3), "cache_dir": self.cache_dir,
                "weights_written": self.weights_written, "bytes_written": self.bytes_written}


@dataclass
class SeedReport:
    plan: str
    check_only: bool
    cases: list[CaseResult] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(case.ok for case in self.cases)

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for case in self.cases:
            counts[case.outcome] = counts.get(case.outcome, 0) + 1
        return counts

    def summary_lines(self) -> list[str]:
        counts = ", ".join(f"{n} {outcome}" for outcome, n in sorted(self.counts().items()))
        verdict = "ok" if self.ok else "FAILED"
        return [case.summary() for case in self.cases] + [
            f"{verdict}: {len(self.cases)} combination(s) of {self.plan}: {counts} in {self.seconds:.1f} s"
        ]

    def as_json(self) -> dict[str, Any]:
        return {"plan": self.plan, "check_only": self.check_only, "ok": self.ok, "counts": self.counts(),
                "started": self.started, "seconds": round(self.seconds, 3),
                "cases": [case.as_json() for case in self.cases]}


def write_json_report(report: SeedReport, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, (json.dumps(report.as_json(), indent=2) + "\n").encode(), durable=False)


def junit_xml(report: SeedReport) -> bytes:
    """One ``testcase`` per combination (``classname`` the model), a ``failure`` with the reason."""
    failures = sum(not case.ok for case in report.cases)
    suites = ET.Element("testsuites", tests=str(len(report.cases)), failures=str(failures),
                        time=f"{report.seconds:.3f}")
    suite = ET.SubElement(suites, "testsuite", name="tt-cache check" if report.check_only else "tt-cache seed",
                          tests=str(len(report.cases)), failures=str(failures), errors="0", skipped="0",
                          time=f"{report.seconds:.3f}",
                          timestamp=time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(report.started)))
    for case in report.cases:
        combination = case.combination
        name = " ".join([combination.mesh, combination.precision] + list(combination.components or ()))
        element = ET.SubElement(suite, "testcase", classname=combination.model, name=name, time=f"{case.seconds:.3f}")
        if not case.ok:
            failure = ET.SubElement(element, "failure", message=f"{case.outcome}: {case.reason}", type=case.outcome)
            failure.text = case.summary()
        else:
            ET.SubElement(element, "system-out").text = case.summary()
    ET.indent(suites)
    return ET.tostring(suites, encoding="utf-8", xml_declaration=True) + b"\n"


def write_junit(report: SeedReport, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, junit_xml(report), durable=False)
