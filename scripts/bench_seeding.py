# SPDX-License-Identifier: Apache-2.0
"""Seeding at scale: throughput and peak RSS against checkpoint size, side by side in one run.

    python scripts/bench_seeding.py                                 # 0.6 / 1.6 / 2.5 GB, bfloat16
    python scripts/bench_seeding.py --sizes 0.6 --precision bfloat8_b

For each llama-shaped checkpoint (made here, deleted after) and each way of seeding, a fresh
process (imports excluded from the clock, checkpoint pages warmed with ``cat`` first):

* ``cold load()``: today's cold build, every converted weight kept (``WeightLoader.load()``);
* ``stream``: the single-process streaming seed (``WeightLoader.seed()``);
* ``ray 1`` / ``ray 2``: :func:`models.seeding.ray_seed.seed_on_ray` on a local Ray instance of
  1 and 2 workers. Ray's fixed cost (``ray.init`` and the workers' imports) is reported apart;
  throughput counts only the conversion (tasks submitted to marked).

Peak RSS is each process's own ``VmHWM`` (the Ray driver's; its workers are separate processes,
each bounded like the streaming seed). Throughput is MiB of checkpoint per second. Writes JSON
and a PNG next to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

from _bench_output import Panel, figure, write_json  # noqa: E402

from models.common.weight_cache.layout import CHECKPOINT_STAMPS as STAMPS  # noqa: E402
from models.testing.llama_shaped import LAYERS_FOR_GB, make_in_child  # noqa: E402

MODES = {"cold load()": "load", "stream": "seed", "ray 1": "ray:1", "ray 2": "ray:2"}


def run(mode: str, checkpoint: Path, precision: str, cache_root: Path, *, keep: bool = False, mesh: str = "1x1",
        workers: int | None = None, verified: bool = False) -> dict:
    """One way of seeding in a fresh process (``models.testing.seed_child``) into an empty
    ``cache_root``, checkpoint pages warmed first; its report. ``keep`` leaves the cache built;
    ``workers``: its conversion workers (default: the loader's); ``verified``: the root keeps the
    checkpoint's stamped digests of an earlier run (a rebuild: the checkpoint is not hashed again)."""
    _empty(cache_root, verified)
    files = sorted(str(f.resolve()) for f in Path(checkpoint).glob("*.safetensors"))
    subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)
    os.sync()  # no case runs during the previous one's writeback
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    env.pop("TT_TRANSFORMERS_FORCE_MODEL_LOAD", None)
    env.pop("TT_CONVERT_WORKERS", None)
    if workers is not None:
        env["TT_CONVERT_WORKERS"] = str(workers)
    proc = subprocess.run([sys.executable, "-m", "models.testing.seed_child", mode, str(checkpoint), precision,
                           str(cache_root), mesh], cwd=REPO, env=env, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("SEED_REPORT ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"{mode} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    if not keep:
        _empty(cache_root, verified)
    return json.loads(lines[-1].split(" ", 1)[1])


def _empty(cache_root: Path, keep_stamps: bool) -> None:
    """Remove what a run built in ``cache_root`` (with ``keep_stamps``, all but its stamp indexes)."""
    if not keep_stamps:
        shutil.rmtree(cache_root, ignore_errors=True)
        return
    for entry in cache_root.iterdir() if cache_root.is_dir() else ():
        if entry.name == STAMPS.parts[0]:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", type=float, default=[0.6, 1.6, 2.5], choices=sorted(LAYERS_FOR_GB))
    parser.add_argument("--precision", default="bfloat16")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/tt-bench-seeding"))
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "bench_seeding.json")
    opts = parser.parse_args()
    rows = []
    try:
        for size in opts.sizes:
            checkpoint = make_in_child(opts.workdir / f"llama-{size}gb", LAYERS_FOR_GB[size])
            mib = (checkpoint / "model.safetensors").stat().st_size / 2**20
            for label in opts.modes:
                report = run(MODES[label], checkpoint, opts.precision, opts.workdir / "cache")
                timings = report.get("timings") or {}
                fixed = timings.get("ray_start", 0.0) + timings.get("workers_ready", 0.0)
                work = report["seconds"] - fixed
                rows.append({"size_gb": size, "checkpoint_mib": mib, "mode": label, "seconds": report["seconds"],
                             "fixed_seconds": fixed, "work_seconds": work, "mib_per_s": mib / work,
                             "peak_mib": report["peak"] / 2**20, "import_peak_mib": report["import_peak"] / 2**20,
                             "timings": timings})
                print(f"{size} GB {label}: {work:.1f} s ({mib / work:.0f} MiB/s) + fixed {fixed:.1f} s, "
                      f"peak {report['peak'] / 2**20:.0f} MiB", flush=True)
            shutil.rmtree(checkpoint)
    finally:
        shutil.rmtree(opts.workdir, ignore_errors=True)
    print_tables(rows, opts.precision)
    write_json(opts.out, {"precision": opts.precision, "cores": os.cpu_count(), "rows": rows})
    plot(rows, opts.out.with_suffix(".png"), opts.precision)


def print_tables(rows: list[dict], precision: str) -> None:
    print(f"\n### Seeding llama-shaped checkpoints to {precision} ({os.cpu_count()} cores, one round)")
    print("| checkpoint | mode | MiB/s (fixed cost excluded) | fixed cost s | total s | peak RSS MiB (import) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['checkpoint_mib']:.0f} MiB | {r['mode']} | {r['mib_per_s']:.0f} | {r['fixed_seconds']:.1f} | "
              f"{r['seconds']:.1f} | {r['peak_mib']:.0f} ({r['import_peak_mib']:.0f}) |")
    by = {(r["size_gb"], r["mode"]): r for r in rows}
    print("\n| checkpoint | ray 2 / stream throughput | ray 1 / stream | stream peak / cold load() peak |")
    print("| --- | --- | --- | --- |")
    for size in sorted({r["size_gb"] for r in rows}):
        stream = by.get((size, "stream"))
        if not stream:
            continue
        cells = [f"{by[(size, m)]['mib_per_s'] / stream['mib_per_s']:.2f}x" if (size, m) in by else "-" for m in ("ray 2", "ray 1")]
        cold = by.get((size, "cold load()"))
        cells.append(f"{stream['peak_mib']:.0f} / {cold['peak_mib']:.0f} MiB" if cold else "-")
        print(f"| {stream['checkpoint_mib']:.0f} MiB | " + " | ".join(cells) + " |")


def plot(rows: list[dict], path: Path, precision: str) -> None:
    """Peak RSS and throughput against checkpoint size, one line per way of seeding."""
    modes = list(dict.fromkeys(r["mode"] for r in rows))

    def series(key: str) -> dict[str, dict[float, float]]:
        return {mode: {r["checkpoint_mib"] / 1024: r[key] for r in sorted(rows, key=lambda r: r["checkpoint_mib"])
                       if r["mode"] == mode} for mode in modes}

    imports = [r["import_peak_mib"] for r in rows]
    figure(path, [
        Panel("lines", series("peak_mib"), title="peak RSS vs checkpoint size", xlabel="checkpoint GiB",
              ylabel="peak RSS MiB (VmHWM)", hlines={"after imports": sum(imports) / len(imports)}),
        Panel("lines", series("mib_per_s"), title=f"seeding throughput ({precision}, {os.cpu_count()} cores)",
              xlabel="checkpoint GiB", ylabel="MiB/s of checkpoint (fixed cost excluded)"),
    ])
    print(f"wrote {path} and {path.with_suffix('.json')}")


if __name__ == "__main__":
    main()
