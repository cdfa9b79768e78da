# SPDX-License-Identifier: Apache-2.0
"""What a request can ask of the host platform, through one real ``vllm.LLM`` (tiny Llama with a
word-level tokenizer): seeded sampling, stop tokens, ``max_tokens``, ``min_tokens``, ``n``, the
three penalties, ``logit_bias``, ``allowed_token_ids``, ``bad_words``, logprobs and prompt
logprobs, and prefix caching (vLLM's default, on).

The oracle is transformers' fp32 forward of the same tokens, each step's logits rewritten by the
rule under test: vLLM's own functions where vLLM has one (``apply_penalties``, the bad-words op),
the one-line rule otherwise (a bias is added; tokens outside ``allowed_token_ids`` are -inf).
"""

from __future__ import annotations

import math

import pytest
import torch

from models.testing.tiny_models import TINY_SHAPES, make_checkpoint
from tests.ttnn.vllm.engines import token_prompts, vllm_engine
from tests.ttnn.vllm.oracle import hf_greedy_with, hf_log_softmax, tiny_tokenizer

PROMPTS = [[1, 5, 77, 300, 12, 9, 400, 33], [7, 8, 9], [100, 200, 300, 400, 50, 60], [42], [3, 1, 4, 1, 5]]
STEPS = 8
LOGPROB_TOLERANCE = 2e-3  # host forward (bf16 weights, fp32 math) vs transformers' fp32 forward


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = make_checkpoint("llama", tmp_path_factory.mktemp("tiny") / "tiny-llama")
    tiny_tokenizer(path, TINY_SHAPES["vocab_size"])
    return path


@pytest.fixture(scope="module")
def llm(checkpoint, tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TT_CACHE_PATH", str(tmp_path_factory.mktemp("tt-cache")))
        with vllm_engine(checkpoint, max_num_seqs=2, tokenizer=True, max_logprobs=-1) as engine:
            yield engine


def generate(llm, prompts, **params) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in run(llm, prompts, **params)]


def run(llm, prompts, **params):
    from vllm import SamplingParams

    return llm.generate(token_prompts(prompts), SamplingParams(**params), use_tqdm=False)


def greedy(checkpoint, prompt, rule=lambda logits, prompt, out: logits, steps=STEPS):
    return hf_greedy_with(checkpoint, prompt, steps, rule)


# -- sampling -------------------------------------------------------------------------------------

def test_seeded_sampling_is_reproducible_and_seed_dependent(llm):
    a = generate(llm, PROMPTS, temperature=1.5, top_k=50, top_p=0.9, seed=7, max_tokens=12, ignore_eos=True)
    b = generate(llm, PROMPTS, temperature=1.5, top_k=50, top_p=0.9, seed=7, max_tokens=12, ignore_eos=True)
    c = generate(llm, PROMPTS, temperature=1.5, top_k=50, top_p=0.9, seed=8, max_tokens=12, ignore_eos=True)
    assert a == b
    assert a != c
    assert all(len(tokens) == 12 for tokens in a)


@pytest.mark.parametrize("truncation", [{"top_k": 1}, {"top_p": 1e-6}, {"min_p": 1.0}])
def test_truncation_to_the_top_token_samples_the_greedy_tokens(llm, checkpoint, truncation):
    got = generate(llm, PROMPTS[:2], temperature=1.0, seed=3, max_tokens=5, ignore_eos=True, **truncation)
    assert got == [greedy(checkpoint, p, steps=5) for p in PROMPTS[:2]]


def test_n_samples_are_distinct_and_reproducible(llm):
    from vllm import SamplingParams

    params = SamplingParams(n=3, temperature=1.5, seed=11, max_tokens=6, ignore_eos=True)
    first, again = (llm.generate(token_prompts(PROMPTS[:1]), params, use_tqdm=False)[0] for _ in range(2))
    tokens = [list(c.token_ids) for c in first.outputs]
    assert len(tokens) == 3 and len({tuple(t) for t in tokens}) == 3
    assert tokens == [list(c.token_ids) for c in again.outputs]


def test_greedy_batch_larger_than_max_num_seqs(llm, checkpoint):
    got = generate(llm, PROMPTS, temperature=0.0, max_tokens=5, ignore_eos=True)
    assert got == [greedy(checkpoint, p, steps=5) for p in PROMPTS]


def test_stop_tokens_and_max_tokens(llm, checkpoint):
    want = greedy(checkpoint, PROMPTS[0], steps=6)
    stop = want[2]
    got = generate(llm, PROMPTS[:1], temperature=0.0, max_tokens=6, stop_token_ids=[stop])[0]
    assert got == want[: want.index(stop) + 1]
    assert generate(llm, PROMPTS[:1], temperature=0.0, max_tokens=3, ignore_eos=True)[0] == want[:3]


