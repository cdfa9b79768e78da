# SPDX-License-Identifier: Apache-2.0
"""``tt-cache clean``: remove what killed writers of this project left behind, and nothing else.

Inside each cache dir under the root (one holding a marker or a build lock, or a ``mesh_<r>x<c>``
dir), and only while clean holds that dir's build lock (a live builder's files are never judged):

* a temp file goes when its name is exactly one :func:`models.common.fileio.unique_temp_path`
  makes, it is a regular file, and :func:`models.common.fileio.temp_writer_alive` says its writer
  is gone (a lock the writer holds, so it works across PID namespaces);
* a build generation goes when its record proves a build of this project made it, no marker names
  it and no reader holds its lease (:func:`models.common.weight_cache.generations.retire_unnamed`);
* an object a killed ``tt-cache pull`` staged goes when it is a regular file in the dir's
  ``.pulled-objects/`` named as a pull names one (a digest, or a digest and ``.part``): the next
  pull fetches it again.

A user's ``.zshrc.tmp.orig`` or ``gemma-2b/`` next to a cache survives. Files that vanish while
clean looks (a writer publishing its temp) are simply gone, not an error.
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.common.fileio import is_temp_path, temp_writer_alive
from models.common.weight_cache.generations import (
    build_lock,
    lease_held,
    named_generations,
    owned_generations,
    recorded_tags,
    retire_unnamed,
    retired_debris,
)
from models.common.weight_cache.layout import (
    VariantPaths,
    is_marker_name,
    iter_variant_dirs,
    tree_usage,
)
from models.common.weight_cache.remote.transfer import is_staged_name


@dataclass(frozen=True)
class Removal:
    """One thing clean removed (or, in a dry run, would remove): a file or a whole build."""

    path: Path
    kind: str  # "temp file", "pulled object", "marker", "leftover build", "retired build"
    files: int
    size_bytes: int

    def as_json(self) -> dict[str, Any]:
        return {"path": str(self.path), "kind": self.kind, "files": self.files, "size_bytes": self.size_bytes}


@dataclass
class CleanReport:
    cache_dirs: list[Path] = field(default_factory=list)
    removals: list[Removal] = field(default_factory=list)
    kept_live: list[Path] = field(default_factory=list)
    busy: list[Path] = field(default_factory=list)  # a builder holds the dir's lock: looked at next time
    leased: list[Path] = field(default_factory=list)  # a reader holds the build: removed by a later clean
    errors: list[tuple[Path, str]] = field(default_factory=list)
    dry_run: bool = False

    @property
    def removed(self) -> list[Path]:
        return [removal.path for removal in self.removals]

    @property
    def removed_files(self) -> int:
        return sum(removal.files for removal in self.removals)

    @property
    def removed_bytes(self) -> int:
        return sum(removal.size_bytes for removal in self.removals)

    def as_json(self) -> dict[str, Any]:
        return {"cache_dirs": [str(p) for p in self.cache_dirs], "removed": [str(p) for p in self.removed],
                "removals": [r.as_json() for r in self.removals], "removed_files": self.removed_files,
                "removed_bytes": self.removed_bytes, "dry_run": self.dry_run,
                "kept_live": [str(p) for p in self.kept_live], "busy": [str(p) for p in self.busy],
                "leased": [str(p) for p in self.leased],
                "errors": [{"path": str(p), "error": e} for p, e in self.errors]}


def _temps(cache_dir: Path) -> list[Path]:
    """Temp files of this project's writers in the dir and its generations (no symlink followed)."""
    temps = []
    for directory, subdirs, names in os.walk(cache_dir):
        for name in names:
            path = Path(directory, name)
            if not is_temp_path(path):
                continue
            try:
                if stat.S_ISREG(path.lstat().st_mode):
                    temps.append(path)
            except FileNotFoundError:
                pass  # published or removed by its writer meanwhile
    return sorted(temps)


def _pulled_objects(cache_dir: Path) -> list[Path]:
    """What killed pulls staged in the dir (regular files named as a pull names them)."""
    staging = VariantPaths(cache_dir).pulled_objects
    try:
        with os.scandir(staging) as entries:
            return sorted(Path(e.path) for e in entries if is_staged_name(e.name) and e.is_file(follow_symlinks=False))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _file_size(path: Path) -> int:
    try:
        return path.lstat().st_size
    except OSError:
        return 0


def _builds(cache_dir: Path, tag: str) -> tuple[list[Removal], list[Path]]:
    """Every unnamed build of ``tag`` (sized before anything goes), and those a reader holds now."""
    paths = VariantPaths(cache_dir, tag=tag)
    named = named_generations(paths)
    builds, leased = [], []
    for name in owned_generations(paths):
        if name not in named:
            builds.append(Removal(cache_dir / name, "leftover build", *tree_usage(cache_dir / name)))
            if lease_held(paths, name):
                leased.append(cache_dir / name)
    builds += [Removal(path, "retired build", *(tree_usage(path) if path.is_dir() else (1, _file_size(path))))
               for path in retired_debris(paths)]
    return builds, leased


def _clean_dir(cache_dir: Path, report: CleanReport, invalidate: bool) -> None:
    """Find what may go (one list for a dry run and a real one), then remove it. A temp file inside
    a build that goes is counted with the build, once."""
    builds = {tag: _builds(cache_dir, tag) for tag in sorted(recorded_tags(cache_dir))}
    doomed = [b.path for removals, leased in builds.values() for b in removals if b.path not in leased]
    files = []
    for temp in _temps(cache_dir):
        if any(build in temp.parents for build in doomed):
            continue
        if temp_writer_alive(temp):
            report.kept_live.append(temp)
        else:
            files.append(Removal(temp, "temp file", 1, _file_size(temp)))
    files += [Removal(p, "pulled object", 1, _file_size(p)) for p in _pulled_objects(cache_dir)]
    if invalidate:
        files += [Removal(p, "marker", 1, _file_size(p)) for p in sorted(cache_dir.iterdir()) if is_marker_name(p.name)]
    if report.dry_run:
        report.removals += files
    for removal in [] if report.dry_run else files:
        try:
            removal.path.unlink()
            report.removals.append(removal)
        except FileNotFoundError:
            pass  # its writer published or removed it meanwhile
        except OSError as error:
            report.errors.append((removal.path, error.strerror or str(error)))
    if not report.dry_run:
        with contextlib.suppress(OSError):  # empty once its objects went (a user's file in it keeps it)
            VariantPaths(cache_dir).pulled_objects.rmdir()
    for tag, (removals, leased) in builds.items():
        if report.dry_run:
            report.removals += [b for b in removals if b.path not in leased]
            report.leased += leased
            continue
        retired = retire_unnamed(VariantPaths(cache_dir, tag=tag))
        gone = {cache_dir / name for name in retired.retired}
        report.removals += [b for b in removals if b.path in gone or (b.kind == "retired build" and not b.path.exists())]
        report.leased += [cache_dir / name for name in retired.leased]


def clean_cache_tree(root: Path, *, invalidate: bool = False, dry_run: bool = False) -> CleanReport:
    """Remove (``dry_run``: only list) what killed writers and failed builds left under ``root``."""
    report = CleanReport(cache_dirs=list(iter_variant_dirs(root)), dry_run=dry_run)
    for cache_dir in report.cache_dirs:
        with build_lock(VariantPaths(cache_dir), blocking=False, create=False) as lock:
            if not lock.held:
                if lock.busy:
                    report.busy.append(cache_dir)
                else:
                    report.errors.append((cache_dir, lock.why))
                continue
            _clean_dir(cache_dir, report, invalidate)
    return report
