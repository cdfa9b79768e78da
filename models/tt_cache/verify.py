# SPDX-License-Identifier: Apache-2.0
"""Deep verification of one variant for ``tt-cache verify``: re-hash, time it, never raise."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.common.weight_cache.gate import verify_weight_cache
from models.tt_cache.scan import VariantInfo


@dataclass(frozen=True)
class VerifyResult:
    marker_file: Path
    problems: tuple[str, ...]
    bytes_read: int
    seconds: float

    @property
    def intact(self) -> bool:
        return not self.problems

    def as_json(self) -> dict[str, Any]:
        return {"marker": str(self.marker_file), "intact": self.intact, "problems": list(self.problems),
                "bytes": self.bytes_read, "seconds": round(self.seconds, 4),
                "mib_per_s": round(self.bytes_read / 2**20 / self.seconds, 1) if self.seconds > 0 else None}


def verify_variant(variant: VariantInfo) -> VerifyResult:
    """Re-hash every file the variant's marker records; an invalid marker or unreadable file is a problem."""
    start = time.perf_counter()
    if variant.marker is None:
        return VerifyResult(variant.marker_file, (variant.reason,), 0, 0.0)
    problems = tuple(verify_weight_cache(variant.cache_dir, variant.marker.build_variant))
    if not problems and not variant.warm:  # files match, but the gate refuses the marker itself
        problems = (variant.reason,)
    return VerifyResult(variant.marker_file, problems, variant.size_bytes, time.perf_counter() - start)
