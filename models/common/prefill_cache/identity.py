# SPDX-License-Identifier: Apache-2.0
"""Identity of a prefill-cache object: everything that can change one prompt's frozen decoder
features, hashed canonically (sorted-key ASCII JSON, SHA-256). That digest names the object.
Source-tree hashes are diagnostics only and never part of the identity."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Final

import torch

from models.common.fileio import sha256_bytes
from models.common.prefill_cache.layout import (
    FROZEN_BACKBONE_AUTHORITY_SCHEMA,
    FROZEN_BACKBONE_AUTHORITY_SCHEMA_V1,
    NATIVE_PARENT_PREFIX,
    SCOPE_FLAGS,
    canonical_json,
    is_int,
    is_sha256_hex,
    json_sha256,
)

FEATURE_DTYPES: Final[dict[str, torch.dtype]] = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
}
_TOKEN_DTYPES: Final = frozenset({"int32", "int64"})
_PROMPT_MASK_DOMAIN: Final = b"nnf.resynthesis.frozen_backbone_prompt_mask.v1\x00"
_POSITION_POLICY_SCHEMA: Final = "nnf.resynthesis.frozen_backbone_position_policy.v1"


def tensor_bytes(value: torch.Tensor) -> memoryview:
    """The raw storage bytes of a tensor (moved to CPU, made contiguous, dtype untouched)."""
    flat = value.detach().to(device="cpu").contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy())


def _digest_row(hex_digest: str) -> torch.Tensor:
    return torch.frombuffer(bytearray.fromhex(hex_digest), dtype=torch.uint8).reshape(1, 32)


def frozen_backbone_prompt_mask_sha256_boundary(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
) -> str:
    """SHA-256 of a prompt and its mask: dtypes, shapes and bytes, so no two geometries collide."""
    well_formed = (
        input_ids.device.type == "cpu"
        and attention_mask.device.type == "cpu"
        and input_ids.ndim == 2
        and input_ids.shape[1] >= 1
        and attention_mask.shape == input_ids.shape
        and input_ids.dtype in (torch.int32, torch.int64)
        and attention_mask.dtype in (torch.bool, torch.int32, torch.int64)
    )
    if not well_formed:
        raise ValueError(
            "prompt/mask identity needs CPU int32/int64 input_ids of shape [batch, sequence>=1] "
            "and a CPU bool/int32/int64 attention_mask of the same shape; got "
            f"{tuple(input_ids.shape)} {input_ids.dtype} on {input_ids.device} and "
            f"{tuple(attention_mask.shape)} {attention_mask.dtype} on {attention_mask.device}"
        )
    hasher = hashlib.sha256(_PROMPT_MASK_DOMAIN)
    for tensor in (input_ids, attention_mask):
        hasher.update(str(tensor.dtype).encode("ascii") + b"\x00")
        hasher.update(canonical_json(list(tensor.shape)) + b"\x00")
        hasher.update(tensor_bytes(tensor))
    return hasher.hexdigest()


def frozen_backbone_position_policy_sha256_boundary(
    *,
    final_hidden_adapter_id: str,  # which adapter produces the final hidden state
    dual_chunk_pretrain_length: int,  # dual-chunk attention: pretraining length
    dual_chunk_local_size: int,  # dual-chunk attention: local window
    pretrained_rope_band_tokens: int,  # tokens in the pretrained RoPE band
    prefill_tile_tokens: int,  # tokens per prefill tile
    prefill_summaries_per_tile: int,  # summary positions emitted per tile
) -> str:
    """SHA-256 of every position and tiling rule that changes the frozen decoder's features."""
    sizes = dict(
        dualChunkPretrainLength=dual_chunk_pretrain_length,
        dualChunkLocalSize=dual_chunk_local_size,
        pretrainedRopeBandTokens=pretrained_rope_band_tokens,
        prefillTileTokens=prefill_tile_tokens,
        prefillSummariesPerTile=prefill_summaries_per_tile,
    )
    bad = [name for name, size in sizes.items() if not is_int(size) or size < 1]
    if not isinstance(final_hidden_adapter_id, str) or not final_hidden_adapter_id:
        bad.insert(0, "finalHiddenAdapterId")
    if bad:
        raise ValueError(
            f"frozen-backbone position policy is malformed: {', '.join(bad)} "
            "(need a non-empty adapter id and positive integer sizes)"
        )
    policy = {"schema": _POSITION_POLICY_SCHEMA, "finalHiddenAdapterId": final_hidden_adapter_id}
    policy.update(sizes)
    return json_sha256(policy)


