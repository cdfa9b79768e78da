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
    if family in NEW_FAMILY_CONFIGS:
        return NEW_FAMILY_CONFIGS[family]({**TINY_SHAPES, **overrides})
    raise ValueError(family)


def _without_head_dim(shapes: dict) -> dict:
    """Qwen2 and Phi-3 configs have no head_dim (it is hidden / heads): 256 / 8 keeps it at 32 (a
    width asked for, not the tiny default, is kept: ``hidden_size=192`` with 6 heads)."""
    hidden = shapes["hidden_size"] if shapes["hidden_size"] != TINY_SHAPES["hidden_size"] else 256
    return {**{k: v for k, v in shapes.items() if k != "head_dim"}, "hidden_size": hidden}

# Phi-3 LongRoPE: distinct short / long factors per frequency, switching past 16 positions.
LONGROPE_ORIGINAL_CONTEXT = 16


def longrope(n_frequencies: int) -> dict:
    return {"rope_type": "longrope", "short_factor": [1.0 + 0.25 * i for i in range(n_frequencies)],
            "long_factor": [1.5 + 2.0 * i for i in range(n_frequencies)]}


def _qwen2(shapes: dict):
    from transformers import Qwen2Config

    # q/k/v biases (always, in Qwen2), tied embeddings (the 0.5B-3B sizes), sliding from layer 1
    return Qwen2Config(**_without_head_dim(shapes), tie_word_embeddings=True,
                       use_sliding_window=True, sliding_window=4, max_window_layers=1)


def _mistral(shapes: dict):
    from transformers import MistralConfig

    return MistralConfig(**shapes, sliding_window=4, tie_word_embeddings=False)


def _phi3(shapes: dict, partial_rotary_factor: float = 1.0, tie: bool = False):
    from transformers import Phi3Config

    shapes = _without_head_dim(shapes)
    head_dim = shapes["hidden_size"] // shapes["num_attention_heads"]
    shapes["max_position_embeddings"] = 4 * LONGROPE_ORIGINAL_CONTEXT
    return Phi3Config(**shapes, original_max_position_embeddings=LONGROPE_ORIGINAL_CONTEXT, sliding_window=6,
                      partial_rotary_factor=partial_rotary_factor, tie_word_embeddings=tie,
                      rope_scaling=longrope(int(head_dim * partial_rotary_factor) // 2),
                      bos_token_id=1, eos_token_id=None, pad_token_id=None)


NEW_FAMILY_CONFIGS = {
    "qwen2": _qwen2,
    "mistral": _mistral,
    "phi3": _phi3,
    # Phi-4-mini's variant of Phi-3: part of each head unrotated (a quarter there, half here), tied embeddings
    "phi3_partial_rotary": lambda shapes: _phi3(shapes, partial_rotary_factor=0.5, tie=True),
}


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
    from models.common.weight_cache.tensor_cache import host_shards

    return {name: host_shards(t) for name, t in loaded.weights.items()}


def weight_digests(loaded) -> dict[str, list[str]]:
    """SHA-256 of every device weight's shards and of every host weight, as read back now
    (every byte touched: a child process can print them for its parent to compare)."""
    import hashlib

    def digest(tensor: torch.Tensor) -> str:
        return hashlib.sha256(tensor.contiguous().view(torch.uint8).numpy()).hexdigest()

    digests = {name: [digest(s) for s in shards] for name, shards in tensors_of(loaded).items()}
    digests.update({f"host {name}": [digest(t)] for name, t in loaded.host_weights.items()})
    return digests


# A warm start in a fresh process (``python -c WARM_START_PROBE FAMILY CHECKPOINT``): prints WARM or COLD
# and the heavy modules it imported ("-" for none).
WARM_START_PROBE = """
import sys
from models.registry import loader_class
loaded = loader_class(sys.argv[1])(sys.argv[2], precision="bfloat8_b").load()
heavy = [m for m in ("transformers", "torch._dynamo", "torch.distributed.tensor", "sympy") if m in sys.modules]
print("WARM" if loaded.warm else "COLD", ",".join(heavy) or "-")
"""
