# SPDX-License-Identifier: Apache-2.0
"""The warm ttnn weight cache: build a model from its ``.tensorbin`` files alone.

``ttnn.as_tensor(t, cache_file_name=...)`` loads the cached file and ignores ``t`` on a hit, so
once every converted weight of a model is on disk a loader needs no checkpoint at all: each
weight can be a *placeholder* with the right shape and dtype and no storage. This module decides
when that is safe and hands out those placeholders.

Layout of one cache directory (one per model, precision and mesh shape)::

    <cache_dir>/
        <any/nesting>/<name>.tensorbin              the converted weights, written by the loader
        .weights_complete.<variant>                 completion marker of one build variant (JSON)
        .host_weights.<variant>.safetensors         real tensors the device code consumes on host

``<variant>`` is a short digest of the build options that change cache file names (precision,
prefetcher, ...), so variants sharing a directory never evict each other's marker.

Marker format (``format_version`` 4), JSON, UTF-8, written atomically after a full build::

    {"format_version": 4, "model_name": str, "n_layers": int, "mesh_shape": "(1, 2)",
     "components": [str, ...], "build_variant": object | null, "is_moe": bool,
     "model_info": {...},            # loader facts a warm build must restore (expert count, fusion)
     "model_config": {...} | null,   # the checkpoint's config.json: a warm start needs no checkpoint
     "digest_algorithm": "blake3",
     "files": [{"path": "layers.0/wq.tensorbin", "bytes": int, "digest": hex}, ...],
     "host_weights": [key, ...], "host_sidecar": {"path": ..., "bytes": ..., "digest": ...} | null,
     "weights": {key: [[dim, ...], "torch.bfloat16"], ...}}

The completeness gate trusts nothing in it: every field is type- and range-checked, every path
must be relative and stay inside the cache dir, and every recorded file must exist with its
recorded size (``stat`` only, fast enough for 10,000 files). Anything off means "cold": the
loader rebuilds from the checkpoint. :func:`verify_weight_cache` re-hashes the files for a deep
check. A placeholder lives on torch's ``meta`` device, so it costs no host memory and a cache
miss on it fails loudly instead of persisting garbage as a weight.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from stat import S_ISREG
from typing import Any

import torch
from loguru import logger

from models.common.checkpoint import SafetensorsFile, write_safetensors
from models.common.fileio import (
    CONTENT_DIGEST_ALGORITHM,
    atomic_output,
    atomic_write_bytes,
    content_digest_file,
    is_temp_path,
)

WEIGHT_CACHE_MARKER = ".weights_complete"
HOST_WEIGHTS_SIDECAR = ".host_weights.safetensors"
# v4: per-file sizes and content digests, model_config / model_info for cache-only deploys, a
# safetensors host sidecar (no pickle), metadata-only placeholders. Older markers read as cold.
WEIGHT_CACHE_FORMAT_VERSION = 4
DEFAULT_FORCE_ENV = "TT_TRANSFORMERS_FORCE_MODEL_LOAD"
TENSORBIN_SUFFIX = ".tensorbin"

MAX_MARKER_BYTES = 512 << 20
_MAX_FILE_BYTES = 1 << 50
_MAX_DIM = 1 << 40
_MAX_ELEMENTS = 1 << 50  # a placeholder's size must fit torch's int64 byte count
_MAX_LAYERS = 1 << 20
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")
_HF_SNAPSHOT = re.compile(r"models--(?:[^/]+--)?(?P<name>[^/]+)/snapshots/[^/]+$")


class WeightCacheError(RuntimeError):
    """A weight-cache file cannot be used as asked (the caller should build cold)."""


# --------------------------------------------------------------------------------------------
# Identity
# --------------------------------------------------------------------------------------------


def checkpoint_name(model_path: str | os.PathLike) -> str:
    """The repo's base name however the checkpoint is addressed.

    ``org/name`` (an HF id), ``/data/name`` (a local directory) and
    ``.../models--org--name/snapshots/<rev>`` (the hub snapshot vLLM passes under
    ``HF_HUB_OFFLINE=1``) all name the same model and must share one cache identity."""
    text = os.fspath(model_path).rstrip("/")
    snapshot = _HF_SNAPSHOT.search(text)
    return snapshot.group("name") if snapshot else text.rsplit("/", 1)[-1]


def _variant_tag(build_variant: Mapping[str, Any] | None) -> str:
    if build_variant is None:
        return "none"
    canonical = json.dumps(build_variant, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def _canonical_variant(build_variant: Mapping[str, Any] | None) -> Any:
    """The build variant as the marker stores it (JSON: tuples become lists, other objects strings),
    so the gate compares like with like."""
    if build_variant is None:
        return None
    return json.loads(json.dumps(build_variant, sort_keys=True, default=str))


def _variant_unverifiable(build_variant: Mapping[str, Any] | None) -> bool:
    return bool(build_variant) and bool(build_variant.get("unverifiable"))


def marker_path(cache_path: str | os.PathLike, build_variant: Mapping[str, Any] | None = None) -> Path:
    """The completion marker of one build variant: one file per variant, so several variants can
    share a cache dir without each seed evicting the other's marker."""
    return Path(cache_path) / f"{WEIGHT_CACHE_MARKER}.{_variant_tag(build_variant)}"


