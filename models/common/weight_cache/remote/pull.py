# SPDX-License-Identifier: Apache-2.0
"""Pull one variant from a shared store into a new local generation, through the one build
transaction, so a pulled cache is exactly as trustworthy as a built one.

::

    the newest trusted manifest of the variant key     (every object it names exists, with its size)
    a marker of another ttnn or tensorbin format  -> cold, nothing fetched or written (the reason)
    with BuildTransaction(paths) as build:             (the build lock: one pull or build at a time)
        warm already?  -> done, nothing fetched
        fetch every object into .pulled-objects/       (each hashed as written, checked against its
                                                        name, fsynced; kept there across a kill; a
                                                        store that stops answering is retried, .retry)
        link each file into a new generation; drop the staged names
        build.commit(marker, files, expected=digests)  (stamped: the linked files are the bytes
                                                        hashed as written, not read again; the
                                                        marker last)
    record the pull in the store (the variant's ``used``, gc's recency; best effort)

**Only this host's identity is pulled.** A manifest's marker records the ttnn and the tensorbin
format its files were written with; a pull compares them with this host's before it fetches a byte
(:meth:`~models.common.weight_cache.variant.VariantIdentity.mismatch`, the gate's own comparison,
against the format probed here), so a variant this host's ttnn cannot read never enters the local
cache, where it would replace a warm variant of the same build in its dir.

A pull killed anywhere leaves no marker: the next build or pull removes its generation, and the
objects it verified are not fetched again. A missing or corrupt object fails the pull with nothing
published.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loguru import logger

from models.common.fileio import fsync_dirs, fsync_file
from models.common.weight_cache.build import BuildTransaction
from models.common.weight_cache.gate import CacheStatus, weight_cache_status
from models.common.weight_cache.layout import VariantPaths
from models.common.weight_cache.marker import WeightCacheError, WeightCacheMarker
from models.common.weight_cache.remote.store_layout import (
    MAX_MANIFEST_BYTES,
    MAX_POINTER_BYTES,
    Manifest,
    ManifestError,
    is_manifest_name,
    keys_in,
    latest_key,
    locations_prefix,
    manifests_prefix,
    model_index_prefix,
    model_key_of,
    object_key,
    objects_prefix,
    parse_latest,
    parse_manifest,
)
from models.common.weight_cache.remote.retry import retrying
from models.common.weight_cache.remote.store_gc import record_pull
from models.common.weight_cache.remote.stores import (
    TRANSFER_THREADS,
    ObjectMissing,
    RemoteStoreError,
    Store,
    StoreIntegrityError,
    StoreUnavailable,
)
from models.common.weight_cache.remote.transfer import (
    TransferProgress,
    fetch_object,
    run_all,
    staged_path,
)
from models.common.weight_cache.variant import VariantIdentity


class CacheNotWritable(RemoteStoreError):
    """The local cache dir cannot take the pull (bad input: the CLI's exit 2)."""


@dataclass(frozen=True)
class PullResult:
    cache_dir: Path
    variant_key: str
    manifest: str
    warm: bool
    reason: str
    already_warm: bool
    objects: int
    objects_fetched: int
    bytes_total: int
    bytes_fetched: int
    seconds: float

    def as_json(self) -> dict[str, Any]:
        return {"cache_dir": str(self.cache_dir), "variant_key": self.variant_key, "manifest": self.manifest,
                "warm": self.warm, "reason": self.reason, "already_warm": self.already_warm, "objects": self.objects,
                "objects_fetched": self.objects_fetched, "bytes": self.bytes_total,
                "bytes_fetched": self.bytes_fetched, "seconds": round(self.seconds, 3)}

    def summary(self) -> str:
        if self.already_warm:
            return f"{self.cache_dir}: already warm (variant {self.variant_key[:16]}); nothing fetched"
        state = "warm" if self.warm else f"cold: {self.reason}"
        return (f"{self.cache_dir}: pulled variant {self.variant_key[:16]}, {state} ({self.objects_fetched}/"
                f"{self.objects} objects, {self.bytes_fetched / 2**20:,.1f}/{self.bytes_total / 2**20:,.1f} MiB "
                f"fetched in {self.seconds:.1f} s)")


# --------------------------------------------------------------------------------------------
# Which manifest
# --------------------------------------------------------------------------------------------


def read_manifest(store: Store, key: str, variant_key: str | None = None) -> Manifest:
    raw = store.read_small(key, MAX_MANIFEST_BYTES)
    if raw is None:
        raise ObjectMissing(f"{store.url}: no manifest {key}")
    try:
        return parse_manifest(raw, variant_key)
    except ManifestError as error:
        raise StoreIntegrityError(f"{store.url}: manifest {key} is refused: {error}") from None


def missing_objects(store: Store, manifest: Manifest, present: dict[str, int] | None = None,
                    threads: int = TRANSFER_THREADS) -> list[str]:
    """The objects ``manifest`` names that the store lacks or holds with another size
    (``present``: a listing of the objects already made; else one HEAD per object)."""
    wanted = sorted(manifest.digests().items())
    if present is None:
        sizes = run_all(lambda item: store.size(object_key(item[0])), wanted, threads)
    else:
        sizes = [present.get(object_key(digest)) for digest, _ in wanted]
    return [digest for (digest, size), stored in zip(wanted, sizes) if stored != size]


def variant_keys_at(store: Store, location: str) -> list[str]:
    """The variants pushed from a model or variant dir (``location`` under a cache root)."""
    if not store.can_list:
        raise StoreUnavailable(f"{store.url}: an HTTP mirror cannot be listed; pull by the variant key push printed")
    return keys_in(store.list_sizes(locations_prefix(location)))


def trusted_manifests_of_model(store: Store, model_key: str) -> list[tuple[str, Manifest]]:
    """(key, manifest) of the newest trusted manifest of each variant indexed under ``model_key``
    whose marker derives that model key; an entry whose manifest is missing, incomplete or of
    another model is left out (one log line): the index is a lead, the manifest the proof."""
    if not store.can_list:
        raise StoreUnavailable(f"{store.url}: an HTTP mirror cannot be listed by model id; pull by the variant key")
    found = []
    for variant_key in keys_in(store.list_sizes(model_index_prefix(model_key))):
        try:
            key, manifest = trusted_manifest(store, variant_key)
        except StoreIntegrityError as error:  # ObjectMissing too: an entry without its manifest
            logger.info(f"{store.url}: model index entry {variant_key[:16]} is ignored ({error})")
            continue
        if model_key_of(manifest.marker) != model_key:
            logger.warning(f"{store.url}: model index entry {variant_key[:16]} names a variant of another model "
                           f"({manifest.marker.model_id}); ignored")
            continue
        found.append((key, manifest))
    return found


def trusted_manifest(store: Store, variant_key: str) -> tuple[str, Manifest]:
    """(key, manifest) of the newest manifest of ``variant_key`` whose objects are all stored."""
    if store.can_list:
        names = sorted((key for key in store.list_sizes(manifests_prefix(variant_key))
                        if is_manifest_name(key.rpartition("/")[2])), reverse=True)
        present = store.list_sizes(objects_prefix()) if names else {}
    else:
        raw = store.read_small(latest_key(variant_key), MAX_POINTER_BYTES)
        try:
            names = [] if raw is None else [manifests_prefix(variant_key) + parse_latest(raw)]
        except ManifestError as error:
            raise StoreIntegrityError(f"{store.url}: {latest_key(variant_key)} is refused: {error}") from None
        present = None
    problems = []
    for key in names:
        try:
            manifest = read_manifest(store, key, variant_key)
        except StoreIntegrityError as error:
            problems.append(str(error))
            continue
        missing = missing_objects(store, manifest, present)
        if not missing:
            return key, manifest
        problems.append(f"{key} names {len(missing)} object(s) the store lacks (first: {object_key(missing[0])})")
    if not names:
        raise ObjectMissing(f"{store.url}: no manifest of variant {variant_key}")
    raise StoreIntegrityError(f"{store.url}: no complete manifest of variant {variant_key[:16]} ({problems[0]})")


# --------------------------------------------------------------------------------------------
# The pull
# --------------------------------------------------------------------------------------------


def local_status(paths: VariantPaths, marker: WeightCacheMarker) -> CacheStatus:
    """The local gate for exactly the variant a manifest's marker is (``paths`` are that variant's)."""
    return weight_cache_status(paths, model_name=marker.model_name, n_layers=marker.n_layers,
                               mesh_shape=marker.mesh_shape, components=marker.components, force_env=None,
                               content_id=marker.content_id)


def host_identity(marker: WeightCacheMarker) -> VariantIdentity:
    """The identity this host's ttnn gives the build ``marker`` records: the recorded probe of this
    install, else probed now (a pull writes files this ttnn will read, so the format is compared too)."""
    here = VariantIdentity.here(marker.build_variant, marker.mesh_shape)
    if here.ttnn_version is not None and here.tensorbin_format is None:
        here = VariantIdentity.here(marker.build_variant, marker.mesh_shape, probe=True)
    return here


def foreign_identity(manifest: Manifest) -> str | None:
    """Why this host cannot use the variant ``manifest`` names, in words (None: it can)."""
    return manifest.marker.identity.mismatch(host_identity(manifest.marker))


def pull_variant(store: Store, manifest: Manifest, cache_root: Path, *, manifest_key: str = "",
                 into: Path | None = None, progress: TransferProgress | None = None,
                 threads: int = TRANSFER_THREADS) -> PullResult:
    """Fetch the variant ``manifest`` names into ``into`` (default ``<cache_root>/<location>``)
    and seal it as a new generation (see the module doc)."""
    start = time.perf_counter()
    marker = manifest.marker
    cache_dir = Path(into) if into is not None else Path(cache_root) / manifest.location
    paths = VariantPaths(cache_dir, marker.build_variant)
    objects = manifest.digests()

    def result(status: CacheStatus, already: bool, fetched: list[int]) -> PullResult:
        return PullResult(cache_dir, manifest.variant_key, manifest_key, status.warm, status.reason, already,
                          len(objects), sum(1 for n in fetched if n), manifest.total_bytes, sum(fetched),
                          time.perf_counter() - start)

    foreign = foreign_identity(manifest)
    if foreign is not None:  # never fetched, never written: the local cache stays as it was
        return result(CacheStatus(False, f"not pulled: {foreign}"), False, [])
    try:
        fetched = _pull_into(store, manifest, paths, progress, threads)
    except OSError as error:  # the local disk: full, read-only, failing
        raise CacheNotWritable(f"{cache_dir}: the pull cannot write there ({error.strerror or error}); "
                               "nothing was published") from None
    status = local_status(paths, marker)
    if status.warm:
        record_pull(store, manifest.variant_key)  # gc's recency; never fails the pull
    return result(status, fetched is None, fetched or [])


def _pull_into(store: Store, manifest: Manifest, paths: VariantPaths, progress: TransferProgress | None,
               threads: int) -> list[int] | None:
    """The pull under the build lock; the bytes fetched per object (None: the variant is warm already)."""
    marker = manifest.marker
    objects = manifest.digests()
    cache_dir = paths.cache_dir
    cache_dir.mkdir(parents=True, exist_ok=True)
    with BuildTransaction(paths) as build:
        if not build.locked:
            raise CacheNotWritable(f"{cache_dir}: cannot take the build lock ({build.lock.why})")
        if local_status(paths, marker).warm:
            return None
        if progress is not None:
            progress.start(len(objects), manifest.total_bytes)

        def fetch(item: tuple[str, int]) -> int:
            digest, size = item
            _, fetched = retrying(lambda: fetch_object(store, digest, size, paths.pulled_objects), object_key(digest))
            if progress is not None:
                progress.weight_done(digest[:16], size)
            return fetched

        try:  # the largest first: it is never alone at the end
            fetched = run_all(fetch, sorted(objects.items(), key=lambda item: -item[1]), threads)
        finally:
            if progress is not None:
                progress.finish()
        root = build.open_generation()
        linked = [record.path for record in marker.all_files()
                  if _place(staged_path(paths.pulled_objects, record.digest), root / record.path)]
        fsync_dirs({(root / record.path).parent for record in marker.all_files()} | {root})
        for digest in objects:  # before the seal: unlinking a name changes the file's ctime, its stamp
            with contextlib.suppress(FileNotFoundError):
                staged_path(paths.pulled_objects, digest).unlink()
        with contextlib.suppress(OSError):
            paths.pulled_objects.rmdir()
        try:
            build.commit(marker, [record.path for record in marker.files],
                         marker.host_sidecar.path if marker.host_sidecar else None,
                         expected={record.path: record.digest for record in marker.all_files()},
                         hashed_as_written=linked)
        except WeightCacheError as error:
            raise StoreIntegrityError(f"{cache_dir}: {error}") from None
    return fetched


def _place(staged: Path, destination: Path) -> bool:
    """A verified object at its path in the generation: a hard link (True: the very bytes this
    pull hashed, so the seal need not read them again), else a copy (False: the seal hashes it)."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(staged, destination)
        return True
    except OSError:  # a file system without hard links
        shutil.copyfile(staged, destination)
        fsync_file(destination)
        return False
