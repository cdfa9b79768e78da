# SPDX-License-Identifier: Apache-2.0
"""A history of seed and check runs (``tt-cache seed --history FILE``): one JSON line per run, and
the trend the job summary shows over the last runs.

Each run appends one record (its time, hit rate, bytes written, the seconds warm hits saved, its
variants by outcome). The file is meant to outlive the runner's workspace (the workflow keeps it
with ``actions/cache``), so it is read defensively: a line that is not a record (a partial line of
a killed writer or a full disk, a hand edit, another tool's line) is skipped with a warning, and
the next record starts on a line of its own. Torch-free.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loguru import logger

from models.common.units import format_bytes
from models.seeding.report import WARM, SeedReport

SCHEMA_VERSION = 1  # of a history line
TREND_RUNS = 10  # the runs the job summary's trend shows
SPARK = "▁▂▃▄▅▆▇█"


@dataclass(frozen=True)
class RunRecord:
    """One run, as a history line has it. ``hit_rate`` is None for a run with no variant (a bad plan)."""

    time: str  # UTC, ISO 8601, seconds
    command: str
    plan: str
    variants: int
    hit_rate: float | None
    bytes_written: int
    seconds_saved: float
    seconds: float
    outcomes: dict[str, int]
    error_type: str | None = None

    @classmethod
    def of(cls, report: SeedReport) -> RunRecord:
        stats, counts = report.statistics(), report.counts()
        return cls(time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(report.started)), command=report.command,
                   plan=report.plan, variants=stats.variants,
                   hit_rate=round(counts.get(WARM, 0) / stats.variants, 4) if stats.variants else None,
                   bytes_written=stats.bytes_written, seconds_saved=round(stats.seconds_saved, 3),
                   seconds=round(report.seconds, 3), outcomes=dict(sorted(counts.items())),
                   error_type=report.error_type)

    def as_json(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, data: Any) -> RunRecord:
        """The record of a decoded line; ``ValueError`` naming what is wrong with one that is not."""
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        if data.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(f"schema_version {data.get('schema_version')!r}, not {SCHEMA_VERSION}")
        fields = {
            "time": str, "command": str, "plan": str, "variants": int, "bytes_written": int,
            "seconds_saved": (int, float), "seconds": (int, float), "outcomes": dict,
        }
        for key, kind in fields.items():
            if not isinstance(data.get(key), kind) or isinstance(data.get(key), bool):
                raise ValueError(f"'{key}' missing or not {getattr(kind, '__name__', 'a number')}")
        hit_rate, error_type = data.get("hit_rate"), data.get("error_type")
        if hit_rate is not None and (not isinstance(hit_rate, (int, float)) or not 0 <= hit_rate <= 1):
            raise ValueError(f"'hit_rate' {hit_rate!r} is not a fraction")
        if not all(isinstance(k, str) and isinstance(v, int) for k, v in data["outcomes"].items()):
            raise ValueError("'outcomes' is not a count per outcome")
        return cls(data["time"], data["command"], data["plan"], data["variants"], hit_rate, data["bytes_written"],
                   float(data["seconds_saved"]), float(data["seconds"]), dict(data["outcomes"]),
                   error_type if isinstance(error_type, str) else None)


def append_record(path: Path, record: RunRecord) -> None:
    """Append ``record`` as one line (one ``write``: concurrent appenders do not interleave). A file
    that ends mid-line gets a newline first, so the partial line costs only itself. ``OSError``
    when the file cannot be written."""
    line = (json.dumps(record.as_json(), separators=(",", ":")) + "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line
        view = memoryview(line)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def read_records(path: Path) -> list[RunRecord]:
    """Every record of the file, oldest first (none if it does not exist); a line that is not a
    record is skipped with a warning naming the file and line. ``OSError`` when it cannot be read."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    records = []
    for number, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        try:
            records.append(RunRecord.from_json(json.loads(raw.decode("utf-8"))))
        except UnicodeDecodeError:
            logger.warning(f"{path}:{number}: not a history record (not UTF-8); skipped")
        except ValueError as error:  # json's errors are ValueErrors too
            logger.warning(f"{path}:{number}: not a history record ({' '.join(str(error).split())}); skipped")
    return records


def sparkline(values: Sequence[float | None], low: float | None = None, high: float | None = None) -> str:
    """One block per value, scaled from ``low`` to ``high`` (default: the values' range); a missing
    value is a space."""
    known = [value for value in values if value is not None]
    if not known:
        return " " * len(values)
    low = min(known) if low is None else low
    high = max(known) if high is None else high
    span = high - low
    blocks = []
    for value in values:
        if value is None:
            blocks.append(" ")
            continue
        level = 0 if span <= 0 else round((min(max(value, low), high) - low) / span * (len(SPARK) - 1))
        blocks.append(SPARK[level])
    return "".join(blocks)


TREND_HEADER = ("| run (UTC) | command | variants | hit rate | bytes written | seconds saved | outcomes |\n"
                "| --- | --- | ---: | ---: | ---: | ---: | --- |")


def _rate(hit_rate: float | None) -> str:
    return "-" if hit_rate is None else f"{hit_rate:.0%}"


def trend_markdown(records: Sequence[RunRecord], runs: int = TREND_RUNS) -> list[str]:
    """The job summary's trend over the last ``runs`` records (oldest first), then one sparkline per
    measure; no lines for an empty history."""
    shown = list(records)[-runs:]
    if not shown:
        return []
    lines = [f"#### Trend over the last {len(shown)} run(s)", "", TREND_HEADER]
    for record in shown:
        outcomes = ", ".join(f"{n} {outcome}" for outcome, n in record.outcomes.items()) or "-"
        if record.error_type:
            outcomes += f" (stopped: {record.error_type})"
        lines.append(f"| {record.time} | {record.command} | {record.variants} | {_rate(record.hit_rate)} | "
                     f"{format_bytes(record.bytes_written)} | {record.seconds_saved:.2f} | {outcomes} |")
    lines += ["", f"hit rate `{sparkline([r.hit_rate for r in shown], 0.0, 1.0)}` (0-100%) · "
                  f"bytes written `{sparkline([r.bytes_written for r in shown], 0)}` · "
                  f"seconds saved `{sparkline([r.seconds_saved for r in shown], 0)}`", ""]
    return lines
