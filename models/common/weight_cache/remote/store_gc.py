# SPDX-License-Identifier: Apache-2.0
"""gc of a shared store: evict whole variants, least recently used first, by the rule of
:mod:`.store_layout` (withdraw, look again, delete only what nobody names, before a deadline).

Plan, then execute (as ``tt-cache gc`` of a cache root does): :func:`plan_store_gc` lists the store
once and says which variants go, which objects with them and how many bytes, deleting nothing;
:func:`collect_store_garbage` carries the plan out and reports what it deleted. Recency is the
newest of a variant's last push (its newest manifest's name) and its last pull (``used``).

A pusher's side of the rule is :func:`wait_for_collectors`: after it wrote its manifest it waits
out every running gc, then re-checks its objects.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from loguru import logger

from models.common.weight_cache.remote.store_layout import (
    LOCATIONS,
    MAX_MANIFEST_BYTES,
    MAX_POINTER_BYTES,
    VARIANTS,
    gc_lease_key,
    gc_leases_prefix,
    latest_key,
    layout_key,
    manifests_prefix,
    object_key,
    used_key,
)
from models.common.weight_cache.remote.stores import (
    TRANSFER_THREADS,
    RemoteStoreError,
    Store,
    StoredKey,
    StoreUnavailable,
)
from models.common.weight_cache.remote.transfer import run_all

GRACE_S = 3600.0  # an object younger than this may belong to a push that has not published yet
LEASE_S = 600.0  # a gc's deletions end this long after it wrote its lease (a killed gc holds pushes no longer)
LAST_DELETE_S = 120.0  # no deletion starts this close to the deadline (a request may take this long)
CLOCK_SKEW_S = 60.0  # a pusher waits past a lease's deadline by this much (another host's clock)
LEASE_POLL_S = 0.25
_HEX64 = re.compile(rb"[0-9a-f]{64}")


@dataclass(frozen=True)
class StoredVariant:
    """One variant as the store holds it: its keys, when it was last pushed or pulled, its objects."""

    variant_key: str
    location: str | None
    manifests: tuple[str, ...]
    records: tuple[str, ...]  # latest, used, location entries
    last_used: float  # seconds since the epoch
    objects: frozenset[str]  # object keys its manifests name
    record_bytes: int  # its manifests' and records' bytes

    def as_json(self) -> dict[str, Any]:
        return {"variant_key": self.variant_key, "location": self.location, "manifests": list(self.manifests),
                "last_used": self.last_used, "objects": len(self.objects)}


@dataclass(frozen=True)
class StoreEviction:
    variant: StoredVariant
    why: str
    freed_bytes: int  # its records and the objects no kept variant names

    def as_json(self) -> dict[str, Any]:
        return {**self.variant.as_json(), "why": self.why, "freed_bytes": self.freed_bytes}


@dataclass
class StoreGcResult:
    """A plan (what would go) or what was done (what went)."""

    store: str
    evicted: list[StoreEviction] = field(default_factory=list)
    objects: dict[str, int] = field(default_factory=dict)  # object key -> size: deleted (or to be)
    dangling: list[str] = field(default_factory=list)  # records of a variant no manifest is left of
    stale_leases: list[str] = field(default_factory=list)  # of gc runs killed before they removed them
    young: list[str] = field(default_factory=list)  # unnamed objects within the grace period: kept
    foreign: list[str] = field(default_factory=list)  # keys the layout does not name: never touched
    kept_objects: list[str] = field(default_factory=list)  # planned, but named again or rewritten since
    deferred: list[str] = field(default_factory=list)  # planned, but the lease's deadline came first
    repushed: list[str] = field(default_factory=list)  # evicted variants pushed again meanwhile: kept
    kept: int = 0
    kept_bytes: int = 0
    freed_bytes: int = 0

    def as_json(self) -> dict[str, Any]:
        return {"store": self.store, "evicted": [e.as_json() for e in self.evicted],
                "objects": sorted(self.objects), "object_bytes": sum(self.objects.values()),
                "dangling": self.dangling, "stale_leases": self.stale_leases, "young": self.young,
                "foreign": self.foreign,
                "kept_objects": self.kept_objects, "deferred": self.deferred, "repushed": self.repushed,
                "kept": self.kept, "kept_bytes": self.kept_bytes, "freed_bytes": self.freed_bytes}


# --------------------------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------------------------


def named_objects(raw: bytes) -> set[str]:
    """Every object key a manifest's bytes could name: any 64-hex run in them, so a manifest this
    code refuses (damaged, or of a newer format) still keeps what it names."""
    return {object_key(match.decode()) for match in _HEX64.findall(raw)}


def _read_names(store: Store, keys: list[str], threads: int) -> dict[str, set[str]]:
    def read(key: str) -> set[str]:
        raw = store.read_small(key, MAX_MANIFEST_BYTES)
        return set() if raw is None else named_objects(raw)

    return dict(zip(keys, run_all(read, keys, threads)))


def _last_pull(store: Store, key: str, stored: StoredKey) -> float:
    """A ``used`` record's time (the store's own write time when its content is not one)."""
    raw = store.read_small(key, MAX_POINTER_BYTES) or b""
    text = raw.decode("ascii", "replace").strip()
    return int(text) / 1e9 if text.isdigit() and len(text) <= 20 else stored.modified


def plan_store_gc(store: Store, *, max_size: int | None = None, older_than: float | None = None,
                  grace: float = GRACE_S, now: float | None = None, threads: int = TRANSFER_THREADS) -> StoreGcResult:
    """Which variants go (nothing is deleted): unused for longer than ``older_than`` seconds, then
    least recently used first until the store's layout keys fit in ``max_size`` bytes. An object
    goes when no kept variant's manifest names it and the store wrote it over ``grace`` s ago."""
    if not store.can_list:
        raise StoreUnavailable(f"{store.url}: an HTTP mirror cannot be listed (gc the directory it serves)")
    now = time.time() if now is None else now
    listing = store.list_keys("")
    result = StoreGcResult(store.url)
    by_variant: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    objects: dict[str, StoredKey] = {}
    for key, stored in sorted(listing.items()):
        kind = layout_key(key)
        if kind is None:
            result.foreign.append(key)
        elif kind.kind == "object":
            objects[key] = stored
        elif kind.kind == "lease":
            if _lease_deadline(store, key) + CLOCK_SKEW_S < now:
                result.stale_leases.append(key)
        else:
            by_variant[kind.name][kind.kind].append(key)
    manifest_keys = [key for keys in by_variant.values() for key in keys["manifest"]]
    names = _read_names(store, manifest_keys, threads)
    used = [key for keys in by_variant.values() for key in keys["used"]]
    pulls = dict(zip(used, run_all(lambda key: _last_pull(store, key, listing[key]), used, threads)))
    variants = []
    for variant_key, keys in sorted(by_variant.items()):
        records = keys["latest"] + keys["used"] + keys["location"] + keys["model"]
        if not keys["manifest"]:  # withdrawn (a pull's late ``used``, a push killed before its manifest)
            result.dangling += [key for key in records if listing[key].modified < now - grace]
            continue
        pushed = max(int(key.rpartition("/")[2][:20]) for key in keys["manifest"]) / 1e9
        pulled = max((pulls[key] for key in keys["used"]), default=0.0)
        location = keys["location"][0][len(LOCATIONS) + 1:].rpartition("/")[0] if keys["location"] else None
        named = frozenset(set().union(*(names[key] for key in keys["manifest"])) & objects.keys())
        variants.append(StoredVariant(variant_key, location, tuple(keys["manifest"]), tuple(records),
                                      max(pushed, pulled), named,
                                      sum(listing[key].size for key in keys["manifest"] + records)))
    references: dict[str, int] = defaultdict(int)
    for variant in variants:
        for key in variant.objects:
            references[key] += 1
    total = sum(stored.size for key, stored in listing.items() if layout_key(key) is not None)

    def release(key: str) -> int:
        """An object no kept variant names any more: planned if old enough, else kept as young."""
        if objects[key].modified < now - grace:
            result.objects[key] = objects[key].size
            return objects[key].size
        result.young.append(key)
        return 0

    total -= sum(release(key) for key in objects if references[key] == 0)
    total -= sum(listing[key].size for key in result.dangling)

    def evict(variant: StoredVariant, why: str) -> None:
        nonlocal total
        freed = variant.record_bytes
        for key in variant.objects:
            references[key] -= 1
            if references[key] == 0:
                freed += release(key)
        total -= freed
        result.evicted.append(StoreEviction(variant, why, freed))

    kept = []
    for variant in sorted(variants, key=lambda v: v.last_used):
        idle = now - variant.last_used
        if older_than is not None and idle > older_than:
            evict(variant, f"unused for {idle / 86400:.1f} days")
        else:
            kept.append(variant)
    while max_size is not None and kept and total > max_size:
        evict(kept.pop(0), "least recently used over --max-size")
    result.kept, result.kept_bytes = len(kept), total
    result.freed_bytes = sum(e.freed_bytes for e in result.evicted) + sum(listing[k].size for k in result.dangling)
    result.freed_bytes += sum(size for key, size in result.objects.items()
                              if not any(key in e.variant.objects for e in result.evicted))
    return result


