# SPDX-License-Identifier: Apache-2.0
"""The seed API's identity rules and gate: warm on a complete cache, and why when cold.

The caches they use: tests/weight_cache/seed_api.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import ttnn

from models.common import weight_cache as wc
from tests.ttnn.weight_cache.seed_api import (
    marker_body,
    rewrite_marker,
    status,
)

# --------------------------------------------------------------------------------------------
# identity
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model_path",
    [
        "meta-llama/Llama-2-7b-hf",
        "/data/checkpoints/Llama-2-7b-hf",
        "/data/checkpoints/Llama-2-7b-hf/",
        "/root/.cache/huggingface/hub/models--meta-llama--Llama-2-7b-hf/snapshots/01c7f73d771dfac7d29232380",
        "/hub/models--meta-llama--Llama-2-7b-hf/snapshots/01c7f73d771dfac7d292323805ebc428287df4f9/",
        Path("/data/checkpoints/Llama-2-7b-hf"),
    ],
)
def test_checkpoint_name_is_the_repo_base_name_however_addressed(model_path) -> None:
    assert wc.checkpoint_name(model_path) == "Llama-2-7b-hf"


def test_checkpoint_name_of_a_hub_snapshot_without_org() -> None:
    assert wc.checkpoint_name("/hub/models--gpt2/snapshots/abc123") == "gpt2"


@pytest.mark.parametrize(
    "make_mesh", [lambda: (1, 2), lambda: [1, 2], lambda: ttnn.MeshShape(1, 2)], ids=["tuple", "list", "MeshShape"]
)
def test_normalize_mesh_shape_encodes_every_spelling_alike(make_mesh) -> None:
    assert wc.normalize_mesh_shape(make_mesh()) == "(1, 2)"


def test_marker_path_differs_per_build_variant(tmp_path: Path) -> None:
    paths = {
        wc.marker_path(tmp_path, None),
        wc.marker_path(tmp_path, {"precision": "bfp8"}),
        wc.marker_path(tmp_path, {"precision": "bf16"}),
    }
    assert len(paths) == 3
    assert all(p.parent == tmp_path and p.name.startswith(wc.WEIGHT_CACHE_MARKER) for p in paths)
    assert wc.marker_path(tmp_path, {"a": 1, "b": 2}) == wc.marker_path(tmp_path, {"b": 2, "a": 1})


def test_list_cache_files_is_recursive_sorted_relative_and_skips_temp_files(built_cache) -> None:
    (built_cache.root / "layers.0" / ".wq.tensorbin.tmp.123.abc.deadbeef").write_bytes(b"partial")
    (built_cache.root / "layers.0" / "notes.txt").write_text("not a tensorbin")
    listed = wc.list_cache_files(built_cache.root)
    assert listed == sorted(built_cache.files.values())
    assert any("/" in p for p in listed) and not any(p.startswith("/") for p in listed)


# --------------------------------------------------------------------------------------------
# the gate: warm on a complete cache, and why when cold
# --------------------------------------------------------------------------------------------


def test_gate_is_warm_on_a_freshly_seeded_cache(seeded_cache) -> None:
    result = status(seeded_cache)
    assert result.warm and bool(result) and result.reason == "complete"
    assert wc.weight_cache_is_complete(seeded_cache.root, **seeded_cache.gate_kwargs())


def test_gate_is_cold_without_a_marker_and_says_so(built_cache) -> None:
    result = status(built_cache)
    assert not result.warm and not bool(result)
    assert "no completion marker" in result.reason


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"model_name": "other-model"}, "model"),
        ({"n_layers": 3}, "layers"),
        ({"mesh_shape": (1, 8)}, "mesh"),
        ({"components": ["text", "vision"]}, "components"),
    ],
)
def test_gate_names_the_first_mismatched_identity_field(seeded_cache, overrides, reason) -> None:
    result = status(seeded_cache, **overrides)
    assert not result.warm
    assert reason in result.reason


def test_gate_accepts_a_mesh_shape_given_as_ttnn_mesh_shape(seeded_cache) -> None:
    assert status(seeded_cache, mesh_shape=ttnn.MeshShape(1, 2)).warm


def test_components_superset_satisfies_a_narrower_build_but_a_subset_does_not(built_cache) -> None:
    assert built_cache.mark(components=["text", "vision"])
    assert status(built_cache, components="text").warm
    assert status(built_cache, components=["vision", "text"]).warm
    built_cache.mark(components="text")
    narrow = status(built_cache, components=["text", "vision"])
    assert not narrow.warm and "components" in narrow.reason
    assert status(built_cache, components=["text"]).warm


def test_force_env_var_forces_cold_and_says_so(seeded_cache, monkeypatch) -> None:
    monkeypatch.setenv(wc.DEFAULT_FORCE_ENV, "1")
    result = status(seeded_cache)
    assert not result.warm and wc.DEFAULT_FORCE_ENV in result.reason
    assert status(seeded_cache, force_env=None).warm
    monkeypatch.setenv(wc.DEFAULT_FORCE_ENV, "0")
    assert status(seeded_cache).warm


def test_unverifiable_build_variant_is_never_marked_and_never_warm(built_cache, captured_warnings) -> None:
    variant = {"unverifiable": True, "error": "no device"}
    assert built_cache.mark(build_variant=variant) is False
    assert not wc.marker_path(built_cache.root, variant).exists()
    result = status(built_cache, build_variant=variant)
    assert not result.warm and "no device" in result.reason
    assert "build variant could not be computed" in captured_warnings()


def test_two_build_variants_coexist_in_one_cache_dir(built_cache) -> None:
    bfp8, bf16 = {"precision": "bfp8", "prefetcher": False}, {"precision": "bf16", "prefetcher": True}
    assert built_cache.mark(build_variant=bfp8)
    assert built_cache.mark(build_variant=bf16)
    assert status(built_cache, build_variant=bfp8).warm
    assert status(built_cache, build_variant=bf16).warm
    other = status(built_cache, build_variant={"precision": "bfp4"})
    assert not other.warm and "no completion marker" in other.reason
    wc.invalidate_weight_cache(built_cache.root, bfp8)
    assert not status(built_cache, build_variant=bfp8).warm
    assert status(built_cache, build_variant=bf16).warm


def test_build_variant_with_tuples_and_non_json_values_round_trips(built_cache) -> None:
    variant = {"mesh": (1, 2), "dtype": ttnn.bfloat8_b, "layers": [0, 1]}
    assert built_cache.mark(build_variant=variant)
    assert status(built_cache, build_variant=variant).warm
    assert not status(built_cache, build_variant={"mesh": (1, 4), "dtype": ttnn.bfloat8_b, "layers": [0, 1]}).warm


def test_invalidate_weight_cache_withdraws_only_the_marker(seeded_cache) -> None:
    wc.invalidate_weight_cache(seeded_cache.root)
    result = status(seeded_cache)
    assert not result.warm and "no completion marker" in result.reason
    assert wc.list_cache_files(seeded_cache.root) == sorted(seeded_cache.files.values())
    wc.invalidate_weight_cache(seeded_cache.root)  # idempotent
    wc.invalidate_weight_cache(seeded_cache.root / "does-not-exist")


def test_gate_sees_a_republished_marker_not_a_stale_memo(seeded_cache) -> None:
    assert status(seeded_cache).warm
    body = marker_body(seeded_cache.root)
    body["n_layers"] = 7
    rewrite_marker(seeded_cache.root, body)
    assert "7 layers" in status(seeded_cache).reason
