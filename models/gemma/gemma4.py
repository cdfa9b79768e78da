# SPDX-License-Identifier: Apache-2.0
"""Gemma 4: the text decoder and, as a separate component, the vision tower.

Gemma 4 keeps Gemma 3's four norms per layer and host-consumed token embedding, and differs in:
norms scale by ``w`` (not ``1 + w``: stored as is, bf16 exact), attention scaling 1 with a
weightless v-norm, a per-layer head_dim (``per_layer_config``: global layers are wider), and the
optional variants below. Per layer ``i`` (``layers.i.`` prefix), as the device consumes them:

=============================  ============================================  =================
weight                         host transform                                format
=============================  ============================================  =================
``attention.wqkv``             q|k|v fused column-blocked by the shared      precision, TILE,
                               :func:`~models.common.decoder.fuse_qkv`,      column-parallel
                               with this layer's head_dim and KV heads
``attention.wqk``              ``attention_k_eq_v`` global layers: q|k       same
                               (the values are the keys before the k-norm)
``attention.wq``               KV-shared layers: queries only (K/V come      same
                               from the last unshared layer of the type)
``attention.wo``               ``[heads * head_dim, dim]``                   row-parallel
``attention.{q,k}_norm``       ``[1, 1, head_dim/32, 32]``; no k-norm on     bf16, ROW_MAJOR
                               KV-shared layers; the v-norm has no weight
``attention_norm`` ...         input / post-attn / pre-FFN / post-FFN        bf16, ROW_MAJOR
``feed_forward.w1/w3/w2``      dense gated MLP (double width on KV-shared    column / row-
                               layers with ``use_double_wide_mlp``)          parallel
``moe.gate``                   router ``[dim, experts]``                     bf16, TILE
``moe.router_norm``            router RMSNorm weight ``scale / sqrt(dim)``   fp32, ROW_MAJOR
``moe.expert_scale``           per-expert weight ``[1, experts]``            bf16, ROW_MAJOR
``moe.experts.w1/w3/w2``       fused ``gate_up`` split; stacked              expert-parallel
                               ``[experts, in, out]`` like qwen3 MoE's       (else replicated)
``ffn_norm_2``                 the MoE input norm                            bf16, ROW_MAJOR
``post_ffn_norm_1/2``          after the dense MLP / after the experts       bf16, ROW_MAJOR
``per_layer_input_gate``       ``[dim, ple]``                                column-parallel
``per_layer_projection``       ``[ple, dim]``                                row-parallel
``post_per_layer_input_norm``  ``[1, 1, dim/32, 32]``                        bf16, ROW_MAJOR
``layer_scalar``               read with ``.item()``                         host weight
=============================  ============================================  =================

Model-wide: ``tok_embeddings`` and ``tok_embeddings_per_layer`` (the packed per-layer embedding
table ``[vocab, layers * ple]``) are looked up on the host: host weights, kept real in warm builds
through the sidecar. ``per_layer_model_projection`` ``[dim, layers * ple]`` (precision, TILE,
replicated: every device needs every layer's slice), ``per_layer_projection_norm``, ``norm`` and
``output`` (the tied LM head, column-parallel).

Vision component (``components={"text", "vision"}``), all replicated, ``vision.`` prefix: linear
weights (``patch_embedding``, ``layers.j.attention.w{q,k,v,o}``, ``layers.j.feed_forward.w{1,3,2}``,
and ``projector``, the multimodal embedder into the text width) ``[in, out]`` at the precision,
TILE; norms bf16 ``[1, 1, n/32, 32]``; ``position_embedding`` ``[2, positions, width]`` and
``std_bias`` / ``std_scale`` ``[1, width]`` bf16 ROW_MAJOR. Clipped linears' bounds
(``*.input_min`` ...) are scalars the device op takes as arguments: host weights, in the sidecar
only when the build includes vision.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import torch
from loguru import logger

from models.common.checkpoint import CheckpointError, KeyRule
from models.common.decoder import (
    EMBEDDING_FORMAT,
    HF_DECODER_RULES,
    ROUTER_FORMAT,
    DecoderLoader,
    column_blocked_output,
    fuse_qkv,
    norm_for_device,
)
from models.common.conversion import WeightSink
from models.common.mesh import COLUMN_PARALLEL, REPLICATED, ROW_PARALLEL
from models.common.model_args import ModelArgs
from models.common.weight_cache.placeholders import fp32_elementwise
from models.gemma.loader import GEMMA_NORM_FORMAT, GEMMA_NORM_RULES, HOST_EMBEDDING

HOST_PER_LAYER_EMBEDDING = "tok_embeddings_per_layer.weight"
VECTOR_FORMAT = EMBEDDING_FORMAT  # bf16 ROW_MAJOR replicated: small vectors the device broadcasts

_LAYER = r"^model\.layers\.(\d+)\."
GEMMA4_TEXT_RULES: tuple[KeyRule, ...] = (
    KeyRule(r"^model\.embed_tokens_per_layer\.weight$", HOST_PER_LAYER_EMBEDDING),
    KeyRule(r"^model\.per_layer_model_projection\.weight$", "per_layer_model_projection.weight"),
    KeyRule(r"^model\.per_layer_projection_norm\.weight$", "per_layer_projection_norm.weight"),
    KeyRule(_LAYER + r"layer_scalar$", r"layers.\1.layer_scalar"),
    KeyRule(_LAYER + r"pre_feedforward_layernorm_2\.weight$", r"layers.\1.ffn_norm_2.weight"),
    KeyRule(_LAYER + r"post_feedforward_layernorm_([12])\.weight$", r"layers.\1.post_ffn_norm_\2.weight"),
    KeyRule(_LAYER + r"post_per_layer_input_norm\.weight$", r"layers.\1.post_per_layer_input_norm.weight"),
    KeyRule(_LAYER + r"per_layer_(input_gate|projection)\.weight$", r"layers.\1.per_layer_\2.weight"),
    KeyRule(_LAYER + r"router\.proj\.weight$", r"layers.\1.moe.gate.weight"),
    KeyRule(_LAYER + r"router\.scale$", r"layers.\1.moe.router_scale"),
    KeyRule(_LAYER + r"router\.per_expert_scale$", r"layers.\1.moe.expert_scale"),
    KeyRule(_LAYER + r"experts\.(gate_up_proj|down_proj)$", r"layers.\1.moe.experts.\2"),
)


def language_model_rules(rules: Iterable[KeyRule]) -> tuple[KeyRule, ...]:
    """Text rules that also accept the multimodal checkpoint's ``model.language_model.`` prefix
    (``Gemma4ForConditionalGeneration``; ``Gemma4ForCausalLM`` writes plain ``model.``)."""
    return tuple(KeyRule(r.pattern.replace(r"^model\.", r"^model\.(?:language_model\.)?", 1), r.replacement)
                 for r in rules)


_VLAYER = r"^model\.vision_tower\.encoder\.layers\.(\d+)\."
_CLIPPED = r"(?:linear\.)?(weight|input_min|input_max|output_min|output_max)$"
GEMMA4_VISION_RULES: tuple[KeyRule, ...] = (
    KeyRule(r"^model\.vision_tower\.patch_embedder\.input_proj\.weight$", "vision.patch_embedding.weight"),
    KeyRule(r"^model\.vision_tower\.patch_embedder\.position_embedding_table$", "vision.position_embedding.weight"),
    KeyRule(r"^model\.vision_tower\.std_(bias|scale)$", r"vision.std_\1"),
    KeyRule(r"^model\.embed_vision\.embedding_projection\.weight$", "vision.projector.weight"),
    KeyRule(_VLAYER + r"self_attn\.([qkvo])_proj\." + _CLIPPED, r"vision.layers.\1.attention.w\2.\3"),
    KeyRule(_VLAYER + r"self_attn\.([qk])_norm\.weight$", r"vision.layers.\1.attention.\2_norm.weight"),
    KeyRule(_VLAYER + r"mlp\.gate_proj\." + _CLIPPED, r"vision.layers.\1.feed_forward.w1.\2"),
    KeyRule(_VLAYER + r"mlp\.down_proj\." + _CLIPPED, r"vision.layers.\1.feed_forward.w2.\2"),
    KeyRule(_VLAYER + r"mlp\.up_proj\." + _CLIPPED, r"vision.layers.\1.feed_forward.w3.\2"),
    KeyRule(_VLAYER + r"input_layernorm\.weight$", r"vision.layers.\1.attention_norm.weight"),
    KeyRule(_VLAYER + r"post_attention_layernorm\.weight$", r"vision.layers.\1.post_attention_norm.weight"),
    KeyRule(_VLAYER + r"pre_feedforward_layernorm\.weight$", r"vision.layers.\1.ffn_norm.weight"),
    KeyRule(_VLAYER + r"post_feedforward_layernorm\.weight$", r"vision.layers.\1.post_ffn_norm.weight"),
)

_LAYER_SCALAR = re.compile(r"^layers\.\d+\.layer_scalar$")
_VISION_CLIP_BOUND = re.compile(r"^vision\.layers\.\d+\.\w+\.w\w\.(input|output)_(min|max)$")
_VISION_LINEARS = ("attention.wq", "attention.wk", "attention.wv", "attention.wo",
                   "feed_forward.w1", "feed_forward.w3", "feed_forward.w2")
_VISION_NORMS = ("attention.q_norm", "attention.k_norm", "attention_norm", "post_attention_norm", "ffn_norm",
                 "post_ffn_norm")


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    return config.get("text_config") or config


@dataclass(frozen=True)
class Gemma4Layer:
    """What one decoder layer's attention looks like (the loader and the reference agree here)."""

    layer_type: str
    head_dim: int
    n_kv_heads: int
    kv_shared: bool  # reuses the K/V of the last unshared layer of its type: no k/v weights
    k_eq_v: bool  # values are the key projection (before the k-norm): no v weights

    @property
    def sliding(self) -> bool:
        return self.layer_type == "sliding_attention"

    @property
    def fused_name(self) -> str:
        """The fused projection's name says what it holds, so a wrong reading cannot load."""
        return "wq" if self.kv_shared else "wqk" if self.k_eq_v else "wqkv"


