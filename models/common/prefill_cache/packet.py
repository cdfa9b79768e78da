# SPDX-License-Identifier: Apache-2.0
"""The packet a producer hands to the cache and a lookup returns: raw frozen-decoder features of
B rows with their identity digests."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from models.common.prefill_cache.identity import FEATURE_DTYPES, FrozenBackboneCacheAuthority


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
