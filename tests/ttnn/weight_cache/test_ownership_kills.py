# SPDX-License-Identifier: Apache-2.0
"""Ownership survives a kill at any point: a process that does nothing but make generations and
delete them (every moment of its life is inside a making or a retirement) is SIGKILLed at random
times; ``tt-cache ls`` counts what it left, and one build, ``gc`` or ``clean`` leaves nothing."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from models.common.fileio import is_temp_path
from models.common.weight_cache import read_marker
from models.common.weight_cache.layout import (
    PENDING_RECORD_PREFIX,
    RETIRED_PREFIX,
    VariantPaths,
    is_generation_name,
)
from models.llama import LlamaLoader
from models.testing.resynthesis_world import tmpfs
from models.testing.tiny_models import make_checkpoint
from models.testing.tt_cache import REPO_ROOT, cli_env, json_out, tt_cache

CHURN = """
import sys
from pathlib import Path
from models.common.weight_cache.generations import Generation, build_lock
from models.common.weight_cache import read_marker
from models.common.weight_cache.layout import VariantPaths
paths = VariantPaths(Path(sys.argv[1]), tag=sys.argv[2])
with build_lock(paths):
    print("ready", flush=True)
    while True:
        generation = Generation(paths)
        for index in range(40):
            (generation.path / f"w{index}.tensorbin").write_bytes(b"x" * 4096)
        generation.remove()
"""

FINISHERS = ("build", "gc", "clean")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return make_checkpoint("llama", tmp_path_factory.mktemp("ownership-kill-models") / "tiny-llama")


def leftovers(cache_dir: Path, keep: set[str]) -> list[str]:
    """Generations (but ``keep``), renamed-aside ones, records beside them and temp files."""
    return sorted(p.name for p in cache_dir.iterdir() if p.name not in keep and (
        is_generation_name(p.name) or p.name.startswith((RETIRED_PREFIX, PENDING_RECORD_PREFIX)) or is_temp_path(p)))


def current_generation(loader: LlamaLoader) -> str:
    return read_marker(loader.paths).generation


def kill_while_churning(paths: VariantPaths, rng: random.Random) -> None:
    churn = subprocess.Popen([sys.executable, "-c", CHURN, str(paths.cache_dir), paths.tag], cwd=REPO_ROOT,
                             env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert churn.stdout.readline().strip() == "ready", churn.stderr.read()[-2000:]
        time.sleep(rng.uniform(0.05, 0.4))
    finally:
        churn.send_signal(signal.SIGKILL)
        churn.wait(timeout=60)


def finish(finisher: str, checkpoint: Path, root: Path) -> None:
    if finisher == "build":
        assert LlamaLoader(checkpoint, precision="bfloat16", force=True).seed().complete
        return
    args = ("gc", str(root), "--older-than", "3650d", "--json") if finisher == "gc" else ("clean", str(root), "--json")
    out = tt_cache(*args, env=cli_env(root))
    assert out.returncode == 0, out.stderr[-2000:]


def run_trials(checkpoint: Path, cache_root: Path, trials: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    loader = LlamaLoader(checkpoint, precision="bfloat16")
    assert loader.seed().complete
    paths = loader.paths
    left_counts = []
    for trial in range(trials):
        kill_while_churning(paths, rng)
        left = leftovers(paths.cache_dir, {current_generation(loader)})
        listed = tt_cache("ls", str(cache_root), "--json", env=cli_env(cache_root))
        assert listed.returncode == 0, listed.stderr[-2000:]
        counted = {Path(b["generation"]).name for b in json_out(listed)["leftovers"]}
        # every directory left is counted; a record beside a directory counts with it (or alone when
        # the directory is gone)
        uncounted = [name for name in left if name not in counted
                     and name.removeprefix(PENDING_RECORD_PREFIX) not in counted]
        assert not uncounted, (trial, left, counted)
        finisher = FINISHERS[trial % len(FINISHERS)]
        finish(finisher, checkpoint, cache_root)
        assert leftovers(paths.cache_dir, {current_generation(loader)}) == [], (trial, finisher, left)
        assert LlamaLoader(checkpoint, precision="bfloat16").load().warm
        left_counts.append(len(left))
    return left_counts


def test_kills_inside_making_and_retiring_generations_leave_nothing_after_one_build_gc_or_clean(
        checkpoint, cache_root):
    left = run_trials(checkpoint, cache_root, trials=6, seed=1)
    assert any(left), f"no kill landed inside a making or a retirement: {left}"


@pytest.mark.slow
def test_kills_inside_making_and_retiring_generations_many_trials(checkpoint, cache_root):
    left = run_trials(checkpoint, cache_root, trials=40, seed=2)
    assert sum(1 for n in left if n) >= 10, left


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a tmpfs")
@pytest.mark.parametrize("room", [0, 16 << 10], ids=["no room for the record", "room for the record only"])
def test_a_full_file_system_under_the_record_leaves_nothing_and_builds_in_memory(checkpoint, tmp_path, room):
    """The cache root on a small tmpfs filled up (to nothing left, or to the record's room and no more):
    the cold load still builds, in memory, and leaves no generation, record or temp file behind."""
    with tmpfs(tmp_path / "small", "2m") as root:
        filler = root / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
        with contextlib.suppress(OSError):
            while os.write(fd, b"\0" * 4096):
                pass
        os.close(fd)
        with contextlib.suppress(OSError):
            os.truncate(filler, max(0, filler.stat().st_size - room))
        loader = LlamaLoader(checkpoint, precision="bfloat16", cache_root=root)
        loaded = loader.load()
        assert not loaded.cached and loaded.weights
        assert not loader.paths.marker.exists()
        assert leftovers(loader.cache_dir, set()) == [] if loader.cache_dir.exists() else True
