# SPDX-License-Identifier: Apache-2.0
"""Qwen2, Mistral and Phi-3 loaders end to end: real tiny checkpoints from transformers' own
config classes, real tensorbins on the mock cluster.

The layout proof is the one of :mod:`tests.families.test_loaders`: the tensor-parallel host forward of
:class:`~models.common.reference.ReferenceDecoder` reads every weight back from the cached ttnn
tensors and must reproduce transformers' logits and greedy tokens. Each family's difference is
also shown to matter (drop the bias, the window or the long factors, and the logits no longer
match), so a parity test that passes is not passing by accident."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from models.common.checkpoint import CheckpointError, CheckpointShapeError, read_config
from models.common.decoder import column_blocked_heads
from models.common.model_args import ModelArgs, attention_layer_types
from models.common.reference import ReferenceDecoder, rope_inv_freq
from models.common.weight_cache.tensor_cache import host_shards
from models.mistral import MistralLoader
from models.phi3 import Phi3Loader
from models.phi3.loader import phi3_rope_parameters
from models.qwen2 import Qwen2Loader
from models.registry import family_of, loader_class
from models.testing.tiny_models import WARM_START_PROBE
from models.testing.tiny_models import LONGROPE_ORIGINAL_CONTEXT, hf_greedy, hf_logits, make_checkpoint, pcc, tensors_of

# checkpoint name -> loader; phi3_partial_rotary is Phi-4-mini's variant (partial rotary, tied head)
LOADERS = {"qwen2": Qwen2Loader, "mistral": MistralLoader, "phi3": Phi3Loader, "phi3_partial_rotary": Phi3Loader}
PROMPT = [1, 5, 77, 300, 12, 9, 400, 33]
# Longer than Phi-3's original context (16 here): LongRoPE switches to its long factors.
LONG_PROMPT = [(37 * i + 11) % 500 for i in range(LONGROPE_ORIGINAL_CONTEXT + 4)]
PROMPTS = {"short": PROMPT, "long": LONG_PROMPT}
CASES = [(name, "short") for name in LOADERS] + [("phi3", "long"), ("phi3_partial_rotary", "long")]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {name: make_checkpoint(name, root / f"tiny-{name}") for name in LOADERS}


@pytest.fixture(scope="module")
def reference_logits(checkpoints) -> dict[tuple[str, str], torch.Tensor]:
    return {(name, prompt): hf_logits(checkpoints[name], PROMPTS[prompt]) for name, prompt in CASES}


def load(name: str, checkpoints, **options):
    return LOADERS[name](checkpoints[name], **options).load()


def max_error(loaded, expected: torch.Tensor, prompt: list[int]) -> float:
    return (ReferenceDecoder(loaded).logits(prompt) - expected).abs().max().item()


def checkpoint_tensor(checkpoint: Path, name: str) -> torch.Tensor:
    with safe_open(checkpoint / "model.safetensors", framework="pt") as reader:
        return reader.get_tensor(name)


def rewrite_config(checkpoint: Path, edit) -> None:
    path = checkpoint / "config.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config, indent=2))


# -- parity with transformers -------------------------------------------------------------------


@pytest.mark.parametrize("name, prompt", CASES)
@pytest.mark.parametrize("mesh", [(1, 1), (1, 2), (1, 8)])
def test_bfloat16_cache_reproduces_transformers_logits(name, prompt, mesh, checkpoints, reference_logits, cache_root):
    loaded = load(name, checkpoints, mesh_shape=mesh, precision="bfloat16")
    assert not loaded.warm
    logits = ReferenceDecoder(loaded).logits(PROMPTS[prompt])
    expected = reference_logits[name, prompt]
    assert (logits - expected).abs().max().item() < 1e-3  # same bf16 weights, fp32 math either side
    assert torch.equal(logits.argmax(-1), expected.argmax(-1))


@pytest.mark.parametrize("name", list(LOADERS))
def test_galaxy_mesh_2d_layout_reproduces_logits(name, checkpoints, reference_logits, cache_root):
    """(8, 4): the model dimension splits over rows too; the q/k/v bias splits over columns only."""
    loaded = load(name, checkpoints, mesh_shape="TG", precision="bfloat16")
    assert len(host_shards(loaded.weights["layers.0.attention.wqkv"])) == 32
    assert max_error(loaded, reference_logits[name, "short"], PROMPT) < 1e-3


@pytest.mark.parametrize("name, prompt", CASES)
def test_bfloat16_warm_cache_greedy_matches_transformers_for_8_steps(name, prompt, checkpoints, cache_root):
    """Phi-3's short prompt stays within the original context for all 8 steps, its long one past
    it from the start: transformers switches factors by length, as the reference does."""
    load(name, checkpoints, mesh_shape=(1, 2), precision="bfloat16")
    warm = load(name, checkpoints, mesh_shape=(1, 2), precision="bfloat16")
    assert warm.warm
    assert ReferenceDecoder(warm).greedy(PROMPTS[prompt], 8) == hf_greedy(checkpoints[name], PROMPTS[prompt], 8)


@pytest.mark.parametrize("name", list(LOADERS))
@pytest.mark.parametrize("mesh", [(1, 1), (1, 8)])
def test_bfloat8_b_cache_logits_pcc(name, mesh, checkpoints, reference_logits, cache_root):
    loaded = load(name, checkpoints, mesh_shape=mesh, precision="bfloat8_b")
    assert pcc(ReferenceDecoder(loaded).logits(PROMPT), reference_logits[name, "short"]) >= 0.99


@pytest.mark.parametrize("name", list(LOADERS))
def test_warm_build_is_bit_identical_to_cold(name, checkpoints, cache_root):
    cold = load(name, checkpoints, mesh_shape=(1, 2), precision="bfloat8_b")
    warm = load(name, checkpoints, mesh_shape=(1, 2), precision="bfloat8_b")
    assert not cold.warm and warm.warm
    assert warm.args.layer_types == cold.args.layer_types and warm.args.rope_scaling == cold.args.rope_scaling
    cold_tensors, warm_tensors = tensors_of(cold), tensors_of(warm)
    assert cold_tensors.keys() == warm_tensors.keys()
    for weight in cold_tensors:
        assert all(torch.equal(a, b) for a, b in zip(cold_tensors[weight], warm_tensors[weight], strict=True)), weight


@pytest.mark.parametrize("name", ["qwen2", "mistral", "phi3"])
def test_warm_build_reads_no_checkpoint_file(name, checkpoints, reference_logits, cache_root, tmp_path):
    checkpoint = shutil.copytree(checkpoints[name], tmp_path / f"tiny-{name}")
    LOADERS[name](checkpoint, mesh_shape=(1, 2), precision="bfloat16").load()
    for weights in checkpoint.glob("*.safetensors"):
        weights.unlink()
    warm = LOADERS[name](checkpoint, mesh_shape=(1, 2), precision="bfloat16").load()
    assert warm.warm
    assert max_error(warm, reference_logits[name, "short"], PROMPT) < 1e-3


@pytest.mark.parametrize("name", ["qwen2", "phi3"])
def test_warm_start_process_imports_nothing_heavy(name, checkpoints, cache_root):
    """The bias fusion and the fused-weight splits stay cheap on placeholders: a warm start pays
    only for torch + ttnn (the probe of :mod:`tests.families.test_loaders`, by ``model_type``)."""
    load(name, checkpoints, precision="bfloat8_b")
    out = subprocess.run([sys.executable, "-c", WARM_START_PROBE, family_of(read_config(checkpoints[name])),
                          str(checkpoints[name])], env=dict(os.environ), capture_output=True, text=True)
    report = [line for line in out.stdout.splitlines() if line.startswith(("WARM", "COLD"))]
    assert report == ["WARM -"], out.stdout[-2000:] + out.stderr[-2000:]


# -- each family's difference, laid out and mattering -------------------------------------------


def test_qwen2_bias_is_column_blocked_like_its_weight(checkpoints, cache_root):
    """Column ``c`` of ``bqkv`` holds the q, k and v biases of exactly the heads whose weights
    column ``c`` of ``wqkv`` holds; bf16 whatever the weights' precision."""
    checkpoint = checkpoints["qwen2"]
    loaded = load("qwen2", checkpoints, mesh_shape=(1, 8), precision="bfloat8_b")
    attention = "model.layers.1.self_attn."
    biases = [checkpoint_tensor(checkpoint, f"{attention}{n}_proj.bias").float() for n in "qkv"]
    expected = column_blocked_heads(*biases, loaded.args, cols=8).reshape(8, -1)
    shards = host_shards(loaded.weights["layers.1.attention.bqkv"])
    assert len(shards) == 8 and all(s.dtype == torch.bfloat16 for s in shards)
    for column, shard in enumerate(shards):
        assert torch.equal(shard.float().reshape(-1), expected[column]), column
    head_dim = loaded.args.head_dim  # column 3: query head 3, then KV head 0 (2 KV heads over 8 columns)
    assert torch.equal(expected[3][:head_dim], biases[0][3 * head_dim:4 * head_dim])
    assert torch.equal(expected[3][head_dim:2 * head_dim], biases[1][:head_dim])


