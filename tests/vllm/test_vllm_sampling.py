# SPDX-License-Identifier: Apache-2.0
"""What a request can ask of the host platform: seeded sampling, stop tokens, ``max_tokens``,
``min_tokens``, more prompts than the batch holds; and a clear refusal of what it cannot do."""

from __future__ import annotations

import pytest

from models.testing.tiny_models import hf_greedy, make_checkpoint
from tests.vllm.engines import token_prompts, vllm_engine

PROMPTS = [[1, 5, 77, 300, 12, 9, 400, 33], [7, 8, 9], [100, 200, 300, 400, 50, 60], [42], [3, 1, 4, 1, 5]]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint("llama", tmp_path_factory.mktemp("tiny") / "tiny-llama")


@pytest.fixture(scope="module")
def llm(checkpoint, tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TT_CACHE_PATH", str(tmp_path_factory.mktemp("tt-cache")))
        with vllm_engine(checkpoint, max_num_seqs=2) as engine:
            yield engine


def generate(llm, prompts, **params) -> list[list[int]]:
    from vllm import SamplingParams

    return [list(o.outputs[0].token_ids) for o in llm.generate(token_prompts(prompts), SamplingParams(**params))]


def test_seeded_sampling_is_reproducible_and_seed_dependent(llm):
    a = generate(llm, PROMPTS, temperature=1.5, top_k=50, top_p=0.9, seed=7, max_tokens=12, ignore_eos=True)
    b = generate(llm, PROMPTS, temperature=1.5, top_k=50, top_p=0.9, seed=7, max_tokens=12, ignore_eos=True)
    c = generate(llm, PROMPTS, temperature=1.5, top_k=50, top_p=0.9, seed=8, max_tokens=12, ignore_eos=True)
    assert a == b
    assert a != c
    assert all(len(tokens) == 12 for tokens in a)


def test_greedy_batch_larger_than_max_num_seqs(llm, checkpoint):
    got = generate(llm, PROMPTS, temperature=0.0, max_tokens=5, ignore_eos=True)
    assert got == [hf_greedy(checkpoint, p, 5) for p in PROMPTS]


def test_stop_tokens_and_max_tokens(llm, checkpoint):
    greedy = hf_greedy(checkpoint, PROMPTS[0], 6)
    stop = greedy[2]
    got = generate(llm, PROMPTS[:1], temperature=0.0, max_tokens=6, stop_token_ids=[stop])[0]
    assert got == greedy[: greedy.index(stop) + 1]
    assert generate(llm, PROMPTS[:1], temperature=0.0, max_tokens=3, ignore_eos=True)[0] == greedy[:3]


def test_min_tokens_masks_stop_tokens(llm, checkpoint):
    greedy = hf_greedy(checkpoint, PROMPTS[1], 1)
    got = generate(llm, PROMPTS[1:2], temperature=0.0, max_tokens=4, min_tokens=3, stop_token_ids=[greedy[0]])[0]
    assert got[0] != greedy[0] and len(got) >= 3


@pytest.mark.parametrize("option", [{"logprobs": 2}, {"presence_penalty": 0.5}, {"repetition_penalty": 1.2},
                                    {"logit_bias": {5: 1.0}}])
def test_unsupported_options_are_refused_by_name(llm, option):
    name = next(iter(option))
    with pytest.raises(ValueError, match=f"does not support {name}"):
        generate(llm, PROMPTS[:1], temperature=0.0, max_tokens=2, **option)
