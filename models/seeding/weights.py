# SPDX-License-Identifier: Apache-2.0
"""The plan of a build, and conversion of one part of it.

A family's ``convert`` is a sequence of ``sink.put(name, tensor, fmt)`` calls, each preceded by
reads of the checkpoint tensors it is made from. Running it once on storage-free placeholders
(as a warm build does) gives the plan: every weight in build order, its format, and the
checkpoint keys read for it. A worker then runs the same ``convert`` again with a state that
hands out real tensors only while the next weight is one of its own (placeholders otherwise,
which cost nothing), so each process reads and converts only its share of the model, and the
files it writes are the ones a single-process build writes.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import ttnn

from models.common.checkpoint import CheckpointError
from models.common.loader import WeightLoader, WeightSink
from models.common.model_args import ModelArgs
from models.common.tensor_cache import TensorFormat, stored_bytes
from models.common.weight_cache import placeholder

@dataclass(frozen=True)
class PlannedWeight:
    """One ``put`` of a build: its name, format, shape, and the checkpoint tensors it reads."""

    name: str
    fmt: TensorFormat
    shape: tuple[int, ...]
    inputs: tuple[str, ...]
    input_bytes: int

    @property
    def estimated_bytes(self) -> int:
        """Roughly the tensorbin's size (progress totals; the real size is known once written)."""
        shape = list(self.shape) or [1]
        if self.fmt.layout == ttnn.TILE_LAYOUT:
            shape[-1] = -(-shape[-1] // 32) * 32
            if len(shape) > 1:
                shape[-2] = -(-shape[-2] // 32) * 32
        return stored_bytes(self.fmt, math.prod(shape))


class _Recording(Mapping):
    """Placeholders for every checkpoint key, noting which keys are read."""

    def __init__(self, specs: Mapping[str, tuple[Sequence[int], torch.dtype]]) -> None:
        self._specs = specs
        self.read: dict[str, None] = {}

    def __getitem__(self, key: str) -> torch.Tensor:
        if key not in self._specs:
            raise CheckpointError(f"checkpoint has no tensor for {key!r}")
        shape, dtype = self._specs[key]
        self.read[key] = None
        return placeholder(shape, dtype)

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def __contains__(self, key: object) -> bool:
        return key in self._specs


class _PlanSink(WeightSink):
    def __init__(self, state: _Recording, host_keys: list[str], specs: Mapping[str, Any]) -> None:
        super().__init__(None, state, host_keys)  # type: ignore[arg-type]
        state.read.clear()  # the host weights are the driver's, not any weight's input
        self._specs = specs
        self.plan: list[PlannedWeight] = []

    def put(self, name: str, tensor: torch.Tensor, fmt: TensorFormat) -> None:
        if name in self.formats:
            raise ValueError(f"weight {name!r} converted twice")
        self.formats[name] = fmt
        inputs = tuple(self.state.read)
        self.state.read.clear()
        nbytes = sum(math.prod(self._specs[k][0]) * self._specs[k][1].itemsize for k in inputs)
        self.plan.append(PlannedWeight(name, fmt, tuple(tensor.shape), inputs, nbytes))


def checkpoint_specs(loader: WeightLoader) -> dict[str, tuple[list[int], torch.dtype]]:
    """Shape and dtype of every checkpoint tensor (under the loader's names), headers only."""
    from models.common.checkpoint import CheckpointReader

    reader = CheckpointReader(loader.checkpoint_dir, loader.key_rules)
    try:
        return {key: reader.spec(key) for key in reader.keys()}
    finally:
        reader.close()


def plan_weights(loader: WeightLoader, args: ModelArgs) -> list[PlannedWeight]:
    """Every weight of this build in build order, from checkpoint headers only (nothing converted)."""
    specs = checkpoint_specs(loader)
    state = _Recording(specs)
    sink = _PlanSink(state, [k for k in specs if loader.is_host_weight(k)], specs)
    loader.convert(sink, args)
    return sink.plan


def partition(plan: Sequence[PlannedWeight], parts: int) -> list[list[str]]:
    """Split the plan into at most ``parts`` groups of about equal checkpoint bytes (greedy, largest
    first), each group in build order; a group is one task."""
    parts = max(1, min(parts, len(plan)))
    loads = [0] * parts
    groups: list[list[str]] = [[] for _ in range(parts)]
    order = {w.name: i for i, w in enumerate(plan)}
    for weight in sorted(plan, key=lambda w: -max(w.input_bytes, 1)):
        target = loads.index(min(loads))
        loads[target] += max(weight.input_bytes, 1)
        groups[target].append(weight.name)
    return [sorted(g, key=order.__getitem__) for g in groups if g]


class PartState(Mapping):
    """The checkpoint as a worker of a partitioned build sees it: real tensors while the next
    weight to be put is one of its own, placeholders otherwise."""

    def __init__(self, lazy: Any, specs: Mapping[str, tuple[Sequence[int], torch.dtype]]) -> None:
        self._lazy = lazy
        self._specs = specs
        self.real = False

    def __getitem__(self, key: str) -> torch.Tensor:
        if self.real:
            return self._lazy[key]
        shape, dtype = self._specs[key]
        return placeholder(shape, dtype)

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def __contains__(self, key: object) -> bool:
        return key in self._specs


class PartSink(WeightSink):
    """Converts only the weights named in ``mine``, checking that ``convert`` puts the plan's
    weights in the plan's order (a build that is not deterministic cannot be split)."""

    def __init__(self, cache: Any, state: PartState, plan: Sequence[PlannedWeight], mine: set[str],
                 after_put: Any = None) -> None:
        super().__init__(cache, state, [], keep=False, after_put=after_put)
        self._order = [w.name for w in plan]
        self._mine = mine
        self._next = 0
        self.done: list[str] = []
        self._arm()

    def _arm(self) -> None:
        upcoming = self._order[self._next] if self._next < len(self._order) else None
        self.state.real = upcoming in self._mine

    def put(self, name: str, tensor: torch.Tensor, fmt: TensorFormat) -> None:
        expected = self._order[self._next] if self._next < len(self._order) else None
        if name != expected:
            raise RuntimeError(f"convert put {name!r} where the plan has {expected!r}: the build is not deterministic")
        self._next += 1
        if name in self._mine:
            super().put(name, tensor, fmt)
            self.done.append(name)
        self._arm()
