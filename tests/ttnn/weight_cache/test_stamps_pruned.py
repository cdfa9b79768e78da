# SPDX-License-Identifier: Apache-2.0
"""Checkpoint stamp indexes (one per checkpoint location) stay bounded: CI jobs that each check a
model out into a new directory, load it and delete it leave no index behind them; live locations
beyond the bound evict the least recently used; concurrent loads lose and corrupt nothing; and
nothing in the directory that is not a proven index is ever deleted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from models.common.weight_cache.layout import CacheRoot, location_key, path_key
from models.common.weight_cache.stamps import MAX_LOCATION_INDEXES
from models.testing.tiny_models import make_checkpoint
from models.testing.tt_cache import REPO_ROOT, cli_env, tt_cache

# CI jobs in one process: each copies the checkpoint into a new directory, loads it with the
# public loader and deletes the directory. With a live location, it then restamps that one's weights
# (a restore in place: hashed again) and loads it too, so every job also writes the live index.
# ``how`` is "load" (``LlamaLoader.load()``) or "check" (``tt-cache seed --check``, torch-free: many
# processes at once start in a fraction of a second).
JOBS = """
import json, os, shutil, sys, time
from pathlib import Path
how, source, base, prefix, jobs, live = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4], int(sys.argv[5]), sys.argv[6:]
def load(location):
    if how == "load":
        from models.llama import LlamaLoader
        assert LlamaLoader(location, precision="bfloat16").load().weights
        return
    from models.tt_cache.cli import main
    plan = base / f"{prefix}-plan.yaml"
    plan.write_text(json.dumps({"models": [{"model": str(location), "meshes": ["N150"], "precisions": ["bfloat16"]}]}))
    assert main(["seed", "--plan", str(plan), "--check"]) in (0, 1)
for job in range(jobs):
    checkout = shutil.copytree(source, base / f"{prefix}-{job}" / "tiny-llama")
    time.sleep(0.03)  # past the racy tick: its stamps are recorded
    load(checkout)
    shutil.rmtree(checkout.parent)
    for location in live:
        os.utime(Path(location) / "model.safetensors")
        time.sleep(0.03)
        load(location)
"""

# A fresh ``tt-cache seed --check`` of one checkpoint (which computes its content id): prints the
# bytes it read (the kernel's count) after its imports.
PROBE = """
import json, sys
from models.tt_cache.cli import main
def rchar():
    return int(next(l for l in open('/proc/self/io') if l.startswith('rchar:')).split()[1])
before = rchar()
assert main(["seed", "--plan", sys.argv[2], "--check"]) in (0, 1)
print(rchar() - before)
"""


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    path = make_checkpoint("llama", tmp_path_factory.mktemp("pruned-stamp-models") / "tiny-llama")
    time.sleep(0.1)  # let the files' stamps settle before any test hashes them
    return path


def indexes(cache_root: Path) -> set[str]:
    return {p.name for p in (cache_root / ".stamps" / "checkpoints").iterdir()}


def own_index(cache_root: Path, location: Path) -> Path:
    return CacheRoot(cache_root).checkpoint_stamps(location.name, location)


def run_jobs(how: str, checkpoint: Path, base: Path, cache_root: Path, prefix: str, jobs: int,
             *live: Path, user_state: Path | None = None) -> subprocess.Popen:
    base.mkdir(parents=True, exist_ok=True)
    env = cli_env(cache_root, **({"TT_USER_STATE": str(user_state)} if user_state else {}))
    return subprocess.Popen([sys.executable, "-c", JOBS, how, str(checkpoint), str(base), prefix, str(jobs),
                             *map(str, live)], cwd=REPO_ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def finished(process: subprocess.Popen) -> str:
    _, stderr = process.communicate(timeout=600)
    assert process.returncode == 0 and "Traceback" not in stderr, stderr[-3000:]
    return stderr


def bytes_read_for_content_id(location: Path, cache_root: Path) -> int:
    plan = location.parent / "probe-plan.yaml"
    plan.write_text(json.dumps({"models": [{"model": str(location), "meshes": ["N150"], "precisions": ["bfloat16"]}]}))
    out = subprocess.run([sys.executable, "-c", PROBE, str(location), str(plan)], cwd=REPO_ROOT,
                         env=cli_env(cache_root), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return int(out.stdout.split()[-1])


def not_ours(directory: Path) -> dict[str, bytes | None]:
    """Files in the index directory that are not indexes this project wrote, or that it must keep:
    a user's file with an index's name, an index-shaped file whose location does not have the
    name's key, one of a location gone from this host written by another host, a symlink to a
    file elsewhere, a FIFO and a directory with indexes' names. ``name -> bytes`` (None: not a file)."""
    directory.mkdir(parents=True, exist_ok=True)
    gone = "/nonexistent/checkouts/tiny-llama"
    made = {
        "notes--0123456789abcdef.json": b'{"mine": true}',
        "forged--0123456789abcdef.json": json.dumps(
            {"format": 1, "entries": {}, "location": gone, "host": os.uname().nodename}).encode(),
        f"tiny-llama--{location_key(gone)}.json": json.dumps(
            {"format": 1, "entries": {}, "location": gone, "host": "another-host"}).encode(),
    }
    for name, content in made.items():
        (directory / name).write_bytes(content)
    outside = directory.parent.parent / "elsewhere.json"
    outside.write_bytes(b"{}")
    (directory / "linked--fedcba9876543210.json").symlink_to(outside)
    os.mkfifo(directory / "fifo--1111111111111111.json")
    (directory / "folder--2222222222222222.json").mkdir()
    return made | {"linked--fedcba9876543210.json": None, "fifo--1111111111111111.json": None,
                   "folder--2222222222222222.json": None}


