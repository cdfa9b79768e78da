# SPDX-License-Identifier: Apache-2.0
"""Every field a vLLM 0.33 request can carry, and what the TT host platform does with it.

A request reaches the model runner only through fields listed here. The platform refuses, by
name and before the request reaches the engine, every field marked ``refused`` that a request
sets, and every field vLLM adds in a later version that is not in these tables and is set to
something other than its default (``tests/ttnn/vllm/test_vllm_request_fields.py`` walks the pinned
vLLM's ``SamplingParams``, prompt types, engine inputs and ``EngineCoreRequest`` against them).

Handling:

* ``supported``: the host runner implements it with vLLM's semantics (tested through ``vllm.LLM``);
* ``engine``: vLLM's own frontend, output processor or scheduler does it; the runner has no part;
* ``refused``: the platform rejects a request that sets it, with the field's name, before the
  request reaches the engine (where vLLM itself already rejects it for this model or engine, the
  note says "vLLM"; the platform's check stays behind it);
* ``internal``: set by vLLM, not by a user.

Light: no vLLM import (``python -m models.vllm_plugin.request_fields`` prints the tables).
"""

from __future__ import annotations

from dataclasses import dataclass

SUPPORTED, ENGINE, REFUSED, INTERNAL = "supported", "engine", "refused", "internal"


@dataclass(frozen=True)
class FieldRule:
    handling: str
    note: str = ""


def supported(note: str = "") -> FieldRule:
    return FieldRule(SUPPORTED, note)


def engine(note: str = "") -> FieldRule:
    return FieldRule(ENGINE, note)


def refuse(note: str = "") -> FieldRule:
    return FieldRule(REFUSED, note)


def internal(note: str = "") -> FieldRule:
    return FieldRule(INTERNAL, note)


SAMPLING_PARAMS: dict[str, FieldRule] = {
    "n": engine("vLLM fans a request out into n child requests (seeds seed, seed+1, ...)"),
    "presence_penalty": supported(),
    "frequency_penalty": supported(),
    "repetition_penalty": supported(),
    "temperature": supported(),
    "watermarking": refuse("True is refused: no watermark (watermark_config is refused at start-up)"),
    "top_p": supported(),
    "top_k": supported(),
    "min_p": supported(),
    "seed": supported("reproducible per request; not the same random stream as vLLM's GPU sampler"),
    "stop": engine("stop strings: vLLM's detokenizer"),
    "stop_token_ids": supported("the scheduler stops on them; the runner holds them back for min_tokens"),
    "ignore_eos": engine(),
    "max_tokens": engine(),
    "min_tokens": supported(),
    "logprobs": supported("raw logprobs (vLLM's default logprobs_mode; the other three modes too), -1 = whole vocabulary"),
    "prompt_logprobs": supported("prompt logprobs skip the prefix cache, as in vLLM"),
    "prompt_logprob_token_ids": refuse("scoring rows of the prompt (vLLM: needs its V2 GPU model runner)"),
    "prompt_logprob_start": refuse("only with prompt_logprob_token_ids (vLLM)"),
    "logprob_token_ids": supported("logprobs of exactly these tokens, after the sampled one"),
    "flat_logprobs": engine("output format"),
    "detokenize": engine(),
    "skip_special_tokens": engine(),
    "spaces_between_special_tokens": engine(),
    "include_stop_str_in_output": engine(),
    "output_kind": engine(),
    "stream_interval": engine(),
    "skip_clone": engine(),
    "output_text_buffer_length": internal(),
    "_eos_token_id": internal(),
    "_all_stop_token_ids": internal(),
    "_watermarking_skipped": internal(),
    "structured_outputs": refuse("structured outputs (guided decoding)"),
    "logit_bias": supported(),
    "allowed_token_ids": supported(),
    "extra_args": engine("passed through untouched; no in-tree sampler reads it (custom logits processors are refused)"),
    "bad_words": supported("needs the tokenizer (refused with skip_tokenizer_init=True)"),
    "_bad_words_token_ids": internal("bad_words, tokenized by vLLM"),
    "skip_reading_prefix_cache": engine("vLLM's KV cache manager"),
    "thinking_token_budget": refuse("needs a reasoning parser (vLLM)"),
    "repetition_detection": engine("vLLM's scheduler ends the request"),
    "routed_experts_prompt_start": refuse("non-zero is refused: routed-expert outputs are not returned"),
    "trace_decode_token_ids": refuse("trace replay (vLLM: needs enable_trace_replay, which needs its V2 GPU runner)"),
}

