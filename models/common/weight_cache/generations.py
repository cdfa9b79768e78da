# SPDX-License-Identifier: Apache-2.0
"""Build generations of one cache dir: one builder at a time, readers never blocked or broken,
and nothing removed that a record does not prove this variant's builds made.

Every cold build writes into a fresh ``g<time>-<token>/`` and publishes its marker last, so readers
of the previous marker keep loading the previous generation's files until the switch. The rules,
in one place:

* **Build lock** ``<cache_dir>/.build.lock``: an exclusive ``flock`` held by the builder from the
  first check to the marker; the holder writes its host and pid into it, so a waiting builder can
  say whom it waits for. Readers never take it. The lock file is opened read-write (NFSv4 grants
  exclusive locks only so), read-only where it is another user's (a local file system locks it
  all the same), and where neither locks, a per-user lock stands in (say so: two users may then
  build at once, each into its own generation, which is safe but wasteful).
* **Ownership record** ``<generation>/.generation``: the variant tag, the build id, host and pid.
  A directory is a generation of a variant only if it is a real directory (no symlink) named like
  one and holds a record that names it and the variant. Everything else in a cache dir, a user's
  folder or another model's cache, is never touched.
* **The proof outlives every file.** A generation is made with its record in one step: the record
  is written beside it first (``.generation.<name>``), then the directory and its lease, then the
  record is renamed into it. A deletion runs the other way: every file but the record, then the
  record out beside it, the empty directory, the record last. So a kill at any point leaves either
  a generation with its record or a record beside what it names; the next holder of the build lock
  (a build, ``gc``, ``clean``) finishes the work, and ``ls`` counts it until then.
* **Who may still be at work on a record beside** is told by its name. Beside a generation's own
  name it is a making's (or the making's own undoing): left alone while the builder it names lives
  (same host: its pid; another host: 10 minutes). Beside a renamed-aside name it is a retirement's,
  and the builder it names is not the retirer (a server that built a generation outlives its
  retirement by someone else): a retirement runs only under the build lock, so the next holder
  finishes it whoever built the generation and whether or not that builder lives.
* **Leases** ``<generation>/.readers``: a reader holds a shared ``flock`` on it while it opens the
  generation's files (each copied into sealed memory as it is opened: the copy outlives the
  unlink), and the builder holds one for as long as it writes. Nobody waits for it: a refused lease means the
  generation is being retired, and the reader reads the (by then newer) marker again.
* **Retirement**, by whoever holds the build lock (a build after publishing, ``gc``, ``clean``,
  and a warm start that finds the lock free): a generation of this variant that no marker names and
  whose lease can be taken exclusively is renamed aside (atomically, out of every reader's path)
  and then deleted, its record last; one still leased is left for the next holder. A build that
  fails removes its own generation at once; a killed one leaves it to the next holder.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import shutil
import socket
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from loguru import logger

from models.common.fileio import (
    atomic_write_bytes,
    create_whole,
    fsync_dir,
    held_by_others,
    open_lock_file,
    try_flock,
)
from models.common.weight_cache.layout import (
    GENERATION_PREFIX,
    GENERATION_RECORD,
    PENDING_RECORD_PREFIX,
    READERS_LEASE,
    RETIRED_PREFIX,
    VariantPaths,
    is_generation_name,
    is_marker_name,
    tree_bytes,
)
from models.common.weight_cache.marker import named_generation
from models.common.weight_cache.side_files import bounded_int, read_json_record

MAX_RECORD_BYTES = 4096
OTHER_HOST_WRITER_S = 600  # a record beside a generation, written on another host: in use this long


# --------------------------------------------------------------------------------------------
# Ownership
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GenerationRecord:
    """Who made a generation: the proof :func:`owned_generations` asks for before removing it."""

    name: str
    variant: str  # the variant tag
    build: str
    created_ns: int
    host: str
    pid: int

    def as_json(self) -> bytes:
        return json.dumps({"name": self.name, "variant": self.variant, "build": self.build,
                           "created_ns": self.created_ns, "host": self.host, "pid": self.pid}).encode()


_MAX_NS = (1 << 63) - 1
_MAX_PID = (1 << 31) - 1


def _parse_record(directory: Path) -> GenerationRecord | None:
    """The regular-file record inside ``directory`` (never through a symlink, never a FIFO),
    parsed and range-checked; anything else is no record (with a warning, by the reader)."""
    return _parse_record_file(directory / GENERATION_RECORD)


def _parse_record_file(path: Path) -> GenerationRecord | None:
    body = read_json_record(path, MAX_RECORD_BYTES, follow_symlinks=False)
    if body is None:
        return None
    fields = [body.get(key) for key in ("name", "variant", "build", "host")]
    created_ns, pid = body.get("created_ns"), body.get("pid")
    if not (all(isinstance(value, str) and len(value) <= 256 for value in fields)
            and bounded_int(created_ns, 0, _MAX_NS) and bounded_int(pid, 0, _MAX_PID)):
        logger.warning(f"{path}: not a generation record (a field is missing, mistyped or out of range); ignored")
        return None
    name, variant, build, host = fields
    return GenerationRecord(name, variant, build, created_ns, host, pid)


def _is_real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def read_record(directory: Path) -> GenerationRecord | None:
    """The record of a generation directory, or None unless ``directory`` is a real directory
    named like a generation whose record names it."""
    if not is_generation_name(directory.name) or not _is_real_dir(directory):
        return None
    record = _parse_record(directory)
    return record if record is not None and record.name == directory.name else None


def owned_generations(paths: VariantPaths) -> list[str]:
    """Names of the generations in ``paths.cache_dir`` whose records name this variant."""
    owned = []
    with contextlib.suppress(OSError), os.scandir(paths.cache_dir) as entries:
        for entry in entries:
            if is_generation_name(entry.name):
                record = read_record(Path(entry.path))
                if record is not None and record.variant == paths.tag:
                    owned.append(entry.name)
    return sorted(owned)


def named_generations(paths: VariantPaths) -> set[str]:
    """Generations some marker of the dir names (any variant's, any format version): never retired."""
    named = set()
    with contextlib.suppress(OSError):
        for name in os.listdir(paths.cache_dir):
            if is_marker_name(name) and (generation := named_generation(paths.cache_dir / name)):
                named.add(generation)
    return named


# --------------------------------------------------------------------------------------------
# Making a generation (the builder's side)
# --------------------------------------------------------------------------------------------


class Generation:
    """A generation being written: its directory exists with its record and lease, and the builder
    holds the lease shared until :meth:`release`, so no retirement can take it meanwhile."""

    def __init__(self, paths: VariantPaths) -> None:
        self.paths = paths
        self.build = secrets.token_hex(3)
        self.name = f"{GENERATION_PREFIX}{time.time_ns():x}-{self.build}"
        self.path = paths.generation_dir(self.name)
        record = GenerationRecord(self.name, paths.tag, self.build, time.time_ns(), socket.gethostname(), os.getpid())
        pending = paths.pending_record(self.name)
        paths.cache_dir.mkdir(parents=True, exist_ok=True)
        create_whole(pending, record.as_json())  # the proof first, beside what it names
        self._lease_fd: int | None = None
        made = False
        try:
            self.path.mkdir()
            made = True
            self._lease_fd = os.open(self.path / READERS_LEASE, os.O_RDWR | os.O_CREAT, 0o644)
            with contextlib.suppress(OSError):  # a file system without flock: nothing can retire it either
                fcntl.flock(self._lease_fd, fcntl.LOCK_SH)
            os.rename(pending, self.path / GENERATION_RECORD)  # one step: from here it is a generation
            fsync_dir(self.path)
        except BaseException:
            self.release()
            if made:
                _delete_owned(paths, self.path)
            else:
                with contextlib.suppress(OSError):
                    pending.unlink()
            raise

    def release(self) -> None:
        if self._lease_fd is not None:
            os.close(self._lease_fd)
            self._lease_fd = None

    def remove(self) -> None:
        """Delete this build's own generation (it failed): it is ours by construction."""
        self.release()
        if retire(self.paths, self.name) is None:
            logger.warning(f"Could not remove the failed build's generation {self.path}; the next build or "
                           f"'tt-cache clean' removes it")


# --------------------------------------------------------------------------------------------
# Locks and leases
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LockState:
    """How the build lock is held: ``held`` (by this process, shared lock file or per-user
    stand-in), else ``busy`` (another process holds it) or not lockable at all; ``why`` says which."""

    held: bool
    why: str = ""
    busy: bool = False


def _lock(fd: int, cache_dir: Path) -> None:
    if not try_flock(fd, exclusive=True):
        holder = os.pread(fd, 256, 0).decode(errors="replace").strip() or "another process"
        logger.info(f"Waiting for the builder of {cache_dir} ({holder})")
        fcntl.flock(fd, fcntl.LOCK_EX)
    with contextlib.suppress(OSError):  # a read-only lock file cannot say who holds it
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"host {socket.gethostname()} pid {os.getpid()}\n".encode(), 0)


