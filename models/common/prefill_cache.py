# SPDX-License-Identifier: Apache-2.0
"""A durable, content-addressed cache of frozen-backbone prefill features.

In resynthesis training the parent (backbone) model is frozen, so the prefill of a prompt yields
the same features at every step, epoch and decode-arm reset. This module keeps them twice:

* :class:`BaseForwardCache` - an in-process LRU of complete prefill outputs in (pinned) CPU memory.
* :class:`FrozenBackboneFeatureSidecar` - one durable object per prompt on disk, shared by every
  later step, process and run on the host, and never read back wrong.

Identity. :class:`FrozenBackboneCacheAuthority` lists every input that can change the features.
Its canonical JSON record (sorted keys, no spaces, ASCII) is hashed with SHA-256 and that digest
names the object. Source-tree hashes are diagnostics only and never part of the identity.

Layout of one cache root::

    <cache_root>/objects/<sha[:2]>/<sha>/
        .writer.lock                  flock of the one writer of this object (empty file)
        progress.json                 durable frontier of an in-flight store (absent when done)
        final_hidden.<dtype>.bin      raw little-endian [1, 1, H] features
        summary_hidden.<dtype>.bin    raw little-endian [1, S, H] features
        input_positions.i64le         one int64 input position
        manifest.json                 published last: the object exists iff this file does

``manifest.json`` (schema ``FROZEN_BACKBONE_SIDECAR_SCHEMA``, canonical JSON plus a newline)::

    {"schema": ..., "authoritySha256": <sha>, "authority": {<authority record>}, "rows": 1,
     "backboneOnly": true, "additiveHeadCached": false, "historicalRboCached": false,
     "fabricCached": false, "targetEnteredForward": false,
     "artifacts": {"finalHidden" | "summaryHidden" | "inputPositions":
                   {"path": <absolute>, "bytes": int, "elements": int, "dtype": str,
                    "sha256": hex, "device": int, "inode": int, "mtimeNs": int}}}

Write protocol: take the object's lock; write the artifacts to ``*.partial`` and flush them; record
their digests in ``progress.json``; rename the partials into place; publish the manifest
atomically; fsync the directory. A writer killed at any point leaves no manifest (a plain miss)
or a complete object; the next writer reuses or rewrites what it finds. Published files are
never modified in place (a repair renames new files over them), so tensors mapped earlier stay
valid. :meth:`FrozenBackboneFeatureSidecar.store_batch_boundary` runs the same protocol for a whole
wave with one flush per phase and locks taken in one global order.

Read protocol: every manifest field, every artifact record and every artifact's SHA-256 is
checked before the files are memory-mapped; anything off raises :class:`FrozenBackboneCacheError`
(a ``RuntimeError``). The proof is kept in a bounded in-process LRU and reused while the kernel
stamps of all four files (dev, inode, mode, size, mtime_ns, ctime_ns) are unchanged - but only for
files last changed more than ``_RACY_WINDOW_NS`` before the proof, because coarse file-system
clocks can hide a same-size rewrite made within one tick (git's "racy clean" rule).

Legacy objects (authority schema v1, named by a hash that included the source tree) are still
found, read-only: by a direct probe when the caller still knows that source hash, otherwise
through a per-root index of their normalized manifests.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, NamedTuple

import torch
from loguru import logger

from models.common.fileio import (
    atomic_write_bytes,
    file_lock,
    file_locks,
    fsync_dir,
    fsync_dirs,
    fsync_fds,
    is_temp_path,
    sha256_bytes,
    sha256_file,
    unique_temp_path,
    write_all,
)

FROZEN_BACKBONE_AUTHORITY_SCHEMA_V1: Final = "nnf.resynthesis.frozen_backbone_prefill_authority.v1"
FROZEN_BACKBONE_AUTHORITY_SCHEMA: Final = "nnf.resynthesis.frozen_backbone_prefill_authority.v2"
FROZEN_BACKBONE_PACKET_SCHEMA: Final = "nnf.resynthesis.frozen_backbone_prefill_packet.v1"
FROZEN_BACKBONE_SIDECAR_SCHEMA: Final = "nnf.resynthesis.frozen_backbone_prefill_sidecar.v1"
FROZEN_BACKBONE_SIDECAR_PROGRESS_SCHEMA: Final = (
    "nnf.resynthesis.frozen_backbone_prefill_sidecar.progress.v1"
)
BASE_FORWARD_CACHE_SCHEMA: Final = "nnf.resynthesis.base_forward_cache.v1"
BASE_FORWARD_CACHE_ENV: Final = "NNF_RESYNTHESIS_BASE_FORWARD_CACHE"
BASE_FORWARD_CACHE_ENTRIES_ENV: Final = "NNF_RESYNTHESIS_BASE_FORWARD_CACHE_ENTRIES"
BASE_FORWARD_CACHE_DEFAULT_ENTRIES: Final = 512

FEATURE_DTYPES: Final[dict[str, torch.dtype]] = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
}
_TOKEN_DTYPES: Final = frozenset({"int32", "int64"})
_NATIVE_PARENT_PREFIX: Final = "resynthesis-native-parent:"
_PROMPT_MASK_DOMAIN: Final = b"nnf.resynthesis.frozen_backbone_prompt_mask.v1\x00"
_POSITION_POLICY_SCHEMA: Final = "nnf.resynthesis.frozen_backbone_position_policy.v1"
# Fields of a v1 authority that observed the source tree: diagnostics, never identity.
_SOURCE_DIAGNOSTIC_FIELDS: Final = frozenset(
    {"parentSourceBundleSha256", "sourceHashDiagnosticOnly", "sourceHashAffectsExecution"}
)
# Flags every record and manifest carries: what the object deliberately does NOT contain.
_SCOPE_FLAGS: Final[dict[str, bool]] = dict(
    backboneOnly=True, additiveHeadCached=False, historicalRboCached=False,
    fabricCached=False, targetEnteredForward=False,
)
_ARTIFACT_NAMES: Final = ("finalHidden", "summaryHidden", "inputPositions")
_MANIFEST_MAX_BYTES: Final = 1 << 20
_PROOF_CACHE_ENTRIES: Final = 8_192
_PROOF_CACHE_BYTES: Final = 64 << 20
_LEGACY_INDEX_ROOTS: Final = 16
_RACY_WINDOW_NS: Final = 2_000_000_000
_PARTIAL_SUFFIX: Final = ".partial"
_FALSE_WORDS: Final = frozenset({"0", "false", "no", "off"})
_TRUE_WORDS: Final = frozenset({"1", "true", "yes", "on"})


class FrozenBackboneCacheError(RuntimeError):
    """A cache object on disk (or its configuration) is not what it claims to be.

    The one exception type for corrupt, truncated, foreign or malformed cache state. It subclasses
    ``RuntimeError`` because callers of the original design already catch that."""


# ---------------------------------------------------------------------------------------------
# Small pure helpers
# ---------------------------------------------------------------------------------------------


def _is_sha256_hex(value: object) -> bool:
    return isinstance(value, str) and len(value) == 64 and not value.strip("0123456789abcdef")


def _is_int(value: object) -> bool:
    """A real JSON integer: ``True`` is not 1 here."""
    return type(value) is int


def _canonical_json(value: object) -> bytes:
    """The one serialization that identities and manifests are hashed in."""
    text = json.dumps(value, ensure_ascii=True, separators=(",", ":"), sort_keys=True)
    return text.encode("ascii")


def _json_sha256(value: object) -> str:
    return sha256_bytes(_canonical_json(value))


def _tensor_bytes(value: torch.Tensor) -> memoryview:
    """The raw storage bytes of a tensor (moved to CPU, made contiguous, dtype untouched)."""
    flat = value.detach().to(device="cpu").contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy())


def _str_keyed(value: object) -> dict[str, object] | None:
    """``value`` as a dict with only string keys, or None (never coerces)."""
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return dict(value)
    return None


def _digest_row(hex_digest: str) -> torch.Tensor:
    return torch.frombuffer(bytearray.fromhex(hex_digest), dtype=torch.uint8).reshape(1, 32)


# ---------------------------------------------------------------------------------------------
# Identity
# ---------------------------------------------------------------------------------------------


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
        hasher.update(_canonical_json(list(tensor.shape)) + b"\x00")
        hasher.update(_tensor_bytes(tensor))
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
    bad = [name for name, size in sizes.items() if not _is_int(size) or size < 1]
    if not isinstance(final_hidden_adapter_id, str) or not final_hidden_adapter_id:
        bad.insert(0, "finalHiddenAdapterId")
    if bad:
        raise ValueError(
            f"frozen-backbone position policy is malformed: {', '.join(bad)} "
            "(need a non-empty adapter id and positive integer sizes)"
        )
    policy = {"schema": _POSITION_POLICY_SCHEMA, "finalHiddenAdapterId": final_hidden_adapter_id}
    policy.update(sizes)
    return _json_sha256(policy)


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
            if not _is_sha256_hex(value)
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
            if not _is_int(value) or value < 1:
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
        record.update(_SCOPE_FLAGS)
        return record

    def record_boundary(self) -> dict[str, object]:
        """The identity record of new (v2) objects: bound to the executed model artifact."""
        native_id = _NATIVE_PARENT_PREFIX + str(self.parent_model_artifact_sha256)
        return self._record(schema=FROZEN_BACKBONE_AUTHORITY_SCHEMA, parent_checkpoint_id=native_id)

    def legacy_v1_record_boundary(self) -> dict[str, object] | None:
        """The record a v1 writer would have used (source-bound), or None when it can't be formed.

        Only a lookup uses it, for a constant-time probe of a historical object; a missing or
        changed source hash must never block the current identity."""
        if not _is_sha256_hex(self.parent_source_bundle_sha256) or not self.parent_checkpoint_id:
            return None
        record = self._record(
            schema=FROZEN_BACKBONE_AUTHORITY_SCHEMA_V1,
            parent_checkpoint_id=self.parent_checkpoint_id,
        )
        record["parentSourceBundleSha256"] = self.parent_source_bundle_sha256
        return record

    def legacy_v1_sha256_boundary(self) -> str | None:
        record = self.legacy_v1_record_boundary()
        return None if record is None else _json_sha256(record)

    def sha256_boundary(self) -> str:
        """The object name: SHA-256 of the canonical v2 record."""
        return _json_sha256(self.record_boundary())

    def digest_tensors_boundary(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Row identity as uint8 ``[1, 32]`` tensors: (cache key, work id, prompt/mask)."""
        work_id_sha256 = sha256_bytes(self.qualified_work_id.encode("utf-8"))
        return (
            _digest_row(self.sha256_boundary()),
            _digest_row(work_id_sha256),
            _digest_row(self.prompt_mask_sha256),
        )


