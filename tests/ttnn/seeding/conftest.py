# SPDX-License-Identifier: Apache-2.0
"""The seeding tests' tiny checkpoints, made once a session (transformers' first model build is
most of their cost); a test writes its caches elsewhere, never into them."""

from __future__ import annotations

from pathlib import Path

import pytest

from models.testing.tiny_models import make_checkpoint


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-checkpoints")
    return {family: make_checkpoint(family, root / f"tiny-{family}") for family in ("llama", "qwen3")}
