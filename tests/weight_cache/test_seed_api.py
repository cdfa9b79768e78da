# SPDX-License-Identifier: Apache-2.0
"""The warm ttnn weight cache (models/common/weight_cache.py) on real tensorbins.

Every cache here is written by ``ttnn.as_tensor`` / ``ttnn.dump_tensor`` on the mock cluster
(bfloat16 and bfloat8_b TILE, two mesh-sharded weights); see models/testing/fixtures.py.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from types import SimpleNamespace

import blake3
import pytest
import torch
import ttnn
from safetensors import safe_open

from models.common import weight_cache as wc
from models.common.fileio import atomic_write_bytes
from models.testing import weight_cache_seeder as seeder

# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def marker_body(root: Path, build_variant=None) -> dict:
    return json.loads(wc.marker_path(root, build_variant).read_bytes())


def rewrite_marker(root: Path, body: dict, build_variant=None) -> None:
    """Publish a new marker (a new inode, as every real writer does)."""
    atomic_write_bytes(wc.marker_path(root, build_variant), json.dumps(body).encode())


def status(cache, **overrides) -> wc.CacheStatus:
    return wc.weight_cache_status(cache.root, **cache.gate_kwargs(**overrides))


def load_torch(path: Path) -> torch.Tensor:
    return seeder.to_torch(ttnn.load_tensor(str(path)))


def as_tensor_prefix(cache, key: str) -> str:
    spec = seeder.weight_specs()[key]
    return str(cache.path(key)).removesuffix(f"_dtype_{spec.dtype.upper()}_layout_TILE.tensorbin")


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


# --------------------------------------------------------------------------------------------
# rule 1: placeholders cost no host memory and can never be persisted
# --------------------------------------------------------------------------------------------


def test_non_host_keys_are_storage_free_placeholders_of_the_manifest_shape(seeded_cache) -> None:
    sd = wc.build_cached_state_dict(seeded_cache.root)
    for key, real in seeded_cache.state_dict.items():
        value = sd[key]
        assert value.shape == real.shape and value.dtype == real.dtype
        if key in seeder.HOST_KEYS:
            assert not value.is_meta
        else:
            assert value.is_meta and wc.is_placeholder_tensor(value)


def test_a_placeholder_of_terabytes_allocates_nothing() -> None:
    huge = wc.placeholder((1 << 20, 1 << 20), torch.bfloat16)  # 2 TiB if it had storage
    assert huge.is_meta and huge.numel() == 1 << 40
    with pytest.raises((NotImplementedError, RuntimeError)):
        huge.sum().item()


def test_placeholders_accept_host_side_reshapes_and_casts() -> None:
    w = wc.placeholder((64, 128), torch.bfloat16)
    assert w.reshape(8, 8, 128).shape == (8, 8, 128)
    assert w.transpose(0, 1).shape == (128, 64) and w.T.shape == (128, 64)
    assert w.view(2, 32, 128).permute(2, 0, 1).shape == (128, 2, 32)
    assert torch.cat([w, w], dim=-1).shape == (64, 256)
    assert [c.shape for c in torch.chunk(w, 4, dim=0)] == [(16, 128)] * 4
    assert w.to(torch.float32).dtype == torch.float32 and w.float().is_meta
    assert w.unsqueeze(0).unsqueeze(0).contiguous().shape == (1, 1, 64, 128)


def test_as_tensor_hit_ignores_the_placeholder_and_loads_the_cached_weight(seeded_cache, tiny_expected) -> None:
    sd = wc.build_cached_state_dict(seeded_cache.root)
    for key in ("layers.0.attention.wq.weight", "layers.1.attention.wo.weight", "norm.weight"):
        spec = seeder.weight_specs()[key]
        loaded = ttnn.as_tensor(
            sd[key],
            dtype=seeder._ttnn_dtype(spec.dtype),
            layout=ttnn.TILE_LAYOUT,
            device=None,
            cache_file_name=as_tensor_prefix(seeded_cache, key),
        )
        assert torch.equal(ttnn.to_torch(loaded), tiny_expected[key])


def test_as_tensor_miss_on_a_placeholder_fails_loudly_and_writes_nothing(seeded_cache) -> None:
    sd = wc.build_cached_state_dict(seeded_cache.root)
    key = "layers.0.attention.wq.weight"
    seeded_cache.path(key).unlink()
    before = set(wc.list_cache_files(seeded_cache.root))
    with pytest.raises(TypeError):
        ttnn.as_tensor(
            sd[key], dtype=ttnn.bfloat8_b, layout=ttnn.TILE_LAYOUT, device=None,
            cache_file_name=as_tensor_prefix(seeded_cache, key),
        )
    assert set(wc.list_cache_files(seeded_cache.root)) == before
    assert not seeded_cache.path(key).exists()


def test_as_tensor_on_a_corrupt_hit_with_a_placeholder_does_not_overwrite_it(seeded_cache) -> None:
    key = "layers.1.attention.wo.weight"
    path = seeded_cache.path(key)
    path.write_bytes(path.read_bytes()[:100])
    sd = wc.build_cached_state_dict(seeded_cache.root)
    with pytest.raises(TypeError):
        ttnn.as_tensor(
            sd[key], dtype=ttnn.bfloat16, layout=ttnn.TILE_LAYOUT, device=None,
            cache_file_name=as_tensor_prefix(seeded_cache, key),
        )
    assert path.stat().st_size == 100


# --------------------------------------------------------------------------------------------
# rule 2: content, not just presence
# --------------------------------------------------------------------------------------------


def test_marker_records_every_tensorbin_with_its_size_and_blake3_digest(seeded_cache) -> None:
    body = marker_body(seeded_cache.root)
    assert body["digest_algorithm"] == "blake3"
    recorded = {f["path"]: f for f in body["files"]}
    assert set(recorded) == set(seeded_cache.files.values())
    for relative, record in recorded.items():
        data = (seeded_cache.root / relative).read_bytes()
        assert record["bytes"] == len(data)
        assert record["digest"] == blake3.blake3(data).hexdigest()


def test_marker_records_exactly_the_given_cache_files_with_their_digests(built_cache) -> None:
    chosen = sorted(built_cache.files.values())[:3]
    assert built_cache.mark(cache_files=chosen + [chosen[0]])
    files = marker_body(built_cache.root)["files"]
    assert [f["path"] for f in files] == chosen
    assert files[0]["digest"] == blake3.blake3(built_cache.root.joinpath(chosen[0]).read_bytes()).hexdigest()
    assert status(built_cache).warm


def test_marking_absolute_or_escaping_cache_files_fails_instead_of_writing_a_dead_marker(
    built_cache, captured_warnings
) -> None:
    absolute = str(built_cache.path("norm.weight"))
    assert built_cache.mark(cache_files=[absolute]) is False
    assert not wc.marker_path(built_cache.root).exists()
    assert built_cache.mark(cache_files=["../cache/" + built_cache.files["norm.weight"]]) is False
    assert "Could not mark" in captured_warnings()


def test_marking_an_empty_cache_dir_fails_and_writes_no_marker(tmp_path, tiny_state_dict, captured_warnings) -> None:
    assert seeder.mark(tmp_path, tiny_state_dict) is False
    assert not wc.marker_path(tmp_path).exists()
    assert "no .tensorbin files" in captured_warnings()


def test_gate_is_cold_when_a_tensorbin_is_missing(seeded_cache) -> None:
    key = "layers.1.feed_forward.w1.weight"
    seeded_cache.path(key).unlink()
    result = status(seeded_cache)
    assert not result.warm
    assert seeded_cache.files[key] in result.reason and "missing" in result.reason


def test_gate_is_cold_when_a_tensorbin_is_truncated(seeded_cache) -> None:
    path = seeded_cache.path("layers.0.attention.wq.weight")
    os.truncate(path, path.stat().st_size - 1)
    result = status(seeded_cache)
    assert not result.warm and "marker says" in result.reason


def test_gate_is_cold_when_a_tensorbin_grew(seeded_cache) -> None:
    path = seeded_cache.path("output.weight")
    with open(path, "ab") as stream:
        stream.write(b"\0" * 32)
    assert not status(seeded_cache).warm


def test_gate_is_cold_when_a_recorded_path_is_a_directory(seeded_cache) -> None:
    body = marker_body(seeded_cache.root)
    body["files"][0] = {
        "path": "layers.0",
        "bytes": (seeded_cache.root / "layers.0").stat().st_size,
        "digest": "0" * 64,
    }
    rewrite_marker(seeded_cache.root, body)
    assert not status(seeded_cache).warm
    assert any("layers.0" in p for p in wc.verify_weight_cache(seeded_cache.root))


def test_same_size_corruption_is_rehashed_by_the_gate_and_deep_verify_names_the_file(seeded_cache) -> None:
    path = seeded_cache.path("layers.0.feed_forward.w1.weight")
    data = bytearray(path.read_bytes())
    data[-7] ^= 0xFF
    path.write_bytes(bytes(data))  # same size, but a new mtime/ctime: the gate re-hashes it
    result = status(seeded_cache)
    assert not result.warm and "content differs" in result.reason
    problems = wc.verify_weight_cache(seeded_cache.root)
    assert len(problems) == 1 and seeded_cache.files["layers.0.feed_forward.w1.weight"] in problems[0]


def test_deep_verify_of_an_intact_cache_is_empty_and_names_missing_files(seeded_cache) -> None:
    assert wc.verify_weight_cache(seeded_cache.root) == []
    seeded_cache.path("norm.weight").unlink()
    problems = wc.verify_weight_cache(seeded_cache.root)
    assert len(problems) == 1 and seeded_cache.files["norm.weight"] in problems[0]


def test_deep_verify_without_a_marker_says_so(built_cache) -> None:
    problems = wc.verify_weight_cache(built_cache.root)
    assert len(problems) == 1 and "no completion marker" in problems[0]


def test_every_seeded_tensorbin_loads_back_with_the_checkpoint_values(seeded_cache, tiny_expected) -> None:
    assert seeder.cache_mismatches(seeded_cache.root, seeded_cache.state_dict) == []
    sharded = ttnn.load_tensor(str(seeded_cache.path("layers.0.feed_forward.w1.weight")))
    assert len(ttnn.get_device_tensors(sharded)) == 2


# --------------------------------------------------------------------------------------------
# rule 3: cache-only deploy
# --------------------------------------------------------------------------------------------


def test_warm_start_after_the_checkpoint_is_deleted(tmp_path, built_cache, tiny_expected) -> None:
    checkpoint = tmp_path / "checkpoints" / "tiny-llama"
    checkpoint.mkdir(parents=True)
    (checkpoint / "config.json").write_text(json.dumps(seeder.MODEL_CONFIG))
    from safetensors.torch import save_file

    save_file(built_cache.state_dict, checkpoint / "model.safetensors")
    config = json.loads((checkpoint / "config.json").read_text())
    name = wc.checkpoint_name(checkpoint)
    assert built_cache.mark(model_name=name, model_config=config)

    for path in checkpoint.iterdir():
        path.unlink()
    checkpoint.rmdir()

    assert wc.weight_cache_is_complete(built_cache.root, **built_cache.gate_kwargs(model_name=name))
    assert wc.cached_model_config(built_cache.root) == seeder.MODEL_CONFIG
    sd = wc.build_cached_state_dict(built_cache.root)
    assert torch.equal(sd["tok_embeddings.weight"], built_cache.state_dict["tok_embeddings.weight"])
    key = "layers.1.attention.wq.weight"
    loaded = ttnn.as_tensor(
        sd[key], dtype=ttnn.bfloat8_b, layout=ttnn.TILE_LAYOUT, device=None,
        cache_file_name=as_tensor_prefix(built_cache, key),
    )
    assert torch.equal(ttnn.to_torch(loaded), tiny_expected[key])


def test_cached_model_config_without_a_recorded_config_raises(built_cache) -> None:
    assert built_cache.mark(model_config=None)
    with pytest.raises(wc.WeightCacheError, match="no model config"):
        wc.cached_model_config(built_cache.root)


# --------------------------------------------------------------------------------------------
# rule 4: no code runs from a cache file; the sidecar is read once per warm run
# --------------------------------------------------------------------------------------------


def test_host_sidecar_is_safetensors_holding_exactly_the_host_weights(seeded_cache) -> None:
    sidecar = wc.VariantPaths(seeded_cache.root).host_sidecar
    with safe_open(sidecar, framework="pt") as f:
        assert set(f.keys()) == set(seeder.HOST_KEYS)
        assert torch.equal(f.get_tensor("tok_embeddings.weight"), seeded_cache.state_dict["tok_embeddings.weight"])
    assert marker_body(seeded_cache.root)["host_weights"] == sorted(seeder.HOST_KEYS)


def test_host_sidecar_is_readable_by_other_users_like_the_tensorbins(seeded_cache) -> None:
    sidecar_mode = wc.VariantPaths(seeded_cache.root).host_sidecar.stat().st_mode & 0o777
    tensorbin_mode = seeded_cache.path("norm.weight").stat().st_mode & 0o777
    assert sidecar_mode & 0o044 == tensorbin_mode & 0o044 == 0o044


class _Bomb:
    """Unpickling this creates a file: proof that code ran from the cache."""

    def __init__(self, sentinel: Path) -> None:
        self.sentinel = sentinel

    def __reduce__(self):
        return (Path.touch, (self.sentinel,))


def test_a_pickle_planted_as_the_sidecar_is_never_executed(seeded_cache, tmp_path) -> None:
    sentinel = tmp_path / "code-ran"
    sidecar = wc.VariantPaths(seeded_cache.root).host_sidecar
    payload = pickle.dumps({"tok_embeddings.weight": _Bomb(sentinel)})
    torch.save({"tok_embeddings.weight": _Bomb(sentinel)}, sidecar)  # the old pickle format, booby-trapped
    data = sidecar.read_bytes()
    body = marker_body(seeded_cache.root)
    body["host_sidecar"].update(bytes=len(data), digest=blake3.blake3(data).hexdigest())
    rewrite_marker(seeded_cache.root, body)
    pickle.loads(payload)
    assert sentinel.exists()  # the payload is live...
    sentinel.unlink()
    status(seeded_cache)  # ...but neither the gate (stat + hash) nor the loader unpickles it
    assert wc.load_host_sidecar(seeded_cache.root) is None
    with pytest.raises(wc.WeightCacheError, match="host sidecar"):
        wc.build_cached_state_dict(seeded_cache.root)
    assert not sentinel.exists()


def test_gate_is_cold_when_the_sidecar_is_missing_or_truncated(seeded_cache) -> None:
    sidecar = wc.VariantPaths(seeded_cache.root).host_sidecar
    os.truncate(sidecar, sidecar.stat().st_size - 3)
    assert "host sidecar" in status(seeded_cache).reason
    sidecar.unlink()
    assert "host sidecar" in status(seeded_cache).reason


def test_sidecar_is_loaded_once_per_warm_run_and_released_by_the_builder(seeded_cache) -> None:
    assert status(seeded_cache).warm
    first = wc.load_host_sidecar(seeded_cache.root)
    assert wc.load_host_sidecar(seeded_cache.root) is first  # memoized: the gate's load is reused
    sd = wc.build_cached_state_dict(seeded_cache.root)
    assert sd["tok_embeddings.weight"] is first["tok_embeddings.weight"]  # the builder took the gate's load
    again = wc.load_host_sidecar(seeded_cache.root)
    assert again is not first  # ...and released it
    assert torch.equal(again["tok_embeddings.weight"], first["tok_embeddings.weight"])


def test_a_republished_sidecar_is_never_served_stale(seeded_cache) -> None:
    assert torch.equal(
        wc.load_host_sidecar(seeded_cache.root)["tok_embeddings.weight"],
        seeded_cache.state_dict["tok_embeddings.weight"],
    )
    changed = dict(seeded_cache.state_dict, **{"tok_embeddings.weight": torch.ones(96, 64, dtype=torch.bfloat16)})
    assert seeder.mark(seeded_cache.root, changed)
    reloaded = wc.load_host_sidecar(seeded_cache.root)
    assert torch.equal(reloaded["tok_embeddings.weight"], changed["tok_embeddings.weight"])


def test_tied_host_weights_sharing_storage_can_be_marked(built_cache) -> None:
    shared = built_cache.state_dict["tok_embeddings.weight"]
    state_dict = dict(built_cache.state_dict, **{"lm_head.weight": shared})
    host_keys = {"tok_embeddings.weight", "lm_head.weight"}
    assert seeder.mark(built_cache.root, state_dict, is_host_weight=lambda k: k in host_keys)
    assert status(built_cache).warm
    sd = wc.build_cached_state_dict(built_cache.root)
    assert torch.equal(sd["lm_head.weight"], shared) and torch.equal(sd["tok_embeddings.weight"], shared)


def test_a_placeholder_host_weight_is_refused(built_cache) -> None:
    state_dict = dict(built_cache.state_dict, **{"tok_embeddings.weight": wc.placeholder((96, 64), torch.bfloat16)})
    with pytest.raises(wc.WeightCacheError, match="placeholder"):
        seeder.mark(built_cache.root, state_dict)
    assert not wc.marker_path(built_cache.root).exists()


def test_marker_without_host_weights_has_no_sidecar(built_cache) -> None:
    assert built_cache.mark(is_host_weight=None)
    body = marker_body(built_cache.root)
    assert body["host_weights"] == [] and body["host_sidecar"] is None
    assert not wc.VariantPaths(built_cache.root).host_sidecar.exists()
    sd = wc.build_cached_state_dict(built_cache.root)
    assert sd.host_keys() == frozenset() and sd["tok_embeddings.weight"].is_meta


# --------------------------------------------------------------------------------------------
# the warm state dict
# --------------------------------------------------------------------------------------------


@pytest.fixture
def warm_sd(seeded_cache) -> wc.CachedStateDict:
    assert status(seeded_cache).warm
    return wc.build_cached_state_dict(seeded_cache.root)


def test_warm_state_dict_is_a_truthy_mutable_mapping_flagged_as_placeholder(warm_sd, seeded_cache) -> None:
    from collections.abc import MutableMapping

    assert isinstance(warm_sd, MutableMapping)
    assert warm_sd.is_placeholder is True and bool(warm_sd)
    assert set(warm_sd) == set(seeded_cache.state_dict) and len(warm_sd) == len(seeded_cache.state_dict)
    assert "norm.weight" in warm_sd and "missing.weight" not in warm_sd and 3 not in warm_sd
    assert warm_sd.get("missing.weight") is None
    with pytest.raises(KeyError):
        warm_sd["missing.weight"]


def test_warm_state_dict_host_keys_are_real(warm_sd, seeded_cache) -> None:
    assert warm_sd.host_keys() == frozenset(seeder.HOST_KEYS)
    real = warm_sd["tok_embeddings.weight"]
    assert not real.is_meta and torch.equal(real, seeded_cache.state_dict["tok_embeddings.weight"])


def test_warm_state_dict_overrides_shadow_the_manifest_and_the_host_weights(warm_sd) -> None:
    derived = torch.zeros(4)
    warm_sd["norm.weight"] = derived
    warm_sd["tok_embeddings.weight"] = derived
    warm_sd["extra.weight"] = derived
    assert warm_sd["norm.weight"] is derived and warm_sd["tok_embeddings.weight"] is derived
    keys = list(warm_sd)
    assert len(keys) == len(set(keys)) == len(warm_sd)
    assert warm_sd.setdefault("extra.weight", torch.ones(1)) is derived
    assert warm_sd.setdefault("new.weight", derived) is derived


def test_warm_state_dict_deletes_hide_keys_until_set_again(warm_sd) -> None:
    count = len(warm_sd)
    del warm_sd["layers.0.attention.wq.weight"]
    del warm_sd["tok_embeddings.weight"]
    assert "layers.0.attention.wq.weight" not in warm_sd and len(warm_sd) == count - 2
    assert "tok_embeddings.weight" not in list(warm_sd)
    with pytest.raises(KeyError):
        warm_sd["layers.0.attention.wq.weight"]
    with pytest.raises(KeyError):
        del warm_sd["layers.0.attention.wq.weight"]
    with pytest.raises(KeyError):
        del warm_sd["never.existed"]
    warm_sd["layers.0.attention.wq.weight"] = torch.ones(2)
    assert torch.equal(warm_sd["layers.0.attention.wq.weight"], torch.ones(2)) and len(warm_sd) == count - 1
    assert warm_sd.pop("norm.weight").is_meta and "norm.weight" not in warm_sd


def test_warm_state_dict_items_are_placeholders_without_storage(warm_sd) -> None:
    for key, value in warm_sd.items():
        assert value.is_meta == (key not in seeder.HOST_KEYS)


def test_build_cached_state_dict_without_a_marker_raises(built_cache) -> None:
    with pytest.raises(wc.WeightCacheError):
        wc.build_cached_state_dict(built_cache.root)


def test_build_cached_state_dict_raises_when_the_sidecar_vanished(seeded_cache) -> None:
    wc.VariantPaths(seeded_cache.root).host_sidecar.unlink()
    with pytest.raises(wc.WeightCacheError, match="vanished"):
        wc.build_cached_state_dict(seeded_cache.root)


def test_build_cached_state_dict_uses_a_given_host_dict(seeded_cache) -> None:
    host = {"tok_embeddings.weight": torch.zeros(96, 64, dtype=torch.bfloat16)}
    sd = wc.build_cached_state_dict(seeded_cache.root, host=host)
    assert sd["tok_embeddings.weight"] is host["tok_embeddings.weight"]


def _moe_state_dict(n_experts: int) -> dict[str, torch.Tensor]:
    sd = {"tok_embeddings.weight": torch.zeros(96, 64, dtype=torch.bfloat16)}
    for e in range(n_experts):
        sd[f"layers.0.block_sparse_moe.experts.{e}.w1.weight"] = wc.placeholder((128, 64), torch.bfloat16)
    sd["layers.0.attention.wqkv.weight"] = wc.placeholder((192, 64), torch.bfloat16)
    return sd


def test_args_facts_are_restored_from_the_manifest_with_more_than_ten_experts(built_cache) -> None:
    assert seeder.mark(built_cache.root, _moe_state_dict(16), is_moe=True, model_info={})
    args = SimpleNamespace(num_experts=0)
    wc.build_cached_state_dict(built_cache.root, args=args)
    assert args.is_mixture_of_experts is True and args.moe is True
    assert args.num_experts == 16
    assert args.fuse_qkv is True and args.fuse_mlp is False


def test_args_facts_from_model_info_win_over_key_sniffing(built_cache) -> None:
    info = {"num_experts": 64, "fuse_qkv": False, "fuse_mlp": True}
    assert seeder.mark(built_cache.root, _moe_state_dict(3), is_moe=True, model_info=info)
    args = SimpleNamespace()
    wc.build_cached_state_dict(built_cache.root, args=args)
    assert (args.num_experts, args.fuse_qkv, args.fuse_mlp) == (64, False, True)


def test_args_num_experts_is_not_clobbered_when_nothing_says_otherwise(built_cache) -> None:
    sd = {"tok_embeddings.weight": torch.zeros(96, 64, dtype=torch.bfloat16),
          "layers.0.feed_forward.experts.gate_up_proj": wc.placeholder((8, 64, 256), torch.bfloat16)}
    assert seeder.mark(built_cache.root, sd, is_moe=True, model_info={})
    args = SimpleNamespace(num_experts=8)
    wc.build_cached_state_dict(built_cache.root, args=args)
    assert args.num_experts == 8 and args.moe is True
    with_local = SimpleNamespace(num_local_experts=32)
    wc.build_cached_state_dict(built_cache.root, args=with_local)
    assert with_local.num_experts == 32


def test_dense_model_args_are_not_flagged_moe(seeded_cache) -> None:
    args = SimpleNamespace()
    wc.build_cached_state_dict(seeded_cache.root, args=args)
    assert args.is_mixture_of_experts is False and not hasattr(args, "moe")
    assert args.fuse_qkv is False and args.fuse_mlp is False


# --------------------------------------------------------------------------------------------
# rule 6 (in process): temp files
# --------------------------------------------------------------------------------------------


def test_no_temp_file_is_left_after_a_successful_mark(seeded_cache) -> None:
    assert seeded_cache.mark()
    leftovers = [p for p in seeded_cache.root.rglob("*") if ".tmp." in p.name]
    assert leftovers == []


def test_placeholder_safe_transforms_give_shapes_on_placeholders_and_values_on_real_tensors():
    from models.common.weight_cache import concat, fp32_elementwise, placeholder, stack

    real = [torch.randn(4, 3).to(torch.bfloat16), torch.randn(2, 3).to(torch.bfloat16)]
    fake = [placeholder(t.shape, t.dtype) for t in real]
    assert torch.equal(concat(real), torch.cat(real))
    joined = concat(fake)
    assert joined.is_meta and tuple(joined.shape) == (6, 3) and joined.dtype == torch.bfloat16
    same = [real[0], real[0].clone()]
    assert torch.equal(stack(same), torch.stack(same))
    stacked = stack([fake[0], fake[0]])
    assert stacked.is_meta and tuple(stacked.shape) == (2, 4, 3)
    assert torch.equal(fp32_elementwise(real[0], lambda w: w + 1.0), real[0].float() + 1.0)
    shifted = fp32_elementwise(fake[0], lambda w: w + 1.0)
    assert shifted.is_meta and shifted.dtype == torch.float32 and tuple(shifted.shape) == (4, 3)


def test_the_default_variants_sidecar_has_the_upstream_name(tmp_path) -> None:
    assert wc.VariantPaths(tmp_path).host_sidecar.name == wc.HOST_WEIGHTS_SIDECAR == ".host_weights.safetensors"
    assert wc.VariantPaths(tmp_path, {"precision": "bfloat16"}).host_sidecar.name != wc.HOST_WEIGHTS_SIDECAR
