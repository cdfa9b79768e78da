# SPDX-License-Identifier: Apache-2.0
"""A copy written with its file and kept for the warm read after it (a pull inside a load): the
file gets every byte, around the page cache or through it; the copy is served only for that very
file, unchanged since, only inside the block that keeps it, and only within its memory budget."""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import blake3
import pytest

from models.common.file_snapshot import (
    MirroredWrite,
    has_kept_copy,
    keeping_snapshots,
    open_once,
    reserve_kept,
    sealed_snapshot,
)

MiB = 1 << 20


def _data(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def _write_kept(path: Path, data: bytes, *, prefix: int = 0, piece: int = 70_001) -> str:
    """``data`` into ``path`` through a :class:`MirroredWrite` (the file holding ``prefix`` bytes
    of it already, as a killed pull leaves it), kept; the BLAKE3 of what went through."""
    path.write_bytes(data[:prefix])
    hasher = blake3.blake3()
    fd = os.open(path, os.O_RDWR)
    try:
        assert reserve_kept(len(data))
        with MirroredWrite(fd, len(data), str(path)) as mirror:
            mirror.take_prefix(prefix, hasher.update)
            for start in range(prefix, len(data), piece):
                chunk = data[start: start + piece]
                hasher.update(chunk)
                mirror.write(chunk)
            mirror.finish()
            os.fsync(fd)
            mirror.keep()
    finally:
        os.close(fd)
    return hasher.hexdigest()


def _served(path: Path) -> tuple[bytes, int]:
    """What a warm read gets for ``path``: (the bytes, the inode of the memory holding them)."""
    with open_once(path) as opened, sealed_snapshot(opened) as snapshot:
        return Path(snapshot.path).read_bytes(), os.fstat(snapshot.fd).st_ino


@contextlib.contextmanager
def _directory(kind: str, tmp_path: Path, monkeypatch):
    """A directory on this machine's disk (ext4), in tmpfs, or on the disk written as where
    ``O_DIRECT`` does not exist (through the page cache)."""
    if kind == "tmpfs":
        with tempfile.TemporaryDirectory(dir="/dev/shm") as directory:
            yield Path(directory)
        return
    if kind == "no O_DIRECT":
        monkeypatch.delattr(os, "O_DIRECT")
    yield tmp_path


@pytest.mark.parametrize("kind", ["disk", "tmpfs", "no O_DIRECT"])
@pytest.mark.parametrize("size, prefix", [(3 * MiB + 1234, 0), (3 * MiB + 1234, 5000), (2 * MiB, MiB), (17, 0), (0, 0)])
def test_the_file_gets_every_byte_and_the_kept_copy_is_served_for_it(tmp_path, monkeypatch, kind, size, prefix):
    data = _data(size, seed=size + prefix)
    with _directory(kind, tmp_path, monkeypatch) as directory, keeping_snapshots():
        path = directory / "object"
        assert _write_kept(path, data, prefix=prefix) == blake3.blake3(data).hexdigest()
        assert path.read_bytes() == data
        assert has_kept_copy(path)
        (first, memory), (second, again) = _served(path), _served(path)
        assert first == second == data and memory == again  # the one kept copy, not a copy made per read


def test_a_file_written_after_its_copy_was_kept_gets_a_copy_of_its_new_bytes(tmp_path):
    data = _data(2 * MiB + 3, seed=1)
    path = tmp_path / "object"
    with keeping_snapshots():
        _write_kept(path, data)
        kept = _served(path)
        fd = os.open(path, os.O_WRONLY)
        os.pwrite(fd, b"\xff" * 4096, MiB)  # the mtime moves
        os.close(fd)
        assert not has_kept_copy(path)
        changed, memory = _served(path)
        assert changed == data[:MiB] + b"\xff" * 4096 + data[MiB + 4096:] and memory != kept[1]


def test_a_copy_is_kept_for_its_inode_only(tmp_path):
    """Another file at the same path (a copy renamed over it, the same bytes and size) gets a copy of its own."""
    data = _data(MiB + 7, seed=2)
    path = tmp_path / "object"
    with keeping_snapshots():
        _write_kept(path, data)
        kept = _served(path)
        other = tmp_path / "other"
        other.write_bytes(data)
        os.utime(other, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns))
        os.replace(other, path)
        assert not has_kept_copy(path)
        served, memory = _served(path)
        assert served == data and memory != kept[1]


