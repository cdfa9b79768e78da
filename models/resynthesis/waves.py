# SPDX-License-Identifier: Apache-2.0
"""A producer of prompt features: one prefill per prompt across every process, stored in waves.

:meth:`FeatureProducer.obtain` serves a list of prompts: it looks each one up, *claims* the
misses (``models.common.prefill_cache.claims``: one producer per object across processes),
computes and stores the claimed ones as one wave, releases its claims, and only then waits for
the claims of other producers and reads what they stored (computing a prompt itself only when
the other producer died or could not store it).

A store that fails (a full disk: ENOSPC, EIO, EROFS, any ``OSError``) does not stop the caller:
the producer warns once, keeps the features of that wave and of every later miss in memory only
(it stops storing and claiming for the rest of its life) and lists them in ``unstored`` so the
run can say what the next one will compute again. With ``max_bytes`` (a size cap) each store is
followed, when the root outgrows the cap, by an LRU eviction down to ``LOW_WATERMARK`` of it.

:func:`produce_waves` walks a fixed prompt set in waves of ``wave_size`` prompts and advances
``cursor.json`` (atomically replaced) only after a wave is durable. A run killed at any point
restarts from the cursor: waves before it are durable; the wave in flight is looked up again, so
nothing stored is recomputed, and objects are content-addressed, so no row is lost or
duplicated. One producer per run directory (``run.lock``); any number of runs may share a cache
root.
"""

from __future__ import annotations

import contextlib
import errno
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Final

import torch
from loguru import logger

from models.common.fileio import atomic_write_bytes, file_lock
from models.common.prefill_cache import (
    FrozenBackboneCacheError,
    FrozenBackboneFeatureSidecar,
    FrozenBackbonePrefillPacket,
)
from models.common.prefill_cache.claims import ProducerClaim
from models.common.prefill_cache.layout import canonical_json, json_sha256
from models.common.prefill_cache.maintenance import gc, list_objects
from models.resynthesis.features import PositionPolicy, authority_for, packet_of, prompt_sha256
from models.resynthesis.parent import FrozenParent
from models.resynthesis.threads import ThreadShare

CURSOR_SCHEMA = "tt-warm-loaders.resynthesis.prefill_cursor.v1"
LOW_WATERMARK: Final = 0.9  # eviction frees down to this fraction of the cap, so it runs rarely
CLAIM_TIMEOUT_S: Final = 600.0  # longest wait for another producer's features before computing them


class ProducerError(RuntimeError):
    """A run directory that belongs to another run, or is already being produced into."""


def describe_os_error(error: OSError) -> str:
    """``ENOSPC: No space left on device: /path``: the errno's name, its words, the file."""
    name = errno.errorcode.get(error.errno or 0, type(error).__name__)
    where = f": {error.filename}" if error.filename else ""
    return f"{name}: {error.strerror or error}{where}"


@dataclass
class Obtained:
    """What :meth:`FeatureProducer.obtain` did for a list of prompts."""

    packets: list[FrozenBackbonePrefillPacket]  # one per prompt, in order
    found: int = 0  # distinct prompts already stored
    waited: int = 0  # distinct prompts stored by another producer while this one waited for it
    computed: int = 0  # parent prefills run here
    stored: int = 0  # of which stored now
    unstored: int = 0  # of which kept in memory only (store failed, or storing stopped)
    compute_seconds: float = 0.0
    store_seconds: float = 0.0
    wait_seconds: float = 0.0


@dataclass
class StorageReport:
    """Everything a producer did to its cache root, for the end-of-run summary."""

    root: str
    stored: int = 0  # objects this producer published
    stored_bytes: int = 0  # their bytes on disk (artifacts + manifest)
    unstored: list[str] = field(default_factory=list)  # prompt SHA-256 of features kept in memory only
    store_error: str | None = None  # why storing stopped
    evicted: int = 0  # objects evicted for the size cap
    max_bytes: int | None = None

    @property
    def bytes_per_sample(self) -> float | None:
        return self.stored_bytes / self.stored if self.stored else None

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "bytes_per_sample": self.bytes_per_sample}