def host_sidecar_path(cache_path: str | os.PathLike, build_variant: Mapping[str, Any] | None = None) -> Path:
    stem = HOST_WEIGHTS_SIDECAR.removesuffix(".safetensors")
    return Path(cache_path) / f"{stem}.{_variant_tag(build_variant)}.safetensors"


def normalize_mesh_shape(mesh_shape: Any) -> str:
    """``(1, 8)``, ``[1, 8]`` and ``ttnn.MeshShape(1, 8)`` all encode as ``"(1, 8)"``."""
    try:
        return str(tuple(int(d) for d in mesh_shape))
    except TypeError:
        return str(mesh_shape)


def _normalize_components(components: str | Iterable[str] | None) -> list[str]:
    """None is the whole model (one implicit component); a lone string is one component."""
    named = ["all"] if components is None else [components] if isinstance(components, str) else components
    return sorted({str(c) for c in named})


def list_cache_files(cache_path: str | os.PathLike) -> list[str]:
    """Every ``.tensorbin`` below ``cache_path`` (recursive: loaders nest per-layer directories),
    as sorted relative POSIX paths; in-flight temp files of a writer are left out."""
    root = Path(cache_path)
    found = []
    for directory, _, names in os.walk(root):
        for name in names:
            if name.endswith(TENSORBIN_SUFFIX) and not is_temp_path(Path(name)):
                found.append(Path(directory, name).relative_to(root).as_posix())
    return sorted(found)


def cache_bytes(cache_path: str | os.PathLike) -> int:
    """Bytes on disk of everything in a cache dir (tensorbins, sidecars, markers)."""
    return sum(p.stat().st_size for p in Path(cache_path).rglob("*") if p.is_file())


# --------------------------------------------------------------------------------------------
# The marker, parsed and validated as data
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileRecord:
    path: str
    bytes: int
    digest: str


@dataclass(frozen=True)
class WeightCacheMarker:
    model_name: str
    n_layers: int
    mesh_shape: str
    components: tuple[str, ...]
    build_variant: Any
    is_moe: bool
    model_info: dict[str, Any]
    model_config: dict[str, Any] | None
    files: tuple[FileRecord, ...]
    host_weights: tuple[str, ...]
    host_sidecar: FileRecord | None
    weights: dict[str, tuple[tuple[int, ...], torch.dtype]] = field(repr=False)


def weights_identity(marker: WeightCacheMarker) -> str:
    """SHA-256 naming exactly the converted weights a marker vouches for (each file's path within
    its build and content digest): equal for bit-identical builds, different for any other.

    Consumers that derive data from a loaded model (the prefill cache's authority) key on it."""
    lines = sorted(f"{_build_relative(r.path)}:{r.digest}" for r in marker.files)
    if marker.host_sidecar is not None:
        lines.append(f"sidecar:{marker.host_sidecar.digest}")
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def _build_relative(path: str) -> str:
    return path


class MarkerFormatError(ValueError):
    """The marker's bytes are not a valid v4 marker; the message says which field."""


def _expect(condition: bool, message: str | Callable[[], str]) -> None:
    """Raise :class:`MarkerFormatError` unless ``condition``; a callable message is formatted only
    then (the per-file checks run 10,000 times per gate call: no eager reprs)."""
    if not condition:
        raise MarkerFormatError(message() if callable(message) else message)


def _is_int(value: Any, low: int, high: int) -> bool:
    return type(value) is int and low <= value <= high


