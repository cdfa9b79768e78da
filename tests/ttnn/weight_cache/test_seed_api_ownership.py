# SPDX-License-Identifier: Apache-2.0
"""``tt-cache gc`` deletes only what a seed-API build provably wrote: a user's subfolder in a marked
cache (whose tensorbins the gate verifies all the same), a fork's ``layer_<n>/`` it was not told of,
and a nested cache (neither verified as the outer variant's nor deleted) survive its eviction."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from models.common import weight_cache as wc
from models.testing import weight_cache_seeder as seeder
from models.testing.tt_cache import cli_env, json_out, tt_cache
from tests.ttnn.weight_cache.seed_api import marker_body, recorded, relayout, rewrite_marker, status


@pytest.fixture
def crowded(built_cache, tiny_state_dict) -> dict:
    """A built (unmarked) seed-API cache holding a user's subfolder of tensorbins and a nested,
    marked cache of its own."""
    root = built_cache.root
    exports = root / "exports"
    exports.mkdir()
    shutil.copyfile(built_cache.path("output.weight"), exports / "mine.tensorbin")
    (exports / "notes.txt").write_text("a user's notes")
    nested = root / "nested"
    nested.mkdir()
    seeder.build_cache(nested, tiny_state_dict)
    assert seeder.mark(nested, tiny_state_dict)
    user_files = {path: path.read_bytes() for path in exports.iterdir()}
    nested_files = {path: path.read_bytes() for path in nested.rglob("*") if path.is_file()}
    return {"cache": built_cache, "root": root, "nested": nested, "user": user_files, "nested_files": nested_files}


def evict_outer(root: Path) -> dict:
    """``tt-cache gc`` of the outer variant only: it was last used long ago, the nested one now."""
    long_ago = time.time() - 10 * 86400
    os.utime(wc.VariantPaths(root).last_used, (long_ago, long_ago))
    gc = tt_cache("gc", str(root), "--older-than", "1d", "--json", env=cli_env())
    assert gc.returncode == 0, gc.stderr[-2000:]
    return json_out(gc)


def assert_survived(world: dict) -> None:
    for path, data in {**world["user"], **world["nested_files"]}.items():
        assert path.exists() and path.read_bytes() == data, path
    assert wc.weight_cache_status(wc.VariantPaths(world["nested"]), **seeder.gate_kwargs()).warm
    assert seeder.cache_mismatches(world["nested"]) == []


def test_gc_of_a_marked_cache_keeps_a_users_subfolder_and_a_nested_cache(crowded):
    root = crowded["root"]
    assert crowded["cache"].mark()
    files = recorded(root)
    result = evict_outer(root)
    assert [Path(e["cache_dir"]) for e in result["evicted"]] == [root]
    assert_survived(crowded)
    # the gate verified the user's tensorbin too, but only the build's own were gc's to delete
    assert files == {**dict.fromkeys(crowded["cache"].files.values(), True), "exports/mine.tensorbin": False}
    assert not any(root.glob("*.tensorbin")) and not any(root.glob("layers.*/*.tensorbin"))  # its own went


def files_below(root: Path) -> dict[Path, int]:
    return {path: path.stat().st_size for path in root.rglob("*") if path.is_file()}


def to_layer_dirs(relative: str) -> str:
    """gemma4's layout: ``layer_<n>/`` for this project's ``layers.<n>/``."""
    return relative.replace("layers.", "layer_", 1)


def test_gc_keeps_a_forks_layer_dirs_unless_the_build_named_them(built_cache):
    """The gate verifies a fork's ``layer_<n>/`` (test_seed_api_layouts.py), but a user could have
    put a tensorbin there, so gc deletes them only once the build named them; the bytes it says it
    freed are the ones that went."""
    root = built_cache.root
    relayout(built_cache, to_layer_dirs)
    in_layer_dirs = {path: path.read_bytes() for path in root.glob("layer_*/*.tensorbin")}
    assert in_layer_dirs and built_cache.mark()
    assert {path for path, owned in recorded(root).items() if not owned} == \
        {path.relative_to(root).as_posix() for path in in_layer_dirs}
    before = files_below(root)
    result = evict_outer(root)
    assert [Path(e["cache_dir"]) for e in result["evicted"]] == [root]
    for path, data in in_layer_dirs.items():
        assert path.read_bytes() == data, path
    assert not any(root.glob("*.tensorbin"))
    assert result["freed_bytes"] == sum(size for path, size in before.items() if not path.exists())
    assert result["evicted"][0]["size_bytes"] == result["freed_bytes"]  # as planned

    built_cache.files = seeder.build_cache(root, built_cache.state_dict)  # built again, naming its files
    relayout(built_cache, to_layer_dirs)
    assert built_cache.mark(cache_files=sorted(built_cache.files.values()))
    assert all(recorded(root).values()) and status(built_cache).warm
    evict_outer(root)
    assert not any(root.rglob("*.tensorbin")) and not any(root.glob("layer_*"))


def test_gc_keeps_a_nested_caches_files_even_where_a_marker_records_them(crowded):
    """A marker written by an older tool, recording every tensorbin below it: gc still leaves a
    directory that holds a cache of its own, and a file that is no longer the recorded one."""
    root = crowded["root"]
    assert crowded["cache"].mark()
    body = marker_body(root)
    nested = json.loads(wc.marker_path(crowded["nested"]).read_bytes())
    body["files"] += [dict(record, path=f"nested/{record['path']}") for record in nested["files"]]
    user_file = root / "exports" / "mine.tensorbin"
    body["files"].append(dict(body["files"][0], path="exports/mine.tensorbin", bytes=user_file.stat().st_size))
    rewrite_marker(root, body)
    evict_outer(root)
    assert_survived(crowded)


def test_named_files_inside_a_nested_cache_are_refused(crowded, captured_warnings):
    root = crowded["root"]
    named = [*crowded["cache"].files.values(), "nested/" + next(iter(crowded["cache"].files.values()))]
    assert not crowded["cache"].mark(cache_files=named)
    assert "holds a cache of its own" in captured_warnings()
    assert not wc.marker_path(root).exists()

