# SPDX-License-Identifier: Apache-2.0
"""The completion marker of one build variant: its format, parsed and validated as data; no torch.

Marker format (``format_version`` 7), JSON, UTF-8, published atomically after a full build::

    {"format_version": 7, "model_name": str, "model_id": str, "content_id": hex | null,
     "generation": str | null, "n_layers": int, "mesh_shape": "(1, 2)", "components": [str],
     "build_variant": object | null, "ttnn_version": str | null, "tensorbin_format": str | null,
     "is_moe": bool, "model_info": {...}, "model_config": {...} | null,
     "digest_algorithm": "blake3", "verified_ns": int,
     "files": [{"path": "g1/layers.0/wq.tensorbin", "bytes": int, "digest": hex,
                "stamp": [inode, mtime_ns, ctime_ns], "owned": false}, ...],
     "host_weights": [key, ...], "host_sidecar": <file record> | null,
     "weights": {key: [[dim, ...], "torch.bfloat16"], ...}, "build_seconds": float | null}

``model_id`` is how the model was named (org included); ``content_id`` the checkpoint's content
digest (:mod:`~models.common.weight_cache.identity`); ``verified_ns`` when the build began hashing
its files (the racy-clock rule of :mod:`~models.common.weight_cache.stamps` needs it); a file's
``owned`` (optional, true when absent) whether its build provably wrote it, so that ``gc`` may
delete it (false: the gate verifies it, nothing deletes it; the rule is in
:mod:`~models.common.weight_cache.compat`);
``build_seconds`` (optional: null or absent in older markers) how long the cold build took, from
its generation's creation to the seal, so a reader that finds the cache warm can say what it saved
(``tt-cache seed`` statistics). ``build_variant``, ``mesh_shape``, ``ttnn_version`` and
``tensorbin_format`` are the variant's identity (:class:`~models.common.weight_cache.variant.VariantIdentity`,
:attr:`WeightCacheMarker.identity`): what the gate compares. Every field is type- and range-checked
and every path must stay inside the cache dir: a marker is input. Older markers read as cold: v6
records no ttnn version or tensorbin format (the cache rebuilds once), v5 and older had another
content identity and stamps.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.common.fileio import CONTENT_DIGEST_ALGORITHM, open_regular
from models.common.weight_cache.layout import VariantPaths, is_marker_name, normalize_components
from models.common.weight_cache.side_files import SideFileError, depth_within, parse_json, read_json_document
from models.common.weight_cache.stamps import FileStamp
from models.common.weight_cache.variant import VariantIdentity

WEIGHT_CACHE_FORMAT_VERSION = 7
UNIDENTIFIED_FORMAT_VERSION = 6  # the last format without the ttnn version and tensorbin format
MAX_MARKER_BYTES = 512 << 20
MAX_FREE_FORM_DEPTH = 16  # build_variant, model_info, model_config (a config.json nests 3 or 4 levels)
_MAX_FILE_BYTES = 1 << 50
_MAX_DIM = 1 << 40
_MAX_ELEMENTS = 1 << 50  # a placeholder's size must fit torch's int64 byte count
_MAX_LAYERS = 1 << 20
_MAX_STAMP = 1 << 80
_MAX_NS = 1 << 63
_MAX_SECONDS = 1e9
_MAX_RUNTIME_CHARS = 128  # a ttnn version or a tensorbin format
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")
_GENERATION = re.compile(r"g[0-9A-Za-z_-]{1,64}")
_MESH_SHAPE = re.compile(r"\((\d+)(?:, (\d+))*,?\)")
# torch dtype names a manifest may hold (strings here; the placeholders map them to torch dtypes)
TORCH_DTYPE_NAMES = frozenset(
    f"torch.{name}"
    for name in ["bfloat16", "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool",
                 "float8_e4m3fn", "float8_e5m2", "complex64", "complex128", "uint16", "uint32", "uint64"]
)


class WeightCacheError(RuntimeError):
    """A weight-cache file cannot be used as asked (the caller should build cold)."""


class MarkerFormatError(ValueError):
    """The marker's bytes are not a valid marker; the message says which field."""


@dataclass(frozen=True)
class FileRecord:
    """One file a marker vouches for: where, how big, its content digest, its stamp when the
    build hashed it, and whether the build provably wrote it (``owned``: ``gc`` may delete it)."""

    path: str
    bytes: int
    digest: str
    stamp: FileStamp | None = None
    owned: bool = True

    def as_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"path": self.path, "bytes": self.bytes, "digest": self.digest}
        if self.stamp is not None:
            body["stamp"] = [self.stamp.inode, self.stamp.mtime_ns, self.stamp.ctime_ns]
        if not self.owned:
            body["owned"] = False
        return body


