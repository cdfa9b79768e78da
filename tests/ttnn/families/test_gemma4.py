# SPDX-License-Identifier: Apache-2.0
"""Gemma 4 loader end to end: real tiny checkpoints (transformers' own classes), real tensorbins.

The layout proof is the host forward of :mod:`models.gemma.gemma4_reference`, which reads every
weight back from the cached ttnn tensors and must reproduce transformers' logits. Three text
variants, each with per-layer input embeddings on: KV-shared layers (with the double-wide MLP),
``attention_k_eq_v`` (one KV head on the wider global layers), and the MoE block; plus a
text + vision checkpoint (``Gemma4ForConditionalGeneration``) for the component rules."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from models.common.checkpoint import CheckpointError
from models.common.weight_cache.tensor_cache import host_shards
from models.common.weight_cache import read_marker
from models.gemma import Gemma4Loader
from models.gemma.gemma4_reference import Gemma4Reference
from models.testing.tiny_gemma4 import CLIP_BOUNDS, VARIANTS, VISION_LINEARS, make_multimodal_checkpoint, make_text_checkpoint
from models.testing.tiny_models import hf_greedy, hf_logits, pcc, tensors_of

PROMPT = [1, 5, 77, 300, 12, 9, 400, 33]
@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gemma4")
    made = {variant: make_text_checkpoint(root / f"tiny-gemma4-{variant}", variant) for variant in VARIANTS}
    made["multimodal"] = make_multimodal_checkpoint(root / "tiny-gemma4-multimodal")
    return made


@pytest.fixture(scope="module")
def reference_logits(checkpoints) -> dict[str, torch.Tensor]:
    return {name: hf_logits(path, PROMPT) for name, path in checkpoints.items()}


def sidecar_keys(loader: Gemma4Loader) -> set[str]:
    sidecar = read_marker(loader.paths).host_sidecar
    with safe_open(loader.cache_dir / sidecar.path, framework="pt") as reader:
        return set(reader.keys())


def text_host_keys(n_layers: int = 4) -> set[str]:
    return {"tok_embeddings.weight", "tok_embeddings_per_layer.weight"} | {
        f"layers.{i}.layer_scalar" for i in range(n_layers)}


def vision_host_keys(n_layers: int = 2) -> set[str]:
    return {f"vision.layers.{j}.{linear}.{bound}"
            for j in range(n_layers) for linear in VISION_LINEARS for bound in CLIP_BOUNDS}


def checkpoint_tensor(checkpoint: Path, name: str) -> torch.Tensor:
    with safe_open(checkpoint / "model.safetensors", framework="pt") as reader:
        return reader.get_tensor(name)


# -- text parity ------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("mesh", [(1, 1), (1, 2)])
def test_bfloat16_cache_reproduces_transformers_logits(variant, mesh, checkpoints, reference_logits, cache_root):
    loaded = Gemma4Loader(checkpoints[variant], mesh_shape=mesh, precision="bfloat16").load()
    assert not loaded.warm and loaded.weights and "tok_embeddings_per_layer.weight" in loaded.host_weights
    logits = Gemma4Reference(loaded).logits(PROMPT)
    expected = reference_logits[variant]
    assert (logits - expected).abs().max().item() < 1e-3  # same bf16 weights, fp32 math either side
    assert torch.equal(logits.argmax(-1), expected.argmax(-1))


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("mesh", [(1, 1), (1, 2)])
def test_bfloat8_b_cache_logits_pcc(variant, mesh, checkpoints, reference_logits, cache_root):
    loaded = Gemma4Loader(checkpoints[variant], mesh_shape=mesh, precision="bfloat8_b").load()
    assert pcc(Gemma4Reference(loaded).logits(PROMPT), reference_logits[variant]) >= 0.99


def test_galaxy_mesh_2d_layout_reproduces_logits(checkpoints, reference_logits, cache_root):
    """On (8, 4) the per-layer input gate and the MLPs split over rows too; the 4 experts do not
    divide 32 devices and are replicated."""
    loaded = Gemma4Loader(checkpoints["moe"], mesh_shape="TG", precision="bfloat16").load()
    assert len(host_shards(loaded.weights["layers.0.per_layer_input_gate"])) == 32
    logits = Gemma4Reference(loaded).logits(PROMPT)
    assert (logits - reference_logits["moe"]).abs().max().item() < 1e-3


@pytest.mark.parametrize("variant", ["kv_shared", "moe"])
def test_bfloat16_warm_cache_greedy_matches_transformers(variant, checkpoints, cache_root):
    Gemma4Loader(checkpoints[variant], mesh_shape=(1, 2), precision="bfloat16").load()
    warm = Gemma4Loader(checkpoints[variant], mesh_shape=(1, 2), precision="bfloat16").load()
    assert warm.warm
    assert Gemma4Reference(warm).greedy(PROMPT, 4) == hf_greedy(checkpoints[variant], PROMPT, 4)


def test_variants_lay_out_what_their_layers_have(checkpoints, cache_root):
    """KV-shared layers hold queries only; k_eq_v global layers hold q|k, their sliding ones q|k|v;
    the MoE block sits beside the dense MLP with experts stacked ``[experts, in, out]``."""
    shared = Gemma4Loader(checkpoints["kv_shared"], precision="bfloat16").load().weights
    assert {n.split(".")[-1] for n in shared if re.match(r"layers\.[23]\.attention\.w", n)} == {"wq", "wo"}
    assert "layers.2.attention.k_norm" not in shared and "layers.1.attention.k_norm" in shared
    k_eq_v = Gemma4Loader(checkpoints["k_eq_v"], precision="bfloat16").load().weights
    assert tuple(k_eq_v["layers.1.attention.wqk"].shape) == (128, 4 * 64 + 64)  # 4 q heads + 1 k head of 64
    assert tuple(k_eq_v["layers.0.attention.wqkv"].shape) == (128, 4 * 32 + 2 * 2 * 32)
    moe = Gemma4Loader(checkpoints["moe"], precision="bfloat16").load().weights
    assert tuple(moe["layers.0.moe.experts.w1"].shape) == (4, 128, 64)
    assert tuple(moe["layers.0.moe.experts.w2"].shape) == (4, 64, 128)
    assert "layers.0.feed_forward.w1" in moe


# -- text + vision ----------------------------------------------------------------------------


def test_text_of_a_multimodal_checkpoint_reproduces_transformers(checkpoints, reference_logits, cache_root):
    loaded = Gemma4Loader(checkpoints["multimodal"], mesh_shape=(1, 2), precision="bfloat16",
                          components={"text", "vision"}).load()
    assert "vision.projector" in loaded.weights
    logits = Gemma4Reference(loaded).logits(PROMPT)
    assert (logits - reference_logits["multimodal"]).abs().max().item() < 1e-3


def test_vision_tower_layout_matches_the_checkpoint(checkpoints, cache_root):
    """Linear weights ``[in, out]``, norms ``[1, 1, n/32, 32]``, embeddings as they are."""
    checkpoint = checkpoints["multimodal"]
    loaded = Gemma4Loader(checkpoint, precision="bfloat16", components={"text", "vision"}).load()
    read = lambda name: host_shards(loaded.weights[name])[0].float()  # noqa: E731
    tower = "model.vision_tower."
    pairs = {
        "vision.layers.1.attention.wk": tower + "encoder.layers.1.self_attn.k_proj.linear.weight",
        "vision.layers.0.feed_forward.w3": tower + "encoder.layers.0.mlp.up_proj.linear.weight",
        "vision.patch_embedding": tower + "patch_embedder.input_proj.weight",
        "vision.projector": "model.embed_vision.embedding_projection.weight",
    }
    for name, source in pairs.items():
        assert torch.equal(read(name), checkpoint_tensor(checkpoint, source).float().T), name
    norm = checkpoint_tensor(checkpoint, tower + "encoder.layers.1.post_feedforward_layernorm.weight")
    assert torch.equal(read("vision.layers.1.post_ffn_norm").reshape(-1), norm.float())
    table = checkpoint_tensor(checkpoint, tower + "patch_embedder.position_embedding_table")
    assert torch.equal(read("vision.position_embedding"), table.float())
    assert torch.equal(read("vision.std_scale").reshape(-1), checkpoint_tensor(checkpoint, tower + "std_scale").float())


def test_warm_text_vision_build_is_bit_identical_to_cold(checkpoints, cache_root):
    options = dict(mesh_shape=(1, 2), precision="bfloat8_b", components={"text", "vision"})
    cold = Gemma4Loader(checkpoints["multimodal"], **options).load()
    warm = Gemma4Loader(checkpoints["multimodal"], **options).load()
    assert not cold.warm and warm.warm
    cold_tensors, warm_tensors = tensors_of(cold), tensors_of(warm)
    assert cold_tensors.keys() == warm_tensors.keys()
    assert any(name.startswith("vision.") for name in cold_tensors)
    for name in cold_tensors:
        assert all(torch.equal(a, b) for a, b in zip(cold_tensors[name], warm_tensors[name], strict=True)), name
    assert cold.host_weights.keys() == warm.host_weights.keys()
    for key in cold.host_weights:
        assert torch.equal(cold.host_weights[key], warm.host_weights[key]), key


def test_text_only_cache_never_satisfies_a_text_vision_build(checkpoints, cache_root):
    text = Gemma4Loader(checkpoints["multimodal"], precision="bfloat16", components={"text"}).load()
    assert not text.warm and not any(name.startswith("vision.") for name in text.weights)
    both = Gemma4Loader(checkpoints["multimodal"], precision="bfloat16", components={"text", "vision"})
    assert not both.status().warm
    built = both.load()
    assert not built.warm and "vision.projector" in built.weights


def test_text_vision_cache_satisfies_a_text_only_build(checkpoints, reference_logits, cache_root):
    Gemma4Loader(checkpoints["multimodal"], precision="bfloat16", components={"text", "vision"}).load()
    text = Gemma4Loader(checkpoints["multimodal"], precision="bfloat16", components={"text"}).load()
    assert text.warm and not any(name.startswith("vision.") for name in text.weights)
    assert (Gemma4Reference(text).logits(PROMPT) - reference_logits["multimodal"]).abs().max().item() < 1e-3


@pytest.mark.parametrize("components", [("text",), ("text", "vision")])
def test_sidecar_holds_exactly_the_host_consumed_weights(components, checkpoints, cache_root):
    checkpoint = checkpoints["multimodal"]
    loader = Gemma4Loader(checkpoint, precision="bfloat16", components=set(components))
    loader.load()
    expected = text_host_keys() | (vision_host_keys() if "vision" in components else set())
    assert set(read_marker(loader.paths).host_weights) == expected
    assert sidecar_keys(loader) == expected
    warm = Gemma4Loader(checkpoint, precision="bfloat16", components=set(components)).load()
    assert warm.warm and set(warm.host_weights) == expected
    # served real, the checkpoint's values
    language = "model.language_model."
    scalar = checkpoint_tensor(checkpoint, language + "layers.3.layer_scalar")
    assert torch.equal(warm.host_weights["layers.3.layer_scalar"], scalar) and scalar.item() != 1.0
    assert torch.equal(warm.host_weights["tok_embeddings_per_layer.weight"],
                       checkpoint_tensor(checkpoint, language + "embed_tokens_per_layer.weight"))
    if "vision" in components:
        bound = "model.vision_tower.encoder.layers.1.mlp.down_proj.output_min"
        assert warm.host_weights["vision.layers.1.feed_forward.w2.output_min"].item() == checkpoint_tensor(
            checkpoint, bound).item() < -8


def test_warm_build_reads_no_checkpoint_file(checkpoints, cache_root, tmp_path):
    checkpoint = shutil.copytree(checkpoints["multimodal"], tmp_path / "tiny-gemma4-multimodal")
    options = dict(mesh_shape=(1, 2), precision="bfloat16", components={"text", "vision"})
    cold = Gemma4Loader(checkpoint, **options).load()
    for weights in checkpoint.glob("*.safetensors"):
        weights.unlink()
    warm = Gemma4Loader(checkpoint, **options).load()
    assert warm.warm
    assert torch.equal(Gemma4Reference(warm).logits(PROMPT), Gemma4Reference(cold).logits(PROMPT))
    projector = [host_shards(loaded.weights["vision.projector"])[0] for loaded in (cold, warm)]
    assert torch.equal(*projector)


def test_vision_of_a_text_only_checkpoint(checkpoints, cache_root):
    """Asked for, a missing tower is an error; by default a text-only checkpoint builds text."""
    with pytest.raises(CheckpointError, match="vision"):
        Gemma4Loader(checkpoints["kv_shared"], precision="bfloat16", components={"text", "vision"}).load()
    loader = Gemma4Loader(checkpoints["kv_shared"], precision="bfloat16")
    loader.load()
    assert read_marker(loader.paths).components == ("text",)
