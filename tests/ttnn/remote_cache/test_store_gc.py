# SPDX-License-Identifier: Apache-2.0
"""``tt-cache gc STORE`` against a real S3 server (SeaweedFS) and a directory store: whole variants
go, least recently pushed or pulled first; an object goes only when no manifest left names it; a
``--dry-run`` deletes nothing and says the same; a key outside the layout is never touched; a gc
racing a push of the variant it evicts ends with the variant whole or absent."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import blake3
import pytest

from models.common.weight_cache.marker import FileRecord
from models.common.weight_cache.remote.pull import missing_objects, pull_variant, read_manifest, trusted_manifest
from models.common.weight_cache.remote.push import push_cache_dir
from models.common.weight_cache.remote.store_gc import collect_store_garbage, plan_store_gc
from models.common.weight_cache.remote.store_layout import (
    Manifest,
    gc_leases_prefix,
    layout_key,
    location_key,
    manifest_json,
    manifests_prefix,
    new_manifest_name,
    object_key,
    used_key,
    variant_key,
)
from models.common.weight_cache.remote.stores import ObjectMissing, Store
from models.common.weight_cache.remote.urls import open_store
from models.testing.object_store import free_ports


def _gc(capsys, *args: str) -> tuple[int, dict]:
    from models.tt_cache.cli import main

    capsys.readouterr()
    code = main(["gc", *args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def _push(cache_dir: Path, url: str) -> Manifest:
    (result,) = push_cache_dir(cache_dir, open_store(url, create=True), threads=2)
    return trusted_manifest(open_store(url), result.variant_key)[1]


def _publish_sibling(store: Store, manifest: Manifest, *, age_s: float = 0.0) -> tuple[Manifest, str]:
    """Another variant that shares every object of ``manifest`` and has one of its own, published
    as a push would (its object, its manifest ``age_s`` old, ``latest``, its location entry)."""
    extra = b"the sibling's own weights " * 1000
    digest = blake3.blake3(extra).hexdigest()
    store.write_small(object_key(digest), extra, exclusive=True)
    marker = dataclasses.replace(manifest.marker, build_variant={"gc-test": "sibling"},
                                 files=(*manifest.marker.files, FileRecord("sibling.tensorbin", len(extra), digest)))
    sibling = Manifest(variant_key(marker), manifest.location, time.time_ns() - int(age_s * 1e9), marker)
    name = new_manifest_name(sibling.pushed_ns)
    store.write_small(manifests_prefix(sibling.variant_key) + name, manifest_json(sibling), exclusive=True)
    store.write_small(f"variants/{sibling.variant_key}/latest", name.encode(), exclusive=False)
    store.write_small(location_key(sibling.location, sibling.variant_key), b"", exclusive=True)
    return sibling, object_key(digest)


def _keys_of(store: Store, key: str) -> list[str]:
    return [k for k in store.list_sizes("") if key in k]


def _complete(store: Store, key: str) -> bool:
    """Every manifest of the variant names only objects the store holds."""
    for name in store.list_sizes(manifests_prefix(key)):
        if missing_objects(store, read_manifest(store, name, key)):
            return False
    return True


def test_evicting_one_of_two_variants_keeps_the_objects_they_share(built_variant, s3_url, tmp_path, capsys,
                                                                   cli_in_process):
    own = _push(built_variant.cache_dir, s3_url)
    store = open_store(s3_url)
    sibling, sibling_object = _publish_sibling(store, own, age_s=3600)  # pushed before: least recently used
    total = sum(size for key, size in store.list_sizes("").items())

    code, done = _gc(capsys, s3_url, "--max-size", str(total - 1), "--grace", "0s")
    assert code == 0, done
    assert [e["variant_key"] for e in done["evicted"]] == [sibling.variant_key]
    assert done["objects"] == [sibling_object]  # its own object only; the shared ones stay
    assert not _keys_of(store, sibling.variant_key), "a manifest, latest or location entry of it is left"
    assert store.size(sibling_object) is None
    assert not missing_objects(store, own)

    _, manifest = trusted_manifest(store, own.variant_key)
    pulled = pull_variant(store, manifest, tmp_path / "fresh-root")
    assert pulled.warm and pulled.objects_fetched == len(own.digests())


def test_a_dry_run_deletes_nothing_and_says_what_the_gc_then_does(built_variant, s3_url, capsys, cli_in_process):
    own = _push(built_variant.cache_dir, s3_url)
    store = open_store(s3_url)
    _publish_sibling(store, own, age_s=3600)
    before = store.list_sizes("")

    code, planned = _gc(capsys, s3_url, "--max-size", "0", "--grace", "0s", "--dry-run")
    assert code == 0 and planned["dry_run"]
    assert store.list_sizes("") == before
    assert len(planned["evicted"]) == 2 and planned["freed_bytes"] == sum(before.values())

    code, done = _gc(capsys, s3_url, "--max-size", "0", "--grace", "0s")
    assert code == 0
    same = ("evicted", "objects", "object_bytes", "freed_bytes", "foreign", "kept", "kept_bytes")
    assert {k: done[k] for k in same} == {k: planned[k] for k in same}
    assert store.list_sizes("") == {}


def test_older_than_evicts_only_the_variants_unused_that_long(built_variant, s3_url, capsys, cli_in_process):
    own = _push(built_variant.cache_dir, s3_url)
    store = open_store(s3_url)
    sibling, _ = _publish_sibling(store, own, age_s=10 * 86400)

    code, done = _gc(capsys, s3_url, "--older-than", "5d", "--grace", "0s")
    assert code == 0
    assert [e["variant_key"] for e in done["evicted"]] == [sibling.variant_key]
    assert "unused for 10.0 days" in done["evicted"][0]["why"]
    assert trusted_manifest(store, own.variant_key)


def test_a_pull_is_a_use_the_store_remembers(built_variant, s3_url, tmp_path, capsys, cli_in_process):
    own = _push(built_variant.cache_dir, s3_url)
    store = open_store(s3_url)
    sibling, _ = _publish_sibling(store, own)  # pushed after: the other one is least recently used
    assert [e.variant.variant_key for e in plan_store_gc(store, max_size=1, grace=0).evicted][0] == own.variant_key

    assert pull_variant(store, own, tmp_path / "root").warm
    assert store.size(used_key(own.variant_key))
    code, done = _gc(capsys, s3_url, "--max-size", str(sum(store.list_sizes("").values()) - 1), "--grace", "0s")
    assert code == 0 and [e["variant_key"] for e in done["evicted"]] == [sibling.variant_key]


def test_a_key_outside_the_layout_is_left_alone_and_reported(built_variant, s3_url, capsys, cli_in_process):
    own = _push(built_variant.cache_dir, s3_url)
    store = open_store(s3_url)
    foreign = {"README.txt": b"the team's notes", f"objects/blake3/zz/{'0' * 64}": b"not ours",
               f"variants/{own.variant_key}/notes.json": b"{}", "objects/blake3/ab/short": b"x"}
    for key, data in foreign.items():
        store.write_small(key, data, exclusive=True)

    code, done = _gc(capsys, s3_url, "--max-size", "0", "--grace", "0s")
    assert code == 0 and len(done["evicted"]) == 1
    assert sorted(done["foreign"]) == sorted(foreign)
    assert store.list_sizes("") == {key: len(data) for key, data in foreign.items()}


def test_an_object_within_the_grace_period_is_kept(built_variant, s3_url, capsys, cli_in_process):
    own = _push(built_variant.cache_dir, s3_url)
    code, done = _gc(capsys, s3_url, "--max-size", "0")  # the default grace: an hour
    assert code == 0 and len(done["evicted"]) == 1
    assert done["objects"] == [] and len(done["young"]) == len(own.digests())
    assert not missing_objects(open_store(s3_url), own)


def test_a_directory_store(built_variant, tmp_path, capsys, cli_in_process):
    store_dir = tmp_path / "store"
    own = _push(built_variant.cache_dir, str(store_dir))
    (store_dir / "keep-me.txt").write_text("a user's file")
    code, done = _gc(capsys, str(store_dir), "--max-size", "0", "--grace", "0s")
    assert code == 0 and [e["variant_key"] for e in done["evicted"]] == [own.variant_key]
    assert done["foreign"] == ["keep-me.txt"]
    left = sorted(p.relative_to(store_dir).as_posix() for p in store_dir.rglob("*") if p.is_file())
    assert left == ["keep-me.txt"]


def test_bad_input_is_one_line_and_exit_2(seaweed, s3_url, tmp_path, capsys, cli_in_process):
    from models.tt_cache.cli import main

    (dead_port,) = free_ports(1)
    cases = {
        "unknown bucket": (["s3://no-such-bucket/x", "--max-size", "1G"], "no such bucket"),
        "bad size": ([s3_url, "--max-size", "12Q"], "size '12Q'"),
        "bad duration": ([s3_url, "--older-than", "soon"], "duration 'soon'"),
        "no limit": ([s3_url], "needs --max-size"),
        "unreachable": ([s3_url, "--max-size", "1G", "--endpoint-url", f"http://127.0.0.1:{dead_port}"],
                        "cannot reach the store"),
        "http mirror": (["http://127.0.0.1:1/x", "--max-size", "1G"], "cannot be listed"),
        "cache-root option": ([s3_url, "--max-size", "1G", "--keep-plan", "p.yaml"], "go with a cache root"),
    }
    for name, (args, expected) in cases.items():
        capsys.readouterr()
        assert main(["gc", *args]) == 2, name
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("tt-cache gc: ") and expected in err[0], (name, err)
        assert "Traceback" not in err[0]


def _recording(errors: list[BaseException]) -> Callable[[Callable[[], object]], None]:
    """A thread target that runs its step and keeps what it raised in ``errors`` (the test reports it)."""

    def run(step: Callable[[], object]) -> None:
        try:
            step()
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)

    return run


def _race(built_variant, url: str) -> None:
    """One gc evicting the variant while the same variant is pushed again."""
    errors: list[BaseException] = []
    run = _recording(errors)

    def collect() -> None:
        store = open_store(url)
        collect_store_garbage(store, plan_store_gc(store, max_size=0, grace=0), grace=0, threads=2)

    threads = [threading.Thread(target=run, args=(step,)) for step in
               (lambda: push_cache_dir(built_variant.cache_dir, open_store(url), threads=2), collect)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors


def _race_rounds(built_variant, url: str, tmp_path: Path, rounds: int) -> None:
    store = open_store(url)
    outcomes = []
    for round_ in range(rounds):
        own = _push(built_variant.cache_dir, url)
        _race(built_variant, url)
        assert _complete(store, own.variant_key), f"round {round_}: a manifest names an object the store lacks"
        try:
            _, manifest = trusted_manifest(store, own.variant_key)
        except ObjectMissing:
            outcomes.append("absent")
            continue
        outcomes.append("present")
        assert pull_variant(store, manifest, tmp_path / f"root-{round_}").warm
    print(f"gc racing a push, {rounds} rounds: {outcomes}")


def test_a_gc_racing_a_push_of_the_variant_leaves_it_whole_or_absent(built_variant, s3_url, tmp_path):
    _race_rounds(built_variant, s3_url, tmp_path, rounds=3)


@pytest.mark.slow
def test_a_gc_racing_a_push_many_rounds(built_variant, s3_url, tmp_path):
    _race_rounds(built_variant, s3_url, tmp_path, rounds=20)


def test_a_pull_that_cannot_record_its_use_still_pulls(built_variant, tmp_path):
    from models.testing.object_store import serve_directory

    store_dir = tmp_path / "store"
    own = _push(built_variant.cache_dir, str(store_dir))
    with serve_directory(store_dir) as http:  # read-only: the use cannot be written
        store = open_store(f"{http.url}/")
        key, manifest = trusted_manifest(store, own.variant_key)
        assert pull_variant(store, manifest, tmp_path / "root", manifest_key=key).warm
    assert not (store_dir / used_key(own.variant_key)).exists()
    assert layout_key(used_key(own.variant_key)).kind == "used"


class _DeletesWhenReleased:
    """The real store, whose gc holds its first object deletion until ``release`` is set: the
    moment a push publishes between the gc's last look at the manifests and its deletions."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.deleting = threading.Event()  # the gc looked at the manifests for the last time
        self.release = threading.Event()

    def __getattr__(self, name: str):
        return getattr(self._store, name)

    def delete(self, key: str) -> None:
        if key.startswith("objects/"):
            self.deleting.set()
            assert self.release.wait(60), "the push never published"
        self._store.delete(key)


