# SPDX-License-Identifier: Apache-2.0
"""The S3 server (a real SeaweedFS, this module's own) SIGKILLed while ``tt-cache pull`` fetches a
large object in ranged reads: back within the retry window, the pull completes warm, resuming the
object from its verified prefix; gone for good, the pull gives up after the bounded retries with one
line and exit 2, nothing warm left, and once the server is back a new pull fetches only what the
first one had not verified. The same for a push (the server killed amid the large object's parts)
and for an HTTP mirror (its server process killed amid a range)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import blake3
import pytest

from models.common.envs import BadValue
from models.common.weight_cache import VariantPaths, verify_weight_cache
from models.common.weight_cache.marker import FileRecord, iter_markers
from models.common.weight_cache.remote.pull import local_status, pull_variant, trusted_manifest
from models.common.weight_cache.remote.push import push_cache_dir
from models.common.weight_cache.remote.retry import backoff_delays, retrying
from models.common.weight_cache.remote.store_layout import (
    latest_key,
    manifest_json,
    manifest_of,
    manifests_prefix,
    new_manifest_name,
    object_key,
)
from models.common.weight_cache.remote.stores import DirectoryStore, RemoteStoreError
from models.common.weight_cache.remote.transfer import PART_SUFFIX, fetch_object, verified_parts
from models.common.weight_cache.remote.urls import open_store
from models.testing.object_store import free_ports, kill_seaweed, restart_seaweed, running_seaweed
from models.testing.tt_cache import REPO_ROOT, cli_env, error_line

FIRST_BYTES = 16 << 20  # the server is killed once the part file holds this much
LARGE = 8 * FIRST_BYTES + 12345  # ... with most of the object still to come


@dataclasses.dataclass
class Server:
    """This module's server, which its tests kill and start again (``current`` the live one)."""

    current: object

    def env(self, **extra: str) -> dict[str, str]:
        return self.current.client_env(cli_env(), **extra)


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    with running_seaweed(tmp_path_factory.mktemp("stopping-seaweed")) as first:
        held = Server(first)
        yield held
        if held.current is not first:
            kill_seaweed(held.current)  # a test server: its data goes with the context's data dir


@dataclasses.dataclass(frozen=True)
class LargeVariant:
    url: str
    key: str
    digest: str  # the large object's
    location: str
    total_bytes: int


@pytest.fixture(scope="module")
def large_variant(built_variant, server, tmp_path_factory) -> LargeVariant:
    """The built variant with one large file more in the module's server."""
    with _talking_to(server):
        return _store_large(open_store(f"s3://{server.current.bucket}/large"), built_variant,
                            tmp_path_factory.mktemp("large"))


def _store_large(store, built_variant, scratch: Path) -> LargeVariant:
    """The built variant with one large file more, its objects, manifest and ``latest`` written into
    ``store`` through the layout module."""
    push_cache_dir(built_variant.cache_dir, store)
    source = scratch / "large.tensorbin"
    source.write_bytes(random.Random(7).randbytes(LARGE))
    digest = blake3.blake3(source.read_bytes()).hexdigest()
    store.upload(object_key(digest), verified_parts(source, digest, LARGE), LARGE)
    source.unlink()
    marker = built_variant.marker
    larger = dataclasses.replace(marker, files=(*marker.files, FileRecord(f"{marker.generation}/large.tensorbin",
                                                                         LARGE, digest)))
    location = built_variant.cache_dir.relative_to(built_variant.cache_root).as_posix()
    manifest = manifest_of(larger, location)
    name = new_manifest_name(time.time_ns() + 10**9)
    store.write_small(manifests_prefix(manifest.variant_key) + name, manifest_json(manifest), exclusive=True)
    store.write_small(latest_key(manifest.variant_key), name.encode(), exclusive=False)
    assert trusted_manifest(store, manifest.variant_key)[1].total_bytes == manifest.total_bytes
    return LargeVariant(store.url, manifest.variant_key, digest, location, manifest.total_bytes)


