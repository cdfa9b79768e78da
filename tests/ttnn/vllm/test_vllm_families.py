# SPDX-License-Identifier: Apache-2.0
"""``vllm.LLM`` on a tiny random checkpoint of every family of the family table, on one device and
over an N300 mesh (1x2): greedy tokens equal transformers' ``generate``.

Each engine is a real vLLM 0.33 engine (scheduler, KV cache manager, our platform, worker and
runner) built in this process; prompts of different lengths share batches, and more prompts than
``max_num_seqs`` make the scheduler queue and refill (continuous batching). The prompts reach each
family's quirk: past the sliding window (4 tokens for Qwen2, Mistral and Gemma 3, 6 for Phi-3),
and for Phi-3 past LongRoPE's original context (16): one prompt is longer from the start, one
crosses it while decoding (transformers then recomputes the sequence with the long factors).
A last prompt shares its first two KV blocks with an earlier one: served from vLLM's prefix cache
(except for Phi-3), still transformers' tokens.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from models.registry import ARCHITECTURES, FAMILIES
from models.testing.tiny_models import LONGROPE_ORIGINAL_CONTEXT, make_checkpoint
from models.vllm_plugin.architectures import tt_architecture
from tests.ttnn.vllm.engines import token_prompts, vllm_engine
from tests.ttnn.vllm.oracle import hf_generate

STEPS = 8
LONG = [(37 * i + 11) % 500 for i in range(LONGROPE_ORIGINAL_CONTEXT + 4)]  # past the switch from the start
CROSSING = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8]  # 12 + 8 steps: crosses 16 while decoding
PROMPTS = [LONG, [7, 8, 9], CROSSING, [42]]
SHARED = LONG[:16] + [101, 102, 103]  # LONG's first two 8-token blocks, then its own tokens
BLOCK = 8  # KV block size of these engines, so that short prompts fill whole blocks
MESHES = {"1x1": None, "N300": "N300"}


def make_gemma4(directory: Path) -> Path:
    from models.testing.tiny_gemma4 import make_text_checkpoint

    return make_text_checkpoint(directory, "kv_shared")


# checkpoint case -> (family, maker); phi3_partial_rotary is Phi-4-mini's variant of the phi3 family.
CHECKPOINTS = {
    "llama": ("llama", lambda d: make_checkpoint("llama", d)),
    "mistral": ("mistral", lambda d: make_checkpoint("mistral", d)),
    "qwen2": ("qwen2", lambda d: make_checkpoint("qwen2", d)),
    "phi3": ("phi3", lambda d: make_checkpoint("phi3", d)),
    "phi3_partial_rotary": ("phi3", lambda d: make_checkpoint("phi3_partial_rotary", d)),
    "qwen3": ("qwen3", lambda d: make_checkpoint("qwen3", d)),
    "qwen3_moe": ("qwen3_moe", lambda d: make_checkpoint("qwen3_moe", d)),
    "gemma3": ("gemma3", lambda d: make_checkpoint("gemma3", d)),
    "gemma4_text": ("gemma4", make_gemma4),
}


def test_every_family_of_the_table_is_served_and_tested():
    """The plugin's architectures are the family table's, and a family added there without a
    checkpoint here fails this test."""
    from vllm import ModelRegistry
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # what every engine does first: our entry point registers the TT classes
    known = ModelRegistry.get_supported_archs()
    assert all(tt_architecture(arch) in known for arch in ARCHITECTURES)
    assert {family.name for family in FAMILIES} == {family for family, _ in CHECKPOINTS.values()}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {case: make(root / f"tiny-{case}") for case, (_, make) in CHECKPOINTS.items()}


@pytest.fixture(scope="module")
def expected(checkpoints) -> dict[str, list[list[int]]]:
    return {case: [hf_generate(path, prompt, STEPS) for prompt in [*PROMPTS, SHARED]] for case, path in checkpoints.items()}


@pytest.mark.parametrize("mesh", list(MESHES))
@pytest.mark.parametrize("case", list(CHECKPOINTS))
def test_greedy_equals_transformers(case, mesh, checkpoints, expected, tmp_path, monkeypatch):
    monkeypatch.setenv("TT_CACHE_PATH", str(tmp_path / "tt-cache"))
    if MESHES[mesh]:
        monkeypatch.setenv("MESH_DEVICE", MESHES[mesh])
    else:
        monkeypatch.delenv("MESH_DEVICE", raising=False)
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True)
    with vllm_engine(checkpoints[case], max_num_seqs=2, max_model_len=64, block_size=BLOCK) as llm:
        outputs = llm.generate(token_prompts(PROMPTS), params)
        shared = llm.generate(token_prompts([SHARED]), params)[0]  # after LONG: its first blocks are cached
        report = llm.collective_rpc("startup_report")[0]
    assert not report["warm"]  # a fresh cache: built cold from the checkpoint
    assert report["model"] == tt_architecture(next(a for a, f in ARCHITECTURES.items() if f == CHECKPOINTS[case][0]))
    assert report["cache_dir"].endswith("mesh_1x2" if MESHES[mesh] else "mesh_1x1")
    assert [list(o.outputs[0].token_ids) for o in outputs] == expected[case][:-1]
    assert list(shared.outputs[0].token_ids) == expected[case][-1]
    # Prefix caching serves every family but LongRoPE's (Phi-3), whose keys depend on the sequence length.
    assert shared.num_cached_tokens == (0 if CHECKPOINTS[case][0] == "phi3" else 2 * BLOCK)
