# SPDX-License-Identifier: Apache-2.0
"""Loaders under real crashes and real concurrency: SIGKILLed cold builds, simultaneous builders.

Whatever happens, the next load must either be warm from a cache that deep-verifies, or rebuild;
it never serves a cache the gate should not have accepted."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from models.common.weight_cache import read_marker, verify_weight_cache
from models.llama import LlamaLoader
from models.testing.cache_child import Child
from models.testing.tiny_models import make_checkpoint, tensors_of
from models.testing import REPO_ROOT

BUILD = """
import sys
from models.llama import LlamaLoader
print("READY", flush=True)
loaded = LlamaLoader(sys.argv[1], precision="bfloat8_b", mesh_shape=(1, 2)).load()
print("BUILT", "warm" if loaded.warm else "cold", flush=True)
"""


def start_build(checkpoint: Path, cache_root: Path, *, force: bool) -> subprocess.Popen:
    env = dict(os.environ, TT_CACHE_PATH=str(cache_root), PYTHONPATH=str(REPO_ROOT))
    env.pop("TT_TRANSFORMERS_FORCE_MODEL_LOAD", None)
    if force:
        env["TT_TRANSFORMERS_FORCE_MODEL_LOAD"] = "1"
    return subprocess.Popen([sys.executable, "-c", BUILD, str(checkpoint)], env=env, cwd=REPO_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return make_checkpoint("llama", tmp_path_factory.mktemp("ckpt") / "tiny-llama", hidden_size=256,
                           intermediate_size=1024, num_hidden_layers=4)


@pytest.fixture(scope="module")
def reference(checkpoint, tmp_path_factory) -> dict[str, list[torch.Tensor]]:
    """The tensors of an undisturbed cold build."""
    root = tmp_path_factory.mktemp("reference-cache")
    return tensors_of(LlamaLoader(checkpoint, precision="bfloat8_b", mesh_shape=(1, 2), cache_root=root).load())


def assert_sound(checkpoint: Path, cache_root: Path, reference) -> None:
    """The gate's verdict is trustworthy and the next load gives the reference tensors."""
    loader = LlamaLoader(checkpoint, precision="bfloat8_b", mesh_shape=(1, 2), cache_root=cache_root)
    if loader.status().warm:
        assert verify_weight_cache(loader.paths) == []
    loaded = tensors_of(loader.load())
    assert loaded.keys() == reference.keys()
    for name, shards in loaded.items():
        assert all(torch.equal(a, b) for a, b in zip(shards, reference[name], strict=True)), name
    again = LlamaLoader(checkpoint, precision="bfloat8_b", mesh_shape=(1, 2), cache_root=cache_root)
    assert again.status().warm and verify_weight_cache(again.paths) == []


def test_sigkilled_cold_rebuilds_never_leave_a_cache_the_gate_accepts_wrongly(checkpoint, reference, tmp_path):
    rng = random.Random(7)
    killed_mid_build = 0
    for trial in range(6):
        cache_root = tmp_path / f"cache{trial}"
        seeder = LlamaLoader(checkpoint, precision="bfloat8_b", mesh_shape=(1, 2), cache_root=cache_root)
        seeder.load()
        build = start_build(checkpoint, cache_root, force=True)  # a new generation beside the old one
        assert build.stdout.readline().strip() == "READY"  # imports done: the build starts now
        named = read_marker(seeder.paths).generation
        deadline = time.monotonic() + 60  # kill once its generation exists: inside the build on any machine
        while not [p for p in seeder.cache_dir.glob("g*") if p.name != named] and time.monotonic() < deadline:
            time.sleep(0.002)
        time.sleep(rng.uniform(0.0, 0.1))
        build.send_signal(signal.SIGKILL)
        out, _ = build.communicate()
        assert seeder.status().warm  # readers keep the last complete generation, killed build or not
        named = read_marker(seeder.paths).generation
        orphans = [p for p in seeder.cache_dir.glob("g*") if p.name != named]
        if build.returncode == -signal.SIGKILL and "BUILT" not in out and orphans:
            killed_mid_build += 1
        assert_sound(checkpoint, cache_root, reference)
    assert killed_mid_build >= 2, f"only {killed_mid_build} of 6 kills landed inside a build"


def test_the_next_build_retires_a_killed_builds_generation_and_nothing_else(checkpoint, tmp_path):
    cache_root = tmp_path / "cache"
    seeder = LlamaLoader(checkpoint, precision="bfloat8_b", mesh_shape=(1, 2), cache_root=cache_root)
    seeder.load()
    with Child("build", str(seeder.cache_dir), seeder.paths.tag) as builder:  # SIGKILLed on exit
        killed = builder.detail
    look_alike = seeder.cache_dir / "g0-dead00"  # a generation's name, but no record: not provably ours
    (look_alike / "layers.0").mkdir(parents=True)
    (look_alike / "layers.0" / "half.tensorbin").write_bytes(b"x" * 100)
    LlamaLoader(checkpoint, precision="bfloat8_b", mesh_shape=(1, 2), cache_root=cache_root, force=True).load()
    generations = sorted(p.name for p in seeder.cache_dir.glob("g*"))
    assert killed not in generations
    assert generations == sorted([read_marker(seeder.paths).generation, look_alike.name])


def test_concurrent_cold_builds_all_succeed_and_agree(checkpoint, reference, tmp_path):
    cache_root = tmp_path / "cache"
    builds = [start_build(checkpoint, cache_root, force=False) for _ in range(4)]
    outputs = [build.communicate(timeout=300) for build in builds]
    for build, (out, err) in zip(builds, outputs, strict=True):
        assert build.returncode == 0 and "BUILT" in out, err[-3000:]
    assert_sound(checkpoint, cache_root, reference)