def test_nothing_is_kept_outside_the_block_nor_beyond_its_budget_and_the_block_drops_its_copies(tmp_path):
    assert not reserve_kept(1)
    data = _data(MiB, seed=3)
    path = tmp_path / "object"
    with keeping_snapshots():
        assert not reserve_kept(1 << 60)  # beyond half of the memory available
        _write_kept(path, data)
        with keeping_snapshots():  # nested: the outer block's copies stay
            pass
        assert has_kept_copy(path)
        kept = _served(path)
    assert not has_kept_copy(path)
    served, memory = _served(path)
    assert served == data and memory != kept[1]


def test_a_mirror_that_is_not_kept_leaves_no_copy(tmp_path):
    """A write abandoned halfway (a digest mismatch, a broken transfer): nothing kept, no memory held."""
    path = tmp_path / "object"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    before = len(os.listdir("/proc/self/fd"))
    with keeping_snapshots():
        assert reserve_kept(MiB)
        with MirroredWrite(fd, MiB, str(path)) as mirror:
            mirror.write(b"x" * 1000)
        assert not has_kept_copy(path)
    os.close(fd)
    assert len(os.listdir("/proc/self/fd")) == before - 1
    with pytest.raises(OSError), MirroredWrite(os.open(path, os.O_RDWR), 10, str(path)) as mirror:
        try:
            mirror.write(b"short")
            mirror.keep()  # 5 of 10 bytes: refused
        finally:
            os.close(mirror.fd)


# In a memory cgroup of its own: how much a load there may keep (half of what it may still fill)
BUDGET_CHILD = """
import os, sys
from models.common.file_snapshot import keeping_snapshots, reserve_kept
with open(sys.argv[1], "w") as procs:
    procs.write(str(os.getpid()))
with keeping_snapshots():
    print(reserve_kept(int(sys.argv[2])), reserve_kept(int(sys.argv[3])), flush=True)
"""


def _memory_cgroup(limit: int) -> Path | None:
    """A new memory cgroup (v1 here, v2 where the memory controller is there) under this process's,
    limited to ``limit`` bytes; None where one cannot be made (not root, no memory controller)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "" and Path("/sys/fs/cgroup/cgroup.controllers").exists():
            base, limit_name = Path("/sys/fs/cgroup"), "memory.max"
        elif "memory" in controllers.split(","):
            base, limit_name = Path("/sys/fs/cgroup/memory"), "memory.limit_in_bytes"
        else:
            continue
        group = base / path.lstrip("/") / f"kept-copies-test-{os.getpid()}"
        try:
            group.mkdir()
            (group / limit_name).write_text(str(limit))
            return group
        except OSError:
            with contextlib.suppress(OSError):
                group.rmdir()
    return None


def test_a_load_in_a_container_keeps_no_more_than_its_memory_limit_allows(tmp_path):
    """/proc/meminfo shows the host's memory; a pod's limit is its cgroup's. A copy kept beyond it
    would have the pod killed, so the budget is half of what the cgroup still allows."""
    group = _memory_cgroup(512 * MiB)
    if group is None:
        pytest.skip("no memory cgroup can be made here (needs root and the memory controller)")
    try:
        procs = group / "cgroup.procs"
        out = subprocess.run([sys.executable, "-c", BUDGET_CHILD, str(procs), str(400 * MiB), str(64 * MiB)],
                             capture_output=True, text=True, timeout=120, check=False)
    finally:
        for _ in range(50):  # the child's exit leaves the group empty a moment later
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "True"], out.stdout  # 400 MiB > half of 512 MiB; 64 MiB fits
