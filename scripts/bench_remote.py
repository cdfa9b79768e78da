# SPDX-License-Identifier: Apache-2.0
"""The shared store against ``s5cmd``, side by side in one run, on one SeaweedFS S3 server on loopback.

    python scripts/bench_remote.py                                # Qwen2.5-Coder-0.5B, Llama-3.1-8B-shaped
    python scripts/bench_remote.py --cases llama-3.1-70b          # a 7 GB checkpoint (2 layers)
    python scripts/bench_remote.py --cases qwen2.5-coder-1.5b --append   # add rows to the JSON of an earlier run

Each case is an N150 variant (``--precision``, bfloat8_b by default) built cold from its checkpoint here
(a real Qwen2.5-Coder, prepared once by ``models.demos.real_models.prepare``, or a 2-layer checkpoint of
a model's shapes from ``models.testing.model_shapes``), then, ``--repeat`` rounds each, alternating:

* **push**: ``push_cache_dir`` (every object hashed as read, checked against its name) against
  ``s5cmd cp 'DIR/*' s3://...`` of the same variant dir to the same server (empty prefixes each round);
* **pull**: ``pull_variant`` into an empty root (each object hashed as written and checked, made
  durable, the marker last) against ``s5cmd cp`` back followed by ``sync`` (the same durability);
  the page cache is dropped before each pull when this runs as root;
* **a second push** of the unchanged variant: the bytes it sends (none) and its time;
* **a new machine to a warm start**, the cache-only deploy: a copy of the checkpoint dir without its
  weights (config and tokenizer), an empty cache root and ``TT_CACHE_REMOTE`` set; one fresh
  ``load()`` process pulls the variant and loads it warm. Against the cold build from the checkpoint
  (a fresh process), alternating, ``--repeat`` rounds each (the median); page cache dropped before
  each. Also ``tt-cache pull`` then a warm ``load()`` of the checkpoint itself (two processes; the
  second hashes the checkpoint to know its variant).

Throughput is MiB of the variant per second (the median round); a ratio is ours over s5cmd's (the
target: >= 0.9). The machine's load average is recorded: other work on it moves every figure.
Writes ``docs/bench_remote.json`` and ``.png`` after each case (``--append``: the rows of an earlier
run are kept unless this run measures the same case and precision); deletes everything it made under
``--workdir``, the shaped checkpoints too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

from _bench_output import Panel, figure, write_json  # noqa: E402

from models.testing.object_store import start_seaweed, stop_seaweed  # noqa: E402

MIB = 1 << 20
REAL = {"qwen2.5-coder-0.5b": "Qwen2.5-Coder-0.5B", "qwen2.5-coder-1.5b": "Qwen2.5-Coder-1.5B"}


def drop_caches() -> bool:
    """Write back, then drop the page cache (root only): every pull starts from the disk."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3")
        return True
    except OSError:
        return False


def checkpoint_of(case: str, workdir: Path, layers: int) -> tuple[Path, bool]:
    """(checkpoint dir, made here: delete it after). A shape's is laid out as a hub snapshot, so that
    its model id (``shapes/<case>``) is the same wherever a copy of it is."""
    if case in REAL:
        from models.demos.real_models.prepare import prepare_model

        return Path(prepare_model(case)), False
    from models.testing.model_shapes import make_shaped_checkpoint

    snapshot = workdir / "hub" / f"models--shapes--{case}" / "snapshots" / "main"
    return Path(make_shaped_checkpoint(snapshot, case, layers)), True


def weightless_copy(checkpoint: Path, root: Path) -> Path:
    """What a cache-only deploy has of ``checkpoint``: its files but the weights, at the same
    hub-snapshot path under ``root`` (the same model id)."""
    copy = root.joinpath(*checkpoint.parts[-4:])
    shutil.copytree(checkpoint, copy, ignore=shutil.ignore_patterns("*.safetensors*"))  # as the tests' deploys
    return copy


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", **extra)
    for name in ("TT_TRANSFORMERS_FORCE_MODEL_LOAD", "TT_CONVERT_WORKERS"):
        env.pop(name, None)
    return env


