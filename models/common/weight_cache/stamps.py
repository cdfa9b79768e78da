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

**Checkpoint locations come and go** (a CI job checks a model out into a new directory each time),
and each has its own index, so their directory is bounded too, by one rule
(:func:`_prune_location_indexes`, run by whoever writes such an index):

* An index of a location that is gone from this host is deleted, if this host wrote it last (it
  records the resolved location and the host: another host may mount what this one does not).
* Beyond :data:`MAX_LOCATION_INDEXES`, the least recently used go (each use touches its index). An
  index is small (four stamps a file), and evicting a live one costs one hash of its checkpoint:
  64 hold every model of a busy shared root, each reached through a few paths.
* Only proven indexes are deleted, or counted: a regular file named ``...--<key>.json`` holding
  exactly an index's fields, whose recorded location has that key (written before locations were
  recorded: no location at all, then only ever evicted as least recently used). Anything else in
  the directory is never touched.
* A writer holds the directory's lock exclusively while it adds what others recorded since it
  read the index, writes it and prunes; a use touches its index under the lock shared. So no index
  is deleted in the middle of its write or use, and no writer loses another's stamps. Nobody waits
  long: a write given up means hashing again. A directory that cannot be locked is not written
  (the per-user one is).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import os
import socket
import stat
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from loguru import logger

from models.common.fileio import (
    CONTENT_DIGEST_ALGORITHM,
    atomic_write_bytes,
    digest_fd,
    open_lock_file,
    open_regular,
    try_flock,
)
from models.common.weight_cache.layout import index_directory_lock, location_index_key, location_key
from models.common.weight_cache.side_files import read_json_record

FINE_TICK_NS = 20_000_000  # local file systems that stamp with the kernel's clock (a jiffy is <= 10 ms)
COARSE_TICK_NS = 2_000_000_000  # FAT's 2 s; NFS and unknown file systems (server clocks, coarse stamps)
MAX_SETTLE_WAIT_NS = 50_000_000  # a build waits at most this long for its newest files to settle
STAMPS_PER_PATH = 4
INDEX_FORMAT = 1
MAX_INDEX_BYTES = 64 << 20  # ~200 bytes per stamp, four stamps per file: 80,000 files
INDEX_MAX_DEPTH = 4
MAX_LOCATION_INDEXES = 64  # checkpoint locations' indexes kept in one directory (see the module doc)
INDEX_LOCK_WAIT_S = 2.0  # a writer or pruner gives up on the index directory's lock after this long
_INDEX_FIELDS = frozenset({"format", "entries"})
_LOCATION_FIELDS = _INDEX_FIELDS | {"location", "host"}
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
        if _LIBC is None:  # the libc this process runs on; find_library spawns ldconfig (a second, loaded)
            _LIBC = ctypes.CDLL(None, use_errno=True)
            if not hasattr(_LIBC, "statfs"):
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


def stamped_as_written(path: str | os.PathLike, digest: str) -> tuple[FileStamp, str, int]:
    """(stamp, digest, verified_ns) of a file whose ``digest`` this process computed from the bytes
    as it wrote them (a pull's objects, in its own generation under the build lock): stamped now,
    not read a second time. The stamp is taken after the caller's :func:`settle_wait`, so it is
    the state the digest describes."""
    verified_ns = time.time_ns()
    fd = open_regular(path)
    try:
        return FileStamp.of(os.fstat(fd)), digest, verified_ns
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

    def __init__(self, path: Path, fallback: Path | None = None, shared: Iterable[Path] = (),
                 location: str | os.PathLike | None = None) -> None:
        """``shared``: other owners' indexes, only read, and only when this one misses (the
        seeder's stamps of the same files, seen through another path). ``location``: the checkpoint
        directory this index is of, recorded (resolved) so that its directory of indexes stays
        bounded (see the module doc)."""
        self.path = Path(path)
        self.fallback = Path(fallback) if fallback is not None else None
        self.shared = [Path(index) for index in shared]
        self.location = os.path.realpath(location) if location is not None else None
        self._entries: dict[str, list[tuple[FileStamp, int, str]]] | None = None
        self._shared_entries: dict[str, list[tuple[FileStamp, int, str]]] | None = None
        self._dirty = False

    def _load(self) -> dict[str, list[tuple[FileStamp, int, str]]]:
        if self._entries is None:
            self._entries = {}
            bodies = [body for index in (self.fallback, self.path) if index is not None
                      and (body := _read_json(index)) is not None]
            for body in bodies:
                _merge(self._entries, body)
            # written before locations were recorded: record this one at the next save
            self._dirty |= self.location is not None and bool(bodies) and not any("location" in b for b in bodies)
        return self._entries

    def _add(self, relative: str, stamp: FileStamp, verified_ns: int, digest: str) -> None:
        _add(self._entries, relative, stamp, verified_ns, digest)

    def lookup(self, relative: str, stamp: FileStamp) -> str | None:
        """The digest recorded for this file in exactly this state (here, else in a shared index), or None."""
        found = _find(self._load(), relative, stamp)
        if found is None and self.shared:
            if self._shared_entries is None:
                self._shared_entries = {}
                for index in self.shared:
                    _merge(self._shared_entries, _read_json(index))
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
        wanted = None if keep is None else set(keep)
        if wanted is not None:
            pruned = {relative: stamps for relative, stamps in entries.items() if relative in wanted}
            self._dirty |= len(pruned) != len(entries)
            self._entries = entries = pruned
        if not self._dirty:
            if self.location is not None:
                self._touch()
            return
        for target in (self.path, self.fallback):
            if target is None:
                continue
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                if self.location is None:
                    atomic_write_bytes(target, _encode(entries), durable=False)
                elif not self._write_location_index(target, wanted):
                    return  # another process does not let go of the directory: hash again next time
                self._dirty = False
            except OSError:
                continue
            return

    def _write_location_index(self, target: Path, wanted: set[str] | None) -> bool:
        """Under the directory's exclusive lock: add what other writers recorded since this index
        was read (none of them loses a stamp to another), write it, prune the directory. False
        when the lock stays taken; ``OSError`` where it cannot be taken at all."""
        with _index_lock(target.parent, exclusive=True) as held:
            if not held:
                return False
            merged = {relative: list(stamps) for relative, stamps in self._load().items()}
            _merge(merged, _read_json(target))
            if wanted is not None:
                merged = {relative: stamps for relative, stamps in merged.items() if relative in wanted}
            self._entries = merged
            atomic_write_bytes(target, _encode(merged, self.location), durable=False)
            _prune_location_indexes(target.parent, target)
        return True

    def _touch(self) -> None:
        """Mark this location's index used now (the pruner evicts the least recently used)."""
        for target in (self.path, self.fallback):
            if target is not None and target.is_file():
                with contextlib.suppress(OSError), _index_lock(target.parent, exclusive=False) as held:
                    if held:
                        os.utime(target)
                        return

    def __len__(self) -> int:
        return sum(len(stamps) for stamps in self._load().values())