class FeatureProducer:
    """Prompt -> its sidecar (durable object) and, on a miss, its packet (one parent prefill)."""

    def __init__(self, parent: FrozenParent, cache_root: str | Path, *, policy: PositionPolicy | None = None,
                 feature_dtype: str = "float32", threads: ThreadShare | None = None,
                 max_bytes: int | None = None, claim_timeout_s: float = CLAIM_TIMEOUT_S) -> None:
        if max_bytes is not None and max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.parent = parent
        self.cache_root = Path(cache_root)
        self.policy = policy or PositionPolicy()
        self.feature_dtype = feature_dtype
        self.threads = threads
        self.claim_timeout_s = claim_timeout_s
        self.storage = StorageReport(root=str(self.cache_root), max_bytes=max_bytes)
        self._root_bytes: int | None = None  # running estimate between eviction scans

    def sidecar(self, tokens: torch.Tensor) -> FrozenBackboneFeatureSidecar:
        authority = authority_for(tokens, self.parent, self.policy, self.feature_dtype)
        return FrozenBackboneFeatureSidecar(cache_root=self.cache_root, authority=authority)

    def compute(self, tokens: torch.Tensor, sidecar: FrozenBackboneFeatureSidecar | None = None
                ) -> FrozenBackbonePrefillPacket:
        """One prefill of the parent, as the packet its authority expects."""
        sidecar = sidecar or self.sidecar(tokens)
        if self.threads is not None:
            self.threads.refresh()
        return packet_of(sidecar.authority, self.parent.final_states(tokens), self.policy)

    def stored(self, sidecar: FrozenBackboneFeatureSidecar) -> FrozenBackbonePrefillPacket | None:
        """The stored packet (marked used, for LRU eviction), or None for a miss; an invalid object
        is a miss to rebuild."""
        try:
            found = sidecar.lookup_boundary()
        except FrozenBackboneCacheError:
            return None
        if found is not None:
            sidecar.mark_used_boundary()
        return found

    def fingerprint(self) -> dict[str, object]:
        """What a run's cursor is bound to besides its prompts."""
        return {"parent": self.parent.identity.key, "parentManifest": self.parent.identity.manifest_sha256,
                "policy": self.policy.sha256(self.parent), "featureDtype": self.feature_dtype,
                "cacheRoot": str(self.cache_root.resolve())}

    # -- serving prompts ----------------------------------------------------------------------

    def obtain(self, prompts: Sequence[torch.Tensor]) -> Obtained:
        """The features of every prompt (see the module docstring), each computed at most once
        across the producers sharing this cache root."""
        sidecars = [self.sidecar(tokens) for tokens in prompts]
        result = Obtained(packets=[None] * len(prompts))  # type: ignore[list-item]
        first: dict[Path, int] = {}
        misses = []
        for index, sidecar in enumerate(sidecars):
            if sidecar.paths.root in first:
                continue
            first[sidecar.paths.root] = index
            found = self.stored(sidecar)
            if found is None:
                misses.append(index)
            else:
                result.packets[index] = found
                result.found += 1
        theirs = self._produce_claimed(prompts, sidecars, misses, result)
        for index, claim in theirs:
            self._await(prompts[index], sidecars[index], claim, index, result)
        for index, sidecar in enumerate(sidecars):  # a prompt twice in the list
            if result.packets[index] is None:
                result.packets[index] = result.packets[first[sidecar.paths.root]]
        return result

    def _produce_claimed(self, prompts, sidecars, misses: list[int], result: Obtained
                         ) -> list[tuple[int, ProducerClaim]]:
        """Claim the misses, compute and store the claimed ones; returns those another producer
        holds. Claims are released before returning (after the store)."""
        mine, held, theirs = [], [], []
        try:
            for index in misses:
                claim = self._claim(sidecars[index])
                if claim is not None and not claim.held:
                    theirs.append((index, claim))
                    continue
                if claim is not None:
                    found = self.stored(sidecars[index])  # published between the lookup and the claim
                    if found is not None:
                        claim.release()
                        result.packets[index] = found
                        result.found += 1
                        continue
                    held.append(claim)
                mine.append(index)
            rows = []
            for index in mine:
                rows.append((sidecars[index], self._compute_timed(prompts[index], sidecars[index], result)))
                result.packets[index] = rows[-1][1]
            self._store(rows, result)
        finally:
            for claim in held:
                claim.release()
        return theirs

    def _claim(self, sidecar: FrozenBackboneFeatureSidecar) -> ProducerClaim | None:
        """The object's claim, held or (another producer's) not; None when claims cannot be
        taken here (storing stopped, a root that cannot hold the lock file)."""
        if self.storage.store_error is not None:
            return None
        claim = ProducerClaim(sidecar.paths.root)
        try:
            claim.take()
        except OSError as error:
            logger.debug("producing {} unclaimed: {}", sidecar.paths.root, error)
            return None
        return claim

    def _await(self, tokens: torch.Tensor, sidecar: FrozenBackboneFeatureSidecar, claim: ProducerClaim,
               index: int, result: Obtained) -> None:
        """Wait for another producer's claim, then read what it stored (or compute it here)."""
        start = time.perf_counter()
        pause = self.threads.paused() if self.threads is not None else contextlib.nullcontext()
        with pause:
            claim.wait(self.claim_timeout_s)
        result.wait_seconds += time.perf_counter() - start
        try:
            found = self.stored(sidecar)
            if found is not None:
                result.packets[index] = found
                result.waited += 1
                return
            result.packets[index] = self._compute_timed(tokens, sidecar, result)
            self._store([(sidecar, result.packets[index])], result)
        finally:
            claim.release()

    def _compute_timed(self, tokens: torch.Tensor, sidecar: FrozenBackboneFeatureSidecar,
                       result: Obtained) -> FrozenBackbonePrefillPacket:
        start = time.perf_counter()
        packet = self.compute(tokens, sidecar)
        result.compute_seconds += time.perf_counter() - start
        result.computed += 1
        return packet

    # -- storing ------------------------------------------------------------------------------

    def _store(self, rows: list[tuple[FrozenBackboneFeatureSidecar, FrozenBackbonePrefillPacket]],
               result: Obtained) -> None:
        """Store a wave; on failure warn once and keep its features (and all later ones) in
        memory only."""
        if not rows:
            return
        if self.storage.store_error is None:
            start = time.perf_counter()
            try:
                FrozenBackboneFeatureSidecar.store_batch_boundary(tuple(rows))
            except OSError as error:
                self.storage.store_error = describe_os_error(error)
                logger.warning("prefill cache {}: cannot store features: {}. This run keeps them in memory "
                               "only; the next run computes them again.", self.cache_root, self.storage.store_error)
            else:
                result.stored += len(rows)
                self._account(rows)
            finally:
                result.store_seconds += time.perf_counter() - start
        if self.storage.store_error is not None:
            result.unstored += len(rows)
            self.storage.unstored += [sidecar.authority.prompt_sha256 for sidecar, _ in rows]

    def _account(self, rows) -> None:
        """Count what a store added; evict beyond the size cap."""
        added = 0
        for sidecar, _ in rows:
            with contextlib.suppress(OSError):
                added += sum(path.stat().st_size for path in (*sidecar.paths.artifacts, sidecar.paths.manifest))
        self.storage.stored += len(rows)
        self.storage.stored_bytes += added
        cap = self.storage.max_bytes
        if cap is None:
            return
        try:
            if self._root_bytes is None:
                self._root_bytes = sum(info.bytes for info in list_objects(self.cache_root))
            else:
                self._root_bytes += added
            if self._root_bytes > cap:
                evicted = gc(self.cache_root, max_bytes=int(cap * LOW_WATERMARK))
                self.storage.evicted += evicted.evicted_objects
                self._root_bytes = evicted.bytes_after
                logger.info("prefill cache {}: evicted {} least recently used objects ({} bytes) to stay under "
                            "{} bytes", self.cache_root, evicted.evicted_objects, evicted.removed_bytes, cap)
        except (FrozenBackboneCacheError, OSError) as error:
            logger.warning("prefill cache {}: cannot enforce the size cap: {}", self.cache_root, error)


