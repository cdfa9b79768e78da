# SPDX-License-Identifier: Apache-2.0
"""Every request field of the pinned vLLM is in the platform's table, and every field the table
refuses is refused through a real ``vllm.LLM`` before it reaches the engine, by name, with the
engine still serving afterwards (a ``prompt_embeds`` request used to kill it: ``EngineDeadError``
for every later request). Engine features the runner does not implement are refused at start-up."""

from __future__ import annotations

import contextlib
import re
import signal
from collections.abc import Iterator

import pytest
import torch

from models.testing import REPO_ROOT
from models.testing.tiny_models import TINY_SHAPES, make_checkpoint
from models.vllm_plugin import request_fields
from models.vllm_plugin.request_fields import ENGINE_CORE_REQUEST, ENGINE_INPUT_KEYS, PROMPT_KEYS, SAMPLING_PARAMS
from tests.ttnn.vllm.engines import vllm_engine
from tests.ttnn.vllm.oracle import hf_generate

PROMPT = [1, 5, 77, 300, 12]


def refusals() -> tuple[type[Exception], ...]:
    """What a refused request raises: ours are ValueErrors; vLLM's own checks raise ValueError,
    TypeError or its VLLMValidationError (not a ValueError)."""
    from vllm.exceptions import VLLMClientError

    return (ValueError, TypeError, VLLMClientError)


def keys_of(*typed_dicts) -> set[str]:
    return {key for cls in typed_dicts for key in cls.__required_keys__ | cls.__optional_keys__}


def test_tables_name_every_field_of_the_pinned_vllm():
    """A field vLLM adds (or drops) makes this fail until the table says what happens to it."""
    from vllm import SamplingParams
    from vllm.inputs import engine, llm
    from vllm.v1.engine import EngineCoreRequest

    assert set(SamplingParams.__struct_fields__) == set(SAMPLING_PARAMS)
    assert set(EngineCoreRequest.__struct_fields__) == set(ENGINE_CORE_REQUEST)
    assert keys_of(llm.TextPrompt, llm.TokensPrompt, llm.EmbedsPrompt, llm.DataPrompt,
                   llm.ExplicitEncoderDecoderPrompt) == set(PROMPT_KEYS)
    assert keys_of(engine.TokensInput, engine.EmbedsInput, engine.MultiModalInput,
                   engine.MultiModalEncDecInput) == set(ENGINE_INPUT_KEYS)


def test_a_field_the_table_does_not_know_is_refused_when_set():
    """A later vLLM's new SamplingParams field, set to anything but its default, is refused by name."""
    from vllm import SamplingParams

    from models.vllm_plugin.platform import unsupported_options

    class NewerSamplingParams(SamplingParams):
        speculative_mood: int = 0

    assert unsupported_options(NewerSamplingParams(temperature=0.0)) == []
    assert unsupported_options(NewerSamplingParams(temperature=0.0, speculative_mood=3)) == ["speculative_mood"]


def test_docs_show_the_tables():
    assert request_fields.markdown() in (REPO_ROOT / "docs" / "vllm.md").read_text()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint("llama", tmp_path_factory.mktemp("tiny") / "tiny-llama")


@pytest.fixture(scope="module")
def llm(checkpoint, tmp_path_factory):
    """No tokenizer (token prompts), and prompt embeddings allowed by the engine's own switch."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TT_CACHE_PATH", str(tmp_path_factory.mktemp("tt-cache")))
        with vllm_engine(checkpoint, max_num_seqs=2, enable_prompt_embeds=True) as engine:
            yield engine


@pytest.fixture(scope="module")
def expected(checkpoint) -> list[int]:
    return hf_generate(checkpoint, PROMPT, 3)


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Fail instead of hanging: a request that reaches this in-process engine's runner and breaks it
    (what a prompt_embeds request did) leaves vLLM's step loop spinning."""
    def expire(signum, frame):
        raise TimeoutError(f"no answer within {seconds} s: the request reached the engine")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def still_serving(llm, expected) -> None:
    from vllm import SamplingParams

    with deadline(60):
        out = llm.generate([{"prompt_token_ids": PROMPT}], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True),
                           use_tqdm=False)
    assert list(out[0].outputs[0].token_ids) == expected


def structured_choice():
    from vllm.sampling_params import StructuredOutputsParams

    return StructuredOutputsParams(choice=["yes", "no"])


