# SPDX-License-Identifier: Apache-2.0
"""Qwen3 dense (per-head q/k RMSNorm) and Qwen3 MoE (router + experts on the sparse layers)."""

from __future__ import annotations

from typing import Any

from models.common.decoder import DecoderLoader
from models.common.model_args import ModelArgs


class Qwen3Loader(DecoderLoader):
    family = "qwen3"

    def make_args(self, config: dict[str, Any], num_layers: int | None) -> ModelArgs:
        return ModelArgs.from_hf_config(config, num_layers, qk_norm=True)


def sparse_layers(config: dict[str, Any], n_layers: int) -> tuple[int, ...]:
    """Layers with an MoE block: every ``decoder_sparse_step``-th, minus ``mlp_only_layers``."""
    step = int(config.get("decoder_sparse_step") or 1)
    dense = set(config.get("mlp_only_layers") or [])
    return tuple(i for i in range(n_layers) if i not in dense and (i + 1) % step == 0)


class Qwen3MoeLoader(Qwen3Loader):
    family = "qwen3_moe"

    def make_args(self, config: dict[str, Any], num_layers: int | None) -> ModelArgs:
        args = super().make_args(config, num_layers)
        args.is_mixture_of_experts = True
        args.num_experts = int(config.get("num_local_experts") or config["num_experts"])
        args.num_experts_per_tok = int(config["num_experts_per_tok"])
        args.moe_hidden_dim = int(config["moe_intermediate_size"])
        args.norm_topk_prob = bool(config.get("norm_topk_prob", True))
        args.moe_layers = sparse_layers(config, args.n_layers)
        return args
