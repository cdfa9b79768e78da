# SPDX-License-Identifier: Apache-2.0
"""With ``$TT_CACHE_REMOTE`` set, a cold local ``load()`` first pulls its exact variant from the
shared store and starts warm with the tensors the cold build made; a store without the variant,
or one that cannot be reached, leaves it to build cold as before."""

from __future__ import annotations

from pathlib import Path

import torch

from models.common.weight_cache.remote.push import push_cache_dir
from models.common.weight_cache.remote.urls import open_store
from models.testing.object_store import free_ports
from models.testing.tiny_models import tensors_of


def _load(built_variant, root):
    from models.registry import loader_class

    return loader_class("llama")(built_variant.checkpoint, precision="bfloat16", cache_root=root,
                                 mesh_shape=(1, 2)).load()


def test_a_cold_load_pulls_its_variant_and_starts_warm(built_variant, s3_url, tmp_path, monkeypatch):
    push_cache_dir(built_variant.cache_dir, open_store(s3_url))
    monkeypatch.setenv("TT_CACHE_REMOTE", s3_url)
    loaded = _load(built_variant, tmp_path / "fresh-root")
    assert loaded.warm and loaded.cache_dir.is_relative_to(tmp_path / "fresh-root")
    tensors = tensors_of(loaded)
    assert tensors.keys() == built_variant.tensors.keys()
    for name, shards in tensors.items():
        assert all(torch.equal(a, b) for a, b in zip(shards, built_variant.tensors[name], strict=True)), name
    # the warm read mapped the copies the pull kept (named after the objects it received), none of its own
    mapped = {line.split(None, 5)[-1] for line in Path("/proc/self/maps").read_text().splitlines()
              if "memfd:snapshot:" in line and str(tmp_path.name) in line}
    assert mapped and all(".pulled-objects/" in name for name in mapped), mapped


def test_without_the_variant_or_the_store_the_load_builds_cold(built_variant, s3_url, tmp_path, monkeypatch):
    (dead_port,) = free_ports(1)
    for number, remote in enumerate([s3_url, f"http://127.0.0.1:{dead_port}/mirror", str(tmp_path / "empty")]):
        (tmp_path / "empty").mkdir(exist_ok=True)
        monkeypatch.setenv("TT_CACHE_REMOTE", remote)
        loaded = _load(built_variant, tmp_path / f"root{number}")
        assert not loaded.warm and loaded.cached, remote


def test_a_store_that_cannot_be_used_is_one_warning_then_a_cold_build(built_variant, seaweed, s3_url, tmp_path,
                                                                      monkeypatch):
    """Refused credentials, no credentials, an unknown bucket, an endpoint that does not answer: each
    cold load says so in one warning, never the secret, and builds cold at once."""
    from loguru import logger

    from models.testing.object_store import SECRET_KEY

    push_cache_dir(built_variant.cache_dir, open_store(s3_url))
    (dead_port,) = free_ports(1)
    cases = {
        "refused the credentials": (s3_url, {"AWS_SECRET_ACCESS_KEY": SECRET_KEY + "x"}),
        "no AWS credentials": (s3_url, {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None}),
        "no such bucket": ("s3://no-such-bucket/x", {}),
        "cannot reach the store": (s3_url, {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{dead_port}"}),
    }
    for number, (message, (remote, extra)) in enumerate(cases.items()):
        warnings: list[str] = []
        sink = logger.add(lambda record: warnings.append(str(record)), level="WARNING", format="{message}")
        try:
            with monkeypatch.context() as patch:
                patch.setenv("TT_CACHE_REMOTE", remote)
                for variable, value in extra.items():
                    patch.setenv(variable, value) if value is not None else patch.delenv(variable)
                loaded = _load(built_variant, tmp_path / f"root{number}")
        finally:
            logger.remove(sink)
        assert not loaded.warm and loaded.cached, message  # built cold, and cached
        store_lines = [line for line in warnings if remote in line]
        assert len(store_lines) == 1 and message in store_lines[0] and "building cold" in store_lines[0], warnings
        assert "\n" not in store_lines[0].strip() and SECRET_KEY not in "".join(warnings), message
