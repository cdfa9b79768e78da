# SPDX-License-Identifier: Apache-2.0
"""Warm starts from a cold page cache: a warm load that then reads every byte, with and without
prefetch, against ``cat`` and parallel ``cat`` of the same files; page cache warm and evicted.

    python scripts/bench_prefetch.py                          # Gemma 3 270M, bfloat8_b
    python scripts/bench_prefetch.py --model /path/to/checkpoint --precision bfloat16

Each case is timed in one run, round-robin over ``--repeat`` rounds (median reported, the
machine is noisy). "Evicted" drops the page cache first (``sync; echo 3 > /proc/sys/vm/drop_caches``,
root only): the loading process has already imported torch and ttnn (its own mapped libraries
stay resident) and waits for the parent to drop the cache before it starts the clock. The
consumer reads every byte of every file of the build (1 MiB copies, in the order the loader
made the tensors: what a device upload moves), then the sidecar. ``cat`` reads the same files;
"parallel cat" runs 4 ``cat`` processes over them round-robin: the parallel-read floor.
Writes JSON and a PNG next to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
from _bench_output import bar_chart, write_json  # noqa: E402

CHILD = r"""
import json, sys, time
from models.common.device_env import ensure_host_cluster
ensure_host_cluster()
import torch, ttnn
from models.common.weight_cache.layout import VariantPaths
from models.common.weight_cache.marker import read_marker
from models.common.weight_cache.tensor_cache import tensorbin_name
from models.registry import family_of, loader_class
from models.common.checkpoint import read_config, resolve_checkpoint_dir
model, precision = sys.argv[1], sys.argv[2]
threads = None if sys.argv[3] == "default" else int(sys.argv[3])
cls = loader_class(family_of(read_config(resolve_checkpoint_dir(model))))
print("READY", flush=True)
sys.stdin.readline()
t0 = time.perf_counter()
loaded = cls(model, precision=precision, prefetch=threads).load()
assert loaded.warm, loaded.reason
t_load = time.perf_counter() - t0
marker = read_marker(VariantPaths(loaded.cache_dir, cls(model, precision=precision).build_variant))
root = loaded.cache_dir / (marker.generation or "")
paths = [root / tensorbin_name(name, loaded.formats[name]) for name in loaded.weights]
if marker.host_sidecar:
    paths.append(loaded.cache_dir / marker.host_sidecar.path)
sys.path.insert(0, "scripts")
from bench_prefetch import consume
total = consume([str(p) for p in paths])
print("RESULT " + json.dumps({"load": t_load, "total": time.perf_counter() - t0, "bytes": total,
                              "files": [str(p) for p in paths]}), flush=True)
