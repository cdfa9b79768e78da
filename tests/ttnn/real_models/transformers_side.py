# SPDX-License-Identifier: Apache-2.0
"""transformers' side of the parity tests, run in a process of its own so its float32 model (7 GB for
Qwen2.5-Coder 1.5B) is gone before the caches are built and read:

    python -m tests.real_models.transformers_side SNAPSHOT MODEL_NAME OUT.pt STEPS PROMPT...

writes ``{"prompts": [ids], "logits": [[T, vocab] float32], "greedy": [[STEPS ids]]}`` to OUT.pt.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from models.demos.real_models.known import KnownModel, known_model


def prompt_ids(tokenizer, model: KnownModel, text: str) -> list[int]:
    """The prompt's ids: through the chat template for an instruct model, plain otherwise."""
    if model.chat:
        encoded = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                tokenize=True, return_dict=True)
        return list(encoded["input_ids"])
    return list(tokenizer(text).input_ids)


@torch.no_grad()
def greedy(hf, ids: list[int], steps: int) -> list[int]:
    """transformers' greedy decoding (its KV cache, as ``generate`` does), never stopping at EOS."""
    out = hf(torch.tensor([ids]), use_cache=True)
    tokens = []
    for step in range(steps):
        tokens.append(int(out.logits[0, -1].argmax()))
        if step + 1 < steps:
            out = hf(torch.tensor([tokens[-1:]]), cache=out.cache, use_cache=True)
    return tokens


@torch.no_grad()
def expected(snapshot: Path, model: KnownModel, prompts: list[str], steps: int) -> dict:
    """float32 transformers on the bf16 checkpoint: each prompt's logits and ``steps`` greedy tokens."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(snapshot)
    ids = [prompt_ids(tokenizer, model, text) for text in prompts]
    hf = AutoModelForCausalLM.from_pretrained(snapshot, dtype=torch.float32).eval()
    return {"prompts": ids, "logits": [hf(torch.tensor([i])).logits[0] for i in ids],
            "greedy": [greedy(hf, i, steps) for i in ids]}


if __name__ == "__main__":
    os.environ["HF_HUB_OFFLINE"] = "1"
    torch.set_num_threads(1)  # see tests/real_models/conftest.py: one_torch_thread
    snapshot, name, out, steps, *texts = sys.argv[1:]
    torch.save(expected(Path(snapshot), known_model(name), texts, int(steps)), out)