def gemma4_layer(config: dict[str, Any], layer: int) -> Gemma4Layer:
    """Layer ``layer``'s attention facts from ``config.json`` (``per_layer_config`` overrides the
    global head_dim / KV heads of full-attention layers)."""
    text = text_config(config)
    overrides = (text.get("per_layer_config") or {}).get(str(layer), {})
    layer_type = (text.get("layer_types") or ["full_attention"] * (layer + 1))[layer]
    n_layers, shared = int(text["num_hidden_layers"]), int(text.get("num_kv_shared_layers") or 0)
    kv_shared = shared > 0 and layer >= n_layers - shared
    return Gemma4Layer(
        layer_type=layer_type,
        head_dim=int(overrides.get("head_dim") or text["head_dim"]),
        n_kv_heads=int(overrides.get("num_key_value_heads") or text["num_key_value_heads"]),
        kv_shared=kv_shared,
        k_eq_v=bool(text.get("attention_k_eq_v")) and layer_type != "sliding_attention" and not kv_shared,
    )


def router_norm(scale: torch.Tensor, dim: int) -> torch.Tensor:
    """The router's ``rms_norm(x) * scale * dim**-0.5`` as one RMSNorm weight, kept in fp32
    (the product is not a bf16 number)."""
    return norm_for_device(fp32_elementwise(scale, lambda s: s * dim**-0.5))