def _safe_relative_path(value: Any) -> str:
    _expect(
        isinstance(value, str) and 0 < len(value) <= 4096, lambda: f"file path {value!r} is not a short string"
    )
    _expect("\x00" not in value and "\\" not in value, lambda: f"file path {value!r} has a NUL or backslash")
    _expect(value.isascii() or _encodable(value), lambda: f"file path {value!r} is not valid UTF-8 text")
    _expect(not value.startswith("/"), lambda: f"file path {value!r} is absolute")
    _expect(
        all(part not in ("", ".", "..") for part in value.split("/")),
        lambda: f"file path {value!r} leaves the cache dir",
    )
    return value


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")  # a lone surrogate (JSON "\ud800") cannot name a file: stat would raise
    except UnicodeEncodeError:
        return False
    return True


_BAD_SEGMENTS = frozenset(("", ".", ".."))


def _file_record(value: Any) -> FileRecord:
    # Fast path, one expression for a well-formed record (a 10,000-file marker is parsed on every
    # warm start); anything it does not accept goes through the checks below for their message.
    if type(value) is dict:
        path, size, digest = value.get("path"), value.get("bytes"), value.get("digest")
        if (
            type(path) is str
            and 0 < len(path) <= 4096
            and path.isascii()
            and "\x00" not in path
            and "\\" not in path
            and not path.startswith("/")
            and _BAD_SEGMENTS.isdisjoint(path.split("/"))
            and _is_int(size, 0, _MAX_FILE_BYTES)
            and type(digest) is str
            and _HEX_DIGEST.fullmatch(digest)
        ):
            return FileRecord(path, size, digest)
    _expect(isinstance(value, dict), lambda: f"file record {value!r} is not an object")
    size, digest = value.get("bytes"), value.get("digest")
    path = _safe_relative_path(value.get("path"))
    _expect(_is_int(size, 0, _MAX_FILE_BYTES), lambda: f"file {path}: size {size!r} is not a sane byte count")
    _expect(
        isinstance(digest, str) and _HEX_DIGEST.fullmatch(digest) is not None, lambda: f"file {path}: bad digest"
    )
    return FileRecord(path, size, digest)


_TORCH_DTYPES = {str(v): v for v in vars(torch).values() if isinstance(v, torch.dtype)}


def _weight_spec(key: str, value: Any) -> tuple[tuple[int, ...], torch.dtype]:
    if type(value) is list and len(value) == 2:  # fast path, as in _file_record
        shape, dtype = value
        if (
            type(shape) is list
            and len(shape) <= 16
            and all(type(d) is int and 0 <= d <= _MAX_DIM for d in shape)
            and type(dtype) is str
            and dtype in _TORCH_DTYPES
            and math.prod(shape) <= _MAX_ELEMENTS
        ):
            return tuple(shape), _TORCH_DTYPES[dtype]
    _expect(isinstance(value, list) and len(value) == 2, lambda: f"weight {key!r}: spec is not [shape, dtype]")
    shape, dtype = value
    _expect(
        isinstance(shape, list) and len(shape) <= 16 and all(_is_int(d, 0, _MAX_DIM) for d in shape),
        lambda: f"weight {key!r}: shape {shape!r} is not a list of sane dimensions",
    )
    _expect(isinstance(dtype, str) and dtype in _TORCH_DTYPES, lambda: f"weight {key!r}: unknown dtype {dtype!r}")
    _expect(math.prod(shape) <= _MAX_ELEMENTS, lambda: f"weight {key!r}: shape {shape!r} has too many elements")
    return tuple(shape), _TORCH_DTYPES[dtype]


def _json_object_or_none(value: Any, name: str) -> dict[str, Any] | None:
    _expect(value is None or isinstance(value, dict), f"{name} is not an object")
    return value


