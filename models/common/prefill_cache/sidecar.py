# SPDX-License-Identifier: Apache-2.0
"""The durable object of one authority: store, lookup, validation proofs and legacy objects.

Write protocol: take the object's lock; write the artifacts to ``*.partial`` and flush them; record
their digests in ``progress.json``; rename the partials into place; publish the manifest
atomically; fsync the directory. A writer killed at any point leaves no manifest (a plain miss)
or a complete object; the next writer of the object reuses or rewrites what it finds. A store
that *fails* (ENOSPC, EIO) removes everything it wrote before re-raising, so a full disk is not
left fuller; a killed writer's files are removed by the next store of that object or by
:func:`models.common.prefill_cache.maintenance.gc`, which knows the writer is dead because it can
take the writer's lock (a ``flock``: valid across PID namespaces, unlike a pid). Published files
are never modified in place (a repair renames new files over them). :meth:`FrozenBackboneFeatureSidecar.store_batch_boundary` runs the same protocol for
a whole wave with one flush per phase and locks taken in one global order.

Read protocol: each of the four files is opened once and checked to be the file stamped, and
everything is read through those opens (:mod:`models.common.file_snapshot`, the rule shared with
the weight cache: open once, verify, copy out through the descriptor, never map a cache file):
every manifest field, every artifact record and the SHA-256 of every artifact's bytes as read
into the tensors returned; anything off - including any ``OSError`` on the way (an unreadable
file, a cache root that is a regular file) - raises :class:`FrozenBackboneCacheError`. A hit's
tensors are memory of the caller's own: a file truncated or rewritten later never reaches them.
The proof is kept in a bounded in-process LRU and reused while the stamps of all four files
(:class:`~models.common.weight_cache.stamps.FileStamp`: inode, size, mtime, ctime) are unchanged,
the summary's checked on the very open it is read through - but only for files last changed a whole clock tick before the proof
(the one racy-clock rule of :mod:`models.common.weight_cache.stamps`), because coarse
file-system clocks can hide a same-size rewrite made within one tick (git's "racy clean" rule).
Changed stamps (a copy, a restore, a remount) only mean "hash again", never "corrupt".

Legacy objects (authority schema v1, named by a hash that included the source tree) are still
found, read-only: by a direct probe when the caller still knows that source hash, otherwise
through a per-root index of their normalized manifests (``legacy``).

A consumer that uses a found object marks it used (:meth:`FrozenBackboneFeatureSidecar.mark_used_boundary`,
``usage``: the object directory's mtime, at most once a minute per object and process), which is
what size-capped eviction orders by.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Final, NamedTuple

import torch
from loguru import logger

from models.common.file_snapshot import OpenFile, open_once, read_snapshot
from models.common.fileio import (
    atomic_write_bytes,
    file_lock,
    file_locks,
    fsync_dir,
    fsync_dirs,
    fsync_fds,
    is_temp_path,
    sha256_bytes,
    sha256_file,
)
from models.common.prefill_cache.identity import FEATURE_DTYPES, FrozenBackboneCacheAuthority, tensor_bytes
from models.common.prefill_cache.layout import (
    ARTIFACT_NAMES,
    MANIFEST_MAX_BYTES,
    FROZEN_BACKBONE_SIDECAR_PROGRESS_SCHEMA,
    FrozenBackboneCacheError,
    _ObjectPaths,
    artifact_record,
    artifact_specs,
    canonical_json,
    check_manifest_header,
    digest_matches,
    expect,
    is_int,
    is_sha256_hex,
    json_sha256,
    manifest_bytes,
    normalized_authority,
    parse_json_object,
    read_json_object,
    recorded_digests,
    str_keyed,
)
from models.common.prefill_cache.legacy import LEGACY_INDEX
from models.common.prefill_cache.packet import FrozenBackbonePrefillPacket
from models.common.prefill_cache.publish import StagedObject, open_partials, publish_wave
from models.common.prefill_cache.usage import USES
from models.common.weight_cache.stamps import FileStamp, timestamp_tick_ns

_PROOF_CACHE_ENTRIES: Final = 8_192
_PROOF_CACHE_BYTES: Final = 64 << 20


@contextlib.contextmanager
def _cache_errors(what: str) -> Iterator[None]:
    """Turn every OSError (and torch's RuntimeError from mapping a file) into the one error."""
    try:
        yield
    except FrozenBackboneCacheError:
        raise
    except (OSError, RuntimeError, RecursionError) as error:
        raise FrozenBackboneCacheError(f"{what}: {error!r}") from error


# ---------------------------------------------------------------------------------------------
# Kernel stamps and validation proofs
# ---------------------------------------------------------------------------------------------


def _stamp(path: Path | str) -> FileStamp | None:
    """The file's stamp (:mod:`models.common.weight_cache.stamps`, the one stamp of every cache),
    None when absent or not a regular file; other OSErrors propagate (a parent that is a regular
    file, an unreadable directory)."""
    try:
        observed = os.stat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(observed.st_mode):
        return None
    return FileStamp.of(observed)


def _object_stamps(paths: _ObjectPaths) -> tuple[FileStamp | None, ...]:
    """Stamps of the manifest and the three artifacts (None where not a regular file)."""
    return tuple(map(_stamp, paths.stamped_names))


class _Small(NamedTuple):
    """The validated small artifacts of an object (templates: callers get clones)."""

    final_hidden: torch.Tensor
    input_positions: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.final_hidden.nbytes + self.input_positions.nbytes


class _ProofCache:
    """Bounded LRU of validated objects: (manifest path, authority sha) -> (file stamps, the
    small artifacts as tensors).

    A hit means "these exact files were fully hashed and matched", so a hot object costs four
    ``stat`` calls and one read of the summary instead of a re-hash. The few KiB of the final
    hidden state and input position ride along with the proof (bounded in total) so a hit reads
    one file, not three. Reset in a forked child (its lock may be mid-use)."""

    def __init__(self, capacity: int, byte_budget: int) -> None:
        self.capacity = capacity
        self.byte_budget = byte_budget
        self._lock = threading.Lock()
        self._proofs: OrderedDict[tuple[str, str], tuple[tuple[FileStamp | None, ...], _Small]] = OrderedDict()
        self._bytes = 0

    def holds(self, key: tuple[str, str], stamps: tuple[FileStamp | None, ...]) -> _Small | None:
        """The small artifacts if ``key`` is proven for exactly these stamps, else None."""
        with self._lock:
            proof = self._proofs.get(key)
            if proof is None:
                return None
            if proof[0] != stamps:
                self._drop(key)
                return None
            self._proofs.move_to_end(key)
            return proof[1]

    def remember(
        self, key: tuple[str, str], stamps: tuple[FileStamp | None, ...], small: _Small, started_ns: int, tick_ns: int
    ) -> None:
        """Keep a proof unless a file changed so recently that its stamp may not show a rewrite
        (the racy-clock rule of :meth:`FileStamp.settled`)."""
        if not all(s.settled(started_ns, tick_ns) for s in stamps if s is not None):
            return
        with self._lock:
            if key in self._proofs:
                self._drop(key)
            self._proofs[key] = (stamps, small)
            self._bytes += small.nbytes
            while len(self._proofs) > self.capacity or self._bytes > self.byte_budget:
                self._drop(next(iter(self._proofs)))

    def _drop(self, key: tuple[str, str]) -> None:
        self._bytes -= self._proofs.pop(key)[1].nbytes

    def clear(self) -> None:
        with self._lock:
            self._proofs.clear()
            self._bytes = 0

    def reset_after_fork(self) -> None:
        self._lock = threading.Lock()
        self.clear()


_PROOFS = _ProofCache(_PROOF_CACHE_ENTRIES, _PROOF_CACHE_BYTES)
os.register_at_fork(after_in_child=_PROOFS.reset_after_fork)


def _clear_validation_proofs() -> None:
    """Forget every cached validation proof (benchmarks measure cold lookups with it)."""
    _PROOFS.clear()


# ---------------------------------------------------------------------------------------------
# The durable object
# ---------------------------------------------------------------------------------------------


class FrozenBackboneFeatureSidecar:
    """The durable object of one authority under ``cache_root`` (see the module docstring)."""

    def __init__(self, *, cache_root: Path, authority: FrozenBackboneCacheAuthority) -> None:
        self.authority = authority
        self.authority_record = authority.record_boundary()
        self.authority_sha256 = json_sha256(self.authority_record)
        with _cache_errors(f"cannot resolve prefill cache root {cache_root}"):
            self.cache_root = Path(cache_root).expanduser().resolve()
        self.paths = _ObjectPaths.of(self.cache_root, self.authority_sha256, authority.feature_dtype)
        self.legacy_authority_record = authority.legacy_v1_record_boundary()
        self.legacy_authority_sha256 = (
            None
            if self.legacy_authority_record is None
            else json_sha256(self.legacy_authority_record)
        )
        self.legacy_paths = (
            None
            if self.legacy_authority_sha256 is None
            else _ObjectPaths.of(self.cache_root, self.legacy_authority_sha256, authority.feature_dtype)
        )
        self._dtype = FEATURE_DTYPES[authority.feature_dtype]
        hidden, positions = authority.hidden_size, authority.summary_positions
        self._specs = artifact_specs(authority.feature_dtype, hidden, positions)
        self._elements = tuple(spec.elements for spec in self._specs)
        self._shapes = ((1, 1, hidden), (1, positions, hidden), (1,))
        self._torch_dtypes = (self._dtype, self._dtype, torch.long)
        self._identity_rows = authority.digest_tensors_boundary()
        self._identity_template = torch.stack(self._identity_rows)  # [3, 1, 32]
        self._summary_mask = torch.ones((1, positions), dtype=torch.bool)

    def __repr__(self) -> str:
        return f"FrozenBackboneFeatureSidecar({self.paths.root})"

    # -- lookup ---------------------------------------------------------------------------

    def lookup_boundary(self) -> FrozenBackbonePrefillPacket | None:
        """The stored row (read into tensors of the caller's own), or None on a miss. Never writes anything.

        Raises FrozenBackboneCacheError when an object exists but does not check out, or when
        the cache cannot be read at all."""
        with _cache_errors(f"cannot look up {self.paths.root}"):
            found = self._lookup(self.paths)
            if found is None and self.legacy_paths is not None:
                found = self._lookup(self.legacy_paths)
            return found if found is not None else self._lookup_indexed_legacy()

    def mark_used_boundary(self) -> None:
        """Record that this object was just used (after a lookup found it): what size-capped
        eviction orders by (``usage``). The one metadata change a reader makes, and only when it
        asks: ``lookup_boundary`` itself never writes."""
        USES.touch(self.paths.root)

    def _lookup_indexed_legacy(self) -> FrozenBackbonePrefillPacket | None:
        for manifest_path in LEGACY_INDEX.get(self.cache_root).get(self.authority_sha256, ()):
            paths = _ObjectPaths.of(self.cache_root, manifest_path.parent.name, self.authority.feature_dtype)
            if paths.root not in (self.paths.root, getattr(self.legacy_paths, "root", None)):
                found = self._lookup(paths)
                if found is not None:
                    return found
        return None

    def _lookup(self, paths: _ObjectPaths) -> FrozenBackbonePrefillPacket | None:
        """The object at ``paths``: None without a manifest, else validated (or proven) and read."""
        stamps = _object_stamps(paths)
        if stamps[0] is None:
            return None
        key = (paths.stamped_names[0], self.authority_sha256)
        small = _PROOFS.holds(key, stamps)
        try:
            found = self._read_proven(paths, small, stamps[2]) if small is not None else None
            if found is None:  # not proven, or the summary is no longer the file proven: hash again
                found = self._validate_and_read(paths, key, stamps if small is None else _object_stamps(paths))
        except (FrozenBackboneCacheError, OSError, RuntimeError):
            if _stamp(paths.manifest) is None:  # retracted meanwhile (gc, a rebuild): a miss
                return None
            raise
        return found

    def _row(self, final_t: torch.Tensor, summary_t: torch.Tensor, positions_t: torch.Tensor) -> FrozenBackbonePrefillPacket:
        """The packet row of the three artifacts (tensors of the caller's own), with this
        authority's mask and identity digests."""
        return FrozenBackbonePrefillPacket(
            final_t, summary_t, self._summary_mask.clone(), positions_t, *self._identity_template.clone().unbind(0)
        )

    def _read_artifact(self, file: OpenFile, index: int) -> torch.Tensor:
        """Artifact ``index`` read through its open file into a new tensor (never a mapping of the
        file: :mod:`models.common.file_snapshot`)."""
        values = torch.empty(self._elements[index], dtype=self._torch_dtypes[index])
        read_snapshot(file, memoryview(values.view(torch.uint8).numpy()))
        return values.view(self._shapes[index])

    def _read_proven(self, paths: _ObjectPaths, small: _Small, proven: FileStamp | None) -> FrozenBackbonePrefillPacket | None:
        """A proven object: the summary read through one open checked to be the file the proof
        stamped (``proven``), the small artifacts cloned from the proof; None when the summary
        opened is another file (renamed over since the stamps were taken): validate again."""
        with open_once(paths.artifact_names[1]) as summary:
            if FileStamp.of(summary.info) != proven:
                return None
            summary_t = self._read_artifact(summary, 1)
        return self._row(small.final_hidden.clone(), summary_t, small.input_positions.clone())

    def _validate_and_read(
        self, paths: _ObjectPaths, key: tuple[str, str], before: tuple[FileStamp | None, ...]
    ) -> FrozenBackbonePrefillPacket:
        """Open the four files once, check they are the files stamped ``before``, read and check
        everything through those opens; remember the proof."""
        started_ns = time.time_ns()
        expect(None not in before, paths.root, "an artifact is missing or not a regular file")
        with contextlib.ExitStack() as stack:
            files = [stack.enter_context(open_once(name)) for name in paths.stamped_names]
            expect(tuple(FileStamp.of(file.info) for file in files) == before, paths.root,
                   "files changed while they were being validated")
            manifest = self._read_manifest(paths, files[0])
            stored = check_manifest_header(paths.root, manifest)
            expect(
                canonical_json(normalized_authority(stored)) == canonical_json(self.authority_record),
                paths.root,
                "stored authority is not the requested authority",
            )
            digests = recorded_digests(paths.root, manifest, self._specs, tuple(file.info.st_size for file in files[1:]))
            final_t, summary_t, positions_t = (self._read_artifact(file, index) for index, file in enumerate(files[1:]))
        for spec, tensor, digest in zip(self._specs, (final_t, summary_t, positions_t), digests, strict=True):
            digest_matches(paths.root, spec, sha256_bytes(tensor_bytes(tensor)), digest)
        expect(int(positions_t[0]) > 0, paths.root, "input position is not positive")
        small = _Small(final_t.clone(), positions_t.clone())
        _PROOFS.remember(key, before, small, started_ns, timestamp_tick_ns(paths.manifest))
        return self._row(final_t, summary_t, positions_t)

    @staticmethod
    def _read_manifest(paths: _ObjectPaths, file: OpenFile) -> dict[str, object]:
        if file.info.st_size > MANIFEST_MAX_BYTES:
            raise FrozenBackboneCacheError(f"manifest {paths.manifest} is larger than {MANIFEST_MAX_BYTES} bytes")
        data = bytearray(file.info.st_size)
        read_snapshot(file, memoryview(data))
        return parse_json_object(bytes(data), paths.manifest, "manifest")

    # -- progress -------------------------------------------------------------------------

    def progress_boundary(self) -> dict[str, object] | None:
        """The durable frontier of an interrupted store of this object, or None if none.

        ``{"schema", "authoritySha256", "completedRows": 1, "artifacts": {name: {"bytes",
        "sha256"}}}`` says the partial artifacts with those digests were flushed to disk.
        Raises FrozenBackboneCacheError when the file exists but is not such a record."""
        with _cache_errors(f"cannot read the progress of {self.paths.root}"):
            if _stamp(self.paths.progress) is None:
                return None
        progress, _ = read_json_object(self.paths.progress, "progress file")
        artifacts = str_keyed(progress.get("artifacts"))
        well_formed = (
            progress.get("schema") == FROZEN_BACKBONE_SIDECAR_PROGRESS_SCHEMA
            and progress.get("authoritySha256") == self.authority_sha256
            and is_int(progress.get("completedRows"))
            and progress.get("completedRows") == 1
            and artifacts is not None
            and set(artifacts) == set(ARTIFACT_NAMES)
            and all(self._is_progress_record(artifacts[name]) for name in ARTIFACT_NAMES)
        )
        if not well_formed:
            raise FrozenBackboneCacheError(f"progress file {self.paths.progress} is malformed")
        return progress

    @staticmethod
    def _is_progress_record(value: object) -> bool:
        record = str_keyed(value)
        return (
            record is not None
            and is_int(record.get("bytes"))
            and record["bytes"] >= 0
            and is_sha256_hex(record.get("sha256"))
        )

    def _progress_payload(self, staged: StagedObject) -> dict[str, object]:
        return {
            "schema": FROZEN_BACKBONE_SIDECAR_PROGRESS_SCHEMA,
            "authoritySha256": self.authority_sha256,
            "completedRows": 1,
            "artifacts": {
                name: {"bytes": len(payload), "sha256": digest}
                for name, payload, digest in zip(
                    ARTIFACT_NAMES, staged.payloads, staged.sha256s, strict=True
                )
            },
        }

    # -- store ----------------------------------------------------------------------------

    def _check_packet(self, packet: FrozenBackbonePrefillPacket) -> None:
        """Refuse a row that is not this authority's before touching the disk."""
        packet.validate_boundary()
        if (
            tuple(packet.final_hidden_t.shape) != self._shapes[0]
            or tuple(packet.summary_hidden_t.shape) != self._shapes[1]
            or packet.final_hidden_t.dtype != self._dtype
        ):
            raise ValueError(
                f"packet does not match its authority: final {tuple(packet.final_hidden_t.shape)}, "
                f"summary {tuple(packet.summary_hidden_t.shape)} {packet.final_hidden_t.dtype}; "
                f"expected {self._shapes[0]}, {self._shapes[1]} {self._dtype}"
            )
        identity = (packet.cache_key_sha256_t, packet.work_id_sha256_t, packet.prompt_mask_sha256_t)
        for actual, expected in zip(identity, self._identity_rows, strict=True):
            if not torch.equal(actual.detach().cpu(), expected):
                raise ValueError("packet identity digests differ from its authority")

    def _staged(self, packet: FrozenBackbonePrefillPacket) -> StagedObject:
        payloads = tuple(
            tensor_bytes(t)
            for t in (packet.final_hidden_t, packet.summary_hidden_t, packet.input_positions_t)
        )
        return StagedObject(self, payloads, tuple(sha256_bytes(p) for p in payloads))

    def _existing_or_retract(self) -> FrozenBackbonePrefillPacket | None:
        """Under the writer lock: the valid object if there is one (its dead writers' leftovers
        removed); otherwise make sure no manifest claims one (a corrupt object is retracted, so a
        crash mid-rebuild is a miss)."""
        try:
            existing = self._lookup(self.paths)
            if existing is not None:
                self._remove_leftovers()
            return existing
        except (FrozenBackboneCacheError, OSError, RuntimeError) as error:
            logger.warning("rebuilding invalid prefill cache object: {}", error)
            self.paths.manifest.unlink(missing_ok=True)
            fsync_dir(self.paths.root)
            return None

    def _sweep_debris(self) -> None:
        """Remove temp files of killed writers (safe: we hold the writer lock)."""
        for path in self.paths.root.iterdir():
            if is_temp_path(path):
                path.unlink(missing_ok=True)

    def _remove_leftovers(self) -> None:
        """Partials, temp files and progress of writers that died after (or while re-) publishing
        this object: we hold its lock, so their writers are gone."""
        for path in (*self.paths.partials, self.paths.progress):
            if _stamp(path) is not None:
                path.unlink(missing_ok=True)
        self._sweep_debris()

    def _discard_unpublished(self) -> None:
        """After a failed store (lock held): remove every file it may have written, unless the
        manifest made it into place (then the object is complete and stays)."""
        with contextlib.suppress(OSError):
            if _stamp(self.paths.manifest) is not None:
                return
        for path in (*self.paths.partials, *self.paths.artifacts, self.paths.progress):
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self._sweep_debris()

    def _durable_frontier(self) -> dict[str, object] | None:
        try:
            return self.progress_boundary()
        except FrozenBackboneCacheError as error:
            logger.warning("ignoring {}; restaging from the packet", error)
            return None

    def _reusable(self, staged: StagedObject, index: int, frontier: dict[str, object] | None) -> bool:
        """True when a durable partial artifact from an interrupted store already holds exactly
        the bytes to write (checked by hash, never trusted)."""
        if frontier is None:
            return False
        recorded = frontier["artifacts"][ARTIFACT_NAMES[index]]  # type: ignore[index]
        partial = self.paths.partials[index]
        if recorded["sha256"] != staged.sha256s[index] or _stamp(partial) is None:
            return False
        return os.stat(partial).st_size == len(staged.payloads[index]) and (
            sha256_file(partial) == staged.sha256s[index]
        )

    def _record_partials(self, staged: StagedObject) -> None:
        for spec, partial, digest in zip(self._specs, self.paths.partials, staged.sha256s, strict=True):
            staged.records[spec.name] = artifact_record(spec, os.stat(partial).st_size, digest)

    def _manifest_bytes(self, staged: StagedObject) -> bytes:
        return manifest_bytes(self.authority_sha256, self.authority_record, staged.records)

    def _promote(self) -> None:
        for partial, final in zip(self.paths.partials, self.paths.artifacts, strict=True):
            os.replace(partial, final)

    def store_boundary(self, packet: FrozenBackbonePrefillPacket) -> FrozenBackbonePrefillPacket:
        """Durably publish one row and return it (private copies of the bytes written).

        If the object already exists (and checks out) it is returned untouched. A store that
        fails raises the OSError that stopped it after removing what it wrote."""
        self._check_packet(packet)
        self.paths.root.mkdir(parents=True, exist_ok=True)
        with file_lock(self.paths.lock):
            existing = self._existing_or_retract()
            if existing is not None:
                return existing
            staged = self._staged(packet)
            try:
                self._sweep_debris()
                frontier = self._durable_frontier()
                with open_partials(self, staged, frontier) as fds:
                    fsync_fds(fd for fd in fds if fd is not None)
                    self._record_partials(staged)
                atomic_write_bytes(self.paths.progress, canonical_json(self._progress_payload(staged)))
                self._promote()
                atomic_write_bytes(self.paths.manifest, self._manifest_bytes(staged))
            except BaseException:
                self._discard_unpublished()
                raise
            self.paths.progress.unlink(missing_ok=True)
            fsync_dirs(self.paths.root.parents[index] for index in range(3))  # the object's own entry
            return self._stored_row(staged)

    def _stored_row(self, staged: StagedObject) -> FrozenBackbonePrefillPacket:
        """The row just stored, as private copies of the bytes written (never a mapping of them)."""
        final_t, summary_t, positions_t = (
            torch.frombuffer(bytearray(payload), dtype=dtype).view(shape)
            for payload, dtype, shape in zip(staged.payloads, self._torch_dtypes, self._shapes, strict=True)
        )
        return self._row(final_t, summary_t, positions_t)

    @staticmethod
    def store_batch_boundary(
        captured: tuple[tuple[FrozenBackboneFeatureSidecar, FrozenBackbonePrefillPacket], ...],
    ) -> int:
        """Durably publish a producer's wave of rows; returns the number of rows in the wave.

        Each row is still its own object with its own lock; only the flushes are shared: all
        artifacts are written then flushed together, then all manifests are written and flushed,
        then renamed into place, then each directory is synced once. Locks are taken in one
        global order, so overlapping waves from many processes never deadlock. A failure before
        the renames leaves no manifest (lookups see a plain miss) and removes what the wave
        wrote. Rows that already exist are left untouched. (Durability of the renames relies on
        the file system committing metadata in order, as journaling file systems do.)"""
        if not captured:
            return 0
        roots = [sidecar.paths.root for sidecar, _ in captured]
        if len(set(roots)) != len(roots):
            raise ValueError("a frozen-backbone batch names the same object more than once")
        for sidecar, packet in captured:
            sidecar._check_packet(packet)
        for root in roots:
            root.mkdir(parents=True, exist_ok=True)
        with file_locks(sidecar.paths.lock for sidecar, _ in captured):
            todo = [
                sidecar._staged(packet)
                for sidecar, packet in sorted(captured, key=lambda row: str(row[0].paths.root))
                if sidecar._existing_or_retract() is None
            ]
            if todo:
                try:
                    publish_wave(todo)
                except BaseException:
                    for staged in todo:
                        staged.sidecar._discard_unpublished()
                    raise
        return len(captured)
