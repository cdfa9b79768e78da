# SPDX-License-Identifier: Apache-2.0
"""A host (torch, fp32) forward pass that reads weights *as stored in the ttnn cache*.

It is the proof that a loader's layout is right and not merely reversible: every weight is read
back from its ttnn tensor (``ttnn.to_torch`` of each device shard) and used the way the
tensor-parallel device model uses it. Each mesh column computes attention for its own heads from
its block of the fused QKV and its rows of ``wo``, and its share of the MLP; the partial results
are summed across columns (the all-reduce), and the LM head's column shards are concatenated.
If a loader put a head in the wrong column or forgot a transpose, the logits would not match
transformers'. Family differences (Gemma's norms, scaling, activation, sliding windows) are read
from :class:`~models.common.model_args.ModelArgs` and its config.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cached_property

import torch
import torch.nn.functional as F

from models.common.heads import column_heads
from models.common.loader import LoadedModel
from models.common.sharding import column_blocks
from models.common.weight_cache.tensor_cache import host_shards


class CachedWeights:
    """Torch views of a loaded model's ttnn weights, per mesh column, in fp32.

    ``keep_fp32`` keeps every weight's fp32 columns after first use: fastest, and 4 bytes a
    parameter. Without it nothing is kept: each use reads the ttnn tensor back and widens it (for a
    few forwards of a model whose fp32 copy would not fit beside everything else: Qwen2.5-Coder
    1.5B's is 7 GB)."""

    def __init__(self, loaded: LoadedModel, keep_fp32: bool = True) -> None:
        self.loaded = loaded
        self.keep_fp32 = keep_fp32
        self._columns: dict[str, list[torch.Tensor]] = {}

    def columns(self, name: str) -> list[torch.Tensor]:
        if name in self._columns:
            return self._columns[name]
        shards = [s.float() for s in host_shards(self.loaded.weights[name])]
        columns = column_blocks(shards, self.loaded.formats[name].placement, self.loaded.mesh_shape)
        if self.keep_fp32:
            self._columns[name] = columns
        return columns

    def full(self, name: str) -> torch.Tensor:
        """A replicated (or expert-parallel, rejoined) weight; host-consumed weights come from the
        host state (``tok_embeddings`` -> ``tok_embeddings.weight``)."""
        if name not in self.loaded.weights and f"{name}.weight" in self.loaded.host_weights:
            return self.loaded.host_weights[f"{name}.weight"].float()
        return self.columns(name)[0]

    def rows(self, name: str, index: torch.Tensor) -> torch.Tensor:
        """``full(name)[index]``, gathering before the fp32 conversion for a host-kept table (the
        same values; Gemma's 262144-row embedding would otherwise be converted whole per call)."""
        if name not in self.loaded.weights and f"{name}.weight" in self.loaded.host_weights:
            return self.loaded.host_weights[f"{name}.weight"][index].float()
        return self.full(name)[index]

    def vector(self, name: str) -> torch.Tensor:
        """A norm weight stored as ``[1, 1, n/32, 32]``, flattened."""
        return self.full(name).reshape(-1)

    def has(self, name: str) -> bool:
        return name in self.loaded.weights


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope_kind(scaling: dict | None) -> str:
    """``rope_type`` of a RoPE config (``type`` in older configs), ``"default"`` when absent."""
    return (scaling or {}).get("rope_type") or (scaling or {}).get("type") or "default"


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None, seq_len: int | None = None) -> torch.Tensor:
    """Inverse frequencies of a RoPE kind; ``seq_len`` picks LongRoPE's short or long factors.
    With a ``partial_rotary_factor`` (default / LongRoPE kinds) only the first part of each head
    rotates: fewer frequencies than ``head_dim / 2`` (see :func:`apply_rope`)."""
    kind = rope_kind(scaling)
    if kind in ("default", "longrope"):
        head_dim = int(head_dim * (scaling or {}).get("partial_rotary_factor", 1.0))
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if kind == "llama3":
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old / high) & (wavelen <= old / low)
        inv_freq = torch.where(medium, smoothed, scaled)
    elif kind == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif kind == "proportional":  # gemma4's global layers: the first frequencies rotate, the rest do not
        rotated = int(scaling.get("partial_rotary_factor", 1.0) * head_dim // 2)
        inv_freq = torch.cat([inv_freq[:rotated], torch.zeros(head_dim // 2 - rotated, dtype=inv_freq.dtype)])
        inv_freq = inv_freq / scaling.get("factor", 1.0)
    elif kind == "longrope":  # Phi-3: per-frequency factors, long ones past the original context
        long = seq_len is not None and seq_len > scaling["original_max_position_embeddings"]
        factors = torch.tensor(scaling["long_factor" if long else "short_factor"], dtype=torch.float64)
        if factors.numel() != inv_freq.numel():
            raise ValueError(f"LongRoPE has {factors.numel()} factors for {inv_freq.numel()} rotary frequencies")
        inv_freq = inv_freq / factors
    elif kind != "default":
        raise NotImplementedError(f"rope_type {kind!r} is not in the reference forward")
    return inv_freq.float()


def rope_attention_scale(scaling: dict | None, max_position_embeddings: int) -> float:
    """The factor RoPE's cos and sin are multiplied by: LongRoPE's attention factor, else 1."""
    if rope_kind(scaling) != "longrope":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    original = scaling["original_max_position_embeddings"]
    factor = scaling.get("factor") or max_position_embeddings / original
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))


def apply_rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Rotate-half RoPE (the HF checkpoint convention) on ``[T, heads, head_dim]``, cos and sin
    times ``scale`` (LongRoPE); channels past ``2 * len(inv_freq)`` (partial rotary) pass through
    unrotated and unscaled."""
    return rope_rotate(x, *rope_tables(positions, inv_freq, scale))


def rope_tables(positions: torch.Tensor, inv_freq: torch.Tensor, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``[T, 1, 2 * len(inv_freq)]`` cos and sin of :func:`apply_rope` (computed once per forward
    and reused by every layer of the same rotary kind)."""
    angles = positions[:, None].float() * inv_freq[None, :]
    cos, sin = (torch.cat([wave(angles) * scale] * 2, -1)[:, None, :] for wave in (torch.cos, torch.sin))
    return cos, sin


def rope_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """:func:`apply_rope` with its tables already computed."""
    rotary = cos.shape[-1]
    if rotary < x.shape[-1]:
        return torch.cat([rope_rotate(x[..., :rotary], cos, sin), x[..., rotary:]], dim=-1)
    half = rotary // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def causal_mask(length: int, window: int | None = None) -> torch.Tensor:
    """``[T, T]`` bool, True where a query may attend a key (causal; within ``window`` if given)."""
    mask = torch.ones(length, length, dtype=torch.bool).tril()
    if window:
        mask &= ~torch.ones_like(mask).tril(-window)
    return mask


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """Softmax attention of ``[..., T, heads, d]`` queries over ``[..., K, kv_heads, d]`` keys and
    values; returns ``[..., T, heads * d]``. Each consecutive group of ``heads / kv_heads`` query
    heads attends with one KV head (GQA, without copying the KV heads per query head). ``mask``
    ``[..., T, K]``: True where a query may attend a key. Leading dimensions are a batch of
    sequences (the paged forward attends all of them in one call)."""
    *lead, length, heads, dim = q.shape
    kv_heads = k.shape[-2]
    group = heads // kv_heads
    # [..., kv_heads, group * T, d]: one matmul per KV head, over the queries of all its query heads
    grouped = q.reshape(*lead, length, kv_heads, group, dim).movedim(-4, -2).reshape(*lead, kv_heads, -1, dim)
    keys, values = k.movedim(-3, -2), v.movedim(-3, -2)  # [..., kv_heads, K, d]
    scores = (grouped @ keys.transpose(-1, -2)).view(*lead, kv_heads, group, length, -1) * scale
    scores = scores.masked_fill(~mask[..., None, None, :, :], float("-inf"))
    out = scores.softmax(-1).view(*lead, kv_heads, group * length, -1) @ values
    return out.view(*lead, kv_heads, group, length, dim).movedim(-2, -4).reshape(*lead, length, heads * dim)


class ReferenceDecoder:
    """Tensor-parallel host forward of a Llama / Qwen3 / Qwen3-MoE / Gemma3 decoder."""

    def __init__(self, loaded: LoadedModel, keep_fp32: bool = True) -> None:
        self.w = CachedWeights(loaded, keep_fp32)
        self.args = loaded.args
        self.cols = loaded.mesh_shape[1]
        text = self.args.config.get("text_config") or self.args.config
        self.text_config = text
        self.gemma = self.args.model_type.startswith("gemma")

    @cached_property
    def _inv_freq_global(self) -> torch.Tensor:
        params = self._rope_params("full_attention")
        return rope_inv_freq(self.args.head_dim, (params or {}).get("rope_theta") or self.args.rope_theta, params)

    @cached_property
    def _inv_freq_local(self) -> torch.Tensor:
        params = self._rope_params("sliding_attention")
        theta = (params or {}).get("rope_theta") or self.text_config.get("rope_local_base_freq") or self.args.rope_theta
        return rope_inv_freq(self.args.head_dim, theta, params)

    def _rope_params(self, kind: str) -> dict | None:
        params = self.args.rope_scaling
        if isinstance(params, dict) and kind in params:
            return params[kind]
        return params

    def _rotary(self, sliding: bool, length: int) -> tuple[torch.Tensor, float]:
        """A layer kind's inverse frequencies and cos/sin scale for a ``length``-token sequence
        (LongRoPE picks its short or long factors by length, as transformers does)."""
        params = self._rope_params("sliding_attention" if sliding else "full_attention")
        if rope_kind(params) != "longrope":
            return (self._inv_freq_local if sliding else self._inv_freq_global), 1.0
        inv_freq = rope_inv_freq(self.args.head_dim, params.get("rope_theta") or self.args.rope_theta, params, length)
        return inv_freq, rope_attention_scale(params, self.args.max_position_embeddings)

    def _activation(self, x: torch.Tensor) -> torch.Tensor:
        act = self.text_config.get("hidden_activation") or self.text_config.get("hidden_act") or "silu"
        return F.gelu(x, approximate="tanh") if act.startswith("gelu") else F.silu(x)

    # -- blocks ---------------------------------------------------------------------------------

    def attention(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        a, p = self.args, f"layers.{layer}.attention."
        positions = torch.arange(x.shape[0])
        sliding = self.args.layer_type(layer) == "sliding_attention"
        inv_freq, rope_scale = self._rotary(sliding, x.shape[0])
        scale = (self.text_config.get("query_pre_attn_scalar") or a.head_dim) ** -0.5
        columns = column_heads(a.n_heads, a.n_kv_heads, self.cols)
        mask = causal_mask(x.shape[0], self.args.sliding_window if sliding else None)
        out = torch.zeros_like(x)
        for c, (column, wqkv, wo) in enumerate(zip(columns, self.w.columns(p + "wqkv"), self.w.columns(p + "wo"))):
            qkv = x @ wqkv
            if self.w.has(p + "bqkv"):  # the bias of this column's heads (Qwen2)
                qkv = qkv + self.w.columns(p + "bqkv")[c].reshape(-1)
            n_q, n_kv = len(column.q) * a.head_dim, len(column.kv) * a.head_dim
            q, k, v = (t.reshape(x.shape[0], -1, a.head_dim) for t in qkv.split([n_q, n_kv, n_kv], -1))
            if self.w.has(p + "q_norm"):
                q = rms_norm(q, self.w.vector(p + "q_norm"), a.norm_eps)
                k = rms_norm(k, self.w.vector(p + "k_norm"), a.norm_eps)
            q, k = (apply_rope(t, positions, inv_freq, rope_scale) for t in (q, k))
            local = list(column.q_to_kv)
            out += attend(q, k[:, local], v[:, local], mask, scale) @ wo
        return out

    def mlp(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        p = f"layers.{layer}.feed_forward."
        if self.w.has(p + "gate"):
            return self.moe(x, p)
        out = torch.zeros_like(x)
        for w1, w3, w2 in zip(self.w.columns(p + "w1"), self.w.columns(p + "w3"), self.w.columns(p + "w2")):
            out += (self._activation(x @ w1) * (x @ w3)) @ w2
        return out

    def moe(self, x: torch.Tensor, p: str) -> torch.Tensor:
        return self.experts(x, p, *self.route(x, p))

    def route(self, x: torch.Tensor, p: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``(weights, experts)`` ``[T, top_k]`` of each token: softmax router, top-k (renormalized)."""
        probs = (x @ self.w.full(p + "gate")).softmax(-1)
        top, chosen = probs.topk(self.args.num_experts_per_tok, dim=-1)
        if self.args.norm_topk_prob:
            top = top / top.sum(-1, keepdim=True)
        return top, chosen

    def experts(self, x: torch.Tensor, p: str, top: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        """The weighted sum of the chosen experts' gated MLPs (stacked ``experts.w1/w3/w2``)."""
        w1, w3, w2 = (self.w.full(f"{p}experts.{n}") for n in ("w1", "w3", "w2"))
        out = torch.zeros_like(x)
        for slot in range(chosen.shape[-1]):
            for expert in chosen[:, slot].unique().tolist():
                rows = chosen[:, slot] == expert
                h = x[rows]
                y = (self._activation(h @ w1[expert]) * (h @ w3[expert])) @ w2[expert]
                out[rows] += top[rows, slot, None] * y
        return out

    # -- the model ------------------------------------------------------------------------------

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.w.rows("tok_embeddings", tokens)
        return x * math.sqrt(self.args.dim) if self.gemma else x

    def logits(self, tokens: Sequence[int]) -> torch.Tensor:
        """``[T, vocab]`` logits of a prompt."""
        return self.output_logits(self.hidden_states(torch.as_tensor(list(tokens))))

    def output_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Final norm, LM head (column shards concatenated) and logit soft-capping of hidden states."""
        x = rms_norm(x, self.w.vector("norm"), self.args.norm_eps)
        logits = torch.cat([x @ head for head in self.w.columns("output")], dim=-1)
        cap = self.text_config.get("final_logit_softcapping")
        return torch.tanh(logits / cap) * cap if cap else logits

    def hidden_states(self, tokens: torch.Tensor) -> torch.Tensor:
        """The residual stream after the last layer (hook: gemma4 threads per-layer inputs through)."""
        x = self.embed(tokens)
        for layer in range(self.args.n_layers):
            x = self.block(x, layer)
        return x

    def block(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        a, p = self.args, f"layers.{layer}."
        norm = lambda h, name: rms_norm(h, self.w.vector(p + name), a.norm_eps)  # noqa: E731
        if self.gemma:
            x = x + norm(self.attention(norm(x, "attention_norm"), layer), "post_attention_norm")
            return x + norm(self.mlp(norm(x, "ffn_norm"), layer), "post_ffn_norm")
        x = x + self.attention(norm(x, "attention_norm"), layer)
        return x + self.mlp(norm(x, "ffn_norm"), layer)

    @torch.no_grad()
    def greedy(self, tokens: Sequence[int], steps: int) -> list[int]:
        """``steps`` greedy next tokens (full recompute each step: this is a checker, not a server)."""
        tokens, out = list(tokens), []
        for _ in range(steps):  # the LM head of the last position only: the rest is not needed
            nxt = int(self.output_logits(self.hidden_states(torch.as_tensor(tokens))[-1:])[0].argmax())
            tokens.append(nxt)
            out.append(nxt)
        return out
