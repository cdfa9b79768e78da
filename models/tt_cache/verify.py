# SPDX-License-Identifier: Apache-2.0
"""Deep verification for ``tt-cache verify``: re-hash, time it, never raise.

Every recorded file of every variant under the root goes through one pool of hashing threads,
one per core, the largest files first (BLAKE3 releases the GIL): one file at a time left the
cores and the disk's queue idle, and a root of many small caches verified one variant after
another paid each variant's slowest file in turn.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.common.fileio import HASH_THREADS, map_largest_first
from models.common.weight_cache.gate import file_problem
from models.common.weight_cache.marker import FileRecord
from models.tt_cache.scan import VariantInfo


@dataclass(frozen=True)
class VerifyResult:
    marker_file: Path
    problems: tuple[str, ...]
    bytes_read: int
    seconds: float  # from the start of the verification to this variant's last file

    @property
    def intact(self) -> bool:
        return not self.problems

    def as_json(self) -> dict[str, Any]:
        return {"marker": str(self.marker_file), "intact": self.intact, "problems": list(self.problems),
                "bytes": self.bytes_read, "seconds": round(self.seconds, 4),
                "mib_per_s": round(self.bytes_read / 2**20 / self.seconds, 1) if self.seconds > 0 else None}


def verify_variants(variants: Sequence[VariantInfo], threads: int = HASH_THREADS) -> list[VerifyResult]:
    """Re-hash every file the variants' markers record, ``threads`` files at once; a variant whose
    marker is invalid, or whose files are intact but which the gate refuses, has that as its problem."""
    start = time.perf_counter()
    jobs = [(index, record) for index, variant in enumerate(variants) if variant.marker is not None
            for record in variant.marker.all_files()]

    def check(job: tuple[int, FileRecord]) -> tuple[str | None, float]:
        index, record = job
        return file_problem(variants[index].cache_dir, record), time.perf_counter() - start

    outcomes = map_largest_first(check, jobs, [record.bytes for _, record in jobs], threads)
    checked: list[list[tuple[str | None, float]]] = [[] for _ in variants]
    for (index, _), outcome in zip(jobs, outcomes):
        checked[index].append(outcome)  # in the marker's order, whatever order they were hashed in
    results = []
    for variant, outcomes_of_variant in zip(variants, checked):
        if variant.marker is None:
            results.append(VerifyResult(variant.marker_file, (variant.reason,), 0, 0.0))
            continue
        problems = tuple(problem for problem, _ in outcomes_of_variant if problem)
        if not problems and not variant.warm:  # files match, but the gate refuses the marker itself
            problems = (variant.reason,)
        seconds = max((finished for _, finished in outcomes_of_variant), default=time.perf_counter() - start)
        results.append(VerifyResult(variant.marker_file, problems, variant.size_bytes, seconds))
    return results


def verify_variant(variant: VariantInfo) -> VerifyResult:
    """Re-hash every file one variant's marker records (see :func:`verify_variants`)."""
    return verify_variants([variant])[0]