def parse_marker(raw: bytes) -> WeightCacheMarker:
    """Parse and validate marker bytes; raise :class:`MarkerFormatError` naming the first bad field."""
    _expect(len(raw) <= MAX_MARKER_BYTES, f"marker is {len(raw):,} bytes, more than {MAX_MARKER_BYTES:,}")
    try:
        body = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise MarkerFormatError(f"marker is not UTF-8 JSON: {error}") from None
    _expect(isinstance(body, dict), "marker is not a JSON object")
    version = body.get("format_version")
    _expect(
        version == WEIGHT_CACHE_FORMAT_VERSION and type(version) is int,
        f"marker format_version {version!r}, this code reads {WEIGHT_CACHE_FORMAT_VERSION}",
    )
    _expect(isinstance(body.get("model_name"), str), "model_name is not a string")
    _expect(_is_int(body.get("n_layers"), 0, _MAX_LAYERS), f"n_layers {body.get('n_layers')!r} is not sane")
    _expect(isinstance(body.get("mesh_shape"), str), "mesh_shape is not a string")
    components = body.get("components")
    _expect(isinstance(components, list) and all(isinstance(c, str) for c in components), "bad components")
    _expect(type(body.get("is_moe")) is bool, "is_moe is not a bool")
    _expect(body.get("digest_algorithm") == CONTENT_DIGEST_ALGORITHM, "unknown digest_algorithm")
    files = body.get("files")
    _expect(isinstance(files, list) and len(files) > 0, "files is not a non-empty list")
    records = tuple(_file_record(f) for f in files)
    host_weights = body.get("host_weights")
    _expect(
        isinstance(host_weights, list) and all(isinstance(k, str) for k in host_weights), "bad host_weights"
    )
    sidecar = body.get("host_sidecar")
    _expect(sidecar is None or bool(host_weights), "host_sidecar without host_weights")
    _expect(sidecar is not None or not host_weights, "host_weights without host_sidecar")
    weights = body.get("weights")
    _expect(isinstance(weights, dict) and len(weights) > 0, "weights is not a non-empty object")
    return WeightCacheMarker(
        model_name=body["model_name"],
        n_layers=body["n_layers"],
        mesh_shape=body["mesh_shape"],
        components=tuple(components),
        build_variant=body.get("build_variant"),
        is_moe=body["is_moe"],
        model_info=_json_object_or_none(body.get("model_info"), "model_info") or {},
        model_config=_json_object_or_none(body.get("model_config"), "model_config"),
        files=records,
        host_weights=tuple(host_weights),
        host_sidecar=None if sidecar is None else _file_record(sidecar),
        weights={key: _weight_spec(key, spec) for key, spec in weights.items()},
    )


def _reject_constant(name: str) -> None:
    raise ValueError(f"non-standard JSON constant {name}")


_MARKER_MEMO: dict[tuple[str, int, int, int], WeightCacheMarker] = {}


def read_marker(cache_path: str | os.PathLike, build_variant: Mapping[str, Any] | None = None) -> WeightCacheMarker:
    """The validated marker of one variant (memoized on path, inode, mtime and size).

    Raises :class:`WeightCacheError` when it is absent, unreadable or invalid."""
    path = marker_path(cache_path, build_variant)
    try:
        with open(path, "rb") as stream:
            stat = os.fstat(stream.fileno())
            key = (str(path), stat.st_ino, stat.st_mtime_ns, stat.st_size)
            if key in _MARKER_MEMO:
                return _MARKER_MEMO[key]
            raw = stream.read(MAX_MARKER_BYTES + 1)
    except FileNotFoundError:
        raise WeightCacheError(f"no completion marker {path.name} in {path.parent}") from None
    except OSError as error:
        raise WeightCacheError(f"cannot read marker {path}: {error}") from None
    try:
        marker = parse_marker(raw)
    except MarkerFormatError as error:
        raise WeightCacheError(f"marker {path} is invalid: {error}") from None
    _MARKER_MEMO.clear()
    _MARKER_MEMO[key] = marker
    return marker


# --------------------------------------------------------------------------------------------
# The host-weights sidecar (safetensors: no code runs from a cache file)
# --------------------------------------------------------------------------------------------

_SIDECAR_MEMO: dict[tuple[str, int, int, int], dict[str, torch.Tensor]] = {}


def load_host_sidecar(
    cache_path: str | os.PathLike, *, consume: bool = False, build_variant: Mapping[str, Any] | None = None
) -> dict[str, torch.Tensor] | None:
    """The real host-consumed weights of a warm build, or None when absent or unreadable.

    Opened once per warm run: memoized on (path, inode, mtime, size) so the gate's validation is
    reused by the builder; ``consume=True`` hands the tensors over and drops the memo. The tensors
    are zero-copy views of the mapped file (pages are read when the host code touches them)."""
    path = host_sidecar_path(cache_path, build_variant)
    try:
        stat = path.stat()
        key = (str(path), stat.st_ino, stat.st_mtime_ns, stat.st_size)
        tensors = _SIDECAR_MEMO.get(key)
        if tensors is None:
            sidecar = SafetensorsFile(path)  # zero-copy views: a warm start maps, never copies
            tensors = {name: sidecar.tensor(name) for name in sidecar.names()}
            _SIDECAR_MEMO.clear()
            _SIDECAR_MEMO[key] = tensors
        if consume:
            _SIDECAR_MEMO.pop(key, None)
        return tensors
    except (OSError, ValueError, RuntimeError) as error:
        if not isinstance(error, FileNotFoundError):
            logger.warning(f"Host-weights sidecar {path} is unreadable: {error}")
        return None


