#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""``tt-cache seed --check`` as the validate job runs it: the light install against the full one.

A small plan (a llama-shaped checkpoint of one layer, 336 MiB, bfloat8_b on N150, and a tiny llama on
N150 and N300, bfloat16) is seeded once by the full install. Then, side by side in one run,
alternating, each a fresh process with a fresh ``HOME`` (a fresh CI container: no user stamp
index) on a read-only bind mount of the cache when this process may mount (root), else on the
cache itself:

* ``seed --check`` on the full install (``.venv``) and on the light install (``setup_light_env.sh``);
* per process: wall seconds, CPU seconds (user + sys: the children's rusage), and bytes read (``rchar`` of
  ``/proc/self/io`` at exit: every ``read`` the process made, imports included), and the bytes of
  the plan's checkpoints, which a check must not read (the seeder's stamps in the cache root vouch
  for them).

Also: the light venv's set-up time from the warm uv cache and both venvs' size on disk.

usage: .venv/bin/python scripts/bench_light_check.py [--runs 7] [--work DIR] [--out-dir docs]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "scripts"))

from _bench_output import write_results  # noqa: E402

# Runs ``tt-cache`` as its console script does (its arguments after the first), and writes this
# process's I/O counters at exit to the file its first argument names.
WRAPPER = """
import atexit, json, sys
io_out = sys.argv[1]
def _io():
    fields = dict(line.split(": ") for line in open("/proc/self/io").read().splitlines())
    with open(io_out, "w") as out:
        json.dump({key: int(value) for key, value in fields.items()}, out)
atexit.register(_io)
sys.argv = ["tt-cache", *sys.argv[2:]]
from models.tt_cache.cli import main
sys.exit(main())
"""


def run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(argv)} exited with {done.returncode}:\n{done.stderr[-3000:]}")
    return done


def prepare(work: Path) -> tuple[Path, Path]:
    """The checkpoints, the plan and the cache seeded by the full install (made once)."""
    plan, cache = work / "plan.yaml", work / "cache"
    if (work / "ready").exists():
        return plan, cache
    run([sys.executable, "-m", "models.testing.llama_shaped", str(work / "llama-1layer"), "1"],
        {**os.environ, "PYTHONPATH": str(REPO_ROOT)}, REPO_ROOT)
    run([sys.executable, "-c", "import sys; from pathlib import Path; from models.testing.tiny_models import "
         "make_checkpoint; make_checkpoint('llama', Path(sys.argv[1]))", str(work / "tiny-llama")],
        {**os.environ, "PYTHONPATH": str(REPO_ROOT)}, REPO_ROOT)
    plan.write_text(json.dumps({"models": [
        {"model": str(work / "llama-1layer"), "meshes": ["N150"], "precisions": ["bfloat8_b"]},
        {"model": str(work / "tiny-llama"), "meshes": ["N150", "N300"], "precisions": ["bfloat16"]},
    ]}))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TT_CACHE_PATH": str(cache), "HF_HUB_OFFLINE": "1"}
    run([sys.executable, "-m", "models.tt_cache.cli", "seed", "--plan", str(plan)], env, REPO_ROOT)
    (work / "ready").touch()
    return plan, cache


def light_venv(work: Path) -> tuple[Path, float]:
    venv = work / "venv-light"
    shutil.rmtree(venv, ignore_errors=True)
    start = time.perf_counter()
    run(["bash", str(REPO_ROOT / "scripts" / "setup_light_env.sh")],
        {**os.environ, "TT_VENV": str(venv), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}, work)
    return venv, time.perf_counter() - start


def readonly_view(cache: Path, work: Path) -> tuple[Path, bool]:
    """A read-only bind mount of the cache (root only), else the cache itself."""
    view = work / "ro-view"
    view.mkdir(exist_ok=True)
    if subprocess.run(["mount", "--bind", str(cache), str(view)], capture_output=True).returncode:
        return cache, False
    if subprocess.run(["mount", "-o", "remount,ro,bind", str(view)], capture_output=True).returncode:
        subprocess.run(["umount", str(view)], check=True)
        return cache, False
    return view, True