def _normalized_authority(value: object) -> dict[str, object] | None:
    """A stored (possibly v1) authority with its source observations removed, in v2 form."""
    record = _str_keyed(value)
    if record is None:
        return None
    for name in _SOURCE_DIAGNOSTIC_FIELDS:
        record.pop(name, None)
    artifact_sha256 = record.get("parentModelArtifactSha256")
    if _is_sha256_hex(artifact_sha256):
        record["parentCheckpointId"] = _NATIVE_PARENT_PREFIX + str(artifact_sha256)
    if record.get("schema") == FROZEN_BACKBONE_AUTHORITY_SCHEMA_V1:
        record["schema"] = FROZEN_BACKBONE_AUTHORITY_SCHEMA
    return record


# ---------------------------------------------------------------------------------------------
# Packet
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FrozenBackbonePrefillPacket:
    """Raw frozen-decoder features of B rows; additive head, RBO and Fabric work stay live."""

    final_hidden_t: torch.Tensor  # [B, 1, H] feature dtype
    summary_hidden_t: torch.Tensor  # [B, S, H] feature dtype
    summary_mask_t: torch.Tensor  # [B, S] bool, all True (exact unpadded geometry)
    input_positions_t: torch.Tensor  # [B] int64, positive
    cache_key_sha256_t: torch.Tensor  # [B, 32] uint8: authority SHA-256
    work_id_sha256_t: torch.Tensor  # [B, 32] uint8: SHA-256 of the qualified work id
    prompt_mask_sha256_t: torch.Tensor  # [B, 32] uint8: prompt/mask SHA-256

    def _tensors(self) -> tuple[torch.Tensor, ...]:
        return (
            self.final_hidden_t,
            self.summary_hidden_t,
            self.summary_mask_t,
            self.input_positions_t,
            self.cache_key_sha256_t,
            self.work_id_sha256_t,
            self.prompt_mask_sha256_t,
        )

    def _geometry_problem(self) -> str | None:
        final, summary = self.final_hidden_t, self.summary_hidden_t
        if final.ndim != 3 or final.shape[1] != 1:
            return f"final hidden must be [B, 1, H], got {tuple(final.shape)}"
        batch, hidden = final.shape[0], final.shape[2]
        if summary.ndim != 3 or summary.shape[0] != batch or summary.shape[2] != hidden:
            return f"summary hidden must be [{batch}, S, {hidden}], got {tuple(summary.shape)}"
        if summary.shape[1] < 1 or summary.dtype != final.dtype:
            return "summary hidden needs S >= 1 and the final hidden's dtype"
        if self.summary_mask_t.shape != summary.shape[:2] or self.summary_mask_t.dtype != torch.bool:
            return "summary mask must be bool [B, S]"
        if self.input_positions_t.shape != (batch,) or self.input_positions_t.dtype != torch.long:
            return "input positions must be int64 [B]"
        digests = (self.cache_key_sha256_t, self.work_id_sha256_t, self.prompt_mask_sha256_t)
        if any(d.shape != (batch, 32) or d.dtype != torch.uint8 for d in digests):
            return "identity digests must be uint8 [B, 32]"
        if any(t.device != final.device for t in self._tensors()):
            return "all packet tensors must be on one device"
        return None

    def validate_boundary(self) -> None:
        """Raise ValueError on bad geometry; value checks run asynchronously on accelerators."""
        problem = self._geometry_problem()
        if problem is not None:
            raise ValueError(f"frozen-backbone prefill packet geometry differs: {problem}")
        torch._assert_async(
            self.summary_mask_t.all(), "frozen-backbone replay requires an all-true summary mask"
        )
        torch._assert_async(
            self.input_positions_t.gt(0).all(), "frozen-backbone input positions must be positive"
        )

    @classmethod
    def from_features_boundary(
        cls,
        *,
        authority: FrozenBackboneCacheAuthority,
        final_hidden_t: torch.Tensor,  # [1, 1, H]
        summary_hidden_t: torch.Tensor,  # [1, S, H]
        input_positions_t: torch.Tensor,  # one position
    ) -> FrozenBackbonePrefillPacket:
        """One row from raw features, checked against (and stamped with) its authority."""
        dtype = FEATURE_DTYPES.get(authority.feature_dtype)
        hidden, positions = authority.hidden_size, authority.summary_positions
        if (
            tuple(final_hidden_t.shape) != (1, 1, hidden)
            or tuple(summary_hidden_t.shape) != (1, positions, hidden)
            or final_hidden_t.dtype != dtype
            or summary_hidden_t.dtype != dtype
            or input_positions_t.numel() != 1
        ):
            raise ValueError(
                f"frozen-backbone row geometry differs: need final [1, 1, {hidden}] and summary "
                f"[1, {positions}, {hidden}] in {authority.feature_dtype} with one input "
                f"position; got {tuple(final_hidden_t.shape)} {final_hidden_t.dtype}, "
                f"{tuple(summary_hidden_t.shape)} {summary_hidden_t.dtype}, "
                f"{input_positions_t.numel()} positions"
            )
        device = final_hidden_t.device
        key_t, work_t, mask_t = authority.digest_tensors_boundary()
        packet = cls(
            final_hidden_t,
            summary_hidden_t,
            torch.ones((1, positions), dtype=torch.bool, device=device),
            input_positions_t.reshape(1).to(device=device, dtype=torch.long),
            key_t.to(device),
            work_t.to(device),
            mask_t.to(device),
        )
        packet.validate_boundary()
        return packet

    @classmethod
    def stack_boundary(
        cls, packets: tuple[FrozenBackbonePrefillPacket, ...]
    ) -> FrozenBackbonePrefillPacket:
        """Concatenate rows of one summary geometry, dtype and device into a batch."""
        if not packets:
            raise ValueError("cannot stack an empty tuple of frozen-backbone packets")
        for packet in packets:
            packet.validate_boundary()
        signatures = {
            (p.summary_hidden_t.shape[1], p.final_hidden_t.shape[2], p.final_hidden_t.dtype,
             p.final_hidden_t.device)
            for p in packets
        }
        if len(signatures) != 1:
            raise ValueError(
                "frozen-backbone rows to stack differ in summary positions, hidden size, dtype "
                f"or device: {sorted(map(str, signatures))}"
            )
        columns = zip(*(packet._tensors() for packet in packets), strict=True)
        stacked = cls(*(torch.cat(column, dim=0) for column in columns))
        stacked.validate_boundary()
        return stacked

    def to_device_boundary(self, device: torch.device) -> FrozenBackbonePrefillPacket:
        """A copy on ``device`` (always a copy, so it never aliases a memory-mapped file)."""
        device = torch.device(device)

        def moved(tensor: torch.Tensor) -> torch.Tensor:
            same = tensor.device == device
            return tensor.detach().to(device, non_blocking=device.type == "cuda", copy=same)

        packet = FrozenBackbonePrefillPacket(*(moved(t) for t in self._tensors()))
        packet.validate_boundary()
        return packet