# --------------------------------------------------------------------------------------------
# The completeness gate
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CacheStatus:
    """The gate's answer: ``warm`` and, when cold, the first failed check in words."""

    warm: bool
    reason: str
    marker: WeightCacheMarker | None = None

    def __bool__(self) -> bool:
        return self.warm


def _cold(reason: str) -> CacheStatus:
    return CacheStatus(False, reason)


def _stat_mismatch(root: str, record: FileRecord, dir_fd: int | None = None) -> str | None:
    try:
        # relative to an open fd of the cache dir: a shorter lookup per file, ~15% faster on 10,000
        info = os.stat(record.path, dir_fd=dir_fd) if dir_fd is not None else os.stat(os.path.join(root, record.path))
    except OSError as error:
        return f"{record.path} is missing ({error.strerror})"
    if not S_ISREG(info.st_mode):
        return f"{record.path} is not a regular file"
    size = info.st_size
    if size != record.bytes:
        return f"{record.path} is {size:,} bytes, marker says {record.bytes:,}"
    return None


def weight_cache_status(
    cache_path: str | os.PathLike,
    *,
    model_name: str,
    n_layers: int,
    mesh_shape: Any,
    components: str | Iterable[str] | None = None,
    build_variant: Mapping[str, Any] | None = None,
    force_env: str | None = DEFAULT_FORCE_ENV,
) -> CacheStatus:
    """Whether a warm build of exactly this model is safe, and if not, why.

    Warm means: a valid marker of this variant records a build of the same model, layer count,
    mesh shape and at least these components, and every file it records is on disk at its
    recorded size. Never raises for a bad cache; it answers cold."""
    if force_env and os.environ.get(force_env) == "1":
        return _cold(f"cold build forced by {force_env}=1")
    if _variant_unverifiable(build_variant):
        logger.warning(f"Weight cache {cache_path}: build variant could not be computed; building cold")
        return _cold(f"build variant could not be computed ({build_variant.get('error', 'unknown error')})")
    try:
        marker = read_marker(cache_path, build_variant)
    except WeightCacheError as error:
        return _cold(str(error))
    checks = (
        (marker.model_name == model_name, f"marker is for model {marker.model_name!r}, not {model_name!r}"),
        (marker.n_layers == n_layers, f"marker is for {marker.n_layers} layers, not {n_layers}"),
        (
            marker.mesh_shape == normalize_mesh_shape(mesh_shape),
            f"marker is for mesh {marker.mesh_shape}, not {normalize_mesh_shape(mesh_shape)}",
        ),
        (
            set(_normalize_components(components)) <= set(marker.components),
            f"marker covers components {list(marker.components)}, build needs {_normalize_components(components)}",
        ),
        (
            marker.build_variant == _canonical_variant(build_variant),
            f"marker variant {marker.build_variant!r} != {build_variant!r}",
        ),
    )
    for passed, reason in checks:
        if not passed:
            return _cold(reason)
    root = os.fspath(cache_path)
    try:
        dir_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as error:
        return _cold(f"cannot open cache dir {root}: {error.strerror}")
    try:
        for record in marker.files:
            problem = _stat_mismatch(root, record, dir_fd)
            if problem:
                return _cold(f"tensorbin {problem}")
    finally:
        os.close(dir_fd)
    if marker.host_sidecar is not None:
        problem = _stat_mismatch(root, marker.host_sidecar)
        if problem:
            return _cold(f"host sidecar {problem}")
        host = load_host_sidecar(cache_path, build_variant=build_variant)
        if host is None or set(host) != set(marker.host_weights):
            return _cold(f"host sidecar {marker.host_sidecar.path} does not hold the recorded host weights")
    return CacheStatus(True, "complete", marker)


