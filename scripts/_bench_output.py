# SPDX-License-Identifier: Apache-2.0
"""Where benchmark results go: a JSON file and a PNG bar chart per run (the README shows the PNGs).

One home for the output of every ``scripts/bench_*.py``: they print their markdown tables, then call
:func:`write_results` with the same figures. Plots use matplotlib's Agg backend (no display here).
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT_DIR = REPO_ROOT / "docs"  # beside the other benchmarks' docs/bench_*.json and .png


def machine() -> dict[str, Any]:
    """What the figures were measured on (they are only comparable on one machine, side by side)."""
    return {"cpus": os.cpu_count(), "python": sys.version.split()[0], "platform": platform.platform(),
            "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def write_json(path: Path, results: Mapping[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": machine(), **results}, indent=2) + "\n")
    return path


def bar_chart(path: Path, groups: Mapping[str, Mapping[str, float]], *, title: str, ylabel: str,
              log: bool = False, value_format: str | None = None) -> Path:
    """Grouped bars: one group per key of ``groups`` (e.g. a precision), one bar per inner key
    (e.g. cold, warm, transformers, cat), each labelled with its value."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = list(dict.fromkeys(name for bars in groups.values() for name in bars))
    colors = {name: plt.get_cmap("tab10")(index % 10) for index, name in enumerate(series)}
    width = 0.8 / max(len(bars) for bars in groups.values())
    total = sum(len(bars) for bars in groups.values())
    fig, ax = plt.subplots(figsize=(max(7.0, 2.4 * len(groups) + 0.45 * total), 4.2), dpi=110)
    labelled: set[str] = set()
    for position, bars in enumerate(groups.values()):
        for index, (name, value) in enumerate(bars.items()):
            x = position + (index - (len(bars) - 1) / 2) * width
            drawn = ax.bar([x], [value], width, color=colors[name], label=None if name in labelled else name)
            ax.bar_label(drawn, labels=[_label(value, value_format)], fontsize=7, padding=1)
            labelled.add(name)
    ax.set_xticks(range(len(groups)), list(groups))
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if log:
        ax.set_yscale("log")
    ax.legend(fontsize=8, ncols=min(len(series), 4), loc="upper left", bbox_to_anchor=(0, -0.12), frameon=False)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path


def _label(value: float, value_format: str | None) -> str:
    if value_format:
        return value_format.format(value)
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def write_results(out_dir: Path, name: str, results: Mapping[str, Any],
                  charts: Mapping[str, dict[str, Any]]) -> list[Path]:
    """``<out_dir>/<name>.json`` with ``results``, and ``<out_dir>/<name>[-<chart>].png`` per chart
    (``charts`` maps a suffix, "" for none, to :func:`bar_chart` arguments); returns the paths."""
    written = [write_json(out_dir / f"{name}.json", results)]
    for suffix, chart in charts.items():
        written.append(bar_chart(out_dir / f"{name}{'-' + suffix if suffix else ''}.png", **chart))
    for path in written:
        print(f"wrote {path}")
    return written