# ---------------------------------------------------------------------------------------------
# On-disk object: paths and kernel stamps
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _ObjectPaths:
    root: Path
    manifest: Path
    progress: Path
    lock: Path
    artifacts: tuple[Path, Path, Path]  # final hidden, summary hidden, input positions

    @classmethod
    def of(cls, cache_root: Path, object_sha256: str, feature_dtype: str) -> _ObjectPaths:
        root = cache_root / "objects" / object_sha256[:2] / object_sha256
        return cls(
            root=root,
            manifest=root / "manifest.json",
            progress=root / "progress.json",
            lock=root / ".writer.lock",
            artifacts=(
                root / f"final_hidden.{feature_dtype}.bin",
                root / f"summary_hidden.{feature_dtype}.bin",
                root / "input_positions.i64le",
            ),
        )

    # The design's names for the three artifacts, kept for callers that read them.
    final_hidden = property(lambda self: self.artifacts[0])
    summary_hidden = property(lambda self: self.artifacts[1])
    input_positions = property(lambda self: self.artifacts[2])

    def artifact_paths_boundary(self) -> tuple[Path, Path, Path]:
        return self.artifacts

    @functools.cached_property
    def artifact_names(self) -> tuple[str, ...]:
        return tuple(map(str, self.artifacts))

    @functools.cached_property
    def stamped_names(self) -> tuple[str, ...]:
        """The files whose stamps make up a validation proof: manifest first."""
        return (str(self.manifest), *self.artifact_names)

    @property
    def partials(self) -> tuple[Path, ...]:
        return tuple(path.with_name(path.name + _PARTIAL_SUFFIX) for path in self.artifacts)


class _Stamp(NamedTuple):
    """What the kernel says about a file, without reading it."""

    device: int
    inode: int
    mode: int
    size: int
    mtime_ns: int
    ctime_ns: int


def _stamp(path: Path | str) -> _Stamp | None:
    try:
        observed = os.stat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(observed.st_mode):
        return None
    return tuple.__new__(_Stamp, (  # the fast path of NamedTuple construction: lookups are hot
        observed.st_dev, observed.st_ino, observed.st_mode,
        observed.st_size, observed.st_mtime_ns, observed.st_ctime_ns,
    ))


def _object_stamps(paths: _ObjectPaths) -> tuple[_Stamp | None, ...]:
    """Stamps of the manifest and the three artifacts (None where not a regular file)."""
    return tuple(map(_stamp, paths.stamped_names))


class _Small(NamedTuple):
    """The validated small artifacts of an object (templates: callers get clones)."""

    final_hidden: torch.Tensor
    input_positions: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.final_hidden.nbytes + self.input_positions.nbytes


