# SPDX-License-Identifier: Apache-2.0
"""Nothing deleted, leaked or served that is not ours, through the public loaders and ``tt-cache``:
a user's folder and another model's cache beside an explicit ``cache_dir=``, a marker whose file
sits behind a symlink, failed and killed builds, generations a reader holds while they are
replaced or evicted, and a reader facing a generation in the middle of its retirement."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from models.common.checkpoint import CheckpointError
from models.common.weight_cache import read_marker
from models.common.weight_cache.layout import VariantPaths, is_generation_name
from models.llama import LlamaLoader
from models.qwen3 import Qwen3Loader
from models.testing.cache_child import Child
from models.testing.file_opens import FileOpens
from models.testing.tiny_models import make_checkpoint, tensors_of
from models.testing.tt_cache import REPO_ROOT, cli_env, json_out, tt_cache


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("ownership-models")
    return {"llama": make_checkpoint("llama", base / "tiny-llama"), "qwen3": make_checkpoint("qwen3", base / "tiny-qwen3")}


def generations(cache_dir: Path) -> list[str]:
    return sorted(p.name for p in cache_dir.iterdir() if is_generation_name(p.name))


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(all(x.equal(y) for x, y in zip(a[k], b[k], strict=True)) for k in a)


def test_an_explicit_cache_dir_keeps_a_users_folder_and_another_models_cache(checkpoints, cache_root, tmp_path):
    """``cache_dir=$TT_CACHE_PATH`` (the README's remedy for an ambiguous cache-only load) beside a
    user's ``gemma-2b/`` and another model's warm cache: builds, forced rebuilds and gc remove
    only this variant's own generations."""
    shared = cache_root
    other = Qwen3Loader(checkpoints["qwen3"], precision="bfloat16")
    other.load()
    user_folder = shared / "gemma-2b"
    user_folder.mkdir()
    (user_folder / "weights.bin").write_bytes(b"a user's weights")
    loader = LlamaLoader(checkpoints["llama"], precision="bfloat16", cache_dir=shared)
    assert not loader.load().warm
    assert LlamaLoader(checkpoints["llama"], precision="bfloat16", cache_dir=shared, force=True).load().cached
    assert len(generations(shared)) == 1
    old = time.time() - 40 * 86400
    os.utime(loader.paths.last_used, (old, old))
    gc = tt_cache("gc", str(shared), "--older-than", "30d", "--json", env=cli_env())
    assert gc.returncode == 0, gc.stderr[-2000:]
    assert [Path(e["cache_dir"]) for e in json_out(gc)["evicted"]] == [shared]
    assert generations(shared) == [] and (user_folder / "weights.bin").read_bytes() == b"a user's weights"
    assert Qwen3Loader(checkpoints["qwen3"], precision="bfloat16").load().warm


def test_gc_never_deletes_through_a_symlinked_directory(tmp_path, built_cache, tiny_state_dict):
    """A seed-API marker whose files sit under a directory that is a symlink to somewhere else:
    gc withdraws the marker and deletes nothing outside the cache."""
    outside = tmp_path / "outside"
    (built_cache.root / "layers.0").rename(outside)
    (built_cache.root / "layers.0").symlink_to(outside)
    before = sorted(p.name for p in outside.iterdir())
    assert built_cache.mark()
    gc = tt_cache("gc", str(built_cache.root), "--max-size", "0", "--json", env=cli_env())
    assert gc.returncode == 0, gc.stderr[-2000:]
    assert json_out(gc)["evicted"] and not VariantPaths(built_cache.root).marker.exists()
    assert sorted(p.name for p in outside.iterdir()) == before
    assert not any(p.suffix == ".tensorbin" for p in built_cache.root.glob("*.tensorbin"))  # its own flat files went


def test_failed_builds_leave_nothing_and_killed_ones_are_cleaned_up(checkpoints, cache_root, tmp_path):
    """Three failures (a missing tensor), then three SIGKILLs at random points of a cold build:
    nothing is left by the failures; the killed builds' generations are listed by ``ls`` and
    removed by the next build."""
    broken = tmp_path / "broken"
    broken.mkdir()
    for item in checkpoints["llama"].iterdir():
        (broken / item.name).write_bytes(item.read_bytes())
    config = (broken / "config.json").read_text().replace('"num_hidden_layers": 2', '"num_hidden_layers": 3')
    (broken / "config.json").write_text(config)
    for _ in range(3):
        with pytest.raises(CheckpointError, match="no tensor for"):
            LlamaLoader(broken, precision="bfloat16").load()
    cache_dir = LlamaLoader(broken, precision="bfloat16").cache_dir
    assert not cache_dir.exists(), list(cache_dir.iterdir())  # refused as planned, before the build lock

    loader = LlamaLoader(checkpoints["llama"], precision="bfloat16")
    rng, killed_mid_build = random.Random(3), 0
    for _ in range(3):
        before = set(generations(loader.cache_dir)) if loader.cache_dir.exists() else set()
        build = subprocess.Popen([sys.executable, "-c", "import sys; from models.llama import LlamaLoader; "
                                  "LlamaLoader(sys.argv[1], precision='bfloat16', force=True).load()",
                                  str(checkpoints["llama"])], env=cli_env(), cwd=REPO_ROOT, stderr=subprocess.DEVNULL)
        while build.poll() is None and not (loader.cache_dir.exists() and set(generations(loader.cache_dir)) - before):
            time.sleep(0.002)
        time.sleep(rng.uniform(0, 0.05))  # somewhere inside the build
        build.send_signal(signal.SIGKILL)
        build.wait()
        marker = loader.status().marker
        unnamed = [g for g in generations(loader.cache_dir) if marker is None or g != marker.generation]
        killed_mid_build += bool(unnamed)
        assert len(unnamed) <= 1, "each build removes what the killed one before it left"
        listed = json_out(tt_cache("ls", str(cache_root), "--json", env=cli_env()))["leftovers"]
        assert sorted(b["generation"] for b in listed) == unnamed
    assert killed_mid_build >= 1, "no kill landed inside a build"
    assert loader.load().cached
    assert generations(loader.cache_dir) == [read_marker(loader.paths).generation]


def test_a_leased_generation_is_removed_once_its_reader_is_gone(checkpoints, cache_root):
    """A reader holds the current generation while a forced re-seed replaces it and gc evicts the
    variant: gc reports the held bytes as deferred, not freed; one more load leaves one generation."""
    loader = LlamaLoader(checkpoints["llama"], precision="bfloat16")
    loader.load()
    first = read_marker(loader.paths).generation
    with Child("lease", str(loader.cache_dir / first)):
        assert LlamaLoader(checkpoints["llama"], precision="bfloat16", force=True).seed().complete
        assert first in generations(loader.cache_dir)  # held: not retired yet
        gc = tt_cache("gc", str(cache_root), "--max-size", "0", "--json", env=cli_env())
        assert gc.returncode == 0, gc.stderr[-2000:]
        result = json_out(gc)
        assert [Path(d["path"]).name for d in result["deferred"]] == [first]
        assert result["freed_bytes"] < sum(f.stat().st_size for f in (loader.cache_dir / first).rglob("*"))
        assert generations(loader.cache_dir) == [first]
    again = LlamaLoader(checkpoints["llama"], precision="bfloat16").load()
    assert not again.warm and again.cached
    assert generations(loader.cache_dir) == [read_marker(loader.paths).generation]


def test_a_warm_start_retires_a_generation_its_reader_held_through_a_rebuild(checkpoints, cache_root):
    loader = LlamaLoader(checkpoints["llama"], precision="bfloat16")
    loader.load()
    first = read_marker(loader.paths).generation
    with Child("lease", str(loader.cache_dir / first)):
        LlamaLoader(checkpoints["llama"], precision="bfloat16", force=True).load()
        assert len(generations(loader.cache_dir)) == 2
    assert LlamaLoader(checkpoints["llama"], precision="bfloat16").load().warm
    assert generations(loader.cache_dir) == [read_marker(loader.paths).generation]


def test_a_reader_opens_nothing_of_a_generation_whose_retirement_holds_its_lease(checkpoints, cache_root):
    """The moment between a retirement taking a generation's lease exclusively and renaming it
    away: a reader that read the marker naming it must open none of its files."""
    loader = LlamaLoader(checkpoints["llama"], precision="bfloat16")
    reference = tensors_of(loader.load())
    generation = read_marker(loader.paths).generation
    with Child("retiring", str(loader.cache_dir / generation)), FileOpens(loader.cache_dir / generation) as watch:
        loaded = LlamaLoader(checkpoints["llama"], precision="bfloat16").load()
        opened = watch.opened()
    assert not [name for name in opened if name.endswith(".tensorbin") or ".host_weights" in name], opened
    assert not loaded.warm and same(tensors_of(loaded), reference)


def test_tt_cache_clean_removes_a_killed_builds_generation_but_not_a_live_ones(checkpoints, cache_root):
    loader = LlamaLoader(checkpoints["llama"], precision="bfloat16")
    loader.load()
    with Child("build", str(loader.cache_dir), loader.paths.tag) as live:
        clean = tt_cache("clean", str(cache_root), "--json", env=cli_env())
        assert clean.returncode == 0 and (loader.cache_dir / live.detail).is_dir()
        assert json_out(clean)["busy"] == [str(loader.cache_dir)]
        killed = live.detail
    clean = tt_cache("clean", str(cache_root), "--json", env=cli_env())
    assert clean.returncode == 0 and str(loader.cache_dir / killed) in json_out(clean)["removed"]
    assert LlamaLoader(checkpoints["llama"], precision="bfloat16").load().warm
