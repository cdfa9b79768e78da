#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Benchmark the warm ttnn weight cache (models/common/weight_cache/); prints a markdown table.

1. Gate latency on a cache of N real tensorbins (default 10,000): a fresh process times its first
   ``weight_cache_status`` call (marker parse + one ``stat`` per file) and the median of repeated
   calls (marker memoized, still one ``stat`` per file). Target: median <= 50 ms.
2. Placeholder memory: a ``CachedStateDict`` over 1,000 keys of a llama-2-7B-shaped manifest, every
   placeholder touched (``sd[k]`` plus a reshape and a transpose); added RSS after a warm-up.
   Target: < 1 MB.
3. Content-digest throughput: ``content_digest_file`` (BLAKE3) vs a plain read of the same file
   (page cache warm), and the digest's cost next to a real cold conversion of one 4096x4096 weight.

Memory figures come from ``models.common.measure`` (``VmRSS`` / ``VmHWM`` of the measuring process).
Results also go to ``--out-dir`` as ``bench_weight_cache.json`` and PNG charts.

usage: .venv/bin/python scripts/bench_weight_cache.py [--files 10000] [--keys 1000] [--digest-mib 512]
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

import torch  # noqa: E402
from _bench_output import DEFAULT_OUT_DIR, write_results  # noqa: E402

import models  # noqa: E402,F401  (mock cluster before ttnn)
from models.common import weight_cache as wc  # noqa: E402
from models.common.weight_cache.placeholders import placeholder
from models.common.fileio import HASH_READ_BYTES, content_digest_file  # noqa: E402
from models.common.measure import peak_rss_mib, rss_bytes, run_measured  # noqa: E402

GATE_TARGET_MS = 50.0
RSS_TARGET_BYTES = 1 << 20
MESH = (1, 1)

# llama-2-7B: hidden 4096, intermediate 11008, vocab 32000, 32 layers
LLAMA2_7B_LAYER = {
    "attention.wq.weight": (4096, 4096),
    "attention.wk.weight": (4096, 4096),
    "attention.wv.weight": (4096, 4096),
    "attention.wo.weight": (4096, 4096),
    "feed_forward.w1.weight": (11008, 4096),
    "feed_forward.w2.weight": (4096, 11008),
    "feed_forward.w3.weight": (11008, 4096),
    "attention_norm.weight": (4096,),
    "ffn_norm.weight": (4096,),
}


