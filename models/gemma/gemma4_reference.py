# SPDX-License-Identifier: Apache-2.0
"""Gemma 4 text forward on the host, from the cached ttnn tensors (the layout proof).

:class:`~models.common.reference.ReferenceDecoder` with Gemma 4's differences: per-layer head_dim
and rope (proportional rope on global layers), attention scaling 1 and a weightless v-norm,
values equal to keys (``attention_k_eq_v``), KV-shared layers reading the K/V of the last
unshared layer of their type (per mesh column, as the device keeps them), the MoE block beside
the dense MLP, per-layer input embeddings, and the per-layer scalar.
"""

from __future__ import annotations

import math
from functools import cache

import torch

from models.common.heads import column_heads
from models.common.loader import LoadedModel
from models.common.reference import ReferenceDecoder, apply_rope, attend, causal_mask, rms_norm, rope_inv_freq
from models.gemma.gemma4 import Gemma4Layer, gemma4_layer

# K/V per layer type, one (keys, values) pair per mesh column: what a KV-shared layer reads.
SharedKV = dict[str, list[tuple[torch.Tensor, torch.Tensor]]]


class Gemma4Reference(ReferenceDecoder):
    """Tensor-parallel host forward of a Gemma 4 text decoder."""

    def __init__(self, loaded: LoadedModel) -> None:
        super().__init__(loaded)
        self.layers = [gemma4_layer(self.args.config, i) for i in range(self.args.n_layers)]
        self.ple_dim = int(self.text_config.get("hidden_size_per_layer_input") or 0)
        self._inv_freq = cache(self._rope)

    def _rope(self, layer_type: str, head_dim: int) -> torch.Tensor:
        params = self._rope_params(layer_type) or {}
        return rope_inv_freq(head_dim, params.get("rope_theta") or self.args.rope_theta, params)

    # -- the model ------------------------------------------------------------------------------

    def hidden_states(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        per_layer = self.per_layer_inputs(tokens, x) if self.ple_dim else None
        shared: SharedKV = {}
        for layer in range(self.args.n_layers):
            x = self.block(x, layer, None if per_layer is None else per_layer[:, layer], shared)
        return x

    def per_layer_inputs(self, tokens: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``[T, layers, ple]``: the per-layer embedding (host table) plus the normed projection of
        the token embedding, scaled by ``1/sqrt(2)``."""
        a, ple = self.args, self.ple_dim
        table = self.w.full("tok_embeddings_per_layer")[tokens] * math.sqrt(ple)
        projected = (x @ self.w.full("per_layer_model_projection")) * a.dim**-0.5
        projected = rms_norm(projected.reshape(len(tokens), -1, ple), self.w.vector("per_layer_projection_norm"),
                             a.norm_eps)
        return (projected + table.reshape(len(tokens), -1, ple)) * 2**-0.5

    def block(self, x: torch.Tensor, layer: int, per_layer_input: torch.Tensor | None = None,
              shared: SharedKV | None = None) -> torch.Tensor:
        a, p = self.args, f"layers.{layer}."
        norm = lambda h, name: rms_norm(h, self.w.vector(p + name), a.norm_eps)  # noqa: E731
        shared = {} if shared is None else shared
        x = x + norm(self.attention(norm(x, "attention_norm"), layer, shared), "post_attention_norm")
        h = self.mlp(norm(x, "ffn_norm"), layer)
        if self.w.has(p + "moe.gate"):
            routed = self.experts(norm(x, "ffn_norm_2"), p + "moe.", *self.route(x, p + "moe."))
            h = norm(h, "post_ffn_norm_1") + norm(routed, "post_ffn_norm_2")
        x = x + norm(h, "post_ffn_norm")
        if per_layer_input is not None:
            x = x + norm(self.per_layer_input(x, layer, per_layer_input), "post_per_layer_input_norm")
        return x * self.w.loaded.host_weights[p + "layer_scalar"].item()

    # -- blocks ---------------------------------------------------------------------------------

    def attention(self, x: torch.Tensor, layer: int, shared: SharedKV) -> torch.Tensor:
        a, shape, p = self.args, self.layers[layer], f"layers.{layer}.attention."
        hd, T = shape.head_dim, x.shape[0]
        inv_freq = self._inv_freq(shape.layer_type, hd)
        positions = torch.arange(T)
        mask = causal_mask(T, self.text_config.get("sliding_window") if shape.sliding else None)
        columns = column_heads(a.n_heads, shape.n_kv_heads, self.cols)
        out, produced = torch.zeros_like(x), []
        for c, (column, w, wo) in enumerate(zip(columns, self.w.columns(p + shape.fused_name), self.w.columns(p + "wo"))):
            q, *kv = (x @ w).split([len(column.q) * hd] + [len(column.kv) * hd] * self._kv_parts(shape), -1)
            q = apply_rope(rms_norm(q.reshape(T, -1, hd), self.w.vector(p + "q_norm"), a.norm_eps), positions, inv_freq)
            if shape.kv_shared:
                k, v = shared[shape.layer_type][c]
            else:
                k, v = (t.reshape(T, -1, hd) for t in (kv[0], kv[-1]))  # k_eq_v: one part, both
                k = apply_rope(rms_norm(k, self.w.vector(p + "k_norm"), a.norm_eps), positions, inv_freq)
                v = rms_norm(v, 1.0, a.norm_eps)
                produced.append((k, v))
            local = list(column.q_to_kv)
            out += attend(q, k[:, local], v[:, local], mask, 1.0) @ wo
        if produced:  # unshared layers precede shared ones: the last writer of a type is its producer
            shared[shape.layer_type] = produced
        return out

    @staticmethod
    def _kv_parts(shape: Gemma4Layer) -> int:
        return 0 if shape.kv_shared else 1 if shape.k_eq_v else 2

    def route(self, x: torch.Tensor, p: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Gemma 4's router: normed input, softmax, renormalized top-k, times a per-expert scale."""
        h = rms_norm(x, self.w.vector(p + "router_norm"), self.args.norm_eps)
        probs = (h @ self.w.full(p + "gate")).softmax(-1)
        top, chosen = probs.topk(self.args.num_experts_per_tok, dim=-1)
        top = top / top.sum(-1, keepdim=True)
        return top * self.w.full(p + "expert_scale").reshape(-1)[chosen], chosen

    def per_layer_input(self, x: torch.Tensor, layer: int, per_layer_input: torch.Tensor) -> torch.Tensor:
        """Each column gates its slice of the per-layer input; partial projections are summed."""
        p = f"layers.{layer}."
        gates, projections = self.w.columns(p + "per_layer_input_gate"), self.w.columns(p + "per_layer_projection")
        out, start = torch.zeros_like(x), 0
        for gate, projection in zip(gates, projections):
            width = gate.shape[-1]
            out += (self._activation(x @ gate) * per_layer_input[:, start:start + width]) @ projection
            start += width
        return out