def prompt_set_sha256(prompts: Sequence[torch.Tensor]) -> str:
    return json_sha256([prompt_sha256(tokens) for tokens in prompts])


@dataclass
class WaveReport:
    waves: int = 0
    computed: int = 0  # prompts whose features this run computed (parent prefills)
    reused: int = 0  # prompts found stored (by an earlier, killed run or another producer)
    compute_seconds: float = 0.0
    store_seconds: float = 0.0
    done: int = 0  # the cursor at the end

    def to_json(self) -> dict[str, object]:
        return asdict(self)


class Cursor:
    """``cursor.json`` of a run: how many prompts of its set are durably stored, in order."""

    def __init__(self, run_dir: Path, binding: dict[str, object]) -> None:
        self.path = run_dir / "cursor.json"
        self.binding = binding

    def load(self) -> int:
        if not self.path.exists():
            return 0
        try:
            record = json.loads(self.path.read_bytes())
        except (OSError, ValueError) as error:
            raise ProducerError(f"cursor {self.path} is unreadable: {error}") from error
        if not isinstance(record, dict) or record.get("schema") != CURSOR_SCHEMA or record.get("binding") != self.binding:
            raise ProducerError(f"{self.path} belongs to another run (other prompts, parent, policy or cache root); "
                                "use a new run directory")
        done = record.get("done")
        if type(done) is not int or done < 0:
            raise ProducerError(f"cursor {self.path} has no valid 'done' count")
        return done

    def advance(self, done: int) -> None:
        atomic_write_bytes(self.path, canonical_json({"schema": CURSOR_SCHEMA, "binding": self.binding, "done": done}))


def produce_waves(producer: FeatureProducer, prompts: Sequence[torch.Tensor], run_dir: str | Path, *,
                  wave_size: int = 8, on_wave: Callable[[int, WaveReport], None] | None = None) -> WaveReport:
    """Store every prompt's features, resuming from the run's cursor (see the module docstring)."""
    if wave_size < 1:
        raise ValueError(f"wave_size must be >= 1, got {wave_size}")
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    binding = {"prompts": prompt_set_sha256(prompts), "count": len(prompts), **producer.fingerprint()}
    with file_lock(run_dir / "run.lock", blocking=False) as held:
        if not held:
            raise ProducerError(f"another producer is running in {run_dir}")
        cursor = Cursor(run_dir, binding)
        report = WaveReport(done=cursor.load())
        while report.done < len(prompts):
            wave = prompts[report.done:report.done + wave_size]
            obtained = producer.obtain(wave)
            report.computed += obtained.computed
            report.reused += obtained.found + obtained.waited
            report.compute_seconds += obtained.compute_seconds
            report.store_seconds += obtained.store_seconds
            if obtained.unstored:
                raise ProducerError(f"wave {report.done}..{report.done + len(wave)} of {run_dir} was not stored "
                                    f"({producer.storage.store_error}); the cursor stays at {report.done}")
            report.done += len(wave)
            report.waves += 1
            cursor.advance(report.done)
            if on_wave is not None:
                on_wave(report.done, report)
        return report
