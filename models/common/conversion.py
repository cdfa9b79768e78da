# SPDX-License-Identifier: Apache-2.0
"""What a family's ``convert`` reads from and writes into.

A family converts a model by reading checkpoint tensors from ``sink.state`` (a ``state_dict``)
and calling ``sink.put(name, tensor, format)`` for every weight the device consumes. The same
``convert`` runs for every kind of build, because only these two objects change:

* cold: ``state`` is the checkpoint (:class:`LazyStateDict`), ``put`` converts and writes;
* warm: ``state`` is the cache's placeholders, ``put`` loads the cached file;
* planning and partitioned (Ray) builds: see :mod:`models.common.build_plan`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future
from typing import Any

import torch
import ttnn

from models.common.safetensors_file import CheckpointReader
from models.common.weight_cache.placeholders import placeholder
from models.common.weight_cache.tensor_cache import TensorCache, TensorFormat


class LazyStateDict(Mapping):
    """The checkpoint as a read-only ``state_dict`` whose tensors are read when indexed."""

    def __init__(self, reader: CheckpointReader) -> None:
        self._reader = reader
        self._keys = reader.keys()

    def __getitem__(self, key: str) -> torch.Tensor:
        return self._reader.get(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._reader

    def release_read(self, keep: Iterable[str] = (), *, now: bool = False) -> None:
        """Release the pages of the tensors read so far but ``keep`` when the next read begins (a
        streaming build, after each weight); ``now``: at once (a large weight's bytes were just
        copied into tiles). See :meth:`CheckpointReader.release_read`."""
        self._reader.release_read(keep, now=now)

    def recent_keys(self) -> list[str]:
        """The tensors read since the last release (those the weight being put was made from)."""
        return self._reader.recent_keys()

    def map_view(self, view: torch.Tensor) -> None:
        """Map the pages under ``view``, a chunk of a large weight about to be converted."""
        self._reader.map_view(view)

    def release_view(self, view: torch.Tensor) -> None:
        """Release the pages under ``view``, a chunk just converted (a large weight, written block by
        block); a view of anything but the checkpoint is left alone."""
        self._reader.release_view(view)

    def manifest_view(self, host: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Shapes and dtypes of every tensor (as placeholders), with the host weights already
        read for the build (``host``) real: nothing is read again."""
        return {key: host[key] if key in host else placeholder(*self._reader.spec(key)) for key in self._keys}


class WeightSink:
    """What ``convert`` writes into: ``put`` a weight in the form the device consumes.

    ``keep=False`` (a streaming seed) drops each converted weight once it is handed to the cache
    and releases the checkpoint pages it was made from (``after_put(name)`` after each put, for
    other states); the host weights' pages stay until ``sidecar`` (the host sidecar's write, set
    by the build) is done, since its writer reads them. A large weight
    made from a host weight (a tied LM head) waits for that write, then releases them too."""

    def __init__(
        self,
        cache: TensorCache | None,
        state: Mapping[str, Any],
        host_keys: Iterable[str],
        *,
        keep: bool = True,
        after_put: Callable[[str], None] | None = None,
    ) -> None:
        self._cache = cache
        self.state = state
        self.keep = keep
        self.sidecar: Future | None = None  # the host sidecar's write, when the build makes one
        self.after_put = after_put
        self.weights: dict[str, ttnn.Tensor] = {}
        self.formats: dict[str, TensorFormat] = {}
        self.host: dict[str, torch.Tensor] = {k: state[k] for k in host_keys if k in state}

    def put(self, name: str, tensor: torch.Tensor, fmt: TensorFormat) -> None:
        if name in self.formats:
            raise ValueError(f"weight {name!r} converted twice")
        streaming = not self.keep and isinstance(self.state, LazyStateDict)  # a streaming seed: memory flat
        converted = self._cache.as_tensor(name, tensor, fmt, release_source=self._release_source if streaming else None,
                                          pages=self.state if streaming else None)
        self.formats[name] = fmt
        if self.keep:
            self.weights[name] = converted
        if streaming:
            self.state.release_read(keep=self._sidecar_reads())
        if self.after_put is not None:
            self.after_put(name)

    def _sidecar_reads(self) -> Iterable[str]:
        """The host weights while the sidecar writer may still read them."""
        return self.host if self.sidecar is not None and not self.sidecar.done() else ()

    def _release_source(self) -> None:
        """A large weight's bytes are in tiles now: release its checkpoint pages at once, its source's
        too when that is a host weight, once the sidecar is written (a later touch reads the file)."""
        if self.sidecar is not None and any(key in self.host for key in self.state.recent_keys()):
            self.sidecar.exception()  # waits; a failed write is the writer's to report
        self.state.release_read(keep=self._sidecar_reads(), now=True)
