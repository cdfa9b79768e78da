# SPDX-License-Identifier: Apache-2.0
"""vLLM's platform for a machine without a Tenstorrent card: the TT model interface on the host.

It tells vLLM to run :class:`~models.vllm_plugin.worker.TTHostWorker` (not a GPU worker),
shapes the scheduler to what the TT model interface serves (whole-prompt prefills, no prefix
caching, no async scheduling, no compilation or graphs) and refuses sampling options the host
sampler does not implement, with their names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import psutil
import torch
from vllm.platforms.interface import Platform, PlatformEnum

from models.vllm_plugin.architectures import MODEL_CAPABILITIES
from models.vllm_plugin.sampler import unsupported_options

if TYPE_CHECKING:
    from vllm.config import VllmConfig

WORKER_CLS = "models.vllm_plugin.worker.TTHostWorker"
DEFAULT_BLOCK_SIZE = 32


class TTHostPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name: str = "tt"
    device_type: str = "cpu"  # tensors vLLM makes for the worker live in host memory
    dispatch_key: str = "CPU"
    dist_backend: str = "gloo"
    simple_compile_backend: str = "eager"

    @property
    def supported_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float32, torch.float16]

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return "tt-host"

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return psutil.virtual_memory().total

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return False

    @classmethod
    def inference_mode(cls):
        return torch.no_grad()

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        """Host tensors need no device selection."""

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        torch.manual_seed(seed)

    @classmethod
    def import_kernels(cls) -> None:
        """The host forward is plain torch: no vLLM kernels to import."""

    @classmethod
    def check_and_update_config(cls, vllm_config: VllmConfig) -> None:
        parallel = vllm_config.parallel_config
        if parallel.world_size > 1:
            raise ValueError(f"the TT host platform runs one worker; got tensor/pipeline parallel size "
                             f"{parallel.world_size} (the mesh comes from MESH_DEVICE instead)")
        if parallel.worker_cls == "auto":
            parallel.worker_cls = WORKER_CLS
        parallel.distributed_executor_backend = "uni"

        scheduler, cache = vllm_config.scheduler_config, vllm_config.cache_config
        scheduler.async_scheduling = False
        if not MODEL_CAPABILITIES["supports_chunked_prefill"]:
            scheduler.enable_chunked_prefill = False
            if vllm_config.model_config is not None:
                scheduler.max_num_batched_tokens = max(scheduler.max_num_batched_tokens,
                                                       vllm_config.model_config.max_model_len)
        if not MODEL_CAPABILITIES["supports_prefix_caching"]:
            cache.enable_prefix_caching = False
        if not cache.user_specified_block_size:
            cache.block_size = DEFAULT_BLOCK_SIZE

        from vllm.config import CompilationMode, CUDAGraphMode

        compilation = vllm_config.compilation_config
        compilation.mode = CompilationMode.NONE
        compilation.cudagraph_mode = CUDAGraphMode.NONE
        compilation.cudagraph_capture_sizes = []

    @classmethod
    def validate_request(cls, processed_inputs: Any, params: Any) -> None:
        """Refuse, by name, what the host sampler would otherwise ignore."""
        asked = unsupported_options(params) if hasattr(params, "temperature") else ["pooling"]
        if asked:
            raise ValueError(f"the TT host platform does not support {', '.join(asked)} yet")
