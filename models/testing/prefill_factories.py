# SPDX-License-Identifier: Apache-2.0
"""Deterministic authorities and packets for the prefill-cache tests and benchmark.

Everything is a pure function of an integer, so a parent process can recompute exactly what a
(killed) child was storing and compare bytes."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from models.common.prefill_cache import (
    FEATURE_DTYPES,
    FrozenBackboneCacheAuthority,
    FrozenBackboneFeatureSidecar,
    FrozenBackbonePrefillPacket,
)


def hex_of(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def authority(
    index: int,
    *,
    hidden: int = 8,
    positions: int = 3,
    dtype: str = "bfloat16",
    source: str | None = "src-v1",
) -> FrozenBackboneCacheAuthority:
    return FrozenBackboneCacheAuthority(
        qualified_work_id=f"run/work-{index}",
        prompt_sha256=hex_of(f"prompt {index}"),
        prompt_mask_sha256=hex_of(f"mask {index}"),
        parent_checkpoint_id="parent-ckpt-7",
        parent_manifest_payload_sha256=hex_of("parent manifest"),
        parent_model_artifact_sha256=hex_of("parent weights"),
        parent_source_bundle_sha256=hex_of(source) if source is not None else "",
        position_policy_sha256=hex_of("policy"),
        token_dtype="int64",
        feature_dtype=dtype,
        hidden_size=hidden,
        summary_positions=positions,
    )


def packet(auth: FrozenBackboneCacheAuthority, seed: int) -> FrozenBackbonePrefillPacket:
    generator = torch.Generator().manual_seed(seed)
    dtype = FEATURE_DTYPES[auth.feature_dtype]
    shape = (1, auth.summary_positions, auth.hidden_size)
    return FrozenBackbonePrefillPacket.from_features_boundary(
        authority=auth,
        final_hidden_t=torch.randn(1, 1, auth.hidden_size, generator=generator).to(dtype),
        summary_hidden_t=torch.randn(*shape, generator=generator).to(dtype),
        input_positions_t=torch.tensor([seed + 1]),
    )


def row(root: Path, index: int, **kwargs) -> tuple[FrozenBackboneFeatureSidecar, FrozenBackbonePrefillPacket]:
    """Object ``index`` under ``root`` with its (deterministic) features."""
    auth = authority(index, **kwargs)
    return FrozenBackboneFeatureSidecar(cache_root=root, authority=auth), packet(auth, index)


def same_bytes(a: FrozenBackbonePrefillPacket, b: FrozenBackbonePrefillPacket) -> bool:
    """Bit-exact equality of every tensor (NaN-safe: compares raw bytes)."""
    return all(
        x.shape == y.shape
        and x.dtype == y.dtype
        and bytes(x.contiguous().reshape(-1).view(torch.uint8).numpy())
        == bytes(y.contiguous().reshape(-1).view(torch.uint8).numpy())
        for x, y in zip(a._tensors(), b._tensors(), strict=True)
    )
