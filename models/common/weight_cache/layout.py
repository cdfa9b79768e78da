# SPDX-License-Identifier: Apache-2.0
"""Every name and path of a weight cache, in one place; no torch, no ttnn, no I/O but listing.

A cache root (``$TT_CACHE_PATH``)::

    <root>/
        <name>--<content id[:16]>/                  one checkpoint's weights (the name is only for people:
            <precision>/mesh_<r>x<c>[-layers<n>]/   caches are found by content id) / one variant dir
                .weights_complete.<tag>             completion marker of one build variant
                .stamps.<tag>.json                  stamps of files re-verified since the build
                .last_used.<tag>                    its mtime is the last warm start (LRU eviction)
                .model_ids.<tag>.json               other model ids whose weights this build also is
                .build.lock                         held by the one builder of this dir
                .pulled-objects/<digest>[.part]     objects a pull from a shared store fetched and verified,
                                                    waiting for its generation (a killed pull resumes here)
                g<time>-<token>/                    one build generation, written by one build
                    .generation                     its ownership record (variant tag, build id)
                    .readers                        the reader lease
                    layers.0/...tensorbin, ...
                    .host_weights[.<tag>].safetensors
                .retired-g<time>-<token>-<x>/       a generation being deleted
                .generation.<g... or .retired-...>  the record of a generation being made or deleted,
                                                    kept beside it while its own may be missing
        .stamps/checkpoints/<name>--<key>.json      checkpoint digests, stamped, per checkpoint location
        .stamps/.checkpoints.lock                   held to write one of those and prune them (a use: shared)
        prefill/                                    the prefill-feature cache (:mod:`models.common.prefill_cache`)

**What a variant is** (:mod:`~models.common.weight_cache.variant`, its one home): anything that changes
the bytes of a cached file, or how they are read, is part of the variant: the build variant (family,
precision, layout version), the mesh shape, the ttnn version and the tensorbin format it writes. The
marker records all of it and the gate compares all of it; a cache of another identity is cold with
the difference in words, never loaded. ``<tag>`` is a short digest of the build variant, so variants
sharing a directory never touch each other's marker, stamps or generations, and a build under
another ttnn replaces its variant's files where they are. Callers of the seed API
(``mark_weight_cache_complete``) may keep tensorbins in a variant dir itself (at its top, in
``layers.<n>/`` or in folders of their own) instead of in a generation; the marker records where
every file is.

Per-user state that cannot go into a read-only cache (stamps, locks, use records) lives under
:data:`models.common.envs.TT_USER_STATE`, keyed by the absolute path of what it stands for.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from models.common import envs
from models.common.fileio import is_temp_path
from models.common.weight_cache.variant import (  # noqa: F401 - the variant's names, re-exported here
    canonical_variant,
    normalize_mesh_shape,
    variant_tag,
    variant_unverifiable,
)

WEIGHT_CACHE_MARKER = ".weights_complete"
HOST_WEIGHTS_SIDECAR = ".host_weights.safetensors"
TENSORBIN_SUFFIX = ".tensorbin"
STAMPS_PREFIX = ".stamps"
LAST_USED_PREFIX = ".last_used"
MODEL_IDS_PREFIX = ".model_ids"
BUILD_LOCK = ".build.lock"
PULLED_OBJECTS = ".pulled-objects"
GENERATION_PREFIX = "g"
GENERATION_RECORD = ".generation"
PENDING_RECORD_PREFIX = f"{GENERATION_RECORD}."
READERS_LEASE = ".readers"
RETIRED_PREFIX = ".retired-"
CHECKPOINT_STAMPS = PurePosixPath(".stamps", "checkpoints")
PREFILL_DIR = "prefill"
MAX_SHARED_STAMP_INDEXES = 16  # other locations' checkpoint stamps a miss consults
CONTENT_PREFIX_HEX = 16  # hex digits of the content id in a model dir's name
PRECISIONS = ("bfloat16", "bfloat8_b", "bfloat4_b", "float32")  # ttnn dtypes a cache stores weights in

_GENERATION_NAME = re.compile(r"g[0-9a-f]{1,20}-[0-9a-f]{6}")
_MESH_DIR = re.compile(r"mesh_\d+x\d+(-layers\d+)?")
_LOCATION_INDEX_NAME = re.compile(r"[^/]+--([0-9a-f]{16})\.json")
_LAYER_DIR = re.compile(r"layers\.\d+")  # a loader's per-layer directory (``layers.3/wq_...tensorbin``)


# --------------------------------------------------------------------------------------------
# Build variants
# --------------------------------------------------------------------------------------------


def normalize_components(components: str | Iterable[str] | None) -> list[str]:
    """None is the whole model (one implicit component); a lone string is one component."""
    named = ["all"] if components is None else [components] if isinstance(components, str) else components
    return sorted({str(c) for c in named})


def variant_subdir(precision: str, mesh_shape: tuple[int, int], num_layers: int | None = None) -> PurePosixPath:
    """``<precision>/mesh_<r>x<c>[-layers<n>]``: where a variant sits under its model dir."""
    rows, cols = mesh_shape
    return PurePosixPath(precision, f"mesh_{rows}x{cols}" + (f"-layers{num_layers}" if num_layers is not None else ""))


def is_mesh_dir_name(name: str) -> bool:
    return _MESH_DIR.fullmatch(name) is not None


def is_generation_name(name: str) -> bool:
    """The shape of a generation's name (a pre-filter only: ownership is its record)."""
    return _GENERATION_NAME.fullmatch(name) is not None