def weight_cache_is_complete(
    cache_path: str | os.PathLike,
    *,
    model_name: str,
    n_layers: int,
    mesh_shape: Any,
    components: str | Iterable[str] | None = None,
    build_variant: Mapping[str, Any] | None = None,
    force_env: str | None = DEFAULT_FORCE_ENV,
) -> bool:
    """True when a warm build from ``cache_path`` is safe (see :func:`weight_cache_status`)."""
    status = weight_cache_status(
        cache_path,
        model_name=model_name,
        n_layers=n_layers,
        mesh_shape=mesh_shape,
        components=components,
        build_variant=build_variant,
        force_env=force_env,
    )
    if not status.warm:
        logger.info(f"Weight cache {cache_path} is cold: {status.reason}")
    return status.warm


def verify_weight_cache(
    cache_path: str | os.PathLike, build_variant: Mapping[str, Any] | None = None
) -> list[str]:
    """Deep check: re-hash every recorded file. Returns one line per file that differs (empty: intact)."""
    try:
        marker = read_marker(cache_path, build_variant)
    except WeightCacheError as error:
        return [str(error)]
    root = os.fspath(cache_path)
    problems = []
    records = marker.files + ((marker.host_sidecar,) if marker.host_sidecar else ())
    for record in records:
        problem = _stat_mismatch(root, record)
        if problem is None and content_digest_file(Path(root, record.path)) != record.digest:
            problem = f"{record.path} content differs from the digest recorded at build time"
        if problem:
            problems.append(problem)
    return problems


# --------------------------------------------------------------------------------------------
# Marking a build complete
# --------------------------------------------------------------------------------------------


def _record_file(root: Path, relative: str, digests: Mapping[str, str] | None) -> FileRecord:
    path = root / relative
    size = path.stat().st_size
    digest = (digests or {}).get(relative) or content_digest_file(path)
    return FileRecord(relative, size, digest)


def write_host_sidecar(
    cache_path: str | os.PathLike, host: Mapping[str, torch.Tensor], build_variant: Mapping[str, Any] | None = None
) -> dict[str, str]:
    """Publish the host weights' safetensors sidecar atomically; returns ``{name: digest}`` for
    :func:`mark_weight_cache_complete`'s ``digests`` (so a loader can write it while converting)."""
    sidecar = host_sidecar_path(cache_path, build_variant)
    with atomic_output(sidecar) as temp:
        write_safetensors(temp, {key: value.detach() for key, value in host.items()})
        digest = content_digest_file(temp)
    return {sidecar.name: digest}


def invalidate_weight_cache(cache_path: str | os.PathLike, build_variant: Mapping[str, Any] | None = None) -> None:
    """Withdraw a variant's marker before a cold build rewrites its files.

    Without this, a rebuild killed half-way would leave the old marker vouching for a mix of old
    and new tensorbins of the same sizes."""
    try:
        marker_path(cache_path, build_variant).unlink(missing_ok=True)
    except OSError as error:
        logger.warning(f"Could not withdraw weight-cache marker in {cache_path}: {error}")
    _MARKER_MEMO.clear()