class Gemma4Loader(DecoderLoader):
    """Gemma 4 text (+ vision) on the shared decoder base; hooks only where Gemma 4 differs."""

    family = "gemma4"
    key_rules = language_model_rules(GEMMA4_TEXT_RULES + GEMMA_NORM_RULES + HF_DECODER_RULES) + GEMMA4_VISION_RULES
    layer_norms = ("attention_norm", "post_attention_norm", "ffn_norm", "post_ffn_norm")

    def __init__(self, model: str | os.PathLike, *, components: Iterable[str] | None = None, **options: Any) -> None:
        super().__init__(model, components=components, **options)
        # A text-only checkpoint has no tower: by default build what it has; asked for, it is an error.
        self._components_given = components is not None

    def make_args(self, config: dict[str, Any], num_layers: int | None) -> ModelArgs:
        if "vision" in self.components and not config.get("vision_config"):
            if self._components_given:
                raise CheckpointError(f"{self.model}: the vision component was asked for; the checkpoint has none")
            logger.info(f"{self.model_name}: no vision tower in the checkpoint; building text only")
            self.components = ("text",)
        text = text_config(config)
        args = ModelArgs.from_hf_config(config, num_layers, qk_norm=True)
        if text.get("enable_moe_block"):
            args.is_mixture_of_experts = True
            args.num_experts = int(text["num_experts"])
            args.num_experts_per_tok = int(text["top_k_experts"])
            args.moe_hidden_dim = int(text["moe_intermediate_size"])
            args.moe_layers = tuple(range(args.n_layers))
        return args

    def layer_args(self, args: ModelArgs, layer: int) -> ModelArgs:
        """This layer's head size and KV heads (wider global layers), and its MLP's width (double on
        KV-shared layers with ``use_double_wide_mlp``)."""
        shape = gemma4_layer(args.config, layer)
        wide = shape.kv_shared and bool(text_config(args.config).get("use_double_wide_mlp"))
        return replace(args, head_dim=shape.head_dim, n_kv_heads=shape.n_kv_heads,
                       hidden_dim=args.hidden_dim * (2 if wide else 1))

    def shape_sizes(self, args: ModelArgs, layer: int | None) -> dict[str, int]:
        text, vision = text_config(args.config), args.config.get("vision_config") or {}
        sizes = {name: int(text[name]) for name in ("hidden_size_per_layer_input", "vocab_size_per_layer_input")
                 if text.get(name)}
        sizes |= {f"vision.{name}": int(vision[name]) for name in (
            "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
            "patch_size", "position_embedding_size") if vision.get(name)}
        return {**super().shape_sizes(args, layer), **sizes}

    def is_host_weight(self, key: str) -> bool:
        if key in (HOST_EMBEDDING, HOST_PER_LAYER_EMBEDDING) or _LAYER_SCALAR.match(key):
            return True
        return "vision" in self.components and bool(_VISION_CLIP_BOUND.match(key))

    # -- text -----------------------------------------------------------------------------------

    def convert(self, sink: WeightSink, args: ModelArgs) -> None:
        super().convert(sink, args)
        if text_config(args.config).get("hidden_size_per_layer_input"):
            self.convert_per_layer_model_inputs(sink)
        if "vision" in self.components:
            self.convert_vision(sink, args)

    def convert_layer(self, sink: WeightSink, args: ModelArgs, layer: int) -> None:
        """Every layer has the dense MLP; the MoE block runs beside it, not instead of it."""
        self.convert_attention(sink, args, layer)
        self.convert_norms(sink, args, layer)
        self.convert_mlp(sink, args, layer)
        if layer in args.moe_layers:
            self.convert_moe(sink, args, layer)
        if f"layers.{layer}.per_layer_input_gate.weight" in sink.state:
            self.convert_per_layer_input(sink, layer)

    def convert_attention(self, sink: WeightSink, args: ModelArgs, layer: int) -> None:
        state, p = sink.state, f"layers.{layer}.attention."
        shape = gemma4_layer(args.config, layer)
        wk = None if shape.kv_shared else state[p + "wk.weight"]
        wv = None if shape.kv_shared or shape.k_eq_v else state[p + "wv.weight"]
        layer_args = self.layer_args(args, layer)
        fused = fuse_qkv(state[p + "wq.weight"], wk, wv, layer_args, self.mesh_shape[1])
        sink.put(p + shape.fused_name, fused, self.linear_format(COLUMN_PARALLEL, p + shape.fused_name))
        sink.put(p + "wo", column_blocked_output(state[p + "wo.weight"], layer_args, self.mesh_shape[1]),
                 self.linear_format(ROW_PARALLEL, p + "wo"))
        for name in ("q_norm",) if shape.kv_shared else ("q_norm", "k_norm"):
            sink.put(p + name, self.norm(state[f"{p}{name}.weight"]), self.norm_format)

    def convert_moe(self, sink: WeightSink, args: ModelArgs, layer: int) -> None:
        state, p = sink.state, f"layers.{layer}.moe."
        sink.put(p + "gate", state[p + "gate.weight"].transpose(0, 1), ROUTER_FORMAT)
        sink.put(p + "router_norm", router_norm(state[p + "router_scale"], args.dim), GEMMA_NORM_FORMAT)
        sink.put(p + "expert_scale", state[p + "expert_scale"].reshape(1, -1), VECTOR_FORMAT)
        gate_up, down = state[p + "experts.gate_up_proj"], state[p + "experts.down_proj"]
        gate, up = gate_up.chunk(2, dim=1)  # [experts, 2 * hidden, dim]: gate rows, then up rows
        for name, weight in (("w1", gate), ("w3", up), ("w2", down)):
            sink.put(f"{p}experts.{name}", weight.transpose(1, 2), self.expert_format(args, f"{p}experts.{name}"))
        for name in ("ffn_norm_2", "post_ffn_norm_1", "post_ffn_norm_2"):
            sink.put(f"layers.{layer}.{name}", self.norm(state[f"layers.{layer}.{name}.weight"]), self.norm_format)

    def convert_per_layer_input(self, sink: WeightSink, layer: int) -> None:
        """The per-layer input block: a gated MLP whose hidden units are the per-layer embedding's."""
        state, p = sink.state, f"layers.{layer}."
        gate, projection = state[p + "per_layer_input_gate.weight"], state[p + "per_layer_projection.weight"]
        sink.put(p + "per_layer_input_gate", gate.transpose(0, 1),
                 self.linear_format(COLUMN_PARALLEL, p + "per_layer_input_gate"))
        sink.put(p + "per_layer_projection", projection.transpose(0, 1),
                 self.linear_format(ROW_PARALLEL, p + "per_layer_projection"))
        sink.put(p + "post_per_layer_input_norm", self.norm(state[p + "post_per_layer_input_norm.weight"]),
                 self.norm_format)

    def convert_per_layer_model_inputs(self, sink: WeightSink) -> None:
        state = sink.state
        projection = state["per_layer_model_projection.weight"].transpose(0, 1)
        sink.put("per_layer_model_projection", projection, self.linear_format(REPLICATED, "per_layer_model_projection"))
        sink.put("per_layer_projection_norm", self.norm(state["per_layer_projection_norm.weight"]), self.norm_format)

    # -- vision ---------------------------------------------------------------------------------

    def convert_vision(self, sink: WeightSink, args: ModelArgs) -> None:
        state, linear = sink.state, self.linear_format(REPLICATED, "vision.projector")  # one group: vision
        sink.put("vision.patch_embedding", state["vision.patch_embedding.weight"].transpose(0, 1), linear)
        sink.put("vision.position_embedding", state["vision.position_embedding.weight"], EMBEDDING_FORMAT)
        for layer in range(int(args.config["vision_config"]["num_hidden_layers"])):
            p = f"vision.layers.{layer}."
            for name in _VISION_LINEARS:
                sink.put(p + name, state[f"{p}{name}.weight"].transpose(0, 1), linear)
            for name in _VISION_NORMS:
                sink.put(p + name, self.norm(state[f"{p}{name}.weight"]), self.norm_format)
        for name in ("vision.std_bias", "vision.std_scale"):
            if name in state:  # only with ``standardize``
                sink.put(name, state[name].reshape(1, -1), VECTOR_FORMAT)
        sink.put("vision.projector", state["vision.projector.weight"].transpose(0, 1), linear)
