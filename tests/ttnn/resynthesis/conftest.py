# SPDX-License-Identifier: Apache-2.0
"""Fixtures of the resynthesis tests: one tiny world per session (see :mod:`models.testing.resynthesis_world`)."""

from __future__ import annotations

import shutil

import pytest

from models.testing.resynthesis_world import World, make_tokenizer
from models.testing.tiny_models import make_checkpoint


@pytest.fixture(scope="session")
def world(tmp_path_factory) -> World:
    """Tiny llama checkpoints (one with a trained tokenizer) and their warm weight caches."""
    from models.resynthesis.parent import FrozenParent

    base = tmp_path_factory.mktemp("resynthesis-world")
    bare = make_checkpoint("llama", base / "bare", seed=0)
    model = base / "with-tokenizer"
    shutil.copytree(bare, model)
    make_tokenizer(model, vocab_size=512)
    other = make_checkpoint("llama", base / "other", seed=1)
    weights = base / "weights"
    for checkpoint in (model, bare, other):
        FrozenParent.load(checkpoint, precision="bfloat16", cache_root=weights)  # warm for every demo process
    share_dir = base / "cpu-share"
    share_dir.mkdir()
    return World(base=base, model=model, bare=bare, other=other, weights=weights, share_dir=share_dir)
