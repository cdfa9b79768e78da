# SPDX-License-Identifier: Apache-2.0
"""Prefetching warm starts: real page-cache eviction (``POSIX_FADV_DONTNEED`` per file), real
residency (``mincore``), real FIFOs and symlinks, the process's own read counters."""

from __future__ import annotations

import ctypes
import errno
import gc
import mmap
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import ttnn

from models.common.prefetch import DEFAULT_THREADS, HEAD_BYTES, Prefetcher, prefetch_threads, read_head
from models.common.weight_cache.layout import VariantPaths
from models.common.weight_cache.marker import read_marker
from models.common.weight_cache.tensor_cache import tensorbin_name
from models.registry import loader_class
from models.testing.mounts import ext4
from models.testing.tiny_models import make_checkpoint


def evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


def resident(path: Path) -> list[bool]:
    """Which pages of ``path`` are in the page cache (``mincore`` of a fresh mapping: unlike a
    probing read, it never starts a read itself)."""
    size = path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        address = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert address not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        pages = -(-size // mmap.PAGESIZE)
        vector = (ctypes.c_ubyte * pages)()
        try:
            assert _libc.mincore(address, size, vector) == 0, os.strerror(ctypes.get_errno())
        finally:
            _libc.munmap(address, size)
        return [bool(v & 1) for v in vector]
    finally:
        os.close(fd)


def fully_cached(path: Path) -> bool:
    return all(resident(path))


def mostly_uncached(path: Path) -> bool:
    """Less than half of the file cached (mapping a file reads its header, and the kernel's
    readahead after it: up to the device's ``read_ahead_kb``, 8 MiB here)."""
    pages = resident(path)
    return sum(pages) < len(pages) / 2


@pytest.fixture(scope="module")
def seeded(tmp_path_factory) -> tuple[type, Path, Path]:
    root = tmp_path_factory.mktemp("prefetch")
    checkpoint = make_checkpoint("gemma3", root / "gemma3", hidden_size=512, intermediate_size=2048, vocab_size=32768)
    cls = loader_class("gemma3")
    assert cls(checkpoint, cache_root=root / "cache").seed().complete
    return cls, checkpoint, root / "cache"


def cache_files(cls, checkpoint: Path, cache_root: Path) -> list[Path]:
    loader = cls(checkpoint, cache_root=cache_root, prefetch=0)
    marker = read_marker(loader.paths)
    return [loader.cache_dir / record.path for record in marker.all_files()]


def evicted_or_skip(files: list[Path]) -> None:
    for path in files:
        evict(path)
    if not all(mostly_uncached(path) for path in files):
        pytest.skip("this file system keeps pages after POSIX_FADV_DONTNEED (tmpfs?): cannot evict here")


def test_prefetching_warm_load_reads_the_files_ahead_and_returns_bit_identical_tensors(seeded):
    cls, checkpoint, cache_root = seeded
    files = cache_files(cls, checkpoint, cache_root)
    large = [p for p in files if p.stat().st_size >= 16 << 20]  # the LM head and the host sidecar
    assert len(large) == 2
    evicted_or_skip(large)
    plain = cls(checkpoint, cache_root=cache_root, prefetch=0).load()
    assert plain.warm and plain.prefetch is None
    assert all(fully_cached(p) for p in large), "a warm read copies every byte it serves, prefetched or not"
    expected = {name: ttnn.to_torch(tensor) for name, tensor in plain.weights.items()}
    expected_host = dict(plain.host_weights)
    del plain
    gc.collect()

    evicted_or_skip(large)
    loaded = cls(checkpoint, cache_root=cache_root, prefetch=2).load()
    assert loaded.warm and loaded.prefetch is not None
    assert loaded.prefetch.wait(timeout=30) and not loaded.prefetch.errors
    assert all(fully_cached(p) for p in files), "prefetch left parts of files unread"
    marker = read_marker(VariantPaths(loaded.cache_dir, cls(checkpoint, cache_root=cache_root).build_variant))
    assert loaded.prefetch.bytes_read == sum(record.bytes for record in marker.all_files())

    assert list(loaded.weights) == list(expected)
    for name, tensor in loaded.weights.items():
        assert torch.equal(ttnn.to_torch(tensor), expected[name]), name
    assert all(torch.equal(loaded.host_weights[k], expected_host[k]) for k in expected_host)


def test_prefetch_follows_the_loaders_order(seeded):
    cls, checkpoint, cache_root = seeded
    order: list[str] = []

    class Recording(Prefetcher):
        def add(self, paths):
            paths = list(paths)
            order.extend(os.fspath(p) for p in paths)
            super().add(paths)

    import models.common.loader as loader_module

    original = loader_module.Prefetcher
    loader_module.Prefetcher = Recording
    try:
        loaded = cls(checkpoint, cache_root=cache_root, prefetch=1).load()
    finally:
        loader_module.Prefetcher = original
    marker = read_marker(VariantPaths(loaded.cache_dir, cls(checkpoint, cache_root=cache_root).build_variant))
    root = loaded.cache_dir / marker.generation
    expected = [os.fspath(root / tensorbin_name(n, loaded.formats[n])) for n in loaded.weights]
    expected.append(os.fspath(loaded.cache_dir / marker.host_sidecar.path))
    assert order == expected


def test_prefetcher_skips_files_it_cannot_read_and_never_raises(tmp_path):
    real = tmp_path / "real.bin"
    real.write_bytes(os.urandom(3 << 20))
    prefetcher = Prefetcher(threads=2, piece_bytes=1 << 20)
    prefetcher.add([tmp_path / "missing.bin", real])
    assert prefetcher.wait(timeout=10)
    assert prefetcher.bytes_read == 3 << 20
    assert len(prefetcher.errors) == 1 and "missing.bin" in prefetcher.errors[0]
    vanishing = tmp_path / "vanishing.bin"
    vanishing.write_bytes(b"x" * (2 << 20))
    slow = Prefetcher(threads=1, piece_bytes=1 << 20)
    slow._queue.append((os.fspath(vanishing), 0, 1 << 20))  # queued, then deleted before it is read
    vanishing.unlink()
    slow._outstanding += 1
    slow.add([])
    assert slow.wait(timeout=10) and slow.errors and "vanishing.bin" in slow.errors[0]


def test_prefetch_threads_option_and_environment(monkeypatch):
    monkeypatch.delenv("TT_PREFETCH_THREADS", raising=False)
    assert prefetch_threads(None) == DEFAULT_THREADS > 0 and prefetch_threads(0) == 0 and prefetch_threads(2) == 2
    monkeypatch.setenv("TT_PREFETCH_THREADS", "3")
    assert prefetch_threads(None) == 3
    monkeypatch.setenv("TT_PREFETCH_THREADS", "0")
    assert prefetch_threads(None) == 0
    with pytest.raises(ValueError, match="prefetch=-1: expected a whole number from 0"):
        prefetch_threads(-1)


def characters_read() -> int:
    """Bytes this process has read through system calls (``rchar``: ``sendfile`` counts too)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def test_prefetch_reads_nothing_of_files_already_cached_and_all_of_evicted_ones(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(os.urandom(24 << 20))
    path.read_bytes()  # every page cached
    before = characters_read()
    prefetcher = Prefetcher(threads=2, piece_bytes=4 << 20)
    prefetcher.add([path])
    assert prefetcher.wait(timeout=30) and not prefetcher.errors
    assert characters_read() - before < 1 << 20, "a cached file was read again"
    assert prefetcher.bytes_read == 24 << 20

    evict(path)
    if not mostly_uncached(path):
        pytest.skip("this file system keeps pages after POSIX_FADV_DONTNEED (tmpfs?): cannot evict here")
    before = characters_read()
    prefetcher.add([path])
    assert prefetcher.wait(timeout=30) and not prefetcher.errors
    assert fully_cached(path)
    assert characters_read() - before >= 12 << 20  # the pieces the head request did not cover


def test_prefetch_never_follows_a_symlink_nor_blocks_on_a_fifo(tmp_path):
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"o" * (1 << 20))
    (tmp_path / "link.tensorbin").symlink_to(outside)
    os.mkfifo(tmp_path / "fifo.tensorbin")  # opening it for reading would block until a writer came
    real = tmp_path / "real.tensorbin"
    real.write_bytes(b"r" * (2 << 20))
    prefetcher = Prefetcher(threads=2, piece_bytes=1 << 20)
    prefetcher.add([tmp_path / "link.tensorbin", tmp_path / "fifo.tensorbin", real])
    assert prefetcher.wait(timeout=10), "prefetch blocked"
    assert prefetcher.bytes_read == 2 << 20
    assert len(prefetcher.errors) == 2
    assert any("fifo.tensorbin" in e for e in prefetcher.errors) and any("link.tensorbin" in e for e in prefetcher.errors)


def test_a_file_system_that_cannot_splice_gets_the_whole_piece_read_by_plain_reads(tmp_path, monkeypatch):
    """``sendfile`` refused (EINVAL: a file system without splice) falls back to plain reads: no
    error, and every page of the piece cached when it is counted. The piece is larger than a
    readahead window (8 MiB on this machine's disk, 128 KiB on a default device): readahead advice
    would cache only its first window, and only some time later."""

    path = tmp_path / "weights.bin"
    path.write_bytes(os.urandom(32 << 20))
    evicted_or_skip([path])

    def no_splice(*args):
        raise OSError(errno.EINVAL, "splice is not supported here")

    read: list[tuple[int, int]] = []
    real_preadv = os.preadv

    def recorded_preadv(fd, buffers, offset, *flags):
        count = real_preadv(fd, buffers, offset, *flags)
        read.append((offset, offset + count))
        return count

    monkeypatch.setattr(os, "sendfile", no_splice)
    monkeypatch.setattr(os, "preadv", recorded_preadv)
    prefetcher = Prefetcher(threads=1, piece_bytes=32 << 20)
    prefetcher.add([path])
    assert prefetcher.wait(timeout=30) and not prefetcher.errors and prefetcher.bytes_read == 32 << 20
    covered = 0
    for start, end in sorted(read):
        assert start <= covered, f"the fallback skipped bytes {covered}..{start}"
        covered = max(covered, end)
    assert covered == 32 << 20, f"the fallback read {covered} of {32 << 20} bytes"
    # Residency, not all of it: another process's memory pressure may reclaim a few fresh pages
    # before they are counted. Advice instead of reads would leave at most one window (25%) cached.
    pages = resident(path)
    assert sum(pages) > len(pages) * 3 // 4, f"{sum(pages)} of {len(pages)} pages cached after the fallback"


@pytest.fixture
def default_readahead_dir(tmp_path) -> Iterator[Path]:
    """A file system on a device with the kernel's default readahead window (128 KiB) and 64 KiB
    requests: one ``POSIX_FADV_WILLNEED`` reads at most 128 KiB there (8 MiB on this machine's disk)."""
    with ext4(tmp_path / "disk", queue={"read_ahead_kb": 128, "max_sectors_kb": 64}) as mount_point:
        yield mount_point


def test_the_head_pass_reads_the_whole_head_on_a_default_readahead_device(default_readahead_dir):
    path = default_readahead_dir / "weights.tensorbin"
    path.write_bytes(os.urandom(1 << 20))
    evicted_or_skip([path])
    assert read_head(str(path)) == 1 << 20
    head_pages = HEAD_BYTES // mmap.PAGESIZE
    deadline = time.monotonic() + 10  # advice queues the reads; they finish in the background
    while not all(resident(path)[:head_pages]) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert all(resident(path)[:head_pages]), f"the head pass read {sum(resident(path)[:head_pages])} of {head_pages} pages"


def test_a_piece_past_the_end_of_a_shortened_file_ends_at_the_end(tmp_path):
    """A file cut short after it was queued: ``sendfile`` returns 0 at its end and the piece stops."""
    from models.common.prefetch import read_ahead

    path = tmp_path / "weights.bin"
    path.write_bytes(os.urandom(2 << 20))
    evicted_or_skip([path])
    sink = os.open(os.devnull, os.O_WRONLY)
    try:
        read_ahead(os.fspath(path), 0, 8 << 20, sink)  # queued when the file was 8 MiB
    finally:
        os.close(sink)
    assert fully_cached(path)


def test_cancel_drops_the_pieces_not_yet_started_and_wait_returns(tmp_path):
    paths = []
    for index in range(4):
        path = tmp_path / f"weights-{index}.bin"
        path.write_bytes(os.urandom(8 << 20))
        paths.append(path)
    prefetcher = Prefetcher(threads=1, piece_bytes=64 << 10)  # 512 small pieces on one thread
    prefetcher.add(paths)
    dropped = prefetcher.cancel()
    assert dropped > 0 and not prefetcher._queue
    assert prefetcher.wait(timeout=10)
    assert prefetcher.bytes_read <= (32 << 20) - dropped * (64 << 10)
    assert prefetcher.cancel() == 0  # nothing left: a second cancel is harmless
    prefetcher.add(paths[:1])  # and the prefetcher still takes new work
    assert prefetcher.wait(timeout=10) and not prefetcher.errors


def test_a_warm_load_that_fails_cancels_its_prefetch_and_builds_cold(tmp_path, monkeypatch):
    """A cache file changed by someone else between the gate and the load: the warm load fails,
    its prefetch is cancelled (the real ``cancel``, watched), and the loader rebuilds cold."""
    checkpoint = make_checkpoint("llama", tmp_path / "tiny-llama")
    cls = loader_class("llama")
    assert cls(checkpoint, cache_root=tmp_path / "cache").seed().complete
    victim = max(cache_files(cls, checkpoint, tmp_path / "cache"), key=lambda path: path.stat().st_size)
    real_add, real_cancel, cancelled = Prefetcher.add, Prefetcher.cancel, []

    def add_then_change_a_file(self, paths):
        real_add(self, paths)
        data = bytearray(victim.read_bytes())  # the gate has passed: this is the window
        data[-1] ^= 0xFF
        victim.write_bytes(bytes(data))

    def watched_cancel(self):
        cancelled.append(real_cancel(self))
        return cancelled[-1]

    monkeypatch.setattr(Prefetcher, "add", add_then_change_a_file)
    monkeypatch.setattr(Prefetcher, "cancel", watched_cancel)
    rebuilt = cls(checkpoint, cache_root=tmp_path / "cache", prefetch=2).load()
    assert len(cancelled) == 1
    assert not rebuilt.warm and rebuilt.prefetch is None