"""


def consume(files: list[str]) -> int:
    """Every byte of every file, in order, copied 1 MiB at a time through a mapping of the file
    (what a device upload of ttnn's mapped tensors does); returns the bytes copied."""
    chunk = memoryview(bytearray(1 << 20))
    total = 0
    for path in files:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mapped:
            source = memoryview(mapped)
            for start in range(0, len(mapped), len(chunk)):
                piece = source[start:start + len(chunk)]
                chunk[:len(piece)] = piece
                total += len(piece)
            del source, piece
    return total


def drop_page_cache() -> None:
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def warm_read(model: str, precision: str, threads: int | None, evict: bool, env: dict) -> dict:
    """A warm load then every byte read, in a fresh process; ``threads``: prefetch threads (None:
    the loader's default, 0: off)."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD, model, precision, "default" if threads is None else str(threads)], env=env, cwd=REPO,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    while (line := proc.stdout.readline()) and not line.startswith("READY"):
        pass
    if evict:
        drop_page_cache()
    proc.stdin.write("go\n")
    proc.stdin.flush()
    out, _ = proc.communicate(timeout=600)
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"warm read failed ({proc.returncode})")
    return json.loads(lines[-1][7:])


def cat(files: list[str], parallel: int, evict: bool) -> float:
    if evict:
        drop_page_cache()
    start = time.perf_counter()
    groups = [files[i::parallel] for i in range(parallel)]
    procs = [subprocess.Popen(["cat", *group], stdout=subprocess.DEVNULL) for group in groups if group]
    for proc in procs:
        proc.wait()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--precision", default="bfloat8_b")
    parser.add_argument("--threads", type=int, default=None, help="prefetch threads (default: the loader's)")
    parser.add_argument("--readers", type=int, default=4, help="parallel cat processes: the parallel-read floor")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cache-root", type=Path, default=Path("/tmp/tt-bench-prefetch"))
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "bench_prefetch.json")
    opts = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("evicting the page cache needs root (echo 3 > /proc/sys/vm/drop_caches)")
    model = opts.model
    if model == "gemma3-270m":
        from models.demos.real_models.prepare import prepare_gemma3_270m

        model = str(prepare_gemma3_270m())
    env = dict(os.environ, TT_CACHE_PATH=str(opts.cache_root), HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    env.pop("TT_TRANSFORMERS_FORCE_MODEL_LOAD", None)
    seed = ("from models.common.device_env import ensure_host_cluster; ensure_host_cluster()\n"
            "import sys; from models.registry import family_of, loader_class\n"
            "from models.common.checkpoint import read_config, resolve_checkpoint_dir\n"
            "m, p = sys.argv[1:3]; print(loader_class(family_of(read_config(resolve_checkpoint_dir(m))))(m, precision=p).seed())")
    subprocess.run([sys.executable, "-c", seed, model, opts.precision], env=env, cwd=REPO, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    files = warm_read(model, opts.precision, 0, False, env)["files"]
    size = sum(os.stat(f).st_size for f in files)
    print(f"{model} {opts.precision}: {len(files)} files, {size / 2**20:.0f} MiB, {opts.repeat} rounds, "
          f"{opts.threads or 'default'} prefetch threads, {opts.readers} readers, {os.cpu_count()} cores")
    samples: dict[str, list[float]] = {}
    for _ in range(opts.repeat):
        for evict in (False, True):
            where = "evicted" if evict else "warm"
            samples.setdefault(f"cat/{where}", []).append(cat(files, 1, evict))
            samples.setdefault(f"parallel cat/{where}", []).append(cat(files, opts.readers, evict))
            for case, threads in (("no prefetch", 0), ("prefetch", opts.threads)):
                result = warm_read(model, opts.precision, threads, evict, env)
                samples.setdefault(f"load+read, {case}/{where}", []).append(result["total"])
                samples.setdefault(f"load, {case}/{where}", []).append(result["load"])  # the warm load() alone
    medians = {case: statistics.median(values) for case, values in samples.items()}
    print("\n| case | page cache warm s | evicted s |\n| --- | --- | --- |")
    for case in ("cat", "parallel cat", "load+read, no prefetch", "load+read, prefetch"):
        print(f"| {case} | {medians[case + '/warm']:.3f} | {medians[case + '/evicted']:.3f} |")
    floor = medians["parallel cat/evicted"]
    ratios = {
        "evicted prefetch / parallel cat": medians["load+read, prefetch/evicted"] / floor,
        "evicted no prefetch / parallel cat": medians["load+read, no prefetch/evicted"] / floor,
        "warm prefetch / warm no prefetch": medians["load+read, prefetch/warm"] / medians["load+read, no prefetch/warm"],
    }
    print("\n| ratio | measured | target |\n| --- | --- | --- |")
    print(f"| evicted, prefetch / parallel-read floor | {ratios['evicted prefetch / parallel cat']:.2f}x | <= 1.2x |")
    print(f"| evicted, no prefetch / parallel-read floor | {ratios['evicted no prefetch / parallel cat']:.2f}x | |")
    print(f"| page cache warm, prefetch / no prefetch | {ratios['warm prefetch / warm no prefetch']:.2f}x | ~1.0x (no slowdown) |")
    print("\n| warm `load()` in-process, ms | page cache warm | evicted |\n| --- | --- | --- |")
    for case in ("no prefetch", "prefetch"):
        print(f"| {case} | {medians[f'load, {case}/warm'] * 1e3:.1f} | {medians[f'load, {case}/evicted'] * 1e3:.1f} |")
    write_json(opts.out, {"model": model, "precision": opts.precision, "bytes": size, "samples": samples,
                          "medians": medians, "ratios": ratios})
    plot(medians, size, opts.out.with_suffix(".png"), f"{Path(model).name} {opts.precision}")


def plot(medians: dict[str, float], size: int, path: Path, title: str) -> None:
    cases = ["cat", "parallel cat", "load+read, no prefetch", "load+read, prefetch"]
    groups = {case: {f"page cache {where}": medians[f"{case}/{where}"] for where in ("warm", "evicted")}
              for case in cases}
    bar_chart(path, groups, title=f"{title}: every byte of {size / 2**20:.0f} MiB read",
              ylabel="seconds (median)", value_format="{:.2f}")
    print(f"wrote {path} and {path.with_suffix('.json')}")


if __name__ == "__main__":
    main()
