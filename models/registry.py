# SPDX-License-Identifier: Apache-2.0
"""Which loader builds which model: by family name, or from a checkpoint's ``model_type``."""

from __future__ import annotations

import importlib
from typing import Any

FAMILY_LOADERS = {
    "llama": "models.llama:LlamaLoader",
    "mistral": "models.mistral:MistralLoader",
    "phi3": "models.phi3:Phi3Loader",
    "qwen2": "models.qwen2:Qwen2Loader",
    "qwen3": "models.qwen3:Qwen3Loader",
    "qwen3_moe": "models.qwen3:Qwen3MoeLoader",
    "gemma3": "models.gemma:Gemma3Loader",
    "gemma4": "models.gemma:Gemma4Loader",
}
MODEL_TYPES = {
    "llama": "llama",
    "mistral": "mistral",
    "phi3": "phi3",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3_moe",
    "gemma3_text": "gemma3",
    "gemma3": "gemma3",
    "gemma4_text": "gemma4",
    "gemma4": "gemma4",
}


def loader_class(family: str) -> type:
    """The loader class of a family (imported on demand: ttnn is heavy)."""
    if family not in FAMILY_LOADERS:
        raise ValueError(f"unknown family {family!r}; known: {sorted(FAMILY_LOADERS)}")
    module, name = FAMILY_LOADERS[family].split(":")
    return getattr(importlib.import_module(module), name)


def family_of(config: dict[str, Any]) -> str:
    """The family that loads a checkpoint with this ``config.json``."""
    model_type = config.get("model_type")
    if model_type not in MODEL_TYPES:
        raise ValueError(f"no loader for model_type {model_type!r}; known: {sorted(MODEL_TYPES)}")
    return MODEL_TYPES[model_type]
