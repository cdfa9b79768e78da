# SPDX-License-Identifier: Apache-2.0
"""The project's cold build against an upstream-style peer loop, side by side in one run.

    python scripts/bench_peer_loop.py                        # Gemma 3 270M and a 0.6 GB llama-shaped checkpoint
    python scripts/bench_peer_loop.py --models gemma3-270m --precision bfloat8_b bfloat16

Cases, each in a fresh process (imports excluded), run round-robin over ``--repeat`` rounds with
the checkpoint's pages warmed before each (``cat``), medians reported:

* ``naive``: the plainest upstream loop a new user writes: ``safetensors.torch.load_file``, transpose
  each 2-D weight, ``ttnn.as_tensor(..., cache_file_name=...)``, nothing else (no family layout:
  no fused QKV, no mesh placement, no norms in the device's form; no fsync, digest or marker).
* ``peer``: upstream model code with the same host transforms as the project: per weight, the
  family's layout, then ``ttnn.as_tensor`` (convert and dump, nothing else). Its summed
  ``ttnn.from_torch`` is timed by wrapping ``ttnn.from_torch``.
* ``load``: the project's cold ``WeightLoader.load()`` (weights kept; fsync, digests, sidecar,
  marker), with its time broken down (see :class:`models.common.cold_build.ColdBuilt`).
* ``seed``: the project's streaming ``WeightLoader.seed()`` (cache only, memory flat).

Targets (bfloat8_b): cold ``load()`` at most 1.2x the naive loop; at most 1.0x the peer loop.
Writes JSON and a PNG into ``--out-dir`` through the shared benchmark helper.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
from _bench_output import DEFAULT_OUT_DIR, bar_chart, write_json

CHILD = r"""
import json, os, sys, time
from models.common.device_env import ensure_host_cluster
ensure_host_cluster()
import torch, ttnn
from models.common.measure import peak_rss_mib
IMPORT_PEAK_MIB = peak_rss_mib()
from models.common.checkpoint import read_config, resolve_checkpoint_dir
from models.common.safetensors_file import CheckpointReader
from models.common.conversion import LazyStateDict, WeightSink
from models.registry import family_of, loader_class
case, model, precision, cache_root = sys.argv[1:5]
cls = loader_class(family_of(read_config(resolve_checkpoint_dir(model))))
loader = cls(model, precision=precision, cache_root=cache_root)
result = {}
if case == "naive":
    from safetensors.torch import load_file
    dtype = {"bfloat8_b": ttnn.bfloat8_b, "bfloat16": ttnn.bfloat16}[precision]
    t0 = time.perf_counter()
    files = sorted(loader.checkpoint_dir.glob("*.safetensors"))
    count = 0
    for file in files:
        for name, tensor in load_file(file).items():
            if tensor.dim() == 2:
                tensor = tensor.transpose(0, 1)
            ttnn.as_tensor(tensor, dtype=dtype, layout=ttnn.TILE_LAYOUT, cache_file_name=os.path.join(cache_root, name))
            count += 1
    result = {"seconds": time.perf_counter() - t0, "weights": count}
elif case == "peer":
    spent = [0.0]
    original = ttnn.from_torch
    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return original(*a, **k)
        finally:
            spent[0] += time.perf_counter() - t
    ttnn.from_torch = timed
    class PeerSink(WeightSink):
        def put(self, name, tensor, fmt):
            self.formats[name] = fmt
            ttnn.as_tensor(tensor, dtype=fmt.dtype, layout=fmt.layout, cache_file_name=os.path.join(cache_root, name))
    t0 = time.perf_counter()
    args = loader.make_args(loader.model_config(), None)
    sink = PeerSink(None, LazyStateDict(CheckpointReader(loader.checkpoint_dir, loader.key_rules)), [])
    loader.convert(sink, args)
    result = {"seconds": time.perf_counter() - t0, "from_torch": spent[0], "weights": len(sink.formats)}
elif case == "load":
    t0 = time.perf_counter()
    loaded = loader.load()
    assert not loaded.warm
    result = {"seconds": time.perf_counter() - t0, **loaded.timings, "weights": len(loaded.weights)}
elif case == "seed":
    t0 = time.perf_counter()
    seeded = loader.seed()
    assert not seeded.warm and seeded.complete
    result = {"seconds": time.perf_counter() - t0, "weights": seeded.files}
