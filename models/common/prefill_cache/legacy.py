# SPDX-License-Identifier: Apache-2.0
"""Legacy (v1, source-bound) objects: found by the authority they would have today.

v1 objects were named by a hash that included the source tree, so a lookup by today's name
misses them. The sidecar probes a v1 object directly when the caller still knows its source hash;
otherwise this per-root index maps each well-formed v1 manifest to its normalized (v2) authority.
Torch-free.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Final

from loguru import logger

from models.common.prefill_cache.layout import (
    SIDECAR_SCHEMAS,
    SOURCE_DIAGNOSTIC_FIELDS,
    FrozenBackboneCacheError,
    is_sha256_hex,
    json_sha256,
    normalized_authority,
    read_json_object,
    str_keyed,
)

_LEGACY_INDEX_ROOTS: Final = 16


def _legacy_entry(manifest_path: Path) -> str | None:
    """The normalized (v2) authority sha of a well-formed legacy manifest, else None."""
    object_sha256 = manifest_path.parent.name
    if not is_sha256_hex(object_sha256) or manifest_path.parent.parent.name != object_sha256[:2]:
        return None
    try:
        manifest, _ = read_json_object(manifest_path, "legacy manifest")
    except FrozenBackboneCacheError:
        return None
    stored = str_keyed(manifest.get("authority"))
    if (
        manifest.get("schema") not in SIDECAR_SCHEMAS
        or manifest.get("authoritySha256") != object_sha256
        or stored is None
        or SOURCE_DIAGNOSTIC_FIELDS.isdisjoint(stored)
        or json_sha256(stored) != object_sha256
    ):
        return None
    return json_sha256(normalized_authority(stored))


class _LegacyIndex:
    """Per resolved root: normalized authority sha -> legacy manifest paths.

    Built on the first miss of a process under a root, by reading every manifest once (legacy
    objects are never written any more, so it never goes stale); bounded to a few roots."""

    def __init__(self, roots: int) -> None:
        self.roots = roots
        self._lock = threading.Lock()
        self._indexes: OrderedDict[Path, dict[str, tuple[Path, ...]]] = OrderedDict()

    def get(self, cache_root: Path) -> dict[str, tuple[Path, ...]]:
        with self._lock:
            index = self._indexes.get(cache_root)
            if index is None:
                index = self._build(cache_root)
                self._indexes[cache_root] = index
            self._indexes.move_to_end(cache_root)
            while len(self._indexes) > self.roots:
                self._indexes.popitem(last=False)
            return index

    @staticmethod
    def _build(cache_root: Path) -> dict[str, tuple[Path, ...]]:
        found: dict[str, list[Path]] = {}
        for manifest_path in sorted((cache_root / "objects").glob("*/*/manifest.json")):
            normalized_sha256 = _legacy_entry(manifest_path)
            if normalized_sha256 is not None:
                found.setdefault(normalized_sha256, []).append(manifest_path)
        logger.debug("legacy prefill index of {}: {} authorities", cache_root, len(found))
        return {key: tuple(value) for key, value in found.items()}

    def reset_after_fork(self) -> None:
        self._lock = threading.Lock()


LEGACY_INDEX = _LegacyIndex(_LEGACY_INDEX_ROOTS)
os.register_at_fork(after_in_child=LEGACY_INDEX.reset_after_fork)
