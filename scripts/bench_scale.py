# SPDX-License-Identifier: Apache-2.0
"""Scale figures of one real model, every figure side by side with its reference in one run.

    python scripts/bench_scale.py --model qwen2.5-coder-1.5b          # bfloat8_b and bfloat16 caches
    python scripts/bench_scale.py --model gemma3-270m --repeat 3
    python scripts/bench_scale.py --from-json docs/bench_scale-gemma3-270m.json   # ratios and charts again
    python scripts/bench_scale.py --from-json docs/bench_scale-*.json --readme     # docs/scale.md's tables

For each precision, every timed thing in a fresh process (the other ``scripts/bench_*.py`` hold
the cases; this script runs them together on one real checkpoint):

* **build** (``bench_seeding.run``, checkpoint pages warm, imports excluded): the cold ``load()``
  (weights kept), the streaming ``seed()``, and the Ray seed at 1 and 2 local workers; each
  process's own peak RSS (``VmHWM``) beside its RSS after ``import torch, ttnn``. Seed target:
  peak <= import RSS + largest checkpoint tensor + 0.5 GiB. Ray: its fixed start cost (all before
  the first task: the build's prepare, ``import ray``, ``ray.init``, workers ready) apart; target:
  2 workers >= 0.8x of the ideal (the 1-worker work halved). Beside it, the machine's own ceiling:
  one ``ttnn.from_torch`` loop alone against two at once in two processes (the speedup two
  workers could get if conversion were all they did).
* **warm start** (``bench_loader.run_case``): a whole warm-start process against a bare
  ``python -c "import torch, ttnn"`` process. Target <= 1.1x.
* **evicted** (``bench_prefetch``; root: ``echo 3 > /proc/sys/vm/drop_caches``): a warm load that
  then reads every byte (the loader's default, prefetch on; and with prefetch off) against the
  parallel-read floor (``--readers`` ``cat`` processes over the same files). Target <= 1.2x.
* **verify** (``tt-cache verify --json``, its own MiB/s) against ``cat`` of the same files, page
  cache warm and evicted; ``tt-cache verify --threads 1`` (one file at a time) beside it. Target
  >= 0.8x of ``cat``.

Ratios of repeated cases are medians of per-round ratios (both measured in the same round).
Writes ``bench_scale-<model>.json`` and its PNGs into ``--out-dir`` (``scripts/_bench_output.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

from _bench_output import DEFAULT_OUT_DIR, write_results
from bench_loader import run_case as loader_case
from bench_prefetch import cat, drop_page_cache, warm_read
from bench_seeding import run as seed_run

from models.common.checkpoint import read_config
from models.demos.real_models.known import known_model
from models.registry import family_of

REPO = Path(__file__).resolve().parent.parent
MIB = 1 << 20
TT_CACHE = str(Path(sys.executable).with_name("tt-cache"))
BUILD_MODES = {"cold load()": "load", "seed()": "seed", "ray 1 worker": "ray:1", "ray 2 workers": "ray:2"}
# Before the first task, the same for any number of workers: Ray's own start, and the build's
# prepare (the gate, the checkpoint's identity, the plan), which a single-process seed pays too
RAY_FIXED = ("prepare", "ray_import", "ray_start", "workers_ready")
CONVERT_LOOP = r"""
import sys, time
from models.common.device_env import ensure_host_cluster
ensure_host_cluster()
import torch, ttnn
torch.set_num_threads(1)
rows, cols, precision, times = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
weight = torch.randn(rows, cols, dtype=torch.bfloat16)
ttnn.from_torch(weight, dtype=getattr(ttnn, precision), layout=ttnn.TILE_LAYOUT)  # first-call set-up, untimed
print("READY", flush=True)
sys.stdin.readline()
start = time.perf_counter()
for _ in range(times):
    ttnn.from_torch(weight, dtype=getattr(ttnn, precision), layout=ttnn.TILE_LAYOUT)
print("SECONDS", time.perf_counter() - start, flush=True)
"""


def largest_tensor_bytes(checkpoint: Path) -> int:
    """Bytes of the checkpoint's largest tensor, from the safetensors headers (nothing else read)."""
    largest = 0
    for file in checkpoint.glob("*.safetensors"):
        with open(file, "rb") as stream:
            (length,) = struct.unpack("<Q", stream.read(8))
            header = json.loads(stream.read(length))
        for name, entry in header.items():
            if name != "__metadata__":
                start, end = entry["data_offsets"]
                largest = max(largest, end - start)
    return largest


