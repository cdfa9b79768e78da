# SPDX-License-Identifier: Apache-2.0
"""How a weight is laid over a mesh of devices: the one home of sharding on host.

A mesh is ``rows x cols`` devices, numbered row-major (device ``r * cols + c``). Tensor
parallelism runs over the mesh *columns*: attention heads and MLP hidden units are split across
them. On a 2D mesh (Galaxy ``(8, 4)``) the model dimension is split across the *rows* as well.

* ``COLUMN_PARALLEL`` (QKV, gate/up, LM head; stored ``[in, out]``): out-features split over
  columns, in-features over rows.
* ``ROW_PARALLEL`` (attention output, down projection): in-features split over columns,
  out-features over rows; the partial results are summed across columns.
* ``EXPERT_PARALLEL`` (stacked MoE experts): the expert dimension split over every device.
* ``REPLICATED`` (norms, router, embeddings): one copy, stored once, replicated on upload.

Fused weights (QKV, gate/up) are built *column-blocked* by the loader: column ``c``'s block is
contiguous, so sharding stays a plain chunk and both directions live here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

MeshShape = tuple[int, int]
KNOWN_MESHES: dict[str, MeshShape] = {"N150": (1, 1), "N300": (1, 2), "T3K": (1, 8), "TG": (8, 4)}


@dataclass(frozen=True)
class Placement:
    col_dim: int | None = None
    row_dim: int | None = None
    flat_dim: int | None = None

    @property
    def replicated(self) -> bool:
        return self.col_dim is None and self.row_dim is None and self.flat_dim is None


REPLICATED = Placement()
COLUMN_PARALLEL = Placement(col_dim=-1, row_dim=-2)
ROW_PARALLEL = Placement(col_dim=-2, row_dim=-1)
EXPERT_PARALLEL = Placement(flat_dim=0)


def parse_mesh_shape(value: str | Sequence[int]) -> MeshShape:
    """``"T3K"``, ``"1x8"``, ``"1,8"`` or ``(1, 8)`` as a ``(rows, cols)`` tuple."""
    if isinstance(value, str):
        if value.upper() in KNOWN_MESHES:
            return KNOWN_MESHES[value.upper()]
        value = value.lower().replace("x", ",").strip("()[] ").split(",")
    dims = tuple(int(d) for d in value)
    if len(dims) != 2 or min(dims) < 1:
        raise ValueError(f"mesh shape {value!r} is not (rows, cols) of positive ints")
    return dims  # type: ignore[return-value]


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


def shard_shape(shape: Sequence[int], placement: Placement, mesh: MeshShape) -> tuple[int, tuple[int, ...]]:
    """(number of device tensors, shape of each) that :func:`shard` makes of a ``shape``:
    arithmetic only, for checking a cached tensor against a placeholder."""
    rows, cols = mesh
    out = list(shape)
    if placement.replicated:
        return 1, tuple(out)
    splits = [(placement.flat_dim, rows * cols)] if placement.flat_dim is not None else [
        (placement.row_dim, rows), (placement.col_dim, cols)]
    for dim, parts in splits:
        if dim is None:
            continue
        if out[dim] % parts:
            raise ValueError(f"cannot split dim {dim} of size {out[dim]} over {parts} devices")
        out[dim] //= parts
    return rows * cols, tuple(out)


def column_blocks(shards: Sequence[torch.Tensor], placement: Placement, mesh: MeshShape) -> list[torch.Tensor]:
    """What each mesh column holds of a weight, its row shards joined: the tensor-parallel view."""
    rows, cols = mesh
    if placement.replicated:
        return [shards[0]] * cols
    if placement.flat_dim is not None:
        return [torch.cat(list(shards), dim=placement.flat_dim)] * cols
    blocks = []
    for c in range(cols):
        column = [shards[r * cols + c] for r in range(rows)]
        blocks.append(torch.cat(column, dim=placement.row_dim) if placement.row_dim is not None else column[0])
    return blocks


def unshard(shards: Sequence[torch.Tensor], placement: Placement, mesh: MeshShape) -> torch.Tensor:
    """The full tensor back from its shards (inverse of :func:`shard`)."""
    blocks = column_blocks(shards, placement, mesh)
    if placement.replicated or placement.flat_dim is not None or placement.col_dim is None:
        return blocks[0]
    return torch.cat(blocks, dim=placement.col_dim)
