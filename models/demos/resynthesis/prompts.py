# SPDX-License-Identifier: Apache-2.0
"""Prompt sets: generated reproducibly, or read from a file.

``synthetic``: token ids drawn from a seeded generator (any vocabulary; what the tiny test
backbones use). ``text``: windows of the token stream of the docstrings of a fixed list of
Python standard-library modules, tokenized by the model's own tokenizer: real text, shipped with
the pinned Python, identical on every machine with the same Python and tokenizer.
``from_file``: a file of the user's prompts (see :func:`from_file`).
"""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path
from typing import Any

import torch

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


class PromptFileError(ValueError):
    """A prompt file that cannot be used as it is (the message names the line)."""


def has_tokenizer(directory: Path | None) -> bool:
    """Whether a checkpoint directory ships a tokenizer."""
    return directory is not None and any((Path(directory) / name).is_file() for name in TOKENIZER_FILES)


def load_tokenizer(directory: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory)


def _line_prompt(line: str, jsonl: bool, where: str) -> str | list[int]:
    if not jsonl:
        return line
    try:
        value = json.loads(line)
    except ValueError as error:
        raise PromptFileError(f"{where}: not JSON ({error})") from None
    if isinstance(value, dict):
        value = value.get("text", value.get("tokens", value.get("input_ids")))
    if isinstance(value, str) or (isinstance(value, list) and all(type(v) is int for v in value)):
        return value
    raise PromptFileError(f"{where}: expected a string, a list of token ids, or an object with \"text\" or "
                          "\"tokens\"")


def from_file(path: Path, tokenizer: Any | None, vocab_size: int) -> list[torch.Tensor]:
    """The prompts of ``path``: one per non-empty line of a text file, or one per line of a
    ``.jsonl`` file (a JSON string, a list of token ids, or ``{"text": ...}`` /
    ``{"tokens": [...]}``). Text is tokenized by ``tokenizer`` (its special tokens included);
    PromptFileError for an unreadable or empty file, text without a tokenizer, or token ids
    outside ``[0, vocab_size)``."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise PromptFileError(f"cannot read prompt file {path}: {error}") from None
    jsonl = path.suffix == ".jsonl"
    prompts = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        value = _line_prompt(line, jsonl, where)
        if isinstance(value, str):
            if tokenizer is None:
                raise PromptFileError(f"{where}: a text prompt, but the model has no tokenizer (give token ids in "
                                      "a .jsonl file: [1, 2, 3] or {\"tokens\": [1, 2, 3]})")
            value = tokenizer(value)["input_ids"]
        if not value:
            raise PromptFileError(f"{where}: an empty prompt")
        if min(value) < 0 or max(value) >= vocab_size:
            raise PromptFileError(f"{where}: token ids must be in [0, {vocab_size})")
        prompts.append(torch.tensor(value, dtype=torch.long))
    if not prompts:
        raise PromptFileError(f"prompt file {path} holds no prompts")
    return prompts

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


def text(count: int, min_tokens: int, max_tokens: int, tokenizer: Any, seed: int = 0) -> list[torch.Tensor]:
    """``count`` windows of real text (see the module docstring) tokenized by ``tokenizer`` (or
    the tokenizer of a checkpoint directory), lengths drawn from ``seed``."""
    if isinstance(tokenizer, (str, Path)):
        tokenizer = load_tokenizer(Path(tokenizer))
    stream = torch.tensor(tokenizer(stdlib_text(), add_special_tokens=False)["input_ids"], dtype=torch.long)
    generator = torch.Generator().manual_seed(seed)
    bos = torch.tensor([tokenizer.bos_token_id]) if tokenizer.bos_token_id is not None else torch.zeros(0, dtype=torch.long)
    prompts = []
    for _ in range(count):
        length = int(torch.randint(min_tokens, max_tokens + 1, (1,), generator=generator))
        start = int(torch.randint(0, max(1, stream.numel() - length), (1,), generator=generator))
        prompts.append(torch.cat([bos, stream[start:start + length - len(bos)]]))
    return prompts
