# SPDX-License-Identifier: Apache-2.0
"""Every key of a shared weight-cache store, and the manifest that names a variant's files in it.

A store (an S3 prefix, a directory, or that directory served over HTTP)::

    <prefix>/
        objects/blake3/<aa>/<digest>                 one file's bytes, named by their BLAKE3 digest
                                                     (the one the marker already records; <aa> its
                                                     first two hex digits); immutable, written once
        variants/<variant key>/
            manifests/<pushed_ns>-<token>.json       one push of the variant: its marker and its
                                                     files (relative path, size, digest); never
                                                     overwritten
            latest                                   the name of the newest manifest, for readers
                                                     that cannot list (``http://``)
            used                                     the time (ns) of the variant's last pull, written
                                                     by the pull (best effort: a pull never fails on it)
        locations/<location>/<variant key>           empty: a variant was pushed from <location>
                                                     (``<model>--<id>/<precision>/mesh_RxC`` under a
                                                     cache root), so ``pull DIR`` finds the variants of
                                                     a model or variant dir by listing
        models/<model key>/<variant key>             empty: a variant of this model id was pushed
                                                     (written after its manifest), so a cache-only
                                                     deploy, which knows no content id, finds it by
                                                     listing
        gc/<started_ns>-<token>.json                 a running gc's lease: the time its deletions end
                                                     (``deadline_ns``); removed when it is done

**Content addressing.** An object's key is its digest, so a file is sent once whatever variants
hold it, and a second push of an unchanged variant sends nothing. Nobody rewrites a stored object:
a key is written with ``If-None-Match: *`` where the store supports it, and two writers of one key
write the same bytes anyway; only an object stored with the wrong size (a damaged store) is written
over by the next push of a variant that holds it.

**Publish last.** A pusher writes a manifest only after every object it names is stored and its
size checked; a reader trusts a manifest only when every object it names exists with its size, and
then trusts each object only once its bytes hash to its name. Two pushers of one variant at once
each write their own manifest; the newest trusted one wins.

**Garbage collection** (``tt-cache gc STORE``, :mod:`.store_gc`) evicts whole variants, least
recently used first (the newest of its last push and its ``used``). Its one rule: *withdraw, then
look again, then delete only what nobody named, before a deadline a pusher can see.*

1. write its lease ``gc/…`` (the deadline of every deletion of this run);
2. withdraw each evicted variant: its manifests first, then ``latest``, ``used`` and its
   location and model index entries (a reader from now on finds the variant absent, never half-deleted);
3. list every manifest AFTER that and read each: an object any of them names stays;
4. delete an object only if no manifest of step 3 names it, the store wrote it longer than the
   grace period ago (a push in progress has not published its manifest yet), and the lease's
   deadline has not passed; then remove the lease.

A pusher, after writing its manifest, waits while any lease it lists is before its deadline, then
checks that every object its manifest names is stored and sends again the ones that are not. A
manifest step 3 did not see was written after the lease, so its pusher sees the lease (or, the
lease gone, every deletion already done) and its re-check comes after the last deletion that could
touch it: the variant ends fully present, or (the pusher killed first) with a manifest that readers
refuse because an object is missing, never trusted. The pusher writes ``latest``, its location
entry and its model index entry only after that wait, so a gc never withdraws them from under a new manifest. A key under the
prefix that this layout does not name is never deleted; gc reports it.

**The variant key** is a SHA-256 of the identity the gate matches (:func:`variant_identity`): the
marker's format, the checkpoint's content id (its model name when it has none), layer count,
components and the variant's :class:`~models.common.weight_cache.variant.VariantIdentity` (build
variant, mesh shape, ttnn version, tensorbin format): a host of another ttnn asks for another key. Every other marker field travels in the manifest, and a
pulled variant is warm only if the local gate accepts its marker.

**The model key** is a SHA-256 of what a cache-only deploy wants (:func:`model_identity`): the
model id its marker records in place of the content id, and every other field of the variant
identity, so one listing names only variants this host can load. An index entry is only a lead:
a reader takes its variant key through the newest trusted manifest, and keeps it only if that
manifest's marker derives the same model key (:func:`model_key_of`); several content ids under
one model key are the deploy's to choose.

**A manifest is untrusted input** (:func:`parse_manifest`): size-capped, strict schema, its marker
through :func:`~models.common.weight_cache.marker.parse_marker`, every path relative, inside the
generation, unique and not a name the cache reserves, every digest well formed, its location in the
model dir of its marker's content id (where a loader looks), and the key it is stored under the
one its marker derives.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from models.common.fileio import CONTENT_DIGEST_ALGORITHM, is_temp_path
from models.common.weight_cache.layout import (
    CONTENT_PREFIX_HEX,
    GENERATION_RECORD,
    READERS_LEASE,
    is_generation_name,
    normalize_components,
)
from models.common.weight_cache.marker import (
    WEIGHT_CACHE_FORMAT_VERSION,
    FileRecord,
    MarkerFormatError,
    WeightCacheMarker,
    build_relative,
    marker_json,
    parse_marker,
    safe_relative_path,
)
from models.common.weight_cache.side_files import SideFileError, parse_json
from models.common.weight_cache.variant import VariantIdentity

MANIFEST_VERSION = 1
MAX_MANIFEST_BYTES = 64 << 20  # a 100,000-file variant's manifest is about 20 MB
MAX_POINTER_BYTES = 256
MAX_PATH_DEPTH = 16
OBJECTS = "objects"
VARIANTS = "variants"
LOCATIONS = "locations"
MODELS = "models"
MANIFESTS = "manifests"
LATEST = "latest"
USED = "used"
GC_LEASES = "gc"
_HEX64 = re.compile(r"[0-9a-f]{64}")
_MANIFEST_NAME = re.compile(r"[0-9]{20}-[0-9a-f]{8}\.json")
_OBJECT_KEY = re.compile(rf"{OBJECTS}/{CONTENT_DIGEST_ALGORITHM}/([0-9a-f]{{2}})/([0-9a-f]{{64}})")
_VARIANT_RECORD = re.compile(
    rf"{VARIANTS}/([0-9a-f]{{64}})/({LATEST}|{USED}|{MANIFESTS}/[0-9]{{20}}-[0-9a-f]{{8}}\.json)")
_LEASE_KEY = re.compile(rf"{GC_LEASES}/[0-9]{{20}}-[0-9a-f]{{8}}\.json")
_LOCATION_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+=@,-]{0,254}")
_RESERVED_NAMES = frozenset((GENERATION_RECORD, READERS_LEASE))
_MANIFEST_KEYS = frozenset(("manifest_version", "variant_key", "location", "pushed_ns", "marker"))
_MAX_NS = 1 << 63


class ManifestError(ValueError):
    """A manifest's bytes are not a manifest this code trusts; the message says which field."""