class _ProofCache:
    """Bounded LRU of validated objects: (manifest path, authority sha) -> (file stamps, the
    small artifacts as tensors).

    A hit means "these exact files were fully hashed and matched", so a hot object costs four
    ``stat`` calls and one ``mmap`` instead of a re-hash. The few KiB of the final hidden state
    and input position ride along with the proof (bounded in total) so a hit maps one file, not
    three. Reset in a forked child (its lock may be mid-use)."""

    def __init__(self, capacity: int, byte_budget: int) -> None:
        self.capacity = capacity
        self.byte_budget = byte_budget
        self._lock = threading.Lock()
        self._proofs: OrderedDict[tuple[str, str], tuple[tuple[_Stamp | None, ...], _Small]] = OrderedDict()
        self._bytes = 0

    def holds(self, key: tuple[str, str], stamps: tuple[_Stamp | None, ...]) -> _Small | None:
        """The small artifacts if ``key`` is proven for exactly these stamps, else None."""
        with self._lock:
            proof = self._proofs.get(key)
            if proof is None:
                return None
            if proof[0] != stamps:
                self._drop(key)
                return None
            self._proofs.move_to_end(key)
            return proof[1]

    def remember(
        self, key: tuple[str, str], stamps: tuple[_Stamp | None, ...], small: _Small, started_ns: int
    ) -> None:
        """Keep a proof unless a file changed so recently that its stamp may not show a rewrite."""
        newest_change = max(max(s.mtime_ns, s.ctime_ns) for s in stamps if s is not None)
        if newest_change > started_ns - _RACY_WINDOW_NS:
            return
        with self._lock:
            if key in self._proofs:
                self._drop(key)
            self._proofs[key] = (stamps, small)
            self._bytes += small.nbytes
            while len(self._proofs) > self.capacity or self._bytes > self.byte_budget:
                self._drop(next(iter(self._proofs)))

    def _drop(self, key: tuple[str, str]) -> None:
        self._bytes -= self._proofs.pop(key)[1].nbytes

    def clear(self) -> None:
        with self._lock:
            self._proofs.clear()
            self._bytes = 0

    def reset_after_fork(self) -> None:
        self._lock = threading.Lock()
        self.clear()


_PROOFS = _ProofCache(_PROOF_CACHE_ENTRIES, _PROOF_CACHE_BYTES)
os.register_at_fork(after_in_child=_PROOFS.reset_after_fork)


# ---------------------------------------------------------------------------------------------
# Reading and checking JSON records
# ---------------------------------------------------------------------------------------------


def _read_json_object(path: Path, what: str) -> tuple[dict[str, object], bytes]:
    """Parse a small JSON object file; any problem is a FrozenBackboneCacheError."""
    try:
        with open(path, "rb") as stream:
            data = stream.read(_MANIFEST_MAX_BYTES + 1)
    except OSError as error:
        raise FrozenBackboneCacheError(f"cannot read {what} {path}: {error}") from error
    if len(data) > _MANIFEST_MAX_BYTES:
        raise FrozenBackboneCacheError(f"{what} {path} is larger than {_MANIFEST_MAX_BYTES} bytes")
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as error:  # bad JSON, bad UTF-8, 5000-digit numbers
        raise FrozenBackboneCacheError(f"{what} {path} is not valid JSON: {error}") from error
    record = _str_keyed(value)
    if record is None:
        raise FrozenBackboneCacheError(f"{what} {path} is not a JSON object")
    return record, data


def _expect(condition: bool, paths: _ObjectPaths, message: str) -> None:
    if not condition:
        raise FrozenBackboneCacheError(
            f"frozen-backbone cache object {paths.root} is invalid: {message}; "
            "store the object again to rebuild it"
        )


# ---------------------------------------------------------------------------------------------
# Legacy (v1, source-bound) objects
# ---------------------------------------------------------------------------------------------


def _legacy_entry(manifest_path: Path) -> str | None:
    """The normalized (v2) authority sha of a well-formed legacy manifest, else None."""
    object_sha256 = manifest_path.parent.name
    if not _is_sha256_hex(object_sha256) or manifest_path.parent.parent.name != object_sha256[:2]:
        return None
    try:
        manifest, _ = _read_json_object(manifest_path, "legacy manifest")
    except FrozenBackboneCacheError:
        return None
    stored = _str_keyed(manifest.get("authority"))
    if (
        manifest.get("schema") != FROZEN_BACKBONE_SIDECAR_SCHEMA
        or manifest.get("authoritySha256") != object_sha256
        or stored is None
        or _SOURCE_DIAGNOSTIC_FIELDS.isdisjoint(stored)
        or _json_sha256(stored) != object_sha256
    ):
        return None
    return _json_sha256(_normalized_authority(stored))


class _LegacyIndex:
    """Per resolved root: normalized authority sha -> legacy manifest paths.

    Built on the first miss of a process under a root, by reading every manifest once (legacy
    objects are never written any more, so it never goes stale); bounded to a few roots."""

    def __init__(self, roots: int) -> None:
        self.roots = roots
        self._lock = threading.Lock()
        self._indexes: OrderedDict[Path, dict[str, tuple[Path, ...]]] = OrderedDict()

    def get(self, cache_root: Path) -> dict[str, tuple[Path, ...]]:
        with self._lock:
            index = self._indexes.get(cache_root)
            if index is None:
                index = self._build(cache_root)
                self._indexes[cache_root] = index
            self._indexes.move_to_end(cache_root)
            while len(self._indexes) > self.roots:
                self._indexes.popitem(last=False)
            return index

    @staticmethod
    def _build(cache_root: Path) -> dict[str, tuple[Path, ...]]:
        found: dict[str, list[Path]] = {}
        for manifest_path in sorted((cache_root / "objects").glob("*/*/manifest.json")):
            normalized_sha256 = _legacy_entry(manifest_path)
            if normalized_sha256 is not None:
                found.setdefault(normalized_sha256, []).append(manifest_path)
        logger.debug("legacy prefill index of {}: {} authorities", cache_root, len(found))
        return {key: tuple(value) for key, value in found.items()}

    def reset_after_fork(self) -> None:
        self._lock = threading.Lock()


_LEGACY_INDEX = _LegacyIndex(_LEGACY_INDEX_ROOTS)
os.register_at_fork(after_in_child=_LEGACY_INDEX.reset_after_fork)


# ---------------------------------------------------------------------------------------------
# The durable object
# ---------------------------------------------------------------------------------------------


@dataclass
class _StagedObject:
    """One object of a store in flight: its payloads, digests and (after flushing) file facts."""

    sidecar: FrozenBackboneFeatureSidecar
    payloads: tuple[memoryview, ...]
    sha256s: tuple[str, ...]
    records: dict[str, dict[str, object]] = field(default_factory=dict)


