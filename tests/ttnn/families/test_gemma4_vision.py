# SPDX-License-Identifier: Apache-2.0
"""Gemma 4's vision tower computed from its cache: the host forward of
:mod:`models.gemma.gemma4_vision_reference` reads every vision weight back from the cached ttnn
tensors (and the clip bounds from the host sidecar) and must give transformers' image features
on a tiny text + vision checkpoint, and the image-bearing prompt transformers' greedy tokens.

Two images of different sizes in one batch, each padded to the same patch count: the padding
patches must be masked out of attention and dropped from the pooled soft tokens."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from models.gemma import Gemma4Loader
from models.gemma.gemma4_vision_reference import Gemma4MultimodalReference, Gemma4VisionReference
from models.testing.tiny_gemma4 import TINY_VISION, make_multimodal_checkpoint
from models.testing.tiny_models import pcc

PATCH_PIXELS = 3 * TINY_VISION["patch_size"] ** 2
KERNEL = TINY_VISION["pooling_kernel_size"]
MAX_PATCHES = 20  # 5 pooled slots of 2 x 2 patches per image
IMAGE_GRIDS = [(4, 4), (4, 2)]  # (columns, rows) of patches: 4 and 2 soft tokens; the rest is padding
SOFT_TOKENS = sum(cols * rows // KERNEL**2 for cols, rows in IMAGE_GRIDS)
TEXT_AND_VISION = dict(precision="bfloat16", components={"text", "vision"})


def patchified_images(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``pixel_values`` ``[images, MAX_PATCHES, 3 * p * p]`` in [0, 1] and the (x, y) of each patch,
    ``(-1, -1)`` on padding: what Gemma 4's image processor hands the model."""
    generator = torch.Generator().manual_seed(seed)
    pixels = torch.zeros(len(IMAGE_GRIDS), MAX_PATCHES, PATCH_PIXELS)
    positions = torch.full((len(IMAGE_GRIDS), MAX_PATCHES, 2), -1, dtype=torch.long)
    for image, (cols, rows) in enumerate(IMAGE_GRIDS):
        count = cols * rows
        pixels[image, :count] = torch.rand(count, PATCH_PIXELS, generator=generator)
        positions[image, :count, 0] = torch.arange(count) % cols
        positions[image, :count, 1] = torch.arange(count) // cols
    return pixels, positions


def image_prompt(image_token_id: int) -> list[int]:
    """Text, the first image's soft tokens, text, the second image's, text."""
    first = IMAGE_GRIDS[0][0] * IMAGE_GRIDS[0][1] // KERNEL**2
    return ([2, 17, 301] + [image_token_id] * first + [45, 99] + [image_token_id] * (SOFT_TOKENS - first)
            + [7, 250])


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return make_multimodal_checkpoint(tmp_path_factory.mktemp("gemma4-vision") / "tiny-gemma4-multimodal")


@pytest.fixture(scope="module")
def hf_model(checkpoint):
    from transformers import Gemma4ForConditionalGeneration

    return Gemma4ForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def hf_image_features(hf_model) -> torch.Tensor:
    pixels, positions = patchified_images()
    with torch.no_grad():
        features = hf_model.model.get_image_features(pixels, positions).pooler_output
    return torch.cat(features)


def with_tight_clip_bounds(checkpoint: Path, directory: Path) -> Path:
    """A copy whose clipped linears really clip: inputs to [-0.5, 0.5], outputs to [-0.3, 0.3]."""
    from safetensors.torch import load_file, save_file

    copy = shutil.copytree(checkpoint, directory)
    state = load_file(copy / "model.safetensors")
    for name in state:
        if name.endswith(("input_min", "input_max", "output_min", "output_max")):
            bound = 0.5 if "input" in name else 0.3
            state[name] = torch.full_like(state[name], -bound if name.endswith("min") else bound)
    save_file(state, copy / "model.safetensors", metadata={"format": "pt"})
    return copy


def test_hf_features_have_one_row_per_real_soft_token(hf_image_features):
    assert tuple(hf_image_features.shape) == (SOFT_TOKENS, 128)  # the text width


@pytest.mark.parametrize("mesh", [(1, 1), (1, 2)])
def test_bfloat16_vision_cache_reproduces_transformers_image_features(mesh, checkpoint, hf_image_features,
                                                                      cache_root):
    loaded = Gemma4Loader(checkpoint, mesh_shape=mesh, **TEXT_AND_VISION).load()
    features = Gemma4VisionReference(loaded).image_features(*patchified_images())
    assert features.shape == hf_image_features.shape
    assert (features - hf_image_features).abs().max().item() < 1e-3  # same bf16 weights, fp32 math


