# SPDX-License-Identifier: Apache-2.0
"""``tt-cache gc``: evict whole variants, least recently used first, and only what is provably ours.

Plan, then execute (after huggingface_hub's ``DeleteCacheStrategy``): :func:`plan_eviction` says
what would go and frees nothing; :func:`collect_garbage` carries the plan out and reports what it
actually freed. A variant is evicted in an order that keeps readers safe: with the cache dir's
build lock held (a builder is never undercut; a held lock means "skip, try next time"), its marker
is withdrawn first (a reader starting now sees a cold cache, never a half-deleted warm one), then
its generations are retired by the builders' own rule (a generation a reader holds is left for the
next build, gc or warm start, and reported as deferred, not freed), and the files the marker
records outside a generation (the seed API's) are unlinked only where its build provably wrote
them (recorded ``owned``: the rule of :mod:`models.common.weight_cache.compat`) and the marker
proves each the recorded file: a regular file reached without following a symlink, with the
recorded inode (else digest), never inside a directory that holds a cache of its own, and not
recorded by another marker. Builds no marker names (failed, killed, or replaced while leased) go
as well. A user's file beside a cache or in a subfolder the seed API does not write, a cache
whose marker cannot be parsed, another model's cache: nothing else is touched.
Recency is the last use (:mod:`models.common.weight_cache.usage`); a read-only runner that cannot
record its uses hands them over in its ``seed --check --report`` (``gc --uses REPORT``,
:func:`hand_over_uses`), recorded before anything is planned. Torch-free.
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.common.fileio import unlink_beneath
from models.common.weight_cache.gate import file_problem
from models.common.weight_cache.generations import LockState, build_lock, retire_unnamed
from models.common.weight_cache.layout import VariantPaths, nested_cache
from models.common.weight_cache.marker import FileRecord, forget_markers, iter_markers
from models.common.weight_cache.side_files import read_json_record
from models.common.weight_cache.usage import forget_use, record_use_at
from models.tt_cache.scan import LeftoverBuild, VariantInfo, marker_stamp, scan_leftovers, scan_root


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
    """A plan (``freed_bytes`` is what it would free) or what was done (what it freed)."""

    evicted: list[Eviction] = field(default_factory=list)
    leftovers: list[LeftoverBuild] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)  # left alone on purpose
    deferred: list[tuple[Path, str]] = field(default_factory=list)  # leased by a reader: removed later
    errors: list[tuple[Path, str]] = field(default_factory=list)  # could not be evicted (exit 1)
    protected: list[Path] = field(default_factory=list)  # markers of variants a --keep-plan plan names
    kept: int = 0
    kept_bytes: int = 0
    freed_bytes: int = 0

    def as_json(self) -> dict[str, Any]:
        return {"evicted": [e.as_json() for e in self.evicted], "leftovers": [b.as_json() for b in self.leftovers],
                "freed_bytes": self.freed_bytes,
                "skipped": [{"path": str(p), "why": w} for p, w in self.skipped],
                "deferred": [{"path": str(p), "why": w} for p, w in self.deferred],
                "errors": [{"path": str(p), "error": e} for p, e in self.errors],
                "protected": [str(p) for p in self.protected],
                "kept": self.kept, "kept_bytes": self.kept_bytes}


MAX_REPORT_BYTES = 64 << 20
_TAG = re.compile(r"^[0-9a-f]{1,64}$")
FUTURE_SKEW_S = 86400.0  # a runner's clock ahead of this one's by at most this much


class UsesError(ValueError):
    """A ``--uses`` report that cannot be read as one (one line, names the file and the entry)."""


@dataclass(frozen=True)
class HandedUse:
    cache_dir: Path
    variant_tag: str
    at: float
    recorded: bool
    why: str = ""


def read_uses(report: Path) -> list[tuple[str, str, float]]:
    """The ``uses`` of a ``seed --check --report`` file: (variant dir relative to the cache root,
    variant tag, time). Raises :class:`UsesError` for anything else."""
    body = read_json_record(report, MAX_REPORT_BYTES)
    if body is None:
        raise UsesError(f"{report}: not a readable seed report (JSON object, at most {MAX_REPORT_BYTES >> 20} MiB)")
    uses = body.get("uses")
    if not isinstance(uses, list):
        raise UsesError(f"{report}: no 'uses' list (written by 'tt-cache seed --check --report' of this version)")
    found = []
    latest = time.time() + FUTURE_SKEW_S
    for index, use in enumerate(uses):
        relative = use.get("cache_dir") if isinstance(use, dict) else None
        tag = use.get("variant_tag") if isinstance(use, dict) else None
        at = use.get("at") if isinstance(use, dict) else None
        parts = Path(relative).parts if isinstance(relative, str) else ()
        if (not parts or Path(relative).is_absolute() or ".." in parts or not isinstance(tag, str)
                or not _TAG.match(tag) or type(at) not in (int, float) or not 0 <= at <= latest):
            raise UsesError(f"{report}: uses[{index}] is not a use (a relative cache_dir, a hex variant_tag and a "
                            f"time 'at' not in the future)")
        found.append((relative, tag, float(at)))
    return found


def _reached_without_symlinks(root: Path, relative: str) -> Path | None:
    """``root/relative`` if every step below ``root`` is a real directory (no symlink followed out)."""
    path = root
    for part in Path(relative).parts:
        path = path / part
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                return None
        except OSError:
            return None
    return path


def hand_over_uses(reports: Iterable[Path], root: Path) -> list[HandedUse]:
    """Record every use the reports carry in the variant it names under ``root`` (where that
    variant's marker is), so the plan that follows sees them. A bad report stops before any is."""
    uses = [(report, use) for report in reports for use in read_uses(report)]
    handed = []
    for _, (relative, tag, at) in uses:
        cache_dir = _reached_without_symlinks(root, relative)
        if cache_dir is None:
            handed.append(HandedUse(root / relative, tag, at, False, "no such directory under the root"))
            continue
        paths = VariantPaths(cache_dir, tag=tag)
        try:
            has_marker = stat.S_ISREG(os.lstat(paths.marker).st_mode)
        except OSError:
            has_marker = False
        if not has_marker:
            handed.append(HandedUse(cache_dir, tag, at, False, "no marker of that variant here"))
            continue
        recorded = record_use_at(paths, at)
        handed.append(HandedUse(cache_dir, tag, at, recorded, "" if recorded else "its use record cannot be written"))
    return handed


def recency(variant: VariantInfo) -> float:
    if variant.last_used is not None:
        return variant.last_used
    try:
        return variant.marker_file.stat().st_mtime
    except OSError:
        return 0.0


def plan_eviction(root: Path, *, max_size: int | None = None, older_than: float | None = None,
                  now: float | None = None, keep: Iterable[Path] = ()) -> GcResult:
    """Which variants to evict (nothing is deleted): unused for longer than ``older_than`` seconds,
    then least recently used first until the rest fits in ``max_size`` bytes; never a variant
    whose marker file is in ``keep`` (``--keep-plan``: it counts toward ``max_size`` all the same);
    and every leftover build."""
    now = time.time() if now is None else now
    protected = {os.path.realpath(path) for path in keep}
    result = GcResult(leftovers=scan_leftovers(root))
    candidates = []
    for variant in scan_root(root):
        if not variant.trusted:  # not provably ours: its files are unknown, so never touched
            result.skipped.append((variant.marker_file, f"left alone: {variant.reason}"))
        elif os.path.realpath(variant.marker_file) in protected:
            result.protected.append(variant.marker_file)
            result.kept += 1
            result.kept_bytes += variant.size_bytes
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
    total = result.kept_bytes + sum(v.size_bytes for v in kept)
    while max_size is not None and kept and total > max_size:
        variant = kept.pop(0)
        total -= variant.size_bytes
        result.evicted.append(Eviction(variant, "least recently used over --max-size"))
    result.kept += len(kept)
    result.kept_bytes = total
    result.freed_bytes = sum(e.size_bytes for e in result.evicted) + sum(b.size_bytes for b in result.leftovers)
    return result


def _proven(cache_dir: Path, record: FileRecord) -> bool:
    """Whether the file at a recorded path is the one the marker records: outside any directory
    that holds a cache of its own, a regular file (not followed through a symlink) with the
    recorded size, and the recorded inode or else the recorded digest. A user's file put there
    since, or a nested cache's, is not."""
    if nested_cache(cache_dir, record.path) is not None:
        return False
    try:
        info = os.lstat(cache_dir / record.path)
    except OSError:
        return False
    if not stat.S_ISREG(info.st_mode) or info.st_size != record.bytes:
        return False
    if record.stamp is not None and info.st_ino == record.stamp.inode:
        return True
    return file_problem(cache_dir, record) is None


def _files_other_markers_keep(cache_dir: Path, evicting: Path) -> set[str]:
    keep: set[str] = set()
    for path, marker, _ in iter_markers(cache_dir):
        if path != evicting and marker is not None:
            keep |= {record.path for record in marker.all_files()}
    return keep


def _remove_empty_dirs(cache_dir: Path, relatives: set[str]) -> None:
    """``rmdir`` the directories the unlinked files leave empty, up to the cache dir (real
    directories only; ``rmdir`` never deletes a symlink's target nor a non-empty directory)."""
    parents = {Path(cache_dir, rel).parent for rel in relatives}
    for directory in sorted(parents, key=lambda p: len(p.parts), reverse=True):
        while directory != cache_dir and cache_dir in directory.parents and not directory.is_symlink():
            try:
                directory.rmdir()
            except OSError:
                break  # not empty (another variant's files, a user's file) or gone
            directory = directory.parent


def evict(variant: VariantInfo) -> tuple[str | None, int, list[str]]:
    """Withdraw the marker, then delete what only it vouched for. Returns (why not or None,
    bytes freed, generations deferred because a reader holds them)."""
    cache_dir, marker_file, marker = variant.cache_dir, variant.marker_file, variant.marker
    paths = VariantPaths(cache_dir, marker.build_variant)
    with build_lock(paths, blocking=False, create=False) as lock:
        if not lock.held:
            return _lock_refused(lock), 0, []
        stamp = marker_stamp(marker_file)
        if stamp is None:
            return "its marker is gone already", 0, []
        if stamp != variant.marker_stamp:
            return "its marker changed since the scan (rebuilt): kept", 0, []
        freed = marker_file.stat().st_size
        marker_file.unlink()  # first: from here on every reader sees this variant cold
        forget_markers()
        forget_use(paths)
        kept = _files_other_markers_keep(cache_dir, marker_file)
        doomed = {record.path for record in marker.evictable_files()
                  if record.path not in kept and _proven(cache_dir, record)}
        for relative in doomed:
            size = _lsize(cache_dir / relative)
            if unlink_beneath(cache_dir, relative):
                freed += size
        _remove_empty_dirs(cache_dir, doomed)
        retired = retire_unnamed(paths)
    return None, freed + retired.freed_bytes, retired.leased


def _lock_refused(lock: LockState) -> str:
    """Why not, when a builder holds the lock (skip: try next time); raise when it cannot be taken."""
    if lock.busy:
        return "a builder holds the cache dir's build lock"
    raise OSError(lock.why)


def _lsize(path: Path) -> int:
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


def remove_leftover(build: LeftoverBuild) -> tuple[str | None, int, list[str]]:
    """Retire a leftover build under its dir's build lock: (why not, bytes freed, still leased)."""
    with build_lock(build.paths, blocking=False, create=False) as lock:
        if not lock.held:
            return _lock_refused(lock), 0, []
        retired = retire_unnamed(build.paths)
    return None, retired.freed_bytes, retired.leased


def _describe(error: OSError) -> str:
    return f"{error.strerror} ({error.filename})" if error.strerror else str(error)


def collect_garbage(plan: GcResult) -> GcResult:
    """Carry out a :func:`plan_eviction`; what cannot go now is reported as skipped or deferred."""
    done = GcResult(skipped=list(plan.skipped), protected=list(plan.protected), kept=plan.kept,
                    kept_bytes=plan.kept_bytes)
    for eviction in plan.evicted:
        try:
            why, freed, leased = evict(eviction.variant)
        except OSError as error:
            done.errors.append((eviction.marker_file, _describe(error)))
            continue
        if why is not None:
            done.skipped.append((eviction.marker_file, why))
            continue
        done.evicted.append(eviction)
        done.freed_bytes += freed
        done.deferred += [(eviction.variant.cache_dir / name, "a reader holds it: removed by the next build, gc "
                           "or warm start") for name in leased]
    deferred = {path for path, _ in done.deferred}
    for build in plan.leftovers:
        if not (build.cache_dir / build.name).exists() or build.cache_dir / build.name in deferred:
            continue  # retired, or found leased, with an evicted variant above
        try:
            why, freed, leased = remove_leftover(build)
        except OSError as error:
            done.errors.append((build.cache_dir / build.name, _describe(error)))
            continue
        if why is not None:
            done.skipped.append((build.cache_dir / build.name, why))
            continue
        done.freed_bytes += freed
        if build.name in leased:
            done.deferred.append((build.cache_dir / build.name, "a reader holds it: removed later"))
        else:
            done.leftovers.append(build)
    return done
