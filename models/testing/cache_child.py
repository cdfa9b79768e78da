# SPDX-License-Identifier: Apache-2.0
"""A second process that holds part of a cache, for tests of locks, leases and kills:
``python -m models.testing.cache_child MODE PATH [TAG]``; prints ``ready <detail>`` once it holds
what it was asked to, then sleeps until killed.

* ``lease GENERATION_DIR``: a reader's shared lease on a generation;
* ``retiring GENERATION_DIR``: the exclusive lease a retirement takes before it renames the
  generation away (held, never renamed: the moment a reader must not open anything);
* ``lock CACHE_DIR``: the cache dir's build lock, as a builder holds it;
* ``build CACHE_DIR TAG``: a build of variant TAG that made its generation and then hangs (a
  SIGKILL then leaves exactly what a killed build leaves); prints the generation's name.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

from models.common.weight_cache.generations import Generation, build_lock
from models.common.weight_cache.layout import READERS_LEASE, VariantPaths


def _hold_forever(detail: str) -> None:
    print(f"ready {detail}", flush=True)
    while True:
        time.sleep(3600)


def main(argv: list[str]) -> int:
    mode, path = argv[0], Path(argv[1])
    if mode in ("lease", "retiring"):
        fd = os.open(path / READERS_LEASE, os.O_RDWR if mode == "retiring" else os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX if mode == "retiring" else fcntl.LOCK_SH)
        _hold_forever(path.name)
    if mode == "lock":
        with build_lock(VariantPaths(path)) as state:
            _hold_forever(str(state.held))
    if mode == "build":
        paths = VariantPaths(path, tag=argv[2])
        with build_lock(paths):
            _hold_forever(Generation(paths).name)
    raise SystemExit(f"unknown mode {mode!r}")


class Child:
    """A running :mod:`models.testing.cache_child`; ``detail`` is what it printed after ``ready``."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "models.testing.cache_child", *args],
                                        stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline().strip()
        if not line.startswith("ready"):
            self.process.kill()
            raise RuntimeError(f"cache_child {args} did not get ready: {line!r}")
        self.detail = line.removeprefix("ready").strip()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