def is_marker_name(name: str) -> bool:
    return name.startswith(WEIGHT_CACHE_MARKER + ".") and not is_temp_path(Path(name))


def user_state_dir() -> Path:
    return envs.TT_USER_STATE


def path_key(path: Path) -> str:
    """A file-name-safe key for an absolute path (per-user state about a shared location)."""
    return hashlib.sha256(os.fsencode(os.path.abspath(path))).hexdigest()[:24]


# --------------------------------------------------------------------------------------------
# One variant
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VariantPaths:
    """Every path of one build variant in one cache dir (after huggingface_hub's
    ``LocalDownloadFilePaths``: one object instead of a ``(cache_dir, build_variant)`` pair)."""

    cache_dir: Path
    build_variant: Mapping[str, Any] | None = field(default=None, compare=False)
    tag: str = ""  # the variant's tag: from ``build_variant``, or given where only the tag is known

    def __post_init__(self) -> None:
        object.__setattr__(self, "cache_dir", Path(self.cache_dir))
        if not self.tag:
            object.__setattr__(self, "tag", variant_tag(self.build_variant))

    @property
    def marker(self) -> Path:
        """The completion marker: one per variant, so variants sharing a dir never evict each other's."""
        return self.cache_dir / f"{WEIGHT_CACHE_MARKER}.{self.tag}"

    @property
    def stamp_index(self) -> Path:
        return self.cache_dir / f"{STAMPS_PREFIX}.{self.tag}.json"

    @property
    def user_stamp_index(self) -> Path:
        return user_state_dir() / "stamps" / f"{path_key(self.cache_dir)}.{self.tag}.json"

    @property
    def last_used(self) -> Path:
        return self.cache_dir / f"{LAST_USED_PREFIX}.{self.tag}"

    @property
    def model_ids(self) -> Path:
        return self.cache_dir / f"{MODEL_IDS_PREFIX}.{self.tag}.json"

    @property
    def user_last_used(self) -> Path:
        """Where a warm start from a cache this user cannot write records its use: keyed by the
        variant dir's device and inode, which a read-only bind mount of it shares, so ``gc`` of the
        writable path sees the uses made through the view."""
        try:
            info = os.stat(self.cache_dir)
            key = f"{info.st_dev:x}-{info.st_ino:x}"
        except OSError:
            key = path_key(self.cache_dir)
        return user_state_dir() / "used" / f"{key}.{self.tag}"

    @property
    def build_lock(self) -> Path:
        return self.cache_dir / BUILD_LOCK

    @property
    def pulled_objects(self) -> Path:
        """Where a pull keeps the objects it verified until its generation is sealed (shared by
        the dir's variants: an object is named by its content; the build lock orders the pulls)."""
        return self.cache_dir / PULLED_OBJECTS

    @property
    def user_build_lock(self) -> Path:
        """The fallback lock of a user who can open the shared lock file only read-only where
        read-only ``flock`` is refused (NFSv4)."""
        return user_state_dir() / "locks" / f"{path_key(self.cache_dir)}.lock"

    @property
    def host_sidecar_name(self) -> str:
        """Exactly ``HOST_WEIGHTS_SIDECAR`` for the ``None`` variant (upstream tooling looks for that
        name), tagged per variant otherwise."""
        if self.build_variant is None:
            return HOST_WEIGHTS_SIDECAR
        return f"{HOST_WEIGHTS_SIDECAR.removesuffix('.safetensors')}.{self.tag}.safetensors"

    @property
    def host_sidecar(self) -> Path:
        """The sidecar of the seed API's flat layout (a build's own is in its generation)."""
        return self.cache_dir / self.host_sidecar_name

    def generation_dir(self, name: str) -> Path:
        return self.cache_dir / name

    def pending_record(self, directory: str) -> Path:
        """The ownership record of ``directory`` (a generation or a retired one) while it is being
        made or deleted: beside it, so the proof outlives every file of it."""
        return self.cache_dir / f"{PENDING_RECORD_PREFIX}{directory}"

    def file(self, relative: str) -> Path:
        return self.cache_dir / relative