@contextlib.contextmanager
def _talking_to(server: Server) -> Iterator[None]:
    """This process's AWS variables those of ``server`` for the block."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in server.current.client_env({}).items():
            patch.setenv(name, value)
        yield


def _serving(server: Server, variant: LargeVariant) -> None:
    """Wait until a server started again serves the variant whole (its bucket answers before its
    volumes are back)."""
    deadline = time.monotonic() + 60
    with _talking_to(server):
        while True:
            try:
                trusted_manifest(open_store(variant.url), variant.key)
                return
            except RemoteStoreError:
                assert time.monotonic() < deadline, "the server did not serve the variant again"
                time.sleep(0.25)


def _pull_then_kill_the_server(server: Server, variant: LargeVariant, root: Path, **env: str):
    """``tt-cache pull`` of the variant into ``root``, and the server SIGKILLed as soon as the large
    object's part file holds its first bytes with more to come. (the running pull, the part's size then)"""
    _serving(server, variant)
    return _pull_then_kill(variant, root, server.env(TT_CACHE_PATH=str(root), **env),
                           lambda: kill_seaweed(server.current))


def _pull_then_kill(variant: LargeVariant, root: Path, env: dict[str, str], kill: Callable[[], None]):
    part = root / variant.location / ".pulled-objects" / f"{variant.digest}{PART_SUFFIX}"
    pull = subprocess.Popen([sys.executable, "-m", "models.tt_cache.cli", "pull", "--from", variant.url, variant.key,
                             "--threads", "1", "--progress-every", "0", "--json"],
                            env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while (size := part.stat().st_size if part.exists() else 0) < FIRST_BYTES:
        assert pull.poll() is None and time.monotonic() < deadline, "the pull never fetched the object's start"
        time.sleep(0.002)
    kill()
    assert size < LARGE - FIRST_BYTES, size  # the kill landed amid the object
    return pull, size


def _nothing_warm(cache_dir: Path) -> None:
    assert not list(cache_dir.glob(".weights_complete.*")) and not [p for p in cache_dir.glob("g*") if p.is_dir()]


def test_a_server_back_within_the_retry_window_lets_the_pull_complete(server, large_variant, tmp_path):
    root = tmp_path / "root"
    pull, prefix = _pull_then_kill_the_server(server, large_variant, root)
    time.sleep(1.0)
    server.current = restart_seaweed(server.current)
    out, err = pull.communicate(timeout=120)
    assert pull.returncode == 0, err[-3000:]
    (document,) = json.loads(out)["variants"]
    assert document["warm"] and document["bytes"] == large_variant.total_bytes
    assert document["bytes_fetched"] < large_variant.total_bytes  # the last try resumed from the verified prefix
    cache_dir = root / large_variant.location
    ((_, marker, _),) = iter_markers(cache_dir)
    assert local_status(VariantPaths(cache_dir, marker.build_variant), marker).warm and verify_weight_cache(VariantPaths(cache_dir, marker.build_variant)) == []
    assert not (cache_dir / ".pulled-objects").exists()


def test_a_server_gone_for_good_fails_the_pull_in_one_line_and_a_later_pull_resumes(server, large_variant, tmp_path):
    root = tmp_path / "root"
    started = time.monotonic()
    pull, prefix = _pull_then_kill_the_server(server, large_variant, root, TT_CACHE_REMOTE_RETRY_S="3")
    out, err = pull.communicate(timeout=120)
    waited = time.monotonic() - started
    try:
        result = subprocess.CompletedProcess(pull.args, pull.returncode, out, err)
        line = error_line(result, "pull")
        assert pull.returncode == 2 and "gave up on objects/blake3/" in line and "TT_CACHE_REMOTE_RETRY_S" in line, line
        assert waited < 60, waited  # bounded: 3 s of backoff, a few tries
        cache_dir = root / large_variant.location
        _nothing_warm(cache_dir)
        staged = cache_dir / ".pulled-objects"
        kept = sum(path.stat().st_size for path in staged.iterdir())
        assert kept >= prefix  # the verified prefix (and whole objects) stay for the next pull
    finally:
        server.current = restart_seaweed(server.current)
    with _talking_to(server):
        store = open_store(large_variant.url)
        key, manifest = trusted_manifest(store, large_variant.key)
        resumed = pull_variant(store, manifest, root, manifest_key=key)
    assert resumed.warm and resumed.bytes_fetched <= large_variant.total_bytes - kept
    assert verify_weight_cache(VariantPaths(cache_dir, manifest.marker.build_variant)) == [] and not staged.exists()


def test_a_push_outlives_a_server_stopped_mid_upload(server, large_variant, tmp_path):
    """The large variant pulled here, then pushed to a new prefix; the server SIGKILLed while the
    large object's parts go up and started again: the push completes, and what it stored is whole."""
    _serving(server, large_variant)
    with _talking_to(server):
        source = open_store(large_variant.url)
        key, manifest = trusted_manifest(source, large_variant.key)
        pulled = pull_variant(source, manifest, tmp_path / "root", manifest_key=key)
    assert pulled.warm
    target = f"s3://{server.current.bucket}/pushed-{tmp_path.name}"
    push = subprocess.Popen([sys.executable, "-m", "models.tt_cache.cli", "push", str(pulled.cache_dir), "--to", target,
                             "--threads", "1", "--progress-every", "0", "--json"], env=server.env(), cwd=REPO_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in push.stderr:  # the transfer's first progress line: the large object goes first
        if " objects, " in line:
            break
    time.sleep(0.5)
    assert push.poll() is None, "the push ended before the server was stopped"
    kill_seaweed(server.current)
    time.sleep(1.0)
    server.current = restart_seaweed(server.current)
    out, err = push.communicate(timeout=120)
    assert push.returncode == 0, err[-3000:]
    (document,) = json.loads(out)["variants"]
    assert document["variant_key"] == large_variant.key and document["objects_sent"] == document["objects"]
    with _talking_to(server):
        store = open_store(target)
        _, stored = trusted_manifest(store, large_variant.key)
        staged = tmp_path / "check"
        assert fetch_object(store, large_variant.digest, LARGE, staged)[1] == LARGE  # its bytes are its name


def _static_server(root: Path, port: int) -> subprocess.Popen:
    """The range-answering static server of ``object_store`` in a process of its own, on ``port``."""
    script = ("import functools, sys; from http.server import ThreadingHTTPServer; "
              "from models.testing.object_store import RangeRequestHandler; "
              "server = ThreadingHTTPServer(('127.0.0.1', int(sys.argv[1])), "
              "functools.partial(RangeRequestHandler, directory=sys.argv[2])); server.ranges = []; "
              "server.serve_forever()")
    process = subprocess.Popen([sys.executable, "-c", script, str(port), str(root)], env=cli_env(), cwd=REPO_ROOT)
    deadline = time.monotonic() + 30
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return process
        assert process.poll() is None and time.monotonic() < deadline, "the static server did not start"
        time.sleep(0.05)


def test_an_http_mirror_back_within_the_retry_window_lets_the_pull_complete(built_variant, tmp_path):
    mirror = tmp_path / "mirror"
    stored = _store_large(DirectoryStore(mirror, create=True), built_variant, tmp_path)
    (port,) = free_ports(1)
    variant = dataclasses.replace(stored, url=f"http://127.0.0.1:{port}")
    root = tmp_path / "root"
    servers = [_static_server(mirror, port)]
    try:
        pull, _ = _pull_then_kill(variant, root, cli_env(root), lambda: (servers[0].kill(), servers[0].wait()))
        time.sleep(1.0)
        servers.append(_static_server(mirror, port))
        out, err = pull.communicate(timeout=120)
    finally:
        for process in servers:
            process.kill()
            process.wait()
    assert pull.returncode == 0, err[-3000:]
    (document,) = json.loads(out)["variants"]
    assert document["warm"] and document["bytes_fetched"] < variant.total_bytes  # resumed from the verified prefix
    cache_dir = root / variant.location
    ((_, marker, _),) = iter_markers(cache_dir)
    assert verify_weight_cache(VariantPaths(cache_dir, marker.build_variant)) == []


def test_the_backoff_doubles_to_its_cap_and_adds_up_to_the_window(monkeypatch):
    assert backoff_delays(30) == [0.5, 1, 2, 4, 8, 8, 6.5] and backoff_delays(0) == []
    assert backoff_delays(3) == [0.5, 1, 1.5]
    monkeypatch.setenv("TT_CACHE_REMOTE_RETRY_S", "soon")
    with pytest.raises(BadValue, match="TT_CACHE_REMOTE_RETRY_S='soon': expected a whole number from 0 to 3600"):
        retrying(lambda: None, "x")
