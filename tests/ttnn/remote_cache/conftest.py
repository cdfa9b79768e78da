# SPDX-License-Identifier: Apache-2.0
"""Fixtures of the shared-store tests: one real S3 server (SeaweedFS) for the session, started
once (about 10 s), and one real tiny-llama cache built by the loader."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from models.testing.object_store import SeaweedServer, running_seaweed


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory) -> Iterator[SeaweedServer]:
    with running_seaweed(tmp_path_factory.mktemp("seaweed")) as server:
        yield server


@pytest.fixture
def s3_env(seaweed, monkeypatch) -> dict[str, str]:
    """This process talks to the test server through the standard AWS variables only."""
    env = seaweed.client_env()
    for name in [name for name in os.environ if name.startswith("AWS_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        if name.startswith("AWS_"):
            monkeypatch.setenv(name, value)
    return env


@pytest.fixture
def s3_url(seaweed, s3_env) -> str:
    """A prefix of the test bucket no other test uses."""
    return f"s3://{seaweed.bucket}/t-{uuid.uuid4().hex[:12]}"


@dataclass
class BuiltVariant:
    checkpoint: Path
    cache_root: Path
    cache_dir: Path
    tensors: dict  # every ttnn weight's per-device torch shards, as the cold build handed them back

    @property
    def marker(self):
        from models.common.weight_cache.marker import iter_markers

        ((_, marker, _),) = iter_markers(self.cache_dir)
        return marker


@pytest.fixture(scope="session")
def built_variant(tmp_path_factory) -> BuiltVariant:
    """A tiny llama (bfloat16, mesh 1x2) built cold by its loader, once."""
    from models.registry import loader_class
    from models.testing.tiny_models import make_checkpoint, tensors_of

    base = tmp_path_factory.mktemp("built")
    checkpoint = make_checkpoint("llama", base / "tiny-llama")
    loaded = loader_class("llama")(checkpoint, precision="bfloat16", cache_root=base / "cache", mesh_shape=(1, 2)).load()
    assert not loaded.warm and loaded.cached
    (marker,) = (base / "cache").rglob(".weights_complete.*")
    return BuiltVariant(checkpoint, base / "cache", marker.parent, tensors_of(loaded))
