# SPDX-License-Identifier: Apache-2.0
"""Next-token sampling on the host, per request, with vLLM 0.33's semantics.

The order is vLLM's own (``vllm/v1/sample/sampler.py`` and its built-in logits processors):

1. logprobs of the raw logits, when asked for (vLLM's default ``logprobs_mode``);
2. ``allowed_token_ids`` (every other token -inf), ``bad_words`` (the last token of a bad word
   whose other tokens end the output so far -inf), ``min_tokens`` (stop tokens -inf until then),
   ``logit_bias`` (added), then the penalties: repetition (prompt and output tokens: positive
   logits divided, negative multiplied), frequency (minus count in the output) and presence
   (minus once per token in the output);
3. greedy: argmax. Otherwise temperature, ``min_p``, ``top_k``, ``top_p``, then a draw from the
   request's own generator when it names a ``seed`` (reproducible, though not the same random
   stream as vLLM's GPU sampler).

Reads ``SamplingParams`` attributes only: no vLLM import.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

GREEDY_EPS = 1e-5  # vLLM's own threshold below which a temperature means greedy
LOGPROBS_MODES = ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")


@dataclass(frozen=True)
class TokenLogprobs:
    """vLLM's logprobs of one position: the sampled (or prompt) token first, then the top ones
    (or the ``logprob_token_ids`` asked for), and the token's rank (1 = most likely)."""

    token_ids: list[int]
    logprobs: list[float]
    rank: int


@dataclass(frozen=True)
class Sample:
    token: int
    logprobs: TokenLogprobs | None


def is_greedy(params: Any) -> bool:
    return params.temperature < GREEDY_EPS


def wants_logprobs(params: Any) -> bool:
    return params.logprobs is not None or bool(getattr(params, "logprob_token_ids", None))


def seeded_generator(params: Any) -> torch.Generator | None:
    """A request's own generator when it names a seed (None: it shares the engine's)."""
    if params.seed is None or is_greedy(params):
        return None
    return torch.Generator().manual_seed(int(params.seed))


def sample(logits: torch.Tensor, params: Any, generator: torch.Generator, prompt_ids: Sequence[int],
           output_ids: Sequence[int], logprobs_mode: str = "raw_logprobs") -> Sample:
    """One token from ``[vocab]`` logits under ``params``; ``prompt_ids`` / ``output_ids``: the
    request's tokens so far (penalties, bad words, ``min_tokens``)."""
    logits = logits.float()
    scored = wants_logprobs(params)
    raw = scores(logits, logprobs_mode) if scored and logprobs_mode.startswith("raw") else None
    processed = process_logits(logits.clone(), params, prompt_ids, output_ids)
    if is_greedy(params):
        final = processed
        token = int(final.argmax())
    else:
        final = truncate(processed / params.temperature, params)
        token = int(torch.multinomial(final.softmax(-1), 1, generator=generator))
    if not scored:
        return Sample(token, None)
    source = raw if raw is not None else scores(final, logprobs_mode)
    return Sample(token, gather(source, token, params.logprobs, getattr(params, "logprob_token_ids", None)))


def scores(logits: torch.Tensor, logprobs_mode: str) -> torch.Tensor:
    """What vLLM reports as a logprob: the log-softmax (``*_logprobs``) or the logits themselves."""
    if logprobs_mode not in LOGPROBS_MODES:
        raise ValueError(f"logprobs_mode {logprobs_mode!r}: expected one of {LOGPROBS_MODES}")
    return logits.log_softmax(-1) if logprobs_mode.endswith("logprobs") else logits