class FrozenBackboneFeatureSidecar:
    """The durable object of one authority under ``cache_root`` (see the module docstring)."""

    def __init__(self, *, cache_root: Path, authority: FrozenBackboneCacheAuthority) -> None:
        self.authority = authority
        self.authority_record = authority.record_boundary()
        self.authority_sha256 = _json_sha256(self.authority_record)
        self.cache_root = Path(cache_root).expanduser().resolve()
        self.paths = _ObjectPaths.of(self.cache_root, self.authority_sha256, authority.feature_dtype)
        self.legacy_authority_record = authority.legacy_v1_record_boundary()
        self.legacy_authority_sha256 = (
            None
            if self.legacy_authority_record is None
            else _json_sha256(self.legacy_authority_record)
        )
        self.legacy_paths = (
            None
            if self.legacy_authority_sha256 is None
            else _ObjectPaths.of(self.cache_root, self.legacy_authority_sha256, authority.feature_dtype)
        )
        self._dtype = FEATURE_DTYPES[authority.feature_dtype]
        hidden, positions = authority.hidden_size, authority.summary_positions
        self._elements = (hidden, positions * hidden, 1)
        self._shapes = ((1, 1, hidden), (1, positions, hidden), (1,))
        self._artifact_dtypes = (authority.feature_dtype, authority.feature_dtype, "int64")
        self._torch_dtypes = (self._dtype, self._dtype, torch.long)
        self._identity_rows = authority.digest_tensors_boundary()
        self._identity_template = torch.stack(self._identity_rows)  # [3, 1, 32]
        self._summary_mask = torch.ones((1, positions), dtype=torch.bool)

    def __repr__(self) -> str:
        return f"FrozenBackboneFeatureSidecar({self.paths.root})"

    # -- lookup ---------------------------------------------------------------------------

    def lookup_boundary(self) -> FrozenBackbonePrefillPacket | None:
        """The stored row (memory-mapped), or None on a miss. Never writes anything.

        Raises FrozenBackboneCacheError when an object exists but does not check out."""
        found = self._lookup(self.paths)
        if found is None and self.legacy_paths is not None:
            found = self._lookup(self.legacy_paths)
        return found if found is not None else self._lookup_indexed_legacy()

    def _lookup_indexed_legacy(self) -> FrozenBackbonePrefillPacket | None:
        for manifest_path in _LEGACY_INDEX.get(self.cache_root).get(self.authority_sha256, ()):
            paths = _ObjectPaths.of(self.cache_root, manifest_path.parent.name, self.authority.feature_dtype)
            if paths.root not in (self.paths.root, getattr(self.legacy_paths, "root", None)):
                found = self._lookup(paths)
                if found is not None:
                    return found
        return None

    def _lookup(self, paths: _ObjectPaths) -> FrozenBackbonePrefillPacket | None:
        """The object at ``paths``: None without a manifest, else validated (or proven) and mapped."""
        stamps = _object_stamps(paths)
        if stamps[0] is None:
            return None
        key = (paths.stamped_names[0], self.authority_sha256)
        small = _PROOFS.holds(key, stamps)
        if small is not None:
            return self._map_proven(paths, small)
        try:
            return self._validate_and_map(paths, key, stamps)
        except (OSError, RecursionError) as error:  # a file vanished or is unreadable
            raise FrozenBackboneCacheError(f"cannot validate {paths.root}: {error!r}") from error

    def _map(self, paths: _ObjectPaths) -> FrozenBackbonePrefillPacket:
        """Memory-map the three artifacts as one packet row (no copy, no hashing, no checks:
        only called on content proven to be what :meth:`store_boundary` validated)."""
        final_t, summary_t, positions_t = (
            torch.from_file(name, shared=False, size=count, dtype=dtype).reshape(shape)
            for name, count, dtype, shape in zip(
                paths.artifact_names, self._elements, self._torch_dtypes, self._shapes, strict=True
            )
        )
        return FrozenBackbonePrefillPacket(
            final_t, summary_t, self._summary_mask.clone(), positions_t,
            *self._identity_template.clone().unbind(0),
        )

    def _map_proven(self, paths: _ObjectPaths, small: _Small) -> FrozenBackbonePrefillPacket:
        """Like :meth:`_map` for a proven object: map the summary, clone the small artifacts from
        the proof (private copies, so callers never share memory)."""
        summary_t = torch.from_file(
            paths.artifact_names[1], shared=False, size=self._elements[1], dtype=self._dtype
        ).view(self._shapes[1])
        return FrozenBackbonePrefillPacket(
            small.final_hidden.clone(),
            summary_t,
            self._summary_mask.clone(),
            small.input_positions.clone(),
            *self._identity_template.clone().unbind(0),
        )

    def _validate_and_map(
        self, paths: _ObjectPaths, key: tuple[str, str], before: tuple[_Stamp | None, ...]
    ) -> FrozenBackbonePrefillPacket:
        """Check everything, map, and check that nothing changed meanwhile; remember the proof."""
        started_ns = time.time_ns()
        _expect(None not in before, paths, "an artifact is missing or not a regular file")
        manifest, _ = _read_json_object(paths.manifest, "manifest")
        self._check_manifest_header(paths, manifest)
        artifacts = _str_keyed(manifest.get("artifacts"))
        _expect(artifacts is not None, paths, "manifest has no artifacts object")
        for index, name in enumerate(_ARTIFACT_NAMES):
            self._check_artifact(paths, index, name, artifacts.get(name))
        packet = self._map(paths)
        _expect(int(packet.input_positions_t[0]) > 0, paths, "input position is not positive")
        _expect(_object_stamps(paths) == before, paths, "files changed while they were being validated")
        small = _Small(packet.final_hidden_t.clone(), packet.input_positions_t.clone())
        _PROOFS.remember(key, before, small, started_ns)
        return packet

    def _check_manifest_header(self, paths: _ObjectPaths, manifest: dict[str, object]) -> None:
        stored = _str_keyed(manifest.get("authority"))
        stored_sha256 = manifest.get("authoritySha256")
        _expect(manifest.get("schema") == FROZEN_BACKBONE_SIDECAR_SCHEMA, paths, "unknown manifest schema")
        _expect(
            _is_sha256_hex(stored_sha256) and paths.root.name == stored_sha256
            and paths.root.parent.name == stored_sha256[:2],
            paths,
            "authoritySha256 does not name this object directory",
        )
        _expect(stored is not None and _json_sha256(stored) == stored_sha256, paths,
                "stored authority does not hash to authoritySha256")
        _expect(
            _canonical_json(_normalized_authority(stored)) == _canonical_json(self.authority_record),
            paths,
            "stored authority is not the requested authority",
        )
        _expect(_is_int(manifest.get("rows")) and manifest.get("rows") == 1, paths, "rows is not 1")
        for flag, expected in _SCOPE_FLAGS.items():
            _expect(manifest.get(flag) is expected, paths, f"{flag} is not {expected}")

    def _check_artifact(self, paths: _ObjectPaths, index: int, name: str, value: object) -> None:
        path = paths.artifacts[index]
        record = _str_keyed(value)
        _expect(record is not None, paths, f"{name} record is missing")
        observed = os.stat(path)
        expected = {
            "path": str(path),
            "bytes": observed.st_size,
            "elements": self._elements[index],
            "dtype": self._artifact_dtypes[index],
            "device": observed.st_dev,
            "inode": observed.st_ino,
            "mtimeNs": observed.st_mtime_ns,
        }
        for field_name, wanted in expected.items():
            stored = record.get(field_name)
            _expect(
                type(stored) is type(wanted) and stored == wanted,
                paths,
                f"{name}.{field_name} is {stored!r:.80}, the file says {wanted!r}",
            )
        element_size = torch.empty((), dtype=self._dtype if index < 2 else torch.long).element_size()
        _expect(observed.st_size == self._elements[index] * element_size, paths, f"{name} has the wrong size")
        recorded_sha256 = record.get("sha256")
        _expect(_is_sha256_hex(recorded_sha256), paths, f"{name}.sha256 is not a SHA-256")
        try:
            actual_sha256 = sha256_file(path)
        except OSError as error:
            raise FrozenBackboneCacheError(f"cannot read {path}: {error}") from error
        _expect(actual_sha256 == recorded_sha256, paths, f"{name} content does not match its SHA-256")

    # -- progress -------------------------------------------------------------------------

    def progress_boundary(self) -> dict[str, object] | None:
        """The durable frontier of an interrupted store of this object, or None if none.

        ``{"schema", "authoritySha256", "completedRows": 1, "artifacts": {name: {"bytes",
        "sha256"}}}`` says the partial artifacts with those digests were flushed to disk.
        Raises FrozenBackboneCacheError when the file exists but is not such a record."""
        if _stamp(self.paths.progress) is None:
            return None
        progress, _ = _read_json_object(self.paths.progress, "progress file")
        artifacts = _str_keyed(progress.get("artifacts"))
        well_formed = (
            progress.get("schema") == FROZEN_BACKBONE_SIDECAR_PROGRESS_SCHEMA
            and progress.get("authoritySha256") == self.authority_sha256
            and _is_int(progress.get("completedRows"))
            and progress.get("completedRows") == 1
            and artifacts is not None
            and set(artifacts) == set(_ARTIFACT_NAMES)
            and all(self._is_progress_record(artifacts[name]) for name in _ARTIFACT_NAMES)
        )
        if not well_formed:
            raise FrozenBackboneCacheError(f"progress file {self.paths.progress} is malformed")
        return progress

    @staticmethod
    def _is_progress_record(value: object) -> bool:
        record = _str_keyed(value)
        return (
            record is not None
            and _is_int(record.get("bytes"))
            and record["bytes"] >= 0
            and _is_sha256_hex(record.get("sha256"))
        )

    def _progress_payload(self, staged: _StagedObject) -> dict[str, object]:
        return {
            "schema": FROZEN_BACKBONE_SIDECAR_PROGRESS_SCHEMA,
            "authoritySha256": self.authority_sha256,
            "completedRows": 1,
            "artifacts": {
                name: {"bytes": len(payload), "sha256": digest}
                for name, payload, digest in zip(
                    _ARTIFACT_NAMES, staged.payloads, staged.sha256s, strict=True
                )
            },
        }

    # -- store ----------------------------------------------------------------------------

    def _check_packet(self, packet: FrozenBackbonePrefillPacket) -> None:
        """Refuse a row that is not this authority's before touching the disk."""
        packet.validate_boundary()
        if (
            tuple(packet.final_hidden_t.shape) != self._shapes[0]
            or tuple(packet.summary_hidden_t.shape) != self._shapes[1]
            or packet.final_hidden_t.dtype != self._dtype
        ):
            raise ValueError(
                f"packet does not match its authority: final {tuple(packet.final_hidden_t.shape)}, "
                f"summary {tuple(packet.summary_hidden_t.shape)} {packet.final_hidden_t.dtype}; "
                f"expected {self._shapes[0]}, {self._shapes[1]} {self._dtype}"
            )
        identity = (packet.cache_key_sha256_t, packet.work_id_sha256_t, packet.prompt_mask_sha256_t)
        for actual, expected in zip(identity, self._identity_rows, strict=True):
            if not torch.equal(actual.detach().cpu(), expected):
                raise ValueError("packet identity digests differ from its authority")

    def _staged(self, packet: FrozenBackbonePrefillPacket) -> _StagedObject:
        payloads = tuple(
            _tensor_bytes(t)
            for t in (packet.final_hidden_t, packet.summary_hidden_t, packet.input_positions_t)
        )
        return _StagedObject(self, payloads, tuple(sha256_bytes(p) for p in payloads))

    def _existing_or_retract(self) -> FrozenBackbonePrefillPacket | None:
        """Under the writer lock: the valid object if there is one; otherwise make sure no
        manifest claims one (a corrupt object is retracted, so a crash mid-rebuild is a miss)."""
        try:
            return self._lookup(self.paths)
        except FrozenBackboneCacheError as error:
            logger.warning("rebuilding invalid prefill cache object: {}", error)
            self.paths.manifest.unlink(missing_ok=True)
            fsync_dir(self.paths.root)
            return None

    def _sweep_debris(self) -> None:
        """Remove temp files of killed writers (safe: we hold the writer lock)."""
        for path in self.paths.root.iterdir():
            if is_temp_path(path):
                path.unlink(missing_ok=True)

    def _durable_frontier(self) -> dict[str, object] | None:
        try:
            return self.progress_boundary()
        except FrozenBackboneCacheError as error:
            logger.warning("ignoring {}; restaging from the packet", error)
            return None

    def _reusable(self, staged: _StagedObject, index: int, frontier: dict[str, object] | None) -> bool:
        """True when a durable partial artifact from an interrupted store already holds exactly
        the bytes to write (checked by hash, never trusted)."""
        if frontier is None:
            return False
        recorded = frontier["artifacts"][_ARTIFACT_NAMES[index]]  # type: ignore[index]
        partial = self.paths.partials[index]
        if recorded["sha256"] != staged.sha256s[index] or _stamp(partial) is None:
            return False
        return os.stat(partial).st_size == len(staged.payloads[index]) and (
            sha256_file(partial) == staged.sha256s[index]
        )

    def _artifact_record(self, staged: _StagedObject, index: int, facts: os.stat_result) -> dict[str, object]:
        return {
            "path": str(self.paths.artifacts[index]),
            "bytes": facts.st_size,
            "elements": self._elements[index],
            "dtype": self._artifact_dtypes[index],
            "sha256": staged.sha256s[index],
            "device": facts.st_dev,
            "inode": facts.st_ino,
            "mtimeNs": facts.st_mtime_ns,
        }

    def _manifest_bytes(self, staged: _StagedObject) -> bytes:
        manifest: dict[str, object] = {
            "schema": FROZEN_BACKBONE_SIDECAR_SCHEMA,
            "authoritySha256": self.authority_sha256,
            "authority": self.authority_record,
            "rows": 1,
        }
        manifest.update(_SCOPE_FLAGS)
        manifest["artifacts"] = staged.records
        return _canonical_json(manifest) + b"\n"

    def _promote(self) -> None:
        for partial, final in zip(self.paths.partials, self.paths.artifacts, strict=True):
            os.replace(partial, final)

    def store_boundary(self, packet: FrozenBackbonePrefillPacket) -> FrozenBackbonePrefillPacket:
        """Durably publish one row and return it memory-mapped from disk.

        If the object already exists (and checks out) it is returned untouched."""
        self._check_packet(packet)
        self.paths.root.mkdir(parents=True, exist_ok=True)
        with file_lock(self.paths.lock):
            existing = self._existing_or_retract()
            if existing is not None:
                return existing
            self._sweep_debris()
            staged = self._staged(packet)
            frontier = self._durable_frontier()
            with _open_partials(self, staged, frontier) as fds:
                fsync_fds(fd for fd in fds if fd is not None)
                self._record_partials(staged)
            atomic_write_bytes(self.paths.progress, _canonical_json(self._progress_payload(staged)))
            self._promote()
            atomic_write_bytes(self.paths.manifest, self._manifest_bytes(staged))
            self.paths.progress.unlink(missing_ok=True)
            fsync_dirs(self.paths.root.parents[index] for index in range(3))  # the object's own entry
            return self._map(self.paths)

    def _record_partials(self, staged: _StagedObject) -> None:
        for index, (name, partial) in enumerate(zip(_ARTIFACT_NAMES, self.paths.partials, strict=True)):
            staged.records[name] = self._artifact_record(staged, index, os.stat(partial))

    @staticmethod
    def store_batch_boundary(
        captured: tuple[tuple[FrozenBackboneFeatureSidecar, FrozenBackbonePrefillPacket], ...],
    ) -> int:
        """Durably publish a producer's wave of rows; returns the number of rows in the wave.

        Each row is still its own object with its own lock; only the flushes are shared: all
        artifacts are written then flushed together, then all manifests are written and flushed,
        then renamed into place, then each directory is synced once. Locks are taken in one
        global order, so overlapping waves from many processes never deadlock. A failure before
        the renames leaves no manifest: lookups see a plain miss. Rows that already exist are
        left untouched. (Durability of the renames relies on the file system committing
        metadata in order, as journaling file systems do.)"""
        if not captured:
            return 0
        roots = [sidecar.paths.root for sidecar, _ in captured]
        if len(set(roots)) != len(roots):
            raise ValueError("a frozen-backbone batch names the same object more than once")
        for sidecar, packet in captured:
            sidecar._check_packet(packet)
        for root in roots:
            root.mkdir(parents=True, exist_ok=True)
        with file_locks(sidecar.paths.lock for sidecar, _ in captured):
            todo = [
                sidecar._staged(packet)
                for sidecar, packet in sorted(captured, key=lambda row: str(row[0].paths.root))
                if sidecar._existing_or_retract() is None
            ]
            if todo:
                _publish_wave(todo)
        return len(captured)


