# SPDX-License-Identifier: Apache-2.0
"""What a loader needs to know about a decoder model, read from its HF ``config.json``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ModelArgs:
    """Architecture facts of a decoder-only model (HF config names mapped to tt-metal's).

    ``n_layers`` is what this build constructs (a ``num_layers`` override for quick tests);
    ``full_n_layers`` is the checkpoint's depth."""

    model_type: str
    dim: int
    n_layers: int
    full_n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    hidden_dim: int
    norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    qk_norm: bool = False
    is_mixture_of_experts: bool = False
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_hidden_dim: int = 0
    norm_topk_prob: bool = True
    moe_layers: tuple[int, ...] = ()
    fuse_qkv: bool = True
    fuse_mlp: bool = False
    qkv_bias: bool = False
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()
    config: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_hf_config(cls, config: dict[str, Any], num_layers: int | None = None, **overrides: Any) -> ModelArgs:
        text = config.get("text_config") or config
        full = int(text["num_hidden_layers"])
        n_heads = int(text["num_attention_heads"])
        dim = int(text["hidden_size"])
        args = cls(
            model_type=str(text.get("model_type") or config.get("model_type")),
            dim=dim,
            n_layers=full if num_layers is None else min(int(num_layers), full),
            full_n_layers=full,
            n_heads=n_heads,
            n_kv_heads=int(text.get("num_key_value_heads") or n_heads),
            head_dim=int(text.get("head_dim") or dim // n_heads),
            vocab_size=int(text["vocab_size"]),
            hidden_dim=int(text.get("intermediate_size") or 0),
            norm_eps=float(text.get("rms_norm_eps", 1e-6)),
            rope_theta=float(text.get("rope_theta") or (text.get("rope_parameters") or {}).get("rope_theta", 10000.0)),
            rope_scaling=text.get("rope_scaling") or text.get("rope_parameters"),
            max_position_embeddings=int(text.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
            sliding_window=int(text["sliding_window"]) if text.get("sliding_window") else None,
            layer_types=attention_layer_types(text, full),
            config=config,
        )
        for name, value in overrides.items():
            setattr(args, name, value)
        return args

    def layer_type(self, layer: int) -> str:
        """``"sliding_attention"`` or ``"full_attention"``: how layer ``layer`` masks its keys."""
        return self.layer_types[layer] if self.layer_types else "full_attention"

    @property
    def partial(self) -> bool:
        """A ``num_layers`` build: never certifies the cache as complete."""
        return self.n_layers != self.full_n_layers


def attention_layer_types(text: dict[str, Any], n_layers: int) -> tuple[str, ...]:
    """Each layer's attention kind, by the HF conventions: ``layer_types`` when the config lists
    them; else, with ``use_sliding_window`` (Qwen2/Qwen3 configs), sliding from layer
    ``max_window_layers`` on when it is true; else (Mistral, Phi-3) every layer slides when a
    ``sliding_window`` is set."""
    if text.get("layer_types"):
        return tuple(text["layer_types"])
    window = text.get("sliding_window")
    if "use_sliding_window" in text:
        first = int(text.get("max_window_layers") or 0) if text["use_sliding_window"] and window else n_layers
    else:
        first = 0 if window else n_layers
    return tuple("sliding_attention" if i >= first else "full_attention" for i in range(n_layers))
