# SPDX-License-Identifier: Apache-2.0
"""The TT model interface without vLLM: paged batches, resolution from tt-metal's variables, the
host forward's paged prefill/decode against transformers, and every refusal with its reason.
Needs no vLLM, so it runs in both environments."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from models.testing import REPO_ROOT
from models.testing.tiny_models import hf_greedy, hf_logits, make_checkpoint, pcc

PROMPT = [1, 5, 77, 300, 12, 9, 400, 33]


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory) -> Path:
    return make_checkpoint("qwen3", tmp_path_factory.mktemp("tiny") / "tiny-qwen3")


@pytest.fixture
def model(qwen3, cache_root):
    from transformers import AutoConfig

    from models.vllm_plugin.tt_models import TTQwen3ForCausalLM

    return TTQwen3ForCausalLM.initialize_vllm_model(AutoConfig.from_pretrained(qwen3), None, 2, 64, precision="bfloat16")


@pytest.fixture
def cache_root(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TT_CACHE_PATH", str(tmp_path / "tt-cache"))
    monkeypatch.delenv("TT_TRANSFORMERS_FORCE_MODEL_LOAD", raising=False)
    for name in ("MESH_DEVICE", "MODEL_WEIGHTS_DIR", "HF_MODEL"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "tt-cache"


def test_chunked_prefill_then_decode_equals_transformers(model, qwen3):
    """A prompt prefilled in two chunks (the second from ``start_pos``), then decoded token by token."""
    kv = model.allocate_kv_cache((8, 2, 4, 32), torch.float32, 2)
    table = torch.tensor([[3, 1, 6, 2, 7]])
    tokens = torch.tensor([PROMPT])
    model.prefill_forward(tokens, table, kv, [5])
    logits = model.prefill_forward(tokens, table, kv, [len(PROMPT)], start_pos=[5])
    assert pcc(logits[0, 0], hf_logits(qwen3, PROMPT)[-1]) > 0.9999
    out, position = [int(logits[0, 0].argmax())], len(PROMPT)
    for _ in range(4):
        logits = model.decode_forward(torch.tensor([[out[-1]]]), torch.tensor([position]), table, kv)
        out.append(int(model.read_decode_output(logits)[0, 0].argmax()))
        position += 1
    assert out == hf_greedy(qwen3, PROMPT, 5)


def test_refusals_say_why(model):
    from models.vllm_plugin.paged_kv import PagedBatch
    from models.vllm_plugin.resolve import ResolveError

    with pytest.raises(ValueError, match="KV cache layers; the model has 2"):
        model.allocate_kv_cache((8, 2, 4, 32), torch.float32, 3)
    kv = model.allocate_kv_cache((8, 2, 4, 32), torch.float32, 2)
    with pytest.raises(ValueError, match="need 3 blocks; the page table has 2"):
        model.prefill_forward(torch.tensor([PROMPT + [1, 2]]), torch.tensor([[1, 2]]), kv, [10])
    with pytest.raises(ValueError, match="needs the page table and the KV cache"):
        model.decode_forward(torch.tensor([[1]]), torch.tensor([0]))
    with pytest.raises(ValueError, match="has no new tokens"):
        PagedBatch.build([([], 0, torch.tensor([1]))], 4)
    with pytest.raises(ResolveError, match="tt_data_parallel=2"):
        type(model).initialize_vllm_model(SimpleNamespace(_name_or_path="x"), None, 1, tt_data_parallel=2)


def test_the_requested_model_wins_over_a_checkpoint_variable_naming_another(monkeypatch, cache_root, tmp_path, qwen3):
    """tt-metal's MODEL_WEIGHTS_DIR / HF_MODEL are followed where they name the checkpoint vLLM was
    asked for (in another spelling: a symlink, a hub id of the same snapshot); a different one is
    ignored and reported; an explicit override wins; with no model named at all, they are used."""
    from models.vllm_plugin.resolve import ResolveError, checkpoint_reference

    config = SimpleNamespace(_name_or_path=str(qwen3))
    assert checkpoint_reference(config).reference == str(qwen3)
    alias = tmp_path / "alias"
    alias.symlink_to(qwen3)
    monkeypatch.setenv("MODEL_WEIGHTS_DIR", str(alias))
    assert checkpoint_reference(config) == type(checkpoint_reference(config))(str(alias), ())
    monkeypatch.setenv("MODEL_WEIGHTS_DIR", "/weights/of/another/model")
    monkeypatch.setenv("HF_MODEL", "org/another-model")
    choice = checkpoint_reference(config)
    assert choice.reference == str(qwen3)
    assert choice.ignored == ("MODEL_WEIGHTS_DIR=/weights/of/another/model", "HF_MODEL=org/another-model")
    assert checkpoint_reference(config, explicit="/weights/of/another/model").reference == "/weights/of/another/model"
    assert checkpoint_reference(SimpleNamespace()).reference == "/weights/of/another/model"
    for name in ("MODEL_WEIGHTS_DIR", "HF_MODEL"):
        monkeypatch.delenv(name)
    with pytest.raises(ResolveError, match="no checkpoint named"):
        checkpoint_reference(SimpleNamespace())


def test_resolution_follows_tt_metal(monkeypatch, cache_root):
    from models.vllm_plugin.resolve import ResolveError, mesh_shape_for, precision_for

    assert mesh_shape_for() == (1, 1)
    for value, shape in (("N300", (1, 2)), ("T3K", (1, 8)), ("BH-Galaxy", (8, 4)), ("(2,4)", (2, 4))):
        monkeypatch.setenv("MESH_DEVICE", value)
        assert mesh_shape_for() == shape
    assert mesh_shape_for(SimpleNamespace(shape=(1, 4))) == (1, 4)  # an open device wins
    monkeypatch.setenv("MESH_DEVICE", "N301")
    with pytest.raises(ResolveError, match="MESH_DEVICE='N301'"):
        mesh_shape_for()

    assert precision_for("performance") == "performance" and precision_for("accuracy") == "accuracy"
    assert precision_for("performance", "bfloat16") == "bfloat16"
    with pytest.raises(ResolveError, match="optimizations='fast'"):
        precision_for("fast")


def test_offline_example_refuses_bad_prompts_in_one_line(tmp_path):
    bad = tmp_path / "prompts.json"
    bad.write_text('{"not": "a list"}')
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "offline_inference_tt.py"), "--prompts_json", str(bad)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"offline_inference_tt: --prompts_json {bad}: expected a non-empty JSON list of prompts"


def test_offline_example_refuses_token_prompts_for_chat_in_one_line(tmp_path):
    """``--chat`` renders a chat template, which needs text: token-id prompts are bad usage."""
    prompts = tmp_path / "prompts.json"
    prompts.write_text('[{"prompt_token_ids": [1, 2, 3]}]')
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "offline_inference_tt.py"), "--chat",
                           "--prompts_json", str(prompts)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "offline_inference_tt: --chat takes text prompts only (a chat template renders text)"


@pytest.mark.parametrize("mesh", ["T3K", "TG"])
def test_paged_forward_on_meshes_whose_columns_the_heads_do_not_divide(mesh, cache_root, monkeypatch, tmp_path):
    """SmolLM2-135M's 9 query / 3 KV heads, padded with zero heads on a T3K's 8 and a Galaxy's 4
    columns: the paged prefill and decode still give transformers' tokens."""
    from transformers import AutoConfig

    from models.vllm_plugin.tt_models import TTQwen3ForCausalLM

    checkpoint = make_checkpoint("qwen3", tmp_path / "smol-shaped", num_attention_heads=9, num_key_value_heads=3,
                                 head_dim=32, hidden_size=288)
    monkeypatch.setenv("MESH_DEVICE", mesh)
    model = TTQwen3ForCausalLM.initialize_vllm_model(AutoConfig.from_pretrained(checkpoint), None, 2, 64,
                                                     precision="bfloat16")
    assert model.decoder.cols == {"T3K": 8, "TG": 4}[mesh]
    kv = model.allocate_kv_cache((8, 3, 4, 32), torch.float32, 2)
    table = torch.tensor([[3, 1, 6, 2, 7]])
    logits = model.prefill_forward(torch.tensor([PROMPT]), table, kv, [len(PROMPT)])
    assert pcc(logits[0, 0], hf_logits(checkpoint, PROMPT)[-1]) > 0.9999
    out, position = [int(logits[0, 0].argmax())], len(PROMPT)
    for _ in range(3):
        logits = model.decode_forward(torch.tensor([[out[-1]]]), torch.tensor([position]), table, kv)
        out.append(int(model.read_decode_output(logits)[0, 0].argmax()))
        position += 1
    assert out == hf_greedy(checkpoint, PROMPT, 4)
