# SPDX-License-Identifier: Apache-2.0
"""Qwen2 and Qwen2.5 (and their distills: QwQ, DeepSeek-R1-Distill-Qwen): the Llama layout with
q/k/v biases.

The biases are fused like their weights (column ``c`` holds the bias of exactly the heads whose
weights it holds) and stored as ``attention.bqkv``; see
:func:`~models.common.decoder.fuse_qkv_bias`. The small sizes (0.5B to 3B) tie the LM head to the
embedding, which the shared decoder already handles. Sliding-window layers follow the config's
``use_sliding_window`` / ``max_window_layers`` (:func:`~models.common.model_args.attention_layer_types`).
"""

from __future__ import annotations

from typing import Any

from models.common.decoder import DecoderLoader
from models.common.model_args import ModelArgs


class Qwen2Loader(DecoderLoader):
    family = "qwen2"

    def make_args(self, config: dict[str, Any], num_layers: int | None) -> ModelArgs:
        return ModelArgs.from_hf_config(config, num_layers, qkv_bias=True)
