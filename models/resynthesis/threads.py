# SPDX-License-Identifier: Apache-2.0
"""Torch threads that never oversubscribe the CPUs, across the processes of one host.

Two trainers that each run torch with one thread per CPU make every OpenMP team wait for threads
the other process has descheduled: on 2 CPUs a prefill took 12.7x as long as alone. So each
process computes with a *share* of the CPUs it may run on (``os.sched_getaffinity``), agreed
with the other processes that compute at the same time:

* alone it uses them all (capped by ``OMP_NUM_THREADS`` when that is set);
* with others it takes ``CPUs // processes`` threads (at least one), and never more than the
  CPUs the others leave free: a newcomer waits for the others to shrink to their share (they
  re-decide before every prefill and training step) instead of oversubscribing meanwhile;
* a process that waits (for another producer's features) gives its share back meanwhile;
* ``threads=N`` (``--threads N``) fixes N threads; the automatic processes plan around it;
* CPUs that *other* work keeps busy (anything: a build, another user's job) are not taken either:
  the CPU time of the machine (``/proc/stat``) minus this process's own, over the last second,
  says how many CPUs are busy elsewhere. On this 2-core machine under load, a 2-thread prefill of
  Gemma 3 270M took 1.3-2.8x its 1-thread time even without spinning.

With more processes than CPUs each runs one thread (the kernel time-slices whole processes, no
thread team is split).

The agreement is a directory of member files (``TT_CPU_SHARE_DIR``, default
``$TMPDIR/tt-warm-loaders-<uid>/cpu-share``): each process holds an ``flock`` on its own file
for its lifetime (so a killed process drops out by itself, in any PID namespace) and writes its
state there (idle, computing or waiting; threads; CPUs); every decision is taken under one short lock
of the directory, so two processes never decide on a stale view of each other. Processes whose
CPU sets do not intersect ignore each other. If the directory cannot be used, the process runs
alone with its cap and says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from loguru import logger

from models.common import envs
from models.common.cpus import affinity_cpus
from models.common.fileio import file_lock, try_flock

SHARE_DIR_ENV: Final = "TT_CPU_SHARE_DIR"
IDLE, COMPUTING, WAITING = "idle", "computing", "waiting"  # a member's state (only computing takes CPUs)
MEMBER_SUFFIX: Final = ".member"
_RECORD_MAX_BYTES: Final = 1 << 16
_POLL_S: Final = 0.01
_MAX_WAIT_S: Final = 30.0  # waiting for others to shrink; then run one thread anyway


def omp_threads() -> int | None:
    """``OMP_NUM_THREADS`` as a positive count (its first level: ``4,2`` is 4), None when unset (the
    table refuses anything else)."""
    return envs.OMP_NUM_THREADS


def default_share_dir() -> Path:
    configured = envs.TT_CPU_SHARE_DIR
    if configured is not None:
        return configured
    return Path(tempfile.gettempdir()) / f"tt-warm-loaders-{os.getuid()}" / "cpu-share"


def _torch_threads(count: int) -> None:
    import torch

    if torch.get_num_threads() != count:
        torch.set_num_threads(count)


class ForeignLoad:
    """How many of ``cpus`` other processes kept busy lately: the machine's busy CPU time on them
    (``/proc/stat``) minus this process's own (``os.times``), per wall second, sampled at most
    every ``interval_s``. 0 where ``/proc/stat`` cannot be read."""

    def __init__(self, cpus: frozenset[int], interval_s: float = 0.5) -> None:
        self.cpus = cpus
        self.interval_s = interval_s
        self.busy = 0.0
        self._last = self._sample()

    def _sample(self) -> tuple[float, float, float, float] | None:
        """(busy ticks, total ticks over the CPUs, own CPU seconds, monotonic seconds)."""
        busy = total = 0
        try:
            with open("/proc/stat", "rb") as stream:
                for line in stream:
                    if not line.startswith(b"cpu") or line[3:4] == b" ":
                        continue
                    name, *ticks = line.split()
                    if int(name[3:]) in self.cpus:
                        values = [int(t) for t in ticks[:8]]  # user nice system idle iowait irq softirq steal
                        total += sum(values)
                        busy += sum(values) - values[3] - values[4]
        except (OSError, ValueError, IndexError):
            return None
        own = os.times()
        return busy, total, own.user + own.system, time.monotonic()

    def update(self) -> float:
        """CPUs busy with other work since the last sample (re-sampled when old enough)."""
        if self._last is None or time.monotonic() - self._last[3] < self.interval_s:
            return self.busy
        now = self._sample()
        if now is None:
            return self.busy
        busy, total, own, wall = (b - a for a, b in zip(self._last, now, strict=True))
        if total > 0 and wall > 0:
            self.busy = max(0.0, busy / (total / len(self.cpus)) - own / wall)
            self._last = now
        return self.busy


@dataclass(frozen=True)
class Member:
    """Another process's state, as it last wrote it."""

    fixed: bool
    computing: bool
    threads: int


