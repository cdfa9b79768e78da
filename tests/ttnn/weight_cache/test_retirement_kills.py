# SPDX-License-Identifier: Apache-2.0
"""A retirement SIGKILLed midway while the generation's builder (a server) lives on: the next build,
``gc`` or ``clean`` removes what it left, and ``ls`` counts it until then; a user's look-alike stays.

The retirer is a real ``tt-cache gc`` evicting the variant, run under ``strace``, which holds it at
every ``rmdir`` (before it, or after it returns); the test SIGKILLs it once the cache dir shows the
state of the chosen moment: the generation's files gone and its record moved out beside the empty
directory (the directory still there, or already removed)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from models.common.weight_cache.layout import PENDING_RECORD_PREFIX, RETIRED_PREFIX
from models.testing.tiny_models import make_checkpoint
from models.testing.tt_cache import REPO_ROOT, cli_env, json_out, tt_cache

# A long-running builder: on each line "<cache root>" it builds the checkpoint cold there and prints
# the generation it made; it lives on afterwards, as a server that built its cache does.
SERVER = """
import sys
from models.common.weight_cache import read_marker
from models.llama import LlamaLoader
print("ready", flush=True)
for line in sys.stdin:
    loader = LlamaLoader(sys.argv[1], precision="bfloat16", cache_root=line.strip(), force=True)
    assert loader.seed().complete
    print(read_marker(loader.paths).generation, loader.cache_dir, flush=True)
"""

HOLD_US = 2_000_000  # strace holds the retirer this long at each rmdir: ample time to see the state and kill

pytestmark = pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace to stop a process at a syscall")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return make_checkpoint("llama", tmp_path_factory.mktemp("retirement-kill-models") / "tiny-llama")


@pytest.fixture(scope="module")
def server(checkpoint) -> Iterator[subprocess.Popen]:
    process = subprocess.Popen([sys.executable, "-c", SERVER, str(checkpoint)], cwd=REPO_ROOT, env=cli_env(),
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "ready"
        yield process
    finally:
        process.kill()
        process.wait(timeout=60)


def built_by(server: subprocess.Popen, cache_root: Path) -> tuple[str, Path]:
    """(generation, cache dir) the live server builds under ``cache_root``."""
    server.stdin.write(f"{cache_root}\n")
    server.stdin.flush()
    generation, cache_dir = server.stdout.readline().split()
    return generation, Path(cache_dir)


def debris(cache_dir: Path, generation: str) -> list[str]:
    """Renamed-aside directories of ``generation`` and records beside them."""
    aside = f"{RETIRED_PREFIX}{generation}-"
    return sorted(p.name for p in cache_dir.iterdir() if p.name.startswith((aside, PENDING_RECORD_PREFIX + aside)))


def kill_retirement(cache_root: Path, cache_dir: Path, generation: str, when: str) -> list[str]:
    """Run ``tt-cache gc`` evicting everything; SIGKILL it at ``when`` ("before rmdir": the empty
    directory and its record beside; "after rmdir": the record alone). Returns what it left."""
    hold = "delay_enter" if when == "before rmdir" else "delay_exit"
    strace = ["strace", "-qq", "-o", os.devnull, "-e", "trace=rmdir", "-e", f"inject=rmdir:{hold}={HOLD_US}"]
    retirer = subprocess.Popen([*strace, sys.executable, "-m", "models.tt_cache.cli", "gc", str(cache_root),
                                "--max-size", "0", "--json"], cwd=REPO_ROOT, env=cli_env(cache_root),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            left = debris(cache_dir, generation)
            beside = [name for name in left if name.startswith(PENDING_RECORD_PREFIX)]
            if beside and (len(left) == 2) == (when == "before rmdir"):
                break
            assert retirer.poll() is None, f"the retirer ended before {when}: {retirer.stderr.read()[-2000:]}"
            time.sleep(0.005)
        else:
            pytest.fail(f"the retirer never reached {when}")
        for tracee in psutil.Process(retirer.pid).children():
            tracee.send_signal(signal.SIGKILL)
    finally:
        retirer.kill()
        retirer.wait(timeout=60)
    return debris(cache_dir, generation)


def finish(finisher: str, checkpoint: Path, cache_root: Path) -> None:
    args = {"build": ("build", str(checkpoint), "--precision", "bfloat16"),
            "gc": ("gc", str(cache_root), "--older-than", "3650d", "--json"),
            "clean": ("clean", str(cache_root), "--json")}[finisher]
    out = tt_cache(*args, env=cli_env(cache_root))
    assert out.returncode == 0, out.stderr[-2000:]


def look_alikes(cache_dir: Path, generation: str) -> dict[Path, bytes | None]:
    """A user's directories named like a retirement's (one even after this very generation), no record."""
    made = {}
    for name, content in ((f"{RETIRED_PREFIX}{generation}-0ddba1", b"notes"), (f"{RETIRED_PREFIX}mine", None)):
        (cache_dir / name).mkdir()
        if content is not None:
            (cache_dir / name / "notes.txt").write_bytes(content)
        made[cache_dir / name] = content
    return made


def assert_untouched(made: dict[Path, bytes | None]) -> None:
    for directory, content in made.items():
        assert directory.is_dir(), directory
        if content is not None:
            assert (directory / "notes.txt").read_bytes() == content


def run(server, checkpoint, cache_root: Path, when: str, finisher: str) -> None:
    generation, cache_dir = built_by(server, cache_root)
    left = kill_retirement(cache_root, cache_dir, generation, when)
    assert len(left) == (2 if when == "before rmdir" else 1), left
    made = look_alikes(cache_dir, generation)
    assert server.poll() is None and psutil.pid_exists(server.pid)  # the generation's builder lives on

    listed = tt_cache("ls", str(cache_root), "--json", env=cli_env(cache_root))
    assert listed.returncode == 0, listed.stderr[-2000:]
    counted = {Path(b["generation"]).name for b in json_out(listed)["leftovers"]}
    # counted: the directory (its record beside with it), or the record alone once the directory is gone
    assert all(name in counted or name.removeprefix(PENDING_RECORD_PREFIX) in counted for name in left), (left, counted)

    finish(finisher, checkpoint, cache_root)
    assert debris(cache_dir, generation) == [name.name for name in made if name.name.startswith(
        f"{RETIRED_PREFIX}{generation}-")], finisher
    assert_untouched(made)
    assert server.poll() is None


@pytest.mark.parametrize("finisher", ["build", "gc", "clean"])
def test_a_retirement_killed_before_its_empty_directory_goes_is_finished_while_the_builder_lives(
        server, checkpoint, cache_root, finisher):
    run(server, checkpoint, cache_root, "before rmdir", finisher)


def test_a_retirement_killed_before_its_record_goes_is_finished_while_the_builder_lives(server, checkpoint, cache_root):
    run(server, checkpoint, cache_root, "after rmdir", "clean")
