# SPDX-License-Identifier: Apache-2.0
"""Act at the moment another process opens or reads a file, while it waits (fanotify
permission events: root only).

For tests that must change a file at an exact point of another process's read, deterministically
and with no hook in the code under test: the kernel holds that process's ``open`` or ``read``
(``sendfile``, ``pread``...) of the watched file until this side answers, so whatever
``on_event`` does happens before the access goes on. Page faults of a mapping raise no such
event: a reader that maps the file is seen at its ``open`` only.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import struct
import threading
from collections.abc import Callable
from pathlib import Path

FAN_CLOEXEC = 0x1
FAN_CLASS_CONTENT = 0x4
FAN_MARK_ADD = 0x1
FAN_OPEN_PERM = 0x00010000
FAN_ACCESS_PERM = 0x00020000
FAN_ALLOW = 0x1
AT_FDCWD = -100
_EVENT = struct.Struct("IBBHQii")  # fanotify_event_metadata: len, vers, reserved, metadata_len, mask, fd, pid
_RESPONSE = struct.Struct("iI")


class FileAccesses:
    """Watch one file for opens and reads by other processes: ``on_event(kind, pid)`` (kind
    ``"open"`` or ``"read"``) runs on a thread while the access waits; every access is then
    allowed. ``with FileAccesses(path, on_event): ...``; ``events`` lists what was seen. The
    process doing the watching must not open or read the file itself meanwhile (it would wait
    for itself): change it through a descriptor opened before."""

    def __init__(self, path: Path, on_event: Callable[[str, int], None]) -> None:
        self.path = Path(path)
        self.on_event = on_event
        self.events: list[tuple[str, int]] = []
        self._libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self._libc.fanotify_mark.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p]
        self._fd = -1
        self._stop_read, self._stop_write = -1, -1
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def __enter__(self) -> FileAccesses:
        self._fd = self._libc.fanotify_init(FAN_CLASS_CONTENT | FAN_CLOEXEC, os.O_RDONLY | os.O_LARGEFILE)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "fanotify_init failed (root and a kernel with permission events needed)")
        if self._libc.fanotify_mark(self._fd, FAN_MARK_ADD, FAN_OPEN_PERM | FAN_ACCESS_PERM, AT_FDCWD,
                                    os.fsencode(self.path)) < 0:
            error = ctypes.get_errno()
            os.close(self._fd)
            raise OSError(error, f"fanotify_mark {self.path} failed")
        self._stop_read, self._stop_write = os.pipe()
        self._thread = threading.Thread(target=self._serve, name="file-accesses", daemon=True)
        self._thread.start()
        return self

    def _serve(self) -> None:
        while True:
            ready, _, _ = select.select([self._fd, self._stop_read], [], [])
            if self._stop_read in ready and self._fd not in ready:
                return
            data = os.read(self._fd, 4096)
            offset = 0
            while offset + _EVENT.size <= len(data):
                length, _, _, _, mask, fd, pid = _EVENT.unpack_from(data, offset)
                offset += length
                kind = "open" if mask & FAN_OPEN_PERM else "read"
                try:
                    if pid != os.getpid():
                        self.events.append((kind, pid))
                        self.on_event(kind, pid)
                except BaseException as error:  # noqa: BLE001 - reported by __exit__
                    self.error = self.error or error
                finally:
                    os.write(self._fd, _RESPONSE.pack(fd, FAN_ALLOW))
                    os.close(fd)

    def __exit__(self, *exc: object) -> None:
        os.write(self._stop_write, b"x")
        if self._thread is not None:
            self._thread.join(timeout=30)
        for fd in (self._fd, self._stop_read, self._stop_write):
            os.close(fd)
        if self.error is not None:
            raise self.error
