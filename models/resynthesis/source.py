# SPDX-License-Identifier: Apache-2.0
"""What a training loop asks for: the frozen parent's features and logits of a batch of prompts.

With the cache on, a prompt is served by the in-memory ``BaseForwardCache`` (read-only views),
else by the durable sidecar (read through the opens it checked, SHA-256 checked), else by another producer that is
computing it right now (waited for), else computed by one parent prefill; a batch's misses are
stored as one wave (:meth:`FeatureProducer.obtain`). A store that fails keeps the features in
memory (the producer says so). With the cache off, every prompt is a prefill.
Both paths hand out the same bytes: features are always cast to the cache's feature dtype and
parent logits are always computed from the (cast) final state, so a run's loss does not depend
on whether the cache was on.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

from models.common.prefill_cache import (
    BaseForwardCache,
    BaseForwardCacheEntry,
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
    waited: int = 0  # of the disk hits, features another producer computed while this one waited
    unstored: int = 0  # prefills whose features could not be stored (kept in memory only)
    prefills: int = 0  # parent prefills computed through this source
    feature_seconds: float = 0.0  # time spent getting parent features (lookups, prefills, stores)
    prefill_seconds: float = 0.0  # of which computing prefills
    store_seconds: float = 0.0  # of which storing waves
    wait_seconds: float = 0.0  # of which waiting for another producer's features
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
        if self.producer.threads is not None:
            self.producer.threads.refresh()
        results: list[BaseForwardCacheEntry | None] = [None] * len(prompts)
        if not self.cache:
            for index, tokens in enumerate(prompts):
                prefill_start = time.perf_counter()
                packet = self.producer.compute(tokens)
                self.stats.prefill_seconds += time.perf_counter() - prefill_start
                self.stats.prefills += 1
                results[index] = self._entry(tokens, packet)
        else:
            keys = [self.lru.key_boundary(*prompt_tensors(tokens))[0] for tokens in prompts]
            missing = []
            for index, key in enumerate(keys):
                results[index] = self.lru.lookup(key)
                if results[index] is None:
                    missing.append(index)
            self.stats.lru_hits += len(prompts) - len(missing)
            self.stats.lru_misses += len(missing)
            if missing:
                self._serve(prompts, keys, missing, results)
        self.stats.feature_seconds += time.perf_counter() - start - (self.stats.head_seconds - head_before)
        return results  # type: ignore[return-value]

    def _serve(self, prompts: list[torch.Tensor], keys: list, missing: list[int],
               results: list[BaseForwardCacheEntry | None]) -> None:
        """Memory misses: from disk, another producer, or a prefill (stored as one wave)."""
        obtained = self.producer.obtain([prompts[index] for index in missing])
        self.stats.disk_hits += obtained.found + obtained.waited
        self.stats.disk_misses += obtained.computed
        self.stats.waited += obtained.waited
        self.stats.unstored += obtained.unstored
        self.stats.prefills += obtained.computed
        self.stats.prefill_seconds += obtained.compute_seconds
        self.stats.store_seconds += obtained.store_seconds
        self.stats.wait_seconds += obtained.wait_seconds
        for index, packet in zip(missing, obtained.packets, strict=True):
            entry = self._entry(prompts[index], packet)
            self.lru.store(keys[index], entry)
            results[index] = entry

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
