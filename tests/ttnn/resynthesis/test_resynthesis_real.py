# SPDX-License-Identifier: Apache-2.0
"""Issue 11 on the real Gemma 3 270M: the producer's features, computed by the host forward from
the warm ttnn cache (bfloat16, the dequantized checkpoint's exact weights), equal transformers'
final hidden states of the same prompts within fp32 tolerance; stored as bfloat16 they keep
PCC >= 0.999. ``scripts/run_tests.sh -m real_models``."""

from __future__ import annotations

import os

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"

from models.demos.real_models.prepare import prepare_gemma3_270m  # noqa: E402
from models.resynthesis.features import PositionPolicy  # noqa: E402
from models.resynthesis.parent import FrozenParent  # noqa: E402
from models.resynthesis.waves import FeatureProducer  # noqa: E402
from models.testing.tiny_models import pcc  # noqa: E402

pytestmark = pytest.mark.real_models("gemma3-270m")
PROMPTS = ["The capital of France is", "def fibonacci(n):\n    if n < 2:\n        return n"]


def test_gemma3_270m_features_equal_transformers(tmp_path, cache_root):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    snapshot = prepare_gemma3_270m()
    parent = FrozenParent.load(snapshot, precision="bfloat16", cache_root=cache_root)
    model = AutoModelForCausalLM.from_pretrained(snapshot, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(snapshot)
    policy = PositionPolicy(tile_tokens=8, summaries_per_tile=2)
    for text in PROMPTS:
        tokens = torch.tensor(tokenizer(text)["input_ids"])
        with torch.no_grad():
            expected = model(tokens[None], output_hidden_states=True).hidden_states[-1][0]
        for dtype in ("float32", "bfloat16"):
            producer = FeatureProducer(parent, tmp_path / dtype, policy=policy, feature_dtype=dtype)
            stored = producer.sidecar(tokens).store_boundary(producer.compute(tokens))
            final = stored.final_hidden_t[0, 0].float()
            summary = stored.summary_hidden_t[0].float()
            reference_summary = torch.stack([chunk.mean(0) for chunk in expected.split(policy.chunk_tokens)])
            if dtype == "float32":
                torch.testing.assert_close(final, expected[-1], atol=2e-3, rtol=1e-3)
                torch.testing.assert_close(summary, reference_summary, atol=2e-3, rtol=1e-3)
            else:
                assert pcc(final, expected[-1]) >= 0.999 and pcc(summary, reference_summary) >= 0.999
