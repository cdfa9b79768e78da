# SPDX-License-Identifier: Apache-2.0
"""The model ``vllm.LLM`` was asked for is the model served: a ``HF_MODEL`` left in the environment
from another model is ignored with a warning naming both (it used to replace the requested model
silently when the architecture matched); ``additional_config={"checkpoint": ...}`` is the explicit
override. Two tiny Llama checkpoints of one architecture, different weights."""

from __future__ import annotations

import pytest
from loguru import logger

from models.testing.tiny_models import make_checkpoint
from tests.ttnn.vllm.engines import token_prompts, vllm_engine
from tests.ttnn.vllm.oracle import hf_generate

PROMPTS = [[1, 5, 77, 300, 12, 9], [7, 8, 9]]
STEPS = 6


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return {"requested": make_checkpoint("llama", root / "requested", seed=0),
            "leftover": make_checkpoint("llama", root / "leftover", seed=1)}


@pytest.fixture(scope="module")
def expected(checkpoints):
    tokens = {name: [hf_generate(path, p, STEPS) for p in PROMPTS] for name, path in checkpoints.items()}
    assert tokens["requested"] != tokens["leftover"]  # the two models are told apart by their tokens
    return tokens


@pytest.fixture
def clean_env(tmp_path, monkeypatch):
    monkeypatch.setenv("TT_CACHE_PATH", str(tmp_path / "tt-cache"))
    for name in ("HF_MODEL", "MODEL_WEIGHTS_DIR"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def serve(model, **kwargs):
    from vllm import SamplingParams

    warnings: list[str] = []
    sink = logger.add(lambda message: warnings.append(str(message)), level="WARNING")
    try:
        with vllm_engine(model, **kwargs) as llm:
            outputs = llm.generate(token_prompts(PROMPTS), SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True))
            report = llm.collective_rpc("startup_report")[0]
    finally:
        logger.remove(sink)
    return [list(o.outputs[0].token_ids) for o in outputs], report, warnings


@pytest.mark.parametrize("variable", ["HF_MODEL", "MODEL_WEIGHTS_DIR"])
def test_a_leftover_checkpoint_variable_does_not_replace_the_requested_model(checkpoints, expected, clean_env, variable):
    clean_env.setenv(variable, str(checkpoints["leftover"]))
    tokens, report, warnings = serve(checkpoints["requested"])
    assert tokens == expected["requested"]
    assert report["checkpoint"] == str(checkpoints["requested"])
    assert report["ignored_overrides"] == [f"{variable}={checkpoints['leftover']}"]
    assert any(f"{variable}={checkpoints['leftover']}" in w and str(checkpoints["requested"]) in w and "IGNORED" in w
               for w in warnings), warnings


def test_an_explicit_checkpoint_override_is_served(checkpoints, expected, clean_env):
    tokens, report, _ = serve(checkpoints["requested"], additional_config={"checkpoint": str(checkpoints["leftover"])})
    assert tokens == expected["leftover"]
    assert report["checkpoint"] == str(checkpoints["leftover"]) and report["ignored_overrides"] == []