# The keys of every prompt form LLM.generate accepts (vllm.inputs.llm).
PROMPT_KEYS: dict[str, FieldRule] = {
    "prompt": supported("text, tokenized by vLLM"),
    "prompt_token_ids": supported(),
    "cache_salt": supported("separates prefix-cache entries"),
    "prompt_token_offsets": engine("character offsets, passed through"),
    "token_type_ids": engine("cross-encoder input: vLLM's renderer drops it for a decoder-only model (any platform)"),
    "multi_modal_data": refuse("multimodal inputs (vLLM: no multimodal processor for a text-only model)"),
    "media_io_kwargs": engine("multimodal options: dropped by vLLM's renderer without multi_modal_data"),
    "mm_processor_kwargs": engine("multimodal options: dropped by vLLM's renderer without multi_modal_data"),
    "multi_modal_uuids": engine("multimodal options: dropped by vLLM's renderer without multi_modal_data"),
    "prompt_embeds": refuse("prompt embeddings"),
    "prompt_is_token_ids": refuse("prompt embeddings"),
    "data": refuse("IO-processor plugin inputs (vLLM: no such plugin)"),
    "data_format": refuse("IO-processor plugin inputs (vLLM: no such plugin)"),
    "encoder_prompt": refuse("encoder-decoder prompts (vLLM: decoder-only model)"),
    "decoder_prompt": refuse("encoder-decoder prompts (vLLM: decoder-only model)"),
}

# The rendered inputs the platform's validate_request sees (vllm.inputs.engine): only token inputs pass.
ENGINE_INPUT_KEYS: dict[str, FieldRule] = {
    "type": supported('"token" only: "embeds" and "multimodal" inputs are refused'),
    "prompt_token_ids": supported(),
    "prompt": supported(),
    "cache_salt": supported(),
    "arrival_time": engine(),
    "prompt_token_offsets": engine(),
    "prompt_embeds": refuse("prompt embeddings"),
    "is_token_ids": refuse("prompt embeddings"),
    "mm_kwargs": refuse("multimodal inputs"),
    "mm_hashes": refuse("multimodal inputs"),
    "mm_placeholders": refuse("multimodal inputs"),
    "encoder_prompt_token_ids": refuse("encoder-decoder models"),
    "encoder_prompt": refuse("encoder-decoder models"),
}

# What the engine core receives per request (vllm.v1.engine.EngineCoreRequest).
ENGINE_CORE_REQUEST: dict[str, FieldRule] = {
    "request_id": engine(),
    "prompt_token_ids": supported(),
    "mm_features": refuse("multimodal inputs (refused in the input, above)"),
    "sampling_params": supported("the SamplingParams table"),
    "pooling_params": refuse("pooling: the worker serves the generate task only"),
    "arrival_time": engine(),
    "lora_request": refuse("LoRA (enable_lora is refused at start-up, so vLLM rejects any lora_request)"),
    "cache_salt": supported("separates prefix-cache entries"),
    "data_parallel_rank": engine("one engine (data_parallel_size > 1 is refused at start-up)"),
    "prompt_embeds": refuse("prompt embeddings (refused in the input, above)"),
    "prompt_is_token_ids": refuse("prompt embeddings"),
    "client_index": engine(),
    "current_wave": engine(),
    "priority": engine("vLLM's scheduler (scheduling_policy='priority')"),
    "trace_headers": engine(),
    "resumable": engine("streaming-input sessions: vLLM's scheduler"),
    "external_req_id": internal(),
    "reasoning_ended": engine("reasoning state of structured outputs, which are refused"),
    "reasoning_parser_kwargs": engine("reasoning state of structured outputs, which are refused"),
    "abort_immediately": engine("KV-transfer clean-up (KV connectors are refused at start-up)"),
    "session_id": engine("streaming-input sessions: vLLM's scheduler"),
    "kv_hints": engine("KV-cache management hints for connectors (refused at start-up)"),
}

TABLES: dict[str, dict[str, FieldRule]] = {
    "SamplingParams": SAMPLING_PARAMS,
    "prompt (TextPrompt, TokensPrompt, EmbedsPrompt, DataPrompt, ExplicitEncoderDecoderPrompt)": PROMPT_KEYS,
    "engine input (TokensInput, EmbedsInput, MultiModalInput)": ENGINE_INPUT_KEYS,
    "EngineCoreRequest": ENGINE_CORE_REQUEST,
}


def refused(table: dict[str, FieldRule]) -> list[str]:
    return [name for name, rule in table.items() if rule.handling == REFUSED]


def markdown() -> str:
    """The tables as the docs show them (user-settable fields only)."""
    lines = []
    for title, table in TABLES.items():
        lines += [f"**{title}**", "", "| field | handling | note |", "| --- | --- | --- |"]
        lines += [f"| `{name}` | {rule.handling} | {rule.note} |" for name, rule in table.items()
                  if rule.handling != INTERNAL]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown())