Entries = dict[str, list[tuple[FileStamp, int, str]]]


def _encode(entries: Entries, location: str | None = None) -> bytes:
    body: dict[str, Any] = {"format": INDEX_FORMAT, "entries": {
        relative: [[*stamp, verified_ns, digest] for stamp, verified_ns, digest in stamps]
        for relative, stamps in sorted(entries.items())}}
    if location is not None:
        body |= {"location": location, "host": socket.gethostname()}
    return json.dumps(body, separators=(",", ":")).encode()


@contextlib.contextmanager
def _index_lock(directory: Path, *, exclusive: bool) -> Iterator[bool]:
    """Hold the lock of a directory of location indexes for the block; yields whether it is held
    (False after :data:`INDEX_LOCK_WAIT_S`). ``OSError`` where it cannot be opened or locked at
    all (a read-only directory without one, a file system without ``flock``)."""
    fd = open_lock_file(index_directory_lock(directory))
    try:
        deadline = time.monotonic() + INDEX_LOCK_WAIT_S
        while not (held := try_flock(fd, exclusive=exclusive)) and time.monotonic() < deadline:
            time.sleep(0.01)
        yield held
    finally:
        os.close(fd)


class _LocationIndex(NamedTuple):
    path: Path
    used_ns: int
    location: str | None  # None: written before locations were recorded
    host: str | None


def _prune_location_indexes(directory: Path, own: Path) -> list[Path]:
    """Delete the checkpoint-location indexes in ``directory`` whose location is gone from this
    host, then the least recently used beyond :data:`MAX_LOCATION_INDEXES` (call with the
    directory's lock held exclusively; see the module doc). ``own``, the index just written, is
    never one. Returns what was deleted."""
    indexes = _proven_location_indexes(directory)
    host = socket.gethostname()
    gone = [index for index in indexes if index.path != own and index.host == host
            and index.location is not None and _location_gone(index.location)]
    kept = sorted((index for index in indexes if index not in gone), key=lambda index: -index.used_ns)
    evicted = [index for index in kept[MAX_LOCATION_INDEXES:] if index.path != own]
    deleted = []
    for index in gone + evicted:
        with contextlib.suppress(FileNotFoundError):
            index.path.unlink()
            deleted.append(index.path)
    if deleted:
        logger.debug(f"{directory}: pruned {len(deleted)} checkpoint stamp index(es) "
                     f"({len(gone)} of locations gone, {len(evicted)} least recently used)")
    return deleted


def _proven_location_indexes(directory: Path) -> list[_LocationIndex]:
    """Every file in ``directory`` proven a checkpoint-location index this project wrote."""
    found = []
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        for entry in entries:
            key = location_index_key(entry.name)
            if key is None:
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISREG(info.st_mode):
                continue
            body = read_json_record(entry.path, MAX_INDEX_BYTES, INDEX_MAX_DEPTH, follow_symlinks=False)
            if body is None or body.get("format") != INDEX_FORMAT or not isinstance(body.get("entries"), dict):
                continue
            if set(body) == _INDEX_FIELDS:
                found.append(_LocationIndex(Path(entry.path), info.st_mtime_ns, None, None))
            elif (set(body) == _LOCATION_FIELDS and isinstance(location := body["location"], str)
                  and isinstance(host := body["host"], str) and 0 < len(location) <= 4096
                  and os.path.isabs(location) and location_key(location) == key):
                found.append(_LocationIndex(Path(entry.path), info.st_mtime_ns, location, host))
    return found


def _location_gone(location: str) -> bool:
    """Whether a checkpoint location is certainly gone from this host (one it cannot look into,
    another user's home or a mount that fails, is not)."""
    try:
        return not stat.S_ISDIR(os.stat(location).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError:
        return False


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
