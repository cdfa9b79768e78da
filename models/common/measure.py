# SPDX-License-Identifier: Apache-2.0
"""Honest per-process measurements: peak RSS from the kernel's own high-water mark, and measured
children that report it.

Why not ``resource.getrusage(RUSAGE_SELF).ru_maxrss``: Linux carries it across fork and exec, so a
child started by a parent that once held many GB reports at least that much whatever it did itself
(a bare ``import torch, ttnn`` then looks like a model load). ``VmHWM``
in ``/proc/<pid>/status`` belongs to the address space, which exec replaces: it is the process's
own peak. The demo and every benchmark take their memory figures from here.

A measured phase runs in a fresh interpreter: the parent starts it with :func:`run_measured`, the
child ends with :func:`report`, which prints its result and its own peak RSS on one line.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

MIB = 1 << 20
REPORT_PREFIX = "MEASURED "


class MeasureError(RuntimeError):
    """A measurement could not be taken (no such process, no /proc, a child that failed)."""


def _status_kib(field: str, pid: int | None) -> int:
    path = Path("/proc") / ("self" if pid is None else str(pid)) / "status"
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise MeasureError(f"cannot read {path}: no such process (or no /proc: Linux only)") from None
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name == field:
            number, unit = value.split()
            if unit != "kB":
                raise MeasureError(f"{path}: {field} is in {unit!r}, expected 'kB'")
            return int(number)
    raise MeasureError(f"{path} has no {field} line")


def peak_rss_bytes(pid: int | None = None) -> int:
    """Peak resident set size of ``pid`` (default: this process) since it was exec'd: ``VmHWM``."""
    return _status_kib("VmHWM", pid) * 1024


def rss_bytes(pid: int | None = None) -> int:
    """Resident set size of ``pid`` (default: this process) now: ``VmRSS``."""
    return _status_kib("VmRSS", pid) * 1024


def peak_rss_mib(pid: int | None = None) -> float:
    return peak_rss_bytes(pid) / MIB


def report(result: Mapping[str, Any]) -> None:
    """Print ``result`` plus this process's ``peak_rss_mib`` as the one line :func:`run_measured` reads."""
    print(REPORT_PREFIX + json.dumps({**result, "peak_rss_mib": peak_rss_mib()}), flush=True)


def run_measured(argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: Path | str | None = None,
                 timeout: float | None = None, show_log: bool = False) -> dict[str, Any]:
    """Run a child that ends with :func:`report`; return its report plus ``process_s``, the wall time
    of the whole child (interpreter start and imports included). A failed child is an error that
    carries the end of its stderr; ``show_log`` passes its stderr through instead (long phases)."""
    start = time.perf_counter()
    done = subprocess.run(list(argv), env=None if env is None else dict(env), cwd=cwd, stdout=subprocess.PIPE,
                          stderr=None if show_log else subprocess.PIPE, text=True, timeout=timeout)
    seconds = time.perf_counter() - start
    lines = [line for line in done.stdout.splitlines() if line.startswith(REPORT_PREFIX)]
    if done.returncode or not lines:
        why = f"exited with {done.returncode}" if done.returncode else "printed no report line"
        log = "(its log is above)" if show_log else done.stderr[-4000:]
        raise MeasureError(f"measured process {_describe(argv)} {why}:\n{log}")
    result = json.loads(lines[-1][len(REPORT_PREFIX):])
    result["process_s"] = seconds
    return result


def _describe(argv: Sequence[str]) -> str:
    shown = " ".join(os.path.basename(part) if index == 0 else part for index, part in enumerate(argv))
    return repr(shown if len(shown) <= 200 else shown[:200] + " ...")
