# SPDX-License-Identifier: Apache-2.0
"""How many CPUs this process may use: the one rule behind every "one per CPU" default.

The affinity mask says which CPUs the scheduler may run the process on; a container's CPU quota
says how much of them it may use. A pod of 4 CPUs on a 64-core node sees all 64 in its mask and
is throttled to 4 by its cgroup, so a count from the mask alone starts 16 times the threads (and,
for conversion workers, about 0.5 GB each at 70B shapes) that can run. :func:`usable_cpus` is the
smaller of the two: the mask's size, and the tightest quota of the process's own cgroup and of its
ancestors (v2 ``cpu.max``; v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``), rounded up to a whole
CPU. Torch- and ttnn-free.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path

_PROC_CGROUP = Path("/proc/self/cgroup")
_MOUNTINFO = Path("/proc/self/mountinfo")


def affinity_cpus() -> frozenset[int]:
    """The CPUs this process may run on."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return frozenset(range(os.cpu_count() or 1))


def usable_cpus() -> int:
    """CPUs this process may use: its affinity mask, bounded by its cgroup's CPU quota (at least 1)."""
    count = len(affinity_cpus())
    quota = cgroup_cpu_quota()
    if quota is not None:
        count = min(count, max(1, math.ceil(quota)))
    return max(1, count)


def cgroup_cpu_quota() -> float | None:
    """The CPUs' worth of time this process's cgroups allow (quota / period, the tightest of its
    cgroup and its ancestors, v2 and v1 alike), or None when no quota applies or none is readable."""
    quotas = [q for q in (*_v2_quotas(), *_v1_quotas()) if q is not None]
    return min(quotas) if quotas else None


def _v2_quotas() -> Iterator[float | None]:
    for relative in _cgroup_paths(lambda controllers: controllers == ""):
        for mount in _mounts("cgroup2", None):
            yield from (_v2_quota(d / "cpu.max") for d in _ancestors(mount, relative))


def _v1_quotas() -> Iterator[float | None]:
    for relative in _cgroup_paths(lambda controllers: "cpu" in controllers.split(",")):
        for mount in _mounts("cgroup", "cpu"):
            yield from (_v1_quota(d) for d in _ancestors(mount, relative))


def _cgroup_paths(wanted: Callable[[str], bool]) -> list[str]:
    """This process's cgroup paths in the hierarchies whose controller list ``wanted`` accepts
    (``/proc/self/cgroup``: ``id:controllers:path``; v2's line is ``0::path``)."""
    try:
        lines = _PROC_CGROUP.read_text().splitlines()
    except OSError:
        return []
    paths = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3 and wanted(parts[1]):
            paths.append(parts[2])
    return paths


def _mounts(fstype: str, option: str | None) -> list[tuple[Path, str]]:
    """(mount point, the cgroup path mounted there) of each mount of ``fstype`` (with the super
    option ``option``: a v1 controller)."""
    try:
        lines = _MOUNTINFO.read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] != fstype:
            continue
        if option is not None and option not in tail[2].split(","):
            continue
        found.append((Path(fields[4]), fields[3]))
    return found


def _ancestors(mount: tuple[Path, str], relative: str) -> Iterator[Path]:
    """The directories of the cgroup at ``relative`` and of its ancestors visible under the mount
    (a container sees its own cgroup as the mount's root)."""
    point, root = mount
    path = Path(relative)
    try:
        inside = path.relative_to(root)
    except ValueError:
        inside = Path(".")  # the cgroup namespace's root is this cgroup: the mount is it
    parts = [] if inside == Path(".") else list(inside.parts)
    for end in range(len(parts), -1, -1):
        yield point.joinpath(*parts[:end])


def _v2_quota(cpu_max: Path) -> float | None:
    """``cpu.max``: ``max PERIOD`` (no quota) or ``QUOTA PERIOD``."""
    try:
        quota, period = cpu_max.read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def _v1_quota(directory: Path) -> float | None:
    """``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``; a quota of -1 is none."""
    try:
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None
