#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Benchmark ``tt-cache ls``, ``check`` and ``verify`` on a cache root of 20 real caches.

Every figure is a fresh process (what a user or a CI step pays), median of ``--runs``, page
cache warm, measured side by side with its reference:

* ``ls`` and ``check`` against ``hf cache ls`` on a hub cache of 20 repos of the same checkpoints,
  against a bare ``python -c pass``, and against ``import torch, ttnn`` (what ``ls`` cost while it
  imported ttnn). Target: ``ls`` and ``check`` under 0.3 s.
* ``verify`` (BLAKE3 re-hash of every file) as MiB/s against ``cat`` of the same files.

The caches: 5 llama-shaped checkpoints (hidden 512, 4 layers, different weights) x 4 meshes
(1x1, 1x2, 1x4, 2x2), bfloat16, seeded with ``WeightLoader.seed``.

usage: .venv/bin/python scripts/bench_cli.py [--runs 5] [--work DIR] [--out docs/bench_cli.json]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _bench_output import DEFAULT_OUT_DIR, Panel, figure, write_json

REPO_ROOT = Path(__file__).resolve().parents[1]

MESHES = ("1x1", "1x2", "1x4", "2x2")
CHECKPOINTS = 5
TARGET_SECONDS = 0.3
SHAPE = dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=4, head_dim=64, vocab_size=4096)


def make_caches(work: Path) -> tuple[Path, Path]:
    """20 caches under ``work/cache`` and a hub cache of 20 repos under ``work/hub`` (made once)."""
    cache, hub = work / "cache", work / "hub"
    if (work / "ready").exists():
        return cache, hub
    import models  # noqa: F401  (mock cluster before ttnn)
    from models.llama import LlamaLoader
    from models.testing.tiny_models import make_checkpoint

    for index in range(CHECKPOINTS):
        checkpoint = make_checkpoint("llama", work / "checkpoints" / f"llama-{index}", seed=index, **SHAPE)
        for mesh in MESHES:
            LlamaLoader(checkpoint, mesh_shape=mesh, precision="bfloat16", cache_root=cache).seed()
            repo = hub / f"models--bench--llama-{index}-{mesh}"
            _hub_repo(checkpoint, repo)
    (work / "ready").touch()
    return cache, hub


def _hub_repo(checkpoint: Path, repo: Path) -> None:
    """The hub layout: blobs (hard links of the checkpoint's files), a snapshot of symlinks, refs/main."""
    revision = "0" * 40
    (repo / "snapshots" / revision).mkdir(parents=True)
    (repo / "blobs").mkdir()
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    for number, file in enumerate(sorted(checkpoint.iterdir())):
        blob = repo / "blobs" / f"{number:064x}"
        os.link(file, blob)
        (repo / "snapshots" / revision / file.name).symlink_to(Path("../../blobs") / blob.name)


