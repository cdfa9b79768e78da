# SPDX-License-Identifier: Apache-2.0
"""What the content-addressed cache identity costs, on the real Gemma 3 270M.

    python scripts/bench_identity.py [--repeat 5] [--out docs/bench_identity.json]

Measured side by side in one run (medians, page cache warm):

* ``content id, first sight``: SHA-256 of the checkpoint's files with no stamps recorded (what a
  cold build, or the first load of a fresh copy of the checkpoint, pays once);
* ``content id, stamps hit``: the same identity from recorded stat stamps (every later start);
* ``gate``: the completeness gate of the warm cache (stat-only path);
* ``warm-start process`` vs ``bare import torch, ttnn``: whole fresh processes.
Writes JSON and a PNG next to it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
from _bench_output import bar_chart  # noqa: E402

WARM_START = """
import sys, time
t = time.perf_counter()
from models.gemma import Gemma3Loader
loaded = Gemma3Loader(sys.argv[1], precision="bfloat16", cache_root=sys.argv[2]).load()
assert loaded.warm, loaded.reason
"""


def timed_process(args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, *args], check=True, capture_output=True, cwd=REPO)
    return time.perf_counter() - start


def median_of(repeat: int, measure) -> float:
    return statistics.median(measure() for _ in range(repeat))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "bench_identity.json")
    options = parser.parse_args()

    from models.common.checkpoint import DigestStamps, content_id
    from models.common.weight_cache.marker import weight_cache_status
    from models.demos.gemma3_270m.prepare import prepare_gemma3_270m
    from models.gemma import Gemma3Loader

    snapshot = Path(prepare_gemma3_270m())
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        loader = Gemma3Loader(snapshot, precision="bfloat16", cache_root=root / "cache")
        cold = loader.load()
        assert not cold.warm

        def first_sight() -> float:
            store = Path(tempfile.mkdtemp(dir=root))
            start = time.perf_counter()
            content_id(snapshot, DigestStamps(store, snapshot))
            return time.perf_counter() - start

        stamps = root / "stamps"
        content_id(snapshot, DigestStamps(stamps, snapshot))

        def stamps_hit() -> float:
            start = time.perf_counter()
            content_id(snapshot, DigestStamps(stamps, snapshot))
            return time.perf_counter() - start

        args = loader.make_args(loader.model_config(), None)

        def gate() -> float:
            start = time.perf_counter()
            status = weight_cache_status(loader.cache_dir, model_name=loader.model_name, n_layers=args.n_layers,
                                         mesh_shape=loader.mesh_shape, components=loader.components,
                                         build_variant=loader.build_variant)
            assert status.warm
            return time.perf_counter() - start

        results = {
            "checkpoint_mib": sum(p.stat().st_size for p in snapshot.glob("*.safetensors")) / 2**20,
            "cold_build_s": cold.seconds,
            "content_id_first_sight_s": median_of(options.repeat, first_sight),
            "content_id_stamps_hit_s": median_of(options.repeat, stamps_hit),
            "gate_s": median_of(options.repeat, gate),
        }
        warm, bare = [], []
        for _ in range(options.repeat):  # alternated, so machine noise hits both alike
            bare.append(timed_process(["-c", "import torch, ttnn"]))
            warm.append(timed_process(["-c", WARM_START, str(snapshot), str(root / "cache")]))
        results["bare_import_process_s"] = statistics.median(bare)
        results["warm_start_process_s"] = statistics.median(warm)

    ratio = results["warm_start_process_s"] / results["bare_import_process_s"]
    print("| measurement (Gemma 3 270M, bf16) | median |")
    print("| --- | --- |")
    print(f"| content id, first sight ({results['checkpoint_mib']:.0f} MiB hashed) | "
          f"{results['content_id_first_sight_s'] * 1e3:.0f} ms ({results['content_id_first_sight_s'] / results['cold_build_s']:.0%} of a {results['cold_build_s']:.2f} s cold build) |")
    print(f"| content id, stamps hit (warm start) | {results['content_id_stamps_hit_s'] * 1e3:.2f} ms |")
    print(f"| gate, stat-only | {results['gate_s'] * 1e3:.2f} ms |")
    print(f"| warm-start process / bare `import torch, ttnn` | {results['warm_start_process_s']:.2f} s / "
          f"{results['bare_import_process_s']:.2f} s = {ratio:.2f}x (target <= 1.3x) |")
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps(results, indent=2))
    _plot(results, options.out.with_suffix(".png"))


def _plot(results: dict, path: Path) -> None:
    labels = {"content id, first sight": "content_id_first_sight_s", "content id, stamps hit": "content_id_stamps_hit_s",
              "gate": "gate_s", "bare import process": "bare_import_process_s",
              "warm start process": "warm_start_process_s"}
    bar_chart(path, {"Gemma 3 270M, bfloat16": {label: results[key] * 1e3 for label, key in labels.items()}},
              title="Cost of the content identity", ylabel="ms (log)", log=True)


if __name__ == "__main__":
    main()
