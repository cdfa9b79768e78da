# SPDX-License-Identifier: Apache-2.0
"""Every family on a T3K (1x8) and a Galaxy (8x4) computes what it computes on one device.

Tiny checkpoints whose heads divide neither mesh's columns (6 query / 2 KV heads; Gemma 4's 4 / 2
on 8 columns): the query heads are padded with zero heads (:func:`models.common.heads.column_heads`).
The host forward reads each mesh's cached shards, column by column, and must give the 1x1 build's
logits and greedy tokens; the layout is checked to be padded, so the test cannot pass on an
even split."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from models.common.checkpoint import read_config
from models.common.heads import column_heads
from models.common.model_args import ModelArgs
from models.common.reference import ReferenceDecoder
from models.gemma.gemma4 import gemma4_layer
from models.gemma.gemma4_reference import Gemma4Reference
from models.registry import loader_class
from models.testing.tiny_gemma4 import make_text_checkpoint
from models.testing.tiny_models import make_checkpoint

PROMPT = [3, 17, 99, 250, 7, 42, 300, 11]
MESHES = [(1, 8), (8, 4)]
STEPS = 3
# checkpoint name -> loader family
FAMILIES = {"llama": "llama", "qwen3": "qwen3", "qwen3_moe": "qwen3_moe", "gemma3": "gemma3", "qwen2": "qwen2",
            "mistral": "mistral", "phi3": "phi3", "phi3_partial_rotary": "phi3",
            "gemma4_kv_shared": "gemma4", "gemma4_k_eq_v": "gemma4"}
# 6 query heads in groups of 3: split 1 + padding on 8 columns, 2 + 1 (and a padding head) on 4
HEADS = dict(num_attention_heads=6, num_key_value_heads=2, head_dim=32, hidden_size=192)


class Checkpoints(dict):
    """Each tiny checkpoint made on first use, with its 1x1 result (so no one test makes them all)."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root
        self.one_device: dict[str, tuple[torch.Tensor, list[int]]] = {}

    def __missing__(self, name: str) -> Path:
        if name.startswith("gemma4_"):
            self[name] = make_text_checkpoint(self.root / name, name.removeprefix("gemma4_"))
        else:
            self[name] = make_checkpoint(name, self.root / name, **HEADS)
        return self[name]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> Checkpoints:
    return Checkpoints(tmp_path_factory.mktemp("meshes"))


def forward(name: str, checkpoint: Path, mesh: tuple[int, int], cache_root: Path) -> tuple[torch.Tensor, list[int]]:
    loaded = loader_class(FAMILIES[name])(checkpoint, precision="bfloat16", mesh_shape=mesh,
                                          cache_root=cache_root).load()
    reference = (Gemma4Reference if FAMILIES[name] == "gemma4" else ReferenceDecoder)(loaded)
    return reference.logits(PROMPT), reference.greedy(PROMPT, STEPS)


def padded(name: str, checkpoint: Path, cols: int) -> bool:
    args = ModelArgs.from_hf_config(read_config(checkpoint))
    kv_heads = {gemma4_layer(args.config, i).n_kv_heads for i in range(args.n_layers)} \
        if FAMILIES[name] == "gemma4" else {args.n_kv_heads}
    return any(c.padded for kv in kv_heads for c in column_heads(args.n_heads, kv, cols))


CASES = [(name, mesh) for name in FAMILIES for mesh in MESHES]


@pytest.mark.parametrize(("name", "mesh"), CASES, ids=[f"{n}-{r}x{c}" for n, (r, c) in CASES])
def test_every_family_on_t3k_and_galaxy_equals_one_device(name, mesh, checkpoints) -> None:
    checkpoint = checkpoints[name]
    cache_root = checkpoints.root / "caches"
    if name not in checkpoints.one_device:
        checkpoints.one_device[name] = forward(name, checkpoint, (1, 1), cache_root)
    logits, tokens = checkpoints.one_device[name]
    if FAMILIES[name] != "gemma4" or mesh[1] == 8:  # Gemma 4's 4 heads divide a Galaxy's 4 columns
        assert padded(name, checkpoint, mesh[1]), (name, mesh)
    mesh_logits, mesh_tokens = forward(name, checkpoint, mesh, cache_root)
    assert mesh_tokens == tokens
    assert (mesh_logits - logits).abs().max().item() < 1e-3
