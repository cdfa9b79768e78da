# SPDX-License-Identifier: Apache-2.0
"""Which files under a directory were opened, as the kernel saw it (inotify ``IN_OPEN``).

For tests that must prove a process opened *none* of some files (a reader facing a generation
being retired, a warm start that must not read the checkpoint): the kernel reports every open,
whoever makes it (Python, ttnn's C++, mmap), so no code under test needs a hook.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
from pathlib import Path

IN_OPEN = 0x00000020
IN_NONBLOCK = 0o4000
_EVENT = struct.Struct("iIII")


class FileOpens:
    """Watch every directory below ``root`` (as it is now) for opens: ``with FileOpens(root) as
    watch: ...``, then ``watch.opened()`` lists the names opened, relative to ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self._fd = -1
        self._dirs: dict[int, Path] = {}

    def __enter__(self) -> FileOpens:
        self._fd = self._libc.inotify_init1(IN_NONBLOCK)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        for directory in [self.root, *(p for p in self.root.rglob("*") if p.is_dir() and not p.is_symlink())]:
            wd = self._libc.inotify_add_watch(self._fd, os.fsencode(directory), IN_OPEN)
            if wd < 0:
                raise OSError(ctypes.get_errno(), f"inotify_add_watch {directory} failed")
            self._dirs[wd] = directory.relative_to(self.root)
        return self

    def opened(self) -> list[str]:
        """Files opened since the watch began (a directory's own opens, by ``os.walk`` say, are
        reported with an empty name and left out)."""
        names = []
        while True:
            try:
                data = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                return sorted(set(names))
            offset = 0
            while offset < len(data):
                wd, _, _, length = _EVENT.unpack_from(data, offset)
                raw = data[offset + _EVENT.size: offset + _EVENT.size + length].rstrip(b"\0")
                offset += _EVENT.size + length
                if raw:
                    names.append((self._dirs[wd] / os.fsdecode(raw)).as_posix())

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)