# Every SamplingParams field the table refuses, set as a user would; the error names it.
REFUSED_PARAMS = {
    "watermarking": lambda: {"watermarking": True},
    "prompt_logprob_token_ids": lambda: {"prompt_logprob_token_ids": [[1], [2], [3], [4]]},
    "prompt_logprob_start": lambda: {"prompt_logprob_start": 1},
    "structured_outputs": lambda: {"structured_outputs": structured_choice()},
    "thinking_token_budget": lambda: {"thinking_token_budget": 4},
    "routed_experts_prompt_start": lambda: {"routed_experts_prompt_start": 1},
    "trace_decode_token_ids": lambda: {"trace_decode_token_ids": [5, 6]},
}
NAMED_AS: dict[str, str] = {}  # the error names each field as the table does


def test_every_refused_sampling_field_has_a_case():
    assert set(REFUSED_PARAMS) == set(request_fields.refused(SAMPLING_PARAMS))


@pytest.mark.parametrize("field", list(REFUSED_PARAMS))
def test_refused_sampling_fields_are_refused_by_name_and_the_engine_serves_on(llm, expected, field):
    from vllm import SamplingParams

    with deadline(60), pytest.raises(refusals(), match=NAMED_AS.get(field, field)):
        llm.generate([{"prompt_token_ids": PROMPT}], SamplingParams(temperature=0.0, max_tokens=2, **REFUSED_PARAMS[field]()),
                     use_tqdm=False)
    still_serving(llm, expected)


# Every prompt key the table refuses, in a prompt a user would write.
REFUSED_PROMPTS = {
    "prompt_embeds": ({"prompt_embeds": torch.randn(4, TINY_SHAPES["hidden_size"])}, "prompt_embeds"),
    "prompt_is_token_ids": ({"prompt_embeds": torch.randn(3, TINY_SHAPES["hidden_size"]), "prompt_token_ids": [1, 2, 3],
                             "prompt_is_token_ids": [True, False, True]}, "prompt_embeds"),
    "multi_modal_data": ({"prompt_token_ids": PROMPT, "multi_modal_data": {"image": torch.zeros(3, 8, 8)}},
                         "[Mm]ulti-modal"),
    "data": ({"data": [1, 2], "data_format": "rows"}, "text, tokens, or embeddings"),
    "data_format": ({"data": [1, 2], "data_format": "rows"}, "text, tokens, or embeddings"),
    "encoder_prompt": ({"encoder_prompt": {"prompt_token_ids": PROMPT}, "decoder_prompt": None}, "encoder-decoder"),
    "decoder_prompt": ({"encoder_prompt": {"prompt_token_ids": PROMPT}, "decoder_prompt": {"prompt_token_ids": [1]}},
                       "encoder-decoder"),
}


def test_every_refused_prompt_key_has_a_case():
    assert set(REFUSED_PROMPTS) == set(request_fields.refused(PROMPT_KEYS))


@pytest.mark.parametrize("key", list(REFUSED_PROMPTS))
def test_refused_prompt_keys_are_refused_and_the_engine_serves_on(llm, expected, key):
    from vllm import SamplingParams

    prompt, named = REFUSED_PROMPTS[key]
    with deadline(60), pytest.raises(refusals(), match=named):
        llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)
    still_serving(llm, expected)


def test_bad_words_without_a_tokenizer_are_refused(llm, expected):
    from vllm import SamplingParams

    with deadline(60), pytest.raises(ValueError, match=re.escape("bad_words without a tokenizer")):
        llm.generate([{"prompt_token_ids": PROMPT}], SamplingParams(max_tokens=2, bad_words=["x"]), use_tqdm=False)
    still_serving(llm, expected)


# Engine features the runner does not implement: refused when the LLM is built, naming them.
REFUSED_FEATURES = {
    "LoRA": {"enable_lora": True},
    "kv_cache_dtype": {"kv_cache_dtype": "fp8"},
    "tensor/pipeline parallel": {"tensor_parallel_size": 2},
    "custom logits processors": {"logits_processors": ["vllm.v1.sample.logits_processor.builtin:MinPLogitsProcessor"]},
    "routed-expert outputs": {"enable_return_routed_experts": True},
    "speculative decoding": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 2,
                                                    "prompt_lookup_max": 2}},
}


@pytest.mark.parametrize("feature", list(REFUSED_FEATURES))
def test_unsupported_engine_features_are_refused_at_start(checkpoint, feature, tmp_path, monkeypatch):
    monkeypatch.setenv("TT_CACHE_PATH", str(tmp_path / "tt-cache"))
    from vllm import LLM

    with pytest.raises(ValueError, match=f"the TT host platform does not support {re.escape(feature)}"):
        LLM(model=str(checkpoint), skip_tokenizer_init=True, max_model_len=64, **REFUSED_FEATURES[feature])