def test_stop_strings_end_the_text(llm, checkpoint):
    """Stop strings are vLLM's detokenizer's work (the tiny tokenizer spells token i as "t<i>")."""
    want = greedy(checkpoint, PROMPTS[0], steps=6)
    # the first token from the third on whose spelling no earlier token's spelling starts with
    k = next(i for i in range(2, 6) if not any(f"t{t}".startswith(f"t{want[i]}") for t in want[:i]))
    stop = f" t{want[k]}"
    completion = run(llm, PROMPTS[:1], temperature=0.0, max_tokens=6, ignore_eos=True, stop=[stop])[0].outputs[0]
    assert completion.finish_reason == "stop" and completion.stop_reason == stop
    assert list(completion.token_ids) == want[: k + 1] and f"t{want[k]}" not in completion.text.split()


def test_min_tokens_masks_stop_tokens(llm, checkpoint):
    first = greedy(checkpoint, PROMPTS[1], steps=1)[0]
    got = generate(llm, PROMPTS[1:2], temperature=0.0, max_tokens=4, min_tokens=3, stop_token_ids=[first])[0]
    assert got[0] != first and len(got) >= 3


# -- logits processors, with vLLM's semantics ------------------------------------------------------

def vllm_penalties(presence: float, frequency: float, repetition: float):
    """vLLM 0.33's own penalty function as the rule (``vllm.model_executor.layers.utils``)."""
    from vllm.model_executor.layers.utils import apply_penalties

    def rule(logits, prompt, out):
        vocab = logits.numel()
        return apply_penalties(logits[None], torch.tensor([prompt]), torch.tensor([out or [vocab]]),
                               torch.tensor([presence]), torch.tensor([frequency]), torch.tensor([repetition]))[0]

    return rule


@pytest.mark.parametrize("penalties", [
    {"repetition_penalty": 1.8},
    {"frequency_penalty": 1.5},
    {"presence_penalty": 2.0},
    {"repetition_penalty": 1.3, "frequency_penalty": 0.7, "presence_penalty": -0.5},
])
def test_penalties_follow_vllm(llm, checkpoint, penalties):
    settings = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0, **penalties}
    rule = vllm_penalties(settings["presence_penalty"], settings["frequency_penalty"], settings["repetition_penalty"])
    prompts = PROMPTS[:3]
    expected = [greedy(checkpoint, p, rule, steps=12) for p in prompts]
    assert expected != [greedy(checkpoint, p, steps=12) for p in prompts]  # the penalty changes the tokens
    assert generate(llm, prompts, temperature=0.0, max_tokens=12, ignore_eos=True, **penalties) == expected


def test_logit_bias_is_added_before_the_choice(llm, checkpoint):
    plain = greedy(checkpoint, PROMPTS[0])
    bias = {plain[1]: -100.0, 17: 3.0, 250: 2.5}

    def rule(logits, prompt, out):
        for token, value in bias.items():
            logits[token] += value
        return logits

    expected = greedy(checkpoint, PROMPTS[0], rule)
    assert expected != plain
    assert generate(llm, PROMPTS[:1], temperature=0.0, max_tokens=STEPS, ignore_eos=True, logit_bias=bias)[0] == expected


def test_allowed_token_ids_restrict_the_choice(llm, checkpoint):
    plain = greedy(checkpoint, PROMPTS[2])
    allowed = [t for t in range(40, 90)] + [plain[3]]

    def rule(logits, prompt, out):
        keep = torch.full_like(logits, float("-inf"))
        keep[allowed] = 0.0
        return logits + keep

    expected = greedy(checkpoint, PROMPTS[2], rule)
    got = generate(llm, PROMPTS[2:3], temperature=0.0, max_tokens=STEPS, ignore_eos=True, allowed_token_ids=allowed)[0]
    assert got == expected and set(got) <= set(allowed)


def test_bad_words_follow_vllm(llm, checkpoint):
    """A one-token bad word is never generated; a two-token one never completed (vLLM's own op)."""
    from vllm.v1.sample.ops.bad_words import _apply_bad_words_single_batch

    plain = greedy(checkpoint, PROMPTS[0])
    words = [[plain[0]], [plain[2], plain[3]]]

    def rule(logits, prompt, out):
        _apply_bad_words_single_batch(logits, words, out)
        return logits

    expected = greedy(checkpoint, PROMPTS[0], rule)
    bad_words = [" ".join(f"t{t}" for t in word) for word in words]  # the tiny tokenizer: token i is "t<i>"
    got = generate(llm, PROMPTS[:1], temperature=0.0, max_tokens=STEPS, ignore_eos=True, bad_words=bad_words)[0]
    assert got == expected and got != plain and plain[0] not in got


