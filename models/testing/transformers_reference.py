# SPDX-License-Identifier: Apache-2.0
"""transformers' view of a checkpoint, in whichever environment runs this module: the token ids of
prompts (raw, without special tokens, through the chat template as ``llm.chat`` renders it) and,
with ``--steps``, its fp32 greedy tokens and last-position logits. The vLLM tests run it in the
default environment, so their reference never comes from the environment under test.

    python -m models.testing.transformers_reference SNAPSHOT PROMPTS_JSON [--chat] [--steps N] [--logits OUT.pt]

Prints one JSON line: ``{"transformers": version, "prompts": [{"raw", "plain", "chat", "ids", "tokens"}]}``
(``ids`` = ``chat`` with ``--chat``, else ``raw``; ``tokens`` only with ``--steps``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any


def token_ids(tokenizer, prompt: str) -> dict[str, Any]:
    """The ids of ``prompt`` three ways; ``chat`` is None without a chat template."""
    ids = {"raw": tokenizer(prompt).input_ids, "plain": tokenizer(prompt, add_special_tokens=False).input_ids,
           "chat": None, "rendered": None}
    if tokenizer.chat_template:
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
        ids["rendered"], ids["chat"] = text, tokenizer(text, add_special_tokens=False).input_ids
    return ids


def reference(snapshot: Path, prompts: list[str], *, chat: bool, steps: int, logits_out: Path | None) -> dict[str, Any]:
    os.environ["HF_HUB_OFFLINE"] = "1"
    import transformers
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(snapshot)
    rows = []
    for prompt in prompts:
        row = token_ids(tokenizer, prompt)
        row["ids"] = row["chat"] if chat else row["raw"]
        rows.append(row)
    if steps:
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(1)  # see tests/ttnn/real_models/conftest.py: one thread is faster on a shared host
        model = AutoModelForCausalLM.from_pretrained(snapshot, dtype=torch.float32).eval()
        last = []
        with torch.no_grad():
            for row in rows:
                out = model.generate(torch.tensor([row["ids"]]), max_new_tokens=steps, do_sample=False)
                row["tokens"] = out[0, len(row["ids"]):].tolist()
                last.append(model(torch.tensor([row["ids"]])).logits[0, -1])
        if logits_out is not None:
            torch.save(torch.stack(last), logits_out)
    return {"transformers": transformers.__version__, "python": sys.executable, "prompts": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m models.testing.transformers_reference")
    parser.add_argument("snapshot", type=Path)
    parser.add_argument("prompts", help="a JSON list of prompt strings")
    parser.add_argument("--chat", action="store_true", help="ids = the chat template's ids")
    parser.add_argument("--steps", type=int, default=0, help="greedy tokens to generate (0: ids only)")
    parser.add_argument("--logits", type=Path, default=None, help="save the last-position fp32 logits here")
    args = parser.parse_args(argv)
    result = reference(args.snapshot, json.loads(args.prompts), chat=args.chat, steps=args.steps,
                       logits_out=args.logits)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
