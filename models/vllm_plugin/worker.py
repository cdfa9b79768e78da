# SPDX-License-Identifier: Apache-2.0
"""vLLM's worker on the TT host platform: what vLLM 0.33's engine core calls, handed to the runner."""

from __future__ import annotations

import time
from typing import Any

import torch
from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.worker.worker_base import CompilationTimes, WorkerBase

from models.common import envs
from models.vllm_plugin.engine_exit import install_signal_forwarding
from models.vllm_plugin.model_runner import TTHostModelRunner

KV_CACHE_LAYOUT = "NHD"
THREADS_ENV = "TT_HOST_THREADS"


class TTHostWorker(WorkerBase):
    model_runner: TTHostModelRunner

    def init_device(self) -> None:
        self.device = torch.device("cpu")
        # In vLLM's engine-core process (this is its main thread): a shutdown SIGTERM taken by
        # another thread must still reach vLLM's handler, or the engine is SIGKILLed 5 s later.
        self.signal_forwarder = install_signal_forwarding()
        # One thread unless told otherwise: on a shared host, torch's OpenMP threads spin against
        # each other and small decode steps get many times slower.
        torch.set_num_threads(envs.TT_HOST_THREADS)
        if self.model_config.seed is not None:
            torch.manual_seed(self.model_config.seed)
        self.model_runner = TTHostModelRunner(self.vllm_config)

    def load_model(self, *, load_dummy_weights: bool = False) -> None:
        if load_dummy_weights:
            raise ValueError("the TT host worker loads real weights only (from the ttnn cache or the checkpoint)")
        self.model_runner.load_model()

    def get_model(self) -> Any:
        return self.model_runner.model

    def get_supported_tasks(self) -> tuple[str, ...]:
        return ("generate",)

    def get_kv_cache_spec(self) -> dict[str, KVCacheSpec]:
        return self.model_runner.kv_cache_spec()

    def get_supported_kv_cache_layouts(self) -> list[str]:
        return [KV_CACHE_LAYOUT]

    def determine_available_memory(self) -> int:
        return self.model_runner.available_kv_bytes()

    def initialize_from_config(self, kv_cache_config: KVCacheConfig) -> None:
        self.cache_config.num_gpu_blocks = kv_cache_config.num_blocks
        self.model_runner.initialize_kv_cache(kv_cache_config)

    def compile_or_warm_up_model(self) -> CompilationTimes:
        start = time.perf_counter()
        self.model_runner.warm_up()
        self.model_runner.timings["warm_up"] = time.perf_counter() - start
        return CompilationTimes(language_model=0.0, encoder=0.0)

    def update_max_model_len(self, max_model_len: int) -> None:
        self.model_config.max_model_len = max_model_len

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.model_runner.execute_model(scheduler_output)

    def sample_tokens(self, grammar_output: GrammarOutput | None) -> ModelRunnerOutput:
        raise RuntimeError("the TT host worker samples inside execute_model; structured outputs are not supported")

    def startup_report(self) -> dict[str, Any]:
        """The model's startup facts plus the runner's own timings (for ``LLM.collective_rpc``)."""
        report = self.model_runner.model.startup_report()
        report.update({f"runner_{k}_seconds": v for k, v in self.model_runner.timings.items()})
        return report

    def runner_stats(self) -> dict[str, Any]:
        """The runner's counters (prompt tokens computed and found in the prefix cache, prefill
        chunks, steps) and whether shutdown signals are forwarded (for ``LLM.collective_rpc``)."""
        stats = dict(vars(self.model_runner.stats))
        stats["signal_forwarding"] = self.signal_forwarder is not None
        return stats

    def check_health(self) -> None:
        return

    def get_cache_block_size_bytes(self) -> int:
        spec = next(iter(self.get_kv_cache_spec().values()))
        return spec.page_size_bytes * len(self.get_kv_cache_spec())
