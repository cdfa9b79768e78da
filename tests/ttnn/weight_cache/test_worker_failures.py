# SPDX-License-Identifier: Apache-2.0
"""Conversion workers end together: a worker that fails (its checkpoint reader cannot open a shard:
``Too many open files``) ends the build promptly with its error, the lock let go and nothing left;
an interrupt stops every worker within a chunk of a large weight. Real child processes, a real
``RLIMIT_NOFILE``, a real SIGINT."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from models.common.fileio import TEMP_MARK
from models.testing.model_shapes import ModelShape, make_shaped_checkpoint
from models.testing.seed_child import REPO_ROOT, child_env

# many small shards: one tensor each (12 layers: 111 shards)
MANY_SHARDS = ModelShape("llama", "LlamaForCausalLM", 128, 256, 512, 4, 2, 10000.0,
                         config={"max_position_embeddings": 256})
# a 256 MiB LM head (and embedding): 8 chunks of 32 MiB of source, written block by block
LARGE_HEAD = ModelShape("llama", "LlamaForCausalLM", 2048, 1024, 65536, 16, 4, 10000.0,
                        config={"max_position_embeddings": 256})
HANG_TIMEOUT = 240  # seconds: the old hang never ends; a build here takes a few


def _child(*args: str) -> list[str]:
    return [sys.executable, "-m", "models.testing.workers_child", *args]


def _lines(out: str, tag: str) -> list[dict]:
    return [json.loads(line.split(" ", 1)[1]) for line in out.splitlines() if line.startswith(tag + " ")]


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory) -> Path:
    return make_shaped_checkpoint(tmp_path_factory.mktemp("many-shards") / "ckpt", MANY_SHARDS, 12, shard_bytes=1)


def test_a_worker_that_cannot_open_a_shard_ends_the_build_and_one_descriptor_per_shard_serves_all(many_shards,
                                                                                                  tmp_path):
    """Three workers, in one process: under a descriptor limit of the shards and a third more (the
    build's proof holds one descriptor per shard, each mapping one more) a worker's reader fails to
    map a shard: the build ends at once with that error, the lock free and only the lock left; then,
    under a limit of twice the shards and a margin (where each worker mapping every shard failed all
    but one and that one waited in the chunk board for ever), the build completes."""
    shards = len(list(many_shards.glob("*.safetensors")))
    try:
        out = subprocess.run(_child("descriptors", str(many_shards), str(tmp_path / "cache"), "3",
                                    str(shards + shards // 3), str(2 * shards + 40)),
                             cwd=REPO_ROOT, env=child_env(), capture_output=True, text=True, timeout=HANG_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"a build on 3 workers did not end within {HANG_TIMEOUT} s: a failed worker left the others waiting")
    failed, built = _lines(out.stdout, "BUILD")
    assert not failed["complete"] and "Too many open files" in failed.get("error", ""), (failed, out.stderr[-3000:])
    assert ".safetensors" in failed["error"] and "another conversion worker" not in failed["error"], failed
    assert failed["lock_free"] and failed["left"] == [".build.lock"], failed
    assert failed["seconds"] < built["seconds"] + 5, "the failure took longer than the whole build"
    assert built["complete"] and built["lock_free"], (built, out.stderr[-3000:])


@pytest.fixture(scope="module")
def large_head(tmp_path_factory) -> Path:
    return make_shaped_checkpoint(tmp_path_factory.mktemp("large-head") / "ckpt", LARGE_HEAD, 1, shard_bytes=None)


def _head_being_written(root: Path) -> bool:
    """Whether the LM head's temp file holds a chunk already: its chunks are being converted."""
    for path in root.rglob(".output*"):
        if TEMP_MARK in path.name:
            try:
                if path.stat().st_blocks * 512 >= 1 << 20:
                    return True
            except FileNotFoundError:
                pass
    return False


def test_an_interrupt_stops_both_workers_within_a_chunk_of_the_large_weight(large_head, tmp_path):
    """SIGINT while two workers write the LM head's chunks: the seed stops within a few chunks'
    conversion time (measured in the same process), not after the head's remaining chunks
    converted by its poster alone; the lock is free and nothing is left."""
    root = tmp_path / "cache"
    child = subprocess.Popen(_child("interrupt", str(large_head), str(root), "2", "bfloat8_b"), cwd=REPO_ROOT,
                             env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while not (line := child.stdout.readline()).startswith("CHUNK "):  # ttnn's banner lines before it
            assert line, "the child ended before it timed a chunk"
        chunk = json.loads(line.split(" ", 1)[1])["seconds"]
        deadline = time.monotonic() + 120
        while not _head_being_written(root):
            assert child.poll() is None and time.monotonic() < deadline, "the head's chunks were never written"
            time.sleep(0.002)
        sent = time.time()
        os.kill(child.pid, signal.SIGINT)
        out, err = child.communicate(timeout=HANG_TIMEOUT)
    finally:
        child.kill()
        child.wait()
    [stopped] = _lines(out, "STOPPED")
    assert stopped["at"] is not None and child.returncode == 130, err[-3000:]
    seconds = stopped["at"] - sent
    print(f"stopped {seconds:.3f} s after SIGINT; one chunk converts in {chunk:.3f} s")
    # the head's remaining chunks, converted by its poster alone, would take about 7 chunks' time; the
    # bound leaves room for the 2 cores' other work (3.3 chunks' time seen once, the chunk timed early)
    assert seconds < 5 * chunk, f"stopped {seconds:.2f} s after SIGINT, {seconds / chunk:.1f} chunks' time"
    assert stopped["lock_free"]
    [variant] = root.rglob("mesh_1x1")
    assert sorted(p.name for p in variant.iterdir()) == [".build.lock"], "no generation, no temp file"
