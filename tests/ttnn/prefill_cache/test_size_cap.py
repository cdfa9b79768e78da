# SPDX-License-Identifier: Apache-2.0
"""A prefill cache root under a size cap: least recently used objects go first, objects a live
writer or producer holds stay, a dry run removes nothing; ``summarize`` (what ``tt-cache ls``
shows) reports bytes, bytes per sample and the cap. Through the prefill cache API and
``tt-cache prefill ls|gc``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from models.common.prefill_cache import FrozenBackboneFeatureSidecar
from models.common.prefill_cache.claims import ProducerClaim
from models.common.prefill_cache.maintenance import (
    MAX_SIZE_ENV,
    gc,
    list_objects,
    summarize,
)
from models.common.prefill_cache.usage import USES
from models.common.units import parse_size
from models.testing import REPO_ROOT
from models.testing.prefill_factories import row, same_bytes
from models.tt_cache.cli import main as tt_cache

pytestmark = pytest.mark.usefixtures("cli_in_process")

COUNT = 8


@pytest.fixture
def aged(tmp_path) -> tuple[Path, list]:
    """8 objects; object i was last used i hours after object 0 (0 is the least recently used)."""
    rows = [row(tmp_path, index, hidden=64, positions=4) for index in range(COUNT)]
    FrozenBackboneFeatureSidecar.store_batch_boundary(tuple(rows))
    start = time.time() - 86_400
    for index, (sidecar, _) in enumerate(rows):
        used = start + index * 3600
        os.utime(sidecar.paths.manifest, (used, used))
        os.utime(sidecar.paths.root, (used, used))
    USES.forget()
    return tmp_path, rows


def _object_bytes(sidecar) -> int:
    return sum(p.stat().st_size for p in sidecar.paths.root.iterdir())


def _present(rows) -> list[int]:
    return [index for index, (sidecar, _) in enumerate(rows) if sidecar.lookup_boundary() is not None]


def test_gc_evicts_least_recently_used_first_down_to_the_cap(aged):
    root, rows = aged
    each = _object_bytes(rows[0][0])
    assert all(_object_bytes(sidecar) == each for sidecar, _ in rows)
    dry = gc(root, max_bytes=5 * each, dry_run=True)
    assert _present(rows) == list(range(COUNT))  # a dry run removes nothing ...
    result = gc(root, max_bytes=5 * each)
    assert (dry.evicted_objects, dry.removed_bytes, dry.bytes_after) == (3, 3 * each, 5 * each)  # ... and says it all
    assert result.evicted_objects == 3 and result.bytes_before == COUNT * each and result.bytes_after == 5 * each
    assert _present(rows) == [3, 4, 5, 6, 7]
    for sidecar, features in rows[3:]:
        assert same_bytes(sidecar.lookup_boundary(), features)
    assert sorted(p.name for p in rows[0][0].paths.root.iterdir()) == [".writer.lock"]  # the lock stays
    assert gc(root, max_bytes=5 * each).evicted_objects == 0  # it fits now
    assert gc(root, max_bytes=0).evicted_objects == 5 and _present(rows) == []


def test_a_used_object_is_recent_and_stays(aged):
    root, rows = aged
    rows[0][0].mark_used_boundary()  # the oldest, just used (a producer's hit marks it)
    rows[0][0].mark_used_boundary()  # (at most one touch a minute: still a single utime)
    each = _object_bytes(rows[0][0])
    gc(root, max_bytes=5 * each)
    assert _present(rows) == [0, 4, 5, 6, 7]


def test_live_writers_and_producers_are_never_evicted(aged):
    root, rows = aged
    each = _object_bytes(rows[0][0])
    ready_read, ready_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a producer claiming object 0 and a writer holding object 1 (a real other process)
        try:
            claim = ProducerClaim(rows[0][0].paths.root)
            assert claim.take()
            fd = os.open(rows[1][0].paths.lock, os.O_RDWR)
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(ready_write, b"x")
            time.sleep(60)
        finally:
            os._exit(0)
    try:
        os.read(ready_read, 1)
        result = gc(root, max_bytes=5 * each)
        assert result.skipped_live == 2 and result.evicted_objects == 3
        assert _present(rows) == [0, 1, 5, 6, 7]
        infos = {info.path: info for info in list_objects(root)}
        assert infos[str(rows[0][0].paths.root)].state == "complete"  # published objects stay complete
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert gc(root, max_bytes=3 * each).evicted_objects == 2  # the holder died: its locks are free
    assert _present(rows) == [0, 6, 7]  # the claim's new lock file made object 0 the most recently used


def test_summarize_reports_bytes_per_sample_and_the_cap(aged, monkeypatch):
    root, rows = aged
    sidecar, features = row(root, 99, hidden=64, positions=4, dtype="float32")
    sidecar.store_boundary(features)
    monkeypatch.delenv(MAX_SIZE_ENV, raising=False)
    summary = summarize(root)
    each16, each32 = _object_bytes(rows[0][0]), _object_bytes(sidecar)
    assert summary.objects == COUNT + 1 and summary.bytes == COUNT * each16 + each32
    assert summary.bytes_per_sample == pytest.approx(summary.bytes / (COUNT + 1))
    assert summary.bytes_per_sample_by_dtype == {"bfloat16": each16, "float32": each32}
    assert summary.max_bytes is None and not summary.over_cap
    monkeypatch.setenv(MAX_SIZE_ENV, "2K")
    assert summarize(root).max_bytes == 2048 and summarize(root).over_cap
    assert summarize(root, max_bytes=1 << 30).over_cap is False  # an explicit cap wins


def test_sizes_parse_like_du():
    assert [parse_size(text) for text in ("4096", "2K", "1.5M", "20G", "500MiB", "1t", " 3 GB ")] == [
        4096, 2048, 3 << 19, 20 << 30, 500 << 20, 1 << 40, 3 << 30]
    for bad in ("", "-1G", "G", "1Q", "one"):
        with pytest.raises(ValueError):
            parse_size(bad)


def _cli(capsys, *argv: str) -> tuple[int, dict]:
    capsys.readouterr()
    code = tt_cache(list(argv))
    return code, json.loads(capsys.readouterr().out)


def test_tt_cache_prefill_ls_and_gc_show_and_apply_the_cap(aged, capsys, monkeypatch):
    root, rows = aged
    each = _object_bytes(rows[0][0])
    monkeypatch.setenv(MAX_SIZE_ENV, str(6 * each))
    code, listing = _cli(capsys, "prefill", "ls", str(root), "--json")
    assert code == 0 and listing["schema_version"] == 1
    assert (listing["objects"], listing["bytes"], listing["max_bytes"], listing["over_cap"]) == (
        COUNT, COUNT * each, 6 * each, True)
    assert listing["bytes_per_sample"] == each and len(listing["entries"]) == COUNT
    code, dry = _cli(capsys, "prefill", "gc", str(root), "--max-size", str(5 * each), "--dry-run", "--json")
    assert code == 0 and dry["dry_run"] and dry["evicted_objects"] == 3 and _present(rows) == list(range(COUNT))
    code, done = _cli(capsys, "prefill", "gc", str(root), "--json")  # the env var's cap
    assert code == 0 and done["evicted_objects"] == 2 and done["max_bytes"] == 6 * each
    assert _present(rows) == [2, 3, 4, 5, 6, 7]
    code = tt_cache(["prefill", "gc", str(root), "--max-size", str(3 * each)])
    assert code == 0 and "3 least recently used beyond" in capsys.readouterr().out
    for argv in (["prefill", "gc", str(root), "--max-size", "big", "--json"],
                 ["prefill", "ls", str(root / "missing"), "--json"],
                 ["prefill", "gc", str(root), "--older-than-days", "-1", "--json"]):
        code, error = _cli(capsys, *argv)
        assert code == 2 and error["schema_version"] == 1 and error["error"] and error["exit_code"] == 2, argv


def test_tt_cache_prefill_gc_as_a_process(aged):
    root, rows = aged
    each = _object_bytes(rows[0][0])
    done = subprocess.run([sys.executable, "-m", "models.tt_cache.cli", "prefill", "gc", str(root), "--max-size",
                           f"{4 * each}", "--json"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["evicted_objects"] == 4 and _present(rows) == [4, 5, 6, 7]
    usage = subprocess.run([sys.executable, "-m", "models.tt_cache.cli", "prefill", "gc", "--json"], cwd=REPO_ROOT,
                           capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))
    assert usage.returncode == 2 and "Traceback" not in usage.stderr and json.loads(usage.stdout)["exit_code"] == 2
