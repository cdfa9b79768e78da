# SPDX-License-Identifier: Apache-2.0
"""Gemma 4 vision tower forward on the host, from the cached ttnn tensors (the layout proof of the
vision component), and the text + image forward that merges its soft tokens into the prompt.

Per image (``pixel_values`` ``[patches, 3 * patch_size**2]``, already patchified as the image
processor hands them over; ``positions`` ``[patches, 2]`` the (x, y) of each patch, ``(-1, -1)``
for padding):

1. patch embedding: ``2 * (pixels - 0.5) @ patch_embedding`` plus the x- and y-rows of the
   position table (zero on padding);
2. encoder layers: Gemma-4-style blocks (four norms), bidirectional attention over the real
   patches with q/k norms, a weightless v-norm, scaling 1 and 2-D axial RoPE (the first half of
   each head rotates by x, the second by y); clipped linears clamp inputs and outputs to the
   bounds kept as host weights;
3. pooling: each ``k x k`` block of patches averaged into one soft token (padding-only tokens
   dropped), times ``sqrt(width)``, standardized with ``std_bias`` / ``std_scale``;
4. projection into the text model: a weightless RMSNorm, then ``projector``.

Weights are the loader's (``vision.`` prefix, replicated, linears ``[in, out]``); see
:mod:`models.gemma.gemma4`.
"""

from __future__ import annotations

import math
from functools import cached_property

import torch
import torch.nn.functional as F

from models.common.loader import LoadedModel
from models.common.reference import CachedWeights, apply_rope, rms_norm, rope_inv_freq
from models.gemma.gemma4_reference import Gemma4Reference


