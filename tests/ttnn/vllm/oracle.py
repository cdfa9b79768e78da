# SPDX-License-Identifier: Apache-2.0
"""transformers as the oracle of the vLLM tests: its fp32 logits of the same tokens, and greedy
decoding with a logits rule applied at every step (vLLM's own functions where it has them)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path

import torch

# (logits [vocab], prompt, output so far) -> processed logits
LogitsRule = Callable[[torch.Tensor, list[int], list[int]], torch.Tensor]


@lru_cache(maxsize=4)
def hf_model(checkpoint: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()


@torch.no_grad()
def hf_logits(checkpoint: Path, tokens: Sequence[int]) -> torch.Tensor:
    """``[T, vocab]`` fp32 logits of every position, one forward over the whole sequence."""
    return hf_model(str(checkpoint))(torch.tensor([list(tokens)])).logits[0]


@torch.no_grad()
def hf_generate(checkpoint: Path, prompt: Sequence[int], steps: int) -> list[int]:
    """transformers' own greedy ``generate`` (its KV cache, and its family quirks such as Phi-3's
    cache reset where LongRoPE switches to the long factors)."""
    out = hf_model(str(checkpoint)).generate(torch.tensor([list(prompt)]), max_new_tokens=steps, do_sample=False)
    return out[0, len(prompt):].tolist()


def hf_log_softmax(checkpoint: Path, tokens: Sequence[int]) -> torch.Tensor:
    return hf_logits(checkpoint, tokens).log_softmax(-1)


def hf_greedy_with(checkpoint: Path, prompt: Sequence[int], steps: int, rule: LogitsRule) -> list[int]:
    """Greedy tokens when ``rule`` rewrites each step's logits (full recompute each step)."""
    prompt, out = list(prompt), []
    for _ in range(steps):
        logits = rule(hf_logits(checkpoint, prompt + out)[-1].clone(), prompt, list(out))
        out.append(int(logits.argmax()))
    return out


def tiny_tokenizer(directory: Path, vocab_size: int) -> None:
    """A word-level tokenizer over ``t0 .. t<vocab-1>`` saved beside a tiny checkpoint: token ``i``
    is the word ``t<i>`` (so ``bad_words=["t5 t7"]`` is the token sequence [5, 7])."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    core.pre_tokenizer = WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=core, unk_token="t0", bos_token="t1", eos_token="t2").save_pretrained(directory)
