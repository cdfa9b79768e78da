# SPDX-License-Identifier: Apache-2.0
"""The bytes a build converts are the bytes its content id names; no torch.

The content id (:mod:`~models.common.weight_cache.identity`) is computed before a cold build
reads the checkpoint, by path. A shard renamed over or rewritten in between (a re-download, a
user's copy) would be converted and cached under the old id, and a pristine copy of the old
weights then served the new ones, warm. So every reader of a build (the loader's cold build, its
conversion workers, a Ray task, the Ray driver's host sidecar) reads through one
:class:`ProvenCheckpoint`, and its rule is:

* **Open once, prove the open.** Each weight file is opened once and read only through that
  descriptor (the header by ``pread``, the tensors mapped from it). Its ``fstat`` must be the
  stamp the content id saw, and that stamp settled (verified a racy tick after the file's last
  change, :meth:`~models.common.weight_cache.stamps.FileStamp.settled`); else the open file is
  hashed, once its last change is a tick old, and must give the SHA-256 the content id names.
  The shard index is small: it is always hashed, and the weight map parsed from those bytes.
  The config the build's architecture comes from (read apart from the content id) must be the one
  it counts (:meth:`ProvenCheckpoint.check_config`).
* **Prove it again after the last read.** An in-place rewrite keeps the inode but moves mtime and
  ctime: :meth:`ProvenCheckpoint.check`, after conversion and before anything is published,
  compares every descriptor's ``fstat`` with the stamp it was proved with.

A mismatch raises :class:`CheckpointChanged` naming the file: the build aborts (its transaction
removes the generation and releases the lock, nothing is published). The next load computes the
content id of what the checkpoint holds then.

The settled path costs an ``fstat`` per shard at open and at the end; only a file changed within
a tick of its content id (just written) is hashed again.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from models.common.checkpoint import (
    CONFIG_FILE,
    MAX_INDEX_BYTES,
    SAFETENSORS_INDEX,
    SAFETENSORS_SINGLE,
    CheckpointError,
    CheckpointFiles,
    parse_index,
)
from models.common.fileio import digest_fd, open_regular, sha256_bytes
from models.common.weight_cache.identity import CheckpointIdentity, IdentifiedFile, canonical_config_sha256
from models.common.weight_cache.stamps import FileStamp, timestamp_tick_ns


class CheckpointChanged(CheckpointError):
    """A checkpoint file does not hold the bytes the build's content id names; the message names it."""


