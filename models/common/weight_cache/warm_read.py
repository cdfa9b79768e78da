# SPDX-License-Identifier: Apache-2.0
"""The warm read: the one way a loader serves a model from its cache (the twin of
:class:`~models.common.weight_cache.build.BuildTransaction`).

::

    with WarmRead(paths, gate) as read:         # the gate, then a reader lease on the generation
        if not read.warm:                        # it names (retried when that generation is
            return <cold: read.reason>           # being retired: the marker names a newer one)
        state = read.state_dict(args)            # placeholders + the host sidecar, opened once and
                                                 # proved to be the file the gate verified
        cache = read.tensor_cache(mesh)          # each tensorbin the same: opened once, its fstat
        ... load every weight through cache ...  # checked against the gate, loaded from that open
        read.used(model_id)                      # last use (gc's LRU); another model id it serves
                                                 # on exit (no error): retire leftover generations

A file renamed over, rewritten or swapped after the gate is never served: the check and the read
go through one descriptor (:mod:`~models.common.weight_cache.verified_open`), so what the gate
verified is what is loaded, or the read raises :class:`WeightCacheError` and the loader builds
cold (or reports it, without a checkpoint). Everything comes from the marker the gate returned;
the marker file is not read again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
from loguru import logger

from models.common.mesh import MeshShape
from models.common.weight_cache.gate import CacheStatus
from models.common.weight_cache.generations import (
    build_lock,
    owned_generations,
    reader_lease,
    retire_unnamed,
    retired_debris,
)
from models.common.weight_cache.host_sidecar import forget_host_sidecar, read_host_sidecar
from models.common.weight_cache.layout import VariantPaths
from models.common.weight_cache.marker import WeightCacheMarker, build_relative
from models.common.weight_cache.placeholders import CachedStateDict, cached_state_dict
from models.common.weight_cache.tensor_cache import TensorCache
from models.common.weight_cache.usage import add_model_id, touch_last_used

WARM_READ_ATTEMPTS = 3  # a generation retired between gate and lease: ask the gate again


class WarmRead:
    """One warm read of one variant, from the gate to retiring leftovers (see the module doc).
    ``gate`` answers whether this exact build is warm (the loader's ``status``)."""

    def __init__(self, paths: VariantPaths, gate: Callable[[], CacheStatus], *,
                 attempts: int = WARM_READ_ATTEMPTS) -> None:
        self.paths = paths
        self.gate = gate
        self.attempts = attempts
        self.status = CacheStatus(False, "not entered")
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> WarmRead:
        for _ in range(self.attempts):
            status = self.gate()
            if not status.warm:
                self.status = status
                return self
            leased = self._stack.enter_context(reader_lease(self.paths, status.marker.generation))
            if leased:
                self.status = status
                return self
            self._stack.close()  # being retired: the marker names a newer one by now
        self.status = CacheStatus(False, "the generation was retired while loading")
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self._stack.close()
        if kind is None and self.warm:
            self._retire_leftovers()

    # -- what the gate said -----------------------------------------------------------------

    @property
    def warm(self) -> bool:
        return self.status.warm

    @property
    def reason(self) -> str:
        return self.status.reason

    @property
    def marker(self) -> WeightCacheMarker:
        if self.status.marker is None:
            raise RuntimeError(f"{self.paths.cache_dir} is not warm: {self.reason}")
        return self.status.marker

    @property
    def root(self) -> Path:
        """Where the build's files are: its generation, or the cache dir (the seed API's layout)."""
        generation = self.marker.generation
        return self.paths.generation_dir(generation) if generation else self.paths.cache_dir

    def files(self) -> list[Path]:
        """Every recorded file, in the order the build wrote them (what a prefetcher reads ahead)."""
        return [self.paths.file(record.path) for record in self.marker.all_files()]

    # -- the read ---------------------------------------------------------------------------

    def host_weights(self) -> dict[str, torch.Tensor]:
        """The real host weights, from the sidecar the gate verified (none: empty)."""
        record = self.marker.host_sidecar
        if record is None:
            return {}
        verified = self.status.verified_stamps().get(record.path)
        digest = record.digest if verified is None else None  # no stamp to go by: the bytes must match
        tensors = read_host_sidecar(self.paths.file(record.path), verified, digest)
        forget_host_sidecar(tensors)  # handed over to this read
        return tensors

    def state_dict(self, args: Any = None) -> CachedStateDict:
        """The warm ``state_dict``: placeholders of the marker's manifest plus the real host weights
        (``args``: see :func:`~models.common.weight_cache.placeholders.cached_state_dict`)."""
        host = self.host_weights() if self.marker.host_weights else {}
        return cached_state_dict(self.marker, host, args, self.paths.cache_dir)

    def tensor_cache(self, mesh: MeshShape, mesh_device: Any = None) -> TensorCache:
        """Loads each recorded tensorbin, opened once and proved to be the one the gate verified."""
        generation = self.marker.generation
        recorded = {build_relative(path, generation): stamp for path, stamp in self.status.verified_stamps().items()}
        return TensorCache(self.root, mesh, rebuild=False, mesh_device=mesh_device, recorded=recorded)

    def used(self, model_id: str | None = None) -> None:
        """Record the use; ``model_id``: the name this load asked for, remembered when the marker
        records another (the same weights under another name: findable cache-only)."""
        touch_last_used(self.paths)
        if model_id is not None and self.marker.model_id != model_id:
            add_model_id(self.paths, model_id)

    def _retire_leftovers(self) -> None:
        """Older generations still here (a reader held them when they were replaced): retire them
        now if no builder holds the lock. One ``scandir`` when there are none."""
        current = self.marker.generation
        if not [name for name in owned_generations(self.paths) if name != current] and not retired_debris(self.paths):
            return
        try:
            with build_lock(self.paths, blocking=False) as lock:
                if lock.held:
                    retire_unnamed(self.paths)
        except OSError as error:
            logger.debug(f"{self.paths.cache_dir}: leftover generations stay for now ({error})")
