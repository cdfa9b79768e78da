# SPDX-License-Identifier: Apache-2.0
"""The seed-API gate verifies every tensorbin the build wrote, wherever it nests them: a fork's
``layer_<n>/`` (gemma4), a ``vision/`` tower, a build with no file at the top at all. A file of
them missing or rewritten is a cold start, never a warm one that lets the caller's
``ttnn.as_tensor`` write its placeholder into the cache. (What ``gc`` may delete of them:
test_seed_api_ownership.py.)

The caches are real ttnn tensorbins (tests/weight_cache/seed_api.py), moved where a fork writes them.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import torch

from models.common import weight_cache as wc
from models.common.weight_cache import mark_weight_cache_complete, weight_cache_is_complete
from models.testing import weight_cache_seeder as seeder
from tests.ttnn.weight_cache.seed_api import load_torch, recorded, relayout, status

SAMPLE_SD = {"wq.weight": torch.zeros(4, 8, dtype=torch.bfloat16), "norm.weight": torch.ones(8)}
SHARED_ID = dict(model_name="unit/test-model", n_layers=2, mesh_shape=(1, 8))


def test_shared_marker_finds_tensorbins_in_subdirs(tmp_path):
    """Upstream's own test, as written there."""
    sub = tmp_path / "layers.0"
    sub.mkdir()
    (sub / "wq_dtype_BFLOAT8_B_layout_TILE.tensorbin").write_bytes(b"x")
    mark_weight_cache_complete(tmp_path, SAMPLE_SD, **SHARED_ID)
    assert weight_cache_is_complete(tmp_path, **SHARED_ID) is True
    (sub / "wq_dtype_BFLOAT8_B_layout_TILE.tensorbin").unlink()
    assert weight_cache_is_complete(tmp_path, **SHARED_ID) is False


def _layer_dir(relative: str) -> str:
    return re.sub(r"^layers\.(\d+)/", r"layer_\1/", relative)


FORK_LAYOUTS: dict[str, tuple[Callable[[str], str], str]] = {
    # name: (where the fork writes a file, the key of a file it writes outside the seed layout)
    "gemma4 layer dirs": (_layer_dir, "layers.0.attention.wq.weight"),
    "vision tower": (lambda rel: f"vision/{rel}" if rel.startswith("output") else rel, "output.weight"),
    "all in subfolders": (lambda rel: _layer_dir(rel) if rel.startswith("layers.") else f"text/{rel}",
                          "norm.weight"),
}


@pytest.fixture(params=list(FORK_LAYOUTS))
def fork_cache(request, built_cache):
    """A built cache laid out as a fork writes it, marked complete through the seed API; and the
    key of one of its files outside the seed layout."""
    place, probe = FORK_LAYOUTS[request.param]
    relayout(built_cache, place)
    assert built_cache.mark(), "a build whose files are in subfolders must get a marker"
    assert status(built_cache).warm
    assert "/" in built_cache.files[probe] and not built_cache.files[probe].startswith("layers.")
    return built_cache, probe


def test_every_file_of_a_fork_layout_is_verified_by_the_gate(fork_cache):
    cache, _ = fork_cache
    assert set(recorded(cache.root)) == set(cache.files.values())


def test_a_deleted_file_in_a_fork_subfolder_is_cold(fork_cache):
    cache, probe = fork_cache
    cache.path(probe).unlink()
    answer = status(cache)
    assert not answer.warm and cache.files[probe] in answer.reason and "missing" in answer.reason
    assert weight_cache_is_complete(cache.root, **cache.gate_kwargs()) is False


def test_a_rewritten_file_in_a_fork_subfolder_is_cold(fork_cache):
    """Same size, other bytes (another build's tensor written over it): the digest says cold."""
    cache, probe = fork_cache
    data = bytearray(cache.path(probe).read_bytes())
    data[-1] ^= 0xFF
    cache.path(probe).write_bytes(bytes(data))
    answer = status(cache)
    assert not answer.warm and cache.files[probe] in answer.reason and "differs" in answer.reason


def test_a_build_with_no_file_at_the_top_is_marked_and_loads_warm(built_cache, tiny_expected):
    place, _ = FORK_LAYOUTS["all in subfolders"]
    relayout(built_cache, place)
    assert not list(built_cache.root.glob("*.tensorbin"))
    assert built_cache.mark()
    assert weight_cache_is_complete(built_cache.root, **built_cache.gate_kwargs()) is True
    state_dict = wc.build_cached_state_dict(built_cache.root)
    assert set(state_dict) == set(tiny_expected) | {"tok_embeddings.weight"}
    for key, expected in tiny_expected.items():
        assert torch.equal(load_torch(built_cache.path(key)), expected), key


def test_a_nested_cache_in_a_fork_subfolder_is_not_verified_as_the_outer_variants(built_cache, tiny_state_dict):
    """A folder with a marker of its own is another cache, however deep: the outer marker records
    the outer build's files beside it and none of its, so losing a file of the nested one never
    turns the outer one cold."""
    relayout(built_cache, _layer_dir)
    nested = built_cache.root / "layer_0" / "draft"
    nested.mkdir()
    seeder.build_cache(nested, tiny_state_dict)
    assert seeder.mark(nested, tiny_state_dict)
    assert built_cache.mark()
    assert set(recorded(built_cache.root)) == set(built_cache.files.values())
    next(nested.rglob("*.tensorbin")).unlink()
    assert status(built_cache).warm
    assert not wc.weight_cache_status(wc.VariantPaths(nested), **seeder.gate_kwargs()).warm
