# SPDX-License-Identifier: Apache-2.0
"""Batched host forward with a paged KV cache, from the cached ttnn tensors.

The project's reference forward (:mod:`models.common.reference`, :mod:`models.gemma.gemma4_reference`)
recomputes a whole prompt each call. Serving needs more: several sequences in one forward,
positions that continue where the cache left off, and keys and values kept in vLLM's pages. The
decoders here reuse the reference forward for everything but attention (weights read back from
their ttnn tensors per mesh column, norms, MLP, MoE, Gemma's per-layer inputs) and replace
attention with a paged one: each column writes its KV heads' new keys and values into the
cache, then attends the queries of every sequence of the batch in one call, each over its own
context gathered from the pages through its block table (no Python loop per sequence).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from functools import cached_property

import torch

from models.common.heads import column_heads
from models.common.loader import LoadedModel
from models.common.reference import (
    CachedWeights,
    ReferenceDecoder,
    apply_rope,
    attend,
    rms_norm,
    rope_kind,
    rope_rotate,
    rope_tables,
)
from models.common.sharding import column_blocks
from models.gemma.gemma4_reference import Gemma4Reference, SharedKV
from models.vllm_plugin.paged_kv import PagedBatch, PagedKVCache
from models.vllm_plugin.readback import read_back, read_threads

# Per layer: (heads, head_dim) of each mesh column's KV cache, or None when the layer reads another's.
KVLayout = list[list[tuple[int, int]] | None]


class HostTable:
    """A host-consumed embedding table read row by row: only the looked-up rows become fp32
    (converting a 262k-row table on every step would cost more than the forward)."""

    def __init__(self, table: torch.Tensor) -> None:
        self.table = table

    def __getitem__(self, rows: torch.Tensor) -> torch.Tensor:
        return self.table[rows].float()


class ServingWeights(CachedWeights):
    """:class:`CachedWeights` whose host tables are looked up, not converted whole."""

    def full(self, name: str) -> torch.Tensor:
        if name not in self.loaded.weights and f"{name}.weight" in self.loaded.host_weights:
            return HostTable(self.loaded.host_weights[f"{name}.weight"])  # type: ignore[return-value]
        return super().full(name)

    def materialize(self) -> int:
        """Read every device weight back to fp32 now (instead of on first use), every weight's
        blocks spread over one thread a core (:mod:`models.vllm_plugin.readback`); returns its bytes."""
        loaded = self.loaded
        with ThreadPoolExecutor(read_threads(), thread_name_prefix="tt-read-back") as pool:
            pending = {name: read_back(t, pool) for name, t in loaded.weights.items() if name not in self._columns}
            for name, readings in pending.items():
                shards = [reading.result() for reading in readings]
                self._columns[name] = column_blocks(shards, loaded.formats[name].placement, loaded.mesh_shape)
        return sum(t.nbytes for name in loaded.weights for t in self.columns(name))


class PagedAttention:
    """The paged half of attention, shared by the decoders below: write, then attend every
    sequence of the batch at once over its context gathered from the pages."""

    w: ServingWeights
    batch: PagedBatch
    cache: PagedKVCache
    _rope_cache: dict[object, tuple[torch.Tensor, torch.Tensor]]  # this forward's RoPE tables, by rotary kind

    def attend_column(self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, cache_layer: int,
                      column: int, local: list[int], window: int | None, scale: float) -> torch.Tensor:
        """``[N, heads * head_dim]`` attention output of one column's query heads (``local``: the
        column-local KV head of each query head). ``k``/``v`` None: read only (a KV-shared layer).
        One :func:`attend` per attention group of the batch (one group for a decode step)."""
        if k is not None:
            self.cache.write(cache_layer, column, k, v, self.batch)
        out = None
        for group in self.batch.groups:
            keys, values = self.cache.gather(cache_layer, column, group)
            if not grouped_heads(local, keys.shape[2]):  # attend pairs consecutive query heads with a KV head
                keys, values = keys[:, :, local], values[:, :, local]
            part = group.unpad(attend(group.pad(q), keys, values, group.mask(window), scale))
            if group.whole:
                return part
            if out is None:
                out = q.new_empty(q.shape[0], part.shape[1])
            out[group.rows] = part
        return out

    def run(self, batch: PagedBatch, cache: PagedKVCache, rows: torch.Tensor | None = None) -> torch.Tensor:
        """``[sequences, vocab]`` logits of each sequence's last new token, or of the flat batch
        ``rows`` asked for (prompt logprobs need every row of a sequence); the cache is updated."""
        self.batch, self.cache, self._rope_cache = batch, cache, {}
        hidden = self.hidden_states(batch.tokens)  # type: ignore[attr-defined]
        return self.head(hidden[batch.last_rows if rows is None else rows])

    def rope(self, x: torch.Tensor, kind: object, inv_freq: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        """RoPE at the batch's positions; the cos/sin tables of each rotary ``kind`` are computed
        once per forward, not once per layer."""
        if kind not in self._rope_cache:
            self._rope_cache[kind] = rope_tables(self.batch.positions, inv_freq, scale)
        return rope_rotate(x, *self._rope_cache[kind])

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Final norm, LM head (column shards concatenated) and logit soft-capping."""
        args, text = self.args, self.text_config  # type: ignore[attr-defined]
        x = rms_norm(x, self.w.vector("norm"), args.norm_eps)
        logits = torch.cat([x @ head for head in self.w.columns("output")], dim=-1)
        cap = text.get("final_logit_softcapping")
        return torch.tanh(logits / cap) * cap if cap else logits