def marker_path(cache_path: str | os.PathLike, build_variant: Mapping[str, Any] | None = None) -> Path:
    """The completion marker of one build variant (the seed's name for :attr:`VariantPaths.marker`)."""
    return VariantPaths(Path(cache_path), build_variant).marker


# --------------------------------------------------------------------------------------------
# A cache root
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CacheRoot:
    """The directory that holds every model's cache (``$TT_CACHE_PATH``)."""

    path: Path

    @classmethod
    def default(cls) -> CacheRoot:
        return cls(envs.TT_CACHE_PATH)

    @property
    def prefill_dir(self) -> Path:
        """The default root of the prefill-feature cache, beside the weight caches."""
        return self.path / PREFILL_DIR

    def model_dir(self, name: str, content_id: str) -> Path:
        return self.path / f"{name}--{content_id[:CONTENT_PREFIX_HEX]}"

    def model_dirs_of(self, content_id: str) -> list[Path]:
        """Every model dir holding this content, whatever its readable name (no glob: a folder
        name like ``llama[v2]`` is a name, not a pattern)."""
        suffix = f"--{content_id[:CONTENT_PREFIX_HEX]}"
        return [path for path in self.model_dirs() if path.name.endswith(suffix)]

    def model_dirs(self) -> list[Path]:
        """Every ``<name>--<id>`` dir (real dirs only: a symlink out of the root is not followed)."""
        found = []
        with contextlib.suppress(OSError), os.scandir(self.path) as entries:
            for entry in entries:
                if "--" in entry.name and not entry.name.startswith(".") and entry.is_dir(follow_symlinks=False):
                    found.append(Path(entry.path))
        return sorted(found)

    def checkpoint_stamps(self, checkpoint_name: str, checkpoint_dir: Path) -> Path:
        """Stamped digests of one checkpoint's files: in the root, so a reader on a read-only mount
        reuses what the seeder verified; one index per checkpoint location (its resolved path), so
        checkpoints that share a folder name (``a/model``, ``b/model``) never evict each other's."""
        return self.path / CHECKPOINT_STAMPS / f"{_file_safe(checkpoint_name)}--{checkpoint_key(checkpoint_dir)}.json"

    def shared_checkpoint_stamps(self, checkpoint_name: str, checkpoint_dir: Path) -> list[Path]:
        """The other indexes of checkpoints of this name (newest first, a few): read, never written,
        when a file is not in this location's own (the same export seen through another path)."""
        own, name = self.checkpoint_stamps(checkpoint_name, checkpoint_dir).name, _file_safe(checkpoint_name)
        found = []
        with contextlib.suppress(OSError), os.scandir(self.path / CHECKPOINT_STAMPS) as entries:
            for entry in entries:
                if entry.name != own and (entry.name == f"{name}.json" or _keyed_stamps(name, entry.name)):
                    with contextlib.suppress(OSError):
                        found.append((entry.stat(follow_symlinks=False).st_mtime_ns, Path(entry.path)))
        return [path for _, path in sorted(found, reverse=True)[:MAX_SHARED_STAMP_INDEXES]]

    def user_checkpoint_stamps(self, checkpoint_name: str, checkpoint_dir: Path) -> Path:
        return user_state_dir() / "stamps" / (f"{path_key(self.path)}.checkpoint.{_file_safe(checkpoint_name)}--"
                                              f"{checkpoint_key(checkpoint_dir)}.json")


def checkpoint_key(checkpoint_dir: Path) -> str:
    """Which checkpoint location a stamp index is of: its resolved path (two hosts mounting one
    export at one path share it; a device number would not be shared)."""
    return location_key(os.path.realpath(checkpoint_dir))


def location_key(resolved: str) -> str:
    """The key of a resolved checkpoint location: what its stamp index's file name ends with."""
    return path_key(Path(resolved))[:16]


def location_index_key(file_name: str) -> str | None:
    """The location key a checkpoint stamp index's file name ends with (``...--<key>.json``, in the
    root or in a user's state), or None for any other name."""
    found = _LOCATION_INDEX_NAME.fullmatch(file_name)
    return found.group(1) if found else None


def index_directory_lock(directory: Path) -> Path:
    """The lock of a directory of stamp indexes: beside it, so a listing of it holds only indexes."""
    return directory.parent / f".{directory.name}.lock"