class _WaitsForCollectors:
    """The real store, which says when its pusher, its manifest written, looks for a running gc."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.waiting = threading.Event()

    def __getattr__(self, name: str):
        return getattr(self._store, name)

    def list_keys(self, prefix: str):
        if prefix == gc_leases_prefix():
            self.waiting.set()
        return self._store.list_keys(prefix)


def test_a_manifest_published_while_gc_deletes_its_objects_ends_complete(built_variant, s3_url):
    own = _push(built_variant.cache_dir, s3_url)
    store = open_store(s3_url)
    paused = _DeletesWhenReleased(store)
    plan = plan_store_gc(store, max_size=0, grace=0)
    assert len(plan.objects) == len(own.digests())
    errors: list[BaseException] = []
    run = _recording(errors)

    gc = threading.Thread(target=run, args=(lambda: collect_store_garbage(paused, plan, grace=0, threads=2),))
    gc.start()
    assert paused.deleting.wait(60), f"the gc never deleted: {errors}"  # it withdrew the manifest and looked again
    assert not store.list_sizes(manifests_prefix(own.variant_key))
    pushing = _WaitsForCollectors(store)

    def push() -> None:
        try:
            push_cache_dir(built_variant.cache_dir, pushing, threads=2)
        finally:
            pushing.waiting.set()  # a push that never looked for a gc: the checks below say what it left

    pusher = threading.Thread(target=run, args=(push,))
    pusher.start()
    assert pushing.waiting.wait(60), "the push never published"  # left alone, it would finish now
    assert store.list_sizes(manifests_prefix(own.variant_key)), errors
    paused.release.set()
    gc.join(60)
    pusher.join(60)
    assert not errors, errors
    assert _complete(store, own.variant_key), "a published manifest names an object the gc deleted"
    assert trusted_manifest(store, own.variant_key)


def test_a_killed_gcs_lease_holds_no_push_and_the_next_gc_removes_it(built_variant, s3_url):
    from models.common.weight_cache.remote.store_gc import CLOCK_SKEW_S, LEASE_S, wait_for_collectors
    from models.common.weight_cache.remote.store_layout import gc_lease_key

    store = open_store(s3_url)
    started = time.time() - LEASE_S - CLOCK_SKEW_S - 60
    stale = gc_lease_key(int(started * 1e9))
    store.write_small(stale, json.dumps({"deadline_ns": int((started + LEASE_S) * 1e9)}).encode(), exclusive=True)
    assert wait_for_collectors(store) < 1.0
    _push(built_variant.cache_dir, s3_url)
    plan = plan_store_gc(store, older_than=86400)
    assert plan.stale_leases == [stale] and not plan.evicted
    collect_store_garbage(store, plan)
    assert store.size(stale) is None

    live = gc_lease_key(time.time_ns())
    store.write_small(live, json.dumps({"deadline_ns": int((time.time() + 2) * 1e9)}).encode(), exclusive=True)
    assert plan_store_gc(store, older_than=86400).stale_leases == []
    threading.Timer(1.0, store.delete, args=(live,)).start()
    assert 0.8 < wait_for_collectors(store) < 10


def test_a_gc_killed_anywhere_leaves_no_manifest_naming_a_missing_object(built_variant, seaweed, s3_url):
    """SIGKILL at moments after the gc wrote its lease (withdrawing, listing, deleting): every
    manifest left names only stored objects, and the next gc finishes the work."""
    import os
    import signal
    import subprocess
    import sys

    from models.testing.tt_cache import REPO_ROOT, cli_env

    store = open_store(s3_url)
    env = seaweed.client_env(cli_env(), PYTHONPATH=os.environ.get("PYTHONPATH", str(REPO_ROOT)))
    command = [sys.executable, "-m", "models.tt_cache.cli", "gc", s3_url, "--max-size", "0", "--grace", "0s"]
    states = []
    for delay in (0.0, 0.03, 0.08, 0.15, 0.3):
        own = _push(built_variant.cache_dir, s3_url)
        sibling, _ = _publish_sibling(store, own, age_s=3600)
        gc = subprocess.Popen(command, env=env, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while gc.poll() is None and not store.list_sizes("gc/"):
            time.sleep(0.005)
        time.sleep(delay)
        gc.send_signal(signal.SIGKILL)
        gc.wait()
        states.append((delay, len(store.list_sizes("variants/")), len(store.list_sizes("objects/"))))
        for key in (own.variant_key, sibling.variant_key):
            assert _complete(store, key), f"killed {delay} s into its run: a manifest names an object the store lacks"
        for lease in store.list_sizes("gc/"):  # its deadline passed (a push would wait for it until then)
            store.delete(lease)
    print(f"(kill delay, variant keys, objects) left by each killed gc: {states}")
    done = subprocess.run(command, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert store.list_sizes("") == {}
