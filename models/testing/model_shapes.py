# SPDX-License-Identifier: Apache-2.0
"""Checkpoints with the tensor shapes of the models users run (Llama-3.1-8B and -70B, a Qwen2.5-72B-like
shape with q/k/v biases), any layer count, laid out as the hub ships large models: safetensors shards
named ``model-0000i-of-0000n.safetensors`` and a ``model.safetensors.index.json``.

Values are one random 1 MiB block tiled over each tensor, rolled per tensor so a misplaced weight shows
(conversion cost does not depend on the values). Written streaming, a few MiB at a time: a 70B-shaped
checkpoint of 2 layers (7.1 GiB) costs its writer no more memory than a small one.

    python -m models.testing.model_shapes llama-3.1-70b DIR --layers 2
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from models.common.fileio import write_all
from models.common.safetensors_file import safetensors_header

GiB = 1 << 30
BLOCK_ELEMENTS = 1 << 19  # the tiled random block: 1 MiB of bf16
CHUNK_BLOCKS = 32  # written 32 MiB at a time


@dataclass(frozen=True)
class ModelShape:
    """The tensor shapes of a decoder model, as its ``config.json`` states them."""

    model_type: str
    architecture: str
    hidden: int
    intermediate: int
    vocab: int
    heads: int
    kv_heads: int
    rope_theta: float
    qkv_bias: bool = False
    tied: bool = False
    config: dict[str, Any] = field(default_factory=dict)  # anything else of the model's config.json

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def config_json(self, layers: int) -> dict[str, Any]:
        return {"architectures": [self.architecture], "model_type": self.model_type, "hidden_size": self.hidden,
                "intermediate_size": self.intermediate, "num_hidden_layers": layers,
                "num_attention_heads": self.heads, "num_key_value_heads": self.kv_heads, "head_dim": self.head_dim,
                "vocab_size": self.vocab, "rope_theta": self.rope_theta, "tie_word_embeddings": self.tied,
                "torch_dtype": "bfloat16", "hidden_act": "silu", "rms_norm_eps": 1e-5, **self.config}

    def tensors(self, layers: int) -> Iterator[tuple[str, tuple[int, ...]]]:
        """Every checkpoint tensor's name and shape, in the hub's order (embedding, layers, norm, head)."""
        kv = self.kv_heads * self.head_dim
        yield "model.embed_tokens.weight", (self.vocab, self.hidden)
        for i in range(layers):
            p = f"model.layers.{i}."
            yield p + "input_layernorm.weight", (self.hidden,)
            yield p + "self_attn.q_proj.weight", (self.hidden, self.hidden)
            yield p + "self_attn.k_proj.weight", (kv, self.hidden)
            yield p + "self_attn.v_proj.weight", (kv, self.hidden)
            if self.qkv_bias:
                yield p + "self_attn.q_proj.bias", (self.hidden,)
                yield p + "self_attn.k_proj.bias", (kv,)
                yield p + "self_attn.v_proj.bias", (kv,)
            yield p + "self_attn.o_proj.weight", (self.hidden, self.hidden)
            yield p + "post_attention_layernorm.weight", (self.hidden,)
            yield p + "mlp.gate_proj.weight", (self.intermediate, self.hidden)
            yield p + "mlp.up_proj.weight", (self.intermediate, self.hidden)
            yield p + "mlp.down_proj.weight", (self.hidden, self.intermediate)
        yield "model.norm.weight", (self.hidden,)
        if not self.tied:
            yield "lm_head.weight", (self.vocab, self.hidden)

    def largest_tensor_bytes(self) -> int:
        """bf16 bytes of the largest tensor (the embedding or the LM head at every size here)."""
        return 2 * max(math.prod(shape) for _, shape in self.tensors(1))


_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}

SHAPES: dict[str, ModelShape] = {
    # the small Llama shape the seeding tests grew up with: 250 MiB of embedding and head, 86 MiB a layer
    "llama-2k": ModelShape("llama", "LlamaForCausalLM", 2048, 5632, 32000, 32, 8, 500000.0,
                           config={"max_position_embeddings": 4096}),
    # the smallest shape with weights written block by block: embedding and LM head 64 MiB each, 20 MiB a layer
    "llama-1k": ModelShape("llama", "LlamaForCausalLM", 1024, 2048, 32768, 8, 4, 500000.0,
                           config={"max_position_embeddings": 4096}),
    "llama-3.1-8b": ModelShape("llama", "LlamaForCausalLM", 4096, 14336, 128256, 32, 8, 500000.0,
                               config={"max_position_embeddings": 131072, "rope_scaling": _LLAMA3_ROPE}),
    "llama-3.1-70b": ModelShape("llama", "LlamaForCausalLM", 8192, 28672, 128256, 64, 8, 500000.0,
                                config={"max_position_embeddings": 131072, "rope_scaling": _LLAMA3_ROPE}),
    "qwen2.5-72b": ModelShape("qwen2", "Qwen2ForCausalLM", 8192, 29568, 152064, 64, 8, 1000000.0, qkv_bias=True,
                              config={"max_position_embeddings": 32768, "sliding_window": 131072,
                                      "use_sliding_window": False, "max_window_layers": 70}),
}


def _is_norm(name: str) -> bool:
    return name.endswith("norm.weight")


def _write_tensor(fd: int, index: int, name: str, count: int, block: torch.Tensor) -> None:
    """``count`` bf16 values: ones for a norm, else the block rolled by the tensor's index, tiled."""
    if _is_norm(name):
        write_all(fd, torch.ones(count, dtype=torch.bfloat16).view(torch.uint8).numpy())
        return
    chunk = block.roll(index * 977).repeat(CHUNK_BLOCKS).view(torch.uint8).numpy()
    left = count * 2
    while left:
        piece = chunk[: min(left, chunk.size)]
        write_all(fd, piece)
        left -= piece.size


