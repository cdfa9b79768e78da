# SPDX-License-Identifier: Apache-2.0
"""A cache-only deploy (config and tokenizer, no weights, an empty cache under a fresh HOME) with
``$TT_CACHE_REMOTE`` set starts warm from the shared store: it finds the variants pushed under its
model id, pulls one, and the cache-only gate decides as for a local cache. A store without one,
or one that fails, is the error: one line naming the store and what to do; an index entry without
its manifest, or naming another model's, is ignored; two checkpoints under one model id are an
error listing both."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from models.common.checkpoint import CheckpointError
from models.common.weight_cache.remote.push import push_cache_dir
from models.common.weight_cache.remote.store_layout import model_index_key, model_key_of, object_key
from models.common.weight_cache.remote.urls import open_store
from models.testing.object_store import free_ports
from models.testing.tiny_models import as_hub_snapshot, make_checkpoint, tensors_of
from tests.ttnn.vllm.oracle import tiny_tokenizer

REPO_ID = "org/tiny-llama"


@dataclass
class HubVariant:
    snapshot: Path
    cache_dir: Path
    tensors: dict

    @property
    def marker(self):
        from models.common.weight_cache.marker import iter_markers

        ((_, marker, _),) = iter_markers(self.cache_dir)
        return marker


def _build(base: Path, seed: int) -> HubVariant:
    """A tiny llama published as ``org/tiny-llama`` in a hub cache, with a tokenizer, built cold."""
    checkpoint = make_checkpoint("llama", base / "checkpoint", seed=seed)
    tiny_tokenizer(checkpoint, json.loads((checkpoint / "config.json").read_text())["vocab_size"])
    snapshot = as_hub_snapshot(checkpoint, base / "hub", REPO_ID)
    loaded = _loader(snapshot, base / "cache").load()
    assert not loaded.warm and loaded.cached
    return HubVariant(snapshot, loaded.cache_dir, tensors_of(loaded))


def _loader(model: Path, cache_root: Path | None = None):
    from models.registry import loader_class

    return loader_class("llama")(model, precision="bfloat16", cache_root=cache_root, mesh_shape=(1, 2))


@pytest.fixture(scope="module")
def hub_variant(tmp_path_factory) -> HubVariant:
    return _build(tmp_path_factory.mktemp("hub-variant"), seed=0)


@pytest.fixture
def deploy(hub_variant, tmp_path, monkeypatch) -> Path:
    """The snapshot's config and tokenizer in another hub cache, no weights; HOME fresh, so the
    default cache root is empty."""
    source = tmp_path / "deploy-files"
    shutil.copytree(hub_variant.snapshot, source, ignore=shutil.ignore_patterns("*.safetensors*"))
    snapshot = as_hub_snapshot(source, tmp_path / "deploy-hub", REPO_ID)
    assert (snapshot / "config.json").is_file() and (snapshot / "tokenizer.json").is_file()
    assert not list(snapshot.glob("*.safetensors*"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name in ("TT_CACHE_PATH", "XDG_CACHE_HOME", "TT_USER_STATE", "TT_CACHE_REMOTE"):
        monkeypatch.delenv(name, raising=False)
    return snapshot


def _no_cache_error(deploy: Path) -> str:
    with pytest.raises(CheckpointError) as error:
        _loader(deploy).load()
    assert "no checkpoint weights on this machine" in str(error.value)
    return str(error.value)


def test_a_cache_only_deploy_starts_warm_from_the_store(hub_variant, deploy, s3_url, tmp_path, monkeypatch):
    push_cache_dir(hub_variant.cache_dir, open_store(s3_url))
    monkeypatch.setenv("TT_CACHE_REMOTE", s3_url)
    loaded = _loader(deploy).load()
    assert loaded.warm and loaded.cache_dir.is_relative_to(tmp_path / "home")
    tensors = tensors_of(loaded)
    assert tensors.keys() == hub_variant.tensors.keys()
    for name, shards in tensors.items():
        assert all(torch.equal(a, b) for a, b in zip(shards, hub_variant.tensors[name], strict=True)), name
    monkeypatch.delenv("TT_CACHE_REMOTE")
    assert _loader(deploy).load().warm  # pulled into the place a cache-only load looks


def test_a_store_without_the_variant_is_one_line_naming_the_push(deploy, s3_url, monkeypatch):
    _no_cache_error(deploy)
    monkeypatch.setenv("TT_CACHE_REMOTE", s3_url)
    error = _no_cache_error(deploy)
    assert "\n" not in error
    assert "no bfloat16/mesh_1x2 cache of it under" in error
    assert f"the shared store TT_CACHE_REMOTE={s3_url} has no variant of {REPO_ID} for this host (ttnn " in error
    assert f"push it there (tt-cache push VARIANT_DIR --to {s3_url}" in error


def test_index_entries_without_their_manifest_or_of_another_model_are_ignored(hub_variant, built_variant, deploy,
                                                                             s3_url, monkeypatch):
    store = open_store(s3_url)
    (other,) = push_cache_dir(built_variant.cache_dir, store)  # another model id (a local path)
    ours = model_key_of(hub_variant.marker)
    store.write_small(model_index_key(ours, other.variant_key), b"", exclusive=True)
    store.write_small(model_index_key(ours, "ab" * 32), b"", exclusive=True)
    monkeypatch.setenv("TT_CACHE_REMOTE", s3_url)
    _no_cache_error(deploy)
    push_cache_dir(hub_variant.cache_dir, store)
    assert _loader(deploy).load().warm


def test_two_checkpoints_under_one_model_id_are_an_error_listing_both(hub_variant, deploy, s3_url, tmp_path,
                                                                      monkeypatch):
    store = open_store(s3_url)
    other = _build(tmp_path / "other", seed=1)
    keys = [result.variant_key for variant in (hub_variant, other) for result in push_cache_dir(variant.cache_dir, store)]
    monkeypatch.setenv("TT_CACHE_REMOTE", s3_url)
    with pytest.raises(CheckpointError, match="different weights") as error:
        _loader(deploy).load()
    assert all(key in str(error.value) for key in keys)
    assert not list((tmp_path / "home").rglob(".weights_complete.*"))  # nothing pulled



def test_a_store_that_fails_is_one_line_naming_it_and_publishes_nothing(hub_variant, deploy, s3_url, tmp_path,
                                                                          monkeypatch):
    """A dead store, an HTTP mirror (no listing) and an object whose bytes are not its digest's
    (same size: only the pull's hash sees it) each give one line naming the store and what failed."""
    store = open_store(s3_url)
    push_cache_dir(hub_variant.cache_dir, store)
    record = max(hub_variant.marker.files, key=lambda r: r.bytes)
    store.upload(object_key(record.digest), [b"\0" * record.bytes], record.bytes, exclusive=False)
    (dead_port,) = free_ports(1)
    dead = f"http://127.0.0.1:{dead_port}/mirror"
    for remote, what in ((s3_url, "failed ("), (dead, "could not be asked for it (")):
        monkeypatch.setenv("TT_CACHE_REMOTE", remote)
        error = _no_cache_error(deploy)
        assert "\n" not in error and f"TT_CACHE_REMOTE={remote}" in error and what in error, error
    assert not list((tmp_path / "home").rglob(".weights_complete.*"))


def test_a_pulled_cache_built_with_another_config_is_refused(hub_variant, deploy, s3_url, monkeypatch):
    """The store's variant is pulled, then the cache-only gate compares the deploy's config.json
    with the recorded one, as for a local cache."""
    push_cache_dir(hub_variant.cache_dir, open_store(s3_url))
    config = json.loads((deploy / "config.json").read_text())
    (config.get("rope_parameters") or config)["rope_theta"] = 123.0
    (deploy / "config.json").write_text(json.dumps(config))
    monkeypatch.setenv("TT_CACHE_REMOTE", s3_url)
    with pytest.raises(CheckpointError, match="differs from the config"):
        _loader(deploy).load()
