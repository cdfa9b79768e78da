# SPDX-License-Identifier: Apache-2.0
"""The on-disk format of the prefill cache, without torch: names, schemas, JSON and the checks a
manifest must pass. The sidecar (reads and writes) and the ``tt-cache prefill`` commands (which
must start fast and never import torch) both check objects with the functions here.

Layout of one cache root::

    <cache_root>/objects/<sha[:2]>/<sha>/
        .writer.lock                  flock of the one writer of this object (empty file)
        .producer.lock                flock of the one producer computing this object's features
        progress.json                 durable frontier of an in-flight store (absent when done)
        final_hidden.<dtype>.bin      raw little-endian [1, 1, H] features
        summary_hidden.<dtype>.bin    raw little-endian [1, S, H] features
        input_positions.i64le         one int64 input position
        manifest.json                 published last: the object exists iff this file does

A v2 manifest records each artifact by its file name *relative to the object directory*, with
its size, element count, dtype and SHA-256, and nothing about the inode that holds it: a cache
root that is moved, copied (``cp -a``, rsync) or mounted elsewhere stays valid, and its first
lookup in a process re-hashes the files as always. v1 manifests (absolute paths, device, inode,
mtime) stay readable: their path must still name this object's own file, and the kernel facts
are diagnostics only.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path, PurePosixPath
from typing import Final

from models.common.fileio import sha256_bytes, sha256_file

FROZEN_BACKBONE_AUTHORITY_SCHEMA_V1: Final = "nnf.resynthesis.frozen_backbone_prefill_authority.v1"
FROZEN_BACKBONE_AUTHORITY_SCHEMA: Final = "nnf.resynthesis.frozen_backbone_prefill_authority.v2"
FROZEN_BACKBONE_PACKET_SCHEMA: Final = "nnf.resynthesis.frozen_backbone_prefill_packet.v1"
FROZEN_BACKBONE_SIDECAR_SCHEMA_V1: Final = "nnf.resynthesis.frozen_backbone_prefill_sidecar.v1"
FROZEN_BACKBONE_SIDECAR_SCHEMA: Final = "nnf.resynthesis.frozen_backbone_prefill_sidecar.v2"
SIDECAR_SCHEMAS: Final = (FROZEN_BACKBONE_SIDECAR_SCHEMA_V1, FROZEN_BACKBONE_SIDECAR_SCHEMA)
FROZEN_BACKBONE_SIDECAR_PROGRESS_SCHEMA: Final = (
    "nnf.resynthesis.frozen_backbone_prefill_sidecar.progress.v1"
)

# Bytes per element of every artifact dtype (the torch dtypes live in the sidecar).
ELEMENT_BYTES: Final[dict[str, int]] = {"float16": 2, "bfloat16": 2, "float32": 4, "int64": 8}
FEATURE_DTYPE_NAMES: Final = ("float16", "bfloat16", "float32")
ARTIFACT_NAMES: Final = ("finalHidden", "summaryHidden", "inputPositions")
NATIVE_PARENT_PREFIX: Final = "resynthesis-native-parent:"
# Fields of a v1 authority that observed the source tree: diagnostics, never identity.
SOURCE_DIAGNOSTIC_FIELDS: Final = frozenset(
    {"parentSourceBundleSha256", "sourceHashDiagnosticOnly", "sourceHashAffectsExecution"}
)
# Flags every record and manifest carries: what the object deliberately does NOT contain.
SCOPE_FLAGS: Final[dict[str, bool]] = dict(
    backboneOnly=True, additiveHeadCached=False, historicalRboCached=False,
    fabricCached=False, targetEnteredForward=False,
)
MANIFEST_MAX_BYTES: Final = 1 << 20
PARTIAL_SUFFIX: Final = ".partial"
LOCK_NAME: Final = ".writer.lock"
PRODUCER_LOCK_NAME: Final = ".producer.lock"
LOCK_NAMES: Final = frozenset({LOCK_NAME, PRODUCER_LOCK_NAME})  # never removed: waiters hold them open
MANIFEST_NAME: Final = "manifest.json"
PROGRESS_NAME: Final = "progress.json"
_V1_KERNEL_FACTS: Final = ("device", "inode", "mtimeNs")


class FrozenBackboneCacheError(RuntimeError):
    """A cache object on disk (or its configuration) is not what it claims to be.

    The one exception type for corrupt, truncated, foreign, unreadable or malformed cache state.
    It subclasses ``RuntimeError`` because callers of the original design already catch that."""


# ---------------------------------------------------------------------------------------------
# Small pure helpers
# ---------------------------------------------------------------------------------------------


def is_sha256_hex(value: object) -> bool:
    return isinstance(value, str) and len(value) == 64 and not value.strip("0123456789abcdef")


def is_int(value: object) -> bool:
    """A real JSON integer: ``True`` is not 1 here."""
    return type(value) is int


def canonical_json(value: object) -> bytes:
    """The one serialization that identities and manifests are hashed in."""
    text = json.dumps(value, ensure_ascii=True, separators=(",", ":"), sort_keys=True)
    return text.encode("ascii")


def json_sha256(value: object) -> str:
    return sha256_bytes(canonical_json(value))


def str_keyed(value: object) -> dict[str, object] | None:
    """``value`` as a dict with only string keys, or None (never coerces)."""
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return dict(value)
    return None


def normalized_authority(value: object) -> dict[str, object] | None:
    """A stored (possibly v1) authority with its source observations removed, in v2 form."""
    record = str_keyed(value)
    if record is None:
        return None
    for name in SOURCE_DIAGNOSTIC_FIELDS:
        record.pop(name, None)
    artifact_sha256 = record.get("parentModelArtifactSha256")
    if is_sha256_hex(artifact_sha256):
        record["parentCheckpointId"] = NATIVE_PARENT_PREFIX + str(artifact_sha256)
    if record.get("schema") == FROZEN_BACKBONE_AUTHORITY_SCHEMA_V1:
        record["schema"] = FROZEN_BACKBONE_AUTHORITY_SCHEMA
    return record


def sha256_of_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# ---------------------------------------------------------------------------------------------
# Paths of one object
# ---------------------------------------------------------------------------------------------


def artifact_file_names(feature_dtype: str) -> tuple[str, str, str]:
    """File names of (final hidden, summary hidden, input positions) inside an object dir."""
    return (f"final_hidden.{feature_dtype}.bin", f"summary_hidden.{feature_dtype}.bin", "input_positions.i64le")


def object_dir(cache_root: Path, object_sha256: str) -> Path:
    return cache_root / "objects" / object_sha256[:2] / object_sha256


@dataclass(frozen=True)
class _ObjectPaths:
    root: Path
    manifest: Path
    progress: Path
    lock: Path
    artifacts: tuple[Path, Path, Path]  # final hidden, summary hidden, input positions

    @classmethod
    def of(cls, cache_root: Path, object_sha256: str, feature_dtype: str) -> _ObjectPaths:
        return cls.in_dir(object_dir(cache_root, object_sha256), feature_dtype)

    @classmethod
    def in_dir(cls, root: Path, feature_dtype: str) -> _ObjectPaths:
        return cls(
            root=root,
            manifest=root / MANIFEST_NAME,
            progress=root / PROGRESS_NAME,
            lock=root / LOCK_NAME,
            artifacts=tuple(root / name for name in artifact_file_names(feature_dtype)),  # type: ignore[arg-type]
        )

    # The design's names for the three artifacts, kept for callers that read them.
    final_hidden = property(lambda self: self.artifacts[0])
    summary_hidden = property(lambda self: self.artifacts[1])
    input_positions = property(lambda self: self.artifacts[2])

    def artifact_paths_boundary(self) -> tuple[Path, Path, Path]:
        return self.artifacts

    @cached_property
    def artifact_names(self) -> tuple[str, ...]:
        return tuple(map(str, self.artifacts))

    @cached_property
    def stamped_names(self) -> tuple[str, ...]:
        """The files whose stamps make up a validation proof: manifest first."""
        return (str(self.manifest), *self.artifact_names)

    @property
    def partials(self) -> tuple[Path, ...]:
        return tuple(path.with_name(path.name + PARTIAL_SUFFIX) for path in self.artifacts)


def object_dirs(cache_root: Path) -> Iterator[Path]:
    """Every ``objects/<aa>/<sha>`` directory under a root, sorted; raises OSError on an
    unreadable or non-directory root (callers turn that into their own error)."""
    objects = Path(cache_root) / "objects"
    if not objects.exists():
        if not Path(cache_root).is_dir():
            raise NotADirectoryError(f"{cache_root} is not a directory")
        return
    for shard in sorted(objects.iterdir()):
        if shard.is_dir() and not shard.is_symlink():
            for entry in sorted(shard.iterdir()):
                if entry.is_dir() and not entry.is_symlink():
                    yield entry


# ---------------------------------------------------------------------------------------------
# Reading and checking JSON records
# ---------------------------------------------------------------------------------------------


def read_json_object(path: Path, what: str) -> tuple[dict[str, object], bytes]:
    """Parse a small JSON object file; any problem is a FrozenBackboneCacheError."""
    try:
        with open(path, "rb") as stream:
            data = stream.read(MANIFEST_MAX_BYTES + 1)
    except OSError as error:
        raise FrozenBackboneCacheError(f"cannot read {what} {path}: {error}") from error
    return parse_json_object(data, path, what), data


def parse_json_object(data: bytes | bytearray, path: Path, what: str) -> dict[str, object]:
    """The JSON object in ``data`` (the bytes of ``path``); any problem is a FrozenBackboneCacheError."""
    if len(data) > MANIFEST_MAX_BYTES:
        raise FrozenBackboneCacheError(f"{what} {path} is larger than {MANIFEST_MAX_BYTES} bytes")
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as error:  # bad JSON, bad UTF-8, 5000-digit numbers
        raise FrozenBackboneCacheError(f"{what} {path} is not valid JSON: {error}") from error
    record = str_keyed(value)
    if record is None:
        raise FrozenBackboneCacheError(f"{what} {path} is not a JSON object")
    return record


def expect(condition: bool, root: Path, message: str) -> None:
    if not condition:
        raise FrozenBackboneCacheError(
            f"frozen-backbone cache object {root} is invalid: {message}; "
            "store the object again to rebuild it"
        )


@dataclass(frozen=True)
class ArtifactSpec:
    """What one artifact file must be, derived from the object's stored authority."""

    name: str  # manifest key
    file_name: str
    elements: int
    dtype: str

    @property
    def nbytes(self) -> int:
        return self.elements * ELEMENT_BYTES[self.dtype]


