# SPDX-License-Identifier: Apache-2.0
"""The single-process streaming seed: ``WeightLoader.seed()``.

A cold build that returns host tensors (``load()``) holds every converted weight until it
returns: peak memory grows with the model (import + about 1.9x the checkpoint measured here).
A seed only wants the cache, so it streams: each weight is read from the mapped checkpoint,
converted, queued to the writer (at most one write in flight), dropped, and its checkpoint pages
are released from the process and the page cache. Peak memory is then the import plus a few
copies of the largest single weight, whatever the model's size. Same files, digests and marker
as ``load()``'s cold build: it is the same code path with keeping turned off.
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loguru import logger

if TYPE_CHECKING:
    from models.common.loader import WeightLoader


@dataclass(frozen=True)
class SeedResult:
    """How a seed went. ``warm``: the cache was already complete and nothing was built;
    ``reason``: the gate's verdict before seeding; ``complete``: the cache is warm now."""

    cache_dir: Path
    warm: bool
    reason: str
    complete: bool
    files: int
    bytes_written: int
    seconds: float
    timings: dict[str, float] = field(default_factory=dict)  # phases, where a seeder reports them


class _Counter:
    """Sums what was written and forwards each weight to the caller's progress object."""

    def __init__(self, progress: Any) -> None:
        self.progress = progress
        self.files = 0
        self.bytes = 0

    def __call__(self, name: str, nbytes: int) -> None:
        self.files += 1
        self.bytes += nbytes
        if self.progress is not None:
            self.progress.weight_done(name, nbytes)


MMAP_THRESHOLD_BYTES = 4 << 20
_M_MMAP_THRESHOLD = -3  # glibc mallopt parameter


def return_freed_buffers() -> None:
    """Make glibc give every freed buffer of 4 MiB or more back to the system at once.

    By default glibc raises its mmap threshold each time a large buffer is freed (up to 32 MiB),
    after which weight-sized buffers come from the heap, whose freed space is kept: measured
    here, about 100 MiB more peak RSS for a 2.5 GB than for a 0.6 GB streaming seed. A fixed
    threshold stops that. Process-wide and harmless elsewhere; a no-op off glibc."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    except (OSError, AttributeError):
        pass


def seed_streaming(loader: WeightLoader, progress: Any = None) -> SeedResult:
    """Make ``loader``'s cache warm with memory flat in model size (see the module doc)."""
    from models.seeding.weights import plan_weights

    return_freed_buffers()
    start = time.perf_counter()
    args = loader.make_args(loader.model_config(), loader.num_layers)
    status = loader.status(args)
    if status.warm:
        logger.info(f"{loader.model_name}: cache {loader.cache_dir} is warm; nothing to seed")
        return SeedResult(loader.cache_dir, True, status.reason, True, 0, 0, time.perf_counter() - start)
    counter = _Counter(progress)
    if progress is not None:
        plan = plan_weights(loader, args)
        progress.start(len(plan), sum(w.estimated_bytes for w in plan))
    loaded = loader._load_cold(args, status.reason, start, stream=True, on_written=counter)
    after = loader.status(args)
    if progress is not None:
        progress.finish()
    sidecar = after.marker.host_sidecar if after.warm and after.marker is not None else None
    seconds = time.perf_counter() - start
    logger.info(f"{loader.model_name}: seeded {counter.files} files, {counter.bytes / 2**20:,.0f} MiB "
                f"in {seconds:.2f} s ({'warm' if after.warm else 'not complete: ' + after.reason})")
    return SeedResult(loaded.cache_dir, loaded.warm, status.reason, after.warm,
                      counter.files + (sidecar is not None), counter.bytes + (sidecar.bytes if sidecar else 0), seconds)