# --------------------------------------------------------------------------------------------
# Keys
# --------------------------------------------------------------------------------------------


def object_key(digest: str, algorithm: str = CONTENT_DIGEST_ALGORITHM) -> str:
    """``objects/<algo>/<aa>/<digest>`` (a malformed digest never becomes a key)."""
    if not _HEX64.fullmatch(digest):
        raise ManifestError(f"digest {digest!r} is not 64 lowercase hex digits")
    return f"{OBJECTS}/{algorithm}/{digest[:2]}/{digest}"


def objects_prefix(algorithm: str = CONTENT_DIGEST_ALGORITHM) -> str:
    return f"{OBJECTS}/{algorithm}/"


def manifests_prefix(variant_key: str) -> str:
    return f"{VARIANTS}/{_checked_key(variant_key)}/{MANIFESTS}/"


def latest_key(variant_key: str) -> str:
    return f"{VARIANTS}/{_checked_key(variant_key)}/{LATEST}"


def used_key(variant_key: str) -> str:
    return f"{VARIANTS}/{_checked_key(variant_key)}/{USED}"


def gc_lease_key(started_ns: int) -> str:
    return f"{GC_LEASES}/{new_manifest_name(started_ns)}"


def gc_leases_prefix() -> str:
    return f"{GC_LEASES}/"