result |= {"peak_mib": peak_rss_mib(), "import_peak_mib": IMPORT_PEAK_MIB}
print("RESULT " + json.dumps(result), flush=True)
"""

CASES = ("naive", "peer", "load", "seed")


def run_case(case: str, model: str, precision: str, workdir: Path) -> dict:
    cache_root = workdir / f"cache-{case}"
    shutil.rmtree(cache_root, ignore_errors=True)
    cache_root.mkdir(parents=True)
    for file in Path(model).glob("*.safetensors"):  # page cache warm for every case alike
        subprocess.run(["cat", str(file.resolve())], stdout=subprocess.DEVNULL, check=True)
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    env.pop("TT_TRANSFORMERS_FORCE_MODEL_LOAD", None)
    proc = subprocess.run([sys.executable, "-c", CHILD, case, model, precision, str(cache_root)], env=env, cwd=REPO,
                          capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"{case} failed:\n{proc.stderr[-3000:]}")
    shutil.rmtree(cache_root, ignore_errors=True)
    return json.loads(lines[-1][7:])


def resolve_model(name: str, workdir: Path) -> str:
    """A known real model's name (prepared if needed), ``llama-0.6gb`` (made here) or a checkpoint dir."""
    from models.demos.real_models.known import UnknownModelError, known_model

    try:
        known_model(name)
    except UnknownModelError:
        pass
    else:
        from models.demos.real_models.prepare import prepare_model

        return str(prepare_model(name))
    if name == "llama-0.6gb":
        from models.testing.llama_shaped import make_in_child

        return str(make_in_child(workdir / "llama-0.6gb", 4))
    return name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["gemma3-270m", "llama-0.6gb"])
    parser.add_argument("--precision", nargs="+", default=["bfloat8_b"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/tt-bench-peer"))
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    parser.add_argument("--keep", action="store_true", help="keep the made checkpoints in --workdir")
    opts = parser.parse_args()
    report = {}
    try:
        for name in opts.models:
            model = resolve_model(name, opts.workdir)
            for precision in opts.precision:
                samples: dict[str, list[dict]] = {case: [] for case in CASES}
                for _ in range(opts.repeat):
                    for case in CASES:
                        samples[case].append(run_case(case, model, precision, opts.workdir))
                med = {case: {k: statistics.median(r[k] for r in rows) for k in rows[0] if k != "weights"}
                       for case, rows in samples.items()}
                report[f"{name} {precision}"] = {"samples": samples, "medians": med}
                print_table(name, precision, med)
    finally:
        if not opts.keep:
            shutil.rmtree(opts.workdir / "llama-0.6gb", ignore_errors=True)
    out = write_json(opts.out_dir / "bench_peer_loop.json", report)
    plot(report, out.with_suffix(".png"))


def print_table(name: str, precision: str, med: dict) -> None:
    naive, peer, floor = med["naive"]["seconds"], med["peer"]["seconds"], med["peer"]["from_torch"]
    print(f"\n### {name}, {precision} (median of rounds, {os.cpu_count()} cores)")
    print("| case | seconds | x naive loop | x peer loop |\n| --- | --- | --- | --- |")
    print(f"| naive loop (load_file, transpose, as_tensor) | {naive:.3f} | 1.00x | {naive / peer:.2f}x |")
    print(f"| peer loop (family layout, as_tensor) | {peer:.3f} | {peer / naive:.2f}x | 1.00x |")
    print(f"| peer's summed ttnn.from_torch | {floor:.3f} | {floor / naive:.2f}x | {floor / peer:.2f}x |")
    for case, label in (("load", "project cold load()"), ("seed", "project seed() (streaming)")):
        s = med[case]["seconds"]
        print(f"| {label} | {s:.3f} | {s / naive:.2f}x | {s / peer:.2f}x |")
    load = med["load"]
    parts = ["convert", "from_torch", "writer_wait", "dump", "fsync", "finish", "seal", "publish", "retire"]
    print("\nproject cold load(), where the time goes (s; dump and fsync run on the writer thread, overlapped):")
    print("| " + " | ".join(parts) + " |\n|" + " --- |" * len(parts))
    print("| " + " | ".join(f"{load.get(part, 0.0):.3f}" for part in parts) + " |")


def plot(report: dict, path: Path) -> None:
    series = {"naive loop": lambda m: m["naive"]["seconds"], "peer's from_torch": lambda m: m["peer"]["from_torch"],
              "peer loop": lambda m: m["peer"]["seconds"],
              "project load()": lambda m: m["load"]["seconds"], "project seed()": lambda m: m["seed"]["seconds"]}
    groups = {label: {name: get(entry["medians"]) for name, get in series.items()} for label, entry in report.items()}
    bar_chart(path, groups, title="cold build: project vs upstream-style peer loop",
              ylabel="cold build seconds (median)", value_format="{:.2f}")
    print(f"wrote {path} and {path.with_suffix('.json')}")


if __name__ == "__main__":
    main()