@dataclass(frozen=True)
class WeightCacheMarker:
    model_name: str
    model_id: str
    content_id: str | None
    generation: str | None
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
    weights: dict[str, tuple[tuple[int, ...], str]] = field(repr=False)
    verified_ns: int = 0
    build_seconds: float | None = None
    ttnn_version: str | None = None
    tensorbin_format: str | None = None

    @property
    def identity(self) -> VariantIdentity:
        """What makes these files valid (what the gate compares with the build it is asked for)."""
        return VariantIdentity(self.build_variant, self.mesh_shape, self.ttnn_version, self.tensorbin_format)

    @property
    def family(self) -> str | None:
        variant = self.build_variant
        return variant.get("family") if isinstance(variant, dict) else None

    @property
    def precision(self) -> str | None:
        variant = self.build_variant
        return variant.get("precision") if isinstance(variant, dict) else None

    def all_files(self) -> tuple[FileRecord, ...]:
        return self.files + ((self.host_sidecar,) if self.host_sidecar else ())

    def evictable_files(self) -> tuple[FileRecord, ...]:
        """The recorded files outside its generation that its build wrote (``owned``): what evicting
        it may delete, each once proven still the recorded file (``tt-cache gc``). Its generation
        goes by the generations' own rule."""
        prefix = f"{self.generation}/" if self.generation else None
        return tuple(r for r in self.all_files() if r.owned and (prefix is None or not r.path.startswith(prefix)))


def draft_marker(
    *,
    model_name: str,
    model_id: str,
    content_id: str | None,
    n_layers: int,
    mesh_shape: Any,
    components: str | Iterable[str] | None,
    build_variant: Mapping[str, Any] | None,
    is_moe: bool,
    model_info: Mapping[str, Any] | None,
    model_config: Mapping[str, Any] | None,
    weights: Mapping[str, tuple[tuple[int, ...], str]],
    host_weights: Iterable[str],
) -> WeightCacheMarker:
    """The marker of a build before its files are sealed (a build transaction, or the seed API,
    fills in ``files``, ``host_sidecar`` and ``verified_ns``): every field normalized as the gate
    compares it, so the loader's builds and the seed API's record the same things the same way.
    The identity is this process's (the one that wrote the files), its tensorbin format probed."""
    identity = VariantIdentity.here(build_variant, mesh_shape, probe=True)
    return WeightCacheMarker(
        model_name=model_name, model_id=model_id, content_id=content_id, generation=None, n_layers=n_layers,
        mesh_shape=identity.mesh_shape, components=tuple(normalize_components(components)),
        build_variant=identity.build_variant, is_moe=bool(is_moe), model_info=dict(model_info or {}),
        model_config=dict(model_config) if model_config is not None else None, files=(),
        host_weights=tuple(sorted(host_weights)), host_sidecar=None, weights=dict(weights),
        ttnn_version=identity.ttnn_version, tensorbin_format=identity.tensorbin_format)


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def _expect(condition: bool, message: str | Callable[[], str]) -> None:
    """Raise :class:`MarkerFormatError` unless ``condition``; a callable message is formatted only
    then (the per-file checks run 10,000 times per gate call: no eager reprs)."""
    if not condition:
        raise MarkerFormatError(message() if callable(message) else message)


def _is_int(value: Any, low: int, high: int) -> bool:
    return type(value) is int and low <= value <= high


_BAD_SEGMENTS = frozenset(("", ".", ".."))


def safe_relative_path(value: Any) -> str:
    """``value`` if it is a relative POSIX path that stays inside its directory, else raise."""
    _expect(
        isinstance(value, str) and 0 < len(value) <= 4096, lambda: f"file path {value!r} is not a short string"
    )
    _expect("\x00" not in value and "\\" not in value, lambda: f"file path {value!r} has a NUL or backslash")
    _expect(value.isascii() or _encodable(value), lambda: f"file path {value!r} is not valid UTF-8 text")
    _expect(not value.startswith("/"), lambda: f"file path {value!r} is absolute")
    _expect(_BAD_SEGMENTS.isdisjoint(value.split("/")), lambda: f"file path {value!r} leaves the cache dir")
    return value


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")  # a lone surrogate (JSON "\ud800") cannot name a file: stat would raise
    except UnicodeEncodeError:
        return False
    return True