def artifact_specs(feature_dtype: str, hidden_size: int, summary_positions: int) -> tuple[ArtifactSpec, ...]:
    files = artifact_file_names(feature_dtype)
    elements = (hidden_size, summary_positions * hidden_size, 1)
    dtypes = (feature_dtype, feature_dtype, "int64")
    return tuple(map(ArtifactSpec, ARTIFACT_NAMES, files, elements, dtypes))


def check_manifest_header(root: Path, manifest: dict[str, object]) -> dict[str, object]:
    """Check a manifest's schema, self-naming and scope; return its stored authority record."""
    stored = str_keyed(manifest.get("authority"))
    stored_sha256 = manifest.get("authoritySha256")
    expect(manifest.get("schema") in SIDECAR_SCHEMAS, root, "unknown manifest schema")
    expect(
        is_sha256_hex(stored_sha256) and root.name == stored_sha256 and root.parent.name == stored_sha256[:2],
        root,
        "authoritySha256 does not name this object directory",
    )
    expect(stored is not None and json_sha256(stored) == stored_sha256, root,
           "stored authority does not hash to authoritySha256")
    expect(is_int(manifest.get("rows")) and manifest.get("rows") == 1, root, "rows is not 1")
    for flag, expected in SCOPE_FLAGS.items():
        expect(manifest.get(flag) is expected, root, f"{flag} is not {expected}")
    return stored  # type: ignore[return-value]