@pytest.mark.parametrize("checkouts", [pytest.param(50, marks=pytest.mark.slow), 12])
def test_checkouts_into_new_directories_leave_no_index_behind(checkpoint, cache_root, tmp_path, checkouts):
    live = shutil.copytree(checkpoint, tmp_path / "live" / "tiny-llama")
    time.sleep(0.05)
    first_sight = bytes_read_for_content_id(live, cache_root)  # hashed
    kept = not_ours(cache_root / ".stamps" / "checkpoints")
    finished(run_jobs("load", checkpoint, tmp_path / "jobs", cache_root, "job", checkouts, live))
    own = own_index(cache_root, live)
    # the live location's and what is not ours to delete (the last job's went with the live one's last write)
    assert indexes(cache_root) == {own.name, *kept}
    directory = cache_root / ".stamps" / "checkpoints"
    for name, content in kept.items():
        if content is not None:
            assert (directory / name).read_bytes() == content
    assert (cache_root / "elsewhere.json").read_bytes() == b"{}"
    assert json.loads(own.read_text())["location"] == str(live.resolve())
    size = (live / "model.safetensors").stat().st_size
    assert bytes_read_for_content_id(live, cache_root) < first_sight - size // 2  # recognised: never lost


def test_live_locations_beyond_the_bound_evict_the_least_recently_used(checkpoint, cache_root, tmp_path):
    """More live locations than the bound, loaded by ``tt-cache seed --check``: the bound holds, and
    the location used again survives those created after it."""
    places = []
    for number in range(MAX_LOCATION_INDEXES + 3):
        place = tmp_path / f"place-{number:03d}" / f"model-{number:03d}"  # its own name: no other index to share
        place.mkdir(parents=True)
        for file in checkpoint.iterdir():
            os.link(file, place / file.name)
        places.append(place)
    time.sleep(0.1)  # the links changed the files' ctime: let it settle

    def seed_check(models: list[Path]) -> None:
        plan = tmp_path / "plan.yaml"
        plan.write_text(json.dumps({"models": [{"model": str(m), "meshes": ["N150"], "precisions": ["bfloat16"]}
                                               for m in models]}))
        out = tt_cache("seed", "--plan", str(plan), "--check", env=cli_env(cache_root))
        assert out.returncode in (0, 1) and "Traceback" not in out.stderr, out.stderr[-3000:]

    seed_check(places[:MAX_LOCATION_INDEXES])
    assert len(indexes(cache_root)) == MAX_LOCATION_INDEXES
    seed_check([places[0], *places[MAX_LOCATION_INDEXES:]])
    expected = {own_index(cache_root, place).name for place in [places[0], *places[4:]]}
    assert indexes(cache_root) == expected


@pytest.mark.parametrize("checkouts", [pytest.param(30, marks=pytest.mark.slow), 6])
def test_concurrent_loads_never_lose_or_corrupt_an_index(checkpoint, cache_root, tmp_path, checkouts):
    """Three processes running CI jobs at once, each writing a live location's index between its
    jobs: the writers of one index and the pruners of its directory all at work together."""
    live = shutil.copytree(checkpoint, tmp_path / "live" / "tiny-llama")
    time.sleep(0.05)
    first_sight = bytes_read_for_content_id(live, cache_root)  # hashed
    jobs = [run_jobs("check", checkpoint, tmp_path / "jobs", cache_root, f"p{n}", checkouts, live) for n in range(3)]
    for process in jobs:
        assert "ignored" not in finished(process)  # no index refused as torn or malformed
    assert len(indexes(cache_root)) <= 1 + len(jobs)  # the live one, and each job process's last one at most
    assert json.loads(own_index(cache_root, live).read_text())["location"] == str(live.resolve())
    size = (live / "model.safetensors").stat().st_size
    assert bytes_read_for_content_id(live, cache_root) < first_sight - size // 2  # recognised by its stamps


def test_a_users_own_indexes_beside_a_read_only_root_stay_bounded(checkpoint, cache_root, readonly_view, tmp_path):
    """Where the root is read-only each user keeps checkpoint indexes in their own state, beside the
    variants' stamps: the same rule prunes the former and never touches the latter."""
    cache_root.mkdir()
    view = readonly_view(cache_root)
    user_state = tmp_path / "user-state"
    stamps = user_state / "stamps"
    stamps.mkdir(parents=True)
    variant_stamps = stamps / f"{path_key(tmp_path)}.0123456789ab.json"  # a variant's, per user
    variant_stamps.write_bytes(b'{"format": 1, "entries": {}}')
    live = shutil.copytree(checkpoint, tmp_path / "live" / "tiny-llama")
    time.sleep(0.05)
    finished(run_jobs("check", checkpoint, tmp_path / "jobs", view, "job", 8, live, user_state=user_state))
    assert not (cache_root / ".stamps").exists()
    own = stamps / CacheRoot(view).user_checkpoint_stamps("tiny-llama", live).name
    assert {p.name for p in stamps.iterdir()} == {own.name, variant_stamps.name}
    assert json.loads(own.read_text())["location"] == str(live.resolve())
    assert variant_stamps.read_bytes() == b'{"format": 1, "entries": {}}'
