# SPDX-License-Identifier: Apache-2.0
"""``tt-cache clean`` after a real ``tt-cache build`` killed mid-build: what a dry run lists is
what the real run removes, file for file and byte for byte, and the dry run removes nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from models.common.units import format_size
from models.testing.tiny_models import make_checkpoint
from models.testing.tt_cache import REPO_ROOT, cli_env, json_out, tt_cache


def _tree(root: Path) -> dict[Path, int]:
    """Every regular file under ``root`` and its size."""
    return {path: path.lstat().st_size for path in root.rglob("*") if path.is_file() and not path.is_symlink()}


def _killed_build(checkpoint: Path, cache_root: Path) -> Path:
    """SIGKILL a real ``tt-cache build`` once its generation holds some tensors; its cache dir."""
    for attempt in range(4):
        command = [sys.executable, "-m", "models.tt_cache.cli", "build", str(checkpoint), "--precision", "bfloat16"]
        build = subprocess.Popen(command + (["--force"] if attempt else []), cwd=REPO_ROOT, env=cli_env(cache_root),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        before = {p for p in cache_root.rglob("g*") if p.is_dir()} if cache_root.exists() else set()
        while build.poll() is None:
            fresh = {p for p in cache_root.rglob("g*") if p.is_dir()} - before if cache_root.exists() else set()
            if fresh and len(list(next(iter(fresh)).rglob("*.tensorbin"))) >= 5:
                build.send_signal(signal.SIGKILL)
                build.wait()
                (generation,) = fresh
                return generation.parent
            time.sleep(0.003)
    pytest.fail("every build finished before it could be killed")


def test_clean_dry_run_lists_then_clean_removes_a_killed_builds_files_and_bytes(tmp_path):
    checkpoint = make_checkpoint("qwen3", tmp_path / "tiny-qwen3", num_hidden_layers=8)
    cache_root = tmp_path / "cache"
    cache_dir = _killed_build(checkpoint, cache_root)
    user_file = cache_dir / "notes.txt"
    user_file.write_text("the user's own")
    before = _tree(cache_root)

    dry = tt_cache("clean", str(cache_root), "--dry-run", "--json", env=cli_env())
    assert dry.returncode == 0, dry.stderr[-2000:]
    planned = json_out(dry)
    assert _tree(cache_root) == before, "a dry run removes nothing"
    assert planned["dry_run"] and planned["removed_files"] > 5 and planned["removed_bytes"] > 0
    builds = [r for r in planned["removals"] if r["kind"] == "leftover build"]
    assert len(builds) == 1, planned
    generation = Path(builds[0]["path"])
    inside = {p: size for p, size in before.items() if generation in p.parents}
    assert builds[0]["files"] == len(inside) and builds[0]["size_bytes"] == sum(inside.values())
    assert planned["removed_files"] == sum(r["files"] for r in planned["removals"])
    assert planned["removed_bytes"] == sum(r["size_bytes"] for r in planned["removals"])

    human = tt_cache("clean", str(cache_root), "--dry-run", env=cli_env())
    assert f"would remove {planned['removed_files']} file(s), {format_size(planned['removed_bytes'])}," in human.stdout
    assert _tree(cache_root) == before

    done = tt_cache("clean", str(cache_root), "--json", env=cli_env())
    assert done.returncode == 0, done.stderr[-2000:]
    report = json_out(done)
    after = _tree(cache_root)
    gone = {p: size for p, size in before.items() if p not in after}
    assert not report["dry_run"] and report["removals"] == planned["removals"]
    assert report["removed_files"] == planned["removed_files"] == len(gone)
    assert report["removed_bytes"] == planned["removed_bytes"] == sum(gone.values())
    assert not generation.exists() and user_file.read_text() == "the user's own"

    again = tt_cache("clean", str(cache_root), env=cli_env())
    assert again.returncode == 0 and "removed 0 file(s), 0," in again.stdout
    assert os.path.isdir(cache_dir)