def specs_of_authority(root: Path, stored: dict[str, object]) -> tuple[ArtifactSpec, ...]:
    """The artifacts a stored authority promises (its dtype and sizes), checked for sanity."""
    dtype, hidden, positions = stored.get("featureDtype"), stored.get("hiddenSize"), stored.get("summaryPositions")
    expect(dtype in FEATURE_DTYPE_NAMES, root, f"featureDtype {dtype!r:.40} is not a feature dtype")
    expect(is_int(hidden) and hidden >= 1 and is_int(positions) and positions >= 1, root,
           "hiddenSize and summaryPositions must be positive integers")
    return artifact_specs(dtype, hidden, positions)  # type: ignore[arg-type]


def check_recorded_path(root: Path, schema: object, spec: ArtifactSpec, recorded: object) -> None:
    """The manifest's path of an artifact must be this object's own file.

    v2: exactly the file name, relative to the object dir. v1: an absolute path whose last three
    components are ``<sha[:2]>/<sha>/<file>`` (the object may since have moved with its root);
    any other path - another object, ``..``, a file outside the cache - is refused."""
    expect(isinstance(recorded, str), root, f"{spec.name}.path is not a string")
    if schema == FROZEN_BACKBONE_SIDECAR_SCHEMA:
        expect(recorded == spec.file_name, root,
               f"{spec.name}.path {recorded!r:.120} is not {spec.file_name!r} inside the object dir")
        return
    path = PurePosixPath(recorded)  # type: ignore[arg-type]
    inside = (
        path.is_absolute()
        and ".." not in path.parts
        and path.parts[-3:] == (root.parent.name, root.name, spec.file_name)
    )
    expect(inside, root, f"{spec.name}.path {recorded!r:.120} leaves the object directory")