# --------------------------------------------------------------------------------------------
# Carrying it out
# --------------------------------------------------------------------------------------------


def collect_store_garbage(store: Store, plan: StoreGcResult, *, grace: float = GRACE_S,
                          threads: int = TRANSFER_THREADS) -> StoreGcResult:
    """Carry out a :func:`plan_store_gc` by the rule of :mod:`.store_layout`; what cannot go now
    (named again, rewritten, the deadline reached) is reported, not deleted."""
    done = StoreGcResult(store.url, foreign=list(plan.foreign), young=list(plan.young), kept=plan.kept,
                         kept_bytes=plan.kept_bytes)
    started = time.time()
    deadline = started + LEASE_S
    lease = gc_lease_key(time.time_ns())
    store.write_small(lease, f'{{"deadline_ns": {int(deadline * 1e9)}}}'.encode(), exclusive=True)
    try:
        for eviction in plan.evicted:  # 2. withdraw: manifests first, then what points at them
            _withdraw(store, eviction, done)
        for key in plan.dangling + plan.stale_leases:  # nobody waits for a lease past its deadline
            store.delete(key)
        done.dangling, done.stale_leases = list(plan.dangling), list(plan.stale_leases)
        # 3. every manifest there is now: what it names stays
        manifests = [key for key in store.list_keys(f"{VARIANTS}/")
                     if (kind := layout_key(key)) is not None and kind.kind == "manifest"]
        named = set().union(*_read_names(store, manifests, threads).values())
        objects = store.list_keys("objects/")
        doomed = []
        for key, size in sorted(plan.objects.items()):
            stored = objects.get(key)
            if stored is None:
                continue  # gone already
            if key in named or stored.modified >= time.time() - grace or stored.size != size:
                done.kept_objects.append(key)
            else:
                doomed.append(key)

        def delete(key: str) -> bool:
            if time.time() > deadline - LAST_DELETE_S:  # 4. never after the deadline a pusher waits for
                return False
            store.delete(key)
            return True

        for key, deleted in zip(doomed, run_all(delete, doomed, threads)):
            if deleted:
                done.objects[key] = plan.objects[key]
            else:
                done.deferred.append(key)
    finally:
        try:
            store.delete(lease)
        except RemoteStoreError as error:  # harmless: pushers stop waiting at its deadline
            logger.warning(f"{store.url}: cannot remove the gc lease {lease}: {error}")
    done.freed_bytes = sum(e.variant.record_bytes for e in done.evicted) + sum(done.objects.values())
    return done