def test_qwen2_tied_head_is_the_embedding(checkpoints, cache_root):
    checkpoint = checkpoints["qwen2"]
    with safe_open(checkpoint / "model.safetensors", framework="pt") as reader:
        assert "lm_head.weight" not in reader.keys()
    loaded = load("qwen2", checkpoints, precision="bfloat16")
    embedding = checkpoint_tensor(checkpoint, "model.embed_tokens.weight")
    assert torch.equal(host_shards(loaded.weights["output"])[0], embedding.T)


def test_phi3_fused_projections_are_split_into_the_shared_layout(checkpoints, cache_root):
    """``qkv_proj`` rows (q, k, v) re-fused column-blocked; ``gate_up_proj`` halves as w1 / w3."""
    checkpoint = checkpoints["phi3"]
    loaded = load("phi3", checkpoints, mesh_shape=(1, 2), precision="bfloat16")
    a, prefix = loaded.args, "model.layers.0."
    assert a.fuse_qkv and a.fuse_mlp
    qkv = checkpoint_tensor(checkpoint, prefix + "self_attn.qkv_proj.weight")
    q, k, v = qkv.split([a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim, a.n_kv_heads * a.head_dim])
    wqkv = torch.cat(host_shards(loaded.weights["layers.0.attention.wqkv"]), dim=-1)
    assert torch.equal(wqkv, column_blocked_heads(q, k, v, a, cols=2).T)
    gate, up = checkpoint_tensor(checkpoint, prefix + "mlp.gate_up_proj.weight").chunk(2)
    for weight, half in (("w1", gate), ("w3", up)):
        assert torch.equal(torch.cat(host_shards(loaded.weights[f"layers.0.feed_forward.{weight}"]), -1), half.T)


