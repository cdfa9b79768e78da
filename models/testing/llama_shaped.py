# SPDX-License-Identifier: Apache-2.0
"""Llama-shaped bf16 checkpoints of a chosen size, made fast (seeding tests and benchmarks).

Hidden 2048, GQA 32/8 heads, MLP 5632, vocab 32000 (untied): 250 MiB of embedding and LM head
plus 86 MiB per layer, so 4 layers make 0.6 GB, 16 make 1.6 GB and 27 make 2.5 GB. Values are a
random 1 MiB block tiled over each tensor (conversion cost does not depend on them; distinct per
tensor so a misplaced weight shows)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from models.common.safetensors_file import write_safetensors

HIDDEN, INTER, VOCAB, HEADS, KV_HEADS = 2048, 5632, 32000, 32, 8
LAYERS_FOR_GB = {0.6: 4, 1.6: 16, 2.5: 27}


def _config(layers: int) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
            "intermediate_size": INTER, "num_hidden_layers": layers, "num_attention_heads": HEADS,
            "num_key_value_heads": KV_HEADS, "head_dim": HIDDEN // HEADS, "vocab_size": VOCAB,
            "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16", "hidden_act": "silu"}


def make_llama_shaped(directory: Path, layers: int) -> Path:
    """Write (once) a llama-shaped checkpoint of ``layers`` layers into ``directory``."""
    directory = Path(directory)
    if (directory / "model.safetensors").is_file():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(0)
    block = (torch.randn(1 << 19, generator=generator) * 0.02).to(torch.bfloat16)

    def weight(index: int, *shape: int) -> torch.Tensor:
        count = shape[0] * shape[1]
        tiled = block.roll(index * 977).repeat(-(-count // block.numel()))[:count]
        return tiled.reshape(shape)

    shapes = {"model.embed_tokens.weight": (VOCAB, HIDDEN), "lm_head.weight": (VOCAB, HIDDEN)}
    for i in range(layers):
        p = f"model.layers.{i}."
        kv = KV_HEADS * HIDDEN // HEADS
        shapes |= {p + "self_attn.q_proj.weight": (HIDDEN, HIDDEN), p + "self_attn.k_proj.weight": (kv, HIDDEN),
                   p + "self_attn.v_proj.weight": (kv, HIDDEN), p + "self_attn.o_proj.weight": (HIDDEN, HIDDEN),
                   p + "mlp.gate_proj.weight": (INTER, HIDDEN), p + "mlp.up_proj.weight": (INTER, HIDDEN),
                   p + "mlp.down_proj.weight": (HIDDEN, INTER)}
    tensors = {name: weight(i, *shape) for i, (name, shape) in enumerate(shapes.items())}
    ones = torch.ones(HIDDEN, dtype=torch.bfloat16)
    tensors["model.norm.weight"] = ones
    for i in range(layers):
        tensors[f"model.layers.{i}.input_layernorm.weight"] = ones
        tensors[f"model.layers.{i}.post_attention_layernorm.weight"] = ones
    temp = directory / "model.safetensors.partial"
    write_safetensors(temp, tensors)
    (directory / "config.json").write_text(json.dumps(_config(layers)))
    temp.rename(directory / "model.safetensors")
    return directory


def make_in_child(directory: Path, layers: int) -> Path:
    """:func:`make_llama_shaped` in a child process (it holds the whole model in memory once)."""
    import os
    import subprocess

    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(repo))
    subprocess.run([sys.executable, "-m", "models.testing.llama_shaped", str(directory), str(layers)],
                   cwd=repo, env=env, check=True, capture_output=True)
    return directory


if __name__ == "__main__":
    print(make_llama_shaped(Path(sys.argv[1]), int(sys.argv[2])))