def _keyed_stamps(name: str, file_name: str) -> bool:
    return re.fullmatch(re.escape(name) + r"--[0-9a-f]{16}\.json", file_name) is not None


def _file_safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)[:100] or "model"


# --------------------------------------------------------------------------------------------
# Listing
# --------------------------------------------------------------------------------------------


def list_cache_files(cache_path: str | os.PathLike) -> list[str]:
    """Every ``.tensorbin`` below ``cache_path`` (recursive: loaders nest per-layer directories),
    as sorted relative POSIX paths; in-flight temp files of a writer are left out and no symlinked
    directory is followed."""
    root = Path(cache_path)
    found = []
    for directory, _, names in os.walk(root):
        for name in names:
            if name.endswith(TENSORBIN_SUFFIX) and not is_temp_path(Path(name)):
                found.append(Path(directory, name).relative_to(root).as_posix())
    return sorted(found)


def holds_own_cache(directory: Path) -> bool:
    """Whether a directory below a cache dir is a cache (or a build) of its own: a generation or
    retired name, a marker, a build lock or an ownership record in it. Its files are never another
    variant's to record or delete."""
    if is_generation_name(directory.name) or directory.name.startswith(RETIRED_PREFIX):
        return True
    try:
        with os.scandir(directory) as entries:
            return any(is_marker_name(e.name) or e.name in (BUILD_LOCK, GENERATION_RECORD) for e in entries)
    except OSError:
        return False


def nested_cache(cache_dir: Path, relative: str) -> Path | None:
    """The first directory on the way from ``cache_dir`` to the file ``relative`` that holds a cache
    of its own (:func:`holds_own_cache`), or None."""
    directory = Path(cache_dir)
    for part in PurePosixPath(relative).parts[:-1]:
        directory = directory / part
        if holds_own_cache(directory):
            return directory
    return None


def in_seed_layout(relative: str) -> bool:
    """Whether a file (relative to a variant dir) is where the seed API's builds write: at the top
    or directly in a per-layer dir ``layers.<n>/`` (the nesting this project's loaders use)."""
    parts = relative.split("/")
    return len(parts) == 1 or (len(parts) == 2 and _LAYER_DIR.fullmatch(parts[0]) is not None)


def tensorbins_below(cache_dir: str | os.PathLike) -> list[str]:
    """Every tensorbin below a variant dir, at any depth, as sorted relative POSIX paths, except
    below a directory that holds a cache of its own (:func:`holds_own_cache`: a nested cache, a
    generation). Temp files of a writer are left out; no symlink is followed."""
    found = []

    def scan(directory: str, prefix: str) -> None:
        with contextlib.suppress(OSError), os.scandir(directory) as entries:
            for entry in entries:
                if entry.is_file(follow_symlinks=False):
                    if entry.name.endswith(TENSORBIN_SUFFIX) and not is_temp_path(Path(entry.name)):
                        found.append(prefix + entry.name)
                elif entry.is_dir(follow_symlinks=False) and not holds_own_cache(Path(entry.path)):
                    scan(entry.path, f"{prefix}{entry.name}/")

    scan(os.fspath(cache_dir), "")
    return sorted(found)


def tree_usage(path: str | os.PathLike) -> tuple[int, int]:
    """(regular files, their bytes) below ``path`` (symlinks neither counted nor followed)."""
    files = total = 0
    for directory, _, names in os.walk(path):
        for name in names:
            with contextlib.suppress(OSError):
                info = os.lstat(os.path.join(directory, name))
                if stat.S_ISREG(info.st_mode):
                    files += 1
                    total += info.st_size
    return files, total


def tree_bytes(path: str | os.PathLike) -> int:
    """Bytes of every regular file below ``path`` (symlinks neither counted nor followed)."""
    return tree_usage(path)[1]


def cache_bytes(cache_dir: str | os.PathLike) -> int:
    """Bytes on disk of everything in a cache dir (tensorbins, sidecars, markers)."""
    return tree_bytes(cache_dir)


def iter_variant_dirs(root: Path) -> Iterator[Path]:
    """Every directory under ``root`` (itself included) that a cache would use as a variant dir:
    it holds a marker, a build lock or a ``mesh_<r>x<c>`` name. Generations and symlinks are not
    entered."""
    for directory, subdirs, names in os.walk(root):
        path = Path(directory)
        holds = is_mesh_dir_name(path.name) or BUILD_LOCK in names or any(is_marker_name(n) for n in names)
        subdirs[:] = [d for d in subdirs if not is_generation_name(d) and not d.startswith(RETIRED_PREFIX)
                      and not (d == PREFILL_DIR and path == Path(root))]
        if holds:
            yield path
