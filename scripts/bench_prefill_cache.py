#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Benchmark of models.common.prefill_cache on this machine's disk.

Measures, interleaved in one run so that a noisy machine hits both sides of every ratio alike:

* lookup of an unchanged 1 MiB object: the first lookup (full SHA-256 validation) against later
  lookups (validation proof reused: four ``stat`` calls and three ``mmap``s);
* ``store_batch_boundary`` of 64 rows against 64 ``store_boundary`` calls;
* bytes/s of ``store_boundary`` and of a first lookup against the physical limit: a plain
  ``write`` + ``fsync`` and a plain ``read`` of the same bytes;
* the in-memory tier's protection of hits against in-place changes: a hit served as read-only
  views (what ``BaseForwardCache`` does) against a hit served as private copies, for entries of
  64 KiB to 64 MiB, plus what a view costs its consumer per torch operation.

Files are in the page cache for both a first lookup and the plain read (dropping caches needs
root); the benchmark compares like with like. Usage::

    .venv/bin/python scripts/bench_prefill_cache.py [--dir /path/on/the/disk] [--repeats 15] \
        [--json docs/bench_prefill_cache.json] [--png docs/bench_prefill_cache.png]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from _bench_output import Panel, figure, write_json  # noqa: E402
from loguru import logger  # noqa: E402

from models.common import prefill_cache as pc  # noqa: E402
from models.common.prefill_cache import sidecar as pc_sidecar  # noqa: E402
from models.common.fileio import write_all  # noqa: E402
from models.common.measure import peak_rss_mib  # noqa: E402
from models.testing.prefill_factories import row  # noqa: E402

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
        pc_sidecar._clear_validation_proofs()
        samples["first_lookup"].append(timed(sidecar.lookup_boundary))
        samples["read"].append(timed(lambda: plain_read(sidecar.paths.artifacts)))
    return samples


def bench_hot_lookup(root: Path, repeats: int, ids: Counter) -> tuple[list[float], list[float], int]:
    (index,) = ids.take(1)
    sidecar, features = row(root, index, **BIG)
    sidecar.store_boundary(features)
    time.sleep(pc_sidecar._RACY_WINDOW_NS / 1e9 + 0.1)  # proofs are kept only for settled files
    first, later = [], []
    for _ in range(repeats):
        pc_sidecar._clear_validation_proofs()
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


HIT_SIZES = {"64 KiB": (1, 16, 1024), "4 MiB": (1, 64, 16384), "64 MiB": (1, 256, 65536)}  # fp32 logits


def _entry(logits_shape: tuple[int, ...]) -> pc.BaseForwardCacheEntry:
    hidden = torch.randn(1, logits_shape[1], 640)
    return pc.BaseForwardCacheEntry.from_forward_boundary(
        hidden=hidden, logits=torch.randn(*logits_shape), parent_context_hidden=hidden,
        parent_expert_routes=torch.zeros(1, 1, dtype=torch.long), parent_layer_routes=torch.zeros(1, 1),
        kv_prefix_positions=torch.arange(1), kv_new_positions=torch.arange(logits_shape[1]),
        parent_prefill_hidden=None, parent_prefill_input_positions=None, sha16="bench",
    )


def bench_hit_protection(repeats: int) -> dict[str, dict[str, float]]:
    """Median seconds per hit: read-only views vs private copies; and one log_softmax on a view
    vs on a plain tensor (the per-operation cost a view adds for its consumer)."""
    results = {}
    for label, shape in HIT_SIZES.items():
        cache = pc.BaseForwardCache(capacity=2)
        cache.store("k", _entry(shape))
        stored = cache._entries["k"]
        view_s, copy_s, op_view_s, op_plain_s = [], [], [], []
        for _ in range(repeats):
            view_s.append(timed(lambda: cache.lookup("k")))
            copy_s.append(timed(lambda: stored._mapped(lambda t: t.as_subclass(torch.Tensor).clone())))
            hit = cache.lookup("k")
            plain = hit.logits.clone()
            op_view_s.append(timed(lambda: F.log_softmax(hit.logits, dim=-1)))
            op_plain_s.append(timed(lambda: F.log_softmax(plain, dim=-1)))
        med = statistics.median
        results[label] = dict(entry_bytes=stored.nbytes, view_s=med(view_s), copy_s=med(copy_s),
                              op_on_view_s=med(op_view_s), op_on_plain_s=med(op_plain_s))
    return results


def write_png(path: Path, report: dict) -> None:
    """The durable tier's costs (ms, log) beside what protecting an in-memory hit costs per size."""
    med, hits = report["medians_s"], report["hit_protection"]
    durable = {"first lookup": med["first_lookup"], "later lookup": med["later_lookup"], "store 1 MiB": med["store"],
               "write+fsync": med["write_fsync"]}
    figure(path, [
        Panel("bars", {"1 MiB object": {k: v * 1e3 for k, v in durable.items()}}, title="durable tier, 1 MiB object",
              ylabel="ms (median, log scale)", log=True),
        Panel("lines", {"hit as private copies": {size: h["copy_s"] * 1e6 for size, h in hits.items()},
                        "hit as read-only views": {size: h["view_s"] * 1e6 for size, h in hits.items()}},
              title="in-memory tier: protecting a hit", ylabel="us per hit (median, log scale)", log=True),
    ])


def mib_per_s(size: int, seconds: float) -> str:
    return f"{size / seconds / MIB:,.0f} MiB/s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir in /tmp)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--png", type=Path, help="also plot them here")
    args = parser.parse_args()
    logger.remove()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-prefill-") as temp:
        root, ids = Path(temp), Counter()
        row(root, 0, **BIG)[0].store_boundary(row(root, 0, **BIG)[1])  # warm imports and paths
        ids.take(1)
        first, later, size = bench_hot_lookup(root, args.repeats, ids)
        io = bench_store_and_first_lookup(root, args.repeats, ids)
        batch = bench_batch(root, max(3, args.repeats // 3), ids)
    hits = bench_hit_protection(args.repeats)
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
    print("\nIn-memory hits (`BaseForwardCache.lookup`), protected against in-place changes:\n")
    print("| entry | hit as read-only views | hit as private copies | copies / views | "
          "`log_softmax` on a view / on a plain tensor |")
    print("| --- | --- | --- | --- | --- |")
    for label, h in hits.items():
        print(f"| {label} logits ({h['entry_bytes'] / MIB:.2f} MiB in all) | {h['view_s'] * 1e6:.1f} us | "
              f"{h['copy_s'] * 1e6:.1f} us | **{h['copy_s'] / h['view_s']:.1f}x** | "
              f"{h['op_on_view_s'] * 1e6:.1f} / {h['op_on_plain_s'] * 1e6:.1f} us |")
    report = {
        "object_bytes": size,
        "repeats": args.repeats,
        "medians_s": {
            "first_lookup": med(first), "later_lookup": med(later), "store": med(io["store"]),
            "write_fsync": med(io["write_fsync"]), "first_lookup_io": med(io["first_lookup"]),
            "read": med(io["read"]), "batch64": med(batch["batch"]), "singles64": med(batch["singles"]),
        },
        "hit_protection": hits,
        "peak_rss_mib": peak_rss_mib(),
    }
    if args.json:
        write_json(args.json, report)
    if args.png:
        write_png(args.png, report)


if __name__ == "__main__":
    main()
