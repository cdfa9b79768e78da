# SPDX-License-Identifier: Apache-2.0
"""A tiny model's real ttnn weight cache, seeded the way a loader seeds it.

Importable (the pytest fixtures build their caches with it) and runnable as a subprocess
(``python -m models.testing.weight_cache_seeder MODE CACHE_DIR``) for the crash and
concurrency tests:

* ``seed``: build every tensorbin with ``ttnn.as_tensor`` (hits load, misses write) and mark the
  cache complete, ``--rounds`` times; with ``--barrier DIR`` each seeder announces itself there
  and waits for a ``go`` file, so all of them really race.
* ``loop``: forever withdraw the marker, delete a random tensorbin, rebuild, mark (a crash target
  for SIGKILL); prints ``ready`` once imports are done and one line per finished round.
* ``mark``: mark an already built cache once and print the result as JSON (used as an
  unprivileged user against an unwritable directory).
* ``gate``: ask the gate and build the warm state dict; print the answer as JSON (used as another
  user than the seeder).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

import models  # noqa: F401  (points ttnn at the mock cluster before it is imported)

MODEL_NAME = "tiny-llama"
N_LAYERS = 2
MESH_SHAPE = (1, 2)
HOST_KEYS = frozenset({"tok_embeddings.weight"})
MODEL_CONFIG = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": N_LAYERS,
    "num_attention_heads": 2,
    "vocab_size": 96,
    "rope_theta": 10000.0,
}
MODEL_INFO = {"fuse_qkv": False, "fuse_mlp": False}


@dataclass(frozen=True)
class WeightSpec:
    """How one checkpoint weight is cached: a ttnn dtype name, and whether it is mesh-sharded."""

    shape: tuple[int, ...]
    dtype: str  # "bfloat16" | "bfloat8_b" | "host"
    sharded: bool = False


def weight_specs(n_layers: int = N_LAYERS) -> dict[str, WeightSpec]:
    specs = {"tok_embeddings.weight": WeightSpec((96, 64), "host"), "norm.weight": WeightSpec((32, 64), "bfloat16")}
    for layer in range(n_layers):
        specs[f"layers.{layer}.attention.wq.weight"] = WeightSpec((64, 64), "bfloat8_b")
        specs[f"layers.{layer}.attention.wo.weight"] = WeightSpec((64, 64), "bfloat16")
        specs[f"layers.{layer}.feed_forward.w1.weight"] = WeightSpec((128, 64), "bfloat8_b", sharded=True)
    specs["output.weight"] = WeightSpec((96, 64), "bfloat16")
    return specs


def make_state_dict(n_layers: int = N_LAYERS, seed: int = 0) -> dict[str, torch.Tensor]:
    """A deterministic bfloat16 checkpoint for :func:`weight_specs`."""
    generator = torch.Generator().manual_seed(seed)
    return {
        key: torch.randn(spec.shape, generator=generator).to(torch.bfloat16)
        for key, spec in weight_specs(n_layers).items()
    }


def tensorbin_path(key: str, spec: WeightSpec) -> str:
    """The cache file (relative) a loader's ``as_tensor(cache_file_name=...)`` call writes for ``key``."""
    parts = key.removesuffix(".weight").split(".")
    if parts[0] == "layers":
        prefix = f"layers.{parts[1]}/{'.'.join(parts[2:])}"
    else:
        prefix = ".".join(parts)
    if spec.sharded:
        prefix += "_mesh_1x2"
    return f"{prefix}_dtype_{spec.dtype.upper()}_layout_TILE.tensorbin"


def _ttnn_dtype(name: str):
    import ttnn

    return {"bfloat16": ttnn.bfloat16, "bfloat8_b": ttnn.bfloat8_b}[name]


def convert(value: torch.Tensor, spec: WeightSpec):
    """The host ttnn tensor a loader would cache for this weight (mesh shards via ``from_host_shards``)."""
    import ttnn

    dtype = _ttnn_dtype(spec.dtype)
    if not spec.sharded:
        return ttnn.from_torch(value, dtype=dtype, layout=ttnn.TILE_LAYOUT)
    shards = [ttnn.from_torch(s.contiguous(), dtype=dtype, layout=ttnn.TILE_LAYOUT) for s in value.chunk(2, dim=0)]
    return ttnn.from_host_shards(shards, ttnn.MeshShape(*MESH_SHAPE))


def to_torch(tensor) -> torch.Tensor:
    """A loaded tensorbin back as one torch tensor (mesh shards concatenated on dim 0)."""
    import ttnn

    shards = ttnn.get_device_tensors(tensor)
    if len(shards) > 1:
        return torch.cat([ttnn.to_torch(s) for s in shards], dim=0)
    return ttnn.to_torch(tensor)


def expected_values(state_dict: Mapping[str, torch.Tensor], n_layers: int = N_LAYERS) -> dict[str, torch.Tensor]:
    """What each cached weight must read back as (bfloat8_b is lossy, so convert once and read back)."""
    return {
        key: to_torch(convert(state_dict[key], spec))
        for key, spec in weight_specs(n_layers).items()
        if spec.dtype != "host"
    }


