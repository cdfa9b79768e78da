# SPDX-License-Identifier: Apache-2.0
"""What a loader needs to know about a decoder model, read from its HF ``config.json``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

_MAX_COUNT = 1 << 31  # layers, heads, widths, vocabularies, positions: far below


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
        check_config(config)
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


class ConfigFieldError(ValueError):
    """A ``config.json`` field has a value no model has; the message names the field."""


def _count(text: dict[str, Any], name: str, low: int = 1) -> int | None:
    """The whole number ``text[name]`` in ``[low, 2**31]``, None when absent or null; else raise."""
    value = text.get(name)
    if value is None:
        return None
    whole = type(value) is int or (type(value) is float and math.isfinite(value) and value.is_integer())
    if not whole or not low <= value <= _MAX_COUNT:
        raise ConfigFieldError(f"field {name!r} is {value!r}: expected a whole number from {low} to {_MAX_COUNT:,}")
    return int(value)


def check_config(config: Any) -> None:
    """Refuse a ``config.json`` whose architecture fields no model has, naming the field: before
    any arithmetic on them (a zero head count, a vocabulary of 1e400, heads not in whole KV groups
    would otherwise fail deep in a build as an unexplained error). A missing required field is left
    to the reader, which names it as missing."""
    if not isinstance(config, dict):
        raise ConfigFieldError("config is not a JSON object")
    text = config.get("text_config") or config
    if not isinstance(text, dict):
        raise ConfigFieldError(f"field 'text_config' is {text!r}: expected an object")
    for name in ("num_hidden_layers", "num_attention_heads", "hidden_size", "vocab_size", "head_dim",
                 "max_position_embeddings"):
        _count(text, name)
    for name in ("num_key_value_heads", "intermediate_size", "sliding_window", "max_window_layers"):  # 0: none or as heads
        _count(text, name, low=0)
    heads, kv_heads = _count(text, "num_attention_heads"), _count(text, "num_key_value_heads")
    if heads is not None and kv_heads and heads % kv_heads:
        raise ConfigFieldError(f"field 'num_key_value_heads' is {kv_heads}: the {heads} attention heads "
                               f"(num_attention_heads) do not split into groups of that many")
    for name in ("rope_scaling", "rope_parameters"):
        if text.get(name) is not None and not isinstance(text[name], dict):
            raise ConfigFieldError(f"field {name!r} is {text[name]!r}: expected an object")
    theta = text.get("rope_theta")
    if theta is None and isinstance(text.get("rope_parameters"), dict):
        theta = text["rope_parameters"].get("rope_theta")
    for name, value in (("rope_theta", theta), ("rms_norm_eps", text.get("rms_norm_eps"))):
        if value is not None and not (type(value) in (int, float) and math.isfinite(value) and value > 0):
            raise ConfigFieldError(f"field {name!r} is {value!r}: expected a positive finite number")
    layer_types = text.get("layer_types")
    if layer_types is not None and not (isinstance(layer_types, list) and all(isinstance(t, str) for t in layer_types)):
        raise ConfigFieldError(f"field 'layer_types' is {layer_types!r}: expected a list of strings")
