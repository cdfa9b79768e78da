# SPDX-License-Identifier: Apache-2.0
"""A Ray seeding driver for tests: ``python -m models.testing.ray_child WORKERS CACHE_ROOT JOB...``.

Each JOB is ``CHECKPOINT,PRECISION,MESH``; all are seeded in one :func:`seed_on_ray` call. Prints
``RAY_REPORT {json}``: per job whether its cache is complete now, and the error if the seed raised."""

from __future__ import annotations

import json
import sys

from models.common.device_env import ensure_host_cluster


def main() -> None:
    workers, cache_root, *jobs = sys.argv[1:]
    ensure_host_cluster()
    from models.common.checkpoint import read_config, resolve_checkpoint_dir
    from models.registry import family_of, loader_class
    from models.seeding.ray_seed import SeedError, seed_on_ray

    loaders = []
    for job in jobs:
        checkpoint, precision, mesh = job.split(",")
        family = family_of(read_config(resolve_checkpoint_dir(checkpoint)))
        loaders.append(loader_class(family)(checkpoint, precision=precision, mesh_shape=mesh, cache_root=cache_root))
    report: dict = {"error": None}
    try:
        results = seed_on_ray(loaders, workers=int(workers))
        report["timings"] = results[0].timings
    except SeedError as error:
        report["error"] = str(error)
    report["jobs"] = [{"cache_dir": str(l.cache_dir), "complete": l.status().warm} for l in loaders]
    print("RAY_REPORT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
