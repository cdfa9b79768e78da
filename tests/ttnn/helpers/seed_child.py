# SPDX-License-Identifier: Apache-2.0
"""A seeding process for tests: ``python -m tests.ttnn.helpers.seed_child MODE CHECKPOINT PRECISION CACHE_ROOT``.

MODE ``seed`` (``WeightLoader.seed()``), ``load`` (a cold ``load()``, today's way, weights kept)
or ``ray:N`` (:func:`models.seeding.ray_seed.seed_on_ray` with N local workers). Prints one line
``SEED_REPORT {json}`` with the process's own peak RSS (``VmHWM``) after imports and at the end."""

from __future__ import annotations

import json
import sys
import time

from models.common.device_env import ensure_host_cluster


def peak_rss_bytes() -> int:
    """This process's own peak RSS (``/proc/self/status`` VmHWM; ``ru_maxrss`` would include the
    parent's peak across fork+exec)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


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
        report |= {"complete": result.complete, "warm_before": result.warm, "bytes_written": result.bytes_written}
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    report |= {"seconds": time.perf_counter() - start, "import_peak": baseline, "peak": peak_rss_bytes(),
               "cache_dir": str(loader.cache_dir)}
    print("SEED_REPORT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
