# SPDX-License-Identifier: Apache-2.0
"""Helpers of the seed-API tests (``test_seed_api_*.py``): read and republish a marker, ask the
gate, load a tensorbin, lay a cache out as a fork does.

Every cache those tests use is written by ``ttnn.as_tensor`` / ``ttnn.dump_tensor`` on the mock
cluster (bfloat16 and bfloat8_b TILE, two mesh-sharded weights); see models/testing/fixtures.py.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import torch
import ttnn

from models.common import weight_cache as wc
from models.common.fileio import atomic_write_bytes
from models.testing import weight_cache_seeder as seeder


def marker_body(root: Path, build_variant=None) -> dict:
    return json.loads(wc.marker_path(root, build_variant).read_bytes())


def rewrite_marker(root: Path, body: dict, build_variant=None) -> None:
    """Publish a new marker (a new inode, as every real writer does)."""
    atomic_write_bytes(wc.marker_path(root, build_variant), json.dumps(body).encode())


def status(cache, build_variant=None, **overrides) -> wc.CacheStatus:
    return wc.weight_cache_status(wc.VariantPaths(cache.root, build_variant), **cache.gate_kwargs(**overrides))


def load_torch(path: Path) -> torch.Tensor:
    return seeder.to_torch(ttnn.load_tensor(str(path)))


def as_tensor_prefix(cache, key: str) -> str:
    spec = seeder.weight_specs()[key]
    return str(cache.path(key)).removesuffix(f"_dtype_{spec.dtype.upper()}_layout_TILE.tensorbin")



def relayout(cache, place: Callable[[str], str]) -> None:
    """Move every tensorbin of a built cache to ``place(relative)`` (a fork's layout: gemma4's
    ``layer_<n>/``, a ``vision/`` tower), as if its build had written it there."""
    for key, relative in sorted(cache.files.items()):
        target = place(relative)
        (cache.root / target).parent.mkdir(parents=True, exist_ok=True)
        os.rename(cache.root / relative, cache.root / target)
        cache.files[key] = target
    for directory in sorted(cache.root.glob("layers.*")):
        if not any(directory.iterdir()):
            directory.rmdir()


def recorded(root: Path, build_variant=None) -> dict[str, bool]:
    """Every file a marker records -> whether ``gc`` may delete it (``owned``)."""
    return {record["path"]: record.get("owned", True) for record in marker_body(root, build_variant)["files"]}