@dataclass(frozen=True)
class LayoutKey:
    """What a key of the store is, by its name alone: ``kind`` one of ``object``, ``manifest``,
    ``latest``, ``used``, ``location``, ``model`` (the model index), ``lease``; ``variant_key`` (or
    an object's digest)."""

    kind: str
    name: str  # the variant key, or an object's digest; "" for a lease


def layout_key(key: str) -> LayoutKey | None:
    """What the layout names ``key`` (None: not a key of the layout, which gc never deletes)."""
    if match := _OBJECT_KEY.fullmatch(key):
        return LayoutKey("object", match.group(2)) if match.group(2).startswith(match.group(1)) else None
    if match := _VARIANT_RECORD.fullmatch(key):
        kind = match.group(2) if match.group(2) in (LATEST, USED) else "manifest"
        return LayoutKey(kind, match.group(1))
    if _LEASE_KEY.fullmatch(key):
        return LayoutKey("lease", "")
    head, _, tail = key.partition("/")
    location, _, name = tail.rpartition("/")
    if head == MODELS and _HEX64.fullmatch(location) and _HEX64.fullmatch(name):
        return LayoutKey("model", name)
    if head == LOCATIONS and _HEX64.fullmatch(name):
        try:
            _check_location(location)
        except ManifestError:
            return None
        return LayoutKey("location", name)
    return None


def location_key(location: str, variant_key: str) -> str:
    return f"{LOCATIONS}/{_check_location(location)}/{_checked_key(variant_key)}"


def locations_prefix(location: str) -> str:
    """Every variant pushed from ``location`` or a dir below it (a model dir holds its variants)."""
    return f"{LOCATIONS}/{_check_location(location)}/"


def model_index_key(model_key: str, variant_key: str) -> str:
    return f"{MODELS}/{_checked_key(model_key)}/{_checked_key(variant_key)}"


def model_index_prefix(model_key: str) -> str:
    """Every variant pushed under ``model_key`` (its variant keys, by listing)."""
    return f"{MODELS}/{_checked_key(model_key)}/"


def keys_in(listing: list[str] | dict[str, int]) -> list[str]:
    """The variant keys a listing of :func:`locations_prefix` or :func:`model_index_prefix` names
    (anything else is left out)."""
    return sorted({key.rpartition("/")[2] for key in listing if _HEX64.fullmatch(key.rpartition("/")[2])})


def new_manifest_name(pushed_ns: int) -> str:
    """``<pushed_ns, 20 digits>-<token>.json``: names sort by push time; no two pushes share one."""
    return f"{pushed_ns:020d}-{secrets.token_hex(4)}.json"


def is_manifest_name(name: str) -> bool:
    return _MANIFEST_NAME.fullmatch(name) is not None


def _checked_key(variant_key: str) -> str:
    if not _HEX64.fullmatch(variant_key):
        raise ManifestError(f"variant key {variant_key!r} is not 64 lowercase hex digits")
    return variant_key


# --------------------------------------------------------------------------------------------
# Identity
# --------------------------------------------------------------------------------------------


def variant_identity(*, content_id: str | None, model_name: str, n_layers: int, components: Any,
                     variant: VariantIdentity) -> dict[str, Any]:
    """What a variant is, as the gate matches it (normalized as a marker records it): the store
    keys manifests by its digest, so a loader can ask for its exact variant before it has a marker."""
    identity = {"content_id": content_id, **_build_identity(n_layers, components, variant)}
    if content_id is None:  # the seed API's caches: no checkpoint digest, the name stands for it
        identity["model_name"] = model_name
    return identity


def model_identity(*, model_id: str, n_layers: int, components: Any, variant: VariantIdentity) -> dict[str, Any]:
    """What a cache-only deploy of ``model_id`` can load: a variant identity with the model id in
    place of the content id it cannot know."""
    return {"model_id": model_id, **_build_identity(n_layers, components, variant)}