class ProvenCheckpoint:
    """The weight files of one build's checkpoint, opened once each and proved (see the module doc).

    Thread-safe: the conversion workers of a build share one. Descriptors stay open until
    :meth:`close` (or the end of the ``with`` block)."""

    def __init__(self, identity: CheckpointIdentity) -> None:
        self.identity = identity
        self.directory = Path(identity.directory)
        self._opened: dict[str, tuple[int, FileStamp]] = {}  # relative path -> (fd, stamp proved)
        self._files: CheckpointFiles | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> ProvenCheckpoint:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def checkpoint_files(self) -> CheckpointFiles:
        """The shards and weight map, from the index bytes the content id names."""
        with self._lock:
            if self._files is None:
                self._files = self._read_files()
            return self._files

    def _read_files(self) -> CheckpointFiles:
        if SAFETENSORS_INDEX not in self.identity.files:
            return CheckpointFiles(self.directory, (SAFETENSORS_SINGLE,), None, None)
        index = self.directory / SAFETENSORS_INDEX
        fd = self._open(SAFETENSORS_INDEX)
        chunks: list[bytes] = []
        while sum(map(len, chunks)) <= MAX_INDEX_BYTES and (chunk := os.read(fd, 1 << 20)):
            chunks.append(chunk)
        raw = b"".join(chunks)
        if sha256_bytes(raw) != self.identity.files[SAFETENSORS_INDEX].digest:
            raise CheckpointChanged(f"{index} changed after the content id of {self.directory} was computed: "
                                    "its bytes are not the ones the cache would be named by; nothing was cached")
        self._opened[SAFETENSORS_INDEX] = (fd, FileStamp.of(os.fstat(fd)))
        weight_map = parse_index(raw, index)
        return CheckpointFiles(self.directory, tuple(sorted(set(weight_map.values()))), SAFETENSORS_INDEX, weight_map)

    def open(self, relative: str) -> int:
        """The descriptor of the weight file ``relative``, proved to hold the bytes the content id
        names (opened on first call). Raises :class:`CheckpointChanged`, or :class:`CheckpointError`."""
        with self._lock:
            if relative not in self._opened:
                seen = self.identity.files.get(relative)
                if seen is None:
                    raise CheckpointChanged(f"{self.directory / relative} is not among the files the content id of "
                                            f"{self.directory} was computed from")
                fd = self._open(relative)
                try:
                    self._opened[relative] = (fd, self._prove(fd, relative, seen))
                except BaseException:
                    os.close(fd)
                    raise
            return self._opened[relative][0]

    def _open(self, relative: str) -> int:
        try:
            return open_regular(self.directory / relative)
        except OSError as error:
            raise CheckpointError(f"cannot read checkpoint file {self.directory / relative}: "
                                  f"{error.strerror or error}") from None

    def _prove(self, fd: int, relative: str, seen: IdentifiedFile) -> FileStamp:
        """The stamp of the open file, once proved to be ``seen``'s bytes (see the module doc)."""
        path = self.directory / relative
        info = os.fstat(fd)
        stamp = FileStamp.of(info)
        if stamp == seen.stamp and seen.settled:
            return stamp
        tick = timestamp_tick_ns(path, info)
        wait = max(stamp.mtime_ns, stamp.ctime_ns) + tick - time.time_ns()
        if wait > 0:  # a file changed a moment ago: hash it once a change would move its stamp
            time.sleep(min(wait, tick) / 1e9)
        verified_ns = time.time_ns()
        stamp = FileStamp.of(os.fstat(fd))
        os.lseek(fd, 0, os.SEEK_SET)
        digest = digest_fd(fd, "sha256")
        if digest != seen.digest:
            raise CheckpointChanged(f"{path} changed after the content id of {self.directory} was computed "
                                    f"(SHA-256 {digest[:12]}..., not {seen.digest[:12]}...): a build from it would be "
                                    "cached under the old weights' id; nothing was cached")
        if FileStamp.of(os.fstat(fd)) != stamp or not stamp.settled(verified_ns, tick):
            raise CheckpointChanged(f"{path} is being written while the build reads it; nothing was cached")
        return stamp

    def check_config(self, config: dict[str, Any]) -> None:
        """The config a build's architecture was read from is the one its content id counts."""
        if canonical_config_sha256(config) != self.identity.config_sha256:
            raise CheckpointChanged(f"{self.directory / CONFIG_FILE} changed after the content id of {self.directory} "
                                    "was computed: the build would be made for another config; nothing was cached")

    def proven_identity(self) -> CheckpointIdentity:
        """The identity with the stamps this proof proved (settled ones): another process's proof of
        the same files (a Ray task) then needs only their ``fstat``, even for files just written."""
        with self._lock:
            proven = {relative: IdentifiedFile(stamp, self.identity.files[relative].digest, True)
                      for relative, (_, stamp) in self._opened.items() if relative != SAFETENSORS_INDEX}
        return dataclasses.replace(self.identity, files={**self.identity.files, **proven})

    def check(self) -> None:
        """After the build's last read: every file opened still has the stamp it was proved with
        (an in-place rewrite, a truncation or a rename over it moves its mtime or ctime)."""
        with self._lock:
            for relative, (fd, proved) in sorted(self._opened.items()):
                if FileStamp.of(os.fstat(fd)) != proved:
                    raise CheckpointChanged(f"{self.directory / relative} changed while the build read it "
                                            f"(content id {self.identity.content_id[:12]}...); nothing was cached")

    def close(self) -> None:
        with self._lock:
            for fd, _ in self._opened.values():
                os.close(fd)
            self._opened.clear()
