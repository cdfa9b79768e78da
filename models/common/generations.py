# SPDX-License-Identifier: Apache-2.0
"""Build generations of one cache dir: one builder at a time, readers never blocked or broken.

Every cold build writes into a fresh ``g<time>-<token>/`` directory and publishes its marker
last, so readers of the previous marker keep loading the previous generation's files until the
switch, and a killed build leaves only an unnamed generation behind. The rules, in one place:

* **Build lock** ``<cache_dir>/.build.lock``: an exclusive ``flock`` held by the builder from
  the first check to the marker; the holder writes its host and pid into it, so a waiting
  builder can say whom it waits for. Readers never take it.
* **Reader lease** ``<generation>/.readers``: a reader holds a shared ``flock`` on it while it
  opens the generation's files (``ttnn.load_tensor`` maps them; a mapping outlives the unlink).
  It never waits: a lease refused means the generation is being retired, and the reader reads
  the (by then newer) marker again.
* **Retirement**, by the builder after publishing: a generation that no marker names and whose
  lease can be taken exclusively is renamed aside (atomically, out of every reader's path) and
  then deleted.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from loguru import logger

from models.common.fileio import try_flock
from models.common.marker import BUILD_LOCK, GENERATION_PREFIX, iter_markers

READERS_LEASE = ".readers"
RETIRED_PREFIX = ".retired-"


def new_generation(cache_dir: Path) -> str:
    """Create a fresh, empty generation directory (with its reader lease) and return its name."""
    name = f"{GENERATION_PREFIX}{time.time_ns():x}-{secrets.token_hex(3)}"
    (cache_dir / name).mkdir(parents=True)
    (cache_dir / name / READERS_LEASE).touch()
    return name


def is_generation(name: str) -> bool:
    return name.startswith(GENERATION_PREFIX) and "-" in name and not name.startswith(".")


@contextlib.contextmanager
def build_lock(cache_dir: Path) -> Iterator[bool]:
    """Hold the cache dir's build lock; yields False (no lock) when the dir cannot be written,
    where no build can publish anything for another builder to conflict with."""
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(cache_dir / BUILD_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        logger.warning(f"Cannot take the build lock of {cache_dir} ({error.strerror}); building unlocked")
        yield False
        return
    try:
        if not try_flock(fd, exclusive=True):
            holder = os.pread(fd, 256, 0).decode(errors="replace").strip() or "another process"
            logger.info(f"Waiting for the builder of {cache_dir} ({holder})")
            fcntl.flock(fd, fcntl.LOCK_EX)
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"host {socket.gethostname()} pid {os.getpid()}\n".encode(), 0)
        yield True
    finally:
        os.close(fd)


@contextlib.contextmanager
def reader_lease(cache_dir: Path, generation: str | None) -> Iterator[bool]:
    """Hold a shared lease on a generation while its files are opened. Yields False at once when
    the generation is gone or being retired (the caller re-reads the marker)."""
    if not generation:  # files at the top level (seed API): nothing is ever retired there
        yield True
        return
    try:
        fd = os.open(cache_dir / generation / READERS_LEASE, os.O_RDONLY)
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
        yield leased and (cache_dir / generation).is_dir()
    finally:
        os.close(fd)


def named_generations(cache_dir: Path) -> set[str]:
    """Generations some marker of the dir still names (an unreadable marker names nothing, but
    then its generation is kept: it might be the one a reader is using)."""
    named = set()
    for _, marker, problem in iter_markers(cache_dir):
        if marker is not None and marker.generation:
            named.add(marker.generation)
        elif problem:
            return {name for name in _listdir(cache_dir) if is_generation(name)}
    return named


def retire_generations(cache_dir: Path) -> list[str]:
    """Delete generations no marker names and no reader holds (call under the build lock)."""
    keep = named_generations(cache_dir)
    retired = []
    for name in sorted(_listdir(cache_dir)):
        if name.startswith(RETIRED_PREFIX):
            shutil.rmtree(cache_dir / name, ignore_errors=True)  # debris of a killed retirement
        elif is_generation(name) and name not in keep and _retire(cache_dir, name):
            retired.append(name)
    return retired


def _retire(cache_dir: Path, name: str) -> bool:
    lease = cache_dir / name / READERS_LEASE
    try:
        fd = os.open(lease, os.O_RDONLY)
    except FileNotFoundError:
        fd = None  # a build killed before its lease existed
    except OSError:
        return False
    try:
        if fd is not None:
            try:
                if not try_flock(fd, exclusive=True):
                    return False  # a reader is opening its files: retire it next time
            except OSError:
                return False
        aside = cache_dir / f"{RETIRED_PREFIX}{name}-{secrets.token_hex(3)}"
        try:
            os.rename(cache_dir / name, aside)
        except OSError:
            return False
    finally:
        if fd is not None:
            os.close(fd)
    shutil.rmtree(aside, ignore_errors=True)
    logger.info(f"Retired build generation {name} of {cache_dir}")
    return True


def _listdir(path: Path) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []
