# SPDX-License-Identifier: Apache-2.0
"""TEMPORARY stand-in on branch ci until the lead's torch-free marker.py lands on main
(merge takes main's version; nothing here is meant to be merged)."""

from __future__ import annotations

import os
from pathlib import Path

from models.common.weight_cache import (  # noqa: F401
    WEIGHT_CACHE_MARKER,
    CacheStatus,
    MarkerFormatError,
    WeightCacheError,
    WeightCacheMarker,
    cache_bytes,
    invalidate_weight_cache,
    marker_path,
    parse_marker,
    read_marker,
    verify_weight_cache,
    weight_cache_status,
)


def last_used(cache_dir, build_variant=None) -> float | None:
    try:
        return os.stat(marker_path(cache_dir, build_variant)).st_mtime
    except OSError:
        return None
