# SPDX-License-Identifier: Apache-2.0
"""Seeding: building a model's weight cache as a job of its own, not as a side effect of a load.

* ``WeightLoader.seed`` (:mod:`models.common.loader`): the single-process streaming seed, memory
  flat in model size; :mod:`models.common.build_plan`: the plan of one build and the partitioned
  conversion that lets several processes share it.
* :mod:`models.seeding.ray_seed`: that conversion as Ray tasks, on a local Ray instance or a cluster.
* CI jobs behind ``tt-cache seed``: :mod:`~models.seeding.plan` (models x meshes x precisions),
  :mod:`~models.seeding.runner` and :mod:`~models.seeding.worker` (one process per seed, watched
  by the stall watchdog of :mod:`~models.seeding.progress`), :mod:`~models.seeding.report` (JSON,
  JUnit), :mod:`~models.seeding.github` (job summary, step outputs) and :mod:`~models.seeding.history`
  (a run's line in ``--history``, the trend). Keep this package's import light: ``tt-cache`` imports
  submodules of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the package import stays light: tt-cache imports submodules of it
    from models.common.loader import SeedResult


def seed_models(loaders: Sequence[Any], *, workers: int = 1, address: str | None = None,
                progress: Any = None) -> list[SeedResult]:
    """``tt-cache seed``'s semantics: ``workers`` 1 and no ``address`` seeds each loader in this
    process, streaming; ``workers`` >= 2 starts a local Ray instance of that many CPUs;
    ``address`` joins an existing Ray cluster (``workers`` then sizes the task split only)."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if workers == 1 and address is None:
        return [loader.seed(progress) for loader in loaders]
    from models.seeding.ray_seed import seed_on_ray

    return seed_on_ray(loaders, workers=workers, address=address, progress=progress)
