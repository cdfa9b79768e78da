# SPDX-License-Identifier: Apache-2.0
"""A producer that stores prompt features in waves behind a durable cursor.

A run (one directory) walks a fixed prompt set in waves of ``wave_size`` prompts. For each wave
it looks every prompt up first (a killed run, or another producer, may have stored it already),
computes only the misses, publishes them with one ``store_batch_boundary`` (durable when it
returns), and only then advances ``cursor.json`` (atomically replaced). A run killed at any
point restarts from the cursor: waves before it are durable; the wave in flight is looked up
again, so nothing stored is recomputed, and objects are content-addressed, so no row is lost or
duplicated. One producer per run directory (``run.lock``); any number of runs may share a cache
root (each object has its own writer lock).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from models.common.fileio import atomic_write_bytes, file_lock
from models.common.prefill_cache import (
    FrozenBackboneCacheError,
    FrozenBackboneFeatureSidecar,
    FrozenBackbonePrefillPacket,
)
from models.common.prefill_cache.layout import canonical_json, json_sha256
from models.resynthesis.features import PositionPolicy, authority_for, packet_of, prompt_sha256
from models.resynthesis.parent import FrozenParent

CURSOR_SCHEMA = "tt-warm-loaders.resynthesis.prefill_cursor.v1"


class ProducerError(RuntimeError):
    """A run directory that belongs to another run, or is already being produced into."""


class FeatureProducer:
    """Prompt -> its sidecar (durable object) and, on a miss, its packet (one parent prefill)."""

    def __init__(self, parent: FrozenParent, cache_root: str | Path, *, policy: PositionPolicy | None = None,
                 feature_dtype: str = "float32") -> None:
        self.parent = parent
        self.cache_root = Path(cache_root)
        self.policy = policy or PositionPolicy()
        self.feature_dtype = feature_dtype

    def sidecar(self, tokens: torch.Tensor) -> FrozenBackboneFeatureSidecar:
        authority = authority_for(tokens, self.parent, self.policy, self.feature_dtype)
        return FrozenBackboneFeatureSidecar(cache_root=self.cache_root, authority=authority)

    def compute(self, tokens: torch.Tensor, sidecar: FrozenBackboneFeatureSidecar | None = None
                ) -> FrozenBackbonePrefillPacket:
        """One prefill of the parent, as the packet its authority expects."""
        sidecar = sidecar or self.sidecar(tokens)
        return packet_of(sidecar.authority, self.parent.final_states(tokens), self.policy)

    def stored(self, sidecar: FrozenBackboneFeatureSidecar) -> FrozenBackbonePrefillPacket | None:
        """The stored packet, or None for a miss; an invalid object is a miss to rebuild."""
        try:
            return sidecar.lookup_boundary()
        except FrozenBackboneCacheError:
            return None

    def fingerprint(self) -> dict[str, object]:
        """What a run's cursor is bound to besides its prompts."""
        return {"parent": self.parent.identity.key, "parentManifest": self.parent.identity.manifest_sha256,
                "policy": self.policy.sha256(self.parent), "featureDtype": self.feature_dtype,
                "cacheRoot": str(self.cache_root.resolve())}


def prompt_set_sha256(prompts: Sequence[torch.Tensor]) -> str:
    return json_sha256([prompt_sha256(tokens) for tokens in prompts])


@dataclass
class WaveReport:
    waves: int = 0
    computed: int = 0  # prompts whose features this run computed (parent prefills)
    reused: int = 0  # prompts found already stored (an earlier, killed run or another producer)
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
            _store_wave(producer, wave, report)
            report.done += len(wave)
            report.waves += 1
            cursor.advance(report.done)
            if on_wave is not None:
                on_wave(report.done, report)
        return report


def _store_wave(producer: FeatureProducer, wave: Sequence[torch.Tensor], report: WaveReport) -> None:
    rows: dict[Path, tuple[FrozenBackboneFeatureSidecar, FrozenBackbonePrefillPacket]] = {}
    for tokens in wave:
        sidecar = producer.sidecar(tokens)
        if sidecar.paths.root in rows:
            continue  # the same prompt twice in one wave
        if producer.stored(sidecar) is not None:
            report.reused += 1
            continue
        start = time.perf_counter()
        rows[sidecar.paths.root] = (sidecar, producer.compute(tokens, sidecar))
        report.compute_seconds += time.perf_counter() - start
        report.computed += 1
    start = time.perf_counter()
    FrozenBackboneFeatureSidecar.store_batch_boundary(tuple(rows.values()))
    report.store_seconds += time.perf_counter() - start