def seed_many_tensorbins(root: Path, count: int) -> float:
    """Write ``count`` real tensorbins (copies of one ttnn-written 32x32 bfloat16 TILE tensor), nested
    100 per layer dir, and mark the cache; returns the marking time in seconds."""
    import ttnn

    template = root / "template"
    ttnn.as_tensor(
        torch.randn(32, 32).to(torch.bfloat16),
        dtype=ttnn.bfloat16,
        layout=ttnn.TILE_LAYOUT,
        device=None,
        cache_file_name=str(template),
    )
    template_file = root / "template_dtype_BFLOAT16_layout_TILE.tensorbin"
    data = template_file.read_bytes()
    template_file.unlink()
    manifest = {}
    for index in range(count):
        layer, slot = divmod(index, 100)
        directory = root / f"layers.{layer}"
        directory.mkdir(exist_ok=True)
        (directory / f"w{slot}_dtype_BFLOAT16_layout_TILE.tensorbin").write_bytes(data)
        manifest[f"layers.{layer}.w{slot}.weight"] = placeholder((32, 32), torch.bfloat16)
    start = time.perf_counter()
    assert wc.mark_weight_cache_complete(root, manifest, model_name="bench", n_layers=count // 100, mesh_shape=MESH)
    return time.perf_counter() - start


GATE_PROBE = r"""
import statistics, sys, time
import models
from models.common.weight_cache.gate import weight_cache_status
from models.common.weight_cache.layout import VariantPaths
root, layers, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
kwargs = dict(model_name="bench", n_layers=layers, mesh_shape=(1, 1))
start = time.perf_counter()
first = weight_cache_status(VariantPaths(root), **kwargs)
first_ms = (time.perf_counter() - start) * 1e3
times = []
for _ in range(repeats):
    start = time.perf_counter()
    result = weight_cache_status(VariantPaths(root), **kwargs)
    times.append((time.perf_counter() - start) * 1e3)
assert first.warm and result.warm, (first.reason, result.reason)
import os
paths = [os.path.join(root, record.path) for record in result.marker.files]
floor = []
for _ in range(repeats):
    start = time.perf_counter()
    for path in paths:
        os.stat(path)
    floor.append((time.perf_counter() - start) * 1e3)
from models.common.measure import report
report({"first_ms": first_ms, "median_ms": statistics.median(times), "max_ms": max(times),
        "stat_floor_ms": statistics.median(floor)})
"""


def gate_latency(root: Path, count: int, repeats: int) -> dict:
    """The gate in a fresh process (its report carries that process's own peak RSS)."""
    return run_measured([sys.executable, "-c", GATE_PROBE, str(root), str(count // 100), str(repeats)])


def llama_manifest(keys: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    manifest = {"tok_embeddings.weight": ((32000, 4096), torch.bfloat16)}
    layer = 0
    while len(manifest) < keys:
        for name, shape in LLAMA2_7B_LAYER.items():
            if len(manifest) == keys:
                break
            manifest[f"layers.{layer}.{name}"] = (shape, torch.bfloat16)
        layer += 1
    return manifest


def touch_all(sd: wc.CachedStateDict) -> int:
    """``sd[k]`` plus a reshape and a transpose for every key; returns the bytes the weights would hold."""
    would_be = 0
    for key in sd:
        value = sd[key]
        flat = value.reshape(-1)
        turned = value.transpose(0, -1) if value.dim() > 1 else flat
        assert value.is_meta and flat.is_meta and turned.is_meta
        would_be += value.numel() * value.element_size()
    return would_be


def placeholder_rss(keys: int) -> dict:
    touch_all(wc.CachedStateDict(llama_manifest(keys), None))  # warm-up: torch's meta dispatch, allocator
    manifest = llama_manifest(keys)  # the marker's data, already in memory on a warm run
    gc.collect()
    before = rss_bytes()
    sd = wc.CachedStateDict(manifest, None)
    would_be = touch_all(sd)
    gc.collect()
    after = rss_bytes()
    return {"keys": len(sd), "added_rss": after - before, "would_be_bytes": would_be}


def read_throughput(path: Path) -> float:
    buffer = bytearray(HASH_READ_BYTES)
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as stream:
        while stream.readinto(buffer):
            pass
    return time.perf_counter() - start


def digest_throughput(directory: Path, mib: int, repeats: int = 3) -> dict:
    path = directory / "digest.bin"
    chunk = os.urandom(1 << 20)
    with open(path, "wb") as stream:
        for _ in range(mib):
            stream.write(chunk)
    size = path.stat().st_size
    read_throughput(path)  # page cache warm for both
    read_s = min(read_throughput(path) for _ in range(repeats))
    digest_s = []
    for _ in range(repeats):
        start = time.perf_counter()
        content_digest_file(path)
        digest_s.append(time.perf_counter() - start)
    path.unlink()
    return {"bytes": size, "read_gbs": size / read_s / 1e9, "digest_gbs": size / min(digest_s) / 1e9}


def cold_conversion_vs_digest(directory: Path) -> dict:
    """One 4096x4096 weight: ``ttnn.as_tensor`` miss to bfloat8_b TILE (convert + write) vs digesting its file."""
    import ttnn

    weight = torch.randn(4096, 4096).to(torch.bfloat16)
    prefix = directory / "cold"
    start = time.perf_counter()
    ttnn.as_tensor(weight, dtype=ttnn.bfloat8_b, layout=ttnn.TILE_LAYOUT, device=None, cache_file_name=str(prefix))
    convert_s = time.perf_counter() - start
    path = directory / "cold_dtype_BFLOAT8_B_layout_TILE.tensorbin"
    start = time.perf_counter()
    content_digest_file(path)
    digest_s = time.perf_counter() - start
    return {"bytes": path.stat().st_size, "convert_s": convert_s, "digest_s": digest_s}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--digest-mib", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=50, help="gate calls for the median")
    parser.add_argument("--dir", type=Path, default=None, help="scratch dir (default: a temp dir, removed)")
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR, help="JSON + PNG go here (default: %(default)s)")
    args = parser.parse_args()

    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level="WARNING")

    scratch = Path(tempfile.mkdtemp(prefix="bench-wc-", dir=args.dir))
    try:
        cache = scratch / "cache"
        cache.mkdir()
        mark_s = seed_many_tensorbins(cache, args.files)
        gate = gate_latency(cache, args.files, args.repeats)
        rss = placeholder_rss(args.keys)
        digest = digest_throughput(scratch, args.digest_mib)
        cold = cold_conversion_vs_digest(scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    verdict = lambda ok: "met" if ok else "MISSED"  # noqa: E731
    rows = [
        (f"gate, {args.files:,} tensorbins, first call in a fresh process (parse + stat)",
         f"{gate['first_ms']:.1f} ms", ""),
        (f"gate, {args.files:,} tensorbins, median of {args.repeats} calls",
         f"{gate['median_ms']:.1f} ms", f"<= {GATE_TARGET_MS:.0f} ms: {verdict(gate['median_ms'] <= GATE_TARGET_MS)}"),
        (f"floor: bare `os.stat` of the same {args.files:,} paths, median", f"{gate['stat_floor_ms']:.1f} ms", ""),
        (f"mark complete, {args.files:,} tensorbins (hash + marker)", f"{mark_s * 1e3:.0f} ms", ""),
        (f"CachedStateDict, {rss['keys']:,} llama-2-7B keys, every placeholder touched: added RSS",
         f"{rss['added_rss'] / 1024:.0f} KiB (weights would be {rss['would_be_bytes'] / 2**30:.1f} GiB)",
         f"< 1 MB: {verdict(rss['added_rss'] < RSS_TARGET_BYTES)}"),
        (f"plain read, {digest['bytes'] >> 20} MiB file, page cache warm", f"{digest['read_gbs']:.2f} GB/s", ""),
        ("content_digest_file (BLAKE3), same file", f"{digest['digest_gbs']:.2f} GB/s", ""),
        (f"cold as_tensor to bfloat8_b of one 4096x4096 weight ({cold['bytes'] >> 20} MiB written)",
         f"{cold['convert_s'] * 1e3:.0f} ms", ""),
        ("digest of that tensorbin", f"{cold['digest_s'] * 1e3:.1f} ms",
         f"{cold['digest_s'] / cold['convert_s'] * 100:.1f}% of the conversion"),
        ("peak RSS: gate process / this benchmark process (own VmHWM)",
         f"{gate['peak_rss_mib']:.0f} / {peak_rss_mib():.0f} MiB", ""),
    ]
    print("| measurement | result | target |")
    print("| --- | --- | --- |")
    for what, result, target in rows:
        print(f"| {what} | {result} | {target} |")
    print(f"\n({os.cpu_count()} CPUs visible, torch {torch.__version__}, python {sys.version.split()[0]})")
    results = {"files": args.files, "gate": gate, "mark_s": mark_s, "placeholders": rss, "digest": digest,
               "cold_vs_digest": cold, "peak_rss_mib": peak_rss_mib()}
    write_results(args.out_dir, "bench_weight_cache", results, {
        "gate": dict(groups={f"gate, {args.files:,} tensorbins": {
            "first call (fresh process)": gate["first_ms"], "median of later calls": gate["median_ms"],
            "bare os.stat floor": gate["stat_floor_ms"], "target": GATE_TARGET_MS}},
            title="weight-cache gate latency", ylabel="ms", value_format="{:.1f}"),
        "throughput": dict(groups={f"{digest['bytes'] >> 20} MiB file, page cache warm": {
            "plain read": digest["read_gbs"], "BLAKE3 content digest": digest["digest_gbs"]}},
            title="digest vs plain read", ylabel="GB/s", value_format="{:.2f}"),
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
