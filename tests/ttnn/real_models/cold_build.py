# SPDX-License-Identifier: Apache-2.0
"""A cold build in a process of its own, reporting a digest of every tensor it built, so the parity
test can check its warm load against it without holding both models (a cold ``load()`` of
Qwen2.5-Coder 1.5B peaks at 7.7 GB on its own):

    python -m tests.real_models.cold_build SNAPSHOT FAMILY PRECISION ROWSxCOLS CACHE_ROOT OUT.json

writes ``{"warm": false, "digests": {name: [[dtype, shape, sha256] per device shard]}}`` to OUT.json.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import torch


def shard_digests(tensors: list[torch.Tensor]) -> list[list]:
    """``[dtype, shape, sha256 of the bytes]`` of each torch shard: equal lists <=> equal tensors."""
    out = []
    for tensor in tensors:
        data = tensor.contiguous().view(torch.uint8) if tensor.dim() else tensor.reshape(1).view(torch.uint8)
        out.append([str(tensor.dtype), list(tensor.shape), hashlib.sha256(data.numpy().tobytes()).hexdigest()])
    return out


def model_digests(loaded) -> dict[str, list[list]]:
    """Digests of every ttnn weight's device shards and every host-kept weight of a loaded model."""
    from models.common.weight_cache.tensor_cache import host_shards

    digests = {name: shard_digests(host_shards(tensor)) for name, tensor in loaded.weights.items()}
    digests |= {f"host:{name}": shard_digests([tensor]) for name, tensor in loaded.host_weights.items()}
    return digests


if __name__ == "__main__":
    from models.common.device_env import ensure_host_cluster

    ensure_host_cluster()
    os.environ["HF_HUB_OFFLINE"] = "1"
    from models.registry import loader_class

    snapshot, family, precision, mesh, cache_root, out = sys.argv[1:]
    rows, cols = (int(n) for n in mesh.split("x"))
    loaded = loader_class(family)(snapshot, precision=precision, mesh_shape=(rows, cols), cache_root=cache_root).load()
    Path(out).write_text(json.dumps({"warm": loaded.warm, "reason": loaded.reason, "digests": model_digests(loaded)}))
