# SPDX-License-Identifier: Apache-2.0
"""Which files were verified in which state: one stamp, one racy-clock rule, one bounded index.

Hashing a multi-GB model on every start is what the caches exist to avoid, so a file verified
once is recognised afterwards by its :class:`FileStamp` (inode, size, mtime, ctime): any write,
replace, copy or restore changes at least one of them. Two rules make that sound:

* **Racy clocks** (git's "racy clean"). A file system records times at its own granularity
  (a kernel tick on ext4/xfs/btrfs/tmpfs; 1-2 s on FAT, NFS and unknown ones). A same-size
  rewrite within the tick of the last change leaves the stamp as it was, so a stamp counts only
  if the file's last change is at least one tick older than the moment its hashing began
  (:meth:`FileStamp.settled`). An unsettled stamp means "hash again next time".
* **No device number.** ``st_dev`` differs between hosts and mounts of one export (and between two
  loop devices of one image), so it is not part of the stamp: a digest the seeder recorded stays
  valid for every client. Entries are keyed by the file's path relative to what it belongs to
  (a checkpoint dir, a variant dir), with a few stamps per path, so clients that see different
  inodes never overwrite each other.

A :class:`StampIndex` is one small JSON file (written atomically, best effort: a lost write only
means hashing again), with a per-user fallback where the shared location is read-only. It is
pruned to the files its owner still has, so it never grows past them.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

from models.common.fileio import CONTENT_DIGEST_ALGORITHM, atomic_write_bytes, digest_fd, open_regular
from models.common.weight_cache.side_files import read_json_record

FINE_TICK_NS = 20_000_000  # local file systems that stamp with the kernel's clock (a jiffy is <= 10 ms)
COARSE_TICK_NS = 2_000_000_000  # FAT's 2 s; NFS and unknown file systems (server clocks, coarse stamps)
MAX_SETTLE_WAIT_NS = 50_000_000  # a build waits at most this long for its newest files to settle
STAMPS_PER_PATH = 4
INDEX_FORMAT = 1
MAX_INDEX_BYTES = 64 << 20  # ~200 bytes per stamp, four stamps per file: 80,000 files
INDEX_MAX_DEPTH = 4
_MAX_STAMP_VALUE = 1 << 80  # inodes, sizes and times: far below

# statfs f_type of file systems that keep nanosecond stamps from the local kernel clock
_FINE_FILE_SYSTEMS = frozenset({
    0xEF53,  # ext2/3/4 (ext3 with small inodes keeps seconds: caught by the whole-second check)
    0x58465342,  # xfs
    0x9123683E,  # btrfs
    0x01021994,  # tmpfs
    0x794C7630,  # overlayfs (stamps from its upper file system, which is local)
    0xF2F52010,  # f2fs
    0x2FC12FC1,  # zfs
})


class FileStamp(NamedTuple):
    """What the kernel says of a file without reading it (no ``st_dev``: see the module doc)."""

    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, info: os.stat_result) -> FileStamp:
        return tuple.__new__(cls, (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns))

    def settled(self, verified_ns: int, tick_ns: int) -> bool:
        """Whether a hash begun at ``verified_ns`` vouches for every state with this stamp: the
        file's last change must be a whole tick older (else a rewrite in that tick keeps the stamp)."""
        return max(self.mtime_ns, self.ctime_ns) + tick_ns <= verified_ns


_TICKS: dict[int, int] = {}  # st_dev -> tick


def timestamp_tick_ns(path: str | os.PathLike, info: os.stat_result | None = None) -> int:
    """The granularity to assume for stamps of files on ``path``'s file system (remembered per
    device). A file whose mtime and ctime are whole seconds is on a coarse clock whatever the
    file system says."""
    info = info or os.stat(path)
    if info.st_mtime_ns % 1_000_000_000 == 0 and info.st_ctime_ns % 1_000_000_000 == 0:
        return COARSE_TICK_NS
    tick = _TICKS.get(info.st_dev)
    if tick is None:
        fs_type = _statfs_type(os.fspath(path))
        tick = FINE_TICK_NS if fs_type in _FINE_FILE_SYSTEMS else COARSE_TICK_NS
        _TICKS[info.st_dev] = tick
    return tick


_LIBC: Any = None


def _statfs_type(path: str) -> int | None:
    """``statfs(2)``'s ``f_type`` (the first field of ``struct statfs`` on Linux), None elsewhere."""
    global _LIBC
    try:
        if _LIBC is None:
            _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        buffer = ctypes.create_string_buffer(256)
        if _LIBC.statfs(os.fsencode(path), buffer) != 0:
            return None
        return ctypes.c_long.from_buffer(buffer).value & 0xFFFFFFFF
    except (OSError, AttributeError):
        return None


def hash_stamped(path: str | os.PathLike, algorithm: str = CONTENT_DIGEST_ALGORITHM) -> tuple[FileStamp, str, int]:
    """(stamp, digest, verified_ns) of a file. The clock is read first, then the stamp is taken
    from the same open file the bytes are read from: whatever the digest describes, a later
    change shows in the stamp unless it falls within the racy tick, which
    :meth:`FileStamp.settled` accounts for."""
    verified_ns = time.time_ns()
    fd = open_regular(path)  # a FIFO swapped in for a weight file fails here instead of blocking
    try:
        stamp = FileStamp.of(os.fstat(fd))
        return stamp, digest_fd(fd, algorithm), verified_ns
    finally:
        os.close(fd)


