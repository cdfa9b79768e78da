# SPDX-License-Identifier: Apache-2.0
"""Find every weight-cache variant under a root and say what it is and whether it is warm.

The model of ``hf cache scan``: one pass over the tree, one row per variant (a marker file),
and a bad cache is a row with its reason, never an exception that hides the other rows.
Torch-free: reads markers and ``stat``s files only.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.common.fileio import is_temp_path
from models.common.marker import (
    WEIGHT_CACHE_MARKER,
    MarkerFormatError,
    WeightCacheMarker,
    last_used,
    marker_path,
    parse_marker,
    weight_cache_status,
)

MESH_DIR_PREFIX = "mesh_"


@dataclass(frozen=True)
class VariantInfo:
    """One variant of one cache dir, as ``ls``, ``check`` and ``gc`` see it."""

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
    def build_variant(self) -> Any:
        return None if self.marker is None else self.marker.build_variant

    def _variant_field(self, key: str) -> str:
        variant = self.build_variant
        value = variant.get(key) if isinstance(variant, dict) else None
        return str(value) if value is not None else "?"

    @property
    def family(self) -> str:
        return self._variant_field("family")

    @property
    def precision(self) -> str:
        return self._variant_field("precision")

    @property
    def model(self) -> str:
        if self.marker is None:
            return "?"
        return getattr(self.marker, "model_id", None) or self.marker.model_name

    @property
    def mesh(self) -> str:
        if self.marker is None:
            return "?"
        return "x".join(str(d) for d in _mesh_dims(self.marker.mesh_shape)) or self.marker.mesh_shape

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
            "files": len(marker.files) if marker else None,
            "size_bytes": self.size_bytes,
            "state": "warm" if self.warm else "cold",
            "reason": self.reason,
            "last_used": self.last_used,
        }


def _mesh_dims(text: str) -> tuple[int, ...]:
    """``"(1, 2)"`` as ``(1, 2)``; anything else as ``()`` (the gate then says why it is cold)."""
    try:
        return tuple(int(d) for d in text.strip("()").split(",") if d.strip())
    except ValueError:
        return ()


def is_marker_name(name: str) -> bool:
    return name.startswith(WEIGHT_CACHE_MARKER + ".") and not is_temp_path(Path(name))


def find_cache_dirs(root: Path) -> list[Path]:
    """Every directory under ``root`` (itself included) that holds at least one variant marker."""
    found = []
    for directory, _, names in os.walk(root):
        if any(is_marker_name(name) for name in names):
            found.append(Path(directory))
    return sorted(found)


def variant_markers(cache_dir: Path) -> list[Path]:
    try:
        names = os.listdir(cache_dir)
    except OSError:
        return []
    return sorted(cache_dir / name for name in names if is_marker_name(name))


def marker_stamp(marker_file: Path) -> tuple[int, int] | None:
    try:
        info = marker_file.stat()
    except OSError:
        return None
    return info.st_ino, info.st_mtime_ns


def _read_marker_file(marker_file: Path) -> tuple[WeightCacheMarker | None, str]:
    try:
        return parse_marker(marker_file.read_bytes()), ""
    except OSError as error:
        return None, f"cannot read {marker_file}: {error.strerror or error}"
    except MarkerFormatError as error:
        return None, f"{marker_file} is invalid: {error}"


def _recorded_bytes(marker_file: Path, marker: WeightCacheMarker) -> int:
    """Bytes on disk of the files a marker vouches for (what evicting the variant frees)."""
    total = _size(marker_file)
    records = marker.files + ((marker.host_sidecar,) if marker.host_sidecar else ())
    for record in records:
        total += _size(marker_file.parent / record.path)
    return total


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def identity_problem(cache_dir: Path, marker: WeightCacheMarker, marker_file: Path) -> str | None:
    """Why a parsed marker cannot be taken at its word (its variant names another file, its mesh is
    not a shape), or None."""
    try:
        if marker_path(cache_dir, marker.build_variant) != marker_file:
            return f"{marker_file.name}: its build_variant {marker.build_variant!r} belongs to another marker name"
    except (TypeError, ValueError) as error:
        return f"{marker_file.name}: unusable build_variant {marker.build_variant!r} ({error})"
    if len(_mesh_dims(marker.mesh_shape)) != 2:
        return f"{marker_file.name}: mesh_shape {marker.mesh_shape!r} is not (rows, cols)"
    return None


def variant_verdict(cache_dir: Path, marker: WeightCacheMarker, marker_file: Path) -> tuple[bool, str]:
    """The gate's verdict on a variant, asked with the marker's own identity (stat only)."""
    dims = _mesh_dims(marker.mesh_shape)
    status = weight_cache_status(
        cache_dir,
        model_name=marker.model_name,
        n_layers=marker.n_layers,
        mesh_shape=dims,
        components=marker.components,
        build_variant=marker.build_variant,
        force_env=None,
    )
    return status.warm, "complete" if status.warm else status.reason


def scan_variant(cache_dir: Path, marker_file: Path) -> VariantInfo:
    """Never raises: an unreadable or invalid marker is a cold row naming the file and the problem."""
    stamp = marker_stamp(marker_file)
    marker, problem = _read_marker_file(marker_file)
    if marker is None:
        return VariantInfo(cache_dir, marker_file, None, False, problem, _size(marker_file), None, stamp)
    size = _recorded_bytes(marker_file, marker)
    problem = identity_problem(cache_dir, marker, marker_file)
    if problem:
        return VariantInfo(cache_dir, marker_file, marker, False, problem, size, None, stamp)
    warm, reason = variant_verdict(cache_dir, marker, marker_file)
    used = last_used(cache_dir, marker.build_variant)
    return VariantInfo(cache_dir, marker_file, marker, warm, reason, size, used, stamp, trusted=True)


def scan_cache_dir(cache_dir: Path) -> list[VariantInfo]:
    return [scan_variant(cache_dir, marker_file) for marker_file in variant_markers(cache_dir)]


def scan_root(root: Path) -> Iterator[VariantInfo]:
    for cache_dir in find_cache_dirs(root):
        yield from scan_cache_dir(cache_dir)
