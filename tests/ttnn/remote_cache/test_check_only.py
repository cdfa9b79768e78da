# SPDX-License-Identifier: Apache-2.0
"""The check-only paths never move a byte through the shared store: ``tt-cache seed --check`` and
``tt-cache check`` with ``$TT_CACHE_REMOTE`` and ``$TT_CACHE_REMOTE_PUSH`` set report a cold cache
cold (the store holds the variant: nothing is pulled) and a warm one warm (the store lacks it:
nothing is pushed); the store, to its last key, and the cache root are as they were."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from models.common.weight_cache.remote.push import push_cache_dir
from models.common.weight_cache.remote.urls import open_store
from models.testing.tt_cache import cli_env, tt_cache


def _files(root: Path) -> dict[str, int]:
    """The cache root's files but its own records (``.stamps``: the checkpoint's content id, kept by a check)."""
    return {p.relative_to(root).as_posix(): p.stat().st_size for p in root.rglob("*")
            if p.is_file() and not p.relative_to(root).as_posix().startswith(".stamps/")}


def _check_only(seaweed, built_variant, root: Path, url: str, plan: Path):
    env = seaweed.client_env(cli_env(root), TT_CACHE_REMOTE=url, TT_CACHE_REMOTE_PUSH="1")
    seed = tt_cache("seed", "--plan", str(plan), "--check", "--report", str(plan.with_name(f"{root.name}.json")),
                    env=env)
    check = tt_cache("check", str(root), env=env)
    return seed, check


def test_check_only_paths_never_pull_nor_push(built_variant, seaweed, s3_url, tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"models": [{"model": str(built_variant.checkpoint), "meshes": ["N300"],
                                            "precisions": ["bfloat16"]}]}))
    full, empty = open_store(s3_url), open_store(f"{s3_url}-empty")
    push_cache_dir(built_variant.cache_dir, full)
    held = full.list_keys("")

    cold = tmp_path / "cold-root"
    cold.mkdir()
    seed, check = _check_only(seaweed, built_variant, cold, s3_url, plan)
    assert seed.returncode == 1, seed.stderr[-3000:]  # cold: the store's copy was not pulled
    (case,) = json.loads((tmp_path / "cold-root.json").read_text())["cases"]
    assert case["outcome"] == "cold", case
    assert check.returncode in (0, 1), check.stderr[-3000:]
    assert _files(cold) == {} and full.list_keys("") == held  # not a byte pulled, no 'used' written

    warm = tmp_path / "warm-root"
    shutil.copytree(built_variant.cache_root, warm, symlinks=True)
    before = _files(warm)
    seed, check = _check_only(seaweed, built_variant, warm, empty.url, plan)
    assert seed.returncode == 0 and check.returncode == 0, seed.stderr[-3000:] + check.stderr[-3000:]
    assert empty.list_keys("") == {}  # not a byte pushed
    assert {k for k in _files(warm) if k in before} == set(before)
