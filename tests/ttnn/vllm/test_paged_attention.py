# SPDX-License-Identifier: Apache-2.0
"""The host forward's batched paged attention against a plain per-sequence, per-query reference.

Random keys and values in shuffled pages, sequences of mixed context lengths with several new
tokens each (chunked prefill) or one (decode), sliding windows, grouped and ungrouped query-to-KV
heads, a KV-shared read and a batch split into attention groups. Every page a sequence does not
own is NaN, so a gather through the wrong block, or a padded position that reads an unwritten
page, poisons the output; a mask off by one position changes it. Needs no vLLM."""

from __future__ import annotations

import pytest
import torch

from models.vllm_plugin import paged_kv
from models.vllm_plugin.host_decoder import PagedAttention
from models.vllm_plugin.paged_kv import PagedBatch, PagedKVCache

BLOCK = 4
KV_HEADS, HEAD_DIM = 2, 8
SCALE = HEAD_DIM**-0.5


def reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor,
              local: list[int], window: int | None) -> torch.Tensor:
    """One query at a time: softmax over exactly the keys it may see (``keys``: the sequence's
    whole ``[context, kv_heads, d]``)."""
    out = []
    for row, position in enumerate(positions.tolist()):
        first = 0 if window is None else max(0, position - window + 1)
        heads = []
        for head, kv in enumerate(local):
            k, v = keys[first: position + 1, kv], values[first: position + 1, kv]
            heads.append(torch.softmax(k @ q[row, head] * SCALE, -1) @ v)
        out.append(torch.cat(heads))
    return torch.stack(out)


def run(chunks: list[tuple[int, int]], local: list[int], window: int | None) -> tuple[PagedBatch, torch.Tensor, torch.Tensor]:
    """``chunks``: (cached tokens, new tokens) per sequence. Returns the batch, the batched output
    and the reference's."""
    gen = torch.Generator().manual_seed(len(chunks) * 100 + len(local) + (window or 0))
    needed = [-(-(cached + new) // BLOCK) for cached, new in chunks]
    shuffled = (torch.randperm(sum(needed) + 3, generator=gen) + 1).tolist()  # block 0 stays unused
    tables = [torch.tensor(shuffled[sum(needed[:i]): sum(needed[: i + 1])]) for i in range(len(chunks))]
    cache = PagedKVCache.allocate([[(KV_HEADS, HEAD_DIM)]], len(shuffled) + 1, BLOCK)
    for pages in cache.layers[0][0]:
        pages.fill_(float("nan"))
    keys = [torch.randn(c + n, KV_HEADS, HEAD_DIM, generator=gen) for c, n in chunks]
    values = [torch.randn(c + n, KV_HEADS, HEAD_DIM, generator=gen) for c, n in chunks]
    for (cached, _), table, k, v in zip(chunks, tables, keys, values):  # the context of earlier steps
        for p in range(cached):
            cache.layers[0][0][0][table[p // BLOCK], :, p % BLOCK] = k[p]
            cache.layers[0][0][1][table[p // BLOCK], :, p % BLOCK] = v[p]
    batch = PagedBatch.build([([7] * n, c, t) for (c, n), t in zip(chunks, tables)], BLOCK)
    q = torch.randn(len(batch.tokens), len(local), HEAD_DIM, generator=gen)
    new_k = torch.cat([k[c:] for (c, _), k in zip(chunks, keys)])
    new_v = torch.cat([v[c:] for (c, _), v in zip(chunks, values)])
    attention = PagedAttention()
    attention.batch, attention.cache = batch, cache
    out = attention.attend_column(q, new_k, new_v, 0, 0, local, window, SCALE)
    shared = attention.attend_column(q, None, None, 0, 0, local, window, SCALE)  # a KV-shared layer's read
    torch.testing.assert_close(shared, out, rtol=0, atol=0)
    expected = torch.cat([reference(q[seq.rows], k, v, batch.positions[seq.rows], local, window)
                          for seq, k, v in zip(batch.sequences, keys, values)])
    return batch, out, expected


DECODE = [(0, 1), (6, 1), (15, 1), (16, 1), (33, 1), (50, 1)]
PREFILL = [(0, 1), (9, 5), (20, 12), (3, 3), (0, 9), (16, 4)]
GROUPED = [0, 0, 0, 1, 1, 1]  # 6 query heads over 2 KV heads, as column_heads lays them out
UNGROUPED = [1, 0, 1, 1, 0, 0]


@pytest.mark.parametrize("window", [None, 5, 1], ids=["causal", "window5", "window1"])
@pytest.mark.parametrize("local", [GROUPED, UNGROUPED], ids=["grouped", "ungrouped"])
@pytest.mark.parametrize("chunks", [DECODE, PREFILL], ids=["decode", "prefill"])
def test_batched_attention_equals_per_sequence_reference(chunks, local, window):
    batch, out, expected = run(chunks, local, window)
    assert len(batch.groups) == 1
    assert not out.isnan().any()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_a_batch_split_into_attention_groups_gives_the_same_rows(monkeypatch):
    """A long prefill among short ones and decodes: padding all to the longest would cost too
    much, so the batch is attended in groups; every row still lands where it belongs."""
    monkeypatch.setattr(paged_kv, "PADDING_FLOOR", 0)
    chunks = [(0, 2), (30, 40), (5, 1), (60, 1), (0, 3), (12, 8)]
    batch, out, expected = run(chunks, GROUPED, None)
    groups = batch.groups
    assert len(groups) > 1
    assert sorted(torch.cat([g.rows for g in groups]).tolist()) == list(range(len(batch.tokens)))
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
