# SPDX-License-Identifier: Apache-2.0
"""Push the warm variants of one cache dir to a shared store: only the objects it lacks, the
manifest last.

::

    list the store's objects once
    send each missing object (several at once), each proved against its digest as it is read
    check that every object the manifest names is there with its size (sending again what a gc
    deleted meanwhile)
    write the manifest (a new name: never overwrites another push)
    wait out every running gc, then send again any object it deleted (gc's rule, :mod:`.store_layout`)
    point ``latest`` at the newest manifest, and record the variant under its location (``pull DIR``
    lists them) and under its model key (a cache-only deploy's cold start lists them)

The variant's generation is leased while its files are read, so a build that replaces it meanwhile
never deletes them under the push. A push killed at any point leaves objects (harmless: named by
their content) and never a manifest that names an object the store lacks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.common.weight_cache.gate import marker_status
from models.common.weight_cache.generations import reader_lease
from models.common.weight_cache.layout import CONTENT_PREFIX_HEX, VariantPaths
from models.common.weight_cache.marker import FileRecord, WeightCacheMarker, iter_markers
from models.common.weight_cache.remote.store_layout import (
    is_manifest_name,
    latest_key,
    location_key,
    manifest_json,
    model_index_key,
    model_key_of,
    manifest_of,
    manifests_prefix,
    new_manifest_name,
    object_key,
    objects_prefix,
)
from models.common.weight_cache.remote.retry import retrying
from models.common.weight_cache.remote.store_gc import wait_for_collectors
from models.common.weight_cache.remote.stores import (
    TRANSFER_THREADS,
    RemoteStoreError,
    Store,
    StoreIntegrityError,
)
from models.common.weight_cache.remote.transfer import TransferProgress, run_all, verified_parts


class PushError(RemoteStoreError):
    """The local variant cannot be pushed as it is (cold, or replaced while pushing)."""


@dataclass(frozen=True)
class PushResult:
    cache_dir: Path
    variant_key: str
    manifest: str  # its key in the store
    objects: int
    objects_sent: int
    bytes_total: int
    bytes_sent: int
    seconds: float

    def as_json(self) -> dict[str, Any]:
        return {"cache_dir": str(self.cache_dir), "variant_key": self.variant_key, "manifest": self.manifest,
                "objects": self.objects, "objects_sent": self.objects_sent, "bytes": self.bytes_total,
                "bytes_sent": self.bytes_sent, "seconds": round(self.seconds, 3)}

    def summary(self) -> str:
        return (f"{self.cache_dir}: pushed variant {self.variant_key[:16]} ({self.objects_sent}/{self.objects} objects, "
                f"{self.bytes_sent / 2**20:,.1f}/{self.bytes_total / 2**20:,.1f} MiB sent in {self.seconds:.1f} s)")


def push_cache_dir(cache_dir: Path, store: Store, *, progress: TransferProgress | None = None,
                   threads: int = TRANSFER_THREADS) -> list[PushResult]:
    """Push every variant whose marker is in ``cache_dir``; each must be warm."""
    found = list(iter_markers(cache_dir))
    if not found:
        raise PushError(f"{cache_dir}: no completion marker (push takes a variant dir, <root>/<model>/<precision>/mesh_RxC)")
    results = []
    for marker_file, marker, problem in found:
        if marker is None:
            raise PushError(f"{marker_file}: {problem}")
        paths = VariantPaths(Path(cache_dir), marker.build_variant)
        results.append(push_variant(paths, marker, store, progress=progress, threads=threads))
    return results


def location_of(cache_dir: Path, marker: WeightCacheMarker) -> str:
    """``cache_dir`` relative to its cache root (the parent of the model dir, whose name ends with
    the checkpoint's content id); a cache without one (the seed API's) is its own name."""
    resolved = Path(cache_dir).resolve()
    if marker.content_id:
        suffix = f"--{marker.content_id[:CONTENT_PREFIX_HEX]}"
        for ancestor in (resolved, *resolved.parents):
            if ancestor.name.endswith(suffix):
                return resolved.relative_to(ancestor.parent).as_posix()
    return resolved.name


def push_variant(paths: VariantPaths, marker: WeightCacheMarker, store: Store, *,
                 progress: TransferProgress | None = None, threads: int = TRANSFER_THREADS) -> PushResult:
    """Push one warm variant (see the module doc)."""
    start = time.perf_counter()
    with reader_lease(paths, marker.generation) as leased:
        if not leased:
            raise PushError(f"{paths.cache_dir}: its build was replaced while the push began; push again")
        status = marker_status(paths, marker)
        if not status.warm or status.marker is None:
            raise PushError(f"{paths.marker}: cold ({status.reason}); only a warm variant is pushed")
        local = status.marker
        manifest = manifest_of(local, location_of(paths.cache_dir, local))
        wanted: dict[str, FileRecord] = {}
        for record in local.all_files():  # one local file per object
            wanted.setdefault(record.digest, record)
        present = store.list_sizes(objects_prefix())
        missing = [r for digest, r in wanted.items() if present.get(object_key(digest)) != r.bytes]
        if progress is not None:
            progress.start(len(missing), sum(r.bytes for r in missing))

        def send(record: FileRecord) -> None:
            _send(paths, store, record, present)  # a short one there is replaced
            if progress is not None:
                progress.weight_done(record.path, record.bytes)

        try:
            run_all(send, sorted(missing, key=lambda r: -r.bytes), threads)
        finally:
            if progress is not None:
                progress.finish()

        resent = _resend_lost(paths, store, wanted, threads)  # the check; and a gc may have deleted one
        if resent:  # a gc is deleting what no manifest names yet: let it end, then send what it took
            wait_for_collectors(store)
            resent += _resend_lost(paths, store, wanted, threads)
        stored = store.list_sizes(objects_prefix()) if resent else {}
        short = [r.path for digest, r in wanted.items() if resent and stored.get(object_key(digest)) != r.bytes]
        if short:
            raise StoreIntegrityError(f"{store.url}: {len(short)} object(s) are not stored after the push "
                                      f"(first: {short[0]}); no manifest was written")
        name = manifests_prefix(manifest.variant_key) + new_manifest_name(manifest.pushed_ns)
        store.write_small(name, manifest_json(manifest), exclusive=True)
        wait_for_collectors(store)  # the pusher's side of gc's rule (store_layout): then check again
        resent += _resend_lost(paths, store, wanted, threads)
    manifests = [key for key in store.list_sizes(manifests_prefix(manifest.variant_key))
                 if is_manifest_name(key.rpartition("/")[2])]
    store.write_small(latest_key(manifest.variant_key), max(manifests, default=name).rpartition("/")[2].encode(),
                      exclusive=False)
    store.write_small(location_key(manifest.location, manifest.variant_key), b"", exclusive=True)
    answers_to = model_key_of(manifest.marker)
    if answers_to is not None:
        store.write_small(model_index_key(answers_to, manifest.variant_key), b"", exclusive=True)
    sent = missing + resent
    return PushResult(paths.cache_dir, manifest.variant_key, name, len(wanted), len(sent), manifest.total_bytes,
                      sum(r.bytes for r in sent), time.perf_counter() - start)


def _resend_lost(paths: VariantPaths, store: Store, wanted: dict[str, FileRecord], threads: int) -> list[FileRecord]:
    """Send again each object the store lacks now (a gc deleted it meanwhile); what was sent."""
    stored = store.list_sizes(objects_prefix())
    lost = [r for digest, r in wanted.items() if stored.get(object_key(digest)) != r.bytes]

    run_all(lambda record: _send(paths, store, record, stored), lost, threads)
    return lost


def _send(paths: VariantPaths, store: Store, record: FileRecord, stored: dict[str, int]) -> None:
    """One object, its bytes proved as they are read; written exclusive unless the store holds a
    key of that name already (of the wrong size: the caller found it so); retried by :mod:`.retry`."""
    key = object_key(record.digest)

    def upload() -> None:
        parts = verified_parts(paths.cache_dir / record.path, record.digest, record.bytes)
        store.upload(key, parts, record.bytes, exclusive=key not in stored)

    retrying(upload, key)

