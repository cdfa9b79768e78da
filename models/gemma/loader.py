# SPDX-License-Identifier: Apache-2.0
"""Gemma 3 text: the Llama layout plus Gemma's differences.

* Four norms per layer (input, post-attention, pre-FFN, post-FFN) and q/k norms, all scaling by
  ``1 + w``: the one is folded into the stored weight, so the device norm is a plain RMSNorm.
  The sum is kept in fp32 (exact for a bf16 ``w``; rounding it to bf16 flips greedy tokens).
* The token embedding is consumed on the host (an embedding lookup before the device graph):
  it is a *host weight*, kept real in warm builds through the safetensors sidecar, and not
  converted to a tensorbin. The LM head (tied to it) is converted as usual.

Everything else is :class:`~models.common.decoder.DecoderLoader`'s.
"""

from __future__ import annotations

from typing import Any

import torch
import ttnn

from models.common.checkpoint import KeyRule
from models.common.decoder import HF_DECODER_RULES, DecoderLoader, norm_for_device
from models.common.mesh import REPLICATED
from models.common.model_args import ModelArgs
from models.common.weight_cache.tensor_cache import TensorFormat
from models.common.weight_cache.placeholders import fp32_elementwise

GEMMA_NORM_RULES = (
    KeyRule(r"^model\.layers\.(\d+)\.post_attention_layernorm\.weight$", r"layers.\1.post_attention_norm.weight"),
    KeyRule(r"^model\.layers\.(\d+)\.pre_feedforward_layernorm\.weight$", r"layers.\1.ffn_norm.weight"),
    KeyRule(r"^model\.layers\.(\d+)\.post_feedforward_layernorm\.weight$", r"layers.\1.post_ffn_norm.weight"),
)
HOST_EMBEDDING = "tok_embeddings.weight"


def gemma_norm(weight: torch.Tensor) -> torch.Tensor:
    """Gemma's ``x_normed * (1 + w)`` as a plain RMSNorm weight, the sum taken in fp32."""
    return norm_for_device(fp32_elementwise(weight, lambda w: w + 1.0))


GEMMA_NORM_FORMAT = TensorFormat(ttnn.float32, ttnn.ROW_MAJOR_LAYOUT, REPLICATED)


class Gemma3Loader(DecoderLoader):
    family = "gemma3"
    key_rules = GEMMA_NORM_RULES + HF_DECODER_RULES
    layer_norms = ("attention_norm", "post_attention_norm", "ffn_norm", "post_ffn_norm")
    norm_format = GEMMA_NORM_FORMAT

    def make_args(self, config: dict[str, Any], num_layers: int | None) -> ModelArgs:
        return ModelArgs.from_hf_config(config, num_layers, qk_norm=True)

    def norm(self, weight: torch.Tensor) -> torch.Tensor:
        return gemma_norm(weight)

    def is_host_weight(self, key: str) -> bool:
        return key == HOST_EMBEDDING
