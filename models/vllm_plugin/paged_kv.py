# SPDX-License-Identifier: Apache-2.0
"""A paged KV cache on the host, addressed the way vLLM addresses the device's.

vLLM hands the model runner a block table per sequence (``page_table`` rows); token ``p`` of a
sequence lives in block ``page_table[p // block_size]`` at offset ``p % block_size``. Each layer
keeps, per mesh column, the keys and values of the KV heads that column holds, shaped
``[num_blocks, heads, block_size, head_dim]`` like tt-metal's paged cache on each device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import torch
from torch.nn.utils.rnn import pad_sequence

# One layer's cache: (keys, values) per mesh column; None for a layer that reads another's.
LayerKV = list[tuple[torch.Tensor, torch.Tensor]]
# Padded score elements (per head) below which a batch is never split into attention groups.
PADDING_FLOOR = 1 << 20


@dataclass(frozen=True)
class SequenceRows:
    """One sequence of a ragged batch: its rows in the flat batch and its cache pages."""

    rows: slice
    block_table: torch.Tensor  # long [blocks]
    context_len: int  # tokens cached once this step is written (last position + 1)


@dataclass(frozen=True)
class PagedBatch:
    """The new tokens of several sequences, flattened: one forward serves prefills and decodes."""

    tokens: torch.Tensor  # long [N]
    positions: torch.Tensor  # long [N]
    sequences: tuple[SequenceRows, ...]
    blocks: torch.Tensor  # long [N]: the block each new token's K/V is written to
    offsets: torch.Tensor  # long [N]: its offset in that block
    block_size: int
    memo: dict[int, torch.Tensor] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def build(cls, chunks: Sequence[tuple[Sequence[int], int, torch.Tensor]], block_size: int) -> PagedBatch:
        """``chunks``: (new tokens, position of the first, block table) of each sequence."""
        tokens, positions, sequences, blocks = [], [], [], []
        start = 0
        for new_tokens, first, table in chunks:
            count = len(new_tokens)
            if count == 0:
                raise ValueError("a sequence in the batch has no new tokens")
            table = torch.as_tensor(table, dtype=torch.long).reshape(-1)
            pos = torch.arange(first, first + count)
            needed = (first + count + block_size - 1) // block_size
            if needed > len(table):
                raise ValueError(f"positions up to {first + count - 1} need {needed} blocks; the page table has {len(table)}")
            tokens.append(torch.as_tensor(list(new_tokens), dtype=torch.long))
            positions.append(pos)
            blocks.append(table[pos // block_size])
            sequences.append(SequenceRows(slice(start, start + count), table[:needed], first + count))
            start += count
        positions_flat = torch.cat(positions)
        return cls(torch.cat(tokens), positions_flat, tuple(sequences), torch.cat(blocks), positions_flat % block_size,
                   block_size)

    @property
    def last_rows(self) -> torch.Tensor:
        """The row of each sequence's last new token (the one whose logits sample the next)."""
        return torch.tensor([seq.rows.stop - 1 for seq in self.sequences])

    def write_rows(self, heads: int) -> torch.Tensor:
        """``[N * heads]``: the page rows the new tokens' ``[N, heads, head_dim]`` keys go to."""
        if heads not in self.memo:
            self.memo[heads] = page_rows(self.blocks[:, None], self.offsets[:, None], heads, self.block_size).reshape(-1)
        return self.memo[heads]

    @cached_property
    def groups(self) -> tuple[AttentionGroup, ...]:
        """The sequences attended together, each group in one call (every layer reuses them).
        One group unless padding every sequence to the longest would cost more than twice the
        ragged scores (a long prompt among short ones): then groups of similar cost, costliest first."""
        seqs = list(self.sequences)
        if _padded_cost(seqs) <= max(2 * _ragged_cost(seqs), PADDING_FLOOR):
            return (AttentionGroup.build(seqs, self.positions, self.block_size, whole=True),)
        groups: list[list[SequenceRows]] = []
        for seq in sorted(seqs, key=lambda s: -_ragged_cost([s])):
            grown = groups[-1] + [seq] if groups else [seq]
            if groups and _padded_cost(grown) <= max(2 * _ragged_cost(grown), PADDING_FLOOR):
                groups[-1] = grown
            else:
                groups.append([seq])
        return tuple(AttentionGroup.build(g, self.positions, self.block_size) for g in groups)