def _shards(tensors: list[tuple[str, tuple[int, ...]]], shard_bytes: int) -> list[list[tuple[str, tuple[int, ...]]]]:
    """Consecutive tensors grouped into shards of at most ``shard_bytes`` (a larger tensor alone)."""
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shape in tensors:
        nbytes = 2 * math.prod(shape)
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nbytes
    return shards


def make_shaped_checkpoint(directory: Path, shape: ModelShape | str, layers: int, *,
                           shard_bytes: int | None = 3 * GiB) -> Path:
    """Write (once) a checkpoint of ``shape`` with ``layers`` layers into ``directory``: shards of at most
    ``shard_bytes`` with an index, or one ``model.safetensors`` (``shard_bytes=None``). ``config.json``
    is written last: a directory with it is complete."""
    shape = SHAPES[shape] if isinstance(shape, str) else shape
    directory = Path(directory)
    if (directory / "config.json").is_file():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    block = (torch.randn(BLOCK_ELEMENTS, generator=torch.Generator().manual_seed(0)) * 0.02).to(torch.bfloat16)
    tensors = list(shape.tensors(layers))
    order = {name: i for i, (name, _) in enumerate(tensors)}
    groups = _shards(tensors, shard_bytes) if shard_bytes else [tensors]
    weight_map: dict[str, str] = {}
    for number, group in enumerate(groups, 1):
        file = f"model-{number:05d}-of-{len(groups):05d}.safetensors" if shard_bytes else "model.safetensors"
        specs = {name: (list(dims), torch.bfloat16) for name, dims in group}
        header, offsets = safetensors_header(specs)
        fd = os.open(directory / file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_all(fd, header)
            for name in sorted(offsets, key=offsets.__getitem__):  # the data in the header's order
                _write_tensor(fd, order[name], name, math.prod(specs[name][0]), block)
        finally:
            os.close(fd)
        weight_map |= {name: file for name, _ in group}
    if shard_bytes:
        total = sum(2 * math.prod(dims) for _, dims in tensors)
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (directory / "config.json").write_text(json.dumps(shape.config_json(layers), indent=2))
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m models.testing.model_shapes", description=__doc__.split("\n\n")[0])
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("directory", type=Path)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--shard-gib", type=float, default=3.0, help="shard size (0: one model.safetensors)")
    opts = parser.parse_args()
    shard = int(opts.shard_gib * GiB) or None
    print(make_shaped_checkpoint(opts.directory, opts.shape, opts.layers, shard_bytes=shard))


if __name__ == "__main__":
    main()