def build_cache(root: Path, state_dict: Mapping[str, torch.Tensor], n_layers: int = N_LAYERS) -> dict[str, str]:
    """Build every tensorbin as a loader does; return key -> relative tensorbin path.

    Single-device weights go through ``ttnn.as_tensor(cache_file_name=...)`` (a hit loads and
    ignores the torch tensor, a miss converts and writes); the mesh-sharded ones are written with
    ``ttnn.dump_tensor`` when absent or unloadable."""
    import ttnn

    files = {}
    for key, spec in weight_specs(n_layers).items():
        if spec.dtype == "host":
            continue
        relative = tensorbin_path(key, spec)
        files[key] = relative
        target = root / relative
        if spec.sharded:
            try:
                ttnn.load_tensor(str(target))
                continue
            except RuntimeError:
                target.parent.mkdir(parents=True, exist_ok=True)
                ttnn.dump_tensor(str(target), convert(state_dict[key], spec))
            continue
        prefix = str(target).removesuffix(f"_dtype_{spec.dtype.upper()}_layout_TILE.tensorbin")
        ttnn.as_tensor(
            state_dict[key], dtype=_ttnn_dtype(spec.dtype), layout=ttnn.TILE_LAYOUT, device=None, cache_file_name=prefix
        )
    return files


def mark(root: Path, state_dict: Mapping[str, torch.Tensor], **overrides) -> bool:
    from models.common.weight_cache import mark_weight_cache_complete

    options = dict(
        model_name=MODEL_NAME,
        n_layers=N_LAYERS,
        mesh_shape=MESH_SHAPE,
        is_host_weight=lambda key: key in HOST_KEYS,
        model_config=MODEL_CONFIG,
        model_info=MODEL_INFO,
    )
    options.update(overrides)
    return mark_weight_cache_complete(root, state_dict, **options)


def gate_kwargs(**overrides) -> dict:
    options = dict(model_name=MODEL_NAME, n_layers=N_LAYERS, mesh_shape=MESH_SHAPE)
    options.update(overrides)
    return options


def cache_mismatches(root: Path, state_dict: Mapping[str, torch.Tensor] | None = None) -> list[str]:
    """Every cached weight that does not load, or loads with values other than the expected ones."""
    import ttnn

    state_dict = state_dict if state_dict is not None else make_state_dict()
    problems = []
    for key, expected in expected_values(state_dict).items():
        relative = tensorbin_path(key, weight_specs()[key])
        try:
            actual = to_torch(ttnn.load_tensor(str(root / relative)))
        except RuntimeError as error:
            problems.append(f"{relative}: does not load ({error})")
            continue
        if actual.shape != expected.shape or not torch.equal(actual, expected):
            problems.append(f"{relative}: values differ from the checkpoint's")
    return problems


def _seed(root: Path, rounds: int, barrier: Path | None) -> None:
    import ttnn  # noqa: F401  (import before the barrier so the race is not an import race)

    state_dict = make_state_dict()
    if barrier is not None:
        (barrier / f"ready.{os.getpid()}").touch()
        while not (barrier / "go").exists():
            time.sleep(0.001)
    results = []
    for _ in range(rounds):
        build_cache(root, state_dict)
        results.append(mark(root, state_dict))
    print(json.dumps({"pid": os.getpid(), "marked": results}), flush=True)


def _loop(root: Path, seed: int) -> None:
    from models.common.weight_cache import invalidate_weight_cache

    state_dict = make_state_dict()
    rng = random.Random(seed)
    build_cache(root, state_dict)
    print("ready", flush=True)
    for round_number in range(1_000_000):
        invalidate_weight_cache(root)
        files = [root / p for p in build_cache(root, state_dict).values()]
        rng.choice(files).unlink(missing_ok=True)
        build_cache(root, state_dict)
        mark(root, state_dict)
        print(f"round {round_number}", flush=True)


def _mark_once(root: Path) -> None:
    import io

    from loguru import logger

    warnings = io.StringIO()
    logger.remove()
    logger.add(warnings, level="WARNING", format="{message}")
    marked = mark(root, make_state_dict())
    print(json.dumps({"marked": marked, "uid": os.getuid(), "warnings": warnings.getvalue()}), flush=True)


def _gate(root: Path) -> None:
    from models.common.weight_cache import build_cached_state_dict
    from models.common.weight_cache.gate import weight_cache_status
    from models.common.weight_cache.layout import VariantPaths

    result = weight_cache_status(VariantPaths(root), **gate_kwargs())
    host_ok = None
    if result.warm:
        sd = build_cached_state_dict(root)
        expected = make_state_dict()
        host_ok = all(torch.equal(sd[key], expected[key]) for key in HOST_KEYS)
    print(json.dumps({"warm": result.warm, "reason": result.reason, "host_ok": host_ok, "uid": os.getuid()}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=("seed", "loop", "mark", "gate"))
    parser.add_argument("cache_dir", type=Path)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--barrier", type=Path, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.mode == "seed":
        _seed(args.cache_dir, args.rounds, args.barrier)
    elif args.mode == "loop":
        _loop(args.cache_dir, args.seed)
    elif args.mode == "mark":
        _mark_once(args.cache_dir)
    else:
        _gate(args.cache_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
