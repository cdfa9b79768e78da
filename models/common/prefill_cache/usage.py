# SPDX-License-Identifier: Apache-2.0
"""When a prefill-cache object was last used: the order of size-capped (LRU) eviction. Torch-free.

A consumer that uses an object it looked up sets the object *directory's* mtime to now
(``FrozenBackboneFeatureSidecar.mark_used_boundary``: ``os.utime``; the lookup itself stays a
pure read). Nothing is written or created, and no validation proof changes (proofs stamp the
manifest and the artifacts, never the directory), so a hot lookup stays a few ``stat`` calls
plus one ``utime`` at most once per :data:`TOUCH_INTERVAL_S` per object and process. A store changes the directory
too (new entries), so a fresh object counts as just used. A read-only mount refuses the touch:
its objects keep the time of their store, which is all eviction there could use anyway.

The manifest's atime does not count: ``ls`` and ``gc`` read every manifest themselves, so on a
``relatime`` mount it would say "used now" of every object they list.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Final

TOUCH_INTERVAL_S: Final = 60.0
_REMEMBERED: Final = 65_536  # objects whose last touch a process remembers (about 8 MiB at most)


class UseClock:
    """Touches object directories on use, each at most once per ``interval_s`` in this process."""

    def __init__(self, interval_s: float = TOUCH_INTERVAL_S, remembered: int = _REMEMBERED) -> None:
        self.interval_s = interval_s
        self.remembered = remembered
        self._lock = threading.Lock()
        self._touched: OrderedDict[str, float] = OrderedDict()

    def touch(self, directory: Path | str) -> None:
        """Mark ``directory`` used now (silently not, where the file system refuses)."""
        key, now = str(directory), time.monotonic()
        with self._lock:
            last = self._touched.get(key)
            if last is not None and now - last < self.interval_s:
                return
            self._touched[key] = now
            self._touched.move_to_end(key)
            while len(self._touched) > self.remembered:
                self._touched.popitem(last=False)
        with contextlib.suppress(OSError):  # read-only mount, another owner, retracted meanwhile
            os.utime(key)

    def forget(self) -> None:
        with self._lock:
            self._touched.clear()

    def reset_after_fork(self) -> None:
        self._lock = threading.Lock()
        self._touched.clear()


USES = UseClock()
os.register_at_fork(after_in_child=USES.reset_after_fork)


def last_used(directory: Path, manifest: os.stat_result | None = None) -> float:
    """Seconds since the epoch at which the object in ``directory`` was last used (stored or
    found). ``manifest`` is its manifest's stat, when the caller has it."""
    used = directory.stat().st_mtime
    return used if manifest is None else max(used, manifest.st_mtime)
