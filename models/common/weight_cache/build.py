# SPDX-License-Identifier: Apache-2.0
"""The build transaction: the one way a cold build, a streaming seed and a Ray seed write a cache.

::

    with BuildTransaction(paths) as build:      # the build lock (waits for another builder)
        if build.locked and <the gate now says warm>:
            return <warm load>                    # another builder finished while this one waited
        root = build.open_generation()           # g<time>-<token>/ with its record and lease
        ... write every file into root ...
        build.commit(marker, files, host_sidecar) # hash + stamp every file, publish the marker,
                                                  # retire the generations it replaced

Any exception before ``commit`` returns (a missing tensor, an OOM, the stall watchdog's interrupt)
removes the generation the transaction made: a failed build leaves nothing behind. A build killed
outright leaves its generation with its record, and the next holder of the build lock removes it.
Marking a build complete through the seed API
(:func:`~models.common.weight_cache.compat.mark_weight_cache_complete`, files in the cache dir
itself, written by the caller) seals and publishes the same way, without a generation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from types import TracebackType

from loguru import logger

from models.common.fileio import atomic_write_bytes, map_largest_first
from models.common.weight_cache.generations import (
    Generation,
    LockState,
    adopt_generation,
    build_lock,
    read_record,
    retire_unnamed,
)
from models.common.weight_cache.layout import (
    VariantPaths,
)
from models.common.weight_cache.marker import (
    FileRecord,
    WeightCacheError,
    WeightCacheMarker,
    forget_markers,
    marker_json,
    named_generation,
)
from models.common.weight_cache.stamps import hash_stamped, settle_wait, stamped_as_written
from models.common.weight_cache.usage import touch_last_used


def seal_files(root: Path, relatives: Sequence[str], prefix: str = "",
               written: Mapping[str, str] | None = None) -> tuple[tuple[FileRecord, ...], int]:
    """Hash and stamp every file (several at once) once the newest has settled; returns the
    records (paths ``prefix + relative``) and the earliest moment a hash began (the marker's
    ``verified_ns``). A missing file raises ``OSError``. ``written`` (relative path -> digest):
    files hashed as they were written into ``root``, stamped without being read again."""
    files = [root / relative for relative in relatives]
    settle_wait(files)
    written = written or {}

    def seal(relative: str) -> tuple:
        if relative in written:
            return stamped_as_written(root / relative, written[relative])
        return hash_stamped(root / relative)

    hashed = map_largest_first(seal, list(relatives), [file.stat().st_size for file in files])
    records = tuple(FileRecord(prefix + relative, stamp.size, digest, stamp)
                    for relative, (stamp, digest, _) in zip(relatives, hashed))
    return records, min((verified for _, _, verified in hashed), default=0)


def publish_marker(paths: VariantPaths, marker: WeightCacheMarker) -> None:
    """Write the marker atomically: from here on readers see this build."""
    atomic_write_bytes(paths.marker, marker_json(marker))
    forget_markers()


class BuildTransaction:
    """One cold build of one variant, from the build lock to the marker (see the module doc)."""

    def __init__(self, paths: VariantPaths, *, blocking: bool = True) -> None:
        self.paths = paths
        self.blocking = blocking
        self.lock = LockState(False, "not entered")
        self.generation: Generation | None = None
        self.committed: WeightCacheMarker | None = None
        self.timings: dict[str, float] = {}  # seal (hash + stamp), publish (marker), retire
        self.opened_at = 0.0  # when the generation was made: the marker's build_seconds count from here
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> BuildTransaction:
        self.lock = self._stack.enter_context(build_lock(self.paths, blocking=self.blocking))
        if self.lock.held:
            retire_unnamed(self.paths)  # what killed builds and leased readers left
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        try:
            if self.generation is not None and self.committed is None:
                self.generation.remove()
        finally:
            self._stack.close()

    @property
    def locked(self) -> bool:
        return self.lock.held

    def open_generation(self) -> Path:
        """Make this build's generation (with its record, lease held) and return its directory.
        Raises ``OSError`` when the cache cannot be written."""
        if not self.lock.held:
            raise PermissionError(f"{self.paths.cache_dir} is not writable: {self.lock.why}")
        self.generation = Generation(self.paths)
        self.opened_at = time.perf_counter()
        return self.generation.path

    def commit(self, marker: WeightCacheMarker, files: Sequence[str], host_sidecar: str | None = None, *,
               expected: Mapping[str, str] | None = None, hashed_as_written: Collection[str] = ()) -> WeightCacheMarker:
        """Seal ``files`` (and the sidecar; paths relative to the generation), publish the marker
        and retire what it replaced. Returns the marker as published.

        ``expected`` (relative path -> digest: files copied from elsewhere, a pull's) must be what
        the seal hashes, or nothing is published (:class:`WeightCacheError`; the generation goes).
        ``hashed_as_written``: paths whose ``expected`` digest the caller computed from the bytes
        as it wrote them into the generation (and checked there): stamped, not hashed again."""
        generation = self.generation
        if generation is None:
            raise RuntimeError("commit() before open_generation()")
        prefix = f"{generation.name}/"
        start = time.perf_counter()
        written = {path: expected[path] for path in hashed_as_written} if expected is not None else {}
        records, verified_ns = seal_files(generation.path, [*files, *([host_sidecar] if host_sidecar else [])], prefix,
                                          written)
        sealed_at = time.perf_counter()
        for record in records if expected is not None else ():
            if expected.get(record.path.removeprefix(prefix)) != record.digest:
                raise WeightCacheError(f"{record.path} is not the file this build was given; nothing was published")
        sealed = dataclasses.replace(marker, generation=generation.name, files=records[:len(files)],
                                     host_sidecar=records[len(files)] if host_sidecar else None, verified_ns=verified_ns,
                                     build_seconds=round(sealed_at - self.opened_at, 3))
        previous = named_generation(self.paths.marker)
        if previous and read_record(self.paths.generation_dir(previous)) is None:
            adopt_generation(self.paths, previous)  # an older format's generation: removable once replaced
        publish_marker(self.paths, sealed)
        published_at = time.perf_counter()
        self.committed = sealed
        generation.release()
        touch_last_used(self.paths)
        retired = retire_unnamed(self.paths)
        self.timings = {"seal": sealed_at - start, "publish": published_at - sealed_at,
                        "retire": time.perf_counter() - published_at}
        if retired.leased:
            logger.info(f"{self.paths.cache_dir}: {len(retired.leased)} older generation(s) still leased by readers; "
                        "the next build, gc or warm start retires them")
        return sealed
