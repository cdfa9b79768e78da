# SPDX-License-Identifier: Apache-2.0
"""``tt-cache gc``: evict whole variants, least recently used first, and only what a marker vouches for.

A variant is evicted in an order that keeps readers safe: with the cache dir's build lock held
(a builder of that dir is never undercut; a held lock means "skip, try next time"), the marker
is withdrawn first (a reader starting now sees a cold cache, never a half-deleted warm one),
then its build generation is retired by the builders' own rule (not while a reader holds its
lease), and files it records outside a generation are deleted unless another marker records
them too. Nothing else is touched: a user's file next to a cache, or a cache whose marker
cannot be parsed, stays.
Recency is the ``last_used`` stamp a warm start updates (else the marker's own mtime).
Torch-free.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.common.fileio import file_lock
from models.common.marker import BUILD_LOCK, WeightCacheMarker, forget_markers, iter_markers, last_used_path
from models.seeding.scan import VariantInfo, marker_stamp, scan_root


@dataclass(frozen=True)
class Eviction:
    variant: VariantInfo
    why: str

    model = property(lambda self: self.variant.model)
    precision = property(lambda self: self.variant.precision)
    mesh = property(lambda self: self.variant.mesh)
    size_bytes = property(lambda self: self.variant.size_bytes)
    marker_file = property(lambda self: self.variant.marker_file)

    def as_json(self) -> dict[str, Any]:
        return {**self.variant.as_json(), "why": self.why}


@dataclass
class GcResult:
    evicted: list[Eviction] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)  # left alone on purpose
    errors: list[tuple[Path, str]] = field(default_factory=list)  # could not be evicted (exit 1)
    kept: int = 0
    kept_bytes: int = 0

    @property
    def freed_bytes(self) -> int:
        return sum(e.size_bytes for e in self.evicted)

    def as_json(self) -> dict[str, Any]:
        return {"evicted": [e.as_json() for e in self.evicted], "freed_bytes": self.freed_bytes,
                "skipped": [{"marker": str(p), "why": w} for p, w in self.skipped],
                "errors": [{"marker": str(p), "error": e} for p, e in self.errors],
                "kept": self.kept, "kept_bytes": self.kept_bytes}


def recency(variant: VariantInfo) -> float:
    if variant.last_used is not None:
        return variant.last_used
    try:
        return variant.marker_file.stat().st_mtime
    except OSError:
        return 0.0


def plan_eviction(root: Path, *, max_size: int | None = None, older_than: float | None = None,
                  now: float | None = None) -> GcResult:
    """Which variants to evict (nothing is deleted): unused for longer than ``older_than`` seconds,
    then least recently used first until the rest fits in ``max_size`` bytes."""
    now = time.time() if now is None else now
    result = GcResult()
    candidates = []
    for variant in scan_root(root):
        if not variant.trusted:  # not provably ours: its files are unknown, so never touched
            result.skipped.append((variant.marker_file, f"left alone: {variant.reason}"))
        else:
            candidates.append(variant)
    candidates.sort(key=recency)
    kept = []
    for variant in candidates:
        idle = now - recency(variant)
        if older_than is not None and idle > older_than:
            result.evicted.append(Eviction(variant, f"unused for {idle / 86400:.1f} days"))
        else:
            kept.append(variant)
    total = sum(v.size_bytes for v in kept)
    while max_size is not None and kept and total > max_size:
        variant = kept.pop(0)
        total -= variant.size_bytes
        result.evicted.append(Eviction(variant, "least recently used over --max-size"))
    result.kept, result.kept_bytes = len(kept), total
    return result


def _top_level_files(marker: WeightCacheMarker) -> set[str]:
    """Recorded files outside the marker's generation dir (the seed API's flat layout)."""
    prefix = f"{marker.generation}/" if marker.generation else None
    return {r.path for r in marker.all_files() if prefix is None or not r.path.startswith(prefix)}


def _files_other_markers_keep(cache_dir: Path, evicting: Path) -> set[str]:
    keep: set[str] = set()
    for path, marker, _ in iter_markers(cache_dir):
        if path != evicting and marker is not None:
            keep |= {record.path for record in marker.all_files()}
    return keep


def _remove_empty_dirs(cache_dir: Path, relatives: set[str]) -> None:
    parents = {Path(cache_dir, rel).parent for rel in relatives}
    for directory in sorted(parents, key=lambda p: len(p.parts), reverse=True):
        while directory != cache_dir and cache_dir in directory.parents:
            try:
                directory.rmdir()
            except OSError:
                break  # not empty (another variant's files, a user's file) or gone
            directory = directory.parent


def evict(variant: VariantInfo) -> str | None:
    """Withdraw the marker, then delete what only it vouched for. Returns why not, or None when done.

    Its generation dir goes through :func:`retire_generations` (the builders' own rule): a
    reader holding the generation's lease keeps it until the next gc or build."""
    from models.common.generations import retire_generations  # loguru: only when deleting

    cache_dir, marker_file, marker = variant.cache_dir, variant.marker_file, variant.marker
    with file_lock(cache_dir / BUILD_LOCK, blocking=False) as held:
        if not held:
            return "a builder holds the cache dir's build lock"
        stamp = marker_stamp(marker_file)
        if stamp is None:
            return "its marker is gone already"
        if stamp != variant.marker_stamp:
            return "its marker changed since the scan (rebuilt): kept"
        marker_file.unlink()  # first: from here on every reader sees this variant cold
        forget_markers()
        last_used_path(cache_dir, marker.build_variant).unlink(missing_ok=True)
        doomed = _top_level_files(marker) - _files_other_markers_keep(cache_dir, marker_file)
        for relative in doomed:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(cache_dir / relative)
        _remove_empty_dirs(cache_dir, doomed)
        retire_generations(cache_dir)
    return None


def collect_garbage(plan: GcResult) -> GcResult:
    """Carry out a :func:`plan_eviction`; variants that cannot be evicted now are reported as skipped."""
    done = GcResult(skipped=list(plan.skipped), kept=plan.kept, kept_bytes=plan.kept_bytes)
    for eviction in plan.evicted:
        try:
            why = evict(eviction.variant)
        except OSError as error:
            done.errors.append((eviction.marker_file, f"{error.strerror or error} ({error.filename})"))
            continue
        if why is None:
            done.evicted.append(eviction)
        else:
            done.skipped.append((eviction.marker_file, why))
    return done
