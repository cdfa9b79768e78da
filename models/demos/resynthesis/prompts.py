# SPDX-License-Identifier: Apache-2.0
"""Prompt sets the project generates reproducibly.

``synthetic``: token ids drawn from a seeded generator (any vocabulary; what the tiny test
backbones use). ``text``: windows of the token stream of the docstrings of a fixed list of
Python standard-library modules, tokenized by the model's own tokenizer: real text, shipped with
the pinned Python, identical on every machine with the same Python and tokenizer.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import torch

TEXT_MODULES = ("json", "pathlib", "collections", "functools", "itertools", "argparse", "dataclasses",
                "contextlib", "threading", "subprocess", "shutil", "hashlib", "logging", "typing", "re",
                "textwrap", "statistics", "random", "tempfile", "unittest")


def synthetic(count: int, min_tokens: int, max_tokens: int, vocab_size: int, seed: int = 0) -> list[torch.Tensor]:
    """``count`` prompts of ``min_tokens..max_tokens`` random token ids (seeded)."""
    if not 1 <= min_tokens <= max_tokens or count < 1:
        raise ValueError(f"need count >= 1 and 1 <= min_tokens <= max_tokens, got {count}, {min_tokens}, {max_tokens}")
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_tokens, max_tokens + 1, (count,), generator=generator)
    return [torch.randint(0, vocab_size, (int(n),), generator=generator) for n in lengths]


def stdlib_text() -> str:
    parts = []
    for name in TEXT_MODULES:
        module = importlib.import_module(name)
        parts.append(inspect.getdoc(module) or "")
        for _, member in sorted(inspect.getmembers(module, inspect.isfunction) + inspect.getmembers(module, inspect.isclass)):
            doc = inspect.getdoc(member)
            if doc:
                parts.append(doc)
    return "\n\n".join(parts)


def text(count: int, min_tokens: int, max_tokens: int, tokenizer_dir: Path, seed: int = 0) -> list[torch.Tensor]:
    """``count`` windows of real text (see the module docstring), lengths drawn from ``seed``."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    stream = torch.tensor(tokenizer(stdlib_text(), add_special_tokens=False)["input_ids"], dtype=torch.long)
    generator = torch.Generator().manual_seed(seed)
    bos = torch.tensor([tokenizer.bos_token_id]) if tokenizer.bos_token_id is not None else torch.zeros(0, dtype=torch.long)
    prompts = []
    for _ in range(count):
        length = int(torch.randint(min_tokens, max_tokens + 1, (1,), generator=generator))
        start = int(torch.randint(0, max(1, stream.numel() - length), (1,), generator=generator))
        prompts.append(torch.cat([bos, stream[start:start + length - len(bos)]]))
    return prompts
