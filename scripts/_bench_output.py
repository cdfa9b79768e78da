# SPDX-License-Identifier: Apache-2.0
"""Where benchmark results go: a JSON file and a PNG bar chart per run (the docs/ pages show the PNGs).

One home for the output of every ``scripts/bench_*.py``: they print their markdown tables, then call
:func:`write_results` (or :func:`write_json` and :func:`bar_chart` / :func:`figure`) with the same
figures; no script draws on its own. Plots use matplotlib's Agg backend (no display here).
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class Panel:
    """One plot of a figure.

    ``kind``: ``"bars"`` (grouped bars: one group per key of ``data``, one bar per inner key, each
    labelled with its value), ``"lines"`` (one line per key of ``data``, inner keys the x values:
    numbers, or strings placed in order) or ``"stacked"`` (one horizontal bar per key of ``data``,
    its inner keys the stacked parts, left to right). ``hlines``: labelled reference lines (a
    target, a baseline)."""

    kind: str
    data: Mapping[str, Mapping[Any, float]]
    title: str = ""
    ylabel: str = ""
    xlabel: str = ""
    log: bool = False
    value_format: str | None = None
    hlines: Mapping[str, float] = field(default_factory=dict)
    width: float = 1.0  # relative to the figure's other panels


def figure(path: Path, panels: Sequence[Panel], *, title: str | None = None) -> Path:
    """Draw ``panels`` side by side into one PNG (matplotlib's Agg backend: no display here)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    widths = [_panel_inches(panel) for panel in panels]
    fig, axes = plt.subplots(1, len(panels), figsize=(sum(widths), 4.2), dpi=110, squeeze=False,
                             gridspec_kw={"width_ratios": [w * p.width for w, p in zip(widths, panels)]})
    for ax, panel in zip(axes[0], panels):
        {"bars": _bars, "lines": _lines, "stacked": _stacked}[panel.kind](ax, panel, plt)
        for index, (name, value) in enumerate(panel.hlines.items()):
            ax.axhline(value, color=("tab:red", "gray", "black")[index % 3], linestyle=("--", ":", "-.")[index % 3],
                       linewidth=1, label=name)
        ax.set_title(panel.title, fontsize=10)
        if panel.ylabel:
            ax.set_ylabel(panel.ylabel)
        if panel.xlabel:
            ax.set_xlabel(panel.xlabel)
        if panel.log:
            ax.set_xscale("log") if panel.kind == "stacked" else ax.set_yscale("log")
        ax.grid(axis="x" if panel.kind == "stacked" else "y", alpha=0.3)
        if panel.kind == "bars" or (panel.kind == "lines" and len(panel.data) > 6):  # below: over the data it would hide it
            ax.legend(fontsize=8, ncols=4 if panel.kind == "bars" else 2, loc="upper left",
                      bbox_to_anchor=(0, -0.2 if panel.xlabel else -0.12), frameon=False)
        else:
            ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0) if panel.kind == "stacked" else None)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path


def bar_chart(path: Path, groups: Mapping[str, Mapping[str, float]], *, title: str, ylabel: str,
              log: bool = False, value_format: str | None = None) -> Path:
    """Grouped bars: one group per key of ``groups`` (e.g. a precision), one bar per inner key
    (e.g. cold, warm, transformers, cat), each labelled with its value."""
    return figure(path, [Panel("bars", groups, title=title, ylabel=ylabel, log=log, value_format=value_format)])


def _panel_inches(panel: Panel) -> float:
    if panel.kind != "bars":
        return 5.5
    total = sum(len(bars) for bars in panel.data.values())
    return max(7.0, 2.4 * len(panel.data) + 0.45 * total)


def _colors(names: Sequence[str], plt: Any) -> dict[str, Any]:
    """One color a name: tab10 up to ten names, tab20 (no repeats) up to twenty."""
    palette = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    return {name: palette(index % palette.N) for index, name in enumerate(names)}


def _bars(ax: Any, panel: Panel, plt: Any) -> None:
    groups = panel.data
    colors = _colors(list(dict.fromkeys(name for bars in groups.values() for name in bars)), plt)
    width = 0.8 / max(len(bars) for bars in groups.values())
    labelled: set[str] = set()
    for position, bars in enumerate(groups.values()):
        for index, (name, value) in enumerate(bars.items()):
            x = position + (index - (len(bars) - 1) / 2) * width
            drawn = ax.bar([x], [value], width, color=colors[name], label=None if name in labelled else name)
            ax.bar_label(drawn, labels=[_label(value, panel.value_format)], fontsize=7, padding=1)
            labelled.add(name)
    ax.set_xticks(range(len(groups)), list(groups))


def _lines(ax: Any, panel: Panel, plt: Any) -> None:
    ticks = list(dict.fromkeys(x for points in panel.data.values() for x in points))
    categorical = any(isinstance(x, str) for x in ticks)
    colors = _colors(list(panel.data), plt)
    for name, points in panel.data.items():
        # numeric x in ascending order, whatever order the points were gathered in
        ordered = list(points.items()) if categorical else sorted(points.items())
        xs = [ticks.index(x) if categorical else x for x, _ in ordered]
        ax.plot(xs, [y for _, y in ordered], marker="o", color=colors[name], label=name)
    if categorical:
        ax.set_xticks(range(len(ticks)), ticks)


def _stacked(ax: Any, panel: Panel, plt: Any) -> None:
    rows = list(panel.data)
    colors = _colors(list(dict.fromkeys(part for parts in panel.data.values() for part in parts)), plt)
    left = [0.0] * len(rows)
    for part in colors:
        widths = [max(0.0, panel.data[row].get(part, 0.0)) for row in rows]
        ax.barh(rows, widths, left=left, color=colors[part], label=part)
        left = [a + b for a, b in zip(left, widths)]


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
