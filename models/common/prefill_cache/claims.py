# SPDX-License-Identifier: Apache-2.0
"""One producer per object across processes: a claim on an object's features.

Two trainers on one cache that miss the same prompt at once would both run the parent's prefill
for it: the writer lock only serialises the *store*. A producer therefore claims an object
before computing it: an exclusive ``flock`` on ``<object>/.producer.lock``, held from the miss
until the object is published (or the producer gives up). Another producer that finds the claim
taken does other work, then waits for the claim and looks the object up again: it gets the
features the first one stored, and computes them itself only when the first one died or could
not store them (a full disk). The kernel drops the lock of a killed holder, so nothing wedges.

Deadlock-free by use: a producer never waits for a claim while holding one (it releases its own
claims, after storing them, before it waits), and a writer lock is never held while waiting for
a claim. Torch-free.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Final

from models.common.fileio import try_flock
from models.common.prefill_cache.layout import PRODUCER_LOCK_NAME

CLAIM_POLL_S: Final = (0.005, 0.1)  # first and longest pause between tries while waiting


class ProducerClaim:
    """The claim on the object in ``object_root`` (see the module docstring).

    ``take`` raises the OSError of a cache root that cannot hold the lock file (read-only, full,
    unreadable): the caller then produces without a claim."""

    def __init__(self, object_root: Path) -> None:
        self.path = Path(object_root) / PRODUCER_LOCK_NAME
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def take(self) -> bool:
        """Claim without waiting: True when this producer now holds the claim, False when another
        one does."""
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            taken = try_flock(fd, exclusive=True)
        except BaseException:
            os.close(fd)
            raise
        if not taken:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def wait(self, timeout_s: float) -> bool:
        """Claim, waiting up to ``timeout_s`` for the current holder; False on timeout."""
        deadline = time.monotonic() + timeout_s
        pause = CLAIM_POLL_S[0]
        while not self.take():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(pause, remaining))
            pause = min(pause * 2, CLAIM_POLL_S[1])
        return True

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                os.close(fd)

    def __enter__(self) -> ProducerClaim:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()