class PagedDecoder(PagedAttention, ReferenceDecoder):
    """Llama / Qwen3 / Qwen3-MoE / Gemma 3 with a paged KV cache."""

    def __init__(self, loaded: LoadedModel) -> None:
        super().__init__(loaded)
        self.w = ServingWeights(loaded)

    def kv_layout(self) -> KVLayout:
        a = self.args
        columns = [(len(c.kv), a.head_dim) for c in column_heads(a.n_heads, a.n_kv_heads, self.cols)]
        return [list(columns) for _ in range(a.n_layers)]

    def attention(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        a, p = self.args, f"layers.{layer}.attention."
        sliding = a.layer_type(layer) == "sliding_attention"
        rows = x.shape[0]
        scale = (self.text_config.get("query_pre_attn_scalar") or a.head_dim) ** -0.5
        window = a.sliding_window if sliding else None
        columns = column_heads(a.n_heads, a.n_kv_heads, self.cols)
        out = torch.zeros_like(x)
        for c, (column, wqkv, wo) in enumerate(zip(columns, self.w.columns(p + "wqkv"), self.w.columns(p + "wo"))):
            width = len(column.kv) * a.head_dim
            qkv = x @ wqkv
            if self.w.has(p + "bqkv"):  # this column's heads' bias (Qwen2)
                qkv = qkv + self.w.columns(p + "bqkv")[c].reshape(-1)
            q, k, v = (t.reshape(rows, -1, a.head_dim) for t in qkv.split([len(column.q) * a.head_dim, width, width], -1))
            if self.w.has(p + "q_norm"):
                q = rms_norm(q, self.w.vector(p + "q_norm"), a.norm_eps)
                k = rms_norm(k, self.w.vector(p + "k_norm"), a.norm_eps)
            q, k = (self.rotate(t, sliding) for t in (q, k))
            out += self.attend_column(q, k, v, layer, c, list(column.q_to_kv), window, scale) @ wo
        return out

    def rotate(self, x: torch.Tensor, sliding: bool) -> torch.Tensor:
        """RoPE at each new token's position. LongRoPE picks its short or long factors per
        sequence by how far that sequence reaches in this step, as transformers picks them by
        the furthest position of the sequence it runs (so batching never changes a request's
        tokens; keys cached earlier keep the factors they were computed with, as in transformers)."""
        positions = self.batch.positions
        if rope_kind(self._rope_params("sliding_attention" if sliding else "full_attention")) != "longrope":
            return self.rope(x, sliding, *self._rotary(sliding, 0))
        out = torch.empty_like(x)
        for seq in self.batch.sequences:
            inv_freq, rope_scale = self._rotary(sliding, seq.context_len)
            out[seq.rows] = apply_rope(x[seq.rows], positions[seq.rows], inv_freq, rope_scale)
        return out


class PagedGemma4Decoder(PagedAttention, Gemma4Reference):
    """Gemma 4 text with a paged KV cache; a KV-shared layer reads its producer layer's pages."""

    def __init__(self, loaded: LoadedModel) -> None:
        super().__init__(loaded)
        self.w = ServingWeights(loaded)

    @cached_property
    def kv_source(self) -> list[int]:
        """The layer whose cache each layer reads: itself, or for a KV-shared layer the last
        unshared layer of its type (as the reference forward threads it)."""
        last: dict[str, int] = {}
        source = []
        for i, shape in enumerate(self.layers):
            if not shape.kv_shared:
                last[shape.layer_type] = i
            source.append(last[shape.layer_type] if shape.kv_shared else i)
        return source

    def kv_layout(self) -> KVLayout:
        return [None if shape.kv_shared else
                [(len(c.kv), shape.head_dim) for c in column_heads(self.args.n_heads, shape.n_kv_heads, self.cols)]
                for shape in self.layers]

    def attention(self, x: torch.Tensor, layer: int, shared: SharedKV | None = None) -> torch.Tensor:
        a, shape, p = self.args, self.layers[layer], f"layers.{layer}.attention."
        hd, rows = shape.head_dim, x.shape[0]
        inv_freq, layer_kind = self._inv_freq(shape.layer_type, hd), (shape.layer_type, hd)
        window = self.text_config.get("sliding_window") if shape.sliding else None
        columns = column_heads(a.n_heads, shape.n_kv_heads, self.cols)
        out = torch.zeros_like(x)
        for c, (column, w, wo) in enumerate(zip(columns, self.w.columns(p + shape.fused_name), self.w.columns(p + "wo"))):
            q, *kv = (x @ w).split([len(column.q) * hd] + [len(column.kv) * hd] * self._kv_parts(shape), -1)
            q = self.rope(rms_norm(q.reshape(rows, -1, hd), self.w.vector(p + "q_norm"), a.norm_eps), layer_kind, inv_freq)
            k = v = None
            if not shape.kv_shared:
                k, v = (t.reshape(rows, -1, hd) for t in (kv[0], kv[-1]))  # k_eq_v: one part, both
                k = self.rope(rms_norm(k, self.w.vector(p + "k_norm"), a.norm_eps), layer_kind, inv_freq)
                v = rms_norm(v, 1.0, a.norm_eps)
            out += self.attend_column(q, k, v, self.kv_source[layer], c, list(column.q_to_kv), window, 1.0) @ wo
        return out


def grouped_heads(local: list[int], kv_heads: int) -> bool:
    """Whether query head ``i`` uses KV head ``i // (heads / kv_heads)``, the grouping :func:`attend` assumes."""
    group = len(local) // kv_heads
    return group * kv_heads == len(local) and local == [i // group for i in range(len(local))]


def paged_decoder(loaded: LoadedModel) -> PagedDecoder | PagedGemma4Decoder:
    """The paged host decoder of a loaded model's family."""
    if loaded.args.model_type.startswith("gemma4"):
        return PagedGemma4Decoder(loaded)
    return PagedDecoder(loaded)
