# SPDX-License-Identifier: Apache-2.0
"""What the cache identity and the warm gate cost, on the real Gemma 3 270M.

    python scripts/bench_identity.py [--repeat 5]

Measured side by side in one run (medians, page cache warm), on the prepared snapshot laid out
as the hub lays out a download (files are symlinks to ``blobs/<sha256>``):

* ``content id, first sight``: every file hashed (the hub blobs verified against their names),
  no stamps recorded: what the first load of a checkpoint on a host pays, once;
* ``content id, stamped``: the same id from the recorded stamps (every later start);
* ``SHA-256 of the mapped weights``: the alternative the design weighed, hashing the bytes while
  the cold build reads them anyway, would still pay this (only the separate read would go);
* ``gate``: the completeness gate of the warm cache (stat-only path);
* ``warm-start process`` vs ``bare import torch, ttnn``: whole fresh processes, alternated.
Writes JSON and a PNG into docs/ through the shared benchmark helper.
"""

from __future__ import annotations

import argparse
import hashlib
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _bench_output import DEFAULT_OUT_DIR, bar_chart, write_json

REPO = Path(__file__).resolve().parent.parent

WARM_START = """
import sys
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


def as_blob_snapshot(snapshot: Path, hub: Path) -> Path:
    """A copy of a snapshot in the hub's own layout: each file a symlink to ``blobs/<sha256>``."""
    repo = hub / "models--google--gemma-3-270m"
    target = repo / "snapshots" / "bench"
    target.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for file in snapshot.iterdir():
        if file.name.startswith("."):
            continue
        digest = hashlib.sha256(file.read_bytes()).hexdigest()
        shutil.copyfile(file, repo / "blobs" / digest)
        (target / file.name).symlink_to(os.path.relpath(repo / "blobs" / digest, target))
    return target


def sha256_of_mapped(path: Path) -> None:
    with open(path, "rb") as stream, mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ) as view:
        hashlib.sha256(view).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    options = parser.parse_args()

    from models.common.weight_cache.identity import content_id
    from models.common.weight_cache.stamps import StampIndex
    from models.demos.real_models.prepare import prepare_gemma3_270m
    from models.gemma import Gemma3Loader

    prepared = Path(prepare_gemma3_270m())
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        snapshot = as_blob_snapshot(prepared, root / "hub")
        time.sleep(0.1)  # past the clock tick of the copies: their stamps settle

        def cold_build() -> float:
            loader = Gemma3Loader(snapshot, precision="bfloat16", cache_root=root / "cold", force=True)
            return loader.load().seconds

        weights = [f for f in snapshot.iterdir() if f.suffix == ".safetensors"]

        def hash_mapped() -> float:
            start = time.perf_counter()
            for file in weights:
                sha256_of_mapped(file)
            return time.perf_counter() - start

        def first_sight() -> float:
            index = StampIndex(Path(tempfile.mkdtemp(dir=root)) / "stamps.json")
            start = time.perf_counter()
            content_id(snapshot, index)
            return time.perf_counter() - start

        stamps = StampIndex(root / "stamps.json")
        content_id(snapshot, stamps)

        def stamped() -> float:
            start = time.perf_counter()
            content_id(snapshot, StampIndex(root / "stamps.json"))
            return time.perf_counter() - start

        loader = Gemma3Loader(snapshot, precision="bfloat16", cache_root=root / "cache")
        assert not loader.load().warm
        args = loader.make_args(loader.model_config(), None)

        def gate() -> float:
            start = time.perf_counter()
            assert loader.status(args).warm
            return time.perf_counter() - start

        results = {
            "checkpoint_mib": sum(f.stat().st_size for f in weights) / 2**20,
            "content_id_first_sight_s": median_of(options.repeat, first_sight),
            "content_id_stamped_s": median_of(options.repeat, stamped),
            "gate_s": median_of(options.repeat, gate),
        }
        results["sha256_of_mapped_weights_s"] = median_of(options.repeat, hash_mapped)
        results["cold_build_s"] = median_of(options.repeat, cold_build)
        warm, bare = [], []
        for _ in range(options.repeat):
            bare.append(timed_process(["-c", "import torch, ttnn"]))
            warm.append(timed_process(["-c", WARM_START, str(snapshot), str(root / "cache")]))
        results["bare_import_process_s"] = statistics.median(bare)
        results["warm_start_process_s"] = statistics.median(warm)

    first, cold = results["content_id_first_sight_s"], results["cold_build_s"]
    inline = results["sha256_of_mapped_weights_s"]
    ratio = results["warm_start_process_s"] / results["bare_import_process_s"]
    print("| measurement (Gemma 3 270M, bf16, hub blob layout) | median |")
    print("| --- | --- |")
    print(f"| content id, first sight ({results['checkpoint_mib']:.0f} MiB hashed, blobs verified) | "
          f"{first * 1e3:.0f} ms ({first / cold:.0%} of a {cold:.2f} s cold build) |")
    print(f"| SHA-256 of the same bytes, already mapped (hashing inside the cold build) | {inline * 1e3:.0f} ms "
          f"({inline / first:.2f}x of first sight) |")
    print(f"| content id, stamped (every later start) | {results['content_id_stamped_s'] * 1e3:.2f} ms |")
    print(f"| gate, stat-only | {results['gate_s'] * 1e3:.2f} ms |")
    print(f"| warm-start process / bare `import torch, ttnn` | {results['warm_start_process_s']:.2f} s / "
          f"{results['bare_import_process_s']:.2f} s = {ratio:.2f}x (target <= 1.1x) |")
    out = write_json(options.out_dir / "bench_identity.json", results)
    labels = {"content id, first sight": "content_id_first_sight_s", "content id, stamped": "content_id_stamped_s",
              "gate": "gate_s", "bare import process": "bare_import_process_s",
              "warm start process": "warm_start_process_s"}
    bar_chart(out.with_suffix(".png"), {"Gemma 3 270M, bfloat16": {k: results[v] * 1e3 for k, v in labels.items()}},
              title="Cost of the content identity", ylabel="ms (log)", log=True)


if __name__ == "__main__":
    main()
