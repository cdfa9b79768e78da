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
contiguous, so sharding stays a plain chunk. This module is the rules, without torch (tools that
only look at caches parse mesh names too); :mod:`models.common.sharding` applies them to tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MeshShape = tuple[int, int]
KNOWN_MESHES: dict[str, MeshShape] = {"N150": (1, 1), "N300": (1, 2), "T3K": (1, 8), "TG": (8, 4)}
# tt-metal's other ``MESH_DEVICE`` names for the same shapes (Blackhole boards, Galaxy spellings)
MESH_ALIASES: dict[str, MeshShape] = {
    "P150": (1, 1), "P300": (1, 2), "N150X4": (1, 4), "P150X4": (1, 4), "P150X8": (1, 8),
    "BH-GALAXY": (8, 4), "BH_GALAXY": (8, 4), "GALAXY": (8, 4),
}


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


MESH_SPELLINGS = ", ".join(KNOWN_MESHES) + " or RxC"  # what a command line says it takes


class MeshError(ValueError):
    """A mesh that is neither a known name nor ``rows x cols`` of positive ints."""


def parse_mesh_shape(value: str | Sequence[int]) -> MeshShape:
    """``"T3K"``, ``"1x8"``, ``"1,8"`` or ``(1, 8)`` as a ``(rows, cols)`` tuple; anything else is a
    :class:`MeshError` that says what is known (the one place a mesh name is read)."""
    given = value
    try:
        if isinstance(value, str):
            name = value.strip().upper()
            if name in KNOWN_MESHES or name in MESH_ALIASES:
                return KNOWN_MESHES.get(name) or MESH_ALIASES[name]
            value = value.lower().replace("x", ",").strip("()[] ").split(",")
        dims = tuple(int(d) for d in value)
    except (TypeError, ValueError):
        dims = ()
    if len(dims) != 2 or min(dims) < 1:
        raise MeshError(f"unknown mesh {given!r}: expected {MESH_SPELLINGS} (rows x columns of devices, e.g. 1x8)")
    return dims  # type: ignore[return-value]


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
