# SPDX-License-Identifier: Apache-2.0
"""A paged KV cache on the host, addressed the way vLLM addresses the device's.

vLLM hands the model runner a block table per sequence (``page_table`` rows); token ``p`` of a
sequence lives in block ``page_table[p // block_size]`` at offset ``p % block_size``. Each layer
keeps, per mesh column, the keys and values of the KV heads that column holds, shaped
``[num_blocks, heads, block_size, head_dim]`` like tt-metal's paged cache on each device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

# One layer's cache: (keys, values) per mesh column; None for a layer that reads another's.
LayerKV = list[tuple[torch.Tensor, torch.Tensor]]


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
        return cls(torch.cat(tokens), positions_flat, tuple(sequences), torch.cat(blocks), positions_flat % block_size)

    @property
    def last_rows(self) -> torch.Tensor:
        """The row of each sequence's last new token (the one whose logits sample the next)."""
        return torch.tensor([seq.rows.stop - 1 for seq in self.sequences])


def position_mask(query_positions: torch.Tensor, context_len: int, window: int | None) -> torch.Tensor:
    """``[queries, context_len]`` bool: causal, and within ``window`` tokens when one is given."""
    keys = torch.arange(context_len)
    mask = keys[None, :] <= query_positions[:, None]
    if window:
        mask &= (query_positions[:, None] - keys[None, :]) < window
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
        cache_k, cache_v = self._pages(layer, column)
        cache_k[batch.blocks, :, batch.offsets] = keys.to(cache_k.dtype)
        cache_v[batch.blocks, :, batch.offsets] = values.to(cache_v.dtype)

    def read(self, layer: int, column: int, sequence: SequenceRows) -> tuple[torch.Tensor, torch.Tensor]:
        """A sequence's cached ``[context_len, heads, head_dim]`` keys and values."""
        return tuple(self._gather(pages, sequence) for pages in self._pages(layer, column))  # type: ignore[return-value]

    def _pages(self, layer: int, column: int) -> tuple[torch.Tensor, torch.Tensor]:
        columns = self.layers[layer]
        if columns is None:
            raise ValueError(f"layer {layer} keeps no KV cache of its own")
        return columns[column]

    def _gather(self, pages: torch.Tensor, sequence: SequenceRows) -> torch.Tensor:
        picked = pages[sequence.block_table]  # [blocks, heads, block_size, head_dim]
        flat = picked.permute(0, 2, 1, 3).reshape(-1, pages.shape[1], pages.shape[3])
        return flat[: sequence.context_len]