def _acquire(lock_path: Path, cache_dir: Path, blocking: bool, create: bool = True) -> tuple[int | None, LockState]:
    """Open and lock one lock file: (the descriptor holding it, or None when another holds it)."""
    fd = open_lock_file(lock_path, create=create)
    try:
        if blocking:
            _lock(fd, cache_dir)
        elif not try_flock(fd, exclusive=True):
            os.close(fd)
            return None, LockState(False, f"another process holds {lock_path}", busy=True)
    except BaseException:
        os.close(fd)
        raise
    return fd, LockState(True)


def _user_fallback(paths: VariantPaths, blocking: bool) -> tuple[int | None, LockState]:
    why = f"{paths.build_lock} cannot be locked by this user; using a per-user lock (another user may build at once)"
    logger.warning(f"{paths.cache_dir}: {why}")
    try:
        paths.user_build_lock.parent.mkdir(parents=True, exist_ok=True)
        fd, state = _acquire(paths.user_build_lock, paths.cache_dir, blocking)
    except OSError as error:
        return None, LockState(False, f"{why}, which cannot be taken either ({error.strerror or error})")
    return fd, LockState(True, why) if state.held else state


@contextlib.contextmanager
def build_lock(paths: VariantPaths, *, blocking: bool = True, create: bool = True) -> Iterator[LockState]:
    """Hold the cache dir's build lock for the block (see the module doc for the fallbacks).

    ``blocking=False`` yields ``LockState(False, busy=True)`` at once when another holder has it.
    ``create=False`` (tools that only tidy up) makes no directory and no lock file: where there
    is none, no builder can be at work, and the lock is reported held."""
    if not create and not paths.build_lock.exists():
        yield LockState(True, "no build lock file: no builder")
        return
    try:
        if create:
            paths.cache_dir.mkdir(parents=True, exist_ok=True)
        fd, state = _acquire(paths.build_lock, paths.cache_dir, blocking, create)
    except OSError as error:  # NFSv4 refuses an exclusive lock on a read-only descriptor (EBADF)
        if error.errno not in (errno.EBADF, errno.ENOLCK, errno.EINVAL):
            yield LockState(False, f"cannot open or lock {paths.build_lock} ({error.strerror or error})")
            return
        fd, state = _user_fallback(paths, blocking)
    try:
        yield state
    finally:
        if fd is not None:
            os.close(fd)


