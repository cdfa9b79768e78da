# SPDX-License-Identifier: Apache-2.0
"""Sharding on host: a weight split into (and joined from) one tensor per device, by the
placements of :mod:`models.common.mesh`."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from models.common.mesh import MeshShape, Placement


def contiguous(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor.contiguous()``, faster for the transposes loaders make of bfloat16 weights.

    torch's strided copy of bf16 is slower than of int16, so bytes move under an int16 view; and
    the transpose of a tall, narrow matrix (a 262k-vocab embedding as LM head) is done in 1 MiB
    row blocks that stay in cache instead of one strided copy (figures: docs/weight-cache.md)."""
    if tensor.is_contiguous() or tensor.element_size() != 2:
        return tensor.contiguous()
    raw = tensor.view(torch.int16)
    if raw.dim() == 2 and raw.stride() == (1, raw.shape[0]) and raw.shape[1] >= 64 * raw.shape[0]:
        return _blocked_transpose(raw.T).view(tensor.dtype)
    return raw.contiguous().view(tensor.dtype)


def _blocked_transpose(source: torch.Tensor, block_bytes: int = 1 << 20) -> torch.Tensor:
    """``source.T.contiguous()`` for a contiguous ``[rows, cols]`` source, in row blocks."""
    rows, cols = source.shape
    out = torch.empty(cols, rows, dtype=source.dtype)
    step = max(32, block_bytes // (cols * source.element_size()))
    for start in range(0, rows, step):
        out[:, start : start + step].copy_(source[start : start + step].T)
    return out


def _chunk(tensor: torch.Tensor, dim: int, parts: int, what: str) -> list[torch.Tensor]:
    size = tensor.shape[dim]
    if size % parts:
        raise ValueError(f"cannot split {what} dim {dim} of size {size} over {parts} devices")
    return list(torch.chunk(tensor, parts, dim=dim))


def shard(tensor: torch.Tensor, placement: Placement, mesh: MeshShape, *, copy: bool = True) -> list[torch.Tensor]:
    """One contiguous tensor per device, row-major; a single tensor when replicated.

    ``copy=False`` returns the shards as views (possibly strided) for a consumer that reads
    strides itself: ``ttnn.from_torch`` to TILE layout gathers a transposed view during its own
    conversion, bit-identically and faster than a torch copy first (see tensor_cache)."""
    rows, cols = mesh
    prepare = contiguous if copy else _as_is
    if placement.replicated:
        return [prepare(tensor)]
    if placement.flat_dim is not None:
        return [prepare(s) for s in _chunk(tensor, placement.flat_dim, rows * cols, "expert")]
    per_row = _chunk(tensor, placement.row_dim, rows, "row") if placement.row_dim is not None else [tensor] * rows
    shards = []
    for row_part in per_row:
        parts = _chunk(row_part, placement.col_dim, cols, "column") if placement.col_dim is not None else [row_part] * cols
        shards.extend(prepare(p) for p in parts)
    return shards


def _as_is(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def column_blocks(shards: Sequence[torch.Tensor], placement: Placement, mesh: MeshShape) -> list[torch.Tensor]:
    """What each mesh column holds of a weight, its row shards joined: the tensor-parallel view."""
    rows, cols = mesh
    if placement.replicated:
        return [shards[0]] * cols
    if placement.flat_dim is not None:
        return [_join(shards, placement.flat_dim)] * cols
    blocks = []
    for c in range(cols):
        column = [shards[r * cols + c] for r in range(rows)]
        blocks.append(_join(column, placement.row_dim) if placement.row_dim is not None else column[0])
    return blocks


def _join(parts: Sequence[torch.Tensor], dim: int) -> torch.Tensor:
    """``parts`` concatenated along ``dim``; one part as it is (``torch.cat`` would copy it: Gemma 3's
    640 MiB fp32 LM head, read back on a one-row mesh, twice over)."""
    return parts[0] if len(parts) == 1 else torch.cat(list(parts), dim=dim)


def unshard(shards: Sequence[torch.Tensor], placement: Placement, mesh: MeshShape) -> torch.Tensor:
    """The full tensor back from its shards (inverse of :func:`shard`)."""
    blocks = column_blocks(shards, placement, mesh)
    if placement.replicated or placement.flat_dim is not None or placement.col_dim is None:
        return blocks[0]
    return torch.cat(blocks, dim=placement.col_dim)
