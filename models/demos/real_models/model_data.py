# SPDX-License-Identifier: Apache-2.0
"""What ``prepare`` left on disk, and removing it: ``tt-cache ls`` and ``tt-cache clean --model-data``.

Only what is provably this project's is listed as removable, and only that is ever deleted:

* a **snapshot** ``<root>/hub/models--<org>--<name>/snapshots/<rev>/`` of a known model: a real
  directory (no symlink) holding a ``.prepared.json`` that names that repo and that revision. Its
  removal unlinks the files the record lists and the record itself (regular files reached without
  following a symlink), then ``rmdir``s what is left empty: a user's file in it survives, and so
  does its directory. ``refs/main`` goes (and is counted) only while it names the removed revision.
* **debris** of a killed preparer: a temp dir (:func:`models.common.fileio.is_temp_path`) in a
  known model's ``snapshots/``. Preparers hold the model's prepare lock for as long as they work,
  so with that lock held every such dir is a dead preparer's.
* an **assembled GGUF** ``$TT_GGUF_CACHE/<model>/<gguf file>`` of a known split model: a regular
  file with the recorded name and size (re-assembled from the installed packages on demand).

Anything else under the root (a hub download, a user's folder, a snapshot without a record) is
reported as not ours and left alone. Each model's removals run under its prepare lock (and its
GGUF's assembler lock for the GGUF), taken without waiting: a model being prepared is skipped, never
undercut, and a snapshot is checked again under the lock. The GGUF cache is shared by every model
root: a preparer of another root that assembled it before the removal fails to read it and is run
again (it re-assembles).

Which snapshots a weight cache needs is decided by the caller (``needed``): the weight cache keys
its variants by the checkpoint's content id, and :meth:`Snapshot.content_id` computes that id from
the digests the completion record holds, by the weight cache's own rule (torch-free, no re-hash).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.common.fileio import file_lock, is_temp_path, unlink_beneath
from models.common.weight_cache.layout import tree_usage
from models.demos.real_models.known import KNOWN_MODELS, KnownModel
from models.demos.real_models.prepare import (
    MANIFEST_NAME,
    lock_path,
    read_manifest,
    read_ref,
    repo_cache_dir,
    snapshot_is_complete,
)
from models.demos.real_models.source import gguf_cache_dir


@dataclass(frozen=True)
class Snapshot:
    model: KnownModel
    path: Path
    files: int
    size_bytes: int
    complete: bool  # the record exists and every file has its recorded size
    current: bool  # refs/main names it
    digests: Mapping[str, str] = field(repr=False, default_factory=dict)  # file name -> sha256, as recorded

    @property
    def revision(self) -> str:
        return self.path.name

    @property
    def content_id(self) -> str | None:
        """The weight cache's content id of these weights (``models.common.weight_cache.identity``):
        the weights' digests from the record, config.json's by the weight cache's own rule; None
        when a weight file it hashes is not recorded or config.json cannot be read."""
        from models.common.checkpoint import CONFIG_FILE, CheckpointError, checkpoint_files
        from models.common.weight_cache.identity import config_sha256, content_id_of

        try:
            names = checkpoint_files(self.path).identity_files
            digests = {CONFIG_FILE: config_sha256(self.path)}
        except CheckpointError:
            return None
        if not all(name in self.digests for name in names if name != CONFIG_FILE):
            return None
        return content_id_of(names, {**self.digests, **digests})

    def as_json(self) -> dict[str, Any]:
        return {"kind": "snapshot", "model": self.model.name, "repo_id": self.model.repo_id, "revision": self.revision,
                "path": str(self.path), "files": self.files, "size_bytes": self.size_bytes, "complete": self.complete,
                "current": self.current}


@dataclass(frozen=True)
class Entry:
    """Debris of a killed preparer, or an assembled GGUF."""

    kind: str  # "unfinished snapshot" or "assembled gguf"
    model: KnownModel
    path: Path
    files: int
    size_bytes: int

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "model": self.model.name, "path": str(self.path), "files": self.files,
                "size_bytes": self.size_bytes}


@dataclass
class ModelData:
    root: Path
    snapshots: list[Snapshot] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)
    foreign: list[Path] = field(default_factory=list)  # under the hub dir, not provably ours: never touched

    @property
    def size_bytes(self) -> int:
        return sum(s.size_bytes for s in self.snapshots) + sum(e.size_bytes for e in self.entries)

    def as_json(self) -> dict[str, Any]:
        return {"root": str(self.root), "size_bytes": self.size_bytes, "snapshots": [s.as_json() for s in self.snapshots],
                "entries": [e.as_json() for e in self.entries], "foreign": [str(p) for p in self.foreign]}


def _real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _real_file(path: Path) -> os.stat_result | None:
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return info if stat.S_ISREG(info.st_mode) else None


def _recorded_files(snapshot: Path, manifest: dict[str, Any]) -> list[str]:
    """The record's file names that are plain names of regular files in the snapshot, and the record."""
    names = [name for name in manifest["files"] if isinstance(name, str) and "/" not in name and name not in ("", ".", "..")]
    return [name for name in [*names, MANIFEST_NAME] if _real_file(snapshot / name) is not None]