def without(loaded, **args_changes):
    """The same cached tensors read with some architecture fact taken away."""
    return dataclasses.replace(loaded, args=dataclasses.replace(loaded.args, **args_changes))


@pytest.mark.parametrize("name, prompt, take_away", [
    ("qwen2", "short", "bias"),
    ("qwen2", "short", "window"),
    ("mistral", "short", "window"),
    ("phi3", "short", "window"),
    ("phi3", "short", "longrope"),
    ("phi3", "long", "long factors"),
    ("phi3_partial_rotary", "short", "partial rotary"),
])
def test_each_family_difference_matters(name, prompt, take_away, checkpoints, reference_logits, cache_root):
    loaded = load(name, checkpoints, mesh_shape=(1, 2), precision="bfloat16")
    expected = reference_logits[name, prompt]
    assert max_error(loaded, expected, PROMPTS[prompt]) < 1e-3
    rope = dict(loaded.args.rope_scaling or {})
    if take_away == "bias":
        for layer in range(loaded.args.n_layers):
            loaded.weights.pop(f"layers.{layer}.attention.bqkv")
        changed = loaded
    elif take_away == "window":
        changed = without(loaded, layer_types=("full_attention",) * loaded.args.n_layers)
    elif take_away == "longrope":  # plain RoPE: no factors, no attention scale
        changed = without(loaded, rope_scaling={"rope_type": "default", "rope_theta": rope["rope_theta"]})
    elif take_away == "long factors":
        changed = without(loaded, rope_scaling={**rope, "long_factor": rope["short_factor"]})
    else:
        changed = without(loaded, rope_scaling={**rope, "partial_rotary_factor": 1.0,
                                                "short_factor": rope["short_factor"] * 2})
    assert max_error(changed, expected, PROMPTS[prompt]) > 1e-2


def test_hub_style_configs_load_like_transformers(checkpoints, cache_root, tmp_path):
    """Configs as the hub ships them: Qwen2.5's sliding window present but off, no layer_types;
    Phi-3-mini-128k's ``rope_scaling`` (``type``, no theta) with the original context at top level."""
    qwen = shutil.copytree(checkpoints["qwen2"], tmp_path / "qwen2-hub")

    def qwen25(config):
        del config["layer_types"]
        config.update(use_sliding_window=False, sliding_window=131072, max_window_layers=21)

    rewrite_config(qwen, qwen25)
    loaded = Qwen2Loader(qwen, precision="bfloat16").load()
    assert loaded.args.layer_types == ("full_attention",) * 2
    assert max_error(loaded, hf_logits(qwen, PROMPT), PROMPT) < 1e-3

    phi = shutil.copytree(checkpoints["phi3"], tmp_path / "phi3-hub")

    def phi3_128k(config):
        rope = config.pop("rope_parameters")
        config["rope_scaling"] = {"type": "longrope", "short_factor": rope["short_factor"],
                                  "long_factor": rope["long_factor"]}
        config.update(rope_theta=rope["rope_theta"], original_max_position_embeddings=LONGROPE_ORIGINAL_CONTEXT)

    rewrite_config(phi, phi3_128k)
    loaded = Phi3Loader(phi, precision="bfloat16").load()
    assert loaded.args.rope_scaling["rope_type"] == "longrope"
    assert max_error(loaded, hf_logits(phi, LONG_PROMPT), LONG_PROMPT) < 1e-3


