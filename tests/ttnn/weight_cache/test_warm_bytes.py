# SPDX-License-Identifier: Apache-2.0
"""A warm tensor's bytes are the verified file's, whatever happens to the file afterwards: a
tensorbin truncated or rewritten in place after a warm load, or while the load copies it, never
kills the process (SIGBUS) and is never served; at worst the load says so and builds cold."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from models.common import weight_cache as wc
from models.common.file_snapshot import FileChanged, open_once, read_snapshot, sealed_snapshot
from models.common.weight_cache.marker import read_marker
from models.gemma import Gemma3Loader
from models.gemma.loader import HOST_EMBEDDING
from models.llama import LlamaLoader
from models.testing.file_access import FileAccesses
from models.testing.tiny_models import make_checkpoint, weight_digests

# A warm load in a fresh process (``CHILD family checkpoint prefetch_threads``): says how it loaded,
# waits for a line on stdin (the parent changes a cache file meanwhile), then reads every tensor back.
CHILD = """
import json, sys
from models.registry import loader_class
from models.testing.tiny_models import weight_digests
loaded = loader_class(sys.argv[1])(sys.argv[2], precision="bfloat16", prefetch=int(sys.argv[3])).load()
print("loaded", "warm" if loaded.warm else "cold", flush=True)
sys.stdin.readline()
print(json.dumps(weight_digests(loaded), sort_keys=True), flush=True)
"""


def change_in_place(fd: int, how: str) -> None:
    """Truncate the open file to half, or rewrite 4 KiB in its middle (same size)."""
    size = os.fstat(fd).st_size
    if how == "truncate":
        os.ftruncate(fd, size // 2)
        return
    middle = size // 2
    original = os.pread(fd, 4096, middle)
    os.pwrite(fd, bytes(byte ^ 0x5A for byte in original), middle)


@pytest.fixture
def warm_llama(tmp_path, cache_root) -> tuple[Path, dict[str, list[str]], Path]:
    """A warm tiny Llama cache: (checkpoint, the digests of its verified tensors, the file of
    ``layers.0``'s QKV weight)."""
    checkpoint = make_checkpoint("llama", tmp_path / "tiny-llama")
    LlamaLoader(checkpoint, precision="bfloat16").load()
    loader = LlamaLoader(checkpoint, precision="bfloat16")
    reference = loader.load()
    assert reference.warm
    marker = read_marker(loader.paths)
    victim = loader.cache_dir / next(r.path for r in marker.files if "layers.0/attention.wqkv" in r.path)
    return checkpoint, weight_digests(reference), victim


def start_child(checkpoint: Path, prefetch: int, family: str = "llama") -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CHILD, family, str(checkpoint), str(prefetch)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish_child(child: subprocess.Popen, read: str = "") -> tuple[str, dict[str, list[str]] | None, str]:
    """(how it loaded, its tensors' digests, stderr) once it read every tensor back (``read``:
    what the caller already read of its output)."""
    out, err = child.communicate("go\n", timeout=300)
    assert child.returncode == 0, f"the child ended with {child.returncode} (SIGBUS is -7):\n{err[-3000:]}"
    lines = (read + out).splitlines()
    state = next(line.split()[1] for line in lines if line.startswith("loaded "))
    digests = next((json.loads(line) for line in lines if line.startswith("{")), None)
    return state, digests, err


@pytest.mark.parametrize("how", ["truncate", "rewrite"])
def test_a_tensorbin_changed_in_place_after_a_warm_load_is_never_served(warm_llama, how):
    """After ``load()`` returned warm (prefetcher on), a tensorbin is truncated or rewritten in
    place; every tensor then read back is the verified bytes, and the process lives."""
    checkpoint, reference, victim = warm_llama
    fd = os.open(victim, os.O_RDWR)
    try:
        child = start_child(checkpoint, prefetch=4)
        first = child.stdout.readline()
        assert first.split() == ["loaded", "warm"]
        change_in_place(fd, how)
    finally:
        os.close(fd)
    state, digests, _ = finish_child(child, first)
    assert state == "warm" and digests == reference


@pytest.mark.parametrize("how", ["truncate", "rewrite"])
def test_a_host_sidecar_changed_in_place_after_a_warm_load_is_never_served(tmp_path, cache_root, how):
    """The host weights (a safetensors file mapped by the warm read) likewise: Gemma 3's token
    embedding stays the verified bytes after its sidecar is truncated or rewritten in place."""
    checkpoint = make_checkpoint("gemma3", tmp_path / "tiny-gemma3")
    Gemma3Loader(checkpoint, precision="bfloat16").load()
    loader = Gemma3Loader(checkpoint, precision="bfloat16")
    reference = loader.load()
    assert reference.warm and HOST_EMBEDDING in reference.host_weights
    sidecar = loader.cache_dir / read_marker(loader.paths).host_sidecar.path
    expected = weight_digests(reference)
    fd = os.open(sidecar, os.O_RDWR)
    try:
        child = start_child(checkpoint, prefetch=4, family="gemma3")
        first = child.stdout.readline()
        assert first.split() == ["loaded", "warm"]
        change_in_place(fd, how)
    finally:
        os.close(fd)
    state, digests, _ = finish_child(child, first)
    assert state == "warm" and digests == expected


@pytest.mark.parametrize("how", ["truncate", "rewrite"])
def test_a_tensorbin_changed_in_place_while_a_warm_load_reads_it_is_never_served(warm_llama, how):
    """The change lands while the warm read holds the file open, before its bytes are taken (at
    the first read of the file after the warm read's open, or at a second open of it): the load
    refuses the file and builds cold, or serves the bytes that were verified; never the new ones."""
    checkpoint, reference, victim = warm_llama
    fd = os.open(victim, os.O_RDWR)  # opened before the watch: the watcher's own changes raise no event
    opens: list[int] = []

    def change(kind: str, pid: int) -> None:
        if kind == "open":
            opens.append(pid)
        if opens and (kind == "read" or len(opens) == 2) and not changed:
            change_in_place(fd, how)
            changed.append(kind)

    changed: list[str] = []
    try:
        with FileAccesses(victim, change):
            child = start_child(checkpoint, prefetch=0)  # no read-ahead: the warm read's own accesses only
            state, digests, err = finish_child(child)
    finally:
        os.close(fd)
    assert changed, "the warm read never took the file's bytes after opening it"
    assert digests == reference
    assert state == "cold" and "changed after the gate verified it" in err


def test_a_cache_only_warm_read_of_a_file_truncated_while_it_is_read_names_it(warm_llama, tmp_path):
    """Without checkpoint weights to fall back on, the load ends with one clear Python error."""
    checkpoint, _, victim = warm_llama
    for weights in checkpoint.glob("*.safetensors"):
        weights.unlink()
    fd = os.open(victim, os.O_RDWR)
    changed: list[str] = []

    def change(kind: str, pid: int) -> None:
        if kind == "read" and not changed:
            change_in_place(fd, "truncate")
            changed.append(kind)

    try:
        with FileAccesses(victim, change):
            child = start_child(checkpoint, prefetch=0)
            _, err = child.communicate("go\n", timeout=300)
    finally:
        os.close(fd)
    assert changed and child.returncode == 1, (child.returncode, err[-2000:])
    assert f"WeightCacheError: cached file of layers.0.attention.wqkv {victim} changed after the gate" in err


# -- the snapshot itself -----------------------------------------------------------------------


def test_a_sealed_snapshot_cannot_be_changed_and_outlives_its_file(tmp_path):
    path = tmp_path / "file.bin"
    path.write_bytes(bytes(range(256)) * 64)
    with open_once(path) as opened, sealed_snapshot(opened) as snapshot:
        with pytest.raises(PermissionError):
            os.ftruncate(snapshot.fd, 10)
        writable = os.open(snapshot.path, os.O_RDWR)
        try:
            with pytest.raises(PermissionError):
                os.pwrite(writable, b"x", 0)
        finally:
            os.close(writable)
        os.truncate(path, 0)
        assert os.pread(snapshot.fd, 1 << 20, 0) == bytes(range(256)) * 64


def test_a_snapshot_of_a_file_that_changed_since_its_open_is_refused(tmp_path):
    path = tmp_path / "file.bin"
    path.write_bytes(b"a" * 8192)
    with open_once(path) as opened:
        with path.open("r+b") as stream:
            stream.write(b"b")  # same size, new mtime and ctime
        with pytest.raises(FileChanged, match="changed while it was being read"):
            sealed_snapshot(opened)
        with pytest.raises(FileChanged):
            read_snapshot(opened, memoryview(bytearray(8192)))
    with open_once(path) as opened:
        os.truncate(path, 100)
        with pytest.raises(FileChanged, match="truncated while it was being read"):
            sealed_snapshot(opened)


def test_a_fifo_is_refused_at_the_open(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(FileChanged, match="not a regular file"), open_once(tmp_path / "fifo"):
        pass


def test_a_digest_checked_read_hashes_the_copy(tmp_path):
    """The seed API's path (no stamp, a digest): the bytes hashed are the copy's, served as is."""
    path = tmp_path / "file.bin"
    path.write_bytes(b"z" * 5000)
    from models.common.fileio import content_digest_file
    from models.common.weight_cache.verified_open import open_verified

    digest = content_digest_file(path)
    with open_verified(path, None, what="test file", digest=digest) as opened:
        assert os.pread(opened.fd, 10000, 0) == b"z" * 5000
    with pytest.raises(wc.WeightCacheError, match="differs from the digest"), \
            open_verified(path, None, what="test file", digest="0" * 64):
        pass


def test_a_copy_that_cannot_be_made_is_one_clear_error(warm_llama):
    """No room for the copy (here ``ulimit -f``: the memfd cannot grow past 4 KiB) in a cache-only
    deploy: the load ends with one Python error naming the file, not a signal or a partial copy."""
    checkpoint, _, _ = warm_llama
    for weights in checkpoint.glob("*.safetensors"):
        weights.unlink()

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of the signal

    child = subprocess.Popen([sys.executable, "-c", CHILD, "llama", str(checkpoint), "0"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=small_files)
    _, err = child.communicate("go\n", timeout=300)
    assert child.returncode == 1, (child.returncode, err[-2000:])
    assert "WeightCacheError: cached file of" in err and "cannot be read after the gate (File too large)" in err
