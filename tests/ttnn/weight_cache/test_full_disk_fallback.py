# SPDX-License-Identifier: Apache-2.0
"""A cold load whose cache root fills up builds in memory, and keeps nothing on the full disk: no
file, and no mapping of a deleted one (a large weight written block by block is handed back mapped
from its file; if the fallback wrote those into a generation it then removed, their space would stay
taken, seen by no ``ls``, ``gc`` or ``clean``, for as long as the model lives)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from models.common.weight_cache.layout import GENERATION_PREFIX, RETIRED_PREFIX, TENSORBIN_SUFFIX
from models.testing import REPO_ROOT
from models.testing.model_shapes import make_shaped_checkpoint
from models.testing.mounts import tmpfs

MiB = 1 << 20
GENERATION = re.compile(rf"({re.escape(RETIRED_PREFIX)})?{GENERATION_PREFIX}[0-9a-f]+-[0-9a-f]+.*")  # live or retired


def _used_bytes(path: Path) -> int:
    """What ``df`` reports as used on the file system of ``path``."""
    stats = os.statvfs(path)
    return (stats.f_blocks - stats.f_bfree) * stats.f_frsize


def _deleted_mappings(pid: int, under: Path) -> list[str]:
    lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return [line for line in lines if str(under) in line and "(deleted)" in line]


@pytest.fixture(scope="module")
def llama_1k(tmp_path_factory) -> Path:
    """One layer of the ``llama-1k`` shape: embedding and LM head of 64 MiB each (written block by
    block), 20 MiB of layer; 148 MiB of bf16 cache."""
    return make_shaped_checkpoint(tmp_path_factory.mktemp("llama-1k") / "llama-1k", "llama-1k", 1, shard_bytes=None)


def test_a_load_that_fills_the_disk_keeps_nothing_on_it_while_the_model_lives(llama_1k, tmp_path):
    with tmpfs(tmp_path / "small", "100m") as full_root:
        before = _used_bytes(full_root)
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        child = subprocess.Popen([sys.executable, "-m", "models.testing.full_disk_child", str(llama_1k),
                                  str(full_root), str(tmp_path / "roomy")],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=REPO_ROOT)
        try:
            output = []  # ttnn logs to stdout too
            while not (output and output[-1].startswith("ready ")):
                line = child.stdout.readline()
                assert line, "the child ended before it was ready:\n" + "".join(output[-20:])
                output.append(line)
            report = json.loads(output[-1].removeprefix("ready "))
            used = _used_bytes(full_root)
            deleted = _deleted_mappings(child.pid, full_root)
        finally:
            child.stdin.close()
            child.wait(timeout=60)
        assert not report["fallback_cached"] and report["normal_cached"], report
        assert report["weights"] > 0 and report["differ"] == [], report  # the fallback's tensors are the build's
        assert deleted == [], deleted
        assert used - before < 1 * MiB, f"{(used - before) / MiB:.1f} MiB of the full disk still in use"
        # the build lock and the checkpoint's stamps stay (bookkeeping of a few bytes); no weight, no generation
        left = [p.relative_to(full_root) for p in full_root.rglob("*")]
        assert not [p for p in left if TENSORBIN_SUFFIX in p.name or GENERATION.fullmatch(p.name)], left
