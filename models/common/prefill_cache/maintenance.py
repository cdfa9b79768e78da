# SPDX-License-Identifier: Apache-2.0
"""Whole-root views of a prefill cache: list, deep-verify and collect garbage. Torch-free, so
the ``tt-cache prefill`` commands start in milliseconds.

Liveness of a writer is decided by its lock: a store holds ``.writer.lock`` (``flock``) from its
first byte to its manifest, so a lock nobody holds means a dead writer, in any PID namespace.
``gc`` removes the debris of dead writers (``*.partial``, temp files, ``progress.json`` and the
artifacts of objects that never got a manifest) and, with ``older_than_days``, whole objects not
used for that long. "Used" is the manifest's atime (every first lookup of a process reads it; on
a ``noatime`` mount this is the time of the store). An object directory and its lock file are
never removed: a writer waiting on that lock must keep locking the file the next writer locks.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from models.common.fileio import file_lock, fsync_dir, is_temp_path, lock_held_elsewhere
from models.common.prefill_cache.layout import (
    FROZEN_BACKBONE_AUTHORITY_SCHEMA_V1,
    FROZEN_BACKBONE_SIDECAR_SCHEMA_V1,
    LOCK_NAME,
    MANIFEST_NAME,
    PARTIAL_SUFFIX,
    PROGRESS_NAME,
    SOURCE_DIAGNOSTIC_FIELDS,
    FrozenBackboneCacheError,
    check_artifacts,
    check_manifest_header,
    expect,
    object_dirs,
    read_json_object,
    specs_of_authority,
)

DAY_S = 86_400.0


@dataclass
class ObjectInfo:
    """One object directory as ``ls`` reports it (no hashing)."""

    sha256: str
    path: str
    state: str  # "complete" | "in-flight" (live writer) | "debris" (dead writer) | "invalid"
    schema: str | None = None  # sidecar manifest schema
    legacy: bool = False  # v1 manifest or v1 (source-bound) authority
    bytes: int = 0  # every file of the object, debris included
    debris_bytes: int = 0  # partials, temps, progress, unpublished artifacts
    last_used: float | None = None  # manifest atime (or mtime if later)
    problem: str | None = None

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def _is_debris(path: Path, published: bool) -> bool:
    name = path.name
    if name == LOCK_NAME or (published and name == MANIFEST_NAME):
        return False
    if name.endswith(PARTIAL_SUFFIX) or is_temp_path(path) or name == PROGRESS_NAME:
        return True
    return not published  # artifacts of an object that never got its manifest


def _files(directory: Path) -> list[tuple[Path, os.stat_result]]:
    found = []
    for path in sorted(directory.iterdir()):
        with contextlib.suppress(FileNotFoundError):
            found.append((path, path.lstat()))
    return found


def describe(directory: Path) -> ObjectInfo:
    """What one object directory holds, from its manifest header and file sizes."""
    info = ObjectInfo(sha256=directory.name, path=str(directory), state="complete")
    manifest_path = directory / MANIFEST_NAME
    published = manifest_path.is_file()
    for path, facts in _files(directory):
        info.bytes += facts.st_size
        if _is_debris(path, published):
            info.debris_bytes += facts.st_size
    if not published:
        info.state = "in-flight" if lock_held_elsewhere(directory / LOCK_NAME) else "debris"
        return info
    facts = manifest_path.stat()
    info.last_used = max(facts.st_atime, facts.st_mtime)
    try:
        manifest, _ = read_json_object(manifest_path, "manifest")
        stored = check_manifest_header(directory, manifest)
    except FrozenBackboneCacheError as error:
        info.state, info.problem = "invalid", str(error)
        return info
    info.schema = str(manifest["schema"])
    info.legacy = (
        info.schema == FROZEN_BACKBONE_SIDECAR_SCHEMA_V1
        or stored.get("schema") == FROZEN_BACKBONE_AUTHORITY_SCHEMA_V1
        or not SOURCE_DIAGNOSTIC_FIELDS.isdisjoint(stored)
    )
    return info


def list_objects(cache_root: Path) -> list[ObjectInfo]:
    """Every object under ``cache_root``; raises FrozenBackboneCacheError when the root is not a
    readable directory."""
    try:
        return [describe(directory) for directory in object_dirs(Path(cache_root))]
    except OSError as error:
        raise FrozenBackboneCacheError(f"cannot list prefill cache {cache_root}: {error}") from error


def verify_object(directory: Path) -> None:
    """Deep-check one published object: manifest, records, sizes, every SHA-256, and a positive
    input position. Raises FrozenBackboneCacheError naming the first problem."""
    manifest, _ = read_json_object(directory / MANIFEST_NAME, "manifest")
    stored = check_manifest_header(directory, manifest)
    specs = specs_of_authority(directory, stored)
    check_artifacts(directory, manifest, specs)
    raw = (directory / specs[2].file_name).read_bytes()
    expect(int.from_bytes(raw, "little", signed=True) > 0, directory, "input position is not positive")


@dataclass
class VerifyResult:
    checked: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)  # (object dir, problem)


def verify(cache_root: Path) -> VerifyResult:
    """Re-hash every published object under ``cache_root`` (objects still being written are
    skipped: they are not objects yet)."""
    result = VerifyResult()
    for info in list_objects(cache_root):
        if info.state in ("in-flight", "debris"):
            continue
        result.checked += 1
        try:
            verify_object(Path(info.path))
        except (FrozenBackboneCacheError, OSError) as error:
            result.failures.append((info.path, str(error)))
    return result


@dataclass
class GcResult:
    removed_files: int = 0
    removed_bytes: int = 0
    removed_objects: int = 0
    skipped_live: int = 0  # objects whose writer holds its lock


def _unlink(path: Path, result: GcResult) -> None:
    with contextlib.suppress(FileNotFoundError):
        size = path.lstat().st_size
        path.unlink()
        result.removed_files += 1
        result.removed_bytes += size


def _collect(directory: Path, older_than_s: float | None, now: float, result: GcResult) -> None:
    """gc of one object directory, with its writer lock held."""
    manifest_path = directory / MANIFEST_NAME
    published = manifest_path.is_file()
    if published and older_than_s is not None:
        facts = manifest_path.stat()
        if now - max(facts.st_atime, facts.st_mtime) > older_than_s:
            _unlink(manifest_path, result)  # retract first: from here on a lookup sees a miss
            fsync_dir(directory)
            published = False
            result.removed_objects += 1
    for path, _ in _files(directory):
        if _is_debris(path, published):
            _unlink(path, result)


def gc(cache_root: Path, *, older_than_days: float | None = None, now: float | None = None) -> GcResult:
    """Remove dead writers' debris and (with ``older_than_days``) objects unused that long."""
    if older_than_days is not None and not older_than_days >= 0:
        raise ValueError(f"older_than_days must be >= 0, got {older_than_days!r}")
    now = time.time() if now is None else now
    older_than_s = None if older_than_days is None else older_than_days * DAY_S
    result = GcResult()
    try:
        for directory in object_dirs(Path(cache_root)):
            with file_lock(directory / LOCK_NAME, blocking=False) as held:
                if not held:
                    result.skipped_live += 1
                    continue
                _collect(directory, older_than_s, now, result)
    except OSError as error:
        raise FrozenBackboneCacheError(f"cannot collect prefill cache {cache_root}: {error}") from error
    return result

