# SPDX-License-Identifier: Apache-2.0
"""Durations for people, and back: ``30d``, ``12m05s``, ``3 minutes ago`` (sizes: ``models.common.units``)."""

from __future__ import annotations

import re
import time

_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])", re.IGNORECASE)


def parse_duration(text: str) -> float:
    """``"30d"``, ``"12h"``, ``"90m"``, ``"45s"``, ``"2w"`` as seconds."""
    match = _DURATION.fullmatch(text.strip())
    if not match:
        raise ValueError(f"duration {text!r}: expected a number with a unit s/m/h/d/w, e.g. 30d")
    return float(match.group(1)) * _DURATION_UNITS[match.group(2).lower()]


def format_duration(seconds: float | None) -> str:
    """How long a build took, as one word: ``0.42s``, ``38s``, ``12m05s``; ``-`` when not recorded."""
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.2f}s"
    if seconds < 600:
        return f"{seconds:.0f}s"
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def format_age(timestamp: float | None, now: float | None = None) -> str:
    if timestamp is None:
        return "-"
    seconds = max(0.0, (now or time.time()) - timestamp)
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            count = int(seconds // size)
            return f"{count} {unit}{'s' if count > 1 else ''} ago"
    return "just now"
