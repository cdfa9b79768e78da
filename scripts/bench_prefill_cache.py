#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Benchmark of models.common.prefill_cache on this machine's disk.

Measures, interleaved in one run so that a noisy machine hits both sides of every ratio alike:

* lookup of an unchanged 1 MiB object: the first lookup (full SHA-256 validation) against later
  lookups (validation proof reused: four ``stat`` calls and three ``mmap``s);
* ``store_batch_boundary`` of 64 rows against 64 ``store_boundary`` calls;
* bytes/s of ``store_boundary`` and of a first lookup against the physical limit: a plain
  ``write`` + ``fsync`` and a plain ``read`` of the same bytes.

Files are in the page cache for both a first lookup and the plain read (dropping caches needs
root); the benchmark compares like with like. Results also go to ``--out-dir`` as
``bench_prefill_cache.json`` and PNG charts, with this process's peak RSS (``VmHWM``). Usage::

    .venv/bin/python scripts/bench_prefill_cache.py [--dir /path/on/the/disk] [--repeats 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from _bench_output import DEFAULT_OUT_DIR, write_results  # noqa: E402
from loguru import logger  # noqa: E402

from models.common import prefill_cache as pc  # noqa: E402
from models.common.fileio import write_all  # noqa: E402
from models.common.measure import peak_rss_mib  # noqa: E402
from tests.ttnn.helpers.prefill_factories import row  # noqa: E402

MIB = 1 << 20
BIG = dict(hidden=2048, positions=256)  # bf16 summary [1, 256, 2048] = 1 MiB (+ 4 KiB final)
SMALL = dict(hidden=1024, positions=8)  # 16 KiB summary per row, for the 64-row wave


def timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def object_bytes(sidecar: pc.FrozenBackboneFeatureSidecar) -> int:
    return sum(path.stat().st_size for path in sidecar.paths.artifacts)


def plain_write_fsync(path: Path, payload: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, payload)
        os.fsync(fd)
    finally:
        os.close(fd)


def plain_read(paths: tuple[Path, ...]) -> None:
    for path in paths:
        with open(path, "rb", buffering=0) as stream:
            while stream.read(MIB):
                pass


class Counter:
    """Hands out fresh object indices so every store writes a new object."""

    def __init__(self) -> None:
        self.next = 0

    def take(self, count: int) -> range:
        start, self.next = self.next, self.next + count
        return range(start, start + count)


def bench_store_and_first_lookup(root: Path, repeats: int, ids: Counter) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {"store": [], "write_fsync": [], "first_lookup": [], "read": []}
    for _ in range(repeats):
        (index,) = ids.take(1)
        sidecar, features = row(root, index, **BIG)
        samples["store"].append(timed(lambda: sidecar.store_boundary(features)))
        payload = b"".join(path.read_bytes() for path in sidecar.paths.artifacts)
        samples["write_fsync"].append(timed(lambda: plain_write_fsync(root / f"plain-{index}.bin", payload)))
        pc._clear_validation_proofs()
        samples["first_lookup"].append(timed(sidecar.lookup_boundary))
        samples["read"].append(timed(lambda: plain_read(sidecar.paths.artifacts)))
    return samples


def bench_hot_lookup(root: Path, repeats: int, ids: Counter) -> tuple[list[float], list[float], int]:
    (index,) = ids.take(1)
    sidecar, features = row(root, index, **BIG)
    sidecar.store_boundary(features)
    time.sleep(pc._RACY_WINDOW_NS / 1e9 + 0.1)  # proofs are kept only for settled files
    first, later = [], []
    for _ in range(repeats):
        pc._clear_validation_proofs()
        first.append(timed(sidecar.lookup_boundary))
        later.extend(timed(sidecar.lookup_boundary) for _ in range(10))
    return first, later, object_bytes(sidecar)


def bench_batch(root: Path, repeats: int, ids: Counter, rows: int = 64) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {"batch": [], "singles": []}
    for repeat in range(repeats):
        order = ("batch", "singles") if repeat % 2 == 0 else ("singles", "batch")
        for kind in order:
            wave = tuple(row(root, index, **SMALL) for index in ids.take(rows))
            if kind == "batch":
                samples[kind].append(timed(lambda: pc.FrozenBackboneFeatureSidecar.store_batch_boundary(wave)))
            else:
                samples[kind].append(timed(lambda: [sidecar.store_boundary(p) for sidecar, p in wave]))
    return samples


def mib_per_s(size: int, seconds: float) -> str:
    return f"{size / seconds / MIB:,.0f} MiB/s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir in /tmp)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR, help="JSON + PNG go here (default: %(default)s)")
    args = parser.parse_args()
    logger.remove()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-prefill-") as temp:
        root, ids = Path(temp), Counter()
        row(root, 0, **BIG)[0].store_boundary(row(root, 0, **BIG)[1])  # warm imports and paths
        ids.take(1)
        first, later, size = bench_hot_lookup(root, args.repeats, ids)
        io = bench_store_and_first_lookup(root, args.repeats, ids)
        batch = bench_batch(root, max(3, args.repeats // 3), ids)
    med = statistics.median
    print(f"object: {size:,} bytes of features ({size / MIB:.3f} MiB); median of {args.repeats} runs\n")
    print("| measurement | median | ratio |")
    print("| --- | --- | --- |")
    print(f"| first lookup (full SHA-256 validation) | {med(first) * 1e3:.3f} ms | |")
    print(f"| later lookup (proof reused) | {med(later) * 1e6:.0f} us | "
          f"**{med(first) / med(later):.0f}x** faster than first |")
    print(f"| `store_boundary`, 1 MiB object | {med(io['store']) * 1e3:.2f} ms = "
          f"{mib_per_s(size, med(io['store']))} | {med(io['write_fsync']) / med(io['store']):.2f}x "
          "of plain write+fsync |")
    print(f"| plain `write` + `fsync`, same bytes | {med(io['write_fsync']) * 1e3:.2f} ms = "
          f"{mib_per_s(size, med(io['write_fsync']))} | (physical limit) |")
    print(f"| first lookup, 1 MiB object | {med(io['first_lookup']) * 1e3:.3f} ms = "
          f"{mib_per_s(size, med(io['first_lookup']))} | {med(io['read']) / med(io['first_lookup']):.2f}x "
          "of plain read |")
    print(f"| plain `read`, same bytes (page cache) | {med(io['read']) * 1e3:.3f} ms = "
          f"{mib_per_s(size, med(io['read']))} | (physical limit) |")
    print(f"| `store_batch_boundary`, 64 rows of 16 KiB | {med(batch['batch']) * 1e3:.1f} ms | "
          f"**{med(batch['singles']) / med(batch['batch']):.1f}x** faster than singles |")
    print(f"| 64 x `store_boundary`, same rows | {med(batch['singles']) * 1e3:.1f} ms | |")
    print(f"| peak RSS of this benchmark process (own VmHWM) | {peak_rss_mib():.0f} MiB | |")
    medians = {"hot_first_lookup": med(first), "hot_later_lookup": med(later),
               **{name: med(values) for name, values in io.items()}, **{name: med(values) for name, values in batch.items()}}
    ms = {name: value * 1e3 for name, value in medians.items()}
    write_results(args.out_dir, "bench_prefill_cache", {"object_bytes": size, "repeats": args.repeats,
                                                         "median_s": medians, "peak_rss_mib": peak_rss_mib()}, {
        "": dict(groups={
            "lookup, 1 MiB object": {"first (SHA-256)": ms["hot_first_lookup"], "later (proof reused)": ms["hot_later_lookup"],
                                     "plain read": ms["read"]},
            "store, 1 MiB object": {"store_boundary": ms["store"], "plain write + fsync": ms["write_fsync"]},
            "store, 64 rows of 16 KiB": {"store_batch_boundary": ms["batch"], "64 x store_boundary": ms["singles"]},
        }, title=f"prefill cache, median of {args.repeats}, page cache warm", ylabel="ms (log scale)", log=True),
    })


if __name__ == "__main__":
    main()
