# SPDX-License-Identifier: Apache-2.0
"""``vllm.LLM`` on tiny random checkpoints of every family: greedy tokens equal transformers'.

Each engine is a real vLLM 0.33 engine (engine-core subprocess, scheduler, our platform, worker and
runner) built in this process; prompts of different lengths share batches, and more prompts
than ``max_num_seqs`` make the scheduler queue and refill (continuous batching).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from models.testing.tiny_models import hf_greedy, make_checkpoint
from tests.vllm.engines import token_prompts, vllm_engine

PROMPTS = [[1, 5, 77, 300, 12, 9, 400, 33], [7, 8, 9], [100, 200, 300, 400, 50, 60], [42], [3, 1, 4, 1, 5, 9, 2, 6, 5]]
STEPS = 6


def make_gemma4(directory: Path) -> Path:
    from models.testing.tiny_gemma4 import make_text_checkpoint

    return make_text_checkpoint(directory, "kv_shared")


CHECKPOINTS = {
    "llama": lambda d: make_checkpoint("llama", d),
    "qwen3": lambda d: make_checkpoint("qwen3", d),
    "qwen3_moe": lambda d: make_checkpoint("qwen3_moe", d),
    "gemma3": lambda d: make_checkpoint("gemma3", d),
    "gemma4_text": make_gemma4,
}


@pytest.mark.parametrize("family", list(CHECKPOINTS))
def test_greedy_equals_transformers(family, tmp_path, monkeypatch):
    checkpoint = CHECKPOINTS[family](tmp_path / f"tiny-{family}")
    monkeypatch.setenv("TT_CACHE_PATH", str(tmp_path / "tt-cache"))
    from vllm import SamplingParams

    with vllm_engine(checkpoint, precision="bfloat16", max_num_seqs=2) as llm:
        outputs = llm.generate(token_prompts(PROMPTS), SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True))
        report = llm.collective_rpc("startup_report")[0]
    assert not report["warm"]  # a fresh cache: built cold from the checkpoint
    expected = [hf_greedy(checkpoint, prompt, STEPS) for prompt in PROMPTS]
    assert [list(o.outputs[0].token_ids) for o in outputs] == expected


def test_mesh_device_env_lays_the_model_over_two_columns(tmp_path, monkeypatch):
    checkpoint = make_checkpoint("qwen3", tmp_path / "tiny-qwen3")
    monkeypatch.setenv("TT_CACHE_PATH", str(tmp_path / "tt-cache"))
    monkeypatch.setenv("MESH_DEVICE", "N300")
    from vllm import SamplingParams

    with vllm_engine(checkpoint, precision="bfloat16") as llm:
        outputs = llm.generate(token_prompts(PROMPTS[:3]), SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True))
        report = llm.collective_rpc("startup_report")[0]
    assert report["mesh_shape"] == [1, 2] and report["cache_dir"].endswith("mesh_1x2")
    assert [list(o.outputs[0].token_ids) for o in outputs] == [hf_greedy(checkpoint, p, STEPS) for p in PROMPTS[:3]]