def _snapshot(model: KnownModel, path: Path, current: str | None) -> Snapshot | None:
    """The snapshot at ``path`` if its record proves it is ours, else None."""
    if not _real_dir(path):
        return None
    manifest = read_manifest(path)
    if manifest is None or manifest.get("repo_id") != model.repo_id or manifest.get("revision") != path.name:
        return None
    names = _recorded_files(path, manifest)
    size = sum(_real_file(path / name).st_size for name in names)  # type: ignore[union-attr]
    digests = {name: entry["sha256"] for name, entry in manifest["files"].items()
               if isinstance(entry, dict) and isinstance(entry.get("sha256"), str)}
    return Snapshot(model, path, len(names), size, snapshot_is_complete(path), current == path.name, digests)


def _models_by_cache_name() -> dict[str, KnownModel]:
    return {model.cache_name: model for model in KNOWN_MODELS.values()}


def scan_model_data(root: Path) -> ModelData:
    """Every snapshot, preparer's debris and assembled GGUF of the known models (nothing is changed)."""
    data = ModelData(root)
    hub = root / "hub"
    known = _models_by_cache_name()
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir(hub)):
            model = known.get(name)
            if model is None:
                if name != ".locks":
                    data.foreign.append(hub / name)
                continue
            snapshots = repo_cache_dir(root, model) / "snapshots"
            if not _real_dir(repo_cache_dir(root, model)) or not _real_dir(snapshots):
                data.foreign.append(hub / name)
                continue
            current = read_ref(repo_cache_dir(root, model))
            for entry in sorted(os.listdir(snapshots)):
                path = snapshots / entry
                if is_temp_path(path) and _real_dir(path):
                    data.entries.append(Entry("unfinished snapshot", model, path, *tree_usage(path)))
                elif (snapshot := _snapshot(model, path, current)) is not None:
                    data.snapshots.append(snapshot)
                else:
                    data.foreign.append(path)
    data.entries += _assembled_ggufs()
    return data


def _assembled_ggufs() -> list[Entry]:
    found = []
    for model in KNOWN_MODELS.values():
        path = gguf_cache_dir() / model.name / model.gguf_file
        info = _real_file(path)
        if len(model.parts) > 1 and _real_dir(path.parent) and info is not None and info.st_size == model.size:
            found.append(Entry("assembled gguf", model, path, 1, info.st_size))
    return found


@dataclass
class Removal:
    """What ``remove_model_data`` removed (a dry run: would remove), kept and skipped."""

    removed: list[Snapshot | Entry] = field(default_factory=list)
    kept: list[tuple[Path, str]] = field(default_factory=list)  # needed, or asked to keep: on purpose
    skipped: list[tuple[Path, str]] = field(default_factory=list)  # busy, or changed since the scan: try again
    left: list[tuple[Path, str]] = field(default_factory=list)  # removed, but its dir stays (a user's files in it)
    removed_files: int = 0
    removed_bytes: int = 0

    def as_json(self) -> dict[str, Any]:
        return {"removed": [r.as_json() for r in self.removed], "removed_files": self.removed_files,
                "removed_bytes": self.removed_bytes, "kept": [{"path": str(p), "why": w} for p, w in self.kept],
                "skipped": [{"path": str(p), "why": w} for p, w in self.skipped],
                "left": [{"path": str(p), "why": w} for p, w in self.left]}


def _locks_of(root: Path, item: Snapshot | Entry) -> list[Path]:
    """The locks its writers hold: the model's prepare lock (a preparer reads the GGUF while it
    holds it), and the assembler's for a GGUF."""
    locks = [lock_path(root, item.model)]
    if isinstance(item, Entry) and item.kind == "assembled gguf":
        locks.append(item.path.with_name(item.path.name + ".lock"))
    return locks


