# SPDX-License-Identifier: Apache-2.0
"""What a process's loads moved through the shared store, and the push that follows a cold build.

The rule kept here: a cold build that committed its cache pushes the new variant to
``$TT_CACHE_REMOTE`` when ``$TT_CACHE_REMOTE_PUSH`` is on, and a push that fails is one warning,
never the build's failure (the local cache is warm either way). Each pull a cold start tried and
each push is recorded in the :class:`StoreLedger` of the ``with recording()`` block around the
load, for a caller that reports them (the seed worker: bytes per variant, hit or miss); outside
such a block nothing is kept.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from loguru import logger

from models.common import envs
from models.common.weight_cache.layout import VariantPaths
from models.common.weight_cache.marker import WeightCacheError, read_marker_file
from models.common.weight_cache.remote.push import PushResult, push_variant
from models.common.weight_cache.remote.stores import RemoteStoreError
from models.common.weight_cache.remote.urls import open_store

HIT, MISS, UNAVAILABLE = "hit", "miss", "unavailable"  # what a cold start's ask of the store found


@dataclass
class StoreLedger:
    """The store traffic of the loads inside one ``recording()`` block."""

    asks: list[str] = field(default_factory=list)  # HIT, MISS or UNAVAILABLE, per cold start
    bytes_pulled: int = 0
    bytes_pushed: int = 0
    pushes: int = 0
    push_errors: list[str] = field(default_factory=list)

    @property
    def store(self) -> str:
        """The last ask's answer ("": the store was not asked)."""
        return self.asks[-1] if self.asks else ""

    def as_json(self) -> dict[str, Any]:
        return {"store": self.store, "bytes_pulled": self.bytes_pulled, "bytes_pushed": self.bytes_pushed,
                "pushes": self.pushes, "push_error": "; ".join(self.push_errors)}


_LEDGER: ContextVar[StoreLedger | None] = ContextVar("store_ledger", default=None)


@contextlib.contextmanager
def recording() -> Iterator[StoreLedger]:
    """Record the store traffic of the loads run inside the block (in this thread's context)."""
    ledger = StoreLedger()
    token = _LEDGER.set(ledger)
    try:
        yield ledger
    finally:
        _LEDGER.reset(token)


def record_ask(answer: str, bytes_pulled: int = 0) -> None:
    """A cold start asked the store (:mod:`.cold_start`)."""
    ledger = _LEDGER.get()
    if ledger is not None:
        ledger.asks.append(answer)
        ledger.bytes_pulled += bytes_pulled


def push_after_build(paths: VariantPaths, model_name: str) -> PushResult | None:
    """Push the variant a cold build just committed at ``paths`` (see the module doc); the result,
    or None when pushing is off or it failed (one warning line)."""
    url = envs.TT_CACHE_REMOTE
    if not url or not envs.TT_CACHE_REMOTE_PUSH:
        return None
    ledger = _LEDGER.get()
    try:
        result = push_variant(paths, read_marker_file(paths.marker), open_store(url, create=True))
    except Exception as error:  # noqa: BLE001 - the build is done and warm; sharing it is a bonus
        known = isinstance(error, (RemoteStoreError, WeightCacheError))
        why = str(error) if known else f"{type(error).__name__}: {error}"
        logger.warning(f"{model_name}: built and warm here, but pushing it to {url} failed ({why})")
        if ledger is not None:
            ledger.push_errors.append(why)
        return None
    logger.info(f"{model_name}: {result.summary()}")
    if ledger is not None:
        ledger.pushes += 1
        ledger.bytes_pushed += result.bytes_sent
    return result
