# SPDX-License-Identifier: Apache-2.0
"""Sizes as people type and read them: ``500G`` in, ``1.4 GiB`` or ``1.4G`` out.

One home for the size rules of every command: caps given on a command line or in an environment
variable (``tt-cache gc --max-size``, ``TT_PREFILL_CACHE_MAX_SIZE``) parse the same way, in binary
units as ``du -h`` prints them.
"""

from __future__ import annotations

import re

_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGTP]?)(?:I?B)?", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``"500G"``, ``"1.5T"``, ``"200MiB"``, ``"3 GB"``, ``"4096"`` as bytes (binary units, like ``du -h``)."""
    match = _SIZE.fullmatch(str(text).strip())
    if not match:
        raise ValueError(f"size {text!r}: expected a number with an optional K/M/G/T/P unit, e.g. 500G")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).upper()])


def format_bytes(nbytes: float) -> str:
    """For sentences and reports, one decimal in binary units: ``0 B``, ``974.2 KiB``, ``1.4 GiB``."""
    if nbytes < 1024:
        return f"{nbytes:.0f} B"
    value = float(nbytes)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}"


def format_size(nbytes: float) -> str:
    """For table columns, ``hf cache scan`` style: ``843.2M``, ``1.4G``."""
    for unit in ("", "K", "M", "G", "T"):
        if abs(nbytes) < 1000 or unit == "T":
            return f"{nbytes:.0f}" if unit == "" else f"{nbytes:.1f}{unit}"
        nbytes /= 1024
    return f"{nbytes:.1f}P"