@contextlib.contextmanager
def _open_partials(
    sidecar: FrozenBackboneFeatureSidecar,
    staged: _StagedObject,
    frontier: dict[str, object] | None,
) -> Iterator[list[int | None]]:
    """Write the object's partial artifacts (reusing verified durable ones) and yield their fds
    (None for a reused file) open for flushing; closes them afterwards."""
    fds: list[int | None] = []
    try:
        for index, partial in enumerate(sidecar.paths.partials):
            if sidecar._reusable(staged, index, frontier):
                fds.append(None)
                continue
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            fds.append(fd)
            write_all(fd, staged.payloads[index])
        yield fds
    finally:
        for fd in fds:
            if fd is not None:
                os.close(fd)


def _publish_wave(wave: list[_StagedObject]) -> None:
    """The phases of :meth:`FrozenBackboneFeatureSidecar.store_batch_boundary` (locks held)."""
    with contextlib.ExitStack() as stack:
        artifact_fds: list[int] = []
        for staged in wave:
            staged.sidecar._sweep_debris()
            staged.sidecar.paths.progress.unlink(missing_ok=True)
            fds = stack.enter_context(_open_partials(staged.sidecar, staged, None))
            artifact_fds.extend(fd for fd in fds if fd is not None)
        fsync_fds(artifact_fds)
    manifest_temps = [_manifest_temp(staged.sidecar) for staged in wave]
    try:
        with contextlib.ExitStack() as stack:
            manifest_fds = []
            for staged, temp in zip(wave, manifest_temps, strict=True):
                staged.sidecar._record_partials(staged)
                fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                stack.callback(os.close, fd)
                write_all(fd, staged.sidecar._manifest_bytes(staged))
                manifest_fds.append(fd)
            fsync_fds(manifest_fds)
        for staged, temp in zip(wave, manifest_temps, strict=True):
            staged.sidecar._promote()
            os.replace(temp, staged.sidecar.paths.manifest)
    finally:
        for temp in manifest_temps:
            temp.unlink(missing_ok=True)
    fsync_dirs(_directories_to_sync(wave))


