# SPDX-License-Identifier: Apache-2.0
"""From one prompt and a frozen parent to the packet the prefill cache stores.

The packet of a prompt of T tokens: the final-normed state of its last token (``[1, 1, H]``),
S summaries of the final-normed states (``[1, S, H]``: the mean over each chunk of
``tile_tokens / summaries_per_tile`` tokens, S = ceil(T / chunk)) and one input position (T).
Its authority binds the parent (weights SHA-256 and manifest), the prompt and its mask, the
position policy (tiling, and which forward produced the features) and the dtypes and sizes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from models.common.fileio import sha256_bytes
from models.common.prefill_cache import (
    FEATURE_DTYPES,
    FrozenBackboneCacheAuthority,
    FrozenBackbonePrefillPacket,
    frozen_backbone_position_policy_sha256_boundary,
    frozen_backbone_prompt_mask_sha256_boundary,
)
from models.resynthesis.parent import HOST_REFERENCE_ADAPTER, FrozenParent


@dataclass(frozen=True)
class PositionPolicy:
    """How a prefill becomes summary tiles, and which forward produced it."""

    tile_tokens: int = 64
    summaries_per_tile: int = 2
    adapter_id: str = HOST_REFERENCE_ADAPTER

    def __post_init__(self) -> None:
        if not (isinstance(self.tile_tokens, int) and isinstance(self.summaries_per_tile, int)
                and self.summaries_per_tile >= 1 and self.tile_tokens >= self.summaries_per_tile
                and self.tile_tokens % self.summaries_per_tile == 0):
            raise ValueError(f"position policy needs tile_tokens a positive multiple of summaries_per_tile, "
                             f"got {self.tile_tokens} and {self.summaries_per_tile}")

    @property
    def chunk_tokens(self) -> int:
        return self.tile_tokens // self.summaries_per_tile

    def summary_positions(self, tokens: int) -> int:
        return math.ceil(tokens / self.chunk_tokens)

    def sha256(self, parent: FrozenParent) -> str:
        return frozen_backbone_position_policy_sha256_boundary(
            final_hidden_adapter_id=self.adapter_id,
            dual_chunk_pretrain_length=parent.max_positions,
            dual_chunk_local_size=parent.sliding_window,
            pretrained_rope_band_tokens=parent.max_positions,
            prefill_tile_tokens=self.tile_tokens,
            prefill_summaries_per_tile=self.summaries_per_tile,
        )

    def summarize(self, normed: torch.Tensor) -> torch.Tensor:
        """``[S, H]`` chunk means of ``[T, H]`` final states (a short last chunk is its own mean)."""
        return torch.stack([chunk.mean(0) for chunk in normed.split(self.chunk_tokens, dim=0)])


def prompt_tensors(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[1, T]`` int64 ids and an all-ones mask: the exact geometry the identity hashes."""
    ids = tokens.detach().to(device="cpu", dtype=torch.long).reshape(1, -1).contiguous()
    return ids, torch.ones_like(ids)


def prompt_sha256(tokens: torch.Tensor) -> str:
    ids, _ = prompt_tensors(tokens)
    return sha256_bytes(memoryview(ids.numpy()).cast("B"))


def authority_for(tokens: torch.Tensor, parent: FrozenParent, policy: PositionPolicy,
                  feature_dtype: str) -> FrozenBackboneCacheAuthority:
    """The authority of one prompt's features. The work id is derived from the prompt itself, so
    runs over overlapping prompt sets share objects."""
    ids, mask = prompt_tensors(tokens)
    digest = prompt_sha256(tokens)
    identity = parent.identity
    return FrozenBackboneCacheAuthority(
        qualified_work_id=f"prefill/{digest}",
        prompt_sha256=digest,
        prompt_mask_sha256=frozen_backbone_prompt_mask_sha256_boundary(ids, mask),
        parent_checkpoint_id=identity.checkpoint_id,
        parent_manifest_payload_sha256=identity.manifest_sha256,
        parent_model_artifact_sha256=identity.weights_sha256,
        parent_source_bundle_sha256="",
        position_policy_sha256=policy.sha256(parent),
        token_dtype="int64",
        feature_dtype=feature_dtype,
        hidden_size=parent.hidden_size,
        summary_positions=policy.summary_positions(ids.shape[1]),
    )


def packet_of(authority: FrozenBackboneCacheAuthority, normed: torch.Tensor,
              policy: PositionPolicy) -> FrozenBackbonePrefillPacket:
    """The packet of one prefill's final states ``[T, H]``, in the authority's feature dtype."""
    dtype = FEATURE_DTYPES[authority.feature_dtype]
    return FrozenBackbonePrefillPacket.from_features_boundary(
        authority=authority,
        final_hidden_t=normed[-1:].reshape(1, 1, -1).to(dtype),
        summary_hidden_t=policy.summarize(normed).unsqueeze(0).to(dtype),
        input_positions_t=torch.tensor([normed.shape[0]], dtype=torch.long),
    )
