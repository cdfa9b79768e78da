# SPDX-License-Identifier: Apache-2.0
"""Whole-root views of a prefill cache: list, summarize, deep-verify and collect garbage (dead
writers' debris, objects unused for N days, least recently used objects beyond a size cap).
Torch-free, so the ``tt-cache prefill`` commands start in milliseconds.

Liveness of a writer is decided by its locks: a store holds ``.writer.lock`` (``flock``) from its
first byte to its manifest, and a producer holds ``.producer.lock`` from its miss to the stored
object, so a lock nobody holds means a dead writer, in any PID namespace. ``gc`` removes the
debris of dead writers (``*.partial``, temp files, ``progress.json`` and the artifacts of objects
that never got a manifest), with ``older_than_days`` whole objects not used for that long, and
with ``max_bytes`` the least recently used objects until the root fits (``usage``: a lookup marks
its object used). An object directory and its lock files are never removed: a producer waiting on
a lock must keep locking the file the next one locks.

For ``tt-cache``: :func:`summarize` (one root's totals and bytes per sample, for ``ls``) and
:func:`gc` (``--max-size``, ``--older-than``, ``--dry-run``). :data:`MAX_SIZE_ENV` names the
size cap of producers that store into a root (``TT_PREFILL_CACHE_MAX_SIZE=20G``).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Final

from models.common import envs
from models.common.fileio import file_lock, fsync_dir, is_temp_path, lock_held_elsewhere
from models.common.prefill_cache.layout import (
    FROZEN_BACKBONE_AUTHORITY_SCHEMA_V1,
    FROZEN_BACKBONE_SIDECAR_SCHEMA_V1,
    LOCK_NAME,
    LOCK_NAMES,
    MANIFEST_NAME,
    PARTIAL_SUFFIX,
    PRODUCER_LOCK_NAME,
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
from models.common.prefill_cache.usage import last_used

DAY_S = 86_400.0
MAX_SIZE_ENV: Final = "TT_PREFILL_CACHE_MAX_SIZE"


def max_bytes_from_env() -> int | None:
    """The size cap named by :data:`MAX_SIZE_ENV`, None when unset or empty; a ``ValueError``
    naming it when it is not a size (the table's :class:`~models.common.envs.Size`)."""
    return envs.TT_PREFILL_CACHE_MAX_SIZE


@dataclass
class ObjectInfo:
    """One object directory as ``ls`` reports it (no hashing)."""

    sha256: str
    path: str
    state: str  # "complete" | "in-flight" (live writer) | "debris" (dead writer) | "invalid"
    schema: str | None = None  # sidecar manifest schema
    legacy: bool = False  # v1 manifest or v1 (source-bound) authority
    feature_dtype: str | None = None  # the stored authority's feature dtype
    bytes: int = 0  # every file of the object, debris included
    debris_bytes: int = 0  # partials, temps, progress, unpublished artifacts
    last_used: float | None = None  # see models.common.prefill_cache.usage
    problem: str | None = None

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def _is_debris(path: Path, published: bool) -> bool:
    name = path.name
    if name in LOCK_NAMES or (published and name == MANIFEST_NAME):
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
        info.state = "in-flight" if _producing(directory) else "debris"
        return info
    info.last_used = last_used(directory, manifest_path.stat())
    try:
        manifest, _ = read_json_object(manifest_path, "manifest")
        stored = check_manifest_header(directory, manifest)
    except FrozenBackboneCacheError as error:
        info.state, info.problem = "invalid", str(error)
        return info
    info.schema = str(manifest["schema"])
    dtype = stored.get("featureDtype")
    info.feature_dtype = dtype if isinstance(dtype, str) else None
    info.legacy = (
        info.schema == FROZEN_BACKBONE_SIDECAR_SCHEMA_V1
        or stored.get("schema") == FROZEN_BACKBONE_AUTHORITY_SCHEMA_V1
        or not SOURCE_DIAGNOSTIC_FIELDS.isdisjoint(stored)
    )
    return info


def _producing(directory: Path) -> bool:
    """Whether a live writer or producer holds one of the object's locks."""
    return any(lock_held_elsewhere(directory / name) for name in (LOCK_NAME, PRODUCER_LOCK_NAME))


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
class PrefillCacheSummary:
    """One root at a glance (what ``tt-cache ls`` shows of a prefill cache)."""

    root: str
    objects: int  # complete (published) objects: one per sample (prompt)
    bytes: int  # every file under the root's objects, debris included
    object_bytes: int  # of which complete objects
    debris_bytes: int
    bytes_per_sample: float | None  # object_bytes / objects
    bytes_per_sample_by_dtype: dict[str, float]  # the same, per stored feature dtype
    legacy: int
    states: dict[str, int]
    schemas: dict[str, int]
    least_recently_used: float | None  # seconds since the epoch
    most_recently_used: float | None
    max_bytes: int | None  # the size cap: the argument, else MAX_SIZE_ENV
    over_cap: bool

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def summarize(cache_root: Path, *, max_bytes: int | None = None,
              infos: list[ObjectInfo] | None = None) -> PrefillCacheSummary:
    """Totals of one root (``infos``: its :func:`list_objects`, when the caller has them).
    Raises FrozenBackboneCacheError when the root is not a readable directory, ValueError when
    :data:`MAX_SIZE_ENV` is set to something that is not a size."""
    infos = list_objects(cache_root) if infos is None else infos
    cap = max_bytes if max_bytes is not None else max_bytes_from_env()
    complete = [info for info in infos if info.state == "complete"]
    states: dict[str, int] = {}
    schemas: dict[str, int] = {}
    for info in infos:
        states[info.state] = states.get(info.state, 0) + 1
        if info.schema:
            schemas[info.schema] = schemas.get(info.schema, 0) + 1
    by_dtype: dict[str, list[int]] = {}
    for info in complete:
        by_dtype.setdefault(info.feature_dtype or "unknown", []).append(info.bytes)
    object_bytes = sum(info.bytes for info in complete)
    total = sum(info.bytes for info in infos)
    uses = [info.last_used for info in complete if info.last_used is not None]
    return PrefillCacheSummary(
        root=str(cache_root), objects=len(complete), bytes=total, object_bytes=object_bytes,
        debris_bytes=sum(info.debris_bytes for info in infos),
        bytes_per_sample=object_bytes / len(complete) if complete else None,
        bytes_per_sample_by_dtype={dtype: sum(sizes) / len(sizes) for dtype, sizes in sorted(by_dtype.items())},
        legacy=sum(1 for info in infos if info.legacy), states=states, schemas=schemas,
        least_recently_used=min(uses, default=None), most_recently_used=max(uses, default=None),
        max_bytes=cap, over_cap=cap is not None and total > cap,
    )


@dataclass
class GcResult:
    removed_files: int = 0
    removed_bytes: int = 0
    removed_objects: int = 0  # objects retracted (unused too long, or evicted for the size cap)
    evicted_objects: int = 0  # of which evicted for the size cap, least recently used first
    skipped_live: int = 0  # objects whose writer or producer holds its lock
    bytes_before: int = 0
    bytes_after: int = 0
    dry_run: bool = False  # nothing was removed: the figures say what would have been
    removed_paths: list[str] = field(default_factory=list)  # object dirs retracted

    def to_json(self) -> dict[str, object]:
        return asdict(self)


@contextlib.contextmanager
def _quiet(directory: Path, dry_run: bool) -> Iterator[bool]:
    """Hold the object's writer lock without waiting (True when held and no producer holds its
    claim either), so no store is in it. Only the writer lock guards the files; a claimed object
    is left alone because its producer is about to store it. A dry run only asks (it must not
    create lock files), and the producer lock is never created here: a new file would change the
    directory's mtime, which is the object's last use."""
    if dry_run:
        yield not _producing(directory)
        return
    with file_lock(directory / LOCK_NAME, blocking=False) as held:
        yield held and not lock_held_elsewhere(directory / PRODUCER_LOCK_NAME)


def _unlink(path: Path, result: GcResult) -> None:
    with contextlib.suppress(FileNotFoundError):
        size = path.lstat().st_size
        if not result.dry_run:
            path.unlink()
        result.removed_files += 1
        result.removed_bytes += size


def _retract(directory: Path, result: GcResult) -> None:
    """Remove a published object, manifest first: from then on a lookup sees a miss."""
    _unlink(directory / MANIFEST_NAME, result)
    if not result.dry_run:
        fsync_dir(directory)
    result.removed_objects += 1
    result.removed_paths.append(str(directory))
    for path, _ in _files(directory):
        if path.name != MANIFEST_NAME and _is_debris(path, published=False):
            _unlink(path, result)


def _collect(info: ObjectInfo, older_than_s: float | None, now: float, result: GcResult) -> None:
    """Debris (and, unused past ``older_than_s``, the object) of one object directory, its writer
    lock held. Its last use is the one listed before the lock was taken (taking it may create the
    lock file, which moves the directory's mtime)."""
    directory = Path(info.path)
    manifest_path = directory / MANIFEST_NAME
    published = manifest_path.is_file()
    unused_s = now - (info.last_used if info.last_used is not None else now)
    if published and older_than_s is not None and unused_s > older_than_s:
        _retract(directory, result)
        return
    for path, _ in _files(directory):
        if _is_debris(path, published):
            _unlink(path, result)


def _evict(infos: list[ObjectInfo], max_bytes: int, result: GcResult) -> None:
    """Retract objects until the root holds ``max_bytes``: invalid ones first, then complete ones,
    least recently used first."""
    total = result.bytes_before - result.removed_bytes
    gone = set(result.removed_paths)
    candidates = sorted((i for i in infos if i.state in ("complete", "invalid") and i.path not in gone),
                        key=lambda info: (info.state == "complete", info.last_used or 0.0, info.path))
    for info in candidates:
        if total <= max_bytes:
            break
        directory = Path(info.path)
        with _quiet(directory, result.dry_run) as held:
            if not held or not (directory / MANIFEST_NAME).is_file():
                continue
            before = result.removed_bytes
            _retract(directory, result)
            result.evicted_objects += 1
            total -= result.removed_bytes - before


def gc(cache_root: Path, *, older_than_days: float | None = None, max_bytes: int | None = None,
       dry_run: bool = False, now: float | None = None) -> GcResult:
    """Remove dead writers' debris, objects unused ``older_than_days``, then the least recently
    used objects until the root holds at most ``max_bytes``. Objects with a live writer or
    producer are left alone. ``dry_run`` removes nothing and reports what would go."""
    if older_than_days is not None and not older_than_days >= 0:
        raise ValueError(f"older_than_days must be >= 0, got {older_than_days!r}")
    if max_bytes is not None and not max_bytes >= 0:
        raise ValueError(f"max_bytes must be >= 0, got {max_bytes!r}")
    now = time.time() if now is None else now
    older_than_s = None if older_than_days is None else older_than_days * DAY_S
    result = GcResult(dry_run=dry_run)
    try:
        infos = list_objects(Path(cache_root))
        result.bytes_before = sum(info.bytes for info in infos)
        for info in infos:
            with _quiet(Path(info.path), dry_run) as held:
                if not held:
                    result.skipped_live += 1
                    continue
                _collect(info, older_than_s, now, result)
        if max_bytes is not None:
            _evict(infos, max_bytes, result)
    except OSError as error:
        raise FrozenBackboneCacheError(f"cannot collect prefill cache {cache_root}: {error}") from error
    result.bytes_after = result.bytes_before - result.removed_bytes
    return result
