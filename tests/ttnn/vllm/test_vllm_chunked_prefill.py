# SPDX-License-Identifier: Apache-2.0
"""Chunked prefill (vLLM's default, on) through a real ``vllm.LLM`` on tiny Phi-3, with a token
budget of 16 per step so that every prompt here is split: tokens and prompt logprobs assembled
from the chunks equal transformers' one-pass forward, also where a chunk crosses LongRoPE's
original context (16) and the sequence is recomputed with the long factors. The engine reports
vLLM's ``processed_logprobs`` (after logit bias, as vLLM's sampler does)."""

from __future__ import annotations

import math

import pytest

from models.testing.tiny_models import LONGROPE_ORIGINAL_CONTEXT, make_checkpoint
from tests.ttnn.vllm.engines import token_prompts, vllm_engine
from tests.ttnn.vllm.oracle import hf_generate, hf_log_softmax, hf_logits

BUDGET = 16  # max_num_batched_tokens: prompt tokens per step, all requests together
PROMPTS = [[(29 * i + 3) % 500 for i in range(40)], [(17 * i + 5) % 500 for i in range(23)], [9, 8, 7, 6, 5]]
STEPS = 6
TOLERANCE = 2e-3


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint("phi3", tmp_path_factory.mktemp("tiny") / "tiny-phi3")


@pytest.fixture(scope="module")
def llm(checkpoint, tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TT_CACHE_PATH", str(tmp_path_factory.mktemp("tt-cache")))
        with vllm_engine(checkpoint, max_num_seqs=2, max_model_len=64, max_num_batched_tokens=BUDGET,
                         logprobs_mode="processed_logprobs") as engine:
            yield engine


def run(llm, prompts, **params):
    from vllm import SamplingParams

    return llm.generate(token_prompts(prompts), SamplingParams(**params), use_tqdm=False)


def test_chunked_prompts_give_transformers_tokens(llm, checkpoint):
    before = llm.collective_rpc("runner_stats")[0]
    outputs = run(llm, PROMPTS, temperature=0.0, max_tokens=STEPS, ignore_eos=True)
    after = llm.collective_rpc("runner_stats")[0]
    assert [list(o.outputs[0].token_ids) for o in outputs] == [hf_generate(checkpoint, p, STEPS) for p in PROMPTS]
    assert after["partial_prefills"] - before["partial_prefills"] >= 3  # 40 and 23 tokens in 16-token steps
    assert after["long_context_recomputes"] > before["long_context_recomputes"]  # a chunk crossed position 16
    assert len(PROMPTS[0]) > 2 * BUDGET > LONGROPE_ORIGINAL_CONTEXT


def test_prompt_logprobs_assembled_from_chunks_equal_transformers(llm, checkpoint):
    outputs = run(llm, PROMPTS[:2], temperature=0.0, max_tokens=1, prompt_logprobs=1)
    for prompt, output in zip(PROMPTS, outputs):
        reference = hf_log_softmax(checkpoint, prompt)  # one forward: long factors throughout
        assert len(output.prompt_logprobs) == len(prompt) and output.prompt_logprobs[0] is None
        for i, position in enumerate(output.prompt_logprobs[1:], start=1):
            assert math.isclose(position[prompt[i]].logprob, float(reference[i - 1, prompt[i]]), abs_tol=TOLERANCE)
            top = int(reference[i - 1].argmax())
            assert math.isclose(position[top].logprob, float(reference[i - 1, top]), abs_tol=TOLERANCE)


def test_processed_logprobs_include_the_logit_bias(llm, checkpoint):
    """``logprobs_mode="processed_logprobs"``: the log-softmax of the logits the choice was made from."""
    prompt, bias = PROMPTS[2], {40: 10.0, 41: -3.0}
    output = run(llm, [prompt], temperature=0.0, max_tokens=1, logprobs=2, logit_bias=bias)[0].outputs[0]
    logits = hf_logits(checkpoint, prompt)[-1].clone()
    for token, value in bias.items():
        logits[token] += value
    reference = logits.log_softmax(-1)
    assert output.token_ids[0] == 40 == int(reference.argmax())  # the bias made the choice
    assert set(output.logprobs[0]) == set(reference.topk(2).indices.tolist())
    for t, entry in output.logprobs[0].items():
        assert math.isclose(entry.logprob, float(reference[t]), abs_tol=TOLERANCE)