def check_artifact_record(root: Path, schema: object, spec: ArtifactSpec, value: object, size: int) -> str:
    """Check one artifact record against the spec and the file's size; return its SHA-256."""
    record = str_keyed(value)
    expect(record is not None, root, f"{spec.name} record is missing")
    check_recorded_path(root, schema, spec, record.get("path"))
    expected = {"bytes": size, "elements": spec.elements, "dtype": spec.dtype}
    for field_name, wanted in expected.items():
        stored = record.get(field_name)
        expect(
            type(stored) is type(wanted) and stored == wanted,
            root,
            f"{spec.name}.{field_name} is {stored!r:.80}, the file says {wanted!r}",
        )
    if schema == FROZEN_BACKBONE_SIDECAR_SCHEMA_V1:
        for fact in _V1_KERNEL_FACTS:  # where the file once lived: diagnostics, never compared
            expect(is_int(record.get(fact)), root, f"{spec.name}.{fact} is not an integer")
    else:
        expect(set(record) == {"path", "bytes", "elements", "dtype", "sha256"}, root,
               f"{spec.name} record has unknown fields")
    expect(size == spec.nbytes, root, f"{spec.name} has the wrong size")
    recorded_sha256 = record.get("sha256")
    expect(is_sha256_hex(recorded_sha256), root, f"{spec.name}.sha256 is not a SHA-256")
    return recorded_sha256  # type: ignore[return-value]


def regular_file_stat(path: Path, root: Path, what: str) -> os.stat_result:
    try:
        observed = os.stat(path)
    except FileNotFoundError:
        expect(False, root, f"{what} is missing")
    expect(stat.S_ISREG(observed.st_mode), root, f"{what} is not a regular file")
    return observed


def hash_matches(root: Path, path: Path, spec: ArtifactSpec, recorded_sha256: str) -> None:
    try:
        actual = sha256_file(path)
    except OSError as error:
        raise FrozenBackboneCacheError(f"cannot read {path}: {error}") from error
    digest_matches(root, spec, actual, recorded_sha256)


def digest_matches(root: Path, spec: ArtifactSpec, actual_sha256: str, recorded_sha256: str) -> None:
    expect(actual_sha256 == recorded_sha256, root, f"{spec.name} content does not match its SHA-256")


def recorded_digests(root: Path, manifest: dict[str, object], specs: tuple[ArtifactSpec, ...],
                     sizes: tuple[int, ...]) -> tuple[str, ...]:
    """Check every artifact record of a manifest against its spec and its file's size (``sizes``,
    in ``specs`` order); return the SHA-256 each records."""
    artifacts = str_keyed(manifest.get("artifacts"))
    expect(artifacts is not None, root, "manifest has no artifacts object")
    return tuple(
        check_artifact_record(root, manifest.get("schema"), spec, artifacts.get(spec.name), size)
        for spec, size in zip(specs, sizes, strict=True)
    )


def check_artifacts(root: Path, manifest: dict[str, object], specs: tuple[ArtifactSpec, ...]) -> None:
    """Every artifact of a manifest: its record, its file's size and its SHA-256 (reads them all)."""
    for spec in specs:
        path = root / spec.file_name
        observed = regular_file_stat(path, root, spec.name)
        (recorded,) = recorded_digests(root, manifest, (spec,), (observed.st_size,))
        hash_matches(root, path, spec, recorded)


def artifact_record(spec: ArtifactSpec, size: int, sha256: str) -> dict[str, object]:
    """The v2 manifest record of one artifact: relative path, size, geometry, digest."""
    return {"path": spec.file_name, "bytes": size, "elements": spec.elements, "dtype": spec.dtype,
            "sha256": sha256}


def manifest_bytes(authority_sha256: str, authority_record: dict[str, object],
                   records: dict[str, dict[str, object]]) -> bytes:
    manifest: dict[str, object] = {
        "schema": FROZEN_BACKBONE_SIDECAR_SCHEMA,
        "authoritySha256": authority_sha256,
        "authority": authority_record,
        "rows": 1,
    }
    manifest.update(SCOPE_FLAGS)
    manifest["artifacts"] = records
    return canonical_json(manifest) + b"\n"