def test_bfloat8_b_vision_cache_image_features_pcc(checkpoint, hf_image_features, cache_root):
    loaded = Gemma4Loader(checkpoint, mesh_shape=(1, 2), precision="bfloat8_b", components={"text", "vision"}).load()
    assert pcc(Gemma4VisionReference(loaded).image_features(*patchified_images()), hf_image_features) >= 0.99


def test_warm_text_and_image_prompt_gives_transformers_greedy_tokens(checkpoint, hf_model, cache_root, tmp_path):
    """From a warm cache with the checkpoint's weights gone: the image tokens merged into the
    text embeddings, 8 greedy tokens as transformers generates them."""
    local = shutil.copytree(checkpoint, tmp_path / "tiny-gemma4-multimodal")
    Gemma4Loader(local, mesh_shape=(1, 2), **TEXT_AND_VISION).load()
    for weights in local.glob("*.safetensors"):
        weights.unlink()
    warm = Gemma4Loader(local, mesh_shape=(1, 2), **TEXT_AND_VISION).load()
    assert warm.warm
    pixels, positions = patchified_images()
    prompt = image_prompt(hf_model.config.image_token_id)
    reference = Gemma4MultimodalReference(warm, pixels, positions)
    with torch.no_grad():
        expected_logits = hf_model(torch.tensor([prompt]), pixel_values=pixels, image_position_ids=positions).logits[0]
        generated = hf_model.generate(torch.tensor([prompt]), pixel_values=pixels, image_position_ids=positions,
                                      max_new_tokens=8, do_sample=False)[0, len(prompt):].tolist()
    assert (reference.logits(prompt) - expected_logits).abs().max().item() < 1e-3
    assert reference.greedy(prompt, 8) == generated


def test_clip_bounds_from_the_sidecar_clip_like_transformers(checkpoint, hf_image_features, cache_root, tmp_path):
    """Bounds tight enough to bite: the features change, and still match transformers'."""
    from transformers import Gemma4ForConditionalGeneration

    tight = with_tight_clip_bounds(checkpoint, tmp_path / "tight")
    pixels, positions = patchified_images()
    with torch.no_grad():
        model = Gemma4ForConditionalGeneration.from_pretrained(tight, dtype=torch.float32).eval()
        expected = torch.cat(model.model.get_image_features(pixels, positions).pooler_output)
    loaded = Gemma4Loader(tight, **TEXT_AND_VISION).load()
    assert loaded.host_weights["vision.layers.0.attention.wq.input_max"].item() == 0.5
    features = Gemma4VisionReference(loaded).image_features(pixels, positions)
    assert (features - expected).abs().max().item() < 1e-3
    assert (expected - hf_image_features).abs().max().item() > 1e-2


def test_the_images_change_the_prediction(checkpoint, hf_model, cache_root):
    """Other pixels, other features and other logits: the image path is not a no-op here."""
    loaded = Gemma4Loader(checkpoint, **TEXT_AND_VISION).load()
    prompt = image_prompt(hf_model.config.image_token_id)
    one = Gemma4MultimodalReference(loaded, *patchified_images(seed=0)).logits(prompt)
    other = Gemma4MultimodalReference(loaded, *patchified_images(seed=1)).logits(prompt)
    assert (one - other).abs().max().item() > 1e-2


def test_padding_patches_do_not_change_an_images_features(checkpoint, cache_root):
    """The second image alone, padded to 20 or to 12 patches: the same soft tokens."""
    vision = Gemma4VisionReference(Gemma4Loader(checkpoint, **TEXT_AND_VISION).load())
    pixels, positions = patchified_images()
    padded = vision.image_features(pixels[1:], positions[1:])
    tighter = vision.image_features(pixels[1:, :12], positions[1:, :12])
    assert padded.shape[0] == 2 and torch.allclose(padded, tighter, atol=1e-5)


def test_image_token_count_must_match_the_soft_tokens(checkpoint, hf_model, cache_root):
    loaded = Gemma4Loader(checkpoint, **TEXT_AND_VISION).load()
    reference = Gemma4MultimodalReference(loaded, *patchified_images())
    with pytest.raises(ValueError, match=f"3 image tokens; the images give {SOFT_TOKENS} soft tokens"):
        reference.logits([2, 17] + [hf_model.config.image_token_id] * 3)


def test_a_text_only_build_has_no_vision_forward(checkpoint, cache_root):
    loaded = Gemma4Loader(checkpoint, precision="bfloat16", components={"text"}).load()
    with pytest.raises(ValueError, match="no vision component"):
        Gemma4VisionReference(loaded)


def test_bidirectional_image_attention_is_refused_not_approximated(checkpoint, cache_root):
    loaded = Gemma4Loader(checkpoint, **TEXT_AND_VISION).load()
    loaded.args.config["text_config"]["use_bidirectional_attention"] = "vision"  # this load's own copy
    with pytest.raises(NotImplementedError, match="use_bidirectional_attention='vision'"):
        Gemma4MultimodalReference(loaded, *patchified_images())
