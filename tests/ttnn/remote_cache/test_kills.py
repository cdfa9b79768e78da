# SPDX-License-Identifier: Apache-2.0
"""SIGKILL of ``tt-cache push`` and ``tt-cache pull`` (and of a load's pull, which keeps copies of
what it receives) at random points of their transfer leaves no false-warm: the store never holds a
manifest naming an object it lacks, nor an object that is not its name's bytes; a local cache dir
never holds a marker its files do not match; and the command run again completes (a pull without
fetching again what it had verified)."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import blake3
import pytest

from models.common.weight_cache import VariantPaths, verify_weight_cache
from models.common.weight_cache.marker import iter_markers
from models.common.weight_cache.remote.pull import local_status, missing_objects, pull_variant, read_manifest, trusted_manifest
from models.common.weight_cache.remote.push import push_cache_dir
from models.common.weight_cache.remote.store_layout import is_manifest_name
from models.common.weight_cache.remote.transfer import PART_SUFFIX
from models.common.weight_cache.remote.urls import open_store
from models.testing.tt_cache import REPO_ROOT, cli_env

SHORT_KILLS, LONG_KILLS = 2, 20


# A load's pull (``store_url variant_key cache_root``): its objects also written into the memory it
# keeps for the warm read after it (a first line like the CLI's progress, then the pull)
KEEPING_PULL = """
import sys
from models.common.file_snapshot import keeping_snapshots
from models.common.weight_cache.remote.pull import pull_variant, trusted_manifest
from models.common.weight_cache.remote.urls import open_store
store = open_store(sys.argv[1])
key, manifest = trusted_manifest(store, sys.argv[2])
print("pulling its objects, kept", file=sys.stderr, flush=True)
with keeping_snapshots():
    pull_variant(store, manifest, sys.argv[3], manifest_key=key, threads=1)
"""


def _kill_during_transfer(argv: list[str], env: dict[str, str], delay: float) -> int:
    """Run ``tt-cache argv`` (or ``KEEPING_PULL`` with ``argv[1:]`` when ``argv[0]`` is "keeping")
    and SIGKILL it ``delay`` s after its first progress line; its exit status."""
    command = ([sys.executable, "-c", KEEPING_PULL, *argv[1:]] if argv[0] == "keeping" else
               [sys.executable, "-m", "models.tt_cache.cli", *argv, "--threads", "1", "--progress-every", "0"])
    process = subprocess.Popen(command, env=env, cwd=REPO_ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, start_new_session=True)
    try:
        for line in process.stderr:  # the first line is the transfer's first progress report
            if b" objects, " in line:
                break
        time.sleep(delay)
        os.killpg(process.pid, signal.SIGKILL)
    finally:
        process.wait(60)
        process.stderr.close()
    return process.returncode


def _store_holds_no_lie(store) -> None:
    """Every object is its name's bytes; every manifest names only objects the store holds."""
    objects = store.list_sizes("objects/")
    for key in objects:
        assert blake3.blake3(b"".join(store.read(key))).hexdigest() == key.rpartition("/")[2], key
    for key in store.list_sizes("variants/"):
        if is_manifest_name(key.rpartition("/")[2]):
            assert missing_objects(store, read_manifest(store, key), objects) == [], key


def _cache_dir_holds_no_lie(cache_dir: Path) -> bool:
    """Whether a warm variant is there (then every file is the marker's); never a false-warm."""
    warm = False
    for _, marker, _ in iter_markers(cache_dir):
        assert marker is not None
        if local_status(VariantPaths(cache_dir, marker.build_variant), marker).warm:
            assert verify_weight_cache(VariantPaths(cache_dir, marker.build_variant)) == []
            warm = True
    return warm


def _seconds(action) -> float:
    """How long an uninterrupted transfer takes here: the kills land within it."""
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def _push_kills(kills: int, built_variant, seaweed, s3_url) -> list[int]:
    """Each kill into an empty prefix (into one that holds every object already, a push only
    writes its manifest); then the last prefix is pushed to the end. Returns the objects each
    killed push left."""
    rng = random.Random(kills)
    env = seaweed.client_env(cli_env())
    span = _seconds(lambda: push_cache_dir(built_variant.cache_dir, open_store(f"{s3_url}/timing"), threads=1))
    left = []
    for kill in range(kills):
        store = open_store(f"{s3_url}/kill{kill}")
        _kill_during_transfer(["push", str(built_variant.cache_dir), "--to", store.url], env, rng.uniform(0, span))
        _store_holds_no_lie(store)
        left.append(len(store.list_sizes("objects/")))
    stored = len(store.list_sizes("objects/"))
    (pushed,) = push_cache_dir(built_variant.cache_dir, store)
    assert pushed.objects_sent == pushed.objects - stored  # what the killed push stored is not sent again
    _store_holds_no_lie(store)
    return left


def _pull_kills(kills: int, built_variant, seaweed, s3_url, root: Path) -> int:
    """Kill after kill into one cache root, each pull resuming the last one's state (a pull that
    ended before its kill must be truly warm; it is then removed and the kills go on). Returns how
    many kills left verified objects staged."""
    rng = random.Random(kills + 1000)
    store = open_store(s3_url)
    (pushed,) = push_cache_dir(built_variant.cache_dir, store)
    key, manifest = trusted_manifest(store, pushed.variant_key)
    span = _seconds(lambda: pull_variant(store, manifest, root.with_name("timing"), threads=1))
    cache_dir = root / manifest.location
    env = seaweed.client_env(cli_env(root))
    staged, mid_transfer = cache_dir / ".pulled-objects", 0
    for number in range(kills):  # the CLI's pull and a load's, which keeps its copies, in turn
        argv = (["pull", "--from", s3_url, pushed.variant_key] if number % 2 == 0 else
                ["keeping", s3_url, pushed.variant_key, str(root)])
        code = _kill_during_transfer(argv, env, rng.uniform(0, span))
        mid_transfer += staged.exists() and any(staged.iterdir())
        if _cache_dir_holds_no_lie(cache_dir):
            assert code in (0, -signal.SIGKILL)
            shutil.rmtree(root)  # the test's own root: pull again from nothing
    kept = sum(p.stat().st_size for p in staged.iterdir()) if staged.exists() else 0
    result = pull_variant(store, manifest, root, manifest_key=key)
    assert result.warm and result.bytes_fetched <= result.bytes_total - kept  # verified objects are not fetched again
    assert _cache_dir_holds_no_lie(cache_dir)
    assert not staged.exists() or not [p for p in staged.iterdir() if not p.name.endswith(PART_SUFFIX)]
    return mid_transfer


def test_killed_pushes_never_publish_a_manifest_naming_a_missing_object(built_variant, seaweed, s3_url):
    _push_kills(SHORT_KILLS, built_variant, seaweed, s3_url)


def test_killed_pulls_never_leave_a_false_warm_and_resume(built_variant, seaweed, s3_url, tmp_path):
    _pull_kills(SHORT_KILLS, built_variant, seaweed, s3_url, tmp_path / "root")


@pytest.mark.slow
def test_twenty_killed_pushes_and_pulls(built_variant, seaweed, s3_url, tmp_path):
    left = _push_kills(LONG_KILLS, built_variant, seaweed, s3_url)
    total = len({record.digest for record in built_variant.marker.all_files()})
    assert any(0 < count < total for count in left), left  # some kills landed amid the objects
    assert _pull_kills(LONG_KILLS, built_variant, seaweed, f"{s3_url}-pull", tmp_path / "root") > 0
