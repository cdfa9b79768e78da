# SPDX-License-Identifier: Apache-2.0
"""Seed progress: the protocol a seeding writer calls, how it is shown, and the stall watchdog.

The protocol (:class:`SeedProgress`) is three calls, made from the writer as files land:
``start(total_weights, total_bytes)`` once, ``weight_done(name, nbytes)`` per weight written,
``finish()`` once. A seed runs in a worker process (:mod:`models.seeding.worker`); its
:class:`PipeProgress` forwards each call as one JSON line to the parent, whose
:class:`ProgressTracker` keeps the counts, shows them (a bar with bytes/s and ETA on a terminal,
one log line every N seconds otherwise) and tells the :class:`StallWatchdog` when anything was
last written. Torch-free.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol, TextIO


class SeedProgress(Protocol):
    def start(self, total_weights: int, total_bytes: int) -> None: ...

    def weight_done(self, name: str, nbytes: int) -> None: ...

    def finish(self) -> None: ...


# -- worker side ---------------------------------------------------------------------------------


class PipeProgress:
    """Forwards the protocol's calls as JSON lines on a pipe (thread-safe: the writer thread calls it)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lock = threading.Lock()

    def send(self, event: str, **fields: Any) -> None:
        line = (json.dumps({"event": event, **fields}) + "\n").encode()
        with self._lock:
            view = memoryview(line)
            while view:
                view = view[os.write(self._fd, view):]

    def start(self, total_weights: int, total_bytes: int) -> None:
        self.send("start", total_weights=int(total_weights), total_bytes=int(total_bytes))

    def weight_done(self, name: str, nbytes: int) -> None:
        self.send("weight_done", name=str(name), nbytes=int(nbytes))

    def finish(self) -> None:
        self.send("finish")


class EventDecoder:
    """Splits the bytes read from a :class:`PipeProgress` pipe into events (partial lines kept)."""

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        lines = (self._pending + data).split(b"\n")
        self._pending = lines.pop()
        events = []
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue  # not ours: a worker never writes anything else here
            if isinstance(event, dict):
                events.append(event)
        return events


# -- parent side ---------------------------------------------------------------------------------


@dataclass
class ProgressSnapshot:
    weights_done: int
    total_weights: int
    bytes_done: int
    total_bytes: int
    last_weight: str | None
    elapsed: float
    idle: float
    started: bool
    unit: str = "weights"  # what is counted (``tt-cache push``/``pull`` count objects)

    @property
    def bytes_per_second(self) -> float:
        return self.bytes_done / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def eta(self) -> float | None:
        rate = self.bytes_per_second
        if not rate or not self.total_bytes:
            return None
        return max(0.0, (self.total_bytes - self.bytes_done) / rate)

    def describe(self) -> str:
        eta = f", ETA {self.eta:.0f} s" if self.eta is not None else ""
        total = f" of {self.total_bytes / 2**20:,.1f}" if self.total_bytes else ""
        last = f", last {self.last_weight}" if self.last_weight else ""
        return (f"{self.weights_done}/{self.total_weights or '?'} {self.unit}, {self.bytes_done / 2**20:,.1f}{total} MiB, "
                f"{self.bytes_per_second / 2**20:,.1f} MiB/s{eta}{last}")