def _build_identity(n_layers: int, components: Any, variant: VariantIdentity) -> dict[str, Any]:
    """The fields both keys share: everything of a build but the weights it was made from."""
    return {"format_version": WEIGHT_CACHE_FORMAT_VERSION, "n_layers": n_layers,
            "components": normalize_components(components), "mesh_shape": variant.mesh_shape,
            "build_variant": variant.build_variant, "ttnn_version": variant.ttnn_version,
            "tensorbin_format": variant.tensorbin_format}


def _digest(identity: dict[str, Any]) -> str:
    canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def identity_key(**identity: Any) -> str:
    """The variant key of :func:`variant_identity`'s fields."""
    return _digest(variant_identity(**identity))


def model_key(**identity: Any) -> str:
    """The model key of :func:`model_identity`'s fields."""
    return _digest(model_identity(**identity))


def model_key_of(marker: WeightCacheMarker) -> str | None:
    """The model key a marker's build answers to (None for a cache of no checkpoint content: the
    seed API's, which a cache-only deploy never loads)."""
    if marker.content_id is None:
        return None
    return model_key(model_id=marker.model_id, n_layers=marker.n_layers, components=marker.components,
                     variant=marker.identity)


def variant_key(marker: WeightCacheMarker) -> str:
    """The variant key of the build a marker records."""
    return identity_key(content_id=marker.content_id, model_name=marker.model_name, n_layers=marker.n_layers,
                        components=marker.components, variant=marker.identity)


# --------------------------------------------------------------------------------------------
# Manifests
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Manifest:
    """One push of one variant: where it sits under a cache root, and its marker with every file
    relative to its build (no generation, no stamps: those are the writing host's)."""

    variant_key: str
    location: str
    pushed_ns: int
    marker: WeightCacheMarker

    @property
    def files(self) -> tuple[FileRecord, ...]:
        return self.marker.all_files()

    @property
    def total_bytes(self) -> int:
        return sum(record.bytes for record in self.files)

    def digests(self) -> dict[str, int]:
        """Every object the manifest names, with its size (files of equal content share one)."""
        return {record.digest: record.bytes for record in self.files}


def manifest_of(marker: WeightCacheMarker, location: str, pushed_ns: int | None = None) -> Manifest:
    """The manifest of a local build: paths made relative to its generation, stamps dropped."""

    def portable(record: FileRecord) -> FileRecord:
        return FileRecord(build_relative(record.path, marker.generation), record.bytes, record.digest)

    sidecar = marker.host_sidecar
    portable_marker = dataclasses.replace(
        marker, generation=None, files=tuple(portable(r) for r in marker.files),
        host_sidecar=None if sidecar is None else portable(sidecar))
    _check_files(portable_marker)
    return Manifest(variant_key(portable_marker), _check_location(location),
                    time.time_ns() if pushed_ns is None else pushed_ns, portable_marker)


def manifest_json(manifest: Manifest) -> bytes:
    """The bytes :func:`parse_manifest` reads back as ``manifest``."""
    body = {"manifest_version": MANIFEST_VERSION, "variant_key": manifest.variant_key,
            "location": manifest.location, "pushed_ns": manifest.pushed_ns,
            "marker": json.loads(marker_json(manifest.marker))}
    return json.dumps(body, separators=(",", ":"), allow_nan=False).encode()


