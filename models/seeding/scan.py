# SPDX-License-Identifier: Apache-2.0
"""Find every weight-cache variant under a root and say what it is and whether it is warm.

The model of ``hf cache scan``: one pass over the tree, one row per variant (a marker file),
and a bad cache is a row with its reason, never an exception that hides the other rows.
Torch-free: reads markers and ``stat``s files (the gate re-hashes only a file that changed).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.common.fileio import is_temp_path
from models.common.marker import (
    WEIGHT_CACHE_MARKER,
    WeightCacheMarker,
    iter_markers,
    last_used,
    marker_path,
    marker_status,
)


@dataclass(frozen=True)
class VariantInfo:
    """One variant of one cache dir, as ``ls``, ``check``, ``verify`` and ``gc`` see it."""

    cache_dir: Path
    marker_file: Path
    marker: WeightCacheMarker | None
    warm: bool
    reason: str
    size_bytes: int
    last_used: float | None
    marker_stamp: tuple[int, int] | None = None  # (inode, mtime_ns) when scanned: gc evicts only that marker
    trusted: bool = False  # the marker parses and names itself consistently: gc may act on what it lists

    @property
    def model(self) -> str:
        return "?" if self.marker is None else self.marker.model_id

    @property
    def family(self) -> str:
        return (self.marker and self.marker.family) or "?"

    @property
    def precision(self) -> str:
        return (self.marker and self.marker.precision) or "?"

    @property
    def mesh(self) -> str:
        if self.marker is None:
            return "?"
        return "x".join(d.strip() for d in self.marker.mesh_shape.strip("()").split(",") if d.strip())

    def as_json(self) -> dict[str, Any]:
        marker = self.marker
        return {
            "cache_dir": str(self.cache_dir),
            "marker": self.marker_file.name,
            "model": self.model,
            "family": self.family,
            "precision": self.precision,
            "mesh": self.mesh,
            "components": list(marker.components) if marker else [],
            "n_layers": marker.n_layers if marker else None,
            "content_id": marker.content_id if marker else None,
            "files": len(marker.files) if marker else None,
            "size_bytes": self.size_bytes,
            "state": "warm" if self.warm else "cold",
            "reason": self.reason,
            "last_used": self.last_used,
        }


def is_marker_name(name: str) -> bool:
    return name.startswith(WEIGHT_CACHE_MARKER + ".") and not is_temp_path(Path(name))


def find_cache_dirs(root: Path) -> list[Path]:
    """Every directory under ``root`` (itself included) that holds at least one variant marker."""
    found = []
    for directory, _, names in os.walk(root):
        if any(is_marker_name(name) for name in names):
            found.append(Path(directory))
    return sorted(found)


def marker_stamp(marker_file: Path) -> tuple[int, int] | None:
    try:
        info = marker_file.stat()
    except OSError:
        return None
    return info.st_ino, info.st_mtime_ns


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _recorded_bytes(marker_file: Path, marker: WeightCacheMarker) -> int:
    """Bytes on disk of the files a marker vouches for (what evicting the variant frees)."""
    return _size(marker_file) + sum(_size(marker_file.parent / record.path) for record in marker.all_files())


def scan_variant(cache_dir: Path, marker_file: Path, marker: WeightCacheMarker | None, problem: str) -> VariantInfo:
    """Never raises: an unreadable or invalid marker is a cold row naming the file and the problem."""
    stamp = marker_stamp(marker_file)
    if marker is None:
        return VariantInfo(cache_dir, marker_file, None, False, problem, _size(marker_file), None, stamp)
    size = _recorded_bytes(marker_file, marker)
    if marker_path(cache_dir, marker.build_variant) != marker_file:
        reason = f"{marker_file} is invalid: its build_variant {marker.build_variant!r} belongs to another marker"
        return VariantInfo(cache_dir, marker_file, marker, False, reason, size, None, stamp)
    status = marker_status(cache_dir, marker)
    used = last_used(cache_dir, marker.build_variant)
    return VariantInfo(cache_dir, marker_file, marker, status.warm, "complete" if status.warm else status.reason,
                       size, used, stamp, trusted=True)


def scan_cache_dir(cache_dir: Path) -> list[VariantInfo]:
    return [scan_variant(cache_dir, path, marker, problem) for path, marker, problem in iter_markers(cache_dir)]


def scan_root(root: Path) -> list[VariantInfo]:
    return [variant for cache_dir in find_cache_dirs(root) for variant in scan_cache_dir(cache_dir)]