def timed(command: list[str], runs: int, env: dict[str, str]) -> tuple[float, float]:
    """Median wall seconds and median CPU seconds (user + system: what a busy machine cannot
    inflate) of ``runs`` fresh processes, after one unmeasured warm-up run."""
    walls, cpus = [], []
    for run in range(runs + 1):
        start = time.perf_counter()
        child = subprocess.Popen(command, env=env, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            raise SystemExit(f"{' '.join(command)} failed with exit code {child.returncode}")
        if run:
            walls.append(time.perf_counter() - start)
            cpus.append(usage.ru_utime + usage.ru_stime)
    return statistics.median(walls), statistics.median(cpus)


def cache_files(cache: Path) -> list[str]:
    return sorted(str(p) for p in cache.rglob("*") if p.is_file() and not p.name.startswith(".readers"))


def plot(results: dict, path: Path) -> None:
    """Each command's wall seconds (log scale, the target line) beside verify's MiB/s against cat's."""
    seconds = results["seconds"]
    figure(path, [
        Panel("bars", {"fresh process, median": seconds}, title=f"20 caches, {results['cache_mib']:.0f} MiB",
              ylabel="wall seconds", log=True, value_format="{:.3f}", hlines={f"target {TARGET_SECONDS} s": TARGET_SECONDS}),
        Panel("bars", {"MiB/s": {"tt-cache verify": results["verify_mib_s"],
                                 **({"verify, 1 file at a time": results["verify_1_thread_mib_s"]}
                                    if "verify_1_thread_mib_s" in results else {}),
                                 "cat": results["cat_mib_s"]}},
              title="verify vs reading the files", ylabel="MiB/s", width=0.35),
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--work", type=Path, help="keep the caches here between runs (default: a temp dir)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT_DIR / "bench_cli.json")
    opts = parser.parse_args()
    work = opts.work or Path(tempfile.mkdtemp(prefix="bench-cli-"))
    try:
        cache, hub = make_caches(work)
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), TT_CACHE_PATH=str(cache))
        python, cli = sys.executable, [sys.executable, "-m", "models.tt_cache.cli"]
        hf = str(Path(sys.executable).parent / "hf")
        files = cache_files(cache)
        cache_mib = sum(os.path.getsize(f) for f in files) / 2**20
        measured = {
            "python -c pass": timed([python, "-c", "pass"], opts.runs, env),
            "tt-cache ls": timed([*cli, "ls", str(cache)], opts.runs, env),
            "tt-cache check": timed([*cli, "check", str(cache)], opts.runs, env),
            "hf cache ls": timed([hf, "cache", "ls", "--cache-dir", str(hub)], opts.runs, env),
            "tt-cache verify": timed([*cli, "verify", str(cache)], opts.runs, env),
            "tt-cache verify --threads 1": timed([*cli, "verify", "--threads", "1", str(cache)], opts.runs, env),
            "cat (every file)": timed(["sh", "-c", 'cat "$@" > /dev/null', "cat", *files], opts.runs, env),
            "import torch, ttnn": timed([python, "-c", "import models, torch, ttnn"], opts.runs, env),
        }
        seconds = {name: wall for name, (wall, _) in measured.items()}
        cpu = {name: used for name, (_, used) in measured.items()}
        results = {
            "caches": len(MESHES) * CHECKPOINTS, "cache_mib": round(cache_mib, 1), "runs": opts.runs,
            "seconds": {k: round(v, 4) for k, v in seconds.items()},
            "cpu_seconds": {k: round(v, 4) for k, v in cpu.items()},
            "load_average": os.getloadavg()[0],
            "verify_mib_s": round(cache_mib / seconds["tt-cache verify"], 1),
            "verify_1_thread_mib_s": round(cache_mib / seconds["tt-cache verify --threads 1"], 1),
            "cat_mib_s": round(cache_mib / seconds["cat (every file)"], 1),
            "ls_vs_hf_cache_ls": round(seconds["tt-cache ls"] / seconds["hf cache ls"], 2),
            "check_vs_hf_cache_ls": round(seconds["tt-cache check"] / seconds["hf cache ls"], 2),
            "target_seconds": TARGET_SECONDS,
        }
    finally:
        if opts.work is None:
            shutil.rmtree(work, ignore_errors=True)
    write_json(opts.out, results)
    plot(results, opts.out.with_suffix(".png"))
    print(f"20 caches, {cache_mib:,.0f} MiB; fresh processes, median of {opts.runs}; "
          f"load average {results['load_average']:.1f} on {os.cpu_count()} cores\n")
    print("| command | wall s | CPU s (user + sys) | wall vs `hf cache ls` | target (wall < 0.3 s) |\n"
          "| --- | --- | --- | --- | --- |")
    for name, value in seconds.items():
        target = ("met" if value < TARGET_SECONDS else "**missed**") if name in ("tt-cache ls", "tt-cache check") else ""
        print(f"| `{name}` | {value:.3f} | {cpu[name]:.3f} | {value / seconds['hf cache ls']:.2f}x | {target} |")
    print(f"\nverify: {results['verify_mib_s']:,.0f} MiB/s (one file at a time: {results['verify_1_thread_mib_s']:,.0f}); "
          f"cat of the same files: {results['cat_mib_s']:,.0f} MiB/s ({results['verify_mib_s'] / results['cat_mib_s']:.2f}x)")
    print(f"wrote {opts.out} and {opts.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
