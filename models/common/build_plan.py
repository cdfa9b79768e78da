# SPDX-License-Identifier: Apache-2.0
"""The plan of a build, and conversion of one part of it.

A family's ``convert`` reads checkpoint tensors and ``sink.put(name, tensor, fmt)``s weights made
from them. Running it once on storage-free placeholders (as a warm build does) gives the plan:
every weight in build order, its format, and its *unit*: the reads since the previous put and
every put until the next read (``gate_up_weights`` reads w1 and w3, then puts both: one unit).
A worker runs the same ``convert`` again with a state that hands out real tensors only inside
the units holding one of its own weights (placeholders otherwise, which cost nothing), so each
process reads and converts only its share, and writes the files a single-process build writes.
A family whose tensors flow past their unit fails loudly (a placeholder handed to a cold put
raises), never silently.

Planning is also where a checkpoint is checked against its ``config.json``: every tensor the plan
reads has the shape the loader's layout table implies
(:data:`~models.common.decoder.CHECKPOINT_SHAPES`), or planning stops at the first that does not
with one line naming it. A cold build plans first (:meth:`WeightLoader.check_checkpoint`), so a
checkpoint its config does not describe is refused before anything is converted, locked or written.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import ttnn

from models.common.checkpoint import CheckpointError, CheckpointShapeError, KeyRule
from models.common.conversion import LazyStateDict, WeightSink
from models.common.model_args import ModelArgs
from models.common.safetensors_file import CheckpointReader
from models.common.weight_cache.checkpoint_proof import ProvenCheckpoint
from models.common.weight_cache.placeholders import placeholder
from models.common.weight_cache.tensor_cache import TensorFormat, stored_bytes

TENSORBIN_HEADER_BYTES = 384  # ttnn.dump_tensor's header of a one-device tensor (measured, ttnn 0.81.1)


class Convertible(Protocol):
    """What planning needs of a loader (any :class:`~models.common.loader.WeightLoader`)."""

    checkpoint_dir: Any
    key_rules: Sequence[KeyRule]

    def is_host_weight(self, key: str) -> bool: ...

    def convert(self, sink: WeightSink, args: ModelArgs) -> None: ...

    def tensor_shape_problem(self, key: str, shape: Sequence[int], args: ModelArgs) -> str | None: ...


@dataclass(frozen=True)
class PlannedWeight:
    """One ``put`` of a build: its name, format, shape, and the checkpoint tensors it reads."""

    name: str
    fmt: TensorFormat
    shape: tuple[int, ...]
    inputs: tuple[str, ...]
    input_bytes: int
    unit: int

    @property
    def estimated_bytes(self) -> int:
        """Roughly the tensorbin's size (progress totals; the real size is known once written):
        the data, tile-padded, and the file's header (larger for a multi-device tensor, so a
        progress total is still an estimate)."""
        shape = list(self.shape) or [1]
        if self.fmt.layout == ttnn.TILE_LAYOUT:
            shape[-1] = -(-shape[-1] // 32) * 32
            if len(shape) > 1:
                shape[-2] = -(-shape[-2] // 32) * 32
        return stored_bytes(self.fmt, math.prod(shape)) + TENSORBIN_HEADER_BYTES


class _SpecView(Mapping):
    """A state dict over a checkpoint's tensor specs (``{key: (shape, dtype)}``): keys only here."""

    _specs: Mapping[str, tuple[Sequence[int], torch.dtype]]

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def __contains__(self, key: object) -> bool:
        return key in self._specs


class _Recording(_SpecView):
    """Placeholders for every checkpoint key, noting which keys are read; ``check(key, shape)``: why
    a tensor read has the wrong shape, or None (a :class:`CheckpointShapeError` names its own name)."""

    def __init__(self, specs: Mapping[str, tuple[Sequence[int], torch.dtype]],
                 check: Callable[[str, Sequence[int]], str | None] | None = None,
                 names: Mapping[str, str] | None = None, where: object = "checkpoint") -> None:
        self._specs = specs
        self._check = check
        self._names = names or {}
        self._where = where
        self._checked: set[str] = set()
        self.read: dict[str, None] = {}

    def __getitem__(self, key: str) -> torch.Tensor:
        if key not in self._specs:
            raise CheckpointError(f"checkpoint has no tensor for {key!r}")
        shape, dtype = self._specs[key]
        if self._check is not None and key not in self._checked:
            problem = self._check(key, shape)
            if problem:
                raise CheckpointShapeError(f"{self._where}: tensor {self._names.get(key, key)} {problem}")
            self._checked.add(key)
        self.read[key] = None
        return placeholder(shape, dtype)


class _PlanSink(WeightSink):
    def __init__(self, state: _Recording, host_keys: list[str], specs: Mapping[str, Any]) -> None:
        super().__init__(None, state, host_keys)  # type: ignore[arg-type]
        state.read.clear()  # the host weights are the driver's, not any weight's input
        self._specs = specs
        self.plan: list[PlannedWeight] = []
        self._unit = 0

    def put(self, name: str, tensor: torch.Tensor, fmt: TensorFormat) -> None:
        if name in self.formats:
            raise ValueError(f"weight {name!r} converted twice")
        self.formats[name] = fmt
        inputs = tuple(self.state.read)
        self.state.read.clear()
        if inputs and self.plan:
            self._unit += 1  # reads since the last put start a new unit
        nbytes = sum(math.prod(self._specs[k][0]) * self._specs[k][1].itemsize for k in inputs)
        self.plan.append(PlannedWeight(name, fmt, tuple(tensor.shape), inputs, nbytes, self._unit))