def check_once(python: Path, plan: Path, cache: Path, work: Path) -> dict[str, float]:
    """One ``seed --check`` process in a fresh HOME: wall s, bytes read, the gates' own seconds."""
    home = Path(tempfile.mkdtemp(prefix="home-", dir=work))
    io_out = home / "io.json"
    env = {"PATH": f"{python.parent}:/usr/bin:/bin", "HOME": str(home), "TT_CACHE_PATH": str(cache),
           "HF_HUB_OFFLINE": "1"}
    start = time.perf_counter()
    child = subprocess.Popen([str(python), "-c", WRAPPER, str(io_out), "seed", "--plan", str(plan), "--check", "--json"],
                             env=env, cwd=home, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = child.communicate()
    wall = time.perf_counter() - start
    if child.returncode:
        raise SystemExit(f"seed --check exited with {child.returncode}:\n{err[-3000:]}")
    document = json.loads(out[out.index("{"):])
    assert document["statistics"]["cache_hit"], document
    counters = json.loads(io_out.read_text())
    shutil.rmtree(home)
    return {"wall_s": wall, "rchar": counters["rchar"], "read_bytes": counters["read_bytes"],
            "check_s": document["seconds"]}


def cpu_seconds_of(python: Path, plan: Path, cache: Path, work: Path) -> tuple[dict[str, float], float]:
    """:func:`check_once` plus the child's CPU seconds (this process's children's rusage delta)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = check_once(python, plan, cache, work)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return result, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def du(path: Path) -> int:
    return int(subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--work", type=Path, help="scratch dir (kept; default: a temp dir, removed)")
    parser.add_argument("--out-dir", type=Path, default=REPO_ROOT / "docs")
    options = parser.parse_args()
    work = options.work or Path(tempfile.mkdtemp(prefix="bench-light-"))
    work.mkdir(parents=True, exist_ok=True)
    plan, cache = prepare(work)
    venv, setup_s = light_venv(work)
    view, readonly = readonly_view(cache, work)
    checkpoints = sum(du(work / name) for name in ("llama-1layer", "tiny-llama"))
    installs = {"full": Path(sys.executable), "light": venv / "bin" / "python"}
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in installs}
    try:
        for _ in range(options.runs):  # alternating: both see the same machine load
            for name, python in installs.items():
                result, cpu = cpu_seconds_of(python, plan, view, work)
                rows[name].append({**result, "cpu_s": cpu})
    finally:
        if readonly:
            subprocess.run(["umount", str(view)], check=True)
    median = {name: {key: statistics.median(row[key] for row in runs) for key in runs[0]}
              for name, runs in rows.items()}
    sizes = {"full": du(Path(sys.executable).parents[1]), "light": du(venv)}
    load = os.getloadavg()[0]
    print(f"seed --check of a 3-variant plan ({checkpoints / 2**20:,.0f} MiB of checkpoints), fresh HOME, "
          f"{'read-only bind mount' if readonly else 'read-write cache'}; median of {options.runs}, "
          f"load average {load:.1f}\n")
    print("| install | process wall s | CPU s | bytes read (rchar) | from disk (read_bytes) | gates s | venv size |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in installs:
        m = median[name]
        print(f"| {name} | {m['wall_s']:.3f} | {m['cpu_s']:.3f} | {m['rchar'] / 2**20:,.2f} MiB | "
              f"{m['read_bytes'] / 2**20:,.2f} MiB | {m['check_s']:.3f} | {sizes[name] / 2**20:,.0f} MiB |")
    ratio = {key: median["light"][key] / median["full"][key] for key in ("wall_s", "cpu_s", "rchar")}
    print(f"\nlight / full: wall {ratio['wall_s']:.2f}x, CPU {ratio['cpu_s']:.2f}x, bytes read {ratio['rchar']:.2f}x; "
          f"venv {sizes['light'] / sizes['full']:.4f}x; light set-up {setup_s:.1f} s (warm uv cache)")
    results = {"plan_variants": 3, "checkpoint_bytes": checkpoints, "readonly_mount": readonly, "runs": options.runs,
               "load_average": load, "median": median, "per_run": rows, "venv_bytes": sizes,
               "light_setup_s": setup_s, "light_over_full": ratio}
    write_results(options.out_dir, "bench_light_check", results, {"": {
        "groups": {"process wall s": {n: median[n]["wall_s"] for n in installs},
                   "CPU s": {n: median[n]["cpu_s"] for n in installs},
                   "MiB read (rchar)": {n: median[n]["rchar"] / 2**20 for n in installs}},
        "title": f"tt-cache seed --check, full vs light install (median of {options.runs}, fresh HOME)",
        "ylabel": "seconds / MiB"}})
    if options.work is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
