# SPDX-License-Identifier: Apache-2.0
"""Cold builds at the sizes users run, every figure side by side with its reference in one run.

    python scripts/bench_large_shapes.py                      # Llama-2k, -3.1-8B and -3.1-70B shapes, 2 layers
    python scripts/bench_large_shapes.py --shapes llama-3.1-70b --precision bfloat8_b --meshes 1x1 1x8 8x4
    python scripts/bench_large_shapes.py --shapes --models qwen2.5-coder-1.5b --meshes 1x1   # a real model
    sudo .venv/bin/python scripts/bench_large_shapes.py       # root: the evicted warm start too
    python scripts/bench_large_shapes.py --shapes llama-3.1-70b --workers 2 --repeat 1 --add   # one shape, added
    python scripts/bench_large_shapes.py --shapes llama-3.1-70b --parts speedup --repeat 2 --add   # one figure again
    python scripts/bench_large_shapes.py --from-json docs/bench_large_shapes.json --readme   # tables again

Each shape (``models/testing/model_shapes.py``: the tensor shapes of the hub model, random values,
sharded with an index as the hub ships it) is made in ``--workdir``, measured, and deleted with its
caches before the next (a 70B-shaped checkpoint of 2 layers is 7.1 GiB). Per precision, each case in
a fresh process with the checkpoint's pages warm:

* **cold builds**: ``load()`` and ``seed()`` on every mesh with 1 and 2 conversion workers: seconds
  (imports excluded) and the process's own peak RSS (``VmHWM``) over its RSS after
  ``import torch, ttnn``. Target: within the largest tensor + 0.5 GiB (+ one unit per further worker).
* **naive loop** (N150: it knows no mesh): ``safetensors.load_file`` per shard, transpose,
  ``ttnn.as_tensor``; the same figures.
* **two workers against the machine's ceiling**: ``seed()`` with 2 workers against 1, beside two
  ``ttnn.from_torch`` loops in two processes against one (the most two workers could gain here), in
  ``--repeat`` rounds; the median of the rounds' ratios. Target: >= 0.9x of the ceiling.
* **warm start**: a whole warm-start process against a bare ``import torch, ttnn`` process
  (target <= 1.1x); as root, a warm load that reads every byte from an evicted page cache against 4
  parallel ``cat`` processes over the same files (target <= 1.2x).

Writes ``bench_large_shapes.json`` and a plot of how each figure grows with the model into ``--out-dir``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from _bench_output import DEFAULT_OUT_DIR, Panel, figure, write_json
from bench_loader import run_case as loader_case
from bench_peer_loop import run_case as peer_case
from bench_prefetch import cat, warm_read
from bench_scale import conversion_seconds, largest_tensor_bytes
from bench_seeding import run as build_run

from models.registry import family_of
from models.testing.model_shapes import SHAPES, make_shaped_checkpoint

REPO = Path(__file__).resolve().parent.parent
MIB = 1 << 20
MESH_NAMES = {"1x1": "N150", "1x8": "T3K", "8x4": "TG"}
BF16_BYTES = 2


def build_cases(meshes: list[str], workers: list[int]) -> list[tuple[str, str, int]]:
    return [(mode, mesh, count) for mesh in meshes for mode in ("load", "seed") for count in workers]


PARTS = ("builds", "naive", "speedup", "warm")


def bench_precision(checkpoint: Path, precision: str, opts: argparse.Namespace) -> dict:
    """The figures of ``opts.parts`` for one precision (the keys of the JSON entry they fill)."""
    parts: dict = {}
    if "builds" in opts.parts:
        parts["builds"] = cold_builds(checkpoint, precision, opts)
    if "naive" in opts.parts:
        naive = peer_case("naive", str(checkpoint), precision, opts.workdir)
        print(f"  {precision} naive loop: {naive['seconds']:.1f} s, "
              f"+{naive['peak_mib'] - naive['import_peak_mib']:,.0f} MiB", flush=True)
        parts["naive"] = naive
    if "speedup" in opts.parts:
        parts["speedup_rounds"] = worker_speedup(checkpoint, precision, opts)
    if "warm" in opts.parts:
        parts["warm"] = warm_cases(checkpoint, precision, opts)
    return parts


def cold_builds(checkpoint: Path, precision: str, opts: argparse.Namespace) -> list[dict]:
    builds = []
    for mode, mesh, count in build_cases(opts.meshes, opts.workers):
        report = build_run(mode, checkpoint, precision, opts.workdir / "build", mesh=mesh, workers=count)
        assert report["complete"] and not report["warm_before"] and report["workers"] == count, report
        builds.append({"mode": mode, "mesh": mesh, "workers": count, "seconds": report["seconds"],
                       "peak_mib": report["peak"] / MIB, "import_mib": report["import_peak"] / MIB})
        print(f"  {precision} {mode} {MESH_NAMES.get(mesh, mesh)} {count} worker(s): {report['seconds']:.1f} s, "
              f"+{(report['peak'] - report['import_peak']) / MIB:,.0f} MiB over imports", flush=True)
    return builds


def worker_speedup(checkpoint: Path, precision: str, opts: argparse.Namespace) -> list[dict]:
    """Round-robin over ``--repeat`` rounds: ``seed()`` on N150 with 1 and 2 workers, and one
    ``ttnn.from_torch`` loop against two in two processes (the machine's ceiling), so each round's
    gain and ceiling are measured minutes apart, never hours.

    The seeds are rebuilds of a verified checkpoint (its digests stamped by a first seed, kept in
    the root): hashing it, which a first seed of a new checkpoint does before any conversion and on
    every core already, is not what the workers share. Each loop converts an MLP weight (the bulk of
    the work) until it has converted as many bytes as the checkpoint holds, so it runs as long.

    Beside them, what bounds a seed apart from conversion: the disk (the cache's bytes written and
    made durable alone, one writer) and the same 1- and 2-worker seeds into RAM (a tmpfs root, where
    writes cost no disk time; only when it has room for two caches and the machine's memory too)."""
    config = json.loads((checkpoint / "config.json").read_text())
    shape = (config["intermediate_size"], config["hidden_size"])
    weight_bytes = shape[0] * shape[1] * BF16_BYTES  # the loop's weight (bench_scale.CONVERT_LOOP)
    checkpoint_bytes = sum(f.stat().st_size for f in checkpoint.glob("*.safetensors"))
    times = max(8, round(checkpoint_bytes / weight_bytes))
    root = opts.workdir / "build"
    ram_root = ram_workdir(checkpoint_bytes)
    first = build_run("seed", checkpoint, precision, root, workers=2, verified=True)
    if ram_root is not None:  # its own verified checkpoint stamps, untimed
        build_run("seed", checkpoint, precision, ram_root, workers=2, verified=True)
    rounds = []
    try:
        for _ in range(opts.repeat):
            one, two = (build_run("seed", checkpoint, precision, root, workers=n, verified=True)["seconds"]
                        for n in (1, 2))
            loop_one, loop_two = (conversion_seconds(shape, precision, n, times) for n in (1, 2))
            row = {"seed_1_worker_s": one, "seed_2_workers_s": two, "loop_1_s": loop_one, "loops_2_s": loop_two,
                   "loop_conversions": times, "verified": True, "first_seed_2_workers_s": first["seconds"],
                   "gain": one / two, "ceiling": 2 * loop_one / loop_two,
                   "disk_write_s": disk_write_seconds(opts.workdir, first["bytes_written"])}
            if ram_root is not None:
                ram_one, ram_two = (build_run("seed", checkpoint, precision, ram_root, workers=n, verified=True)["seconds"]
                                    for n in (1, 2))
                row |= {"ram_seed_1_worker_s": ram_one, "ram_seed_2_workers_s": ram_two, "ram_gain": ram_one / ram_two}
            rounds.append(row)
            ram = f", in RAM {row['ram_gain']:.2f}x" if "ram_gain" in row else ""
            print(f"  {precision} workers: 2 / 1 = {one / two:.2f}x{ram}, two processes {row['ceiling']:.2f}x; "
                  f"the cache's bytes alone to disk {row['disk_write_s']:.1f} s against {two:.1f} s "
                  f"(a first seed, hashing the checkpoint: {first['seconds']:.1f} s)", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if ram_root is not None:
            shutil.rmtree(ram_root, ignore_errors=True)
    return rounds


RAM_FS = Path("/dev/shm")


def ram_workdir(checkpoint_bytes: int) -> Path | None:
    """A fresh directory on the RAM file system if it has room for two caches of this checkpoint
    and the machine's available memory for three (the checkpoint's pages, the cache, the seed)."""
    if not RAM_FS.is_dir():
        return None
    available = next((int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()
                      if line.startswith("MemAvailable:")), 0)
    if shutil.disk_usage(RAM_FS).free < 2 * checkpoint_bytes or available < 3 * checkpoint_bytes:
        return None
    return Path(tempfile.mkdtemp(prefix="tt-bench-large-shapes-", dir=RAM_FS))


def disk_write_seconds(workdir: Path, size: int) -> float:
    """Seconds to write ``size`` bytes into one new file in ``workdir`` and make them durable: the
    disk's share of a seed that writes as much, with no conversion beside it."""
    os.sync()
    block = os.urandom(32 << 20)  # not zeros: nothing below may shortcut them
    path = workdir / "disk-write.bin"
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        left = size
        while left:
            left -= os.write(fd, memoryview(block)[:min(len(block), left)])
        os.fsync(fd)
        return time.perf_counter() - start
    finally:
        os.close(fd)
        path.unlink()


def warm_cases(checkpoint: Path, precision: str, opts: argparse.Namespace) -> dict:
    """Round-robin over ``--repeat`` rounds: the warm-start process against a bare import, and (root)
    the evicted warm read against the parallel-read floor."""
    cache_root = opts.workdir / "warm-cache"
    build_run("seed", checkpoint, precision, cache_root, keep=True)
    env = dict(os.environ, TT_CACHE_PATH=str(cache_root), HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    env.pop("TT_TRANSFORMERS_FORCE_MODEL_LOAD", None)
    model = str(checkpoint)
    family = family_of(json.loads((checkpoint / "config.json").read_text()))
    files = warm_read(model, precision, 0, False, env)["files"]
    cache_mib = sum(os.stat(f).st_size for f in files) / MIB
    rounds: dict[str, list[float]] = {}
    for _ in range(opts.repeat):
        rounds.setdefault("import", []).append(loader_case("import", family, model, precision, "1x1", env)["wall"])
        rounds.setdefault("warm process", []).append(
            loader_case("warm_lazy", family, model, precision, "1x1", env)["wall"])
        if os.geteuid() == 0:
            rounds.setdefault("evicted warm+read", []).append(warm_read(model, precision, None, True, env)["total"])
            rounds.setdefault("evicted parallel read", []).append(cat(files, opts.readers, True))
    shutil.rmtree(cache_root, ignore_errors=True)
    return {"rounds": rounds, "cache_mib": cache_mib}


def paired(rounds: dict[str, list[float]], case: str, reference: str) -> float | None:
    """Median over rounds of ``case / reference`` measured in the same round."""
    if case not in rounds:
        return None
    return statistics.median(a / b for a, b in zip(rounds[case], rounds[reference], strict=True))


# -- tables ----------------------------------------------------------------------------------


def _build(entry: dict, mode: str, mesh: str, workers: int) -> dict | None:
    return next((b for b in entry.get("builds", []) if (b["mode"], b["mesh"], b["workers"]) == (mode, mesh, workers)), None)


def _added(row: dict) -> float:
    return row["peak_mib"] - row["import_mib"]


def summary(shape: dict, precision: str) -> dict[str, str]:
    """Each table row's cell for one precision."""
    entry = shape["precisions"][precision]
    bound = shape["largest_mib"] + 512
    cells: dict[str, str] = {}
    for mesh in sorted({b["mesh"] for b in entry.get("builds", [])}, key=list(MESH_NAMES).index):
        for mode in ("load", "seed"):
            found = [_build(entry, mode, mesh, w) for w in (1, 2)]
            rows = [r for r in found if r]
            figures = " / ".join(f"{r['seconds']:.1f} s, +{_added(r):,.0f}" if r else "not run" for r in found)
            worst = max(_added(r) - 512 * (r["workers"] - 1) for r in rows)
            verdict = "met" if worst <= bound else "**missed**"
            label = "cold `load()`" if mode == "load" else "`seed()`"
            cells[f"{label} {MESH_NAMES.get(mesh, mesh)}, 1 / 2 workers: s, MiB over imports"] = (
                f"{figures} ({verdict})")
    if naive := entry.get("naive"):
        cells["naive loop (N150): s, MiB over imports"] = (
            f"{naive['seconds']:.1f} s, +{naive['peak_mib'] - naive['import_peak_mib']:,.0f}")
    if rounds := entry.get("speedup_rounds") or _one_round(entry):
        gain, ceiling = (statistics.median(r[key] for r in rounds) for key in ("gain", "ceiling"))
        share = statistics.median(r["gain"] / r["ceiling"] for r in rounds)
        cells["`seed()` N150, 2 workers' speedup / two processes' (the ceiling)"] = (
            f"{gain:.2f}x / {ceiling:.2f}x ({share:.2f} of it, {'met' if share >= 0.9 else '**missed**'})"
            f" in {len(rounds)} round(s)" + (", checkpoint verified before" if rounds[0].get("verified") else ""))
        if all("ram_gain" in r for r in rounds):
            ram = statistics.median(r["ram_gain"] for r in rounds)
            ram_share = statistics.median(r["ram_gain"] / r["ceiling"] for r in rounds)
            cells["the same seeds into RAM (tmpfs): 2 workers' speedup"] = f"{ram:.2f}x ({ram_share:.2f} of the ceiling)"
        if all("disk_write_s" in r for r in rounds):
            two, disk = (statistics.median(r[key] for r in rounds) for key in ("seed_2_workers_s", "disk_write_s"))
            cells["disk floor: the cache's bytes alone written / `seed()` N150, 2 workers"] = f"{disk:.1f} s / {two:.1f} s"
    if "warm" not in entry:
        return cells
    rounds = entry["warm"]["rounds"]
    warm = paired(rounds, "warm process", "import")
    cells["warm-start process / bare `import torch, ttnn`"] = (
        f"{warm:.2f}x ({'met' if warm <= 1.1 else '**missed**'})")
    evicted = paired(rounds, "evicted warm+read", "evicted parallel read")
    cells["evicted: warm + every byte / 4 parallel `cat`s"] = (
        f"{evicted:.2f}x ({'met' if evicted <= 1.2 else '**missed**'})" if evicted else "not run (needs root)")
    return cells


def _one_round(entry: dict) -> list[dict]:
    """A run without paired rounds: its single N150 seeds and conversion loops as one round."""
    one, two, loops = _build(entry, "seed", "1x1", 1), _build(entry, "seed", "1x1", 2), entry.get("convert_loops_s")
    if not (one and two and loops):
        return []
    return [{"gain": one["seconds"] / two["seconds"], "ceiling": 2 * loops["1"] / loops["2"]}]


TARGETS = {"cold `load()`": "MiB <= largest tensor + 512 (+512 a further worker)", "`seed()` N150, 2": ">= 0.9 of the ceiling",
           "`seed()`": "MiB <= largest tensor + 512 (+512 a further worker)", "warm-start": "<= 1.1x",
           "evicted": "<= 1.2x"}


def readme_tables(report: dict) -> str:
    out = []
    for name, shape in report["shapes"].items():
        precisions = list(shape["precisions"])
        cells = {p: summary(shape, p) for p in precisions}
        kind = "-shaped" if name in SHAPES else ""
        out.append(f"**{name}{kind}, {shape['layers']} layer(s)** ({shape['checkpoint_mib']:,.0f} MiB bf16 checkpoint "
                   f"in {shape['shards']} shard(s), largest tensor {shape['largest_mib']:,.0f} MiB)\n")
        out.append("| | " + " | ".join(precisions) + " | target |")
        out.append("| --- | " + " | ".join("---" for _ in precisions) + " | --- |")
        for row in cells[precisions[0]]:
            target = next((t for key, t in TARGETS.items() if row.startswith(key)), "")
            out.append(f"| {row} | " + " | ".join(cells[p].get(row, "not run") for p in precisions) + f" | {target} |")
        out.append("")
    return "\n".join(out)


def plot(report: dict, path: Path) -> Path:
    """Peak RSS over the imports against the checkpoint's size, per way of building (N150, 1 worker
    and the default 2), beside the bound: how each figure grows from the small shape to 70B's."""
    lines: dict[str, dict[float, float]] = {}
    seconds: dict[str, dict[float, float]] = {}
    for shape in report["shapes"].values():
        size = shape["checkpoint_mib"] / 1024
        lines.setdefault("bound (largest tensor + 512 MiB)", {})[size] = shape["largest_mib"] + 512
        for precision, entry in shape["precisions"].items():
            for mode, workers in (("load", 1), ("seed", 1), ("load", 2), ("seed", 2)):
                if row := _build(entry, mode, "1x1", workers):
                    key = f"{mode}() {workers} worker{'s' if workers > 1 else ''}, {precision}"
                    lines.setdefault(key, {})[size] = _added(row)
                    seconds.setdefault(key, {})[size] = row["seconds"]
            if naive := entry.get("naive"):
                lines.setdefault(f"naive loop, {precision}", {})[size] = naive["peak_mib"] - naive["import_peak_mib"]
                seconds.setdefault(f"naive loop, {precision}", {})[size] = naive["seconds"]
    return figure(path, [
        Panel("lines", lines, title="peak RSS over imports (N150)", ylabel="MiB", xlabel="checkpoint GiB", log=True),
        Panel("lines", seconds, title="cold build time (N150)", ylabel="s", xlabel="checkpoint GiB", log=True),
    ], title="cold builds by model size")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="*", default=["llama-2k", "llama-3.1-8b", "llama-3.1-70b"],
                        choices=sorted(SHAPES))
    parser.add_argument("--models", nargs="+", default=[], help="known real models too (qwen2.5-coder-1.5b, ...)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--precision", nargs="+", default=["bfloat8_b", "bfloat16"])
    parser.add_argument("--meshes", nargs="+", default=list(MESH_NAMES))
    parser.add_argument("--workers", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--repeat", type=int, default=3, help="rounds of the warm-start cases")
    parser.add_argument("--readers", type=int, default=4, help="parallel cat processes: the parallel-read floor")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/tt-bench-large-shapes"))
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    parser.add_argument("--add", action="store_true",
                        help="keep what the JSON already in --out-dir holds beyond this run (other shapes, other parts)")
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS,
                        help="which figures to measure (with --add, the others are kept from the JSON)")
    parser.add_argument("--from-json", type=Path, metavar="JSON", help="print the tables of an earlier run")
    parser.add_argument("--readme", action="store_true", help="with --from-json: docs/large-shapes.md's tables only")
    opts = parser.parse_args()
    if opts.from_json:
        report = json.loads(opts.from_json.read_text())
        print(readme_tables(report))
        if not opts.readme:  # the plot again, from the same figures
            print(f"wrote {plot(report, opts.out_dir / 'bench_large_shapes.png')}")
        return
    out = opts.out_dir / "bench_large_shapes.json"
    report: dict = {"shapes": json.loads(out.read_text())["shapes"] if opts.add and out.is_file() else {}}
    for name in [*opts.shapes, *opts.models]:
        workdir = opts.workdir / name
        if name in SHAPES:
            checkpoint = make_shaped_checkpoint(workdir / "checkpoint", name, opts.layers)
        else:  # a known real model, prepared into TT_MODEL_DATA (kept there)
            from models.demos.real_models.prepare import prepare_model

            checkpoint = prepare_model(name)
        files = sorted(checkpoint.glob("*.safetensors"))
        config = json.loads((checkpoint / "config.json").read_text())
        entry = {"layers": config["num_hidden_layers"], "shards": len(files),
                 "checkpoint_mib": sum(f.stat().st_size for f in files) / MIB,
                 "largest_mib": largest_tensor_bytes(checkpoint) / MIB,
                 "precisions": report["shapes"].get(name, {}).get("precisions", {})}
        print(f"{name}: {entry['checkpoint_mib']:,.0f} MiB in {len(files)} shards", flush=True)
        try:
            for precision in opts.precision:
                measured = bench_precision(checkpoint, precision, argparse.Namespace(**{**vars(opts), "workdir": workdir}))
                entry["precisions"][precision] = {**entry["precisions"].get(precision, {}), **measured}
        finally:
            shutil.rmtree(workdir, ignore_errors=True)  # gigabytes: nothing of a shape outlives its turn
        report["shapes"][name] = entry
        write_json(out, report)  # each shape as it is done: runs are long
    print()
    print(readme_tables(report))
    print(f"wrote {plot(report, opts.out_dir / 'bench_large_shapes.png')}")


if __name__ == "__main__":
    main()
