# SPDX-License-Identifier: Apache-2.0
"""``tt-cache gc``: whole variants evicted least recently used first, readers of the others never
disturbed, and nothing that is not a cache this project wrote ever deleted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from models.common.weight_cache.layout import VariantPaths
from models.llama import LlamaLoader
from models.qwen3 import Qwen3Loader
from models.testing.tt_cache import REPO_ROOT, cli_env, json_out, tt_cache
from models.testing.tiny_models import make_checkpoint

READER = """
import json, sys, time
from pathlib import Path
from models.llama import LlamaLoader
checkpoint, root, stop = sys.argv[1:]
loads = []
while not Path(stop).exists() or len(loads) < 3:
    loaded = LlamaLoader(checkpoint, precision="bfloat16", cache_root=root).load()
    loads.append(loaded.warm)
    if len(loads) == 1:
        print("ready", flush=True)
print(json.dumps({"loads": loads}), flush=True)
"""


@pytest.fixture
def three_variants(tmp_path_factory, tmp_path) -> dict:
    """A llama (A) and two qwen3 meshes (B, C) under one root, last used in the order B, C, A."""
    models = tmp_path_factory.getbasetemp() / "gc-models"
    if not models.exists():
        make_checkpoint("llama", models / "tiny-llama")
        make_checkpoint("qwen3", models / "tiny-qwen3")
    root = tmp_path / "cache"
    loaders = {
        "A": LlamaLoader(models / "tiny-llama", precision="bfloat16", cache_root=root),
        "B": Qwen3Loader(models / "tiny-qwen3", precision="bfloat16", cache_root=root),
        "C": Qwen3Loader(models / "tiny-qwen3", precision="bfloat16", mesh_shape="N300", cache_root=root),
    }
    for loader in loaders.values():
        assert not loader.load().warm
    for name in ("B", "C", "A"):
        time.sleep(0.02)
        assert loaders[name].load().warm  # a warm start stamps the variant as used now
    dirs = {name: loader.cache_dir for name, loader in loaders.items()}
    sizes = {row["cache_dir"]: row["size_bytes"] for row in json_out(tt_cache("ls", str(root), "--json", env=cli_env()))["variants"]}
    return {"root": root, "dirs": dirs, "sizes": {n: sizes[str(d)] for n, d in dirs.items()},
            "llama": models / "tiny-llama", "variants": {n: loader.build_variant for n, loader in loaders.items()}}


def _files(directory: Path) -> set[Path]:
    return {p for p in directory.rglob("*") if p.is_file()}


def test_max_size_evicts_lru_first_while_a_reader_of_another_variant_stays_warm(three_variants, tmp_path):
    root, dirs, sizes = three_variants["root"], three_variants["dirs"], three_variants["sizes"]
    user_file = dirs["B"] / "notes-of-the-user.txt"
    user_file.write_text("mine")
    before = {name: _files(d) for name, d in dirs.items()}

    dry = tt_cache("gc", str(root), "--max-size", str(sizes["A"]), "--dry-run", "--json", env=cli_env())
    assert dry.returncode == 0
    assert [Path(e["cache_dir"]) for e in json_out(dry)["evicted"]] == [dirs["B"], dirs["C"]]
    assert {name: _files(d) for name, d in dirs.items()} == before  # a dry run deletes nothing

    stop = tmp_path / "stop"
    reader = subprocess.Popen([sys.executable, "-c", READER, str(three_variants["llama"]), str(root), str(stop)],
                              cwd=REPO_ROOT, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert reader.stdout.readline().strip() == "ready", reader.stderr.read()[-2000:]
    gc = tt_cache("gc", str(root), "--max-size", str(sizes["A"]), "--json", env=cli_env())
    stop.touch()
    out, err = reader.communicate(timeout=300)
    assert gc.returncode == 0, gc.stderr[-2000:]
    result = json_out(gc)
    assert [Path(e["cache_dir"]) for e in result["evicted"]] == [dirs["B"], dirs["C"]]
    assert result["freed_bytes"] == sizes["B"] + sizes["C"] and result["kept_bytes"] == sizes["A"]
    loads = [line for line in out.splitlines() if line.startswith("{")]
    assert loads and all(json.loads(loads[-1])["loads"]), (out, err[-2000:])

    for name in ("B", "C"):
        left = _files(dirs[name])
        assert not any(p.name.startswith((".weights_complete", ".last_used")) or p.suffix == ".tensorbin" for p in left)
    assert user_file.read_text() == "mine"
    assert _files(dirs["A"]) >= {p for p in before["A"] if ".last_used" not in p.name}
    check = tt_cache("check", str(root), "--json", env=cli_env())
    assert [Path(v["cache_dir"]) for v in json_out(check)["variants"]] == [dirs["A"]] and check.returncode == 0


def test_older_than_evicts_only_variants_unused_that_long(three_variants):
    root, dirs = three_variants["root"], three_variants["dirs"]
    stamp = VariantPaths(dirs["C"], three_variants["variants"]["C"]).last_used
    long_ago = time.time() - 40 * 86400
    os.utime(stamp, (long_ago, long_ago))
    gc = tt_cache("gc", str(root), "--older-than", "30d", "--json", env=cli_env())
    assert gc.returncode == 0
    (evicted,) = json_out(gc)["evicted"]
    assert Path(evicted["cache_dir"]) == dirs["C"] and evicted["why"].startswith("unused for 40.0 days")
    assert not list(dirs["C"].glob(".weights_complete.*")) and len(list(dirs["A"].glob(".weights_complete.*"))) == 1


def test_gc_needs_a_limit_and_parses_it(tmp_path):
    (tmp_path / "root").mkdir()
    for args, message in ((["gc", str(tmp_path / "root")], "needs --max-size, --older-than"),
                          (["gc", str(tmp_path / "root"), "--max-size", "lots"], "size 'lots'"),
                          (["gc", str(tmp_path / "root"), "--older-than", "1 fortnight"], "duration '1 fortnight'")):
        out = tt_cache(*args, env=cli_env())
        assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr


def test_gc_of_a_read_only_cache_reports_each_variant_and_deletes_nothing(three_variants, readonly_view):
    view = readonly_view(three_variants["root"])
    before = _files(three_variants["root"])
    gc = tt_cache("gc", str(view), "--max-size", "0", "--json", env=cli_env())
    assert gc.returncode == 1 and "Traceback" not in gc.stderr
    result = json_out(gc)
    assert result["evicted"] == [] and len(result["errors"]) == 3
    assert all("Read-only file system" in error["error"] for error in result["errors"])
    assert _files(three_variants["root"]) == before
