# SPDX-License-Identifier: Apache-2.0
"""The model runner: vLLM's scheduler output in, the TT model interface called, tokens out.

It keeps each running request's tokens and pages, turns a scheduler step into one
``prefill_forward`` (new prompts, prompt chunks, prompts whose prefix vLLM found in the prefix
cache) and one ``decode_forward`` (the running requests), samples each request's next token on
the host and reports it, with its logprobs and prompt logprobs when asked for, as vLLM's
``ModelRunnerOutput``. Shared prefix pages need nothing here: vLLM's KV cache manager hands a
request the blocks another request already filled (by block hash) and schedules only the rest.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psutil
import torch
from loguru import logger
from vllm.config import VllmConfig
from vllm.model_executor.models.registry import ModelRegistry
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheSpec
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, LogprobsLists, LogprobsTensors, ModelRunnerOutput

from models.vllm_plugin.architectures import tt_architecture
from models.vllm_plugin.options import plugin_options
from models.vllm_plugin.sampler import TokenLogprobs, prompt_logprobs, sample, scores, seeded_generator

KV_DTYPE = torch.float32  # the host forward computes, and caches, in fp32
HOST_KV_FRACTION = 0.2  # of the available host memory, at most, unless kv_cache_memory_bytes says otherwise


@dataclass
class RequestState:
    """What the runner keeps of a running request between steps."""

    token_ids: list[int]  # prompt, then every token sampled so far
    num_prompt_tokens: int
    block_ids: list[int]
    num_computed_tokens: int
    params: Any  # SamplingParams
    generator: torch.Generator | None
    # prompt logprobs: one entry per prompt position 0..len-2, filled chunk by chunk, sent once
    prompt_rows: list[TokenLogprobs | None] = field(default_factory=list)
    prompt_logprobs_sent: bool = False

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def wants_prompt_logprobs(self) -> bool:
        return self.params.prompt_logprobs is not None and not self.prompt_logprobs_sent


@dataclass
class Scheduled:
    """One request's work in this step."""

    req_id: str
    state: RequestState
    start: int
    count: int

    @property
    def is_decode(self) -> bool:
        return self.count == 1 and self.start >= self.state.num_prompt_tokens

    @property
    def completes_prompt(self) -> bool:
        """False for a partial prefill, whose logits sample nothing."""
        return self.start + self.count >= len(self.state.token_ids)


@dataclass
class RunnerStats:
    """Counters the tests and benchmarks read (``collective_rpc("runner_stats")``)."""

    prompt_tokens_computed: int = 0  # prompt positions run through the model
    prompt_tokens_cached: int = 0  # prompt positions a new request found in the prefix cache
    partial_prefills: int = 0  # prefill chunks that did not reach the end of the prompt
    long_context_recomputes: int = 0  # LongRoPE sequences run again from their first token
    steps: int = 0


