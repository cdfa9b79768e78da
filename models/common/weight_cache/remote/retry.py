# SPDX-License-Identifier: Apache-2.0
"""How an object transfer outlives a store that stops answering for a while: one rule, here.

**The rule**: an object transfer (a pull's fetch of one object, a push's upload of one) that failed
because the store stopped answering (:class:`~.stores.StoreUnreachable`: a refused or reset
connection, a read that timed out or broke off, a 5xx) is tried again after a backoff of
:data:`FIRST_BACKOFF_S` doubling to at most :data:`MAX_BACKOFF_S`, until ``$TT_CACHE_REMOTE_RETRY_S``
seconds (30 unless set) were spent waiting. Each try resumes from what the earlier ones proved: a
pull keeps its part file, a hashed prefix, and asks for the rest; an upload starts again, the store
having published nothing of the broken one. Then the transfer fails with one line naming the store,
the object, the tries and the last error (the CLI's exit 2; a pull leaves nothing warm, and a later
pull resumes from the verified objects and prefixes).

Nothing else is retried: refused credentials, an unknown bucket, a missing or corrupt object do not
change by waiting; and the requests around the transfers (listings, manifests) are not, so a store
that does not answer at all is one line at once and a cold start builds without waiting for it.
botocore retries nothing itself (``total_max_attempts`` 1 in :mod:`.s3`): its standard mode would
retry every request three times with a backoff of its own inside each of these tries.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from loguru import logger

from models.common import envs
from models.common.weight_cache.remote.stores import StoreUnreachable

FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 8.0
T = TypeVar("T")


def backoff_delays(window_s: float) -> list[float]:
    """The waits before each try again: 0.5, 1, 2, 4, 8, 8, ... s, the last cut so that they add
    up to ``window_s`` (none for 0)."""
    delays: list[float] = []
    delay = FIRST_BACKOFF_S
    while sum(delays) < window_s:
        delays.append(min(delay, window_s - sum(delays)))
        delay = min(2 * delay, MAX_BACKOFF_S)
    return delays


def retrying(transfer: Callable[[], T], what: str) -> T:
    """``transfer()``, tried again by the rule (see the module doc) while the store does not answer."""
    delays = backoff_delays(envs.TT_CACHE_REMOTE_RETRY_S)
    for delay in delays:
        try:
            return transfer()
        except StoreUnreachable as error:
            logger.info(f"{what}: {error}; trying again in {delay:.1f} s")
            time.sleep(delay)
    try:
        return transfer()
    except StoreUnreachable as error:
        raise StoreUnreachable(f"{error}; gave up on {what} after {len(delays) + 1} tries in {sum(delays):.0f} s "
                               "(TT_CACHE_REMOTE_RETRY_S)") from None