def load_process(checkpoint: Path, precision: str, cache_root: Path, **env: str) -> dict:
    """A ``load()`` in a fresh process (``models.testing.seed_child``): its report and wall seconds."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "models.testing.seed_child", "load", str(checkpoint), precision,
                           str(cache_root), "1x1"], cwd=REPO, env=child_env(**env), capture_output=True, text=True)
    wall = time.perf_counter() - start
    lines = [line for line in proc.stdout.splitlines() if line.startswith("SEED_REPORT ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"load failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return {**json.loads(lines[-1].split(" ", 1)[1]), "wall": wall}


def s5cmd(server, *args: str) -> float:
    binary = Path(sys.executable).parent / "s5cmd"
    start = time.perf_counter()
    subprocess.run([str(binary if binary.exists() else "s5cmd"), "--endpoint-url", server.endpoint, *args],
                   env=server.client_env(), check=True, capture_output=True)
    return time.perf_counter() - start


def bench_case(case: str, server, opts: argparse.Namespace) -> dict:
    from models.common.weight_cache.remote.pull import pull_variant, trusted_manifest
    from models.common.weight_cache.remote.push import push_cache_dir
    from models.common.weight_cache.remote.s3 import S3Store

    work = opts.workdir / f"{case}-{opts.precision}"
    checkpoint, made = checkpoint_of(case, opts.workdir, opts.layers)
    drop_caches()
    cold = load_process(checkpoint, opts.precision, work / "built")
    (marker,) = (work / "built").rglob(".weights_complete.*")
    variant = marker.parent
    mib = sum(f.stat().st_size for f in variant.rglob("*") if f.is_file()) / MIB
    print(f"{case} {opts.precision}: variant {mib:,.0f} MiB, cold build process {cold['wall']:.1f} s", flush=True)
    rounds: dict[str, list[float]] = {"push": [], "s5cmd push": [], "pull": [], "s5cmd pull + sync": []}
    for index in range(opts.repeat):
        prefix = f"{case}-{opts.precision}"
        store = S3Store(server.bucket, f"{prefix}/ours-{index}")
        start = time.perf_counter()
        (pushed,) = push_cache_dir(variant, store)
        rounds["push"].append(time.perf_counter() - start)
        rounds["s5cmd push"].append(s5cmd(server, "cp", f"{variant}/*", f"s3://{server.bucket}/{prefix}/s5-{index}/"))
        drop_caches()
        start = time.perf_counter()
        _, manifest = trusted_manifest(store, pushed.variant_key)
        pulled = pull_variant(store, manifest, work / f"pulled-{index}")
        rounds["pull"].append(time.perf_counter() - start)
        assert pulled.warm and pulled.objects_fetched == pulled.objects, pulled.summary()
        shutil.rmtree(work / f"pulled-{index}")
        drop_caches()
        start = time.perf_counter()
        s5cmd(server, "cp", f"s3://{server.bucket}/{prefix}/s5-{index}/*", f"{work / 's5-pulled'}/")
        os.sync()
        rounds["s5cmd pull + sync"].append(time.perf_counter() - start)
        shutil.rmtree(work / "s5-pulled")
        print(f"  round {index + 1}: " + ", ".join(f"{name} {times[-1]:.2f} s" for name, times in rounds.items())
              + f" (load {os.getloadavg()[0]:.1f})", flush=True)
    start = time.perf_counter()
    (again,) = push_cache_dir(variant, store)
    second = {"seconds": time.perf_counter() - start, "bytes_sent": again.bytes_sent, "objects_sent": again.objects_sent}
    # a new machine: config and tokenizer only, an empty cache root, nothing in the page cache, one
    # process; alternating with cold builds from the checkpoint (the first was the one above)
    deploy = weightless_copy(checkpoint, work / "deploy")
    starts: dict[str, list[float]] = {"cold build": [cold["wall"]], "new machine": []}
    for index in range(opts.repeat):
        if index:
            drop_caches()
            starts["cold build"].append(load_process(checkpoint, opts.precision, work / f"built-{index}")["wall"])
            shutil.rmtree(work / f"built-{index}")
        drop_caches()
        cache_only = load_process(deploy, opts.precision, work / "deploy-cache",
                                  **server.client_env({}, TT_CACHE_REMOTE=store.url))
        assert cache_only["warm_before"], "the cache-only deploy did not start warm from the store"
        starts["new machine"].append(cache_only["wall"])
        shutil.rmtree(work / "deploy-cache")
        print(f"  start {index + 1}: cold build {starts['cold build'][-1]:.1f} s, new machine {cache_only['wall']:.1f} s "
              f"(load {os.getloadavg()[0]:.1f})", flush=True)
    # the same with the checkpoint there: tt-cache pull, then a load that proves the checkpoint's variant
    drop_caches()
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "models.tt_cache.cli", "pull", "--from", store.url, pushed.variant_key,
                    "--cache-root", str(work / "new-machine")], cwd=REPO, env=child_env(**server.client_env({})),
                   check=True, capture_output=True)
    pull_wall = time.perf_counter() - start
    warm = load_process(checkpoint, opts.precision, work / "new-machine")
    assert warm["warm_before"], "the pulled variant did not start warm"
    median = {name: statistics.median(times) for name, times in rounds.items()}
    shutil.rmtree(work, ignore_errors=True)
    if made:
        shutil.rmtree(checkpoint, ignore_errors=True)
    return {"case": case, "precision": opts.precision, "variant_mib": mib, "objects": pushed.objects, "rounds": rounds, "median": median,
            "push_ratio": median["s5cmd push"] / median["push"], "pull_ratio": median["s5cmd pull + sync"] / median["pull"],
            "second_push": second, "starts": starts, "cold_build_wall": statistics.median(starts["cold build"]),
            "new_machine": {"wall": statistics.median(starts["new machine"])},
            "with_checkpoint": {"pull_wall": pull_wall, "warm_load_wall": warm["wall"],
                                "warm_load_seconds": warm["seconds"], "total": pull_wall + warm["wall"]}}


def label(row: dict) -> str:
    return f"{row['case']} {row.get('precision', 'bfloat8_b')}"


def print_table(rows: list[dict]) -> None:
    print(f"\n### Shared store vs s5cmd (N150; SeaweedFS on loopback; {os.cpu_count()} cores; median round)")
    print("| case | variant | push / s5cmd cp (MiB/s) | ratio | pull / s5cmd cp + sync (MiB/s) | ratio | "
          "second push (sent, s) | new machine (config + tokenizer): pulled and warm / cold build (s) | "
          "with the checkpoint: tt-cache pull + warm load (s) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        m, new, there = r["median"], r["new_machine"], r["with_checkpoint"]
        mib = r["variant_mib"]
        print(f"| {label(r)} | {mib:,.0f} MiB, {r['objects']} objects | {mib / m['push']:.0f} / {mib / m['s5cmd push']:.0f} | "
              f"{r['push_ratio']:.2f}x | {mib / m['pull']:.0f} / {mib / m['s5cmd pull + sync']:.0f} | {r['pull_ratio']:.2f}x | "
              f"{r['second_push']['bytes_sent']} B, {r['second_push']['seconds']:.2f} s | "
              f"{new['wall']:.1f} / {r['cold_build_wall']:.1f} ({new['wall'] / r['cold_build_wall']:.2f}x) | "
              f"{there['pull_wall']:.1f} + {there['warm_load_wall']:.1f} = {there['total']:.1f} |")


def plot(rows: list[dict], path: Path) -> None:
    throughput = {label(r): {name: r["variant_mib"] / seconds for name, seconds in r["median"].items()} for r in rows}
    start = {label(r): {"cold build (process)": r["cold_build_wall"],
                         "new machine: pulled and warm (process)": r["new_machine"]["wall"]} for r in rows}
    figure(path, [
        Panel("bars", throughput, title="push and pull vs s5cmd (SeaweedFS, loopback)", ylabel="MiB/s of the variant"),
        Panel("bars", start, title="a new machine (config + tokenizer) vs cold build", ylabel="seconds (wall)"),
    ])
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", default=["qwen2.5-coder-0.5b", "llama-3.1-8b"],
                        help="qwen2.5-coder-0.5b (real) or a shape of models.testing.model_shapes (llama-3.1-70b: 7 GB)")
    parser.add_argument("--precision", default="bfloat8_b")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/tt-bench-remote"))
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "bench_remote.json")
    parser.add_argument("--append", action="store_true", help="keep the rows of --out of other cases or precisions")
    opts = parser.parse_args()
    if opts.workdir.exists():
        raise SystemExit(f"bench_remote: {opts.workdir} exists; remove it or pass another --workdir")
    load_before = os.getloadavg()
    server = start_seaweed(opts.workdir / "seaweed")
    os.environ.update(server.client_env())  # this process's own push and pull: the test server's key pair
    rows = json.loads(opts.out.read_text())["rows"] if opts.append and opts.out.exists() else []
    try:
        for case in opts.cases:
            row = bench_case(case, server, opts)
            row["load_average"] = {"before": load_before, "after": os.getloadavg()}
            rows = [r for r in rows if label(r) != label(row)] + [row]
            write_json(opts.out, {"mesh": "1x1 (N150)", "root": os.geteuid() == 0, "rows": rows})
            plot(rows, opts.out.with_suffix(".png"))
            load_before = os.getloadavg()
    finally:
        stop_seaweed(server)
        shutil.rmtree(opts.workdir, ignore_errors=True)
    print_table(rows)


if __name__ == "__main__":
    main()
