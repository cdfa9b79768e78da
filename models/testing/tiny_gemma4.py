# SPDX-License-Identifier: Apache-2.0
"""Tiny random-weight Gemma 4 checkpoints (text variants, text + vision), made with transformers' own classes.

Three text variants, each with per-layer input embeddings on: KV-shared layers (with the double-wide
MLP), ``attention_k_eq_v`` (one KV head on the wider global layers), and the MoE block; plus a
text + vision checkpoint (``Gemma4ForConditionalGeneration``)."""

from __future__ import annotations

from pathlib import Path

import torch

LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
TINY_TEXT = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, global_head_dim=64, sliding_window=4, layer_types=LAYER_TYPES,
                 vocab_size_per_layer_input=512, hidden_size_per_layer_input=32, max_position_embeddings=256,
                 final_logit_softcapping=30.0)
VARIANTS = {
    "kv_shared": dict(num_kv_shared_layers=2, use_double_wide_mlp=True),
    "k_eq_v": dict(attention_k_eq_v=True, num_global_key_value_heads=1),
    "moe": dict(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=64),
}
TINY_VISION = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                   num_key_value_heads=2, head_dim=32, pooling_kernel_size=2, patch_size=4, position_embedding_size=32,
                   use_clipped_linears=True, standardize=True)
VISION_LINEARS = ["attention.wq", "attention.wk", "attention.wv", "attention.wo",
                  "feed_forward.w1", "feed_forward.w2", "feed_forward.w3"]
CLIP_BOUNDS = ["input_min", "input_max", "output_min", "output_max"]


def randomize(model: torch.nn.Module) -> None:
    """Larger-than-default random weights, norms and scalars off their init value, finite clip
    bounds: so every weight (and every misplaced one) shows in the logits or the sidecar."""
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if not tensor.dtype.is_floating_point:
                continue
            if tensor.dim() >= 2:
                tensor.normal_(0.0, 0.08)
            elif tensor.dim() == 0:  # clipped linears' bounds
                tensor.fill_((-1 if name.endswith("_min") else 1) * (8.0 + torch.rand(()).item()))
            elif tensor.numel() == 1:  # layer scalars: clearly off 1, also in bf16
                tensor.uniform_(0.5, 1.5)
            else:
                tensor.add_(torch.randn_like(tensor) * 0.1)


def save(model: torch.nn.Module, directory: Path) -> Path:
    randomize(model)
    model.to(torch.bfloat16).save_pretrained(directory)
    return directory


def make_text_checkpoint(directory: Path, variant: str, seed: int = 0) -> Path:
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    torch.manual_seed(seed)
    return save(Gemma4ForCausalLM(Gemma4TextConfig(**TINY_TEXT, **VARIANTS[variant])), directory)


def make_multimodal_checkpoint(directory: Path, seed: int = 0) -> Path:
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration, Gemma4TextConfig, Gemma4VisionConfig

    torch.manual_seed(seed)
    text = Gemma4TextConfig(**TINY_TEXT, **VARIANTS["kv_shared"])
    config = Gemma4Config(text_config=text, vision_config=Gemma4VisionConfig(**TINY_VISION), audio_config=None)
    return save(Gemma4ForConditionalGeneration(config), directory)
