# SPDX-License-Identifier: Apache-2.0
"""``tt-cache clean``: remove what killed writers of this project left behind, and nothing else.

Inside each cache dir under the root (one holding a marker or a build lock, or a ``mesh_<r>x<c>``
dir), and only while clean holds that dir's build lock (a live builder's files are never judged):

* a temp file goes when its name is exactly one :func:`models.common.fileio.unique_temp_path`
  makes, it is a regular file, and :func:`models.common.fileio.temp_writer_alive` says its writer
  is gone (a lock the writer holds, so it works across PID namespaces);
* a build generation goes when its record proves a build of this project made it, no marker names
  it and no reader holds its lease (:func:`models.common.weight_cache.generations.retire_unnamed`).

A user's ``.zshrc.tmp.orig`` or ``gemma-2b/`` next to a cache survives. Files that vanish while
clean looks (a writer publishing its temp) are simply gone, not an error.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.common.fileio import is_temp_path, temp_writer_alive
from models.common.weight_cache.generations import build_lock, read_record, retire_unnamed
from models.common.weight_cache.layout import VariantPaths, is_generation_name, is_marker_name, iter_variant_dirs


@dataclass
class CleanReport:
    cache_dirs: list[Path] = field(default_factory=list)
    removed: list[Path] = field(default_factory=list)
    kept_live: list[Path] = field(default_factory=list)
    busy: list[Path] = field(default_factory=list)  # a builder holds the dir's lock: looked at next time
    errors: list[tuple[Path, str]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"cache_dirs": [str(p) for p in self.cache_dirs], "removed": [str(p) for p in self.removed],
                "kept_live": [str(p) for p in self.kept_live], "busy": [str(p) for p in self.busy],
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


def _generation_tags(cache_dir: Path) -> set[str]:
    tags = set()
    try:
        names = os.listdir(cache_dir)
    except OSError:
        return tags
    for name in names:
        if is_generation_name(name) and (record := read_record(cache_dir / name)) is not None:
            tags.add(record.variant)
    return tags


def _clean_dir(cache_dir: Path, report: CleanReport, invalidate: bool) -> None:
    targets = []
    for temp in _temps(cache_dir):
        (report.kept_live if temp_writer_alive(temp) else targets).append(temp)
    if invalidate:
        targets += sorted(p for p in cache_dir.iterdir() if is_marker_name(p.name))
    for path in targets:
        try:
            path.unlink()
            report.removed.append(path)
        except FileNotFoundError:
            pass  # its writer published or removed it meanwhile
        except OSError as error:
            report.errors.append((path, error.strerror or str(error)))
    for tag in sorted(_generation_tags(cache_dir)):
        retired = retire_unnamed(VariantPaths(cache_dir, tag=tag))
        report.removed += [cache_dir / name for name in retired.retired]


def clean_cache_tree(root: Path, *, invalidate: bool = False) -> CleanReport:
    report = CleanReport(cache_dirs=list(iter_variant_dirs(root)))
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
