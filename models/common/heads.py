# SPDX-License-Identifier: Apache-2.0
"""Which attention heads each mesh column computes, and whether a model can be laid over a mesh.

Torch-free arithmetic on a model's config (:class:`~models.common.model_args.ModelArgs`): the
loaders (:mod:`models.common.decoder`) and the host forwards build from it, and the command
lines and the seeding plan ask :func:`layout_problem` before any work, so a model that cannot be
built on a mesh is refused in one line instead of failing seconds into its conversion."""

from __future__ import annotations

from dataclasses import dataclass

from models.common.mesh import MeshShape
from models.common.model_args import ModelArgs


def kv_heads_per_column(n_kv_heads: int, cols: int) -> list[list[int]]:
    """Which KV heads each mesh column holds when they spread evenly: a block when they divide,
    else one head replicated over ``cols / n_kv_heads`` columns (fewer KV heads than devices)."""
    if n_kv_heads % cols == 0:
        per = n_kv_heads // cols
        return [list(range(c * per, (c + 1) * per)) for c in range(cols)]
    if cols % n_kv_heads == 0:
        return [[c * n_kv_heads // cols] for c in range(cols)]
    raise ValueError(f"{n_kv_heads} KV heads cannot be spread over {cols} mesh columns")


@dataclass(frozen=True)
class ColumnHeads:
    """The attention heads one mesh column computes, in the order of its block of ``wqkv`` (and of
    its rows of ``wo``). ``None`` is a padding head: zero weights, zero bias, zero ``wo`` rows, so
    it adds exactly nothing."""

    q: tuple[int | None, ...]
    kv: tuple[int | None, ...]
    q_to_kv: tuple[int, ...]  # for each query slot, the index in ``kv`` of the head it attends with

    @property
    def padded(self) -> bool:
        return None in self.q or None in self.kv


def column_heads(n_heads: int, n_kv_heads: int, cols: int) -> list[ColumnHeads]:
    """How the heads are spread over ``cols`` mesh columns; every column holds as many query and
    KV slots as the others (equal shards), padding heads where the counts do not divide.

    * At least as many KV heads as columns: the KV heads in blocks, padded with zero heads to a
      multiple of ``cols`` (SmolLM2-135M's 3 on an N300's 2), each with its whole group of query
      heads.
    * Fewer: the KV heads padded to the smallest divisor of ``cols`` they fit in, each replicated
      over the columns it owns, and its query heads split over those columns, the last ones
      padded (SmolLM2-135M on a T3K: 3 KV heads as 4 over pairs of columns, its 3 query heads a
      group as 2 + 1 and a padding head).

    When the heads divide evenly this is the plain layout: consecutive heads, no padding."""
    if n_heads % n_kv_heads:
        raise ValueError(f"{n_heads} attention heads are not a whole number of groups of {n_kv_heads} KV heads")
    group = n_heads // n_kv_heads
    if n_kv_heads >= cols:
        per_kv = -(-n_kv_heads // cols)
        columns = []
        for c in range(cols):
            kv = tuple(k if k < n_kv_heads else None for k in range(c * per_kv, (c + 1) * per_kv))
            q = tuple(None if k is None else k * group + g for k in kv for g in range(group))
            columns.append(ColumnHeads(q, kv, tuple(j for j in range(per_kv) for _ in range(group))))
        return columns
    kv_slots = next(d for d in range(n_kv_heads, cols + 1) if cols % d == 0)
    share = cols // kv_slots  # columns that hold one KV head
    per_q = -(-group // share)
    columns = []
    for c in range(cols):
        k, part = divmod(c, share)
        real = k < n_kv_heads
        q = tuple(k * group + j if real and j < group else None for j in range(part * per_q, (part + 1) * per_q))
        columns.append(ColumnHeads(q, (k if real else None,), (0,) * per_q))
    return columns


def layout_problem(args: ModelArgs, mesh: MeshShape) -> str | None:
    """Why ``args``'s model cannot be laid over ``mesh``, or None when it can.

    Heads always can (padded, :func:`column_heads`); what is split without padding must divide:
    the model dimension over the rows, the MLP's hidden units and the vocabulary (the LM head)
    over the columns."""
    rows, cols = mesh
    if args.n_kv_heads < 1 or args.n_heads % args.n_kv_heads:
        return f"{args.n_heads} attention heads are not a whole number of groups of {args.n_kv_heads} KV heads"
    splits = [("hidden size", args.dim, rows, "rows"), ("MLP hidden size", args.hidden_dim, cols, "columns"),
              ("vocabulary", args.vocab_size, cols, "columns")]
    for what, size, parts, axis in splits:
        if size and size % parts:
            return f"its {what} {size} cannot be split over {parts} mesh {axis}"
    return None