# -- config facts and bad input -----------------------------------------------------------------


@pytest.mark.parametrize("config, expected", [
    (dict(layer_types=["full_attention", "sliding_attention"], sliding_window=4), ("full", "sliding")),
    (dict(sliding_window=4), ("sliding", "sliding")),  # Mistral, Phi-3: every layer
    (dict(sliding_window=None), ("full", "full")),
    (dict(use_sliding_window=False, sliding_window=131072, max_window_layers=1), ("full", "full")),  # Qwen2.5
    (dict(use_sliding_window=True, sliding_window=4, max_window_layers=1), ("full", "sliding")),
], ids=["listed", "mistral", "no-window", "qwen2-off", "qwen2-on"])
def test_which_layers_slide(config, expected):
    assert attention_layer_types(config, 2) == tuple(f"{kind}_attention" for kind in expected)


@pytest.mark.parametrize("model_type", ["qwen2", "mistral", "phi3"])
def test_registered_by_model_type(model_type):
    assert family_of({"model_type": model_type}) == model_type
    assert loader_class(model_type) is {"qwen2": Qwen2Loader, "mistral": MistralLoader, "phi3": Phi3Loader}[model_type]


@pytest.mark.parametrize("kind", ["su", "yarn", "longrope"])
def test_phi3_rope_kinds_read_as_longrope(kind):
    config = {"rope_scaling": {"type": kind, "short_factor": [1.0], "long_factor": [2.0]}, "rope_theta": 500.0,
              "original_max_position_embeddings": 4096, "max_position_embeddings": 131072}
    assert phi3_rope_parameters(config) == {"type": kind, "rope_type": "longrope", "short_factor": [1.0],
                                            "long_factor": [2.0], "rope_theta": 500.0, "partial_rotary_factor": 1.0,
                                            "original_max_position_embeddings": 4096}


@pytest.mark.parametrize("rope, message", [
    ({"type": "longrope", "short_factor": [1.0]}, "long_factor"),
    ({"rope_type": "dynamic", "factor": 2.0}, "expected default or longrope"),
])
def test_phi3_bad_rope_config_is_a_clear_error(rope, message):
    with pytest.raises(ValueError, match=message):
        phi3_rope_parameters({"rope_scaling": rope, "max_position_embeddings": 64})


def test_longrope_factor_count_must_match_the_rotary_frequencies():
    rope = {"rope_type": "longrope", "short_factor": [1.0] * 3, "long_factor": [1.0] * 3,
            "original_max_position_embeddings": 16}
    with pytest.raises(ValueError, match="3 factors for 16 rotary frequencies"):
        rope_inv_freq(32, 10000.0, rope, seq_len=8)


def test_phi3_config_that_does_not_fit_the_fused_weight_is_a_clear_error(checkpoints, cache_root, tmp_path):
    checkpoint = shutil.copytree(checkpoints["phi3"], tmp_path / "phi3-wrong-kv")
    rewrite_config(checkpoint, lambda config: config.update(num_key_value_heads=4))
    with pytest.raises(CheckpointShapeError, match=r"tensor model\.layers\.0\.self_attn\.qkv_proj\.weight has shape "
                       r"\[384, 256\]; config\.json implies .* = \[512, 256\]"):
        Phi3Loader(checkpoint, precision="bfloat16").load()


def test_qwen2_checkpoint_without_biases_is_a_clear_error(checkpoints, cache_root, tmp_path):
    """A Llama-layout checkpoint labelled qwen2: the missing bias is named, not silently skipped."""
    checkpoint = make_checkpoint("mistral", tmp_path / "not-really-qwen2")
    rewrite_config(checkpoint, lambda config: config.update(model_type="qwen2"))
    with pytest.raises(CheckpointError, match="no tensor for 'layers.0.attention.wq.bias'"):
        Qwen2Loader(checkpoint, precision="bfloat16").load()


def test_model_args_defaults_keep_other_families_unbiased_and_full():
    args = ModelArgs.from_hf_config({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
                                     "num_attention_heads": 2, "vocab_size": 32})
    assert not args.qkv_bias and args.sliding_window is None and args.layer_type(1) == "full_attention"
