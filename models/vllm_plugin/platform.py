# SPDX-License-Identifier: Apache-2.0
"""vLLM's platform for a machine without a Tenstorrent card: the TT model interface on the host.

It tells vLLM to run :class:`~models.vllm_plugin.worker.TTHostWorker` (not a GPU worker), keeps
vLLM's defaults for the scheduler (chunked prefill, prefix caching) but not what the host runner
cannot do (async scheduling, compilation, graphs), turns away at start-up the engine features the
runner does not implement (LoRA, speculative decoding, KV connectors, ...), and refuses, by name and
before a request reaches the engine, every request field the runner does not serve
(:mod:`models.vllm_plugin.request_fields`).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import TYPE_CHECKING, Any

import psutil
import torch
from loguru import logger
from vllm.exceptions import VLLMValidationError
from vllm.platforms.interface import Platform, PlatformEnum

from models.vllm_plugin.architectures import MODEL_CAPABILITIES
from models.vllm_plugin.engine_exit import quiet_engine_dead_at_shutdown
from models.vllm_plugin.options import plugin_options
from models.vllm_plugin.request_fields import ENGINE_INPUT_KEYS, REFUSED, SAMPLING_PARAMS

if TYPE_CHECKING:
    from vllm.config import VllmConfig

WORKER_CLS = "models.vllm_plugin.worker.TTHostWorker"
DEFAULT_BLOCK_SIZE = 32
INPUT_TYPES = {"embeds": "prompt_embeds", "multimodal": "multimodal inputs", "enc_dec": "encoder-decoder prompts"}


class TTHostPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name: str = "tt"
    device_type: str = "cpu"  # tensors vLLM makes for the worker live in host memory
    dispatch_key: str = "CPU"
    dist_backend: str = "gloo"
    simple_compile_backend: str = "eager"
    # bad_words are tokenized by vLLM's frontend; without a tokenizer vLLM would drop them silently.
    tokenizer_present: bool = True

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
        unsupported = unsupported_features(vllm_config)
        if unsupported:
            raise ValueError(f"the TT host platform does not support {', '.join(unsupported)}")
        plugin_options(vllm_config.additional_config)  # a bad option stops the start here, by name
        parallel = vllm_config.parallel_config
        if parallel.worker_cls == "auto":
            parallel.worker_cls = WORKER_CLS
        parallel.distributed_executor_backend = "uni"

        scheduler, cache_config = vllm_config.scheduler_config, vllm_config.cache_config
        scheduler.async_scheduling = False
        if not MODEL_CAPABILITIES["supports_chunked_prefill"]:
            scheduler.enable_chunked_prefill = False
        model = vllm_config.model_config
        if not MODEL_CAPABILITIES["supports_prefix_caching"]:
            cache_config.enable_prefix_caching = False
        elif model is not None and cache_config.enable_prefix_caching and uses_longrope(model.hf_config):
            # A LongRoPE key depends on how long its sequence grows, not on its prefix alone.
            logger.info("prefix caching off: LongRoPE keys depend on the sequence length, so pages are not shared")
            cache_config.enable_prefix_caching = False
        if not cache_config.user_specified_block_size:
            cache_config.block_size = DEFAULT_BLOCK_SIZE
        if model is not None:
            cls.tokenizer_present = not model.skip_tokenizer_init
            if model.enable_prompt_embeds:
                logger.warning("enable_prompt_embeds=True: the TT host platform refuses every prompt_embeds request")

        from vllm.config import CompilationMode, CUDAGraphMode

        compilation = vllm_config.compilation_config
        compilation.mode = CompilationMode.NONE
        compilation.cudagraph_mode = CUDAGraphMode.NONE
        compilation.cudagraph_capture_sizes = []
        refuse_before_vllm_checks()
        quiet_engine_dead_at_shutdown()

    @classmethod
    def validate_request(cls, processed_inputs: Any, params: Any) -> None:
        """Refuse, by name, what the host runner would otherwise drop or die on."""
        asked = unsupported_input(processed_inputs)
        asked += unsupported_options(params, cls.tokenizer_present) if hasattr(params, "temperature") else ["pooling"]
        if asked:
            raise RefusedRequest(asked)


class RefusedRequest(VLLMValidationError, ValueError):
    """A request that sets what the host runner does not serve, naming the fields: vLLM's OpenAI
    server answers it with HTTP 400 and the first field as ``param``; offline it is a ValueError."""

    def __init__(self, asked: list[str]) -> None:
        super().__init__(f"the TT host platform does not support {', '.join(asked)}", parameter=asked[0])


def refuse_before_vllm_checks() -> None:
    """Run the platform's refusal of sampling fields before vLLM's own ``SamplingParams.verify``.

    vLLM validates the params (``InputProcessor._validate_params``) before it asks the platform,
    and for structured outputs with a tokenizer that validation compiles the grammar with its
    backends; here that raised an exception with no message, which the OpenAI server turned into
    HTTP 500 with an empty message (``response_format: json_object``). Refused first, every field
    the platform refuses is a 400 naming it, the same in the server as offline. Idempotent."""
    from vllm.v1.engine.input_processor import InputProcessor

    original = InputProcessor._validate_params
    if getattr(original, "tt_refuses_first", False):
        return

    def _validate_params(self, params: Any, *args: Any, **kwargs: Any) -> Any:
        if hasattr(params, "temperature"):
            asked = unsupported_options(params, TTHostPlatform.tokenizer_present)
            if asked:
                raise RefusedRequest(asked)
        return original(self, params, *args, **kwargs)

    _validate_params.tt_refuses_first = True
    InputProcessor._validate_params = _validate_params


def unsupported_features(config: VllmConfig) -> list[str]:
    """Engine features the host runner does not implement (a request could not opt out of them)."""
    model, parallel = config.model_config, config.parallel_config
    checks = {
        f"tensor/pipeline parallel size {parallel.world_size} (the mesh comes from MESH_DEVICE)": parallel.world_size > 1,
        f"data_parallel_size={parallel.data_parallel_size}": parallel.data_parallel_size > 1,
        "LoRA (enable_lora)": config.lora_config is not None,
        "speculative decoding (speculative_config)": config.speculative_config is not None,
        "watermarking (watermark_config)": getattr(config, "watermark_config", None) is not None,
        "KV transfer (kv_transfer_config)": config.kv_transfer_config is not None,
        "encoder cache transfer (ec_transfer_config)": getattr(config, "ec_transfer_config", None) is not None,
        f"kv_cache_dtype={config.cache_config.cache_dtype!r} (the host KV cache is fp32)":
            str(config.cache_config.cache_dtype) != "auto",
    }
    if model is not None:
        checks |= {
            "custom logits processors (logits_processors)": bool(getattr(model, "logits_processors", None)),
            "trace replay (enable_trace_replay)": bool(getattr(model, "enable_trace_replay", False)),
            "sampling masks (return_sampling_mask)": bool(getattr(model, "return_sampling_mask", False)),
        }
    aux = getattr(config, "aux_output_config", None)
    checks["routed-expert outputs (enable_return_routed_experts)"] = bool(
        getattr(aux, "enable_return_routed_experts", False))
    return [name for name, asked in checks.items() if asked]


def uses_longrope(hf_config: Any) -> bool:
    """Whether a checkpoint's RoPE is LongRoPE (Phi-3), in any of the config's spellings."""
    text = getattr(hf_config, "text_config", None) or hf_config
    for name in ("rope_parameters", "rope_scaling"):
        params = getattr(text, name, None)
        if isinstance(params, Mapping):
            kinds = [params] + [v for v in params.values() if isinstance(v, Mapping)]
            if any((kind.get("rope_type") or kind.get("type")) == "longrope" for kind in kinds):
                return True
    return False


def unsupported_input(processed_inputs: Any) -> list[str]:
    """What a rendered input asks for beyond token prompts: embeddings, multimodal data, an
    encoder prompt, or a key this vLLM added that the field table does not know."""
    if not isinstance(processed_inputs, Mapping):
        return []
    kind = processed_inputs.get("type", "token")
    if kind != "token":
        return [INPUT_TYPES.get(kind, f"{kind!r} inputs")]
    return [f"input field {key!r}" for key in processed_inputs
            if key not in ENGINE_INPUT_KEYS or ENGINE_INPUT_KEYS[key].handling == REFUSED]


def unsupported_options(params: Any, tokenizer_present: bool = True) -> list[str]:
    """The ``SamplingParams`` fields ``params`` sets that the host runner does not serve: those
    the table refuses, and any field the table does not know that differs from its default."""
    defaults = _defaults(type(params))
    asked = []
    for name in getattr(type(params), "__struct_fields__", ()):
        rule = SAMPLING_PARAMS.get(name)
        if (rule is None or rule.handling == REFUSED) and not _unset(getattr(params, name, None), defaults.get(name)):
            asked.append(name)
    if getattr(params, "bad_words", None) and not tokenizer_present:
        asked.append("bad_words without a tokenizer (skip_tokenizer_init=True)")
    return asked


@cache
def _defaults(params_type: type) -> dict[str, Any]:
    fields = getattr(params_type, "__struct_fields__", ())
    try:
        default = params_type()
    except Exception:  # not constructible without arguments: compare against None only
        return {}
    return {name: getattr(default, name, None) for name in fields}


def _unset(value: Any, default: Any) -> bool:
    if value is None or value is False:
        return True
    if isinstance(value, (list, tuple, dict, set)) and len(value) == 0:
        return True
    try:
        return bool(value == default)
    except (TypeError, ValueError):  # e.g. an array compared elementwise
        return False
