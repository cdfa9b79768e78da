# SPDX-License-Identifier: Apache-2.0
"""How a variant is used: when last (what ``tt-cache gc --older-than`` and LRU eviction go by),
and under which model ids (what a cache-only load is found by).

Every warm start counts, and every seed or check that finds the cache warm. The record is the
mtime of ``.last_used.<tag>`` in the variant dir (one ``utime``), created writable by every user
(its mtime is all it holds), so another user's warm start lands where the builder's ``gc`` reads
it. Where even that cannot be written (a read-only mount) it is a per-user file under
:data:`models.common.envs.TT_USER_STATE` instead, which the same user's ``gc`` reads too.

A build records the model id it was built from; the same weights loaded warm under another model
id (another folder, a copy) add that id to ``.model_ids.<tag>.json``, so a cache-only deploy under
either name finds the cache. Only a load whose checkpoint content id matched the marker's adds one.
No torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from pathlib import Path

from models.common.fileio import atomic_write_bytes
from models.common.weight_cache.layout import VariantPaths
from models.common.weight_cache.side_files import read_json_document

MAX_MODEL_IDS = 64
MAX_MODEL_IDS_BYTES = 1 << 20


def _touch(path: Path, *, create_parents: bool = False, shared: bool = False) -> bool:
    """Set ``path``'s mtime to now, creating it if missing; ``shared``: created writable by every
    user (0666, whatever the umask), so any user's warm start can ``utime`` it."""
    try:
        os.utime(path)
        if shared:
            _share(path)
        return True
    except FileNotFoundError:
        pass
    except OSError:
        return False
    try:
        if create_parents:
            path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
        try:
            if shared:
                os.fchmod(fd, 0o666)
        finally:
            os.close(fd)
        return True
    except OSError:
        return False


def _share(path: Path) -> None:
    """Make an own record made before records were shared writable by every user."""
    with contextlib.suppress(OSError):
        info = os.lstat(path)
        if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) != 0o666:
            os.chmod(path, 0o666)


def touch_last_used(paths: VariantPaths) -> None:
    """Record a use now: in the cache where it can be written, else in the user's state."""
    if not _touch(paths.last_used, shared=True):
        _touch(paths.user_last_used, create_parents=True)


def record_use_at(paths: VariantPaths, when: float) -> bool:
    """Record a use made elsewhere at ``when`` (a read-only runner's, handed over in its report:
    ``tt-cache gc --uses``), in the cache's record; it only ever moves forward."""
    previous = _regular_mtime(paths.last_used)
    if previous is not None and previous >= when:
        return True
    if not _touch(paths.last_used, shared=True):
        return False
    try:
        os.utime(paths.last_used, (when, when))
    except OSError:
        return False
    return True


def last_used(paths: VariantPaths) -> float | None:
    """The latest recorded use (the cache's record, this user's record), else the marker's mtime."""
    times = [when for path in (paths.last_used, paths.user_last_used) if (when := _regular_mtime(path)) is not None]
    return max(times) if times else _regular_mtime(paths.marker)


def _regular_mtime(path: Path) -> float | None:
    """The mtime of a regular file (a FIFO or device in a record's place records nothing)."""
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_mtime if stat.S_ISREG(info.st_mode) else None


def forget_use(paths: VariantPaths) -> None:
    """Drop the cache's use record of an evicted variant (a user's own records age out with it)."""
    with contextlib.suppress(OSError):
        paths.last_used.unlink()


def model_ids(paths: VariantPaths) -> list[str]:
    """The other model ids this variant's build was loaded warm as (see the module doc)."""
    body = read_json_document(paths.model_ids, MAX_MODEL_IDS_BYTES, 2)
    return [value for value in body if isinstance(value, str)][:MAX_MODEL_IDS] if isinstance(body, list) else []


def answers_to(paths: VariantPaths, recorded: str | None, model_id: str) -> bool:
    """The one cache-only matching rule: a variant whose marker records ``recorded`` serves
    ``model_id`` when that is the id it was built from or one it was loaded warm as."""
    return recorded is not None and (recorded == model_id or model_id in model_ids(paths))


def add_model_id(paths: VariantPaths, model_id: str) -> None:
    """Remember ``model_id`` as another name of this build (best effort: read-only caches skip it)."""
    known = model_ids(paths)
    if model_id in known:
        return
    with contextlib.suppress(OSError):
        atomic_write_bytes(paths.model_ids, json.dumps([model_id, *known][:MAX_MODEL_IDS]).encode(), durable=False)