def mark_weight_cache_complete(
    cache_path: str | os.PathLike,
    state_dict: Mapping[str, Any],
    *,
    model_name: str,
    n_layers: int,
    mesh_shape: Any,
    components: str | Iterable[str] | None = None,
    build_variant: Mapping[str, Any] | None = None,
    is_moe: bool = False,
    is_host_weight: Callable[[str], bool] | None = None,
    model_config: Mapping[str, Any] | None = None,
    model_info: Mapping[str, Any] | None = None,
    cache_files: Iterable[str] | None = None,
    digests: Mapping[str, str] | None = None,
) -> bool:
    """Record that a full build of this variant wrote every tensorbin it needs. Returns success.

    Call it only after the whole model was built. ``state_dict`` gives the manifest (each
    weight's shape and dtype); weights matching ``is_host_weight`` are saved real to the
    safetensors sidecar. ``cache_files`` (relative paths, default: every tensorbin found) and
    ``digests`` (already computed by the loader) are recorded with their sizes; a sidecar the
    loader already wrote with :func:`write_host_sidecar` is recorded, not rewritten. The sidecar is
    published before the marker, and the marker last, each by atomic rename, so a crash at any
    point leaves either the previous state or a complete one. Failing to write (read-only or
    full disk) only warns: the build it records has already succeeded."""
    if _variant_unverifiable(build_variant):
        logger.warning(f"Not marking {cache_path} complete: its build variant could not be computed")
        return False
    root = Path(cache_path)
    marker = marker_path(root, build_variant)
    manifest, host = {}, {}
    for key, value in state_dict.items():
        if not isinstance(value, torch.Tensor):
            continue
        manifest[key] = [list(value.shape), str(value.dtype)]
        if is_host_weight is not None and is_host_weight(key):
            if value.is_meta:
                raise WeightCacheError(f"host weight {key!r} is a placeholder; a host weight must be real")
            host[key] = value.detach()
    try:
        if cache_files is not None:
            files = sorted({_safe_relative_path(f) for f in cache_files})
        else:
            files = list_cache_files(root)
        if not files:
            logger.warning(f"Not marking {root} complete: no {TENSORBIN_SUFFIX} files in it")
            return False
        records = [_record_file(root, rel, digests) for rel in files]
        sidecar_record = None
        if host:
            name = host_sidecar_path(root, build_variant).name
            if name not in (digests or {}):  # else the loader published it while converting
                write_host_sidecar(root, host, build_variant)
            sidecar_record = _record_file(root, name, digests)
        body = {
            "format_version": WEIGHT_CACHE_FORMAT_VERSION,
            "model_name": model_name,
            "n_layers": n_layers,
            "components": _normalize_components(components),
            "mesh_shape": normalize_mesh_shape(mesh_shape),
            "build_variant": _canonical_variant(build_variant),
            "is_moe": bool(is_moe),
            "model_info": dict(model_info or {}),
            "model_config": dict(model_config) if model_config is not None else None,
            "digest_algorithm": CONTENT_DIGEST_ALGORITHM,
            "files": [vars(r) for r in records],
            "host_weights": sorted(host),
            "host_sidecar": vars(sidecar_record) if sidecar_record else None,
            "weights": manifest,
        }
        atomic_write_bytes(marker, json.dumps(body, separators=(",", ":"), allow_nan=False).encode())
    except Exception as error:  # noqa: BLE001 - recording completion must never fail a finished build
        logger.warning(f"Could not mark weight cache {root} complete: {error}")
        return False
    logger.info(f"Marked weight cache complete: {marker} ({len(manifest)} weights, {len(host)} on host)")
    return True


# --------------------------------------------------------------------------------------------
# The warm state dict
# --------------------------------------------------------------------------------------------


def placeholder(shape: Iterable[int], dtype: torch.dtype) -> torch.Tensor:
    """A tensor with this shape and dtype and no storage (torch ``meta``).

    Host-side reshapes, transposes, permutes, cats, chunks and dtype casts work on it (loaders
    use :func:`concat`, :func:`stack` and :func:`fp32_elementwise`, which skip torch's slow meta
    kernels); reading its values, or converting it to a ttnn tensor, raises."""
    return torch.empty(tuple(shape), dtype=dtype, device="meta")


def is_placeholder_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_meta


# Host transforms that stay cheap on placeholders. Views (reshape, transpose, narrow, chunk) are
# free on torch ``meta`` tensors, but ``cat`` and arithmetic go through torch's meta kernels, whose
# first use imports its decomposition machinery: about 4 s on every warm start. Loaders use these
# instead; on placeholders they compute only the result's shape and dtype.


def concat(tensors: Sequence[torch.Tensor], dim: int = 0) -> torch.Tensor:
    """``torch.cat``, shape-only on placeholders."""
    if all(is_placeholder_tensor(t) for t in tensors):
        shape = list(tensors[0].shape)
        shape[dim] = sum(t.shape[dim] for t in tensors)
        return placeholder(shape, tensors[0].dtype)
    return torch.cat(list(tensors), dim=dim)