def _file_record(value: Any) -> FileRecord:
    # Fast path, one expression for a well-formed record (a 10,000-file marker is parsed on every
    # warm start); anything it does not accept goes through the checks below for their message.
    if type(value) is dict:
        path, size, digest, stamp = value.get("path"), value.get("bytes"), value.get("digest"), value.get("stamp")
        owned = value.get("owned", True)
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
            and type(stamp) is list
            and len(stamp) == 3
            and all(type(v) is int and 0 <= v <= _MAX_STAMP for v in stamp)
            and type(owned) is bool
        ):
            return FileRecord(path, size, digest, tuple.__new__(FileStamp, (stamp[0], size, stamp[1], stamp[2])), owned)
    _expect(isinstance(value, dict), lambda: f"file record {value!r} is not an object")
    size, digest, stamp, owned = value.get("bytes"), value.get("digest"), value.get("stamp"), value.get("owned", True)
    path = safe_relative_path(value.get("path"))
    _expect(_is_int(size, 0, _MAX_FILE_BYTES), lambda: f"file {path}: size {size!r} is not a sane byte count")
    _expect(
        isinstance(digest, str) and _HEX_DIGEST.fullmatch(digest) is not None, lambda: f"file {path}: bad digest"
    )
    _expect(
        stamp is None or (type(stamp) is list and len(stamp) == 3 and all(_is_int(v, 0, _MAX_STAMP) for v in stamp)),
        lambda: f"file {path}: stamp {stamp!r} is not [inode, mtime_ns, ctime_ns]",
    )
    _expect(type(owned) is bool, lambda: f"file {path}: owned {owned!r} is not a bool")
    stamped = None if stamp is None else FileStamp(stamp[0], size, stamp[1], stamp[2])
    return FileRecord(path, size, digest, stamped, owned)


def _weight_spec(key: str, value: Any) -> tuple[tuple[int, ...], str]:
    if type(value) is list and len(value) == 2:  # fast path, as in _file_record
        shape, dtype = value
        if (
            type(shape) is list
            and len(shape) <= 16
            and all(type(d) is int and 0 <= d <= _MAX_DIM for d in shape)
            and type(dtype) is str
            and dtype in TORCH_DTYPE_NAMES
            and math.prod(shape) <= _MAX_ELEMENTS
        ):
            return tuple(shape), dtype
    _expect(isinstance(value, list) and len(value) == 2, lambda: f"weight {key!r}: spec is not [shape, dtype]")
    shape, dtype = value
    _expect(
        isinstance(shape, list) and len(shape) <= 16 and all(_is_int(d, 0, _MAX_DIM) for d in shape),
        lambda: f"weight {key!r}: shape {shape!r} is not a list of sane dimensions",
    )
    _expect(isinstance(dtype, str) and dtype in TORCH_DTYPE_NAMES, lambda: f"weight {key!r}: unknown dtype {dtype!r}")
    _expect(math.prod(shape) <= _MAX_ELEMENTS, lambda: f"weight {key!r}: shape {shape!r} has too many elements")
    return tuple(shape), dtype


def _json_object_or_none(value: Any, name: str) -> dict[str, Any] | None:
    _expect(value is None or isinstance(value, dict), f"{name} is not an object")
    return value


def _optional_str(value: Any, name: str, pattern: re.Pattern | None = None) -> str | None:
    _expect(value is None or (isinstance(value, str) and len(value) <= 4096), f"{name} is not a string")
    _expect(value is None or pattern is None or pattern.fullmatch(value) is not None, f"{name} {value!r} is malformed")
    return value


# Facts a loader restores from model_info after the gate: each must have the right type, or cold.
_MODEL_INFO_TYPES: dict[str, tuple[type, ...]] = {"fuse_qkv": (bool,), "fuse_mlp": (bool,), "num_experts": (int,)}


def _model_info(value: Any) -> dict[str, Any]:
    info = _json_object_or_none(value, "model_info") or {}
    for key, types in _MODEL_INFO_TYPES.items():
        value = info.get(key)
        _expect(value is None or type(value) in types, f"model_info.{key} {value!r} has the wrong type")
    experts = info.get("num_experts")
    _expect(experts is None or _is_int(experts, 0, 1 << 20), lambda: f"model_info.num_experts {experts!r} is not sane")
    return info


