# SPDX-License-Identifier: Apache-2.0
"""A manifest whose marker names another ttnn, another tensorbin format or another marker format is
never used: written into a real store through the layout module (its objects valid and stored), a
pull by key, by dir and a cold start's pull all leave it; nothing of it enters the local cache (where
it would replace a warm variant of the same build), and the pull says why in words."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from models.common.weight_cache.marker import iter_markers
from models.common.weight_cache import VariantPaths
from models.common.weight_cache.remote.pull import local_status, trusted_manifest
from models.common.weight_cache.remote.push import push_cache_dir
from models.common.weight_cache.remote.store_layout import (
    Manifest,
    location_key,
    manifest_json,
    manifest_of,
    manifests_prefix,
    new_manifest_name,
)
from models.common.weight_cache.remote.urls import open_store

FOREIGN = {"ttnn_version": "0.0.0+another-ttnn", "tensorbin_format": "framed-d64-0badf00d"}


def _write_manifest(store, manifest: Manifest, body: bytes | None = None) -> str:
    """A manifest and its location entry, as a push from another host writes them."""
    key = manifests_prefix(manifest.variant_key) + new_manifest_name(manifest.pushed_ns)
    assert store.write_small(key, manifest_json(manifest) if body is None else body, exclusive=True)
    store.write_small(location_key(manifest.location, manifest.variant_key), b"", exclusive=True)
    return key


def _foreign(store, marker, location: str, field: str) -> Manifest:
    """The variant ``marker`` records, as a host of another ttnn (or format) pushed it: the same
    objects (stored already), its own manifest."""
    manifest = manifest_of(dataclasses.replace(marker, **{field: FOREIGN[field]}), location)
    _write_manifest(store, manifest)
    assert trusted_manifest(store, manifest.variant_key)[1] == manifest  # complete, well formed: only its identity is off
    return manifest


def _pushed(built_variant, s3_url) -> tuple[object, str]:
    store = open_store(s3_url)
    push_cache_dir(built_variant.cache_dir, store)
    return store, built_variant.cache_dir.relative_to(built_variant.cache_root).as_posix()


def _objects_only(built_variant, url: str):
    """A store holding the variant's objects and none of its manifests (nor their index entries)."""
    store, _ = _pushed(built_variant, url)
    for key in store.list_sizes(""):
        if not key.startswith("objects/"):
            store.delete(key)
    return store


def _markers(cache_dir: Path) -> list:
    return [marker for _, marker, _ in iter_markers(cache_dir)] if cache_dir.exists() else []


@pytest.mark.parametrize("field", ["ttnn_version", "tensorbin_format"])
def test_a_pull_by_key_of_another_identity_fetches_and_writes_nothing(field, built_variant, s3_url, tmp_path, capsys,
                                                                     cli_in_process):
    from models.tt_cache.cli import main

    store, location = _pushed(built_variant, s3_url)
    foreign = _foreign(store, built_variant.marker, location, field)
    empty, warm = tmp_path / "empty", tmp_path / "warm"
    shutil.copytree(built_variant.cache_root, warm, symlinks=True)
    for root in (empty, warm):
        code = main(["pull", "--from", s3_url, foreign.variant_key, "--cache-root", str(root), "--json"])
        (document,) = json.loads(capsys.readouterr().out)["variants"]
        assert code == 1 and not document["warm"] and not document["already_warm"], root
        assert document["reason"].startswith("not pulled: built with ttnn ") and FOREIGN[field] in document["reason"]
        assert document["objects_fetched"] == 0 and document["bytes_fetched"] == 0
        assert not (root / location / ".pulled-objects").exists()
    assert _markers(empty / location) == [] and not [p for p in (empty / location).glob("g*")]
    (kept,) = _markers(warm / location)  # the warm variant there is untouched, and still warm
    assert kept == built_variant.marker and local_status(VariantPaths(warm / location, kept.build_variant), kept).warm