def _manifest_temp(sidecar: FrozenBackboneFeatureSidecar) -> Path:
    return unique_temp_path(sidecar.paths.manifest)


def _directories_to_sync(wave: Iterable[_StagedObject]) -> Iterator[Path]:
    for staged in wave:
        root = staged.sidecar.paths.root
        yield from (root, root.parent, root.parent.parent, root.parent.parent.parent)


def _clear_validation_proofs() -> None:
    """Forget every cached validation proof (benchmarks measure cold lookups with it)."""
    _PROOFS.clear()


# ---------------------------------------------------------------------------------------------
# In-memory tier: complete prefill outputs in (pinned) CPU memory
# ---------------------------------------------------------------------------------------------


def _env_word(name: str, default: str) -> str:
    return os.environ.get(name, default).strip().lower()


def base_forward_cache_enabled_boundary() -> bool:
    """Whether the in-memory frozen-parent prefill cache is on (``NNF_RESYNTHESIS_BASE_FORWARD_CACHE``)."""
    word = _env_word(BASE_FORWARD_CACHE_ENV, "1")
    if word in _TRUE_WORDS:
        return True
    if word in _FALSE_WORDS:
        return False
    raise FrozenBackboneCacheError(
        f"{BASE_FORWARD_CACHE_ENV}={os.environ[BASE_FORWARD_CACHE_ENV]!r} is not one of "
        f"{sorted(_TRUE_WORDS | _FALSE_WORDS)}"
    )


def base_forward_cache_capacity_boundary() -> int:
    """LRU capacity in entries (``NNF_RESYNTHESIS_BASE_FORWARD_CACHE_ENTRIES``, default 512)."""
    raw = os.environ.get(BASE_FORWARD_CACHE_ENTRIES_ENV, str(BASE_FORWARD_CACHE_DEFAULT_ENTRIES))
    try:
        capacity = int(raw.strip())
    except ValueError:
        capacity = 0
    if capacity < 1:
        raise FrozenBackboneCacheError(
            f"{BASE_FORWARD_CACHE_ENTRIES_ENV}={raw!r} must be a positive integer"
        )
    return capacity