@contextlib.contextmanager
def _held(lock: Path, *, create: bool) -> Iterator[bool]:
    """The lock without waiting; False when a preparer (or assembler) holds it. A dry run creates
    no lock file: where there is none, nobody holds it."""
    if not create and not lock.exists() or not lock.parent.is_dir():
        yield True  # nobody ever prepared here through this root: no preparer holds it
        return
    with file_lock(lock, blocking=False) as held:
        yield held


def _ref_usage(snapshot: Snapshot) -> tuple[int, int]:
    """(1, its bytes) when ``refs/main`` is a regular file naming this revision (it goes with it), else (0, 0)."""
    ref = snapshot.path.parent.parent / "refs" / "main"
    info = _real_file(ref)
    if info is None or not _real_dir(ref.parent) or read_ref(snapshot.path.parent.parent) != snapshot.revision:
        return 0, 0
    return 1, info.st_size


def _remove_snapshot(snapshot: Snapshot) -> tuple[int, int, str | None]:
    """Unlink the recorded files (the record last), rmdir what is left empty, and drop ``refs/main``
    if it names this revision. Returns (files, bytes, why something stayed or None)."""
    manifest = read_manifest(snapshot.path) or {"files": {}}
    files = size = 0
    for name in [n for n in _recorded_files(snapshot.path, manifest) if n != MANIFEST_NAME] + [MANIFEST_NAME]:
        info = _real_file(snapshot.path / name)
        if info is not None and unlink_beneath(snapshot.path, name):
            files, size = files + 1, size + info.st_size
    repo_dir = snapshot.path.parent.parent
    ref_files, ref_bytes = _ref_usage(snapshot)
    if ref_files and unlink_beneath(repo_dir, "refs/main"):
        files, size = files + ref_files, size + ref_bytes
        with contextlib.suppress(OSError):
            (repo_dir / "refs").rmdir()
    try:
        snapshot.path.rmdir()
    except OSError:
        return files, size, "files that are not its record's stay in it, and so does the directory"
    for directory in (repo_dir / "snapshots", repo_dir):
        with contextlib.suppress(OSError):
            directory.rmdir()
    return files, size, None


def remove_model_data(data: ModelData, *, needed: Mapping[Path, str], models: set[str] | None = None,
                      dry_run: bool = False) -> Removal:
    """Remove every snapshot not in ``needed`` (path -> why it is kept), every preparer's debris and
    every assembled GGUF, of ``models`` (default: all); ``dry_run`` only says what would go."""
    result = Removal()
    chosen = [item for item in [*data.snapshots, *data.entries] if models is None or item.model.name in models]
    for item in chosen:
        if isinstance(item, Snapshot) and item.path in needed:
            result.kept.append((item.path, needed[item.path]))
            continue
        with contextlib.ExitStack() as stack:
            held = all([stack.enter_context(_held(lock, create=not dry_run)) for lock in _locks_of(data.root, item)])
            if not held:
                result.skipped.append((item.path, "a preparer holds its lock: try again later"))
                continue
            if dry_run:
                extra = _ref_usage(item) if isinstance(item, Snapshot) else (0, 0)
                files, size, why = item.files + extra[0], item.size_bytes + extra[1], None
            elif isinstance(item, Snapshot):
                fresh = _snapshot(item.model, item.path, read_ref(item.path.parent.parent))
                files, size, why = _remove_snapshot(fresh) if fresh is not None else (0, 0, "it changed since the scan")
            elif item.kind == "assembled gguf":
                info = _real_file(item.path)
                gone = info is not None and info.st_size == item.model.size and unlink_beneath(item.path.parent,
                                                                                              item.path.name)
                files, size, why = (1, info.st_size, None) if gone else (0, 0, "it changed since the scan")
            else:
                files, size = tree_usage(item.path)
                if _real_dir(item.path):
                    shutil.rmtree(item.path, ignore_errors=True)
                why = "some of it could not be removed" if item.path.exists() else None
        result.removed_files += files
        result.removed_bytes += size
        if isinstance(item, Snapshot) and files:
            result.removed.append(item)
            if why is not None:
                result.left.append((item.path, why))
        elif why is None:
            result.removed.append(item)
        else:
            result.skipped.append((item.path, why))
    return result
