# SPDX-License-Identifier: Apache-2.0
"""Next-token sampling on the host, per request, from one row of logits.

Supported: greedy (temperature 0), temperature, top-k, top-p, min-p, a per-request ``seed``
(reproducible across runs, though not the same stream as vLLM's GPU sampler) and ``min_tokens``
(stop tokens masked until then). Stop tokens, stop strings, ``max_tokens`` and ``ignore_eos`` are
the engine's work and need nothing here. Everything else a ``SamplingParams`` can ask for is
refused up front by :func:`unsupported_options`, so no request silently gets less than it asked.
Reads ``SamplingParams`` attributes only: no vLLM import.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

GREEDY_EPS = 1e-5  # vLLM's own threshold below which a temperature means greedy

# option -> (its "not asked for" value, what to say when it is asked for)
UNSUPPORTED: dict[str, tuple[Any, str]] = {
    "logprobs": (None, "logprobs"),
    "prompt_logprobs": (None, "prompt_logprobs"),
    "presence_penalty": (0.0, "presence_penalty"),
    "frequency_penalty": (0.0, "frequency_penalty"),
    "repetition_penalty": (1.0, "repetition_penalty"),
    "logit_bias": (None, "logit_bias"),
    "allowed_token_ids": (None, "allowed_token_ids"),
    "bad_words": (None, "bad_words"),
    "structured_outputs": (None, "structured outputs (guided decoding)"),
    "thinking_token_budget": (None, "thinking_token_budget"),
    "logits_processors": (None, "logits processors"),
}


def unsupported_options(params: Any) -> list[str]:
    """The options ``params`` sets that the host sampler does not implement."""
    asked = []
    for name, (default, label) in UNSUPPORTED.items():
        value = getattr(params, name, default)
        if value not in (default, None) and value != [] and value != {}:
            asked.append(label)
    return asked


def is_greedy(params: Any) -> bool:
    return params.temperature < GREEDY_EPS


def seeded_generator(params: Any) -> torch.Generator | None:
    """A request's own generator when it names a seed (None: it shares the engine's)."""
    if params.seed is None or is_greedy(params):
        return None
    return torch.Generator().manual_seed(int(params.seed))


def sample(logits: torch.Tensor, params: Any, generator: torch.Generator, num_output_tokens: int) -> int:
    """One token from ``[vocab]`` fp32 logits under ``params``."""
    logits = logits.float()
    if num_output_tokens < params.min_tokens:
        logits = _mask(logits, stop_tokens(params))
    if is_greedy(params):
        return int(logits.argmax())
    logits = logits / params.temperature
    if params.top_k and 0 < params.top_k < logits.numel():
        kth = logits.topk(params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(-1)
    if params.min_p > 0:
        probs = probs.masked_fill(probs < params.min_p * probs.max(), 0.0)
    if params.top_p < 1.0:
        probs = _top_p(probs, params.top_p)
    return int(torch.multinomial(probs / probs.sum(), 1, generator=generator))


def stop_tokens(params: Any) -> list[int]:
    """Tokens that would end the request now: its stop tokens and, unless ignored, EOS."""
    tokens = set(getattr(params, "all_stop_token_ids", None) or ())
    tokens |= set(params.stop_token_ids or ())
    return sorted(tokens)


def _mask(logits: torch.Tensor, tokens: Sequence[int]) -> torch.Tensor:
    if not tokens:
        return logits
    masked = logits.clone()
    masked[list(tokens)] = float("-inf")
    return masked


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches ``top_p`` (at least one)."""
    sorted_probs, order = probs.sort(descending=True)
    before = sorted_probs.cumsum(-1) - sorted_probs  # mass of the tokens ranked above each
    sorted_probs = sorted_probs.masked_fill(before >= top_p, 0.0)
    return torch.zeros_like(probs).scatter(-1, order, sorted_probs)