def _withdraw(store: Store, eviction: StoreEviction, done: StoreGcResult) -> None:
    """A variant's manifests, then its ``latest``, ``used``, location and model index entries; a variant pushed
    again since the plan (a manifest the plan did not list) keeps its new manifest and records."""
    variant = eviction.variant
    for key in variant.manifests:
        store.delete(key)
    remaining = sorted(store.list_keys(manifests_prefix(variant.variant_key)))
    if remaining:
        done.repushed.append(variant.variant_key)
        store.write_small(latest_key(variant.variant_key), remaining[-1].rpartition("/")[2].encode(), exclusive=False)
        return
    for key in variant.records:
        store.delete(key)
    done.evicted.append(eviction)


def wait_for_collectors(store: Store, *, poll: float = LEASE_POLL_S) -> float:
    """Wait while any gc's lease is before its deadline (the pusher's side of the rule); the seconds
    waited. A lease that cannot be read counts from its name's start time."""
    waited = time.monotonic()
    told = False
    while True:
        now = time.time()
        running = [key for key in store.list_keys(gc_leases_prefix())
                   if _lease_deadline(store, key) + CLOCK_SKEW_S > now]
        if not running:
            return time.monotonic() - waited
        if not told:
            logger.info(f"{store.url}: a gc is running ({running[0]}); the push checks its objects once it ends")
            told = True
        time.sleep(poll)


def _lease_deadline(store: Store, key: str) -> float:
    started = int(key.rpartition("/")[2][:20]) / 1e9
    raw = store.read_small(key, MAX_POINTER_BYTES) or b""
    match = re.fullmatch(rb'\{"deadline_ns": ([0-9]{1,20})\}', raw.strip())
    return min(int(match.group(1)) / 1e9, started + LEASE_S) if match else started + LEASE_S


def record_pull(store: Store, variant_key: str) -> bool:
    """Record in the store that a variant was pulled now (its ``used``: gc's recency). Best effort:
    a store that cannot take it (read-only, an HTTP mirror) never fails the pull."""
    try:
        store.write_small(used_key(variant_key), str(time.time_ns()).encode(), exclusive=False)
        return True
    except (RemoteStoreError, OSError) as error:
        logger.debug(f"{store.url}: the pull of {variant_key[:16]} is not recorded ({error})")
        return False
