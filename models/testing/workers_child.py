# SPDX-License-Identifier: Apache-2.0
"""Cold builds on several conversion workers in a child process, for the workers' failure tests.

``python -m models.testing.workers_child descriptors CHECKPOINT CACHE_ROOT WORKERS LIMIT...``: for each
``LIMIT`` (extra descriptors over those open before the build, or ``none``), set ``RLIMIT_NOFILE`` to
it and seed the checkpoint, in this one process; one line ``BUILD {json}`` per build (its outcome,
its first error, its seconds, what the cache dir holds after it, and whether the build lock is free).

``python -m models.testing.workers_child interrupt CHECKPOINT CACHE_ROOT WORKERS PRECISION``: first the
time one chunk of the LM head takes to convert here, as the build converts it (``CHUNK {json}``), then
a seed that the parent interrupts; ``STOPPED {json}`` once the interrupt reached this process's code.
"""

from __future__ import annotations

import fcntl
import json
import os
import resource
import signal
import sys
import time
from pathlib import Path

from models.common.device_env import ensure_host_cluster


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def lock_is_free(lock: Path) -> bool:
    """Whether another open of the build lock can take it now (flock: per open file, even here)."""
    if not lock.exists():
        return True
    fd = os.open(lock, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def _loader(checkpoint: str, cache_root: str, workers: int, precision: str = "bfloat16"):
    from models.common.checkpoint import read_config, resolve_checkpoint_dir
    from models.registry import family_of, loader_class

    family = family_of(read_config(resolve_checkpoint_dir(checkpoint)))
    return loader_class(family)(checkpoint, precision=precision, cache_root=cache_root, workers=workers, force=True)


def descriptors(checkpoint: str, cache_root: str, workers: int, limits: list[str]) -> None:
    import torch
    import ttnn

    loader = _loader(checkpoint, cache_root, workers)
    # ttnn opens descriptors of its own on its first conversion (its MPI context): before the limits
    ttnn.from_torch(torch.zeros(32, 32, dtype=torch.bfloat16), dtype=ttnn.bfloat8_b, layout=ttnn.TILE_LAYOUT)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    base = open_descriptors()
    for limit in limits:
        soft = hard if limit == "none" else base + int(limit)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        start = time.perf_counter()
        report: dict = {"limit": limit}
        try:
            result = loader.seed()
            report |= {"complete": result.complete}
        except Exception as error:  # noqa: BLE001 - the test reads the first error
            report |= {"complete": False, "error": f"{type(error).__name__}: {error}"}
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        report |= {"seconds": time.perf_counter() - start, "lock_free": lock_is_free(loader.paths.build_lock),
                   "left": sorted(p.name for p in loader.cache_dir.iterdir()) if loader.cache_dir.exists() else []}
        print("BUILD " + json.dumps(report), flush=True)


def chunk_seconds(checkpoint: str, loader) -> float:
    """Seconds ``ttnn.from_torch`` takes for one chunk (``BLOCK_BYTES`` of source) of the LM head as
    the build converts it: columns of the transposed head, in TILE layout at the loader's precision
    (the median of three)."""
    import ttnn

    from models.common.safetensors_file import CheckpointReader
    from models.common.weight_cache.tensorbin import BLOCK_BYTES

    reader = CheckpointReader(Path(checkpoint), loader.key_rules)
    try:
        head = reader.get("output.weight")
        columns = max(32, BLOCK_BYTES // (head.shape[1] * head.element_size()) // 32 * 32)
        chunk = head.transpose(0, 1)[:, :columns]
        times = []
        for _ in range(3):
            start = time.perf_counter()
            ttnn.from_torch(chunk, dtype=loader.precision_dtype(), layout=ttnn.TILE_LAYOUT)
            times.append(time.perf_counter() - start)
    finally:
        reader.close()
    return sorted(times)[1]


def interrupt(checkpoint: str, cache_root: str, workers: int, precision: str) -> None:
    loader = _loader(checkpoint, cache_root, workers, precision)
    print("CHUNK " + json.dumps({"seconds": chunk_seconds(checkpoint, loader)}), flush=True)
    # Ctrl-C as in a terminal, whatever this process inherited: a job a shell without job control
    # starts in the background gets SIGINT ignored (Python then installs no handler), and a parent
    # that blocked it in its main thread passes the blocked mask on through exec.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        loader.seed()
    except KeyboardInterrupt:
        print("STOPPED " + json.dumps({"at": time.time(), "lock_free": lock_is_free(loader.paths.build_lock)}),
              flush=True)
        sys.exit(130)
    print("STOPPED " + json.dumps({"at": None}), flush=True)  # the seed ended before the interrupt


def main() -> None:
    mode, checkpoint, cache_root, workers, *rest = sys.argv[1:]
    ensure_host_cluster()
    if mode == "descriptors":
        descriptors(checkpoint, cache_root, int(workers), rest)
    elif mode == "interrupt":
        interrupt(checkpoint, cache_root, int(workers), *rest)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
