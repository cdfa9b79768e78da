# SPDX-License-Identifier: Apache-2.0
"""At the tensor shapes users run: a checkpoint with Llama-3.1-70B's shapes (hidden 8192, MLP 28672,
vocabulary 128256, 64/8 heads, untied head; 2 layers, 7.1 GiB in three shards with an index) builds
cold, as ``seed()`` and as ``load()``, on N150, T3K and TG, in bfloat16, bfloat8_b and bfloat4_b, within the imports +
the largest tensor (the 2.0 GiB embedding or head) + half a GiB, in fresh processes (``VmHWM``).
The long form: ``scripts/bench_large_shapes.py`` measures the same builds side by side with the naive
loop, and the default suite holds the bound on a small shape of the same profile
(``test_cold_load.py``)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from models.testing.model_shapes import SHAPES, make_shaped_checkpoint
from models.testing.seed_child import run_seed_child

MiB = 1 << 20
SHAPE = SHAPES["llama-3.1-70b"]
BOUND = SHAPE.largest_tensor_bytes() + 512 * MiB
WORKER_ALLOWANCE = 512 * MiB  # one unit's working set per further worker at this shape (a fused QKV, ...)


@pytest.fixture(scope="module")
def seventy_b_shaped(tmp_path_factory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("llama-3.1-70b-shaped")
    yield make_shaped_checkpoint(root / "checkpoint", SHAPE, 2)
    shutil.rmtree(root)  # 7.1 GiB: never left to pytest's kept temp dirs


@pytest.mark.slow  # 7.1 GiB written, then a 35-70 s build per case
@pytest.mark.parametrize("mode, mesh, precision, workers", [
    ("seed", "1x1", "bfloat8_b", 1), ("load", "1x1", "bfloat8_b", 1), ("load", "1x1", "bfloat16", 2),
    ("seed", "1x8", "bfloat8_b", 2), ("load", "1x8", "bfloat16", 1),
    ("seed", "8x4", "bfloat16", 1), ("load", "8x4", "bfloat8_b", 2),
    ("seed", "1x1", "bfloat4_b", 1), ("load", "1x8", "bfloat4_b", 2),
])
def test_a_70b_shaped_cold_build_peaks_within_the_largest_tensor_and_half_a_gib(seventy_b_shaped, tmp_path, mode,
                                                                                 mesh, precision, workers):
    cache = tmp_path / "cache"
    rc, report, err = run_seed_child(mode, seventy_b_shaped, cache, mesh=mesh, precision=precision, workers=workers)
    shutil.rmtree(cache, ignore_errors=True)
    assert rc == 0 and report and report["complete"], err
    added = report["peak"] - report["import_peak"]
    bound = BOUND + (workers - 1) * WORKER_ALLOWANCE
    assert added <= bound, f"{mode} {mesh} {precision} added {added / MiB:,.0f} MiB (bound {bound / MiB:,.0f})"