def gather(source: torch.Tensor, token: int, num: int | None, token_ids: Sequence[int] | None = None) -> TokenLogprobs:
    """``token``'s score and rank, then the ``num`` highest scores (-1: the whole vocabulary), or
    exactly ``token_ids`` when given (vLLM prefers those when both are set)."""
    chosen = source[token]
    rank = int((source >= chosen).sum())
    if token_ids:
        ids = [int(t) for t in token_ids]
        values = source[torch.tensor(ids, dtype=torch.long)]
    else:
        count = source.numel() if num == -1 else int(num or 0)
        values, indices = source.topk(count)
        ids = indices.tolist()
    return TokenLogprobs([token, *ids], [float(chosen), *values.tolist()], rank)


def prompt_logprobs(source: torch.Tensor, targets: Sequence[int], num: int) -> list[TokenLogprobs]:
    """Per row of ``[rows, vocab]`` scores: the next prompt token's score, rank and the top ``num``."""
    return [gather(row, int(target), num) for row, target in zip(source, targets)]


def process_logits(logits: torch.Tensor, params: Any, prompt_ids: Sequence[int],
                   output_ids: Sequence[int]) -> torch.Tensor:
    """The logits processors that can change a greedy choice, in vLLM's order (in place)."""
    allowed = getattr(params, "allowed_token_ids", None)
    if allowed:
        keep = torch.zeros_like(logits, dtype=torch.bool)
        keep[torch.tensor(list(allowed), dtype=torch.long)] = True
        logits.masked_fill_(~keep, float("-inf"))
    for bad in getattr(params, "bad_words_token_ids", None) or ():
        prefix = list(bad[:-1])
        if len(prefix) <= len(output_ids) and (not prefix or list(output_ids[-len(prefix):]) == prefix):
            logits[bad[-1]] = float("-inf")
    if len(output_ids) < params.min_tokens:
        stops = stop_tokens(params)
        if stops:
            logits[torch.tensor(stops, dtype=torch.long)] = float("-inf")
    for token, bias in (getattr(params, "logit_bias", None) or {}).items():
        logits[int(token)] += float(bias)
    return apply_penalties(logits, params, prompt_ids, output_ids)


def apply_penalties(logits: torch.Tensor, params: Any, prompt_ids: Sequence[int],
                    output_ids: Sequence[int]) -> torch.Tensor:
    """Repetition (prompt or output), then frequency and presence (output only), as vLLM does."""
    repetition, frequency, presence = params.repetition_penalty, params.frequency_penalty, params.presence_penalty
    if repetition == 1.0 and frequency == 0.0 and presence == 0.0:
        return logits
    vocab = logits.numel()
    counts = torch.bincount(torch.tensor(list(output_ids), dtype=torch.long), minlength=vocab)[:vocab].to(logits.dtype)
    if repetition != 1.0:
        seen = counts > 0
        if prompt_ids:
            seen[torch.tensor(list(prompt_ids), dtype=torch.long)] = True
        factor = torch.where(logits > 0, 1.0 / repetition, repetition)
        logits = torch.where(seen, logits * factor, logits)
    return logits - frequency * counts - presence * (counts > 0).to(logits.dtype)


def truncate(logits: torch.Tensor, params: Any) -> torch.Tensor:
    """``min_p``, then ``top_k``, then ``top_p`` on temperature-scaled logits (masked to -inf)."""
    if params.min_p > 0:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < params.min_p * probs.max(), float("-inf"))
    if params.top_k and 0 < params.top_k < logits.numel():
        kth = logits.topk(params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        ordered, order = logits.sort()  # ascending, as vLLM sorts
        mass = ordered.softmax(-1).cumsum(-1)
        drop = mass <= 1 - params.top_p
        drop[-1] = False  # keep at least the most likely token
        logits = logits.scatter(-1, order, ordered.masked_fill(drop, float("-inf")))
    return logits


def stop_tokens(params: Any) -> list[int]:
    """Tokens that would end the request now: its stop tokens and EOS (which ``min_tokens`` holds back)."""
    tokens = set(getattr(params, "all_stop_token_ids", None) or ())
    tokens |= set(params.stop_token_ids or ())
    return sorted(tokens)
