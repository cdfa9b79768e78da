# SPDX-License-Identifier: Apache-2.0
"""Phi-3 / Phi-3.5 / Phi-4-mini (``model_type`` ``phi3``): the Llama layout stored fused.

The checkpoint holds ``qkv_proj`` (q rows, then k rows, then v rows) and ``gate_up_proj`` (gate
rows, then up rows). The device code consumes the shared decoder's layout, so they are split
here (views, no copy) and converted like everyone's: q/k/v re-fused column-blocked per mesh
column into ``attention.wqkv`` (a checkpoint's contiguous fusion would put every head on one
column), gate/up into ``feed_forward.w1`` / ``w3``.

RoPE: LongRoPE (``su`` / ``yarn`` in older configs: Phi-3's config reads both as LongRoPE) with
its short and long per-frequency factors, the original context they switch at, and a partial
rotary factor (Phi-4-mini), gathered into one :attr:`ModelArgs.rope_scaling` dict that the
reference forward reads. A window from ``sliding_window`` applies to every layer.
"""

from __future__ import annotations

from typing import Any

import torch

from models.common.checkpoint import KeyRule
from models.common.decoder import HF_DECODER_RULES, DecoderLoader, split_rows
from models.common.model_args import ModelArgs

PHI3_FUSED_RULES: tuple[KeyRule, ...] = (
    KeyRule(r"^model\.layers\.(\d+)\.self_attn\.qkv_proj\.weight$", r"layers.\1.attention.qkv_proj.weight"),
    KeyRule(r"^model\.layers\.(\d+)\.mlp\.gate_up_proj\.weight$", r"layers.\1.feed_forward.gate_up_proj.weight"),
)


def phi3_rope_parameters(text: dict[str, Any]) -> dict[str, Any]:
    """The RoPE facts of a Phi-3 config in one dict, whether it is a transformers 5 config
    (``rope_parameters``) or an original hub one (``rope_scaling`` plus top-level fields)."""
    params = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    kind = params.get("rope_type") or params.get("type") or "default"
    params["rope_type"] = "longrope" if kind in ("su", "yarn") else kind
    params.setdefault("rope_theta", float(text.get("rope_theta") or 10000.0))
    params.setdefault("partial_rotary_factor", float(text.get("partial_rotary_factor") or 1.0))
    if params["rope_type"] == "longrope":
        params.setdefault("original_max_position_embeddings",
                          int(text.get("original_max_position_embeddings") or text["max_position_embeddings"]))
        missing = [k for k in ("short_factor", "long_factor") if not params.get(k)]
        if missing:
            raise ValueError(f"Phi-3 LongRoPE config has no {' / '.join(missing)}")
    elif params["rope_type"] != "default":
        raise ValueError(f"Phi-3 RoPE type {kind!r}: expected default or longrope (su, yarn)")
    return params


class Phi3Loader(DecoderLoader):
    family = "phi3"
    key_rules = PHI3_FUSED_RULES + HF_DECODER_RULES

    def make_args(self, config: dict[str, Any], num_layers: int | None) -> ModelArgs:
        text = config.get("text_config") or config
        return ModelArgs.from_hf_config(config, num_layers, fuse_qkv=True, fuse_mlp=True,
                                        rope_scaling=phi3_rope_parameters(text))

    def qkv_weights(self, state: dict[str, torch.Tensor], prefix: str, args: ModelArgs) -> list[torch.Tensor]:
        q, kv = args.n_heads * args.head_dim, args.n_kv_heads * args.head_dim
        return split_rows(state[prefix + "qkv_proj.weight"], [q, kv, kv])

    def gate_up_weights(self, state: dict[str, torch.Tensor], prefix: str, args: ModelArgs) -> list[torch.Tensor]:
        return split_rows(state[prefix + "gate_up_proj.weight"], [args.hidden_dim, args.hidden_dim])
