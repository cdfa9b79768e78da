# SPDX-License-Identifier: Apache-2.0
"""The one family table: which loader builds which model, chosen by a checkpoint's ``model_type``
or its Hugging Face causal-LM architecture.

Everything else (``tt-cache``, seeding, the vLLM plugin's ``TT<Arch>`` classes) derives its lists
from :data:`FAMILIES`, so a family added here is served everywhere. Importing this module imports
nothing heavy (no torch, no ttnn): loaders are imported on demand.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Family:
    """One family: its loader (``module:Class``), the ``model_type`` values of its configs and the
    HF causal-LM architectures (``config.architectures``) of its text models."""

    name: str
    loader: str
    model_types: tuple[str, ...]
    architectures: tuple[str, ...]


FAMILIES: tuple[Family, ...] = (
    Family("llama", "models.llama:LlamaLoader", ("llama",), ("LlamaForCausalLM",)),
    Family("mistral", "models.mistral:MistralLoader", ("mistral",), ("MistralForCausalLM",)),
    Family("phi3", "models.phi3:Phi3Loader", ("phi3",), ("Phi3ForCausalLM",)),
    Family("qwen2", "models.qwen2:Qwen2Loader", ("qwen2",), ("Qwen2ForCausalLM",)),
    Family("qwen3", "models.qwen3:Qwen3Loader", ("qwen3",), ("Qwen3ForCausalLM",)),
    Family("qwen3_moe", "models.qwen3:Qwen3MoeLoader", ("qwen3_moe",), ("Qwen3MoeForCausalLM",)),
    Family("gemma3", "models.gemma:Gemma3Loader", ("gemma3_text", "gemma3"), ("Gemma3ForCausalLM",)),
    Family("gemma4", "models.gemma:Gemma4Loader", ("gemma4_text", "gemma4"), ("Gemma4ForCausalLM",)),
)

FAMILY_LOADERS: dict[str, str] = {f.name: f.loader for f in FAMILIES}
MODEL_TYPES: dict[str, str] = {model_type: f.name for f in FAMILIES for model_type in f.model_types}
ARCHITECTURES: dict[str, str] = {arch: f.name for f in FAMILIES for arch in f.architectures}


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


def family_of_architecture(architecture: str) -> str:
    """The family whose text model a Hugging Face architecture name is."""
    if architecture not in ARCHITECTURES:
        raise ValueError(f"no family for architecture {architecture!r}; known: {sorted(ARCHITECTURES)}")
    return ARCHITECTURES[architecture]
