# SPDX-License-Identifier: Apache-2.0
"""What a training loop asks for: the frozen parent's features and logits of a batch of prompts.

With the cache on, a prompt is served by the in-memory ``BaseForwardCache`` (read-only views),
else by the durable sidecar (memory-mapped, SHA-256 checked), else computed by one parent
prefill; a batch's misses are stored as one wave. With the cache off, every prompt is a prefill.
Both paths hand out the same bytes: features are always cast to the cache's feature dtype and
parent logits are always computed from the (cast) final state, so a run's loss does not depend
on whether the cache was on.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from models.common.prefill_cache import (
    BaseForwardCache,
    BaseForwardCacheEntry,
    FrozenBackboneFeatureSidecar,
    FrozenBackbonePrefillPacket,
    base_forward_cache_capacity_boundary,
)
from models.resynthesis.features import prompt_tensors
from models.resynthesis.waves import FeatureProducer


@dataclass
class SourceStats:
    lru_hits: int = 0
    lru_misses: int = 0
    disk_hits: int = 0
    disk_misses: int = 0
    prefills: int = 0  # parent prefills computed through this source
    feature_seconds: float = 0.0  # time spent getting parent features (lookups, prefills, stores)
    prefill_seconds: float = 0.0  # of which computing prefills
    store_seconds: float = 0.0  # of which storing waves
    head_seconds: float = 0.0  # parent logits from a final state (the frozen LM head; not a prefill)

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    def minus(self, earlier: SourceStats) -> SourceStats:
        return SourceStats(**{k: v - getattr(earlier, k) for k, v in asdict(self).items()})


class ParentFeatureSource:
    """Features and logits of the frozen parent for prompts (see the module docstring)."""

    def __init__(self, producer: FeatureProducer, *, cache: bool = True, lru_capacity: int | None = None) -> None:
        self.producer = producer
        self.cache = cache
        fingerprint = producer.fingerprint()
        self.lru = BaseForwardCache(
            capacity=lru_capacity or base_forward_cache_capacity_boundary(),
            parent_identity=f"{fingerprint['parent']}|{fingerprint['policy']}|{fingerprint['featureDtype']}",
        )
        self.stats = SourceStats()
        producer.parent.head_weight  # noqa: B018 - materialized once, outside any timed step

    def batch(self, prompts: list[torch.Tensor]) -> list[BaseForwardCacheEntry]:
        start, head_before = time.perf_counter(), self.stats.head_seconds
        results: list[BaseForwardCacheEntry | None] = [None] * len(prompts)
        keys = [self.lru.key_boundary(*prompt_tensors(tokens))[0] for tokens in prompts] if self.cache else []
        wave: dict[Path, tuple[FrozenBackboneFeatureSidecar, FrozenBackbonePrefillPacket]] = {}
        for index, tokens in enumerate(prompts):
            if self.cache:
                results[index] = self.lru.lookup(keys[index])
                if results[index] is not None:
                    self.stats.lru_hits += 1
                    continue
                self.stats.lru_misses += 1
            packet = self._packet(tokens, wave)
            entry = self._entry(tokens, packet)
            if self.cache:
                self.lru.store(keys[index], entry)
            results[index] = entry
        if wave:
            store_start = time.perf_counter()
            FrozenBackboneFeatureSidecar.store_batch_boundary(tuple(wave.values()))
            self.stats.store_seconds += time.perf_counter() - store_start
        self.stats.feature_seconds += time.perf_counter() - start - (self.stats.head_seconds - head_before)
        return results  # type: ignore[return-value]

    def _packet(self, tokens: torch.Tensor, wave: dict) -> FrozenBackbonePrefillPacket:
        sidecar = self.producer.sidecar(tokens)
        if self.cache:
            if sidecar.paths.root in wave:
                return wave[sidecar.paths.root][1]
            stored = self.producer.stored(sidecar)
            if stored is not None:
                self.stats.disk_hits += 1
                return stored
            self.stats.disk_misses += 1
        start = time.perf_counter()
        packet = self.producer.compute(tokens, sidecar)
        self.stats.prefill_seconds += time.perf_counter() - start
        self.stats.prefills += 1
        if self.cache:
            wave[sidecar.paths.root] = (sidecar, packet)
        return packet

    def _entry(self, tokens: torch.Tensor, packet: FrozenBackbonePrefillPacket) -> BaseForwardCacheEntry:
        final = packet.final_hidden_t.reshape(1, -1)
        start = time.perf_counter()
        logits = self.producer.parent.logits_of(final)
        self.stats.head_seconds += time.perf_counter() - start
        empty = torch.zeros(1, 0, dtype=torch.long)
        return BaseForwardCacheEntry.from_forward_boundary(
            hidden=final, logits=logits, parent_context_hidden=packet.summary_hidden_t[0],
            parent_expert_routes=empty, parent_layer_routes=empty,
            kv_prefix_positions=torch.zeros(1, dtype=torch.long),
            kv_new_positions=torch.arange(tokens.numel()),
            parent_prefill_hidden=packet.summary_hidden_t[0],
            parent_prefill_input_positions=packet.input_positions_t,
            sha16=packet.cache_key_sha256_t[0, :8].numpy().tobytes().hex(),
        )
