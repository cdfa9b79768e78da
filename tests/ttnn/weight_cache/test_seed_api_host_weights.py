# SPDX-License-Identifier: Apache-2.0
"""The seed API's cache-only deploys and the host-weights sidecar (no code runs from a cache file).

The caches they use: tests/weight_cache/seed_api.py.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import blake3
import pytest
import torch
import ttnn
from safetensors import safe_open

from models.common import weight_cache as wc
from models.common.weight_cache.marker import cached_model_config
from models.common.weight_cache.placeholders import placeholder
from models.testing import weight_cache_seeder as seeder
from tests.ttnn.weight_cache.seed_api import (
    as_tensor_prefix,
    marker_body,
    rewrite_marker,
    status,
)

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
    assert cached_model_config(wc.VariantPaths(built_cache.root)) == seeder.MODEL_CONFIG
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
        cached_model_config(wc.VariantPaths(built_cache.root))


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
    state_dict = dict(built_cache.state_dict, **{"tok_embeddings.weight": placeholder((96, 64), torch.bfloat16)})
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
