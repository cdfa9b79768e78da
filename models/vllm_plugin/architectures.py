# SPDX-License-Identifier: Apache-2.0
"""Which TT model class serves which Hugging Face architecture (light: no torch, no ttnn, no vllm).

The architectures come from the project's one family table (:data:`models.registry.ARCHITECTURES`):
every family's text model is served. vLLM names out-of-tree Tenstorrent models ``TT<Arch>``; the
plugin registers each by import string, so nothing heavy is imported until a model is loaded.
"""

from __future__ import annotations

from models.registry import ARCHITECTURES, family_of_architecture

MODULE = "models.vllm_plugin.tt_models"
TT_PREFIX = "TT"
# What the host forward does and does not do: the platform shapes vLLM's scheduler from this.
MODEL_CAPABILITIES: dict[str, bool] = {
    "supports_prefix_caching": True,
    "supports_chunked_prefill": True,
    "supports_multimodal": False,
    "supports_async_decode": False,
    "host_forward": True,
}

__all__ = ["ARCHITECTURES", "MODEL_CAPABILITIES", "tt_architecture", "tt_class_path", "family_of_architecture"]


def tt_architecture(hf_architecture: str) -> str:
    return TT_PREFIX + hf_architecture


def tt_class_path(hf_architecture: str) -> str:
    """``module:Class`` of the TT model serving ``hf_architecture`` (vLLM's lazy registration form)."""
    if hf_architecture not in ARCHITECTURES:
        raise ValueError(f"no TT model for architecture {hf_architecture!r}; supported: {sorted(ARCHITECTURES)}")
    return f"{MODULE}:{tt_architecture(hf_architecture)}"