def test_a_pull_by_dir_skips_a_variant_another_ttnn_pushed_from_there(built_variant, s3_url, tmp_path, capsys,
                                                                      cli_in_process):
    from models.tt_cache.cli import main

    store, location = _pushed(built_variant, s3_url)
    foreign = _foreign(store, built_variant.marker, location, "ttnn_version")
    root = tmp_path / "root"
    code = main(["pull", "--from", s3_url, str(root / location), "--cache-root", str(root), "--json"])
    document = json.loads(capsys.readouterr().out)
    assert code == 0 and document["warm"]
    (pulled,) = document["variants"]
    assert pulled["variant_key"] != foreign.variant_key and pulled["objects_fetched"] > 0
    (skipped,) = document["skipped"]
    assert foreign.variant_key[:16] in skipped and FOREIGN["ttnn_version"] in skipped
    (marker,) = _markers(root / location)
    assert marker.ttnn_version == built_variant.marker.ttnn_version and local_status(VariantPaths(root / location, marker.build_variant), marker).warm
    # only the foreign one there: nothing pulled, one line that says why
    only = _objects_only(built_variant, f"{s3_url}-only")
    _foreign(only, built_variant.marker, location, "tensorbin_format")
    code = main(["pull", "--from", only.url, str(tmp_path / "r2" / location), "--cache-root", str(tmp_path / "r2")])
    assert code == 1 and "can be used here" in capsys.readouterr().err and not (tmp_path / "r2" / location).exists()


def _other_marker_format(manifest: Manifest, version: int) -> tuple[Manifest, bytes]:
    """``manifest`` pushed later by a writer of another marker format (everything else the same)."""
    later = dataclasses.replace(manifest, pushed_ns=manifest.pushed_ns + 10**9)
    body = json.loads(manifest_json(later))
    body["marker"]["format_version"] = version
    return later, json.dumps(body).encode()


def test_a_manifest_of_another_marker_format_is_passed_over(built_variant, s3_url, tmp_path, capsys, cli_in_process):
    from models.tt_cache.cli import main

    store, _ = _pushed(built_variant, s3_url)
    key, manifest = trusted_manifest(store, _variant_key(built_variant))
    for version in (6, 8):
        newer, body = _other_marker_format(manifest, version)
        _write_manifest(store, newer, body)
        assert trusted_manifest(store, manifest.variant_key)[0] == key  # the newest one this code reads
    alone = _objects_only(built_variant, f"{s3_url}-alone")
    _write_manifest(alone, *_other_marker_format(manifest, 6))
    code = main(["pull", "--from", alone.url, manifest.variant_key, "--cache-root", str(tmp_path / "root")])
    err = capsys.readouterr().err
    assert code == 1 and "format_version 6" in err and len([l for l in err.splitlines() if "tt-cache pull" in l]) == 1
    assert not (tmp_path / "root").exists() or _markers(tmp_path / "root" / manifest.location) == []


def _variant_key(built_variant) -> str:
    from models.common.weight_cache.remote.store_layout import variant_key

    return variant_key(built_variant.marker)


def test_a_cold_start_never_takes_a_foreign_variant(built_variant, s3_url, tmp_path, monkeypatch):
    """The store holds this variant only as another ttnn built it, and as a manifest of another
    marker format under this host's own key: the load builds cold, and its marker is this host's."""
    from models.registry import loader_class

    store, location = _pushed(built_variant, s3_url)
    _, manifest = trusted_manifest(store, _variant_key(built_variant))
    store = _objects_only(built_variant, s3_url)  # this host's own manifest withdrawn
    _foreign(store, built_variant.marker, location, "ttnn_version")
    _write_manifest(store, *_other_marker_format(manifest, 6))
    monkeypatch.setenv("TT_CACHE_REMOTE", s3_url)
    root = tmp_path / "root"
    loaded = loader_class("llama")(built_variant.checkpoint, precision="bfloat16", cache_root=root,
                                   mesh_shape=(1, 2)).load()
    assert not loaded.warm and loaded.cached
    (marker,) = _markers(root / location)
    assert marker.ttnn_version == built_variant.marker.ttnn_version
    assert marker.tensorbin_format == built_variant.marker.tensorbin_format
    assert not (root / location / ".pulled-objects").exists()
