# SPDX-License-Identifier: Apache-2.0
"""Tiny random-weight checkpoints made with transformers' own config classes.

Saved with ``save_pretrained`` (safetensors), optionally sharded into several files with an
index, or laid out as an HF hub cache snapshot (``models--org--name/snapshots/<rev>``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

TINY_SHAPES = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=8,
                   num_key_value_heads=2, head_dim=32, vocab_size=512, max_position_embeddings=256)


def tiny_config(family: str, **overrides):
    from transformers import LlamaConfig, Qwen3Config, Qwen3MoeConfig

    shapes = {**TINY_SHAPES, **overrides}
    if family == "llama":
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
        return LlamaConfig(**shapes, rope_parameters=rope, tie_word_embeddings=False)
    if family == "qwen3":
        return Qwen3Config(**shapes, tie_word_embeddings=True)
    if family == "gemma3":
        from transformers import Gemma3TextConfig

        return Gemma3TextConfig(**{**shapes, "num_hidden_layers": 3, "sliding_window": 4, "query_pre_attn_scalar": 32,
                                   "layer_types": ["sliding_attention", "sliding_attention", "full_attention"]})
    if family == "qwen3_moe":
        return Qwen3MoeConfig(**{**shapes, "num_local_experts": 12, "num_experts_per_tok": 2,
                                 "moe_intermediate_size": 64, "mlp_only_layers": [0], **overrides})
    raise ValueError(family)


def make_checkpoint(family: str, directory: Path, *, seed: int = 0, max_shard_size: str | None = None,
                    dtype: torch.dtype = torch.bfloat16, **overrides) -> Path:
    """Save a random-weight model of ``family`` to ``directory`` and return it."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(family, **overrides))
    with torch.no_grad():  # larger-than-default init so the layers matter for the logits
        for param in model.parameters():
            if param.dim() == 2:
                param.normal_(0.0, 0.08)
            else:  # norms: off their init value, so a wrong norm layout shows in the logits
                param.add_(torch.randn_like(param) * 0.1)
    model = model.to(dtype)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(directory, **kwargs)
    return Path(directory)


def as_hub_snapshot(checkpoint: Path, hub_cache: Path, repo_id: str, revision: str = "0123456789abcdef") -> Path:
    """Copy a checkpoint into a hub cache layout; return the snapshot directory."""
    repo = hub_cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / revision
    snapshot.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(checkpoint, snapshot)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return snapshot


def hf_logits(checkpoint: Path, tokens: list[int]) -> torch.Tensor:
    """transformers' own fp32 logits ``[T, vocab]`` of a prompt."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0]


def hf_greedy(checkpoint: Path, tokens: list[int], steps: int) -> list[int]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([tokens]), max_new_tokens=steps, do_sample=False)
    return out[0, len(tokens):].tolist()


def pcc(a: torch.Tensor, b: torch.Tensor) -> float:
    """Pearson correlation of two tensors' values."""
    return torch.corrcoef(torch.stack([a.flatten().double(), b.flatten().double()]))[0, 1].item()


def tensors_of(loaded) -> dict[str, list[torch.Tensor]]:
    """Every ttnn weight of a loaded model as its per-device torch shards."""
    from models.common.tensor_cache import host_shards

    return {name: host_shards(t) for name, t in loaded.weights.items()}