def settle_wait(paths: Iterable[Path]) -> None:
    """Sleep until the newest of ``paths`` has settled, if that is a short wait (a build's last
    files, on a fine-clock file system): then one hash vouches for all of them."""
    newest, tick = 0, FINE_TICK_NS
    for path in paths:
        with contextlib.suppress(OSError):
            info = os.stat(path)
            newest = max(newest, info.st_mtime_ns, info.st_ctime_ns)
            tick = max(tick, timestamp_tick_ns(path, info))
    wait = newest + tick - time.time_ns()
    if 0 < wait <= MAX_SETTLE_WAIT_NS:
        time.sleep(wait / 1e9)


class StampIndex:
    """Digests of files verified after they were recorded, by relative path and stamp.

    ``path`` is the shared location; ``fallback`` the per-user one used when ``path`` cannot be
    written. Reads merge both. Only settled stamps are ever recorded (see the module doc)."""

    def __init__(self, path: Path, fallback: Path | None = None, shared: Iterable[Path] = ()) -> None:
        """``shared``: other owners' indexes, only read, and only when this one misses (the
        seeder's stamps of the same files, seen through another path)."""
        self.path = Path(path)
        self.fallback = Path(fallback) if fallback is not None else None
        self.shared = [Path(location) for location in shared]
        self._entries: dict[str, list[tuple[FileStamp, int, str]]] | None = None
        self._shared_entries: dict[str, list[tuple[FileStamp, int, str]]] | None = None
        self._dirty = False

    def _load(self) -> dict[str, list[tuple[FileStamp, int, str]]]:
        if self._entries is None:
            self._entries = {}
            for location in (self.fallback, self.path):
                if location is not None:
                    _merge(self._entries, _read_json(location))
        return self._entries

    def _add(self, relative: str, stamp: FileStamp, verified_ns: int, digest: str) -> None:
        _add(self._entries, relative, stamp, verified_ns, digest)

    def lookup(self, relative: str, stamp: FileStamp) -> str | None:
        """The digest recorded for this file in exactly this state (here, else in a shared index), or None."""
        found = _find(self._load(), relative, stamp)
        if found is None and self.shared:
            if self._shared_entries is None:
                self._shared_entries = {}
                for location in self.shared:
                    _merge(self._shared_entries, _read_json(location))
            found = _find(self._shared_entries, relative, stamp)
        return found

    def record(self, relative: str, stamp: FileStamp, digest: str, verified_ns: int, tick_ns: int) -> None:
        """Remember a digest computed from a hash begun at ``verified_ns``, if the stamp is settled."""
        if stamp.settled(verified_ns, tick_ns):
            self._load()
            self._add(relative, stamp, verified_ns, digest)
            self._dirty = True

    def save(self, keep: Iterable[str] | None = None) -> None:
        """Write the index, keeping only the paths in ``keep`` (the files its owner still has)."""
        entries = self._load()
        if keep is not None:
            wanted = set(keep)
            pruned = {relative: stamps for relative, stamps in entries.items() if relative in wanted}
            self._dirty |= len(pruned) != len(entries)
            self._entries = entries = pruned
        if not self._dirty:
            return
        raw = json.dumps({"format": INDEX_FORMAT, "entries": {
            relative: [[*stamp, verified_ns, digest] for stamp, verified_ns, digest in stamps]
            for relative, stamps in sorted(entries.items())}}, separators=(",", ":")).encode()
        for location in (self.path, self.fallback):
            if location is None:
                continue
            try:
                location.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_bytes(location, raw, durable=False)
                self._dirty = False
                return
            except OSError:
                continue

    def __len__(self) -> int:
        return sum(len(stamps) for stamps in self._load().values())


Entries = dict[str, list[tuple[FileStamp, int, str]]]


def _find(entries: Entries, relative: str, stamp: FileStamp) -> str | None:
    for known, _, digest in entries.get(relative, ()):
        if known == stamp:
            return digest
    return None


def _add(entries: Entries, relative: str, stamp: FileStamp, verified_ns: int, digest: str) -> None:
    known = [entry for entry in entries.setdefault(relative, []) if entry[0] != stamp]
    entries[relative] = sorted([(stamp, verified_ns, digest), *known], key=lambda e: -e[1])[:STAMPS_PER_PATH]


def _merge(entries: Entries, body: Any) -> None:
    """Add the valid stamps of an index's JSON to ``entries`` (anything malformed is skipped)."""
    recorded = body.get("entries") if isinstance(body, dict) and body.get("format") == INDEX_FORMAT else None
    if not isinstance(recorded, dict):
        return
    for relative, stamps in recorded.items():
        if not isinstance(relative, str) or not isinstance(stamps, list):
            continue
        for item in stamps:
            if (type(item) is list and len(item) == 6 and all(type(v) is int and 0 <= v <= _MAX_STAMP_VALUE for v in item[:5])
                    and isinstance(item[5], str) and 0 < len(item[5]) <= 128):
                _add(entries, relative, FileStamp(*item[:4]), item[4], item[5])


def _read_json(path: Path) -> Any:
    """The index's JSON (``{"format", "entries": {path: [[stamp..., digest]]}}``, four levels), or
    None: absent, or refused by the side-file reader (a FIFO, too large, too deep, 1e999)."""
    return read_json_record(path, MAX_INDEX_BYTES, INDEX_MAX_DEPTH)