class ProgressTracker:
    """Counts what a seed wrote; shows it on ``stream`` (a tqdm bar on a terminal, else a line
    every ``log_every`` seconds). Implements :class:`SeedProgress` itself, so an in-process seed
    can report to it directly."""

    def __init__(self, label: str, *, stream: TextIO | None = None, log_every: float = 30.0,
                 show: bool = True, clock=time.monotonic, unit: str = "weights") -> None:
        self.label = label
        self.unit = unit
        self._stream = stream or sys.stderr
        self._log_every = log_every
        self._show = show
        self._clock = clock
        self._lock = threading.Lock()
        self._started = self._last_activity = self._last_log = clock()
        self.weights_done = self.total_weights = self.bytes_done = self.total_bytes = 0
        self.last_weight: str | None = None
        self.started = False
        self._bar = None

    def _touch(self) -> None:
        self._last_activity = self._clock()

    def start(self, total_weights: int, total_bytes: int) -> None:
        with self._lock:
            self.total_weights, self.total_bytes = int(total_weights), int(total_bytes)
            self.started = True
            self._touch()
            self._started = self._last_activity  # rates count from here, not from the worker's imports
            if self._show and self._stream.isatty():
                from tqdm import tqdm

                self._bar = tqdm(total=self.total_bytes or None, unit="B", unit_scale=True, unit_divisor=1024,
                                 desc=self.label, file=self._stream, dynamic_ncols=True)

    def weight_done(self, name: str, nbytes: int) -> None:
        with self._lock:
            self.weights_done += 1
            self.bytes_done += int(nbytes)
            self.last_weight = str(name)
            self._touch()
            if self._bar is not None:
                if self._bar.total is not None and self.bytes_done > self._bar.total:
                    self._bar.total = self.bytes_done  # the estimate was short: never past 100%
                total = max(self.total_weights, self.weights_done)
                self._bar.set_postfix_str(f"{self.weights_done}/{total} {self.unit}", refresh=False)
                self._bar.update(int(nbytes))

    def finish(self) -> None:
        with self._lock:
            self._touch()
            if self._bar is not None:
                self._bar.close()
                self._bar = None

    def handle(self, event: dict[str, Any]) -> None:
        """Apply one event decoded from a worker's pipe."""
        kind = event.get("event")
        if kind == "start":
            self.start(event.get("total_weights", 0), event.get("total_bytes", 0))
        elif kind == "weight_done":
            self.weight_done(event.get("name", "?"), event.get("nbytes", 0))
        elif kind == "finish":
            self.finish()

    def snapshot(self) -> ProgressSnapshot:
        """The counts so far; a total is at least what was done (the totals are estimates)."""
        with self._lock:
            now = self._clock()
            total_weights = max(self.total_weights, self.weights_done) if self.total_weights else 0
            total_bytes = max(self.total_bytes, self.bytes_done) if self.total_bytes else 0
            return ProgressSnapshot(self.weights_done, total_weights, self.bytes_done, total_bytes,
                                    self.last_weight, now - self._started, now - self._last_activity, self.started,
                                    self.unit)

    def tick(self) -> None:
        """Called periodically: the log line when not on a terminal (once the seed started)."""
        if not self._show or self._bar is not None or not self.started:
            return
        now = self._clock()
        if now - self._last_log >= self._log_every:
            self._last_log = now
            print(f"{self.label}: {self.snapshot().describe()}", file=self._stream, flush=True)

    def close(self) -> None:
        self.finish()


STARTUP_SECONDS = 300.0  # imports and the weight plan, before a seed can write anything


class StallWatchdog:
    """Says a seed stalled once nothing was written for ``timeout`` seconds (tt-inference-server 1473).

    The clock starts at the seed's ``start`` call; before it (imports, reading the checkpoint's
    headers: seconds on a loaded machine) the allowance is ``max(timeout, STARTUP_SECONDS)``."""

    def __init__(self, timeout: float | None, startup: float = STARTUP_SECONDS) -> None:
        self.timeout = timeout
        self.startup = None if timeout is None else max(timeout, startup)

    def check(self, snapshot: ProgressSnapshot) -> str | None:
        if self.timeout is None:
            return None
        if not snapshot.started:
            if snapshot.elapsed < self.startup:
                return None
            return f"the seed did not start writing within {snapshot.elapsed:.0f} s"
        if snapshot.idle < self.timeout:
            return None
        last = f"last weight written: {snapshot.last_weight}" if snapshot.last_weight else "no weight written yet"
        return (f"nothing written for {snapshot.idle:.0f} s (--stall-timeout {self.timeout:g}); {last} "
                f"({snapshot.weights_done}/{snapshot.total_weights or '?'} weights)")