def checkpoint_specs(loader: Convertible,
                     proof: ProvenCheckpoint | None = None) -> dict[str, tuple[list[int], torch.dtype]]:
    """Shape and dtype of every checkpoint tensor (under the loader's names), headers only
    (through the build's ``proof``, when planning a build)."""
    return _checkpoint_headers(loader, proof)[0]


def _checkpoint_headers(loader: Convertible, proof: ProvenCheckpoint | None = None
                        ) -> tuple[dict[str, tuple[list[int], torch.dtype]], dict[str, str]]:
    """:func:`checkpoint_specs`, and each tensor's name in the checkpoint."""
    reader = CheckpointReader(loader.checkpoint_dir, loader.key_rules, proof)
    try:
        return {key: reader.spec(key) for key in reader.keys()}, {key: reader.source_name(key) for key in reader.keys()}
    finally:
        reader.close()


def plan_weights(loader: Convertible, args: ModelArgs, proof: ProvenCheckpoint | None = None) -> list[PlannedWeight]:
    """Every weight of this build in build order, from checkpoint headers only (nothing converted;
    read through the build's ``proof``, if given); :class:`CheckpointShapeError` at the first
    tensor read whose shape its config does not imply."""
    specs, names = _checkpoint_headers(loader, proof)
    state = _Recording(specs, lambda key, shape: loader.tensor_shape_problem(key, shape, args), names,
                       loader.checkpoint_dir)
    sink = _PlanSink(state, [k for k in specs if loader.is_host_weight(k)], specs)
    loader.convert(sink, args)
    return sink.plan


def partition(plan: Sequence[PlannedWeight], parts: int) -> list[list[str]]:
    """Split the plan into at most ``parts`` groups of whole units of about equal checkpoint bytes
    (greedy, largest first), each group in build order; a group is one task."""
    units: dict[int, list[PlannedWeight]] = {}
    for weight in plan:
        units.setdefault(weight.unit, []).append(weight)
    parts = max(1, min(parts, len(units)))
    loads = [0] * parts
    groups: list[list[str]] = [[] for _ in range(parts)]
    order = {w.name: i for i, w in enumerate(plan)}
    for members in sorted(units.values(), key=lambda ws: -max(sum(w.input_bytes for w in ws), 1)):
        target = loads.index(min(loads))
        loads[target] += max(sum(w.input_bytes for w in members), 1)
        groups[target] += [w.name for w in members]
    return [sorted(g, key=order.__getitem__) for g in groups if g]


class PartState(LazyStateDict):
    """The checkpoint as a worker of a partitioned build sees it: real tensors inside the units
    it converts, placeholders otherwise (a streaming state: it releases what it read)."""

    def __init__(self, reader: CheckpointReader) -> None:
        super().__init__(reader)
        self._specs = {key: reader.spec(key) for key in reader.keys()}
        self.real = False

    def __getitem__(self, key: str) -> torch.Tensor:
        if self.real:
            return super().__getitem__(key)
        if key not in self._specs:
            raise CheckpointError(f"checkpoint has no tensor for {key!r}")
        return placeholder(*self._specs[key])


class PartSink(WeightSink):
    """Converts only the weights of the units it ``owns`` (asked once per unit, when ``convert``
    reaches it: a fixed share, or the first worker to arrive), checking that ``convert`` puts the
    plan's weights in the plan's order (a build that is not deterministic cannot be split)."""

    def __init__(self, cache: Any, state: PartState, plan: Sequence[PlannedWeight], owns: Callable[[int], bool],
                 after_put: Any = None) -> None:
        super().__init__(cache, state, [], keep=False, after_put=after_put)
        self._order = [w.name for w in plan]
        self._units = [w.unit for w in plan]
        self._owns = owns
        self._owned: dict[int, bool] = {}
        self._next = 0
        self.done: list[str] = []
        self._arm()

    def _owner(self, index: int) -> bool:
        unit = self._units[index]
        if unit not in self._owned:
            self._owned[unit] = self._owns(unit)
        return self._owned[unit]

    def _arm(self) -> None:
        self.state.real = self._next < len(self._order) and self._owner(self._next)

    def put(self, name: str, tensor: torch.Tensor, fmt: TensorFormat) -> None:
        expected = self._order[self._next] if self._next < len(self._order) else None
        if name != expected:
            raise RuntimeError(f"convert put {name!r} where the plan has {expected!r}: the build is not deterministic")
        mine = self._owner(self._next)
        self._next += 1
        if mine:
            super().put(name, tensor, fmt)
            self.done.append(name)
        self._arm()


def units_of(plan: Sequence[PlannedWeight], names: Iterable[str]) -> set[int]:
    """The units holding these weights (a task's share of a partitioned build)."""
    names = set(names)
    return {w.unit for w in plan if w.name in names}
