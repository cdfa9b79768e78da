# SPDX-License-Identifier: Apache-2.0
"""``tt-cache clean``: remove what killed writers of this project left behind, and nothing else.

Three conditions, all required, before a file is deleted: it sits inside a weight-cache dir
(one holding a completion marker or a build lock, or a ``mesh_<r>x<c>`` dir), its name is
exactly a temp name made by :func:`models.common.fileio.unique_temp_path`, and
:func:`models.common.fileio.temp_writer_alive` says its writer is gone (a lock the writer holds,
so it works across PID namespaces). A user's ``.zshrc.tmp.orig`` next to a cache survives.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.common.fileio import is_temp_path, temp_writer_alive
from models.common.marker import BUILD_LOCK
from models.seeding.scan import is_marker_name

MESH_DIR = re.compile(r"mesh_\d+x\d+(-layers\d+)?")


@dataclass
class CleanReport:
    cache_dirs: list[Path] = field(default_factory=list)
    removed: list[Path] = field(default_factory=list)
    kept_live: list[Path] = field(default_factory=list)
    errors: list[tuple[Path, str]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"cache_dirs": [str(p) for p in self.cache_dirs], "removed": [str(p) for p in self.removed],
                "kept_live": [str(p) for p in self.kept_live],
                "errors": [{"path": str(p), "error": e} for p, e in self.errors]}


def is_cache_dir(directory: Path, names: list[str]) -> bool:
    return (MESH_DIR.fullmatch(directory.name) is not None or BUILD_LOCK in names
            or any(is_marker_name(name) for name in names))


def find_cache_dirs_to_clean(root: Path) -> list[Path]:
    """Outermost cache dirs under ``root`` (a cache dir's own subdirs are part of it)."""
    found: list[Path] = []
    for directory, subdirs, names in os.walk(root):
        if is_cache_dir(Path(directory), names):
            found.append(Path(directory))
            subdirs.clear()
    return found


def _debris(cache_dir: Path) -> list[Path]:
    temps = []
    for directory, _, names in os.walk(cache_dir):
        for name in names:
            path = Path(directory, name)
            if is_temp_path(path) and stat.S_ISREG(path.lstat().st_mode):
                temps.append(path)
    return sorted(temps)


def clean_cache_tree(root: Path, *, invalidate: bool = False) -> CleanReport:
    report = CleanReport(cache_dirs=find_cache_dirs_to_clean(root))
    for cache_dir in report.cache_dirs:
        targets = []
        for temp in _debris(cache_dir):
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
    return report
