# SPDX-License-Identifier: Apache-2.0
"""Cold conversion on every core: one build's weights converted by several threads of this process.

``ttnn.from_torch``, torch's copies and file writes release the GIL, so threads convert side by side
without a second interpreter and its imports (Ray's fixed start, 11-15 s here; Ray stays the engine
for more than one host). Each worker runs the family's ``convert`` over the whole plan with its own view
of the checkpoint (:class:`~models.common.build_plan.PartState`: placeholders outside its
units), and converts the units it claims: the first worker to reach a unit takes it, so the work is
shared as it comes, in build order, and the files are the ones a single worker writes, byte for byte.
The workers share one :class:`~models.common.safetensors_file.CheckpointReader`'s mappings, each
shard mapped when first read: a 191-shard checkpoint holds 191 mappings on any number of workers,
all through the build's one :class:`~models.common.weight_cache.checkpoint_proof.ProvenCheckpoint`
(the bytes its content id names).

A worker with no unit left converts chunks of the large weights others are still writing block by
block (:mod:`~models.common.weight_cache.chunk_board`): the build's last large weight, an LM head,
is not converted by one core while the rest idle.

Memory: a worker holds one unit at a time, streaming as a seed does. A large weight is written block
by block (:mod:`~models.common.weight_cache.tensorbin`), so what a worker holds is a few chunks, or a
weight small enough to be converted whole (a fused QKV: about 0.5 GB at Llama-70B shapes). The bound
is the one-worker bound plus that much per further worker.

How many: ``workers=``, else ``$TT_CONVERT_WORKERS`` (both accept what the ``envs`` table declares),
else one per CPU this process may use (:func:`~models.common.cpus.usable_cpus`: its affinity mask
and its cgroup's CPU quota); then never more than the plan has units of work (:func:`fit_workers`).

The rule of a failure: whatever ends a worker (its reader cannot open a shard, a conversion
raises, an interrupt reaches the build's thread) stops the build: it leaves the chunk board in
any case (no helper waits for it), it sets the stop every other worker looks at before each unit
and each chunk, and the first real error is raised once all have stopped; the caller's
transaction then removes what they wrote and lets the build lock go.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, wait

from models.common import envs
from models.common.build_plan import PlannedWeight
from models.common.converter import Build, Converted, convert_units, streaming_cache
from models.common.cpus import usable_cpus
from models.common.weight_cache.chunk_board import BuildStopped, ChunkBoard
from models.common.weight_cache.tensor_cache import STREAM_BLOCKS_FROM, TensorCache, conversion_threads
from models.common.weight_cache.tensorbin import BLOCK_BYTES


def convert_workers(requested: int | None) -> int:
    """Workers for a cold build: ``requested``, else ``$TT_CONVERT_WORKERS``, else one per CPU this
    process may use. A bad value is a ``ValueError`` naming the argument or the variable."""
    if requested is not None:
        requested = envs.CONVERT_WORKERS.check("workers=", requested)
    else:
        requested = envs.TT_CONVERT_WORKERS
    return max(1, requested if requested is not None else usable_cpus())


def units_of_work(plan: Sequence[PlannedWeight]) -> int:
    """What workers can share: each unit, and each further chunk of a weight written block by block
    (an idle worker converts those beside its poster)."""
    extra_chunks = sum(-(-w.input_bytes // BLOCK_BYTES) - 1 for w in plan if w.input_bytes >= STREAM_BLOCKS_FROM)
    return len({w.unit for w in plan}) + extra_chunks


def fit_workers(workers: int, plan: Sequence[PlannedWeight]) -> int:
    """No more workers than the plan has units of work: one more would only wait."""
    return max(1, min(workers, units_of_work(plan)))


class WorkerFailed(BuildStopped):
    """Another worker of the same build failed: this one stops at its next unit."""


class _Claims:
    """Which worker converts each unit: the first to reach it. Once a worker failed, the rest stop."""

    def __init__(self) -> None:
        self._taken: set[int] = set()
        self._lock = threading.Lock()
        self.failed = threading.Event()

    def claim(self, unit: int) -> bool:
        if self.failed.is_set():
            raise WorkerFailed("another conversion worker of this build failed")
        with self._lock:
            if unit in self._taken:
                return False
            self._taken.add(unit)
            return True


class ThreadsConverter:
    """Converts a streaming build's weights on at most ``workers`` threads (fitted to the plan),
    each reading the checkpoint through the build's proof (a reader sharing the build's mappings),
    each running :func:`~models.common.converter.convert_units`. The first error of any worker is
    raised once all have stopped; the build's transaction then removes what they wrote."""

    def __init__(self, workers: int) -> None:
        self.workers = workers

    def convert(self, build: Build) -> Converted:
        loader, plan = build.loader, build.plan
        workers = fit_workers(self.workers, plan)
        claims = _Claims()
        board = ChunkBoard(workers, stop=claims.failed)
        caches: list[TensorCache] = []

        def work(_: int) -> list[str]:
            try:
                with contextlib.ExitStack() as held:
                    with board.worker():  # left whatever ends the worker: no helper waits for it
                        cache = held.enter_context(streaming_cache(loader, build.root, on_written=build.on_written,
                                                                   chunk_board=board))
                        caches.append(cache)
                        convert_units(loader, build.args, build.reader.sharing_maps(), cache, plan, claims.claim)
                    board.help()  # no unit left: the chunks of the large weights others still convert
                    return cache.finish()
            except BaseException:
                claims.failed.set()
                raise

        start = time.perf_counter()
        pool = ThreadPoolExecutor(workers, thread_name_prefix="convert-worker")
        try:
            with conversion_threads():
                futures = [pool.submit(work, i) for i in range(workers)]
                wait(futures)
        except BaseException:  # Ctrl-C, or a seeding job's SIGTERM, in this thread: the workers stop too
            claims.failed.set()
            raise
        finally:
            pool.shutdown(wait=True)
        converted_at = time.perf_counter()
        errors = [f.exception() for f in futures if f.exception() is not None]
        if errors:
            raise next((e for e in errors if not isinstance(e, BuildStopped)), errors[0])
        timings = {"convert": converted_at - build.start, "workers": workers, "workers_wall": converted_at - start,
                   "from_torch": sum(c.convert_seconds for c in caches),
                   "writer_wait": sum(c.wait_seconds for c in caches), "dump": sum(c.dump_seconds for c in caches),
                   "fsync": sum(c.fsync_seconds for c in caches)}
        return Converted([path for f in futures for path in f.result()],
                         [e for cache in caches for e in cache.write_errors], timings)
