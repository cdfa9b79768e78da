# SPDX-License-Identifier: Apache-2.0
"""Which TT model class serves which Hugging Face architecture (light: no torch, no ttnn, no vllm).

vLLM names out-of-tree Tenstorrent models ``TT<Arch>``; the plugin registers each by import
string, so nothing heavy is imported until a model is actually loaded.
"""

from __future__ import annotations

MODULE = "models.vllm_plugin.tt_models"
# HF architecture -> (project family, TT class name)
ARCHITECTURES: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("llama", "TTLlamaForCausalLM"),
    "Qwen3ForCausalLM": ("qwen3", "TTQwen3ForCausalLM"),
    "Qwen3MoeForCausalLM": ("qwen3_moe", "TTQwen3MoeForCausalLM"),
    "Gemma3ForCausalLM": ("gemma3", "TTGemma3ForCausalLM"),
    "Gemma4ForCausalLM": ("gemma4", "TTGemma4ForCausalLM"),
}
TT_PREFIX = "TT"
# What the host forward does and does not do: the platform shapes vLLM's scheduler from this.
MODEL_CAPABILITIES: dict[str, bool] = {
    "supports_prefix_caching": False,
    "supports_chunked_prefill": False,
    "supports_multimodal": False,
    "supports_async_decode": False,
    "host_forward": True,
}


def tt_architecture(hf_architecture: str) -> str:
    return TT_PREFIX + hf_architecture


def tt_class_path(hf_architecture: str) -> str:
    """``module:Class`` of the TT model serving ``hf_architecture`` (vLLM's lazy registration form)."""
    if hf_architecture not in ARCHITECTURES:
        raise ValueError(f"no TT model for architecture {hf_architecture!r}; supported: {sorted(ARCHITECTURES)}")
    return f"{MODULE}:{ARCHITECTURES[hf_architecture][1]}"
