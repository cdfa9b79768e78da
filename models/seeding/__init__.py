# SPDX-License-Identifier: Apache-2.0
"""Seeding: building a model's weight cache as a job of its own, not as a side effect of a load.

* :mod:`models.seeding.stream`: the single-process streaming seed (``WeightLoader.seed``):
  memory flat in model size.
* :mod:`models.seeding.weights`: the plan of one build (which weights, from which checkpoint
  tensors) and the partitioned conversion that lets several processes share it.
* :mod:`models.seeding.ray_seed`: that conversion as Ray tasks, on a local Ray instance or a cluster.
"""
