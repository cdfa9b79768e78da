# SPDX-License-Identifier: Apache-2.0
"""A seeding process for tests: ``python -m models.testing.seed_child MODE CHECKPOINT PRECISION CACHE_ROOT [MESH]``.

MODE ``seed`` (``WeightLoader.seed()``), ``load`` (a cold ``load()``: streamed, then read back)
or ``ray:N`` (:func:`models.seeding.ray_seed.seed_on_ray` with N local workers); MESH defaults to
``1x1``, conversion workers to ``$TT_CONVERT_WORKERS`` as for any load. Prints one line
``SEED_REPORT {json}`` with the process's own peak RSS (``VmHWM``) after imports and at the end."""

from __future__ import annotations

import dataclasses
import filecmp
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from models.common.device_env import ensure_host_cluster
from models.common.measure import peak_rss_bytes  # this process's own peak (VmHWM), never its parent's
from models.testing.memlimit import run_limited


def main() -> None:
    mode, checkpoint, precision, cache_root = sys.argv[1:5]
    mesh = sys.argv[5] if len(sys.argv) > 5 else "1x1"
    ensure_host_cluster()
    import torch  # noqa: F401  (the import cost belongs to the baseline)
    import ttnn  # noqa: F401

    from models.common.checkpoint import read_config, resolve_checkpoint_dir
    from models.registry import family_of, loader_class

    family = family_of(read_config(resolve_checkpoint_dir(checkpoint)))
    loader = loader_class(family)(checkpoint, precision=precision, cache_root=cache_root, mesh_shape=mesh)
    baseline = peak_rss_bytes()
    start = time.perf_counter()
    report: dict = {"mode": mode}
    if mode == "seed":
        result = loader.seed()
        report |= {"complete": result.complete, "warm_before": result.warm, "bytes_written": result.bytes_written}
    elif mode == "load":
        loaded = loader.load()
        report |= {"complete": loader.status().warm, "warm_before": loaded.warm}
    elif mode.startswith("ray:"):
        from models.seeding.ray_seed import seed_on_ray

        [result] = seed_on_ray([loader], workers=int(mode[4:]))
        report |= {"complete": result.complete, "warm_before": result.warm, "bytes_written": result.bytes_written,
                   "timings": result.timings}
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    report |= {"seconds": time.perf_counter() - start, "import_peak": baseline, "peak": peak_rss_bytes(),
               "cache_dir": str(loader.cache_dir), "workers": loader.workers}
    print("SEED_REPORT " + json.dumps(report), flush=True)


# -- the parent's side -----------------------------------------------------------------------

REPO_ROOT = Path(__file__).resolve().parents[2]


def marker_essence(cache_dir: Path, build_variant: dict) -> dict:
    """A cache's marker without what differs between two equal builds (generation name, stat
    stamps, build time): every file's build-relative path, size and digest, the sidecar, the manifest."""
    from models.common.weight_cache.layout import VariantPaths
    from models.common.weight_cache.marker import build_relative, read_marker

    marker = read_marker(VariantPaths(cache_dir, build_variant))
    records = marker.all_files()
    body = dataclasses.asdict(marker) | {"generation": None, "host_sidecar": None, "verified_ns": None,
                                         "build_seconds": None}
    body["files"] = sorted((build_relative(r.path, marker.generation), r.bytes, r.digest) for r in records)
    return body


def assert_same_cache(a: Path, b: Path, build_variant: dict) -> None:
    """Two caches vouch for the same files (marker essence) and hold them byte for byte."""
    from models.common.weight_cache.layout import VariantPaths
    from models.common.weight_cache.marker import read_marker

    essence = marker_essence(a, build_variant)
    assert essence == marker_essence(b, build_variant)
    roots = [d / (read_marker(VariantPaths(d, build_variant)).generation or "") for d in (a, b)]
    different = [f for f, _, _ in essence["files"] if not filecmp.cmp(roots[0] / f, roots[1] / f, shallow=False)]
    assert not different, f"files differ between the two builds: {different}"


def child_env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), HF_HUB_OFFLINE="1")
    env.pop("TT_TRANSFORMERS_FORCE_MODEL_LOAD", None)
    env.pop("TT_CONVERT_WORKERS", None)
    return env


def seed_command(mode: str, checkpoint: Path, cache_root: Path, precision: str = "bfloat16",
                 mesh: str = "1x1") -> list[str]:
    return [sys.executable, "-m", "models.testing.seed_child", mode, str(checkpoint), precision, str(cache_root), mesh]


def run_seed_child(mode: str, checkpoint: Path, cache_root: Path, limit: int | None = None,
                   precision: str = "bfloat16", mesh: str = "1x1",
                   workers: int | None = None) -> tuple[int, dict | None, str]:
    """Run this module as a child (``limit``: inside a memory cgroup of that many bytes; ``workers``:
    its conversion workers, else the default); return its exit status, its report (None if it
    printed none) and the tail of its stderr."""
    command = seed_command(mode, checkpoint, cache_root, precision, mesh)
    env = child_env() | ({"TT_CONVERT_WORKERS": str(workers)} if workers is not None else {})
    kwargs = dict(cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)
    proc = run_limited(command, limit, **kwargs) if limit else subprocess.run(command, **kwargs)
    reports = [line for line in proc.stdout.splitlines() if line.startswith("SEED_REPORT ")]
    return proc.returncode, json.loads(reports[-1].split(" ", 1)[1]) if reports else None, proc.stderr[-3000:]


if __name__ == "__main__":
    main()