# -- logprobs ---------------------------------------------------------------------------------------

def assert_logprobs(position: dict, reference: torch.Tensor, chosen: int, count: int) -> None:
    """One position of vLLM's logprobs against transformers' log-softmax row ``reference``."""
    top = reference.topk(count).indices.tolist()
    assert set(position) == {chosen, *top}
    for token, entry in position.items():
        assert math.isclose(entry.logprob, float(reference[token]), abs_tol=LOGPROB_TOLERANCE), (token, entry)
    assert position[chosen].rank == int((reference > reference[chosen]).sum()) + 1
    for rank, token in enumerate(top, start=1):
        assert position[token].rank == rank


def test_logprobs_and_prompt_logprobs_equal_transformers(llm, checkpoint):
    prompts = PROMPTS[:3]
    outputs = run(llm, prompts, temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=3, prompt_logprobs=2)
    for prompt, output in zip(prompts, outputs):
        completion = output.outputs[0]
        tokens = list(completion.token_ids)
        reference = hf_log_softmax(checkpoint, prompt + tokens)
        assert len(completion.logprobs) == len(tokens)
        for step, (token, position) in enumerate(zip(tokens, completion.logprobs)):
            assert_logprobs(position, reference[len(prompt) - 1 + step], token, 3)
            assert position[token].rank == 1  # greedy
        assert math.isclose(completion.cumulative_logprob,
                            sum(float(reference[len(prompt) - 1 + i, t]) for i, t in enumerate(tokens)),
                            abs_tol=LOGPROB_TOLERANCE * len(tokens))
        assert output.prompt_logprobs[0] is None and len(output.prompt_logprobs) == len(prompt)
        for i, position in enumerate(output.prompt_logprobs[1:], start=1):
            assert_logprobs(position, reference[i - 1], prompt[i], 2)


def test_logprobs_of_sampled_tokens_and_of_named_tokens(llm, checkpoint):
    """Random sampling reports the sampled token's raw logprob (vLLM's default mode);
    ``logprob_token_ids`` gives exactly the named tokens; -1 the whole vocabulary."""
    named = [5, 77, 300]
    output = run(llm, PROMPTS[:1], temperature=1.0, seed=5, max_tokens=4, ignore_eos=True, logprob_token_ids=named)[0]
    tokens = list(output.outputs[0].token_ids)
    reference = hf_log_softmax(checkpoint, PROMPTS[0] + tokens)
    for step, (token, position) in enumerate(zip(tokens, output.outputs[0].logprobs)):
        row = reference[len(PROMPTS[0]) - 1 + step]
        assert set(position) == {token, *named}
        for t, entry in position.items():
            assert math.isclose(entry.logprob, float(row[t]), abs_tol=LOGPROB_TOLERANCE)
        assert position[token].rank == int((row > row[token]).sum()) + 1

    everything = run(llm, PROMPTS[1:2], temperature=0.0, max_tokens=1, logprobs=-1)[0].outputs[0].logprobs[0]
    assert len(everything) == TINY_SHAPES["vocab_size"]
    assert math.isclose(sum(math.exp(e.logprob) for e in everything.values()), 1.0, abs_tol=1e-3)


# -- prefix caching -------------------------------------------------------------------------------

def test_prefix_cache_hit_computes_only_the_suffix(llm, checkpoint):
    """A second prompt sharing a 70-token prefix (two full 32-token blocks) with the first finds
    those blocks in vLLM's prefix cache: the runner computes only its last 11 positions, and the
    tokens are still transformers'. A different cache_salt shares nothing."""
    prefix = [(13 * i + 7) % 500 for i in range(70)]
    first, second = prefix + [11, 12, 13, 14, 15], prefix + [21, 22, 23, 24, 25]
    generate(llm, [first], temperature=0.0, max_tokens=1)
    before = llm.collective_rpc("runner_stats")[0]
    output = run(llm, [second], temperature=0.0, max_tokens=STEPS, ignore_eos=True)[0]
    after = llm.collective_rpc("runner_stats")[0]
    assert output.num_cached_tokens == 64
    assert after["prompt_tokens_cached"] - before["prompt_tokens_cached"] == 64
    assert after["prompt_tokens_computed"] - before["prompt_tokens_computed"] == len(second) - 64
    assert list(output.outputs[0].token_ids) == greedy(checkpoint, second)

    from vllm import SamplingParams

    salted = llm.generate([{"prompt_token_ids": second, "cache_salt": "another tenant"}],
                          SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)[0]
    assert salted.num_cached_tokens == 0