def _count(seq: SequenceRows) -> int:
    return seq.rows.stop - seq.rows.start


def _ragged_cost(seqs: Sequence[SequenceRows]) -> int:
    return sum(_count(s) * s.context_len for s in seqs)


def _padded_cost(seqs: Sequence[SequenceRows]) -> int:
    return len(seqs) * max(_count(s) for s in seqs) * max(s.context_len for s in seqs)


@dataclass(frozen=True)
class AttentionGroup:
    """Sequences attended in one call: their new tokens' queries padded to ``[B, T]`` and their
    cached context gathered to ``[B, L]`` (``L``: the longest context), addressed through the
    block tables. Padding never reads a page that was not written (uninitialized memory may hold
    NaN, which a zero attention weight would not cancel): a padded key slot repeats its
    sequence's last cached position, and the causal mask hides it; a padded query sits at
    position 0 (it attends to key 0 and is dropped)."""

    rows: torch.Tensor  # long [n]: the group's rows of the flat batch
    slots: torch.Tensor  # long [n]: each row's place in the padded [B * T] queries
    query_positions: torch.Tensor  # long [B, T]
    key_blocks: torch.Tensor  # long [B, L]: the block of each context position
    key_offsets: torch.Tensor  # long [B, L]: its offset in that block
    whole: bool  # the batch's rows in order, unpadded (a decode step): pad and unpad are reshapes
    block_size: int
    memo: dict[tuple[str, int | None], torch.Tensor] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def build(cls, seqs: Sequence[SequenceRows], positions: torch.Tensor, block_size: int,
              whole: bool = False) -> AttentionGroup:
        counts = [_count(s) for s in seqs]
        context = torch.tensor([s.context_len for s in seqs])
        width = max(counts)
        rows = torch.cat([torch.arange(s.rows.start, s.rows.stop) for s in seqs])
        slots = torch.cat([torch.arange(i * width, i * width + c) for i, c in enumerate(counts)])
        query_positions = torch.zeros(len(seqs) * width, dtype=torch.long)
        query_positions[slots] = positions[rows]
        keys = torch.arange(int(context.max())).expand(len(seqs), -1).minimum(context[:, None] - 1)
        tables = pad_sequence([s.block_table for s in seqs], batch_first=True)
        return cls(rows, slots, query_positions.reshape(len(seqs), width), tables.gather(1, keys // block_size),
                   keys % block_size, whole and width == 1, block_size)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """``[N, ...]`` rows of the flat batch -> ``[B, T, ...]``."""
        batch, width = self.query_positions.shape
        if self.whole:
            return x.reshape(batch, width, *x.shape[1:])
        padded = x.new_zeros(batch * width, *x.shape[1:])
        padded[self.slots] = x[self.rows]
        return padded.reshape(batch, width, *x.shape[1:])

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, T, ...]`` -> the ``[n, ...]`` rows of :attr:`rows`, in their order."""
        flat = x.reshape(-1, *x.shape[2:])
        return flat if self.whole else flat[self.slots]

    def mask(self, window: int | None) -> torch.Tensor:
        """``[B, T, L]``: causal by position (which also hides the padded keys), within ``window``."""
        if ("mask", window) not in self.memo:
            self.memo["mask", window] = position_mask(self.query_positions, self.key_blocks.shape[1], window)
        return self.memo["mask", window]

    def key_rows(self, heads: int) -> torch.Tensor:
        """``[B * heads * L]``: the page rows of the context, heads first (the layout attention multiplies in)."""
        if ("rows", heads) not in self.memo:
            self.memo["rows", heads] = page_rows(self.key_blocks, self.key_offsets, heads, self.block_size).reshape(-1)
        return self.memo["rows", heads]


def page_rows(blocks: torch.Tensor, offsets: torch.Tensor, heads: int, block_size: int) -> torch.Tensor:
    """``[..., heads, n]`` rows of a ``[num_blocks, heads, block_size, head_dim]`` cache viewed as
    ``[rows, head_dim]``, for positions at ``blocks`` / ``offsets`` ``[..., n]``: one
    ``index_select`` then reads or one ``index_copy_`` writes them all (several times faster than
    indexing the block and offset dimensions around the heads)."""
    head_rows = torch.arange(heads)[:, None] * block_size
    return (blocks * heads * block_size + offsets)[..., None, :] + head_rows


def position_mask(query_positions: torch.Tensor, context_len: int, window: int | None) -> torch.Tensor:
    """``[..., queries, context_len]`` bool: causal, and within ``window`` tokens when one is given."""
    keys = torch.arange(context_len)
    mask = keys <= query_positions[..., None]
    if window:
        mask &= (query_positions[..., None] - keys) < window
    return mask


class PagedKVCache:
    """Every layer's paged keys and values, per mesh column, in fp32 (the host forward's dtype)."""

    def __init__(self, layers: list[LayerKV | None], block_size: int) -> None:
        self.layers = layers
        self.block_size = block_size

    @classmethod
    def allocate(cls, layout: Sequence[Sequence[tuple[int, int]] | None], num_blocks: int, block_size: int,
                 dtype: torch.dtype = torch.float32) -> PagedKVCache:
        """``layout``: per layer, (heads, head_dim) of each mesh column, or None (shared K/V)."""
        def pages(heads: int, head_dim: int) -> torch.Tensor:
            # Uninitialized: a position is always written before it is read (reads stop at the
            # context length), and untouched pages then cost no host memory.
            return torch.empty(num_blocks, heads, block_size, head_dim, dtype=dtype)

        layers = [None if columns is None else [(pages(h, d), pages(h, d)) for h, d in columns] for columns in layout]
        return cls(layers, block_size)

    @property
    def num_blocks(self) -> int:
        first = next(layer for layer in self.layers if layer is not None)
        return first[0][0].shape[0]

    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for layer in self.layers if layer for k, v in layer)

    def write(self, layer: int, column: int, keys: torch.Tensor, values: torch.Tensor, batch: PagedBatch) -> None:
        """Store the ``[N, heads, head_dim]`` keys and values of the batch's new tokens."""
        for pages, new in zip(self._pages(layer, column), (keys, values)):
            rows = pages.view(-1, pages.shape[-1])
            rows.index_copy_(0, batch.write_rows(pages.shape[1]), new.reshape(-1, new.shape[-1]).to(rows.dtype))

    def gather(self, layer: int, column: int, group: AttentionGroup) -> tuple[torch.Tensor, torch.Tensor]:
        """The group's cached ``[B, L, heads, head_dim]`` keys and values, one ``index_select``
        each (views of ``[B, heads, L, head_dim]`` memory, the layout :func:`attend` multiplies)."""
        batch, length = group.key_blocks.shape
        out = []
        for pages in self._pages(layer, column):
            heads, dim = pages.shape[1], pages.shape[3]
            rows = pages.view(-1, dim).index_select(0, group.key_rows(heads))
            out.append(rows.view(batch, heads, length, dim).transpose(1, 2))
        return out[0], out[1]

    def _pages(self, layer: int, column: int) -> tuple[torch.Tensor, torch.Tensor]:
        columns = self.layers[layer]
        if columns is None:
            raise ValueError(f"layer {layer} keeps no KV cache of its own")
        return columns[column]
