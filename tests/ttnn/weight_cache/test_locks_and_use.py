# SPDX-License-Identifier: Apache-2.0
"""Locks that work where users are, and uses that count wherever they happen: a shared cache whose
build lock is another user's read-only file still caches; warm starts from a read-only mount and
``seed --check`` and another user's warm starts keep a variant from ``gc --older-than``."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from models.llama import LlamaLoader
from models.testing.tiny_models import make_checkpoint
from models.testing.tt_cache import REPO_ROOT, cli_env, json_out, tt_cache

NOBODY = 65534


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return make_checkpoint("llama", tmp_path_factory.mktemp("lock-models") / "tiny-llama")


def test_a_build_lock_owned_by_another_user_still_lets_this_user_cache(checkpoint, cache_root, as_unprivileged_python):
    """Another user's 0644 ``.build.lock`` in a shared cache dir: this user opens it read-only,
    still excludes other builders, and caches (it used to build unlocked and cache nothing, forever)."""
    loader = LlamaLoader(checkpoint, precision="bfloat16")
    loader.cache_dir.mkdir(parents=True)
    loader.paths.build_lock.touch()
    os.chown(loader.paths.build_lock, NOBODY, NOBODY)
    loader.paths.build_lock.chmod(0o644)
    probe = ("import sys\nfrom models.llama import LlamaLoader\n"
             "loaded = LlamaLoader(sys.argv[1], precision='bfloat16', cache_root=sys.argv[2]).load()\n"
             "print(loaded.warm, loaded.cached)\n")
    assert as_unprivileged_python(probe, str(checkpoint), str(cache_root)).split() == ["False", "True"]
    assert as_unprivileged_python(probe, str(checkpoint), str(cache_root)).split() == ["True", "True"]


def _age(loader: LlamaLoader, days: float) -> None:
    old = time.time() - days * 86400
    for record in (loader.paths.last_used, loader.paths.marker):
        os.utime(record, (old, old))


def test_warm_starts_from_a_read_only_mount_keep_a_cache_from_gc(checkpoint, cache_root, readonly_view, tmp_path,
                                                                   monkeypatch):
    monkeypatch.setenv("TT_USER_STATE", str(tmp_path / "user-state"))
    loader = LlamaLoader(checkpoint, precision="bfloat16")
    loader.load()
    _age(loader, 40)
    view = readonly_view(cache_root)
    assert LlamaLoader(checkpoint, precision="bfloat16", cache_root=view).load().warm  # in daily use, read-only
    env = cli_env(TT_USER_STATE=str(tmp_path / "user-state"))
    gc = tt_cache("gc", str(cache_root), "--older-than", "30d", "--json", env=env)
    assert gc.returncode == 0 and json_out(gc)["evicted"] == [], gc.stdout
    assert LlamaLoader(checkpoint, precision="bfloat16").load().warm


def test_a_seed_check_that_finds_the_cache_warm_counts_as_a_use(checkpoint, cache_root, tmp_path):
    loader = LlamaLoader(checkpoint, precision="bfloat16")
    loader.load()
    _age(loader, 40)
    plan = tmp_path / "plan.yaml"
    plan.write_text(f"models:\n  - model: {checkpoint}\n    meshes: [N150]\n    precisions: [bfloat16]\n")
    check = tt_cache("seed", "--plan", str(plan), "--check", "--cache-root", str(cache_root), "--json", env=cli_env())
    assert check.returncode == 0, check.stderr[-2000:]
    gc = tt_cache("gc", str(cache_root), "--older-than", "30d", "--json", env=cli_env())
    assert gc.returncode == 0 and json_out(gc)["evicted"] == [], gc.stdout
    _age(loader, 40)
    gc = tt_cache("gc", str(cache_root), "--older-than", "30d", "--json", env=cli_env())
    assert [Path(e["cache_dir"]) for e in json_out(gc)["evicted"]] == [loader.cache_dir]  # unused: evicted


OTHER_USER = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner",
              "--inh-caps=-dac_override,-dac_read_search,-fowner", "--"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand the cache to another user (chown)")
def test_another_users_warm_start_keeps_the_cache_from_the_builders_gc(checkpoint, cache_root, tmp_path):
    """The cache is the builder's (here ``nobody``: every file chowned), the reader someone else with
    its own user state (uid 0 without the capabilities that bypass file modes and ownership, so
    only "other" bits apply to it): its warm start lands in the record the builder's gc reads."""
    loader = LlamaLoader(checkpoint, precision="bfloat16")
    loader.load()
    assert stat.S_IMODE(loader.paths.last_used.stat().st_mode) == 0o666
    for path in [cache_root, *cache_root.rglob("*")]:
        os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
    _age(loader, 40)
    probe = ("import sys\nfrom models.llama import LlamaLoader\n"
             "print(LlamaLoader(sys.argv[1], precision='bfloat16', cache_root=sys.argv[2]).load().warm)\n")
    reader_state = tmp_path / "reader-state"
    reader = subprocess.run([*OTHER_USER, sys.executable, "-c", probe, str(checkpoint), str(cache_root)],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                            env=cli_env(TT_USER_STATE=str(reader_state)))
    assert reader.returncode == 0 and reader.stdout.split()[-1] == "True", reader.stderr[-3000:]
    gc = tt_cache("gc", str(cache_root), "--older-than", "30d", "--json", env=cli_env())
    assert gc.returncode == 0 and json_out(gc)["evicted"] == [], gc.stdout


def test_a_read_only_runners_check_report_hands_its_uses_to_the_writers_gc(checkpoint, cache_root, readonly_view,
                                                                           tmp_path):
    """A CI runner checks through a read-only mount, with a user state of its own (another machine's
    or container's): its uses reach the writer's gc only through its report (``gc --uses``)."""
    loader = LlamaLoader(checkpoint, precision="bfloat16")
    loader.load()
    _age(loader, 40)
    view = readonly_view(cache_root)
    plan = tmp_path / "plan.yaml"
    plan.write_text(f"models:\n  - model: {checkpoint}\n    meshes: [N150]\n    precisions: [bfloat16]\n")
    report = tmp_path / "check.json"
    check = tt_cache("seed", "--plan", str(plan), "--check", "--cache-root", str(view), "--report", str(report),
                     env=cli_env(TT_USER_STATE=str(tmp_path / "runner-state")))
    assert check.returncode == 0, check.stderr[-2000:]
    (use,) = json.loads(report.read_text())["uses"]
    assert use["cache_dir"] == loader.cache_dir.relative_to(cache_root).as_posix()
    dry = tt_cache("gc", str(cache_root), "--older-than", "30d", "--dry-run", "--json", env=cli_env())
    assert [Path(e["cache_dir"]) for e in json_out(dry)["evicted"]] == [loader.cache_dir]  # unseen without the report

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"uses": [{"cache_dir": "../../etc", "variant_tag": use["variant_tag"], "at": 1.0}]}))
    for broken in (bad, tmp_path / "missing.json"):
        refused = tt_cache("gc", str(cache_root), "--older-than", "30d", "--uses", str(broken), env=cli_env())
        assert refused.returncode == 2 and "nothing was evicted" in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1 and "Traceback" not in refused.stderr
    assert loader.paths.marker.exists()

    gc = tt_cache("gc", str(cache_root), "--older-than", "30d", "--uses", str(report), "--json", env=cli_env())
    assert gc.returncode == 0 and json_out(gc)["evicted"] == [], gc.stdout
    assert [u["recorded"] for u in json_out(gc)["uses"]] == [True]
    assert LlamaLoader(checkpoint, precision="bfloat16").load().warm