class TTHostModelRunner:
    def __init__(self, vllm_config: VllmConfig) -> None:
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.cache_config = vllm_config.cache_config
        self.scheduler_config = vllm_config.scheduler_config
        self.model: Any = None
        self.kv_cache: Any = None
        self.requests: dict[str, RequestState] = {}
        self.shared_generator = torch.Generator().manual_seed(int(self.model_config.seed or 0))
        self.logprobs_mode = str(getattr(self.model_config, "logprobs_mode", "raw_logprobs"))
        self.timings: dict[str, float] = {}
        self.stats = RunnerStats()

    # -- model ------------------------------------------------------------------------------

    def model_class(self) -> type:
        """The registered ``TT<Arch>`` class of the checkpoint's architecture."""
        arch = self.model_config.architectures[0]
        model_cls, _ = ModelRegistry.resolve_model_cls([tt_architecture(arch)], self.model_config)
        return model_cls

    def load_model(self) -> None:
        start = time.perf_counter()
        options = plugin_options(self.vllm_config.additional_config)
        self.model = self.model_class().initialize_vllm_model(
            self.model_config.hf_config,
            None,
            self.scheduler_config.max_num_seqs,
            max_seq_len=self.model_config.max_model_len,
            n_layers=options["n_layers"],
            optimizations=options["optimizations"],
            precision=options["precision"],
            checkpoint=options["checkpoint"],
        )
        self.timings["load_model"] = time.perf_counter() - start

    # -- KV cache ---------------------------------------------------------------------------

    def kv_cache_spec(self) -> dict[str, KVCacheSpec]:
        """One uniform spec per layer, as large as the largest layer's per-token K/V (vLLM only
        counts blocks with it; the host pages themselves are shaped per layer by the model).
        Every layer is full attention to vLLM, so prefix-cache hits keep all of a prefix's pages
        (sliding-window layers simply attend to fewer of them)."""
        layout = self.model.decoder.kv_layout()
        widest = max(sum(h * d for h, d in columns) for columns in layout if columns is not None)
        spec = FullAttentionSpec(block_size=self.cache_config.block_size, num_kv_heads=1, head_size=widest,
                                 dtype=KV_DTYPE)
        return {f"model.layers.{i}.self_attn.attn": spec for i in range(len(layout))}

    def available_kv_bytes(self) -> int:
        """Host memory for the KV pages: ``kv_cache_memory_bytes`` if set, else enough for
        ``max_num_seqs`` full-length sequences, at most a fifth of the free host memory."""
        if self.cache_config.kv_cache_memory_bytes:
            return int(self.cache_config.kv_cache_memory_bytes)
        spec = next(iter(self.kv_cache_spec().values()))
        layers = len(self.model.decoder.kv_layout())
        blocks_per_seq = -(-self.model_config.max_model_len // self.cache_config.block_size)
        wanted = (self.scheduler_config.max_num_seqs * blocks_per_seq + 1) * spec.page_size_bytes * layers
        return min(wanted, int(psutil.virtual_memory().available * HOST_KV_FRACTION))

    def initialize_kv_cache(self, kv_cache_config: KVCacheConfig) -> None:
        start = time.perf_counter()
        num_layers = len(self.model.decoder.kv_layout())
        shape = (kv_cache_config.num_blocks, 1, self.cache_config.block_size, 1)
        self.kv_cache = self.model.allocate_kv_cache(shape, KV_DTYPE, num_layers)
        self.timings["kv_cache"] = time.perf_counter() - start
        logger.info(f"host KV cache: {kv_cache_config.num_blocks} blocks of {self.cache_config.block_size} tokens")

    def warm_up(self) -> None:
        self.model.warmup_model_prefill(self.kv_cache)
        self.model.warmup_model_decode(self.kv_cache)

    # -- a step -----------------------------------------------------------------------------

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        self._update_requests(scheduler_output)
        if scheduler_output.total_num_scheduled_tokens == 0:
            return EMPTY_MODEL_RUNNER_OUTPUT
        self.stats.steps += 1
        work = [self._recompute_if_switching(Scheduled(req_id, self.requests[req_id],
                                                       self.requests[req_id].num_computed_tokens, count))
                for req_id, count in scheduler_output.num_scheduled_tokens.items()]
        prefills = [w for w in work if not w.is_decode]
        rows = self._forward(prefills) | self._forward_decode([w for w in work if w.is_decode])
        sampled: list[list[int]] = []
        logprobs: list[TokenLogprobs | None] = []
        prompt_logprobs_dict: dict[str, LogprobsTensors | None] = {}
        for w in work:
            state = w.state
            if not w.is_decode:
                self._count_prefill(w)
            if state.wants_prompt_logprobs:
                self._record_prompt_logprobs(w, rows[w.req_id])
            state.num_computed_tokens = w.start + w.count
            if not w.completes_prompt:
                sampled.append([])
                logprobs.append(None)
                continue
            if state.wants_prompt_logprobs:  # sent with the first sampled token, as vLLM's runner does
                prompt_logprobs_dict[w.req_id] = self._prompt_logprobs_tensors(state)
            out = sample(rows[w.req_id][-1], state.params, state.generator or self.shared_generator,
                         state.token_ids[: state.num_prompt_tokens], state.token_ids[state.num_prompt_tokens:],
                         self.logprobs_mode)
            state.token_ids.append(out.token)
            sampled.append([out.token])
            logprobs.append(out.logprobs)
        req_ids = [w.req_id for w in work]
        return ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                 sampled_token_ids=sampled, logprobs=logprobs_lists(logprobs),
                                 prompt_logprobs_dict=prompt_logprobs_dict)

    def _recompute_if_switching(self, w: Scheduled) -> Scheduled:
        """A LongRoPE sequence crossing its switch length in this step is run again from its
        first token (its pages rewritten with the long factors), as transformers' Phi-3 does."""
        switch = self.model.long_context_switch
        if switch is not None and 0 < w.start <= switch < w.start + w.count:
            self.stats.long_context_recomputes += 1
            return Scheduled(w.req_id, w.state, 0, w.start + w.count)
        return w

    def _count_prefill(self, w: Scheduled) -> None:
        prompt_end = min(w.start + w.count, w.state.num_prompt_tokens)
        self.stats.prompt_tokens_computed += max(0, prompt_end - w.start)
        if not w.completes_prompt:
            self.stats.partial_prefills += 1

    def _record_prompt_logprobs(self, w: Scheduled, logits: torch.Tensor) -> None:
        """Score the prompt positions of this chunk (``logits``: one row per scheduled token)."""
        state, last = w.state, w.state.num_prompt_tokens - 1
        if not state.prompt_rows:
            state.prompt_rows = [None] * max(last, 0)
        end = min(w.start + w.count, last)
        if end <= w.start:
            return
        num = state.params.prompt_logprobs
        num = logits.shape[-1] if num == -1 else num
        source = scores(logits[: end - w.start].float(), self.logprobs_mode)
        targets = state.token_ids[w.start + 1: end + 1]
        state.prompt_rows[w.start:end] = prompt_logprobs(source, targets, num)

    def _prompt_logprobs_tensors(self, state: RequestState) -> LogprobsTensors:
        state.prompt_logprobs_sent = True
        rows = state.prompt_rows
        if any(row is None for row in rows):
            raise RuntimeError("prompt logprobs: a prompt position was never computed")
        width = max((len(row.token_ids) for row in rows), default=state.params.prompt_logprobs + 1)
        ids = torch.zeros(len(rows), width, dtype=torch.int32)
        values = torch.full((len(rows), width), float("-inf"))
        for i, row in enumerate(rows):
            ids[i, : len(row.token_ids)] = torch.tensor(row.token_ids, dtype=torch.int32)
            values[i, : len(row.logprobs)] = torch.tensor(row.logprobs)
        ranks = torch.tensor([row.rank for row in rows], dtype=torch.int64)
        state.prompt_rows = []
        return LogprobsTensors(ids, values, ranks)

    def _update_requests(self, out: SchedulerOutput) -> None:
        for req_id in out.finished_req_ids:
            self.requests.pop(req_id, None)
        for new in out.scheduled_new_reqs:
            if new.sampling_params is None or new.prompt_token_ids is None:
                raise ValueError(f"request {new.req_id}: the TT host runner serves token prompts for generation only")
            self.requests[new.req_id] = RequestState(
                token_ids=list(new.prompt_token_ids), num_prompt_tokens=len(new.prompt_token_ids),
                block_ids=list(new.block_ids[0]), num_computed_tokens=new.num_computed_tokens,
                params=new.sampling_params, generator=seeded_generator(new.sampling_params))
            self.stats.prompt_tokens_cached += new.num_computed_tokens
        cached = out.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            state = self.requests[req_id]
            new_blocks = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:  # preempted and back: pages replaced, tokens resent
                state.block_ids = list(new_blocks[0]) if new_blocks else []
                if req_id in cached.all_token_ids:
                    state.token_ids = list(cached.all_token_ids[req_id])
            elif new_blocks:
                state.block_ids.extend(new_blocks[0])
            state.num_computed_tokens = cached.num_computed_tokens[i]

    def _page_table(self, work: list[Scheduled]) -> torch.Tensor:
        width = max(len(w.state.block_ids) for w in work)
        table = torch.zeros(len(work), width, dtype=torch.long)
        for i, w in enumerate(work):
            table[i, : len(w.state.block_ids)] = torch.tensor(w.state.block_ids)
        return table

    def _forward(self, work: list[Scheduled]) -> dict[str, torch.Tensor]:
        """Prefills (whole or partial prompts, prompts after a prefix-cache hit, or a resumed
        request's tokens) in one call: ``[rows, vocab]`` logits per request, of every scheduled
        position for a request that wants prompt logprobs, else of the last one."""
        if not work:
            return {}
        ends = [w.start + w.count for w in work]
        tokens = torch.zeros(len(work), max(ends), dtype=torch.long)
        for i, w in enumerate(work):
            tokens[i, : ends[i]] = torch.tensor(w.state.token_ids[: ends[i]])
        every = [w.state.wants_prompt_logprobs for w in work]
        logits = self.model.prefill_forward(tokens, self._page_table(work), self.kv_cache, ends,
                                            start_pos=[w.start for w in work], return_all_logits=every)
        return {w.req_id: logits[i] for i, w in enumerate(work)}

    def _forward_decode(self, work: list[Scheduled]) -> dict[str, torch.Tensor]:
        if not work:
            return {}
        tokens = torch.tensor([[w.state.token_ids[w.start]] for w in work])
        positions = torch.tensor([w.start for w in work])
        out = self.model.decode_forward(tokens, positions, self._page_table(work), self.kv_cache)
        logits = self.model.read_decode_output(out)
        return {w.req_id: logits[i] for i, w in enumerate(work)}


def logprobs_lists(rows: list[TokenLogprobs | None]) -> LogprobsLists | None:
    """One row per request of the step (vLLM slices it by request index); None when no request
    asked for logprobs. Narrower rows are padded: vLLM reads each request's own width only."""
    if all(row is None for row in rows):
        return None
    width = max(len(row.token_ids) for row in rows if row is not None)
    ids = np.zeros((len(rows), width), dtype=np.int32)
    values = np.full((len(rows), width), -np.inf, dtype=np.float32)
    ranks = np.zeros(len(rows), dtype=np.int64)
    for i, row in enumerate(rows):
        if row is not None:
            ids[i, : len(row.token_ids)] = row.token_ids
            values[i, : len(row.logprobs)] = row.logprobs
            ranks[i] = row.rank
    return LogprobsLists(ids, values, ranks)