class Gemma4VisionReference:
    """Host forward of the vision tower and its projection into the text model's width."""

    def __init__(self, loaded: LoadedModel) -> None:
        if "vision.projector" not in loaded.weights:
            raise ValueError(f"{loaded.cache_dir}: this build has no vision component (load it with "
                             f"components={{'text', 'vision'}})")
        self.w = CachedWeights(loaded)
        self.host = loaded.host_weights
        self.config = loaded.args.config["vision_config"]
        self.eps = float(self.config.get("rms_norm_eps", 1e-6))
        self.head_dim = int(self.config["head_dim"])
        self.n_heads = int(self.config["num_attention_heads"])
        self.n_kv_heads = int(self.config.get("num_key_value_heads") or self.n_heads)
        self.kernel = int(self.config["pooling_kernel_size"])

    @cached_property
    def _inv_freq(self) -> torch.Tensor:
        """Axial RoPE: each of the two halves of a head rotates with ``head_dim / 4`` frequencies."""
        theta = (self.config.get("rope_parameters") or {}).get("rope_theta", 100.0)
        return rope_inv_freq(self.head_dim // 2, theta, None)

    # -- pieces ---------------------------------------------------------------------------------

    def linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """A (clipped) linear: inputs and outputs clamped to the bounds when the tower has them."""
        bound = lambda kind: self.host.get(f"{name}.{kind}")  # noqa: E731
        if bound("input_min") is not None:
            x = x.clamp(bound("input_min").float(), bound("input_max").float())
        y = x @ self.w.full(name)
        if bound("output_min") is not None:
            y = y.clamp(bound("output_min").float(), bound("output_max").float())
        return y

    def embed_patches(self, pixels: torch.Tensor, positions: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        x = (2 * (pixels.float() - 0.5)) @ self.w.full("vision.patch_embedding")
        table = self.w.full("vision.position_embedding")  # [2, positions, width]
        clamped = positions.clamp(min=0)
        position = table[0][clamped[:, 0]] + table[1][clamped[:, 1]]
        return x + position.masked_fill(padding[:, None], 0.0)

    def axial_rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return torch.cat([apply_rope(x[..., :half], positions[:, 0], self._inv_freq),
                          apply_rope(x[..., half:], positions[:, 1], self._inv_freq)], dim=-1)

    def attention(self, x: torch.Tensor, layer: int, positions: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        p, T, hd = f"vision.layers.{layer}.attention.", x.shape[0], self.head_dim
        q = rms_norm(self.linear(x, p + "wq").reshape(T, -1, hd), self.w.vector(p + "q_norm"), self.eps)
        k = rms_norm(self.linear(x, p + "wk").reshape(T, -1, hd), self.w.vector(p + "k_norm"), self.eps)
        v = rms_norm(self.linear(x, p + "wv").reshape(T, -1, hd), 1.0, self.eps)
        q, k = self.axial_rope(q, positions), self.axial_rope(k, positions)
        group = self.n_heads // self.n_kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k).masked_fill(padding[None, None, :], float("-inf"))
        out = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(T, -1)
        return self.linear(out, p + "wo")

    def mlp(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        p = f"vision.layers.{layer}.feed_forward."
        gate = F.gelu(self.linear(x, p + "w1"), approximate="tanh")
        return self.linear(gate * self.linear(x, p + "w3"), p + "w2")

    def block(self, x: torch.Tensor, layer: int, positions: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        p = f"vision.layers.{layer}."
        norm = lambda h, name: rms_norm(h, self.w.vector(p + name), self.eps)  # noqa: E731
        x = x + norm(self.attention(norm(x, "attention_norm"), layer, positions, padding), "post_attention_norm")
        return x + norm(self.mlp(norm(x, "ffn_norm"), layer), "post_ffn_norm")

    def pool(self, x: torch.Tensor, positions: torch.Tensor, padding: torch.Tensor, length: int) -> torch.Tensor:
        """``[soft tokens, width]``: ``k x k`` blocks of patches averaged (transformers' pooler),
        tokens that only padding fell into dropped, scaled by ``sqrt(width)``."""
        x = x.masked_fill(padding[:, None], 0.0)
        if x.shape[0] != length:
            k = math.isqrt(x.shape[0] // length)
            if k * k * length != x.shape[0]:
                raise ValueError(f"cannot pool {x.shape[0]} patches into {length} soft tokens")
            clamped = positions.clamp(min=0)
            columns = int(clamped[:, 0].max()) + 1
            token = clamped[:, 0] // k + (columns // k) * (clamped[:, 1] // k)
            weights = F.one_hot(token, length).float() / (k * k)  # [patches, tokens]
            x = weights.T @ x
            x = x[(weights != 0).any(dim=0)]
        return x * math.sqrt(x.shape[-1])

    # -- the tower ------------------------------------------------------------------------------

    def image_tokens(self, pixels: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One image's soft tokens in the vision width (the tower's output, before projection)."""
        padding = (positions == -1).all(dim=-1)
        x = self.embed_patches(pixels, positions, padding)
        for layer in range(int(self.config["num_hidden_layers"])):
            x = self.block(x, layer, positions, padding)
        x = self.pool(x, positions, padding, pixels.shape[0] // self.kernel**2)
        if self.w.has("vision.std_bias"):
            x = (x - self.w.vector("vision.std_bias")) * self.w.vector("vision.std_scale")
        return x

    @torch.no_grad()
    def image_features(self, pixel_values: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``[soft tokens of every image, text width]``: what replaces the prompt's image tokens.
        ``pixel_values`` ``[images, patches, 3 * patch_size**2]``, ``positions`` ``[images, patches, 2]``."""
        tokens = torch.cat([self.image_tokens(p, q) for p, q in zip(pixel_values, positions, strict=True)])
        return rms_norm(tokens, 1.0, self.eps) @ self.w.full("vision.projector")


class Gemma4MultimodalReference(Gemma4Reference):
    """The Gemma 4 text forward with images: each image token of the prompt is replaced by the
    next soft token of the images (in order); the per-layer embeddings see the pad token there,
    as in transformers. ``greedy`` / ``logits`` then work on prompts that hold image tokens.
    Attention stays causal (transformers' default; the ``use_bidirectional_attention`` variants
    are refused, not approximated)."""

    def __init__(self, loaded: LoadedModel, pixel_values: torch.Tensor, positions: torch.Tensor) -> None:
        super().__init__(loaded)
        if self.text_config.get("use_bidirectional_attention"):
            raise NotImplementedError(
                f"use_bidirectional_attention={self.text_config['use_bidirectional_attention']!r} (image tokens "
                "attending each other both ways) is not in the reference forward; it is causal only")
        self.image_token_id = int(loaded.args.config["image_token_id"])
        self.pad_token_id = int(self.text_config.get("pad_token_id") or 0)
        self.features = Gemma4VisionReference(loaded).image_features(pixel_values, positions)

    def _text_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        return torch.where(tokens == self.image_token_id, self.pad_token_id, tokens)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        slots = tokens == self.image_token_id
        if int(slots.sum()) != self.features.shape[0]:
            raise ValueError(f"the prompt has {int(slots.sum())} image tokens; the images give "
                             f"{self.features.shape[0]} soft tokens")
        x = super().embed(self._text_tokens(tokens))
        x[slots] = self.features
        return x

    def per_layer_inputs(self, tokens: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return super().per_layer_inputs(self._text_tokens(tokens), x)
