# SPDX-License-Identifier: Apache-2.0
"""One seed in its own process: ``python -m models.seeding.worker SPEC_JSON PROGRESS_FD``.

Started by :func:`models.seeding.runner.run_worker`; reports progress and, last, one ``result``
event on the pipe ``PROGRESS_FD`` (stdout is free for ttnn's own logging), with what the seed pulled
from or pushed to the shared store (:class:`~models.common.weight_cache.remote.after_build.StoreLedger`)."""

from __future__ import annotations

import json
import sys

from models.seeding.plan import Combination
from models.seeding.progress import PipeProgress

BUILD_MODULES = frozenset({"torch", "ttnn", "transformers", "safetensors", "numpy"})  # what a light install lacks


def main(argv: list[str]) -> int:
    spec, progress = json.loads(argv[0]), PipeProgress(int(argv[1]))
    raw = spec["combination"]
    combination = Combination(raw["model"], raw["mesh"], raw["precision"], raw.get("family"),
                              tuple(raw["components"]) if raw.get("components") else None)
    try:
        from models.common.checkpoint import CheckpointError
        from models.common.weight_cache.remote.after_build import recording
        from models.seeding import seed_models
        from models.seeding.runner import SeedInputError, open_model

        loader, _ = open_model(combination, spec.get("cache_root"))
        with recording() as store:  # what it pulled from or pushed to $TT_CACHE_REMOTE, for the report
            (result,) = seed_models([loader], workers=spec.get("workers", 1), address=spec.get("address"),
                                    progress=progress)
    except (SeedInputError, CheckpointError) as error:  # a checkpoint its config.json does not describe, ...
        progress.send("result", ok=False, reason=str(error))
        return 2
    except Exception as error:  # noqa: BLE001 - reported to the parent as this combination's failure
        reason = f"{type(error).__name__}: {error}"
        if isinstance(error, ModuleNotFoundError) and (error.name or "").split(".")[0] in BUILD_MODULES:
            reason = (f"{error.name} is not installed: a light install (requirements-light.txt) checks caches but "
                      "cannot build them; seed from the full install (scripts/setup_env.sh)")
        progress.send("result", ok=False, reason=reason)
        return 1
    progress.send("result", ok=result.complete, reason="" if result.complete else "the seed left the cache cold",
                  **store.as_json())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
