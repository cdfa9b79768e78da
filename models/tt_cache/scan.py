# SPDX-License-Identifier: Apache-2.0
"""Find every weight-cache variant under a root and say what it is and whether it is warm.

The model of ``hf cache scan``: one pass over the tree, one row per variant (a marker file), and a
bad cache is a row with its reason, never an exception that hides the other rows. Builds that no
marker names (a failed or killed build, a replaced one a reader still held) are rows too, so their
bytes are never invisible. Torch-free: reads markers and records and ``stat``s files (the gate
re-hashes only a file that changed).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.common.weight_cache.gate import marker_status
from models.common.weight_cache.generations import interrupted_work, named_generations, read_record, recorded_tags
from models.common.weight_cache.layout import VariantPaths, is_generation_name, iter_variant_dirs, tree_bytes
from models.common.weight_cache.marker import WeightCacheMarker, iter_markers
from models.common.weight_cache.usage import last_used


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
    def paths(self) -> VariantPaths:
        return VariantPaths(self.cache_dir, self.marker.build_variant if self.marker else None)

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
            "ttnn_version": marker.ttnn_version if marker else None,
            "tensorbin_format": marker.tensorbin_format if marker else None,
            "n_layers": marker.n_layers if marker else None,
            "content_id": marker.content_id if marker else None,
            "files": len(marker.files) if marker else None,
            "size_bytes": self.size_bytes,
            "state": "warm" if self.warm else "cold",
            "reason": self.reason,
            "last_used": self.last_used,
            "build_seconds": marker.build_seconds if marker else None,
        }


@dataclass(frozen=True)
class LeftoverBuild:
    """A generation this project's build made (its record says so) that no marker names."""

    cache_dir: Path
    name: str
    variant_tag: str
    size_bytes: int
    created_ns: int
    host: str
    pid: int

    @property
    def paths(self) -> VariantPaths:
        return VariantPaths(self.cache_dir, tag=self.variant_tag)

    def as_json(self) -> dict[str, Any]:
        return {"cache_dir": str(self.cache_dir), "generation": self.name, "variant_tag": self.variant_tag,
                "size_bytes": self.size_bytes, "created_ns": self.created_ns, "host": self.host, "pid": self.pid}


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
    """Bytes on disk of what evicting the variant frees: the marker, its generation (everything in
    it) and the files outside one its build wrote (the seed API's:
    :meth:`~models.common.weight_cache.marker.WeightCacheMarker.evictable_files`)."""
    cache_dir = marker_file.parent
    inside = tree_bytes(cache_dir / marker.generation) if marker.generation else 0
    return _size(marker_file) + inside + sum(_size(cache_dir / record.path) for record in marker.evictable_files())


def scan_variant(cache_dir: Path, marker_file: Path, marker: WeightCacheMarker | None, problem: str) -> VariantInfo:
    """Never raises: an unreadable or invalid marker is a cold row naming the file and the problem."""
    stamp = marker_stamp(marker_file)
    if marker is None:
        return VariantInfo(cache_dir, marker_file, None, False, problem, _size(marker_file), None, stamp)
    size = _recorded_bytes(marker_file, marker)
    paths = VariantPaths(cache_dir, marker.build_variant)
    if paths.marker != marker_file:
        reason = f"{marker_file} is invalid: its build_variant {marker.build_variant!r} belongs to another marker"
        return VariantInfo(cache_dir, marker_file, marker, False, reason, size, None, stamp)
    status = marker_status(paths, marker)
    return VariantInfo(cache_dir, marker_file, marker, status.warm, "complete" if status.warm else status.reason,
                       size, last_used(paths), stamp, trusted=True)


def scan_cache_dir(cache_dir: Path) -> list[VariantInfo]:
    return [scan_variant(cache_dir, path, marker, problem) for path, marker, problem in iter_markers(cache_dir)]


def scan_root(root: Path) -> list[VariantInfo]:
    return [variant for cache_dir in iter_variant_dirs(root) for variant in scan_cache_dir(cache_dir)]


def scan_leftovers(root: Path) -> list[LeftoverBuild]:
    """Every generation under ``root`` with this project's record that no marker names."""
    leftovers = []
    for cache_dir in iter_variant_dirs(root):
        named = None
        try:
            names = sorted(os.listdir(cache_dir))
        except OSError:
            continue
        for name in names:
            if not is_generation_name(name):
                continue
            record = read_record(cache_dir / name)
            if record is None:
                continue
            named = named_generations(VariantPaths(cache_dir)) if named is None else named
            if name not in named:
                leftovers.append(LeftoverBuild(cache_dir, name, record.variant, tree_bytes(cache_dir / name),
                                               record.created_ns, record.host, record.pid))
        for tag in sorted(recorded_tags(cache_dir)):  # killed makings and retirements
            for path, record in interrupted_work(VariantPaths(cache_dir, tag=tag)):
                size = tree_bytes(path) if path.is_dir() and not path.is_symlink() else 0
                leftovers.append(LeftoverBuild(cache_dir, path.name, tag, size, record.created_ns, record.host,
                                               record.pid))
    return leftovers