def parse_manifest(raw: bytes, expected_key: str | None = None) -> Manifest:
    """Parse and check untrusted manifest bytes; raise :class:`ManifestError` naming the first
    problem. ``expected_key``: the variant key it was stored under, which its marker must derive."""
    _expect(len(raw) <= MAX_MANIFEST_BYTES, f"manifest is {len(raw):,} bytes, more than {MAX_MANIFEST_BYTES:,}")
    try:
        body = parse_json(raw, None)  # every field is checked below; the marker's free-form ones for depth
    except SideFileError as error:
        raise ManifestError(f"manifest is not UTF-8 JSON: {error}") from None
    _expect(isinstance(body, dict), "manifest is not a JSON object")
    unknown = sorted(set(body) - _MANIFEST_KEYS)
    _expect(not unknown, f"manifest has unknown fields {unknown[:5]}")
    version = body.get("manifest_version")
    _expect(type(version) is int and version == MANIFEST_VERSION,
            f"manifest_version {version!r}, this code reads {MANIFEST_VERSION}")
    key = body.get("variant_key")
    _expect(isinstance(key, str) and _HEX64.fullmatch(key) is not None, f"variant_key {key!r} is malformed")
    pushed_ns = body.get("pushed_ns")
    _expect(type(pushed_ns) is int and 0 <= pushed_ns < _MAX_NS, f"pushed_ns {pushed_ns!r} is not a time in ns")
    location = _check_location(body.get("location"))
    marker_body = body.get("marker")
    _expect(isinstance(marker_body, dict), "marker is not an object")
    try:
        marker = parse_marker(json.dumps(marker_body).encode())
    except MarkerFormatError as error:
        raise ManifestError(f"marker: {error}") from None
    _expect(marker.generation is None, "marker names a generation (a manifest's paths are relative to its build)")
    _check_files(marker)
    _expect(marker.content_id is None or location.split("/")[0].endswith(f"--{marker.content_id[:CONTENT_PREFIX_HEX]}"),
            "location is not in the model dir of the marker's checkpoint content")
    derived = variant_key(marker)
    _expect(derived == key, "variant_key is not the one its marker derives")
    _expect(expected_key is None or key == expected_key, "manifest is stored under another variant's key")
    return Manifest(key, location, pushed_ns, marker)


def parse_latest(raw: bytes) -> str:
    """The manifest name a ``latest`` pointer holds (untrusted too)."""
    _expect(len(raw) <= MAX_POINTER_BYTES, "latest pointer is too large")
    name = raw.decode("ascii", "replace").strip()
    _expect(is_manifest_name(name), f"latest pointer {name[:80]!r} is not a manifest name")
    return name


def _check_files(marker: WeightCacheMarker) -> None:
    """Paths a pull may create inside a new generation: unique, not too deep, no file where another
    needs a directory, and no name the cache keeps for itself (a generation's record, its lease,
    a writer's temp file)."""
    seen: set[str] = set()
    directories: set[str] = set()
    for record in marker.all_files():
        try:
            path = safe_relative_path(record.path)
        except MarkerFormatError as error:
            raise ManifestError(str(error)) from None
        parts = PurePosixPath(path).parts
        _expect(len(parts) <= MAX_PATH_DEPTH, f"file path {path!r} is nested deeper than {MAX_PATH_DEPTH}")
        _expect(not any(part in _RESERVED_NAMES or is_temp_path(PurePosixPath(part)) for part in parts),
                f"file path {path!r} uses a name the cache reserves")
        _expect(path not in seen, f"file path {path!r} is listed twice")
        seen.add(path)
        directories.update("/".join(parts[:depth]) for depth in range(1, len(parts)))
    clash = sorted(seen & directories)
    _expect(not clash, f"file path {clash[0]!r} is also a directory of another file" if clash else "")


def check_location(value: Any) -> str:
    """``value`` if it is a location a manifest may hold, else :class:`ManifestError`."""
    return _check_location(value)


def _check_location(value: Any) -> str:
    """Where a variant sits under a cache root (``<name>--<id>/<precision>/mesh_1x2``): relative,
    a few plain segments, none hidden or a generation's name (a pull never writes into ``.stamps``
    or into another build)."""
    _expect(isinstance(value, str) and 0 < len(value) <= 1024, f"location {value!r} is not a short string")
    parts = value.split("/")
    _expect(len(parts) <= 8 and all(_LOCATION_SEGMENT.fullmatch(p) and not is_generation_name(p) for p in parts),
            f"location {value[:200]!r} is not a relative path of plain names")
    return value


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise ManifestError(message)
