# SPDX-License-Identifier: Apache-2.0
"""How a cold build converts its weights: the one interface of the conversion strategies.

A :class:`~models.common.cold_build.ColdBuild` has proved and planned the checkpoint, opened its
generation and started the host sidecar; a :class:`Converter` then converts every planned weight
into that generation and says what it wrote (:class:`Converted`). Each strategy is one module:

* inline (:mod:`models.common.convert_inline`): the family's ``convert`` on this thread; the only
  one that keeps weights (a cold load on a device, or one that cannot write the cache);
* threads (:mod:`models.common.convert_workers`): several threads of this process sharing the
  plan's units, and the chunks of large weights (the chunk board);
* Ray (:mod:`models.seeding.ray_seed`): tasks on a Ray cluster, each converting a share.

The build picks inline or threads (:func:`~models.common.cold_build.choose_converter`, the one
place); the Ray seed hands its converter to the build. A worker of a partitioned build (a thread,
a Ray task) runs :func:`convert_units`: the same loop wherever it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
import ttnn

from models.common.build_plan import PartSink, PartState, PlannedWeight
from models.common.safetensors_file import CheckpointReader
from models.common.weight_cache.chunk_board import ChunkBoard
from models.common.weight_cache.tensor_cache import TensorCache, TensorFormat

STREAM_PENDING_BYTES = 64 << 20  # a streaming build's converted weights queued behind the newest, at most


@dataclass
class Converted:
    """What a converter wrote (paths relative to the generation) and, inline, what it kept."""

    written: list[str]
    write_errors: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    weights: dict[str, ttnn.Tensor] = field(default_factory=dict)
    formats: dict[str, TensorFormat] = field(default_factory=dict)


class Build(Protocol):
    """What a converter is given: the :class:`~models.common.cold_build.ColdBuild` under way."""

    loader: Any  # the family's WeightLoader: convert, mesh, workers
    args: Any
    plan: list[PlannedWeight]
    reader: CheckpointReader  # through the build's proof
    root: Path | None  # the generation; None: in memory
    streaming: bool  # keep no weight
    host: dict[str, torch.Tensor]  # the host weights, read once
    sidecar: Future | None  # their sidecar's write, under way
    on_written: Callable[[str, int], None] | None
    start: float


class Converter(Protocol):
    """Converts every weight of ``build.plan`` into ``build.root`` (None: in memory), reading the
    checkpoint through ``build.reader`` (the build's proof), calling ``build.on_written`` as each
    file is written. Raises on the first failure; the build's transaction removes what it wrote."""

    def convert(self, build: Build) -> Converted: ...


def streaming_cache(loader: Any, root: Path, *, on_written: Callable[[str, int], None] | None = None,
                    chunk_board: ChunkBoard | None = None) -> TensorCache:
    """The cache a worker of a partitioned build writes through: streaming, nothing kept."""
    return TensorCache(root, loader.mesh_shape, rebuild=True, max_pending_bytes=STREAM_PENDING_BYTES,
                       on_written=on_written, chunk_board=chunk_board)


def convert_units(loader: Any, args: Any, reader: CheckpointReader, cache: TensorCache,
                  plan: Sequence[PlannedWeight], owns: Callable[[int], bool]) -> list[str]:
    """One worker's loop: the family's ``convert`` over the whole plan, real tensors only inside
    the units it ``owns`` (asked once per unit), written through ``cache``; returns the weights it
    converted. Call it inside ``conversion_threads()``."""
    sink = PartSink(cache, PartState(reader), plan, owns)
    loader.convert(sink, args)
    return sink.done


def host_weights(loader: Any, reader: CheckpointReader) -> dict[str, torch.Tensor]:
    """The weights the device code consumes on the host (the host sidecar's), read from ``reader``."""
    return {key: reader.get(key) for key in reader.keys() if loader.is_host_weight(key)}
