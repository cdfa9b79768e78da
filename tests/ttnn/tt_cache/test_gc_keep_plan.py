# SPDX-License-Identifier: Apache-2.0
"""``tt-cache gc --keep-plan PLAN``: a variant a seeding plan names is never evicted, nor offered
for eviction, whatever the limits; a plan gc cannot read stops it before anything is deleted."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from models.llama import LlamaLoader
from models.qwen3 import Qwen3Loader
from models.testing.tiny_models import make_checkpoint
from models.testing.tt_cache import cli_env, error_line, json_out, tt_cache


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    """Four variants: a llama, two qwen3 meshes, and a llama bfloat8_b built from a copy of the
    checkpoint that is gone since (a cache-only model: its plan entry cannot be opened)."""
    base = tmp_path_factory.mktemp("keep-plan")
    llama, qwen = make_checkpoint("llama", base / "tiny-llama"), make_checkpoint("qwen3", base / "tiny-qwen3")
    gone = base / "gone-llama"
    shutil.copytree(llama, gone)
    root = base / "cache"
    loaders = {
        "llama": LlamaLoader(llama, precision="bfloat16", cache_root=root),
        "qwen-1x1": Qwen3Loader(qwen, precision="bfloat16", cache_root=root),
        "qwen-1x2": Qwen3Loader(qwen, precision="bfloat16", mesh_shape="N300", cache_root=root),
        "gone": LlamaLoader(gone, precision="bfloat8_b", cache_root=root),
    }
    for loader in loaders.values():
        assert not loader.load().warm
    markers = {name: str(loader.paths.marker) for name, loader in loaders.items()}
    shutil.rmtree(gone)
    return {"base": base, "root": root, "llama": llama, "qwen": qwen, "gone": gone, "markers": markers}


@pytest.fixture
def cache(built, tmp_path) -> tuple[Path, dict[str, str]]:
    """A copy of the built root for one test to evict from, and its variants' markers."""
    copy = tmp_path / "cache"
    subprocess.run(["cp", "-a", str(built["root"]), str(copy)], check=True)
    return copy, {name: marker.replace(str(built["root"]), str(copy), 1) for name, marker in built["markers"].items()}


def _plan(path: Path, *entries: dict) -> Path:
    path.write_text(json.dumps({"models": list(entries)}))
    return path


def _markers_left(root: Path) -> set[str]:
    return {str(path) for path in root.rglob(".weights_complete.*")}


def test_named_variants_survive_max_size_0_and_older_than_0(built, cache, tmp_path):
    root, markers = cache
    llama_plan = _plan(tmp_path / "llama.yaml", {"model": str(built["llama"]), "meshes": ["N150"],
                                                 "precisions": ["bfloat16"]})
    qwen_plan = _plan(tmp_path / "qwen.yaml", {"model": str(built["qwen"]), "family": "qwen3", "meshes": ["1x2"],
                                               "precisions": ["bfloat16"], "components": ["text"]})
    kept = {markers["llama"], markers["qwen-1x2"]}
    keep = ["--keep-plan", str(llama_plan), "--keep-plan", str(qwen_plan)]
    dry = tt_cache("gc", str(root), "--older-than", "0s", "--max-size", "0", "--dry-run", *keep, "--json", env=cli_env())
    assert dry.returncode == 0, dry.stderr[-2000:]
    offered = json_out(dry)
    assert {e["cache_dir"] + "/" + e["marker"] for e in offered["evicted"]} == {markers["qwen-1x1"], markers["gone"]}
    assert set(offered["protected"]) == kept and _markers_left(root) == set(markers.values())

    gc = tt_cache("gc", str(root), "--max-size", "0", *keep, env=cli_env())
    assert gc.returncode == 0, gc.stderr[-2000:]
    assert all(f"kept {marker}: named by --keep-plan" in gc.stdout for marker in kept)
    assert _markers_left(root) == kept
    check = tt_cache("check", str(root), "--json", env=cli_env())
    assert check.returncode == 0 and {v["state"] for v in json_out(check)["variants"]} == {"warm"}


def test_a_plan_entry_without_checkpoint_keeps_the_variants_of_its_model_id(built, cache, tmp_path):
    """No checkpoint and no family: the loader cannot open it, so every variant built from that
    model id at that precision and mesh is kept."""
    root, markers = cache
    plan = _plan(tmp_path / "gone.yaml", {"model": str(built["gone"]), "meshes": ["N150"], "precisions": ["bfloat8_b"]})
    gc = tt_cache("gc", str(root), "--max-size", "0", "--keep-plan", str(plan), "--json", env=cli_env())
    assert gc.returncode == 0, gc.stderr[-2000:]
    assert json_out(gc)["protected"] == [markers["gone"]] and _markers_left(root) == {markers["gone"]}


BAD_PLANS = {
    "unreadable": (None, "cannot read the plan"),
    "bad YAML": ("models: [\n", "not valid YAML"),
    "unknown mesh": ("models:\n  - {model: a, meshes: [N3000], precisions: [bfloat16]}\n", "unknown mesh 'N3000'"),
    "unknown family": ("models:\n  - {model: a, family: gpt9, meshes: [N150], precisions: [bfloat16]}\n",
                       "unknown family 'gpt9'"),
}


@pytest.mark.parametrize("kind", list(BAD_PLANS))
def test_a_bad_keep_plan_is_exit_2_and_deletes_nothing(built, cache, tmp_path, kind):
    root, markers = cache
    text, problem = BAD_PLANS[kind]
    plan = tmp_path / "plan.yaml"
    if text is not None:
        plan.write_text(text)
    good = _plan(tmp_path / "good.yaml", {"model": str(built["llama"]), "meshes": ["N150"], "precisions": ["bfloat16"]})
    before = sorted(str(path) for path in root.rglob("*"))
    out = tt_cache("gc", str(root), "--max-size", "0", "--keep-plan", str(good), "--keep-plan", str(plan), env=cli_env())
    assert out.returncode == 2
    line = error_line(out, "gc")
    assert str(plan) in line and problem in line and line.endswith("nothing was evicted"), line
    assert set(before) <= {str(path) for path in root.rglob("*")}  # (reading the good plan may stamp its checkpoint)