def parse_marker(raw: bytes) -> WeightCacheMarker:
    """Parse and validate marker bytes; raise :class:`MarkerFormatError` naming the first bad field."""
    _expect(len(raw) <= MAX_MARKER_BYTES, f"marker is {len(raw):,} bytes, more than {MAX_MARKER_BYTES:,}")
    try:
        body = parse_json(raw, None)  # every field is checked below; the free-form ones for depth
    except SideFileError as error:
        raise MarkerFormatError(f"marker is not UTF-8 JSON: {error}") from None
    _expect(isinstance(body, dict), "marker is not a JSON object")
    for name in ("build_variant", "model_info", "model_config"):
        _expect(depth_within(body.get(name), MAX_FREE_FORM_DEPTH), f"{name} is nested deeper than {MAX_FREE_FORM_DEPTH}")
    version = body.get("format_version")
    _expect(
        not (type(version) is int and 0 < version <= UNIDENTIFIED_FORMAT_VERSION),
        f"marker format_version {version!r} records no ttnn version or tensorbin format (written before "
        f"caches could move between machines; this code reads {WEIGHT_CACHE_FORMAT_VERSION}): the cache rebuilds once",
    )
    _expect(
        version == WEIGHT_CACHE_FORMAT_VERSION and type(version) is int,
        f"marker format_version {version!r}, this code reads {WEIGHT_CACHE_FORMAT_VERSION}",
    )
    _expect(isinstance(body.get("model_name"), str), "model_name is not a string")
    model_id = body.get("model_id", body.get("model_name"))
    _expect(isinstance(model_id, str), "model_id is not a string")
    _expect(_is_int(body.get("n_layers"), 0, _MAX_LAYERS), f"n_layers {body.get('n_layers')!r} is not sane")
    mesh_shape = body.get("mesh_shape")
    _expect(
        isinstance(mesh_shape, str) and _MESH_SHAPE.fullmatch(mesh_shape) is not None,
        f"mesh_shape {mesh_shape!r} is not like '(1, 2)'",
    )
    components = body.get("components")
    _expect(
        isinstance(components, list) and components and all(isinstance(c, str) for c in components),
        "components is not a non-empty list of strings",
    )
    variant = body.get("build_variant")
    _expect(variant is None or isinstance(variant, dict), f"build_variant {variant!r} is not an object")
    _expect(type(body.get("is_moe")) is bool, "is_moe is not a bool")
    _expect(body.get("digest_algorithm") == CONTENT_DIGEST_ALGORITHM, "unknown digest_algorithm")
    verified_ns = body.get("verified_ns")
    _expect(_is_int(verified_ns, 0, _MAX_NS), f"verified_ns {verified_ns!r} is not a time in ns")
    build_seconds = body.get("build_seconds")
    _expect(
        build_seconds is None
        or (type(build_seconds) in (int, float) and math.isfinite(build_seconds) and 0 <= build_seconds < _MAX_SECONDS),
        f"build_seconds {build_seconds!r} is not a duration in seconds",
    )
    for name in ("ttnn_version", "tensorbin_format"):
        _expect(name in body, f"{name} is missing")
        value = body[name]
        _expect(value is None or (isinstance(value, str) and 0 < len(value) <= _MAX_RUNTIME_CHARS and value.isprintable()),
                f"{name} {value!r} is not a short string or null")
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
    _expect(all(key in weights for key in host_weights), "a host weight is missing from weights")
    return WeightCacheMarker(
        model_name=body["model_name"],
        model_id=model_id,
        content_id=_optional_str(body.get("content_id"), "content_id", _HEX_DIGEST),
        generation=_optional_str(body.get("generation"), "generation", _GENERATION),
        n_layers=body["n_layers"],
        mesh_shape=mesh_shape,
        components=tuple(components),
        build_variant=variant,
        is_moe=body["is_moe"],
        model_info=_model_info(body.get("model_info")),
        model_config=_json_object_or_none(body.get("model_config"), "model_config"),
        files=records,
        host_weights=tuple(host_weights),
        host_sidecar=None if sidecar is None else _file_record(sidecar),
        weights={key: _weight_spec(key, spec) for key, spec in weights.items()},
        verified_ns=verified_ns,
        build_seconds=None if build_seconds is None else float(build_seconds),
        ttnn_version=body["ttnn_version"],
        tensorbin_format=body["tensorbin_format"],
    )