@dataclass(frozen=True)
class FrozenBackboneCacheAuthority:
    """Everything that can change one prompt's frozen decoder features (and nothing else)."""

    qualified_work_id: str  # the training work item the prompt belongs to
    prompt_sha256: str  # SHA-256 of the prompt text/tokens
    prompt_mask_sha256: str  # frozen_backbone_prompt_mask_sha256_boundary(...)
    parent_checkpoint_id: str  # v1 naming of the parent; v2 derives it from the artifact hash
    parent_manifest_payload_sha256: str  # the parent checkpoint manifest
    parent_model_artifact_sha256: str  # the parent weights actually executed
    parent_source_bundle_sha256: str = field(compare=False)  # diagnostic only: moving source tree
    position_policy_sha256: str  # frozen_backbone_position_policy_sha256_boundary(...)
    token_dtype: str  # "int32" | "int64"
    feature_dtype: str  # a key of FEATURE_DTYPES
    hidden_size: int  # H
    summary_positions: int  # S

    def _problems(self, parent_checkpoint_id: str) -> list[str]:
        problems = [
            name
            for name, value in (
                ("prompt_sha256", self.prompt_sha256),
                ("prompt_mask_sha256", self.prompt_mask_sha256),
                ("parent_manifest_payload_sha256", self.parent_manifest_payload_sha256),
                ("parent_model_artifact_sha256", self.parent_model_artifact_sha256),
                ("position_policy_sha256", self.position_policy_sha256),
            )
            if not is_sha256_hex(value)
        ]
        if not isinstance(self.qualified_work_id, str) or not self.qualified_work_id:
            problems.append("qualified_work_id")
        if not isinstance(parent_checkpoint_id, str) or not parent_checkpoint_id:
            problems.append("parent_checkpoint_id")
        if self.token_dtype not in _TOKEN_DTYPES:
            problems.append("token_dtype")
        if self.feature_dtype not in FEATURE_DTYPES:
            problems.append("feature_dtype")
        for name in ("hidden_size", "summary_positions"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                problems.append(name)
        return problems

    def _record(self, *, schema: str, parent_checkpoint_id: str) -> dict[str, object]:
        """The canonical record under ``schema``; raises ValueError naming every bad field."""
        problems = self._problems(parent_checkpoint_id)
        if problems:
            raise ValueError(f"frozen-backbone cache authority is malformed: {', '.join(problems)}")
        record: dict[str, object] = dict(
            schema=schema,
            qualifiedWorkId=self.qualified_work_id,
            qualifiedWorkIdSha256=sha256_bytes(self.qualified_work_id.encode("utf-8")),
            promptSha256=self.prompt_sha256,
            promptMaskSha256=self.prompt_mask_sha256,
            parentCheckpointId=parent_checkpoint_id,
            parentManifestPayloadSha256=self.parent_manifest_payload_sha256,
            parentModelArtifactSha256=self.parent_model_artifact_sha256,
            positionPolicySha256=self.position_policy_sha256,
            tokenDtype=self.token_dtype,
            featureDtype=self.feature_dtype,
            hiddenSize=self.hidden_size,
            summaryPositions=self.summary_positions,
        )
        record.update(SCOPE_FLAGS)
        return record

    def record_boundary(self) -> dict[str, object]:
        """The identity record of new (v2) objects: bound to the executed model artifact."""
        native_id = NATIVE_PARENT_PREFIX + str(self.parent_model_artifact_sha256)
        return self._record(schema=FROZEN_BACKBONE_AUTHORITY_SCHEMA, parent_checkpoint_id=native_id)

    def legacy_v1_record_boundary(self) -> dict[str, object] | None:
        """The record a v1 writer would have used (source-bound), or None when it can't be formed.

        Only a lookup uses it, for a constant-time probe of a historical object; a missing or
        changed source hash must never block the current identity."""
        if not is_sha256_hex(self.parent_source_bundle_sha256) or not self.parent_checkpoint_id:
            return None
        record = self._record(
            schema=FROZEN_BACKBONE_AUTHORITY_SCHEMA_V1,
            parent_checkpoint_id=self.parent_checkpoint_id,
        )
        record["parentSourceBundleSha256"] = self.parent_source_bundle_sha256
        return record

    def legacy_v1_sha256_boundary(self) -> str | None:
        record = self.legacy_v1_record_boundary()
        return None if record is None else json_sha256(record)

    def sha256_boundary(self) -> str:
        """The object name: SHA-256 of the canonical v2 record."""
        return json_sha256(self.record_boundary())

    def digest_tensors_boundary(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Row identity as uint8 ``[1, 32]`` tensors: (cache key, work id, prompt/mask)."""
        work_id_sha256 = sha256_bytes(self.qualified_work_id.encode("utf-8"))
        return (
            _digest_row(self.sha256_boundary()),
            _digest_row(work_id_sha256),
            _digest_row(self.prompt_mask_sha256),
        )