def verify_mib_per_s(cache_root: Path, threads: int | None, evict: bool) -> dict:
    """``tt-cache verify`` as a user runs it: its own hashing MiB/s and the whole process's seconds."""
    if evict:
        drop_page_cache()
    command = [TT_CACHE, "verify", str(cache_root), "--json", *(["--threads", str(threads)] if threads else [])]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode:
        raise RuntimeError(f"tt-cache verify failed ({done.returncode}): {done.stdout[-2000:]}{done.stderr[-2000:]}")
    report = json.loads(done.stdout)
    return {"mib_per_s": report["mib_per_s"], "process_s": wall, "bytes": report["bytes"]}


def cat_mib_per_s(files: list[str], evict: bool) -> float:
    size = sum(os.stat(f).st_size for f in files)
    if not evict:
        cat(files, 1, False)  # pages in
    return size / MIB / cat(files, 1, evict)


def conversion_seconds(shape: tuple[int, int], precision: str, processes: int, times: int = 8) -> float:
    """Wall time of ``processes`` processes converting the same weight ``times`` times each, started
    together once all have imported (the longest one's time)."""
    os.sync()  # not during a previous case's writeback
    procs = [subprocess.Popen([sys.executable, "-c", CONVERT_LOOP, *map(str, shape), precision, str(times)], cwd=REPO,
                              env=dict(os.environ, PYTHONPATH=str(REPO)), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for _ in range(processes)]
    for proc in procs:
        while (line := proc.stdout.readline()) and not line.startswith("READY"):
            pass
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    seconds = []
    for proc in procs:
        out, _ = proc.communicate(timeout=600)
        seconds += [float(line.split()[1]) for line in out.splitlines() if line.startswith("SECONDS ")]
    if len(seconds) != processes:
        raise RuntimeError("a conversion loop failed")
    return max(seconds)


def median(rows: list[dict], key: str) -> float:
    return statistics.median(row[key] for row in rows)


def bench_precision(model: str, family: str, precision: str, opts: argparse.Namespace) -> dict:
    cache_root = opts.workdir / f"cache-{precision}"  # the seed's, kept for the warm cases
    config = read_config(Path(model))
    shape = (config["intermediate_size"], config["hidden_size"])  # an MLP weight: the bulk of the work
    build: dict[str, dict] = {}
    for label, mode in BUILD_MODES.items():
        seeding = mode == "seed"
        report = seed_run(mode, Path(model), precision, cache_root if seeding else opts.workdir / "build", keep=seeding)
        assert report["mode"] == mode and report["complete"] and not report["warm_before"], report
        timings = report.get("timings") or {}
        fixed = sum(timings.get(key, 0.0) for key in RAY_FIXED)
        build[label] = {"seconds": report["seconds"], "fixed_seconds": fixed, "work_seconds": report["seconds"] - fixed,
                        "timings": timings,
                        "peak_mib": report["peak"] / MIB, "import_peak_mib": report["import_peak"] / MIB}
        print(f"  {precision} {label}: {report['seconds']:.2f} s (fixed {fixed:.2f}), "
              f"peak {report['peak'] / MIB:.0f} MiB (after imports {report['import_peak'] / MIB:.0f})", flush=True)
    env = dict(os.environ, TT_CACHE_PATH=str(cache_root), HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    env.pop("TT_TRANSFORMERS_FORCE_MODEL_LOAD", None)
    files = warm_read(model, precision, 0, False, env)["files"]
    cache_bytes = sum(os.stat(f).st_size for f in files)
    samples: dict[str, list] = {}
    for _ in range(opts.repeat):  # round-robin: machine noise hits every case alike
        samples.setdefault("import", []).append(loader_case("import", family, model, precision, "1x1", env))
        for processes in (1, 2):
            samples.setdefault(f"convert {processes} process", []).append(
                conversion_seconds(shape, precision, processes))
        samples.setdefault("warm process", []).append(loader_case("warm_lazy", family, model, precision, "1x1", env))
        samples.setdefault("evicted warm+read", []).append(warm_read(model, precision, None, True, env)["total"])
        samples.setdefault("evicted warm+read, no prefetch", []).append(warm_read(model, precision, 0, True, env)["total"])
        samples.setdefault("evicted parallel read", []).append(cat(files, opts.readers, True))
        for where, evict in (("warm", False), ("evicted", True)):
            samples.setdefault(f"cat {where}", []).append(cat_mib_per_s(files, evict))
            samples.setdefault(f"verify {where}", []).append(verify_mib_per_s(cache_root, None, evict))
            samples.setdefault(f"verify 1 thread {where}", []).append(verify_mib_per_s(cache_root, 1, evict))
    shutil.rmtree(cache_root, ignore_errors=True)
    med = {
        "import_s": median(samples["import"], "wall"), "import_rss_mib": median(samples["import"], "rss_mib"),
        "warm_process_s": median(samples["warm process"], "wall"),
        "warm_process_rss_mib": median(samples["warm process"], "rss_mib"),
        "evicted_warm_read_s": statistics.median(samples["evicted warm+read"]),
        "evicted_warm_read_no_prefetch_s": statistics.median(samples["evicted warm+read, no prefetch"]),
        "evicted_parallel_read_s": statistics.median(samples["evicted parallel read"]),
        **{f"{case.replace(' ', '_')}_mib_per_s": (statistics.median(samples[case]) if case.startswith("cat")
                                                   else median(samples[case], "mib_per_s"))
           for case in ("cat warm", "cat evicted", "verify warm", "verify evicted",
                        "verify 1 thread warm", "verify 1 thread evicted")},
    }
    return {"cache_bytes": cache_bytes, "files": len(files), "build": build, "medians": med, "samples": samples}


def _figure(row: float | dict) -> float:
    """A sample's figure: seconds or MiB/s as recorded, a process's wall time, or a verify's MiB/s."""
    if isinstance(row, (int, float)):
        return row
    return row["wall"] if "wall" in row else row["mib_per_s"]


def paired(entry: dict, case: str, reference: str) -> float:
    """Median over rounds of ``case / reference`` measured in the same round: the machine's load
    drifts between rounds, and a ratio of medians would pair a quiet round with a busy one."""
    samples = entry["samples"]
    return statistics.median(_figure(a) / _figure(b) for a, b in zip(samples[case], samples[reference]))


def ratios(entry: dict, largest: int) -> dict[str, dict]:
    """Each target: the measured figure, its reference and whether it is met."""
    build = entry["build"]
    seed = build["seed()"]
    seed_budget = seed["import_peak_mib"] + largest / MIB + 512
    ray1, ray2 = build["ray 1 worker"], build["ray 2 workers"]
    ideal_work = ray1["work_seconds"] / 2
    samples = entry["samples"]
    ceiling = (2 * paired(entry, "convert 1 process", "convert 2 process")
               if "convert 1 process" in samples else None)  # two processes' conversions per one's
    out = {
        "seed peak RSS / (import + largest tensor + 0.5 GiB)": (seed["peak_mib"] / seed_budget, "<= 1.0"),
        "warm process / bare import": (paired(entry, "warm process", "import"), "<= 1.1"),
        "evicted warm+read / parallel-read floor": (paired(entry, "evicted warm+read", "evicted parallel read"), "<= 1.2"),
        "evicted warm+read without prefetch / parallel-read floor": (
            paired(entry, "evicted warm+read, no prefetch", "evicted parallel read"), ""),
        "ray 2 workers: ideal / measured work (fixed cost apart)": (ideal_work / ray2["work_seconds"], ">= 0.8"),
        **({"2 conversions at once: speedup / ideal 2x (the machine's ceiling)": (ceiling / 2, ""),
            "ray 2 workers: speedup / the machine's ceiling": (ray1["work_seconds"] / ray2["work_seconds"] / ceiling, "")}
           if ceiling else {}),
        "verify / cat MiB/s, pages warm": (paired(entry, "verify warm", "cat warm"), ">= 0.8"),
        "verify / cat MiB/s, evicted": (paired(entry, "verify evicted", "cat evicted"), ">= 0.8"),
        "cold load() / seed()": (build["cold load()"]["seconds"] / seed["seconds"], ""),
    }
    result = {}
    for name, (value, target) in out.items():
        met = None
        if target.startswith("<="):
            met = value <= float(target[2:])
        elif target.startswith(">="):
            met = value >= float(target[2:])
        result[name] = {"value": value, "target": target, "met": met}
    result["seed peak RSS / (import + largest tensor + 0.5 GiB)"]["budget_mib"] = seed_budget
    return result


def readme_table(results: dict) -> str:
    """docs/scale.md's table of one model: each figure, its reference, the ratio and the verdict."""
    report = results["precisions"]

    def verdict(entry: dict, name: str) -> str:
        ratio = entry["ratios"][name]
        met = "" if ratio["met"] is None else (" met" if ratio["met"] else " **missed**")
        return f"{ratio['value']:.2f}x{met}"

    def row(label: str, cell, target: str = "") -> str:
        return f"| {label} | " + " | ".join(cell(report[p]) for p in report) + f" | {target} |"

    seed_ratio = "seed peak RSS / (import + largest tensor + 0.5 GiB)"
    lines = [
        f"**{known_model(results['model']).repo_id}** ({results['checkpoint_bytes'] / MIB:,.0f} MiB bf16 checkpoint, largest tensor "
        f"{results['largest_tensor_bytes'] / MIB:,.0f} MiB)", "",
        "| | " + " | ".join(report) + " | target |", "| --- |" + " --- |" * (len(report) + 1),
        row("cache MiB", lambda e: f"{e['cache_bytes'] / MIB:,.0f}"),
        row("cold `load()`: s, peak RSS MiB",
            lambda e: f"{e['build']['cold load()']['seconds']:.1f}, {e['build']['cold load()']['peak_mib']:,.0f}"),
        row("streaming `seed()`: s, peak RSS MiB / target",
            lambda e: f"{e['build']['seed()']['seconds']:.1f}, {e['build']['seed()']['peak_mib']:,.0f} / "
                      f"{e['ratios'][seed_ratio]['budget_mib']:,.0f} ({verdict(e, seed_ratio)})",
            "<= import + largest tensor + 512 MiB"),
        row("warm-start process / bare `import torch, ttnn` s",
            lambda e: f"{e['medians']['warm_process_s']:.2f} / {e['medians']['import_s']:.2f} "
                      f"({verdict(e, 'warm process / bare import')})", "<= 1.1x"),
        row("evicted: warm + every byte / parallel-read floor s (prefetch off)",
            lambda e: f"{e['medians']['evicted_warm_read_s']:.2f} / {e['medians']['evicted_parallel_read_s']:.2f} "
                      f"({verdict(e, 'evicted warm+read / parallel-read floor')}) "
                      f"({e['medians']['evicted_warm_read_no_prefetch_s']:.2f})", "<= 1.2x"),
        row("Ray 1 / 2 workers: work s (+ fixed start s)",
            lambda e: f"{e['build']['ray 1 worker']['work_seconds']:.1f} (+{e['build']['ray 1 worker']['fixed_seconds']:.0f})"
                      f" / {e['build']['ray 2 workers']['work_seconds']:.1f} "
                      f"(+{e['build']['ray 2 workers']['fixed_seconds']:.0f}) "
                      f"({verdict(e, 'ray 2 workers: ideal / measured work (fixed cost apart)')})",
            ">= 0.8x of ideal (work / 2)"),
    ]
    ceiling = "2 conversions at once: speedup / ideal 2x (the machine's ceiling)"
    if all(ceiling in e["ratios"] for e in report.values()):
        lines.append(row("two `from_torch` loops at once in two processes / ideal 2x (this machine's ceiling)",
                         lambda e: verdict(e, ceiling)))
    for where in ("warm", "evicted"):
        name = f"verify / cat MiB/s, {'pages warm' if where == 'warm' else 'evicted'}"
        lines.append(row(f"`tt-cache verify` / `cat` MiB/s, {'pages warm' if where == 'warm' else 'evicted'}",
                         lambda e, w=where, n=name: f"{e['medians'][f'verify_{w}_mib_per_s']:,.0f} / "
                                                    f"{e['medians'][f'cat_{w}_mib_per_s']:,.0f} ({verdict(e, n)})",
                         ">= 0.8x"))
    return "\n".join(lines)


def verify_table(runs: list[dict]) -> str:
    """docs/scale.md's table of ``tt-cache verify`` against ``cat``, every model and precision."""
    lines = ["| model, precision | verify warm (1 thread) | cat warm | verify evicted (1 thread) | cat evicted |",
             "| --- | --- | --- | --- | --- |"]
    for results in runs:
        for precision, entry in results["precisions"].items():
            m = entry["medians"]
            lines.append(f"| {known_model(results['model']).repo_id}, {precision} | "
                         f"{m['verify_warm_mib_per_s']:,.0f} ({m['verify_1_thread_warm_mib_per_s']:,.0f}) | "
                         f"{m['cat_warm_mib_per_s']:,.0f} | {m['verify_evicted_mib_per_s']:,.0f} "
                         f"({m['verify_1_thread_evicted_mib_per_s']:,.0f}) | {m['cat_evicted_mib_per_s']:,.0f} |")
    return "\n".join(lines)


def print_tables(model: str, checkpoint_mib: float, largest: int, report: dict) -> None:
    precisions = list(report)
    print(f"\n### {model}: checkpoint {checkpoint_mib:,.0f} MiB (largest tensor {largest / MIB:,.0f} MiB), "
          f"{os.cpu_count()} cores")
    print("| figure | " + " | ".join(precisions) + " |\n| --- |" + " --- |" * len(precisions))
    rows = [
        ("cache MiB", lambda e: f"{e['cache_bytes'] / MIB:,.0f}"),
        *[(f"{label} s (peak RSS MiB)", lambda e, l=label: f"{e['build'][l]['seconds']:.1f} ({e['build'][l]['peak_mib']:,.0f})")
          for label in BUILD_MODES],
        ("ray fixed start cost s (1 / 2 workers)", lambda e: f"{e['build']['ray 1 worker']['fixed_seconds']:.1f} / "
                                                          f"{e['build']['ray 2 workers']['fixed_seconds']:.1f}"),
        ("RSS after import torch, ttnn MiB", lambda e: f"{e['build']['seed()']['import_peak_mib']:,.0f}"),
        ("bare import process s", lambda e: f"{e['medians']['import_s']:.2f}"),
        ("warm-start process s", lambda e: f"{e['medians']['warm_process_s']:.2f}"),
        ("evicted: warm + read every byte s (prefetch off)", lambda e: f"{e['medians']['evicted_warm_read_s']:.2f} "
                                                                        f"({e['medians']['evicted_warm_read_no_prefetch_s']:.2f})"),
        ("evicted: parallel-read floor s", lambda e: f"{e['medians']['evicted_parallel_read_s']:.2f}"),
        ("verify MiB/s warm / evicted", lambda e: f"{e['medians']['verify_warm_mib_per_s']:,.0f} / "
                                                  f"{e['medians']['verify_evicted_mib_per_s']:,.0f}"),
        ("verify 1 thread MiB/s warm / evicted", lambda e: f"{e['medians']['verify_1_thread_warm_mib_per_s']:,.0f} / "
                                                           f"{e['medians']['verify_1_thread_evicted_mib_per_s']:,.0f}"),
        ("cat MiB/s warm / evicted", lambda e: f"{e['medians']['cat_warm_mib_per_s']:,.0f} / "
                                               f"{e['medians']['cat_evicted_mib_per_s']:,.0f}"),
    ]
    for label, cell in rows:
        print(f"| {label} | " + " | ".join(cell(report[p]) for p in precisions) + " |")
    print("\n| ratio | target | " + " | ".join(precisions) + " |\n| --- | --- |" + " --- |" * len(precisions))
    for name, first in report[precisions[0]]["ratios"].items():
        cells = []
        for p in precisions:
            r = report[p]["ratios"][name]
            cells.append(f"{r['value']:.2f}x" + ("" if r["met"] is None else (" met" if r["met"] else " MISSED")))
        print(f"| {name} | {first['target']} | " + " | ".join(cells) + " |")


def charts(model: str, report: dict) -> dict[str, dict]:
    seconds = {p: {**{label: e["build"][label]["seconds"] for label in BUILD_MODES},
                   "bare import": e["medians"]["import_s"], "warm process": e["medians"]["warm_process_s"],
                   "evicted warm+read": e["medians"]["evicted_warm_read_s"],
                   "evicted, no prefetch": e["medians"]["evicted_warm_read_no_prefetch_s"],
                   "parallel-read floor": e["medians"]["evicted_parallel_read_s"]} for p, e in report.items()}
    rss = {p: {"after import": e["build"]["seed()"]["import_peak_mib"],
               "seed() target": e["ratios"]["seed peak RSS / (import + largest tensor + 0.5 GiB)"]["budget_mib"],
               "seed()": e["build"]["seed()"]["peak_mib"], "cold load()": e["build"]["cold load()"]["peak_mib"],
               "warm process": e["medians"]["warm_process_rss_mib"]} for p, e in report.items()}
    speed = {f"{p} {where}": {"cat": e["medians"][f"cat_{where}_mib_per_s"],
                              "tt-cache verify": e["medians"][f"verify_{where}_mib_per_s"],
                              "verify, 1 thread": e["medians"][f"verify_1_thread_{where}_mib_per_s"]}
             for p, e in report.items() for where in ("warm", "evicted")}
    return {"": {"groups": seconds, "title": f"{model}: builds, warm starts and evicted reads", "ylabel": "seconds",
                 "log": True, "value_format": "{:.2f}"},
            "rss": {"groups": rss, "title": f"{model}: peak RSS (VmHWM) per process", "ylabel": "MiB"},
            "verify": {"groups": speed, "title": f"{model}: tt-cache verify vs cat", "ylabel": "MiB/s"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a known real model (gemma3-270m, qwen2.5-coder-1.5b, ...)")
    parser.add_argument("--precision", nargs="+", default=["bfloat8_b", "bfloat16"])
    parser.add_argument("--repeat", type=int, default=3, help="rounds of the warm, evicted and verify cases")
    parser.add_argument("--readers", type=int, default=4, help="parallel cat processes: the parallel-read floor")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/tt-bench-scale"))
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    parser.add_argument("--from-json", type=Path, nargs="+", metavar="JSON",
                        help="recompute the ratios, tables and charts of earlier runs' JSON (nothing is measured)")
    parser.add_argument("--readme", action="store_true",
                        help="with --from-json: print docs/scale.md's tables and its verify table, write nothing")
    opts = parser.parse_args()
    if opts.from_json:
        runs = [json.loads(path.read_text()) for path in opts.from_json]
        for results in runs:
            if "machine" in results:  # where and when the figures were measured (write_json adds this run's)
                results["measured_on"] = results.pop("machine")
            report = results["precisions"]
            for entry in report.values():
                entry["ratios"] = ratios(entry, results["largest_tensor_bytes"])
            if not opts.readme:
                print_tables(results["model"], results["checkpoint_bytes"] / MIB, results["largest_tensor_bytes"], report)
                write_results(opts.out_dir, f"bench_scale-{results['model']}", results, charts(results["model"], report))
        if opts.readme:
            print("\n\n".join(readme_table(results) for results in runs) + "\n\n" + verify_table(runs))
        return
    if not opts.model:
        parser.error("--model is required (or --from-json)")
    if os.geteuid() != 0:
        raise SystemExit("evicting the page cache needs root (echo 3 > /proc/sys/vm/drop_caches)")
    from models.demos.real_models.prepare import prepare_model

    checkpoint = prepare_model(opts.model)
    family = family_of(read_config(checkpoint))
    checkpoint_bytes = sum(f.stat().st_size for f in checkpoint.glob("*.safetensors"))
    largest = largest_tensor_bytes(checkpoint)
    print(f"{opts.model} ({family}): {checkpoint_bytes / MIB:,.0f} MiB checkpoint, {opts.repeat} rounds, "
          f"{os.cpu_count()} cores", flush=True)
    report = {}
    try:
        for precision in opts.precision:
            entry = bench_precision(str(checkpoint), family, precision, opts)
            entry["ratios"] = ratios(entry, largest)
            report[precision] = entry
    finally:
        shutil.rmtree(opts.workdir, ignore_errors=True)
    print_tables(opts.model, checkpoint_bytes / MIB, largest, report)
    results = {"model": opts.model, "family": family, "checkpoint_bytes": checkpoint_bytes, "largest_tensor_bytes": largest,
               "rounds": opts.repeat, "readers": opts.readers, "precisions": report}
    write_results(opts.out_dir, f"bench_scale-{opts.model}", results, charts(opts.model, report))


if __name__ == "__main__":
    main()