@contextlib.contextmanager
def reader_lease(paths: VariantPaths, generation: str | None) -> Iterator[bool]:
    """Hold a shared lease on a generation while its files are opened. Yields False at once when
    the generation is gone or being retired (the caller re-reads the marker)."""
    if not generation:  # files at the top level (seed API): nothing is ever retired there
        yield True
        return
    try:
        fd = os.open(paths.generation_dir(generation) / READERS_LEASE, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        yield False
        return
    except OSError:  # an unreadable lease (another user's cache): open the files unleased
        yield True
        return
    try:
        try:
            leased = try_flock(fd, exclusive=False)
        except OSError:  # a file system without flock: open the files unleased
            leased = True
        yield leased and paths.generation_dir(generation).is_dir()
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------
# Retirement
# --------------------------------------------------------------------------------------------


@dataclass
class Retirement:
    """What one retirement pass did: ``retired`` names and bytes freed, ``leased`` left for later."""

    retired: list[str]
    leased: list[str]
    freed_bytes: int = 0


def retire_unnamed(paths: VariantPaths) -> Retirement:
    """Retire every generation of this variant that no marker names and no reader holds, and the
    debris of killed retirements (call with the build lock held)."""
    keep = named_generations(paths)
    result = Retirement([], [])
    for name in owned_generations(paths):
        if name in keep:
            continue
        freed = retire(paths, name)
        if freed is None:
            result.leased.append(name)
        else:
            result.retired.append(name)
            result.freed_bytes += freed
    result.freed_bytes += _remove_retired_debris(paths)
    return result


def retire(paths: VariantPaths, name: str) -> int | None:
    """Rename one owned generation aside and delete it, unless a lease is held on it. Returns the
    bytes freed, or None when it is leased, not this variant's, or cannot be renamed."""
    directory = paths.generation_dir(name)
    record = read_record(directory)
    if record is None or record.variant != paths.tag:
        return None
    try:
        fd = open_lock_file(directory / READERS_LEASE, create=False)
    except FileNotFoundError:
        fd = None  # the lease file was removed: nobody can hold it
    except OSError:
        return None
    try:
        if fd is not None:
            try:
                if not try_flock(fd, exclusive=True):
                    return None  # a reader or its builder: the next holder of the build lock retires it
            except OSError:
                return None
        aside = paths.cache_dir / f"{RETIRED_PREFIX}{name}-{secrets.token_hex(3)}"
        try:
            os.rename(directory, aside)
        except OSError:
            return None
    finally:
        if fd is not None:
            os.close(fd)
    freed = tree_bytes(aside)
    _delete_owned(paths, aside)
    logger.info(f"Retired build generation {name} of {paths.cache_dir}")
    return freed


def retired_debris(paths: VariantPaths) -> list[Path]:
    """What killed makings and retirements of this variant left (see :func:`interrupted_work`)."""
    return [path for path, _ in interrupted_work(paths)]


def interrupted_work(paths: VariantPaths) -> list[tuple[Path, GenerationRecord]]:
    """What killed makings and retirements of this variant left, with the record that proves it
    ours: renamed-aside generations (their record inside names the generation they were), and
    whatever a record beside names (the directory, or the record alone when the directory is
    gone). Never a making whose builder lives (see the module doc)."""
    found: dict[Path, GenerationRecord] = {}
    with contextlib.suppress(OSError), os.scandir(paths.cache_dir) as entries:
        for entry in entries:
            if entry.name.startswith(PENDING_RECORD_PREFIX):
                if (pending := _pending_target(paths, Path(entry.path))) is not None:
                    target, record = pending
                    found[target if os.path.lexists(target) else Path(entry.path)] = record
            elif entry.name.startswith(RETIRED_PREFIX) and entry.is_dir(follow_symlinks=False):
                record = _parse_record(Path(entry.path))
                if record is not None and record.variant == paths.tag and _retired_from(entry.name, record.name):
                    found[Path(entry.path)] = record
    return sorted(found.items())


def recorded_tags(cache_dir: Path) -> set[str]:
    """Variant tags of every record in ``cache_dir``: its generations', renamed-aside generations'
    and the records beside them."""
    tags = set()
    with contextlib.suppress(OSError), os.scandir(cache_dir) as entries:
        for entry in entries:
            path = Path(entry.path)
            if is_generation_name(entry.name):
                record = read_record(path)
            elif entry.name.startswith(RETIRED_PREFIX) and entry.is_dir(follow_symlinks=False):
                record = _parse_record(path)
            elif entry.name.startswith(PENDING_RECORD_PREFIX) and entry.is_file(follow_symlinks=False):
                record = _parse_record_file(path)
            else:
                continue
            if record is not None:
                tags.add(record.variant)
    return tags


def _retired_from(directory: str, generation: str) -> bool:
    return directory.startswith(f"{RETIRED_PREFIX}{generation}-")


def _pending_target(paths: VariantPaths, pending: Path) -> tuple[Path, GenerationRecord] | None:
    """The directory a record beside names, if the record is this variant's and names it: one
    renamed aside from the generation (a retirement's), or the generation itself once its builder
    is gone (a making's)."""
    try:
        if not stat.S_ISREG(os.lstat(pending).st_mode):
            return None
        mtime = os.lstat(pending).st_mtime
    except OSError:
        return None
    record = _parse_record_file(pending)
    directory = pending.name[len(PENDING_RECORD_PREFIX):]
    if record is None or record.variant != paths.tag:
        return None
    if directory == record.name:
        if _builder_alive(record, mtime):
            return None
    elif not _retired_from(directory, record.name):
        return None
    return paths.cache_dir / directory, record


def _builder_alive(record: GenerationRecord, mtime: float) -> bool:
    """Whether the builder that wrote ``record`` beside its generation may still be making it (or
    undoing a making that failed)."""
    if record.host != socket.gethostname():
        return time.time() - mtime < OTHER_HOST_WRITER_S
    if record.pid <= 0 or record.pid == os.getpid():
        return False  # no process, or this one: not inside a making or a deletion while it asks
    try:
        os.kill(record.pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # alive, another user's
    return True


def _remove_retired_debris(paths: VariantPaths) -> int:
    """Finish what killed makings and retirements of this variant left."""
    freed = 0
    for path in retired_debris(paths):
        if _is_real_dir(path):
            freed += tree_bytes(path)
            _delete_owned(paths, path)
        else:
            with contextlib.suppress(OSError):
                path.unlink()  # a record beside a directory already gone
    return freed


def _delete_owned(paths: VariantPaths, directory: Path) -> bool:
    """Delete a directory this variant owns, its proof last: every entry but the record, then the
    record out beside it, the empty directory, the record. Never follows a symlink (Python's
    ``rmtree`` walks by file descriptors; a symlinked ``directory`` is refused). False, with a
    warning, when something stays (the record beside it then stays too, for the next holder)."""
    pending = paths.pending_record(directory.name)
    if _is_real_dir(directory):
        try:
            with os.scandir(directory) as entries:
                for entry in list(entries):
                    if entry.name == GENERATION_RECORD:
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path)
                    else:
                        os.unlink(entry.path)
            with contextlib.suppress(FileNotFoundError):  # a killed making: its record is beside it already
                os.rename(directory / GENERATION_RECORD, pending)
            os.rmdir(directory)
        except OSError as error:
            logger.warning(f"Could not delete all of {directory} ({error.strerror or error}); "
                           f"the next build, 'tt-cache gc' or 'tt-cache clean' tries again")
            return False
    with contextlib.suppress(FileNotFoundError):
        pending.unlink()
    return True


def lease_held(paths: VariantPaths, name: str) -> bool:
    """Whether a reader (or its builder) holds generation ``name``'s lease now: what :func:`retire`
    would find, asked without retiring (``clean --dry-run``). The exclusive probe is released at once."""
    try:
        fd = open_lock_file(paths.generation_dir(name) / READERS_LEASE, create=False)
    except FileNotFoundError:
        return False
    except OSError:
        return True  # retire could not take it either
    return held_by_others(fd)


def adopt_generation(paths: VariantPaths, name: str) -> bool:
    """Give a record to a generation an older format's marker of this variant names (those had
    no records), so this variant's next retirement may remove it. Only a real directory named
    like a generation and holding a lease file is adopted."""
    directory = paths.generation_dir(name)
    try:
        if not is_generation_name(name) or not _is_real_dir(directory):
            return False
        if not stat.S_ISREG(os.lstat(directory / READERS_LEASE).st_mode):
            return False
    except OSError:
        return False
    if read_record(directory) is not None:
        return True
    record = GenerationRecord(name, paths.tag, "adopted", time.time_ns(), socket.gethostname(), os.getpid())
    try:
        atomic_write_bytes(directory / GENERATION_RECORD, record.as_json())
    except OSError:
        return False
    return True