class ThreadShare:
    """This process's share of the CPUs (see the module docstring). Use as a context manager, or
    :meth:`start` / :meth:`close`; call :meth:`refresh` before each unit of parallel work (a
    prefill, a training step: that is when the share is taken, and re-decided) and wrap waits in
    :meth:`paused`.

    ``history`` lists ``(time.time(), threads)`` at every change of this process's threads (0:
    waiting or paused), stamped when the decision was published under the directory lock: the
    histories of all processes merge into one consistent timeline."""

    def __init__(self, threads: int | None = None, *, share_dir: Path | None = None,
                 apply: Callable[[int], None] = _torch_threads) -> None:
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.cpus = affinity_cpus()
        self.fixed = threads
        omp = omp_threads()
        self.cap = threads if threads is not None else min(omp or len(self.cpus), len(self.cpus))
        self.share_dir = Path(share_dir) if share_dir is not None else default_share_dir()
        self.apply = apply
        self.threads = 0  # what this process computes with now (0: not yet, or waiting)
        self.coordinated = False
        self.history: list[tuple[float, int]] = []
        self.load = ForeignLoad(self.cpus)
        self._fd: int | None = None
        self._path: Path | None = None
        self._published: tuple[str, int] | None = None  # (state, threads) last written

    # -- membership -------------------------------------------------------------------------

    def start(self) -> ThreadShare:
        try:
            self.share_dir.mkdir(parents=True, exist_ok=True)
            name = f"{socket.gethostname()}.{os.getpid()}.{secrets.token_hex(4)}{MEMBER_SUFFIX}"
            path = self.share_dir / name
            with file_lock(self.share_dir / ".share.lock"):  # no one probes it before it is locked
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                if not try_flock(fd, exclusive=True):  # a fresh file nobody else knows: cannot happen
                    os.close(fd)
                    raise OSError(f"{path} is locked by another process")
            self._fd, self._path, self.coordinated = fd, path, True
            with self._decision():
                self._publish(IDLE, 0)  # a member, not computing yet: loading claims no CPU share
        except OSError as error:
            logger.warning("cannot share CPUs with other processes through {} ({}); computing with {} "
                           "thread(s) as if alone", self.share_dir, error, self.cap)
        return self

    def close(self) -> None:
        if self._fd is not None:
            with self._decision():
                self._publish(IDLE, 0)
                with contextlib.suppress(OSError):
                    self._path.unlink()
            os.close(self._fd)
            self._fd = None
        else:
            self._note(0)

    def __enter__(self) -> ThreadShare:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- decisions --------------------------------------------------------------------------

    @contextlib.contextmanager
    def _decision(self) -> Iterator[None]:
        """The directory lock: one process decides at a time, on a current view of the others."""
        if self._fd is None:
            yield
            return
        with file_lock(self.share_dir / ".share.lock"):
            yield

    def refresh(self) -> int:
        """Re-decide this process's threads now (waiting, if a newcomer, for the others to shrink)
        and apply them; returns the count."""
        if self.fixed is not None or self._fd is None:
            if self._published != (COMPUTING, self.cap):
                with self._decision():
                    self._publish(COMPUTING, self.cap)
            return self._use(self.cap)
        deadline = time.monotonic() + _MAX_WAIT_S
        while True:
            with self._decision():
                chosen = self._choose(self._others(), waited_enough=time.monotonic() > deadline)
                self._publish(COMPUTING, chosen)
            if chosen:
                return self._use(chosen)
            time.sleep(_POLL_S)

    def _choose(self, others: list[Member], *, waited_enough: bool) -> int:
        """Threads for this process given the others computing now; 0 means wait for them."""
        cpus = len(self.cpus)
        idle = round(cpus - self.load.update())  # CPUs no other work keeps busy (trainers included)
        fair = max(1, min(self.cap, cpus // (len(others) + 1), idle))
        free = cpus - sum(member.threads for member in others)
        if free >= 1:
            return min(fair, free)
        will_shrink = any(not m.fixed and m.threads > max(1, cpus // (len(others) + 1)) for m in others)
        return 0 if will_shrink and not waited_enough else 1

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Give the share back for the block (a wait), take a share again after it."""
        automatic = self._fd is not None and self.fixed is None
        if automatic:
            with self._decision():
                self._publish(WAITING, 0)
        try:
            yield
        finally:
            if automatic:
                self.refresh()

    def _use(self, count: int) -> int:
        self.apply(count)
        self.threads = count
        return count

    def _note(self, threads: int) -> None:
        if not self.history or self.history[-1][1] != threads:
            self.history.append((time.time(), threads))

    # -- member files -----------------------------------------------------------------------

    def _publish(self, state: str, threads: int) -> None:
        """Write this process's state into its member file and its history (decision held)."""
        self._note(threads if state == COMPUTING else 0)
        if self._fd is None or self._published == (state, threads):
            return
        record = {"fixed": self.fixed is not None, "state": state, "threads": threads, "pid": os.getpid(),
                  "cpus": sorted(self.cpus)}
        data = json.dumps(record, separators=(",", ":")).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)
        self._published = (state, threads)

    def _others(self) -> list[Member]:
        """The other live processes computing on CPUs this one may use (decision held); removes
        the files of dead ones."""
        found = []
        for path in self.share_dir.iterdir():
            if path == self._path or not path.name.endswith(MEMBER_SUFFIX):
                continue
            member = self._read_live(path)
            if member is not None and member.computing:
                found.append(member)
        return found

    def _read_live(self, path: Path) -> Member | None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            if try_flock(fd, exclusive=False):  # nobody holds it: its process is gone
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                return None
            record = json.loads(os.pread(fd, _RECORD_MAX_BYTES, 0) or b"{}")
        except (OSError, ValueError) as error:
            logger.debug("ignoring CPU share member {}: {}", path, error)
            return None
        finally:
            os.close(fd)
        cpus = record.get("cpus") if isinstance(record, dict) else None
        if not isinstance(cpus, list) or self.cpus.isdisjoint(c for c in cpus if isinstance(c, int)):
            return None
        threads = record.get("threads")
        return Member(fixed=record.get("fixed") is True, computing=record.get("state") == COMPUTING,
                      threads=threads if type(threads) is int and threads >= 0 else len(self.cpus))