def stack(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """``torch.stack`` along a new first dim, shape-only on placeholders."""
    return concat([t.unsqueeze(0) for t in tensors], dim=0)


def fp32_elementwise(weight: torch.Tensor, transform: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``transform(weight.float())`` for an elementwise transform (same shape, float32 result),
    shape-only on placeholders."""
    if is_placeholder_tensor(weight):
        return placeholder(weight.shape, torch.float32)
    return transform(weight.float())


class CachedStateDict(MutableMapping):
    """The ``state_dict`` of a warm build: real host weights plus storage-free placeholders.

    Keys in the host sidecar give real tensors; every other key of the manifest gives a fresh
    :func:`placeholder`. Mutable (loaders ``setdefault`` derived weights) and truthy.
    Branch on ``is_placeholder`` to tell it from a real state dict, never on truthiness."""

    is_placeholder = True

    def __init__(
        self,
        manifest: Mapping[str, tuple[Iterable[int], torch.dtype | str]],
        host: Mapping[str, torch.Tensor] | None,
    ) -> None:
        self._manifest = {key: (tuple(shape), _as_dtype(dtype)) for key, (shape, dtype) in manifest.items()}
        self._host = dict(host or {})
        self._overrides: dict[str, Any] = {}
        self._deleted: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        if key in self._deleted:
            raise KeyError(key)
        for source in (self._overrides, self._host):
            if key in source:
                return source[key]
        shape, dtype = self._manifest[key]
        return placeholder(shape, dtype)

    def __setitem__(self, key: str, value: Any) -> None:
        self._deleted.discard(key)
        self._overrides[key] = value

    def __delitem__(self, key: str) -> None:
        if key not in self:
            raise KeyError(key)
        self._overrides.pop(key, None)
        self._deleted.add(key)

    def __contains__(self, key: object) -> bool:
        return key not in self._deleted and (key in self._overrides or key in self._host or key in self._manifest)

    def __iter__(self) -> Iterator[str]:
        for source in (self._overrides, self._host, self._manifest):
            for key in source:
                if key in self._deleted:
                    continue
                if source is not self._overrides and key in self._overrides:
                    continue
                if source is self._manifest and key in self._host:
                    continue
                yield key

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def host_keys(self) -> frozenset[str]:
        return frozenset(self._host)


def _as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _TORCH_DTYPES:
        raise WeightCacheError(f"unknown dtype {dtype!r} in weight manifest")
    return _TORCH_DTYPES[dtype]


def _restore_model_facts(args: Any, marker: WeightCacheMarker) -> None:
    """Put back on ``args`` what a cold build learns from checkpoint keys and a warm build skips."""
    info = marker.model_info
    args.is_mixture_of_experts = marker.is_moe
    keys = marker.weights.keys()
    args.fuse_qkv = bool(info["fuse_qkv"]) if "fuse_qkv" in info else any("qkv" in k for k in keys)
    args.fuse_mlp = bool(info["fuse_mlp"]) if "fuse_mlp" in info else any("gate_up" in k for k in keys)
    if marker.is_moe:
        args.moe = True
        if _is_int(info.get("num_experts"), 1, 1 << 20):
            args.num_experts = info["num_experts"]
        else:
            counted = _count_experts(keys)
            if counted:
                args.num_experts = counted
            elif hasattr(args, "num_local_experts"):
                args.num_experts = args.num_local_experts


_EXPERT_INDEX = re.compile(r"\.experts\.(\d+)\.")


def _count_experts(keys: Iterable[str]) -> int:
    indices = [int(m.group(1)) for k in keys if (m := _EXPERT_INDEX.search(k))]
    return max(indices) + 1 if indices else 0


def build_cached_state_dict(
    cache_path: str | os.PathLike,
    host: Mapping[str, torch.Tensor] | None = None,
    args: Any = None,
    build_variant: Mapping[str, Any] | None = None,
) -> CachedStateDict:
    """The warm ``state_dict`` from the marker's manifest and the host sidecar.

    ``host`` may be the sidecar the gate already loaded; otherwise it is taken (and released)
    from the gate's memo. ``args`` (a ModelArgs-like) gets ``is_mixture_of_experts``, ``moe``,
    ``num_experts``, ``fuse_qkv`` and ``fuse_mlp`` restored, since a warm build never sees the
    checkpoint keys they are normally sniffed from."""
    marker = read_marker(cache_path, build_variant)
    if args is not None and hasattr(args, "__dict__"):
        _restore_model_facts(args, marker)
    if host is None and marker.host_weights:
        host = load_host_sidecar(cache_path, consume=True, build_variant=build_variant)
        if host is None:
            raise WeightCacheError(f"host sidecar of {cache_path} vanished after the gate passed")
    logger.info(
        f"Warm weight cache {cache_path}: {len(marker.weights)} weights, "
        f"{len(host or {})} real on host, no checkpoint read"
    )
    return CachedStateDict(marker.weights, host)


def cached_model_config(cache_path: str | os.PathLike, build_variant: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The checkpoint ``config.json`` kept with the marker (for warm starts without a checkpoint)."""
    config = read_marker(cache_path, build_variant).model_config
    if config is None:
        raise WeightCacheError(f"marker in {cache_path} keeps no model config")
    return config

