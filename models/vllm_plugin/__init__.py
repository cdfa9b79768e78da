# SPDX-License-Identifier: Apache-2.0
"""vLLM plugin: serve the project's models through ``vllm.LLM`` from the warm ttnn cache.

Two entry points (``setup.py``), both inert when vLLM is not installed:

* ``vllm.platform_plugins`` -> :func:`register`: the TT host platform, for machines with no
  Tenstorrent card (on a card, tt-metal's own vLLM plugin is the platform) and no CUDA device.
* ``vllm.general_plugins`` -> :func:`register_models`: ``TT<Arch>`` model classes in vLLM's model
  registry, by import string (nothing heavy is imported until a model loads).

Importing this package imports neither vLLM nor torch.
"""

from __future__ import annotations

import importlib.util

from models.common import envs

PLATFORM_CLS = "models.vllm_plugin.platform.TTHostPlatform"


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def register() -> str | None:
    """The platform class for vLLM, or None when this machine is not the host platform's to serve."""
    envs.check_or_exit()  # a bad variable stops vLLM's start in one line, before any work
    if not vllm_available() or not envs.TT_VLLM_HOST_PLATFORM:
        return None
    from models.common.device_env import tenstorrent_card_present

    if tenstorrent_card_present():
        return None
    import torch

    if torch.cuda.is_available():
        return None
    from models.vllm_plugin.engine_exit import freeze_heap_at_exit, grant_engine_core_grace

    freeze_heap_at_exit()  # a script's exit need not scan vLLM's whole heap for cycles once more
    grant_engine_core_grace()  # a server's SIGINT/SIGTERM: the engine core exits, it is not SIGKILLed
    return PLATFORM_CLS


def register_models() -> None:
    """Register ``TT<Arch>`` for every supported architecture not registered already."""
    if not vllm_available():
        return
    from vllm import ModelRegistry

    from models.vllm_plugin.architectures import ARCHITECTURES, tt_architecture, tt_class_path

    known = ModelRegistry.get_supported_archs()
    for arch in ARCHITECTURES:
        if tt_architecture(arch) not in known:
            ModelRegistry.register_model(tt_architecture(arch), tt_class_path(arch))
