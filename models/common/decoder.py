# SPDX-License-Identifier: Apache-2.0
"""Weight layouts of a Llama-style decoder as its device code consumes them, shared by families.

Per layer (names are the loader's, after renaming checkpoint keys):

============================  =====================================  ==================
weight                        host transform                         format
============================  =====================================  ==================
``attention.wqkv``            q/k/v ``[out,in]`` -> ``[in, out]``,     policy, TILE,
                              fused column-blocked per mesh column   column-parallel
``attention.bqkv``            q/k/v biases (Qwen2) in the column     bf16, TILE, split
                              blocks of ``wqkv``, ``[1, out]``       over columns only
``attention.wo``              ``[in, out]``                          policy, TILE,
                                                                     row-parallel
``attention.{q,k}_norm``      ``[1, 1, head_dim/32, 32]``            bf16, ROW_MAJOR
``attention_norm`` etc.       ``[1, 1, dim/32, 32]``                 bf16, ROW_MAJOR
``feed_forward.w1/w3``        gate/up ``[in, out]``                  column-parallel
``feed_forward.w2``           down ``[in, out]``                     row-parallel
``feed_forward.gate``         MoE router ``[dim, experts]``          bf16, TILE
``feed_forward.experts.w*``   stacked ``[experts, in, out]``         expert-parallel
============================  =====================================  ==================

plus ``tok_embeddings`` (bf16 ROW_MAJOR, replicated), ``norm`` and ``output`` (the LM head,
``[dim, vocab]`` column-parallel; the embedding when tied). "policy": the dtype the build's precision
policy gives the weight's tensor group and decoder (:mod:`models.common.precision`); linear weights
(MLP, experts, LM head too) are TILE in it. Every transform is a plain torch op,
so the same code runs on real weights (cold) and on storage-free placeholders (warm).

**Checkpoint shapes** (:data:`CHECKPOINT_SHAPES`, every family's tensors, in ``config.json``'s
names): the shape each checkpoint tensor must have, from the sizes :meth:`DecoderLoader.shape_sizes`
takes from the very :class:`ModelArgs` the conversion uses (per layer: :meth:`DecoderLoader.layer_args`,
Gemma 4's wider global layers). Every tensor the conversion reads is checked against it when a build
is planned from the checkpoint's headers, before anything is converted or locked
(:mod:`models.common.build_plan`): a config that does not describe its checkpoint is one
:class:`~models.common.checkpoint.CheckpointShapeError` naming the tensor, its shape and the expected one, never a cache
built from it nor a failure deep in a conversion.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import ttnn

from models.common.checkpoint import KeyRule
from models.common.conversion import WeightSink
from models.common.heads import column_heads
from models.common.loader import WeightLoader
from models.common.mesh import COLUMN_PARALLEL, EXPERT_PARALLEL, REPLICATED, ROW_PARALLEL, Placement
from models.common.model_args import ModelArgs
from models.common.weight_cache.placeholders import concat, stack
from models.common.weight_cache.tensor_cache import TensorFormat

HF_DECODER_RULES: tuple[KeyRule, ...] = (
    KeyRule(r"^model\.embed_tokens\.weight$", "tok_embeddings.weight"),
    KeyRule(r"^model\.norm\.weight$", "norm.weight"),
    KeyRule(r"^lm_head\.weight$", "output.weight"),
    KeyRule(r"^model\.layers\.(\d+)\.self_attn\.([qkvo])_proj\.(weight|bias)$", r"layers.\1.attention.w\2.\3"),
    KeyRule(r"^model\.layers\.(\d+)\.self_attn\.([qk])_norm\.weight$", r"layers.\1.attention.\2_norm.weight"),
    KeyRule(r"^model\.layers\.(\d+)\.input_layernorm\.weight$", r"layers.\1.attention_norm.weight"),
    KeyRule(r"^model\.layers\.(\d+)\.post_attention_layernorm\.weight$", r"layers.\1.ffn_norm.weight"),
    KeyRule(r"^model\.layers\.(\d+)\.mlp\.gate\.weight$", r"layers.\1.feed_forward.gate.weight"),
    KeyRule(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.gate_proj\.weight$", r"layers.\1.feed_forward.experts.\2.w1.weight"),
    KeyRule(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.down_proj\.weight$", r"layers.\1.feed_forward.experts.\2.w2.weight"),
    KeyRule(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.up_proj\.weight$", r"layers.\1.feed_forward.experts.\2.w3.weight"),
    KeyRule(r"^model\.layers\.(\d+)\.mlp\.gate_proj\.weight$", r"layers.\1.feed_forward.w1.weight"),
    KeyRule(r"^model\.layers\.(\d+)\.mlp\.down_proj\.weight$", r"layers.\1.feed_forward.w2.weight"),
    KeyRule(r"^model\.layers\.(\d+)\.mlp\.up_proj\.weight$", r"layers.\1.feed_forward.w3.weight"),
)



@dataclass(frozen=True)
class TensorShape:
    """One row of :data:`CHECKPOINT_SHAPES`: checkpoint tensors (loader names; ``{layer}`` a decoder
    layer, ``{n}`` any other index) and their dimensions, each a sum of products of sizes named as
    in ``config.json`` (``vision.`` for the vision tower's), e.g. ``"num_attention_heads*head_dim"``."""

    names: str
    dims: tuple[str, ...]

    @property
    def pattern(self) -> re.Pattern[str]:
        return _pattern(self.names)

    def expected(self, sizes: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(sum(_product(term, sizes) for term in dim.split("+")) for dim in self.dims)


def _pattern(names: str) -> re.Pattern[str]:
    escaped = re.escape(names).replace(r"\{layer\}", r"(?P<layer>\d+)").replace(r"\{n\}", r"\d+")
    return re.compile(escaped)


def _product(term: str, sizes: Mapping[str, int]) -> int:
    value = 1
    for factor in term.strip().split("*"):
        factor = factor.strip()
        value *= int(factor) if factor.isdigit() else sizes[factor]
    return value


_Q, _KV = "num_attention_heads*head_dim", "num_key_value_heads*head_dim"
_VQ, _VKV = "vision.num_attention_heads*vision.head_dim", "vision.num_key_value_heads*vision.head_dim"
CHECKPOINT_SHAPES: tuple[TensorShape, ...] = (
    TensorShape("tok_embeddings.weight", ("vocab_size", "hidden_size")),
    TensorShape("output.weight", ("vocab_size", "hidden_size")),  # tied: absent, the embedding serves
    TensorShape("norm.weight", ("hidden_size",)),
    TensorShape("layers.{layer}.attention.wq.weight", (_Q, "hidden_size")),
    TensorShape("layers.{layer}.attention.wk.weight", (_KV, "hidden_size")),
    TensorShape("layers.{layer}.attention.wv.weight", (_KV, "hidden_size")),
    TensorShape("layers.{layer}.attention.wq.bias", (_Q,)),
    TensorShape("layers.{layer}.attention.wk.bias", (_KV,)),
    TensorShape("layers.{layer}.attention.wv.bias", (_KV,)),
    TensorShape("layers.{layer}.attention.qkv_proj.weight", (f"{_Q} + 2*{_KV}", "hidden_size")),  # Phi-3, fused
    TensorShape("layers.{layer}.attention.wo.weight", ("hidden_size", _Q)),
    TensorShape("layers.{layer}.attention.q_norm.weight", ("head_dim",)),
    TensorShape("layers.{layer}.attention.k_norm.weight", ("head_dim",)),
    TensorShape("layers.{layer}.attention_norm.weight", ("hidden_size",)),
    TensorShape("layers.{layer}.ffn_norm.weight", ("hidden_size",)),
    TensorShape("layers.{layer}.post_attention_norm.weight", ("hidden_size",)),  # Gemma
    TensorShape("layers.{layer}.post_ffn_norm.weight", ("hidden_size",)),
    TensorShape("layers.{layer}.feed_forward.w1.weight", ("intermediate_size", "hidden_size")),
    TensorShape("layers.{layer}.feed_forward.w3.weight", ("intermediate_size", "hidden_size")),
    TensorShape("layers.{layer}.feed_forward.w2.weight", ("hidden_size", "intermediate_size")),
    TensorShape("layers.{layer}.feed_forward.gate_up_proj.weight", ("2*intermediate_size", "hidden_size")),  # Phi-3
    # Qwen3 MoE: a router and one MLP per expert
    TensorShape("layers.{layer}.feed_forward.gate.weight", ("num_experts", "hidden_size")),
    TensorShape("layers.{layer}.feed_forward.experts.{n}.w1.weight", ("moe_intermediate_size", "hidden_size")),
    TensorShape("layers.{layer}.feed_forward.experts.{n}.w3.weight", ("moe_intermediate_size", "hidden_size")),
    TensorShape("layers.{layer}.feed_forward.experts.{n}.w2.weight", ("hidden_size", "moe_intermediate_size")),
    # Gemma 4: the MoE block beside the dense MLP (experts stacked, gate and up fused)
    TensorShape("layers.{layer}.moe.gate.weight", ("num_experts", "hidden_size")),
    TensorShape("layers.{layer}.moe.router_scale", ("hidden_size",)),
    TensorShape("layers.{layer}.moe.expert_scale", ("num_experts",)),
    TensorShape("layers.{layer}.moe.experts.gate_up_proj", ("num_experts", "2*moe_intermediate_size", "hidden_size")),
    TensorShape("layers.{layer}.moe.experts.down_proj", ("num_experts", "hidden_size", "moe_intermediate_size")),
    TensorShape("layers.{layer}.ffn_norm_2.weight", ("hidden_size",)),
    TensorShape("layers.{layer}.post_ffn_norm_1.weight", ("hidden_size",)),
    TensorShape("layers.{layer}.post_ffn_norm_2.weight", ("hidden_size",)),
    # Gemma 4: per-layer inputs
    TensorShape("tok_embeddings_per_layer.weight",
                ("vocab_size_per_layer_input", "num_hidden_layers*hidden_size_per_layer_input")),
    TensorShape("per_layer_model_projection.weight", ("num_hidden_layers*hidden_size_per_layer_input", "hidden_size")),
    TensorShape("per_layer_projection_norm.weight", ("hidden_size_per_layer_input",)),
    TensorShape("layers.{layer}.per_layer_input_gate.weight", ("hidden_size_per_layer_input", "hidden_size")),
    TensorShape("layers.{layer}.per_layer_projection.weight", ("hidden_size", "hidden_size_per_layer_input")),
    TensorShape("layers.{layer}.post_per_layer_input_norm.weight", ("hidden_size",)),
    TensorShape("layers.{layer}.layer_scalar", ("1",)),
    # Gemma 4: the vision tower and its projection into the text width
    TensorShape("vision.patch_embedding.weight", ("vision.hidden_size", "3*vision.patch_size*vision.patch_size")),
    TensorShape("vision.position_embedding.weight", ("2", "vision.position_embedding_size", "vision.hidden_size")),
    TensorShape("vision.std_bias", ("vision.hidden_size",)),
    TensorShape("vision.std_scale", ("vision.hidden_size",)),
    TensorShape("vision.projector.weight", ("hidden_size", "vision.hidden_size")),
    TensorShape("vision.layers.{n}.attention.wq.weight", (_VQ, "vision.hidden_size")),
    TensorShape("vision.layers.{n}.attention.wk.weight", (_VKV, "vision.hidden_size")),
    TensorShape("vision.layers.{n}.attention.wv.weight", (_VKV, "vision.hidden_size")),
    TensorShape("vision.layers.{n}.attention.wo.weight", ("vision.hidden_size", _VQ)),
    TensorShape("vision.layers.{n}.feed_forward.w1.weight", ("vision.intermediate_size", "vision.hidden_size")),
    TensorShape("vision.layers.{n}.feed_forward.w3.weight", ("vision.intermediate_size", "vision.hidden_size")),
    TensorShape("vision.layers.{n}.feed_forward.w2.weight", ("vision.hidden_size", "vision.intermediate_size")),
    TensorShape("vision.layers.{n}.attention.q_norm.weight", ("vision.head_dim",)),
    TensorShape("vision.layers.{n}.attention.k_norm.weight", ("vision.head_dim",)),
    *(TensorShape(f"vision.layers.{{n}}.{norm}.weight", ("vision.hidden_size",))
      for norm in ("attention_norm", "post_attention_norm", "ffn_norm", "post_ffn_norm")),
    *(TensorShape(f"vision.layers.{{n}}.{linear}.{bound}", ())  # a clipped linear's bounds: scalars
      for linear in ("attention.wq", "attention.wk", "attention.wv", "attention.wo",
                     "feed_forward.w1", "feed_forward.w3", "feed_forward.w2")
      for bound in ("input_min", "input_max", "output_min", "output_max")),
)
_SHAPE_PATTERNS = tuple((rule.pattern, rule) for rule in CHECKPOINT_SHAPES)


def shape_rule(key: str) -> tuple[TensorShape, int | None]:
    """The row of :data:`CHECKPOINT_SHAPES` for a checkpoint tensor (loader name), and its layer.
    A tensor a conversion reads with no row is this table's omission: ``LookupError``."""
    for pattern, rule in _SHAPE_PATTERNS:
        match = pattern.fullmatch(key)
        if match:
            layer = match.groupdict().get("layer")
            return rule, int(layer) if layer is not None else None
    raise LookupError(f"checkpoint tensor {key!r} has no row in the layout table (models.common.decoder)")


def _shown(dims: Sequence[object]) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


NORM_FORMAT = TensorFormat(ttnn.bfloat16, ttnn.ROW_MAJOR_LAYOUT, REPLICATED)
EMBEDDING_FORMAT = TensorFormat(ttnn.bfloat16, ttnn.ROW_MAJOR_LAYOUT, REPLICATED)
ROUTER_FORMAT = TensorFormat(ttnn.bfloat16, ttnn.TILE_LAYOUT, REPLICATED)
# Biases are added after the reduction over mesh rows: split over columns like their weight's
# outputs, replicated over rows. bf16 whatever the precision (tt-metal keeps biases in bf16).
BIAS_FORMAT = TensorFormat(ttnn.bfloat16, ttnn.TILE_LAYOUT, Placement(col_dim=-1))


def norm_for_device(weight: torch.Tensor) -> torch.Tensor:
    """RMSNorm weights as tt-metal's ``RMSNorm`` reads them: ``[1, 1, dim/32, 32]``."""
    return weight.reshape(1, 1, -1, 32)


def _heads(weight: torch.Tensor, indices: Sequence[int | None], head_dim: int) -> list[torch.Tensor]:
    """Rows ``[h * head_dim, (h + 1) * head_dim)`` of each head; zeros for a padding head."""
    return [weight.narrow(0, h * head_dim, head_dim) if h is not None
            else weight.new_zeros((head_dim, *weight.shape[1:])) for h in indices]


def column_blocked_heads(
    wq: torch.Tensor, wk: torch.Tensor | None, wv: torch.Tensor | None, args: ModelArgs, cols: int
) -> torch.Tensor:
    """q/k/v rows (weights ``[out, in]`` or biases ``[out]``) regrouped per mesh column: column
    ``c``'s block holds its query heads, then its key heads, then its value heads (see
    :func:`column_heads`)."""
    blocks = []
    for column in column_heads(args.n_heads, args.n_kv_heads, cols):
        blocks += _heads(wq, column.q, args.head_dim)
        for w in (wk, wv):
            blocks += _heads(w, column.kv, args.head_dim) if w is not None else []
    return concat(blocks, dim=0)


def column_blocked_output(wo: torch.Tensor, args: ModelArgs, cols: int) -> torch.Tensor:
    """``wo`` as ``[n_heads * head_dim, dim]`` whose row blocks follow each column's query heads:
    the plain transpose when the heads divide evenly (consecutive heads per column), with zero
    rows for padding heads otherwise."""
    columns = column_heads(args.n_heads, args.n_kv_heads, cols)
    rows = wo.transpose(0, 1)
    if not any(column.padded for column in columns):
        return rows
    return concat([block for column in columns for block in _heads(rows, column.q, args.head_dim)], dim=0)


def fuse_qkv(
    wq: torch.Tensor, wk: torch.Tensor | None, wv: torch.Tensor | None, args: ModelArgs, cols: int
) -> torch.Tensor:
    """``[dim, cols * (q + k + v heads of a column) * head_dim]``, column-blocked (see
    :func:`column_blocked_heads`).

    ``wk`` / ``wv`` may be None for a model whose layer has no such projection (gemma4's KV-shared
    layers, or values equal to keys): that part of every column's block is then left out."""
    return column_blocked_heads(wq, wk, wv, args, cols).transpose(0, 1)


def fuse_qkv_bias(bq: torch.Tensor, bk: torch.Tensor, bv: torch.Tensor, args: ModelArgs, cols: int) -> torch.Tensor:
    """``[1, cols * block]``: the q/k/v biases in exactly the column blocks of :func:`fuse_qkv`, so
    each device adds the bias of the heads it computes."""
    return column_blocked_heads(bq, bk, bv, args, cols).reshape(1, -1)


def split_rows(fused: torch.Tensor, sizes: Sequence[int]) -> list[torch.Tensor]:
    """Views of consecutive row ranges of a fused ``[out, in]`` checkpoint weight (Phi-3's
    ``qkv_proj``, ``gate_up_proj``; that the sizes add up is :data:`CHECKPOINT_SHAPES`' to check)."""
    return list(fused.split(list(sizes), dim=0))


def stack_experts(state: Mapping[str, torch.Tensor], prefix: str, name: str, count: int) -> torch.Tensor:
    """``[experts, in, out]`` of one projection of every expert of a layer."""
    return stack([state[f"{prefix}experts.{e}.{name}.weight"].transpose(0, 1) for e in range(count)])


class DecoderLoader(WeightLoader):
    """Llama-style decoder conversion; families override the hooks where their models differ."""

    key_rules = HF_DECODER_RULES
    norm_format = NORM_FORMAT
    layer_norms: tuple[str, ...] = ("attention_norm", "ffn_norm")

    def make_args(self, config: dict, num_layers: int | None) -> ModelArgs:
        return ModelArgs.from_hf_config(config, num_layers)

    def layer_args(self, args: ModelArgs, layer: int) -> ModelArgs:
        """Hook: the facts of layer ``layer`` where they differ from the model's (Gemma 4's head
        size and KV heads on its global layers); the conversion and the shape check both use it."""
        return args

    # checkpoint shapes -----------------------------------------------------------------------

    def shape_sizes(self, args: ModelArgs, layer: int | None) -> dict[str, int]:
        """The sizes :data:`CHECKPOINT_SHAPES` names, for one layer (or the model: ``None``), as
        the conversion sees them; a family adds what its own tensors need."""
        facts = self.layer_args(args, layer) if layer is not None else args
        return {"hidden_size": args.dim, "vocab_size": args.vocab_size, "num_attention_heads": facts.n_heads,
                "num_key_value_heads": facts.n_kv_heads, "head_dim": facts.head_dim,
                "intermediate_size": facts.hidden_dim, "num_experts": args.num_experts,
                "moe_intermediate_size": args.moe_hidden_dim, "num_hidden_layers": args.full_n_layers}

    def tensor_shape_problem(self, key: str, shape: Sequence[int], args: ModelArgs) -> str | None:
        """How checkpoint tensor ``key``'s shape differs from the one ``config.json`` implies, or None."""
        rule, layer = shape_rule(key)
        try:
            expected = rule.expected(self.shape_sizes(args, layer))
        except KeyError as error:  # a size this family's config does not give: its tensor cannot be read
            return f"is read, but config.json gives no {error.args[0]} for its shape {_shown(rule.dims)}"
        if tuple(shape) == expected:
            return None
        return f"has shape {_shown(shape)}; config.json implies {_shown(rule.dims)} = {_shown(expected)}"

    # formats ---------------------------------------------------------------------------------

    def linear_format(self, placement, weight: str) -> TensorFormat:
        """A linear weight's format: TILE, in the dtype the precision policy gives ``weight``."""
        return TensorFormat(self.precision_dtype(weight), ttnn.TILE_LAYOUT, placement)

    def expert_format(self, args: ModelArgs, weight: str) -> TensorFormat:
        devices = self.mesh_shape[0] * self.mesh_shape[1]
        return self.linear_format(EXPERT_PARALLEL if args.num_experts % devices == 0 else REPLICATED, weight)

    def norm(self, weight: torch.Tensor) -> torch.Tensor:
        """Hook: a family whose norm scales by ``1 + w`` (gemma) folds the one in here."""
        return norm_for_device(weight)

    # conversion ------------------------------------------------------------------------------

    def convert(self, sink: WeightSink, args: ModelArgs) -> None:
        state = sink.state
        if not self.is_host_weight("tok_embeddings.weight"):
            sink.put("tok_embeddings", state["tok_embeddings.weight"], EMBEDDING_FORMAT)
        # The LM head (the largest weight) goes first, so its write overlaps the layers' conversion.
        head = state["output.weight"] if "output.weight" in state else state["tok_embeddings.weight"]
        sink.put("output", head.transpose(0, 1), self.linear_format(COLUMN_PARALLEL, "output"))
        sink.put("norm", self.norm(state["norm.weight"]), self.norm_format)
        for layer in range(args.n_layers):
            self.convert_layer(sink, args, layer)

    def convert_layer(self, sink: WeightSink, args: ModelArgs, layer: int) -> None:
        self.convert_attention(sink, args, layer)
        self.convert_norms(sink, args, layer)
        if layer in args.moe_layers:
            self.convert_moe(sink, args, layer)
        else:
            self.convert_mlp(sink, args, layer)

    def qkv_weights(self, state: Mapping[str, torch.Tensor], prefix: str, args: ModelArgs) -> list[torch.Tensor]:
        """Hook: q, k and v ``[out, in]`` of a layer (a family storing them fused splits here)."""
        return [state[f"{prefix}w{name}.weight"] for name in "qkv"]

    def gate_up_weights(self, state: Mapping[str, torch.Tensor], prefix: str, args: ModelArgs) -> list[torch.Tensor]:
        """Hook: gate (``w1``) and up (``w3``) ``[out, in]`` of a layer's MLP."""
        return [state[prefix + "w1.weight"], state[prefix + "w3.weight"]]

    def convert_attention(self, sink: WeightSink, args: ModelArgs, layer: int) -> None:
        state, p = sink.state, f"layers.{layer}.attention."
        cols = self.mesh_shape[1]
        args = self.layer_args(args, layer)
        wqkv = fuse_qkv(*self.qkv_weights(state, p, args), args, cols)
        sink.put(p + "wqkv", wqkv, self.linear_format(COLUMN_PARALLEL, p + "wqkv"))
        if args.qkv_bias:
            bqkv = fuse_qkv_bias(*(state[f"{p}w{name}.bias"] for name in "qkv"), args, cols)
            sink.put(p + "bqkv", bqkv, BIAS_FORMAT)
        sink.put(p + "wo", column_blocked_output(state[p + "wo.weight"], args, cols),
                 self.linear_format(ROW_PARALLEL, p + "wo"))
        if args.qk_norm:
            sink.put(p + "q_norm", self.norm(state[p + "q_norm.weight"]), self.norm_format)
            sink.put(p + "k_norm", self.norm(state[p + "k_norm.weight"]), self.norm_format)

    def convert_norms(self, sink: WeightSink, args: ModelArgs, layer: int) -> None:
        p = f"layers.{layer}."
        for name in self.layer_norms:
            sink.put(p + name, self.norm(sink.state[f"{p}{name}.weight"]), self.norm_format)

    def convert_mlp(self, sink: WeightSink, args: ModelArgs, layer: int) -> None:
        state, p = sink.state, f"layers.{layer}.feed_forward."
        w1, w3 = self.gate_up_weights(state, p, args)
        sink.put(p + "w1", w1.transpose(0, 1), self.linear_format(COLUMN_PARALLEL, p + "w1"))
        sink.put(p + "w3", w3.transpose(0, 1), self.linear_format(COLUMN_PARALLEL, p + "w3"))
        sink.put(p + "w2", state[p + "w2.weight"].transpose(0, 1), self.linear_format(ROW_PARALLEL, p + "w2"))

    def convert_moe(self, sink: WeightSink, args: ModelArgs, layer: int) -> None:
        state, p = sink.state, f"layers.{layer}.feed_forward."
        sink.put(p + "gate", state[p + "gate.weight"].transpose(0, 1), ROUTER_FORMAT)
        for name in ("w1", "w3", "w2"):
            sink.put(f"{p}experts.{name}", stack_experts(state, p, name, args.num_experts),
                     self.expert_format(args, f"{p}experts.{name}"))
