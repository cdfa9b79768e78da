# SPDX-License-Identifier: Apache-2.0
"""The one family table: which loader builds which model, chosen by a checkpoint's ``model_type``
or its Hugging Face causal-LM architecture.

Everything else (``tt-cache``, seeding, the vLLM plugin's ``TT<Arch>`` classes) derives its lists
from :data:`FAMILIES`, so a family added here is served everywhere. Importing this module imports
nothing heavy (no torch, no ttnn): loaders are imported on demand. A family's tensor groups are
the precision policy groups its loader's weights fall in (:mod:`models.common.precision`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
import os
from typing import Any

from models.common.precision import PrecisionPolicy, model_facts, resolve_policy, uniform_policy


@dataclass(frozen=True)
class Family:
    """One family: its loader (``module:Class``), the ``model_type`` values of its configs, the
    HF causal-LM architectures (``config.architectures``) of its text models, the components a
    build may hold, and its layout version (bump it when the loader lays weights out otherwise:
    every existing cache of the family then reads as cold)."""

    name: str
    loader: str
    model_types: tuple[str, ...]  # (``tensor_groups``: the precision policy groups its weights are in)
    architectures: tuple[str, ...]
    components: tuple[str, ...] = ("text",)
    layout_version: int = 1
    tensor_groups: tuple[str, ...] = ("wqkv", "wo", "ff1_ff3", "ff2", "lm_head")

    def build_variant(self, precision: str | PrecisionPolicy) -> dict[str, Any]:
        """The options that decide which files a build writes (matched exactly by the gate, with
        the rest of the variant's identity: :mod:`models.common.weight_cache.variant`): a dtype
        (every group in it) or a precision policy (:mod:`models.common.precision`)."""
        from models.common.weight_cache.variant import family_variant

        policy = uniform_policy(precision, self.name, self.tensor_groups) if isinstance(precision, str) else precision
        return family_variant(self.name, policy.label, self.layout_version,
                              None if policy.uniform else policy.canonical())

    def policy(self, precision: str | os.PathLike | PrecisionPolicy, model: str | os.PathLike) -> PrecisionPolicy:
        """The precision policy ``precision`` names (a dtype, ``performance``/``accuracy``, a policy
        file) for ``model`` (HF id, checkpoint dir or snapshot) of this family: keyed by its name,
        folded over its decoders (:func:`models.common.precision.resolve_policy`; a bad one is a
        :class:`~models.common.precision.PolicyError`, a decoder it lacks included)."""
        name, decoders = model_facts(model)
        return resolve_policy(precision, self.name, self.tensor_groups, name, decoders)

    def default_components(self, config: dict[str, Any]) -> tuple[str, ...]:
        """What a build holds when none are named: every component the checkpoint has (a text-only
        checkpoint of a multimodal family has no vision tower)."""
        return tuple(c for c in self.components if c != "vision" or config.get("vision_config"))


FAMILIES: tuple[Family, ...] = (
    Family("llama", "models.llama:LlamaLoader", ("llama",), ("LlamaForCausalLM",)),
    Family("mistral", "models.mistral:MistralLoader", ("mistral",), ("MistralForCausalLM",)),
    Family("phi3", "models.phi3:Phi3Loader", ("phi3",), ("Phi3ForCausalLM",)),
    Family("qwen2", "models.qwen2:Qwen2Loader", ("qwen2",), ("Qwen2ForCausalLM",)),
    Family("qwen3", "models.qwen3:Qwen3Loader", ("qwen3",), ("Qwen3ForCausalLM",)),
    Family("qwen3_moe", "models.qwen3:Qwen3MoeLoader", ("qwen3_moe",), ("Qwen3MoeForCausalLM",)),
    Family("gemma3", "models.gemma:Gemma3Loader", ("gemma3_text", "gemma3"), ("Gemma3ForCausalLM",)),
    Family("gemma4", "models.gemma:Gemma4Loader", ("gemma4_text", "gemma4"), ("Gemma4ForCausalLM",),
           components=("text", "vision"),
           tensor_groups=("wqkv", "wo", "ff1_ff3", "ff2", "lm_head", "per_layer_input", "vision")),
)

FAMILY_LOADERS: dict[str, str] = {f.name: f.loader for f in FAMILIES}
MODEL_TYPES: dict[str, str] = {model_type: f.name for f in FAMILIES for model_type in f.model_types}
ARCHITECTURES: dict[str, str] = {arch: f.name for f in FAMILIES for arch in f.architectures}


def family_facts(family: str) -> Family:
    """The table's entry for a family name."""
    for entry in FAMILIES:
        if entry.name == family:
            return entry
    raise ValueError(f"unknown family {family!r}; known: {sorted(FAMILY_LOADERS)}")


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
