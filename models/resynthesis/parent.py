# SPDX-License-Identifier: Apache-2.0
"""The frozen parent (backbone): a model loaded by the project's loaders, its host forward from
the cached ttnn tensors, and its identity taken from the weight cache itself.

Identity. The weights the forward actually reads are named by
``weights_identity(read_marker(loader.paths))`` (SHA-256 of every
converted file's digest); the checkpoint id, precision, mesh, build variant and ``config.json``
form the "parent manifest". Both enter every prefill object's authority, so a rebuilt cache
with other weights, another precision or another checkpoint can never serve a stale object.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch

from models.common.prefill_cache.layout import json_sha256
from models.common.reference import ReferenceDecoder, rms_norm

# Which forward produced the features: part of the position policy, so a device forward (or a
# change of the host one) gives new objects, never a stale hit.
HOST_REFERENCE_ADAPTER = "tt-warm-loaders.reference-host.fp32.final-norm.v1"


@dataclass(frozen=True)
class ParentIdentity:
    """What names a frozen parent: its converted weights and the manifest of its build."""

    checkpoint_id: str  # the checkpoint's content id (its model id when the marker has none)
    precision: str  # weight precision of the cache the forward reads
    weights_sha256: str  # weight_cache.weights_identity of the marker
    manifest_sha256: str  # SHA-256 of {checkpoint, precision, mesh, variant, config}

    @property
    def key(self) -> str:
        """One string for in-memory cache keys (``BaseForwardCache(parent_identity=...)``)."""
        return f"{self.checkpoint_id}@{self.weights_sha256}/{self.precision}"


def parent_identity(loader: Any, loaded: Any) -> ParentIdentity:
    """The identity of a loaded parent, read from its weight cache's marker (never assumed)."""
    from models.common.weight_cache import read_marker
    from models.common.weight_cache.marker import weights_identity

    marker = read_marker(loader.paths)
    checkpoint_id = marker.content_id or marker.model_id  # the same weights under any folder name
    manifest = {
        "checkpointId": checkpoint_id,
        "precision": loader.precision,
        "meshShape": list(loaded.mesh_shape),
        "buildVariant": loader.build_variant,
        "markerModel": marker.model_name,
        "nLayers": marker.n_layers,
        "config": marker.model_config,
    }
    return ParentIdentity(
        checkpoint_id=checkpoint_id,
        precision=loader.precision,
        weights_sha256=weights_identity(marker),
        manifest_sha256=json_sha256(json_safe(manifest)),
    )


def json_safe(value: Any) -> Any:
    """``value`` as plain JSON data (tuples to lists, anything else to its string)."""
    import json

    return json.loads(json.dumps(value, sort_keys=True, default=str))


@dataclass
class FrozenParent:
    """A loaded backbone, run on the host from its cached tensors. Counts its prefills."""

    loader: Any
    loaded: Any
    identity: ParentIdentity
    decoder: ReferenceDecoder = field(repr=False)
    prefills: int = 0  # forwards over a prompt (the cost the cache exists to avoid)
    prefill_tokens: int = 0

    @classmethod
    def load(cls, model: str | os.PathLike, *, family: str | None = None, precision: str = "bfloat16",
             mesh_shape: str | tuple[int, int] = (1, 1), cache_root: str | os.PathLike | None = None) -> FrozenParent:
        """Load (warm, or cold once) a checkpoint through the project's loader for its family."""
        from models.common.checkpoint import read_config, resolve_checkpoint_dir
        from models.registry import family_of, loader_class

        if family is None:
            checkpoint = resolve_checkpoint_dir(model)
            if checkpoint is None:
                raise ValueError(f"{model}: no checkpoint on this machine; pass family= for a cache-only load")
            family = family_of(read_config(checkpoint))
        loader = loader_class(family)(model, mesh_shape=mesh_shape, precision=precision, cache_root=cache_root)
        loaded = loader.load()
        return cls(loader, loaded, parent_identity(loader, loaded), ReferenceDecoder(loaded))

    @property
    def hidden_size(self) -> int:
        return self.loaded.args.dim

    @property
    def vocab_size(self) -> int:
        return self.loaded.args.vocab_size

    @property
    def max_positions(self) -> int:
        text = self.decoder.text_config
        return int(text.get("max_position_embeddings") or 8192)

    @property
    def sliding_window(self) -> int:
        return int(self.decoder.text_config.get("sliding_window") or self.max_positions)

    @torch.no_grad()
    def final_states(self, tokens: torch.Tensor) -> torch.Tensor:
        """``[T, H]`` fp32: the last layer's output after the final norm (the LM head's input)
        for a 1-D prompt. One prefill."""
        if tokens.ndim != 1 or tokens.numel() < 1:
            raise ValueError(f"a prompt is a non-empty 1-D token tensor, got shape {tuple(tokens.shape)}")
        if int(tokens.max()) >= self.vocab_size or int(tokens.min()) < 0:
            raise ValueError(f"prompt tokens must be in [0, {self.vocab_size})")
        self.prefills += 1
        self.prefill_tokens += tokens.numel()
        hidden = self.decoder.hidden_states(tokens.long())
        return rms_norm(hidden, self.decoder.w.vector("norm"), self.loaded.args.norm_eps)

    @cached_property
    def head_weight(self) -> torch.Tensor:
        """The frozen LM head ``[H, V]`` (fp32, from the cached tensors; concatenated columns)."""
        return torch.cat(self.decoder.w.columns("output"), dim=-1)

    def logits_of(self, normed: torch.Tensor) -> torch.Tensor:
        """Logits of final-normed states ``[..., H]`` (soft-capped like the model); not a prefill."""
        logits = normed.float() @ self.head_weight
        cap = self.decoder.text_config.get("final_logit_softcapping")
        return torch.tanh(logits / cap) * cap if cap else logits