def base_forward_cache_allowed_boundary(
    *, input_mask: torch.Tensor | None, use_past: bool, parent_trainable: bool
) -> bool:
    """Whether a prefill may be served from the cache.

    Only a batched training prefill qualifies: it has an explicit attention mask, continues no
    KV state and runs a frozen parent. A decode arm must run live to populate its KV cache."""
    if input_mask is None or use_past or parent_trainable:
        return False
    return base_forward_cache_enabled_boundary()


def base_forward_cache_key_boundary(
    input_ids: torch.Tensor, attention_mask: torch.Tensor | None
) -> tuple[str, str]:
    """(SHA-256 hex, its 16-hex display prefix) of a prompt, its mask and their shapes."""
    if input_ids.ndim != 2 or input_ids.shape[1] < 1:
        raise ValueError(f"base forward cache key needs [batch, sequence], got {tuple(input_ids.shape)}")
    if attention_mask is not None and attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention mask {tuple(attention_mask.shape)} differs from input ids {tuple(input_ids.shape)}"
        )
    hasher = hashlib.sha256(b"nnf.resynthesis.base_forward_cache_key.v2\x00")
    for tensor in (input_ids, attention_mask):
        if tensor is None:
            hasher.update(b"no-mask\x00")
            continue
        hasher.update(_canonical_json(list(tensor.shape)) + b"\x00")
        hasher.update(_tensor_bytes(tensor.detach().to(device="cpu", dtype=torch.long)))
    full = hasher.hexdigest()
    return full, full[:16]


@functools.cache
def _host_can_pin() -> bool:
    try:
        torch.empty(1).pin_memory()
    except RuntimeError:
        return False
    return True


def _to_host(value: torch.Tensor) -> torch.Tensor:
    """A detached contiguous CPU copy, page-locked when the host has an accelerator."""
    host = value.detach().to(device="cpu").contiguous()
    return host.pin_memory() if _host_can_pin() else host


def _map_optional(function, value: torch.Tensor | None) -> torch.Tensor | None:
    return function(value) if isinstance(value, torch.Tensor) else None


@dataclass(frozen=True)
class BaseForwardCacheEntry:
    """One complete frozen-parent prefill output, held in CPU memory."""

    hidden: torch.Tensor  # decoder output hidden states
    logits: torch.Tensor  # parent logits
    parent_context_hidden: torch.Tensor  # context features fed to the child
    parent_expert_routes: torch.Tensor  # MoE routing of the parent
    parent_layer_routes: torch.Tensor  # per-layer routing
    kv_prefix_positions: torch.Tensor  # positions already in the KV cache
    kv_new_positions: torch.Tensor  # positions this prefill appended
    parent_prefill_hidden: torch.Tensor | None  # optional tiled prefill features
    parent_prefill_input_positions: torch.Tensor | None  # optional positions of those
    sha16: str  # display prefix of the prompt key

    _REQUIRED = (
        "hidden", "logits", "parent_context_hidden", "parent_expert_routes",
        "parent_layer_routes", "kv_prefix_positions", "kv_new_positions",
    )
    _OPTIONAL = ("parent_prefill_hidden", "parent_prefill_input_positions")

    def _mapped(self, function) -> BaseForwardCacheEntry:
        values = {name: function(getattr(self, name)) for name in self._REQUIRED}
        values.update({name: _map_optional(function, getattr(self, name)) for name in self._OPTIONAL})
        return BaseForwardCacheEntry(sha16=self.sha16, **values)

    @classmethod
    def from_forward_boundary(
        cls,
        *,
        hidden: torch.Tensor,  # required outputs of the forward ...
        logits: torch.Tensor,
        parent_context_hidden: torch.Tensor,
        parent_expert_routes: torch.Tensor,  # ... routing ...
        parent_layer_routes: torch.Tensor,
        kv_prefix_positions: torch.Tensor,  # ... and KV geometry
        kv_new_positions: torch.Tensor,
        parent_prefill_hidden: torch.Tensor | None,  # optional tiled prefill outputs
        parent_prefill_input_positions: torch.Tensor | None,
        sha16: str,
    ) -> BaseForwardCacheEntry:
        """Capture a forward's outputs as detached CPU copies (pinned where possible)."""
        live = cls(
            hidden, logits, parent_context_hidden, parent_expert_routes, parent_layer_routes,
            kv_prefix_positions, kv_new_positions, parent_prefill_hidden,
            parent_prefill_input_positions, sha16,
        )
        return live._mapped(_to_host)

    def to_device_boundary(self, device: torch.device) -> BaseForwardCacheEntry:
        """The entry on the compute device (asynchronous copies from pinned memory on CUDA)."""
        device = torch.device(device)
        return self._mapped(lambda t: t.to(device=device, non_blocking=device.type == "cuda"))


class BaseForwardCache:
    """Thread-safe LRU of complete frozen-parent prefill outputs, with hit/miss telemetry."""

    def __init__(self, *, capacity: int) -> None:
        if not _is_int(capacity) or capacity < 1:
            raise ValueError(f"base forward cache capacity must be a positive integer, got {capacity!r}")
        self._capacity = capacity
        self._entries: OrderedDict[str, BaseForwardCacheEntry] = OrderedDict()
        self._lock = threading.Lock()
        self._hits = 0
        self._misses = 0

    hits = property(lambda self: self._hits, doc="Lookups that found their key.")
    misses = property(lambda self: self._misses, doc="Lookups that did not.")

    def clear(self) -> None:
        """Drop every entry (the counters keep counting)."""
        with self._lock:
            self._entries.clear()

    def lookup(self, cache_key: str) -> BaseForwardCacheEntry | None:
        """The entry for ``cache_key`` (now the most recently used) or None; counted."""
        with self._lock:
            entry = self._entries.pop(cache_key, None)
            if entry is None:
                self._misses += 1
            else:
                self._hits += 1
                self._entries[cache_key] = entry
            return entry

    def store(self, cache_key: str, entry: BaseForwardCacheEntry) -> None:
        """Insert or refresh ``cache_key``, evicting the least recently used beyond capacity."""
        with self._lock:
            self._entries.pop(cache_key, None)
            self._entries[cache_key] = entry
            if len(self._entries) > self._capacity:
                del self._entries[next(iter(self._entries))]

    def telemetry_boundary(self) -> dict[str, object]:
        """Counters for run logs: schema, enabled, capacity, entries, hits, misses."""
        with self._lock:
            return dict(
                schema=BASE_FORWARD_CACHE_SCHEMA,
                enabled=base_forward_cache_enabled_boundary(),
                capacity=self._capacity,
                entries=len(self._entries),
                hits=self._hits,
                misses=self._misses,
            )
