# SPDX-License-Identifier: Apache-2.0
"""Run a child process under a real memory limit: a memory cgroup (v1 or v2) made for it.

``prlimit --as`` limits address space, not memory: importing torch and ttnn alone maps gigabytes
of it, so only a cgroup limits what a seed actually uses."""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _own_memory_cgroup() -> tuple[Path, str] | None:
    """This process's memory cgroup directory and the name of its limit file."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return CGROUP_ROOT / "memory" / path.lstrip("/"), "memory.limit_in_bytes"
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        if line.startswith("0::") and (CGROUP_ROOT / "cgroup.controllers").is_file():
            return CGROUP_ROOT / line[3:].lstrip("/"), "memory.max"
    return None


def cgroup_unavailable() -> str | None:
    """Why no memory cgroup can be made here (None: it can)."""
    found = _own_memory_cgroup()
    if found is None:
        return "no memory cgroup controller"
    parent, limit_file = found
    probe = parent / f"probe-{secrets.token_hex(4)}"
    try:
        probe.mkdir()
        (probe / limit_file).write_text(str(64 << 20))
    except OSError as error:
        return f"cannot make a memory cgroup under {parent}: {error}"
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()
    return None


@contextlib.contextmanager
def memory_cgroup(limit_bytes: int) -> Iterator[Path]:
    """A fresh memory cgroup limited to ``limit_bytes``; removed when the block ends."""
    found = _own_memory_cgroup()
    assert found is not None, "no memory cgroup controller"
    parent, limit_file = found
    group = parent / f"tt-seed-{os.getpid()}-{secrets.token_hex(4)}"
    group.mkdir()
    try:
        (group / limit_file).write_text(str(limit_bytes))
        yield group
    finally:
        for _ in range(100):  # the killed child's memory is uncharged asynchronously
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def run_limited(command: Sequence[str], limit_bytes: int, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(command)`` with the child inside a fresh cgroup of ``limit_bytes``."""
    with memory_cgroup(limit_bytes) as group:
        procs = group / "cgroup.procs"
        return subprocess.run(command, preexec_fn=lambda: procs.write_text(str(os.getpid())), **kwargs)
