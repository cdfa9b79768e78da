# SPDX-License-Identifier: Apache-2.0
"""The write phases of a store: partial artifacts, then manifests, then renames, each phase
flushed once for a whole wave (see ``sidecar`` for the protocol and its guarantees).

Torch-free; the sidecar is seen through :class:`Writer`, the few methods these phases call."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from models.common.fileio import fsync_dirs, fsync_fds, unique_temp_path, write_all
from models.common.prefill_cache.layout import _ObjectPaths


class Writer(Protocol):
    """What the write phases need of a sidecar (``FrozenBackboneFeatureSidecar``)."""

    paths: _ObjectPaths

    def _reusable(self, staged: StagedObject, index: int, frontier: dict[str, object] | None) -> bool: ...
    def _sweep_debris(self) -> None: ...
    def _record_partials(self, staged: StagedObject) -> None: ...
    def _manifest_bytes(self, staged: StagedObject) -> bytes: ...
    def _promote(self) -> None: ...


@dataclass
class StagedObject:
    """One object of a store in flight: its payloads, digests and (after flushing) file records."""

    sidecar: Writer
    payloads: tuple[memoryview, ...]
    sha256s: tuple[str, ...]
    records: dict[str, dict[str, object]] = field(default_factory=dict)


@contextlib.contextmanager
def open_partials(
    sidecar: Writer,
    staged: StagedObject,
    frontier: dict[str, object] | None,
) -> Iterator[list[int | None]]:
    """Write the object's partial artifacts (reusing verified durable ones) and yield their fds
    (None for a reused file) open for flushing; closes them afterwards."""
    fds: list[int | None] = []
    try:
        for index, partial in enumerate(sidecar.paths.partials):
            if sidecar._reusable(staged, index, frontier):
                fds.append(None)
                continue
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            fds.append(fd)
            write_all(fd, staged.payloads[index])
        yield fds
    finally:
        for fd in fds:
            if fd is not None:
                os.close(fd)


def publish_wave(wave: list[StagedObject]) -> None:
    """The phases of ``FrozenBackboneFeatureSidecar.store_batch_boundary`` (locks held)."""
    with contextlib.ExitStack() as stack:
        artifact_fds: list[int] = []
        for staged in wave:
            staged.sidecar._sweep_debris()
            staged.sidecar.paths.progress.unlink(missing_ok=True)
            fds = stack.enter_context(open_partials(staged.sidecar, staged, None))
            artifact_fds.extend(fd for fd in fds if fd is not None)
        fsync_fds(artifact_fds)
    manifest_temps = [unique_temp_path(staged.sidecar.paths.manifest) for staged in wave]
    try:
        with contextlib.ExitStack() as stack:
            manifest_fds = []
            for staged, temp in zip(wave, manifest_temps, strict=True):
                staged.sidecar._record_partials(staged)
                fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                stack.callback(os.close, fd)
                write_all(fd, staged.sidecar._manifest_bytes(staged))
                manifest_fds.append(fd)
            fsync_fds(manifest_fds)
        for staged, temp in zip(wave, manifest_temps, strict=True):
            staged.sidecar._promote()
            os.replace(temp, staged.sidecar.paths.manifest)
    finally:
        for temp in manifest_temps:
            temp.unlink(missing_ok=True)
    fsync_dirs(_directories_to_sync(wave))


def _directories_to_sync(wave: Iterable[StagedObject]) -> Iterator[Path]:
    for staged in wave:
        root = staged.sidecar.paths.root
        yield from (root, root.parent, root.parent.parent, root.parent.parent.parent)
