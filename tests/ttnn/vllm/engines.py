# SPDX-License-Identifier: Apache-2.0
"""Helpers of the vLLM tests: an engine in this process, and the offline example in a fresh one."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from models.testing import REPO_ROOT

OFFLINE_SCRIPT = REPO_ROOT / "scripts" / "offline_inference_tt.py"


def token_prompts(prompts: Sequence[Sequence[int]]) -> list[dict[str, list[int]]]:
    return [{"prompt_token_ids": list(p)} for p in prompts]


@contextlib.contextmanager
def vllm_engine(model: str | Path, *, precision: str = "bfloat16", max_num_seqs: int = 4,
                max_model_len: int = 128, tokenizer: bool = False, additional_config: dict | None = None,
                **engine_args: Any) -> Iterator[Any]:
    """A real ``vllm.LLM`` (scheduler, KV cache manager, our platform, worker and runner; the
    engine core in this process, see conftest), shut down on exit. ``engine_args``: any other
    ``LLM(...)`` argument (``max_num_batched_tokens``, ``logprobs_mode``, ...)."""
    from vllm import LLM

    llm = LLM(model=str(model), skip_tokenizer_init=not tokenizer, max_num_seqs=max_num_seqs,
              max_model_len=max_model_len,
              additional_config={"tt": {"precision": precision}, **(additional_config or {})},
              **engine_args)
    try:
        yield llm
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


def run_offline(*args: str, env: dict[str, str], report: Path, prefix: Sequence[str] = (),
                timeout: float = 900) -> tuple[subprocess.CompletedProcess, dict[str, Any] | None]:
    """``scripts/offline_inference_tt.py`` in a fresh process (``prefix``: a wrapper such as
    setpriv); returns the process and its JSON report (None when it wrote none)."""
    report.unlink(missing_ok=True)
    proc = subprocess.run([*prefix, sys.executable, str(OFFLINE_SCRIPT), *args, "--report", str(report)],
                          cwd=REPO_ROOT, env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1", **env}, capture_output=True, text=True, timeout=timeout)
    return proc, json.loads(report.read_text()) if report.is_file() else None