def marker_json(marker: WeightCacheMarker) -> bytes:
    """The bytes :func:`parse_marker` reads back as ``marker``."""
    body = {
        "format_version": WEIGHT_CACHE_FORMAT_VERSION,
        "model_name": marker.model_name,
        "model_id": marker.model_id,
        "content_id": marker.content_id,
        "generation": marker.generation,
        "n_layers": marker.n_layers,
        "components": list(marker.components),
        "mesh_shape": marker.mesh_shape,
        "build_variant": marker.build_variant,
        "ttnn_version": marker.ttnn_version,
        "tensorbin_format": marker.tensorbin_format,
        "is_moe": marker.is_moe,
        "model_info": marker.model_info,
        "model_config": marker.model_config,
        "digest_algorithm": CONTENT_DIGEST_ALGORITHM,
        "verified_ns": marker.verified_ns,
        "files": [record.as_json() for record in marker.files],
        "host_weights": list(marker.host_weights),
        "host_sidecar": marker.host_sidecar.as_json() if marker.host_sidecar else None,
        "weights": {key: [list(shape), dtype] for key, (shape, dtype) in marker.weights.items()},
        "build_seconds": marker.build_seconds,
    }
    return json.dumps(body, separators=(",", ":"), allow_nan=False).encode()


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------

_MARKER_MEMO: dict[tuple[str, int, int, int, int], WeightCacheMarker] = {}


def read_marker(paths: VariantPaths) -> WeightCacheMarker:
    """The validated marker of one variant (memoized on path, inode, mtime, ctime and size).

    Raises :class:`WeightCacheError` when it is absent, unreadable or invalid."""
    return read_marker_file(paths.marker)


def read_marker_file(path: Path) -> WeightCacheMarker:
    try:
        fd = open_regular(path)  # a FIFO or device named like a marker is refused, never waited on
    except FileNotFoundError:
        raise WeightCacheError(f"no completion marker {path.name} in {path.parent}") from None
    except OSError as error:
        raise WeightCacheError(f"cannot read marker {path}: {error.strerror or error}") from None
    try:
        with open(fd, "rb", closefd=True) as stream:
            stat = os.fstat(stream.fileno())
            key = (str(path), stat.st_ino, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_size)
            if key in _MARKER_MEMO:
                return _MARKER_MEMO[key]
            raw = stream.read(MAX_MARKER_BYTES + 1)
    except OSError as error:
        raise WeightCacheError(f"cannot read marker {path}: {error.strerror or error}") from None
    try:
        marker = parse_marker(raw)
    except MarkerFormatError as error:
        raise WeightCacheError(f"marker {path} is invalid: {error}") from None
    _MARKER_MEMO.clear()
    _MARKER_MEMO[key] = marker
    return marker


def forget_markers() -> None:
    """Drop the memo (a marker was withdrawn or replaced by this process)."""
    _MARKER_MEMO.clear()


def iter_markers(cache_dir: str | os.PathLike) -> Iterator[tuple[Path, WeightCacheMarker | None, str]]:
    """(marker file, parsed marker or None, problem) for every variant's marker in a cache dir;
    a bad marker is reported, never raised, so one bad variant cannot hide the others."""
    try:
        names = sorted(os.listdir(cache_dir))
    except OSError:
        return
    for name in names:
        if is_marker_name(name):
            path = Path(cache_dir, name)
            try:
                yield path, read_marker_file(path), ""
            except WeightCacheError as error:
                yield path, None, str(error)


def named_generation(marker_file: Path) -> str | None:
    """The generation a marker of any format version names (only its ``generation`` field is read,
    and only if it is a generation's name): what a build must not retire while that marker stands."""
    body = read_json_document(marker_file, MAX_MARKER_BYTES, None)
    name = body.get("generation") if isinstance(body, dict) else None
    return name if isinstance(name, str) and _GENERATION.fullmatch(name) else None


def weights_identity(marker: WeightCacheMarker) -> str:
    """SHA-256 naming exactly the converted weights a marker vouches for (each file's path within
    its build and content digest): equal for bit-identical builds, different for any other.

    Consumers that derive data from a loaded model (the prefill cache's authority) key on it."""
    lines = sorted(f"{build_relative(r.path, marker.generation)}:{r.digest}" for r in marker.files)
    if marker.host_sidecar is not None:
        lines.append(f"sidecar:{marker.host_sidecar.digest}")
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def build_relative(path: str, generation: str | None) -> str:
    """A recorded path without its generation directory (the same file in any build)."""
    prefix = f"{generation}/" if generation else ""
    return path[len(prefix):] if prefix and path.startswith(prefix) else path


def cached_model_config(paths: VariantPaths) -> dict[str, Any]:
    """The checkpoint ``config.json`` kept with the marker (for warm starts without a checkpoint)."""
    config = read_marker(paths).model_config
    if config is None:
        raise WeightCacheError(f"marker in {paths.cache_dir} keeps no model config")
    return config
