# SPDX-License-Identifier: Apache-2.0
"""A cold build converts the bytes its content id names, or fails naming the file: a checkpoint
shard replaced (renamed over, or rewritten in place) after the content id was computed is never
cached under the old weights' id, so a pristine copy of the old weights is never served the new.

The races are made deterministic with the loader's own observable points: the log line a cold
build starts with (the content id is known by then), and a seed's per-weight progress callback
(the build is reading the checkpoint then). At each, a second process (``mv``, ``dd``) replaces the
shard for real."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from loguru import logger

from models.common.weight_cache.checkpoint_proof import CheckpointChanged
from models.common.weight_cache.layout import GENERATION_PREFIX
from models.llama import LlamaLoader
from models.testing.tiny_models import make_checkpoint, tensors_of

SHARD = "model-00002-of-00004.safetensors"  # a middle shard: layer weights


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> dict[str, Path]:
    """Two sharded checkpoints of one shape (``old``, ``new``: other weights, same file sizes)."""
    root = tmp_path_factory.mktemp("weights")
    made = {name: make_checkpoint("llama", root / name, seed=seed, max_shard_size="300KB")
            for name, seed in (("old", 0), ("new", 5))}
    assert (made["old"] / SHARD).stat().st_size == (made["new"] / SHARD).stat().st_size
    assert (made["old"] / SHARD).read_bytes() != (made["new"] / SHARD).read_bytes()
    return made


@pytest.fixture(scope="module")
def reference(weights, tmp_path_factory) -> dict[str, list[torch.Tensor]]:
    """The old weights' tensors, from a cold build in a cache of their own."""
    loader = LlamaLoader(weights["old"], precision="bfloat16", cache_root=tmp_path_factory.mktemp("ref"))
    return tensors_of(loader.load())


def _same(a: dict[str, list[torch.Tensor]], b: dict[str, list[torch.Tensor]]) -> bool:
    return a.keys() == b.keys() and all(all(torch.equal(x, y) for x, y in zip(a[k], b[k], strict=True)) for k in a)


@contextlib.contextmanager
def on_log(text: str, action) -> Iterator[list[str]]:
    """Run ``action()`` once, in the logging thread, when a log line containing ``text`` is written."""
    done: list[str] = []

    def sink(message) -> None:
        if text in message.record["message"] and not done:
            done.append(message.record["message"])
            action()

    handle = logger.add(sink, level="INFO")
    try:
        yield done
    finally:
        logger.remove(handle)


def _copies(weights: dict[str, Path], tmp_path: Path) -> tuple[Path, Path]:
    """A working copy of the old weights (to be changed under a build) and a pristine one."""
    working = Path(shutil.copytree(weights["old"], tmp_path / "work" / "model"))
    pristine = Path(shutil.copytree(weights["old"], tmp_path / "pristine" / "model"))
    time.sleep(0.05)  # past the racy tick: the content id's stamps vouch for the copies' bytes
    return working, pristine


def _assert_nothing_cached_then_own_build(pristine: Path, reference) -> None:
    """No warm cache of the old weights' id (no marker, no generation left); a pristine copy of them
    builds its own cache, of its own weights."""
    loader = LlamaLoader(pristine, precision="bfloat16")
    status = loader.status()
    assert not status.warm
    assert not loader.paths.marker.exists()
    assert not list(loader.cache_dir.glob(f"{GENERATION_PREFIX}*"))  # the failed build's generation is gone
    built = LlamaLoader(pristine, precision="bfloat16").load()
    assert not built.warm and _same(tensors_of(built), reference)
    again = LlamaLoader(pristine, precision="bfloat16").load()
    assert again.warm and _same(tensors_of(again), reference)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_shard_renamed_over_after_the_content_id_fails_the_build(weights, reference, cache_root, tmp_path, workers):
    working, pristine = _copies(weights, tmp_path)
    staged = tmp_path / "work" / "incoming.safetensors"
    shutil.copyfile(weights["new"] / SHARD, staged)  # a re-download lands next to the checkpoint

    def rename_over() -> None:
        subprocess.run(["mv", str(staged), str(working / SHARD)], check=True)

    loader = LlamaLoader(working, precision="bfloat16", workers=workers)
    with on_log("cold build into", rename_over) as seen, pytest.raises(CheckpointChanged, match=SHARD):
        loader.load()
    assert seen and not staged.exists()
    assert loader.content_id == LlamaLoader(pristine, precision="bfloat16").content_id  # the old weights' id
    _assert_nothing_cached_then_own_build(pristine, reference)


class _RewriteAtFirstWeight:
    """A seed's progress: when the first weight is written, ``dd`` rewrites ``shard`` in place with
    ``source``'s bytes (same size, same inode, other weights)."""

    def __init__(self, shard: Path, source: Path) -> None:
        self.shard, self.source = shard, source
        self.rewritten = False

    def start(self, weights: int, nbytes: int) -> None:
        pass

    def weight_done(self, name: str, nbytes: int) -> None:
        if not self.rewritten:
            self.rewritten = True
            inode = self.shard.stat().st_ino
            subprocess.run(["dd", f"if={self.source}", f"of={self.shard}", "conv=notrunc", "status=none"], check=True)
            assert self.shard.stat().st_ino == inode

    def finish(self) -> None:
        pass


@pytest.mark.parametrize("workers", [1, 2])
def test_a_shard_rewritten_in_place_during_the_build_fails_it(weights, reference, cache_root, tmp_path, workers):
    working, pristine = _copies(weights, tmp_path)
    progress = _RewriteAtFirstWeight(working / SHARD, weights["new"] / SHARD)
    with pytest.raises(CheckpointChanged, match=f"{SHARD} changed while the build read it"):
        LlamaLoader(working, precision="bfloat16", workers=workers).seed(progress)
    assert progress.rewritten
    _assert_nothing_cached_then_own_build(pristine, reference)


def test_a_shard_touched_after_the_content_id_still_builds(weights, reference, cache_root, tmp_path):
    """Only the bytes count: a shard whose stamp moved but whose bytes are the content id's (a
    ``touch``, a restore) is hashed again at open, and the build goes on."""
    working, _ = _copies(weights, tmp_path)

    def touch() -> None:
        subprocess.run(["touch", str(working / SHARD)], check=True)

    with on_log("cold build into", touch) as seen:
        built = LlamaLoader(working, precision="bfloat16").load()
    assert seen and not built.warm and built.cached and _same(tensors_of(built), reference)
    assert LlamaLoader(working, precision="bfloat16").load().warm


def test_a_ray_task_reads_only_the_drivers_content(weights, cache_root, tmp_path):
    """What every Ray task runs (``convert_part``), here in-process: the checkpoint changed after the
    driver computed its content id, and the task refuses it, naming the shard."""
    from models.common.build_plan import plan_weights
    from models.seeding.ray_seed import LoaderSpec, convert_part

    working, _ = _copies(weights, tmp_path)
    driver = LlamaLoader(working, precision="bfloat16")
    spec = LoaderSpec.of(driver)  # the driver's identity travels with the spec
    names = [w.name for w in plan_weights(driver, driver.make_args(driver.model_config(), None))]
    shutil.copyfile(weights["new"] / SHARD, tmp_path / "incoming")
    os.replace(tmp_path / "incoming", working / SHARD)
    with pytest.raises(CheckpointChanged, match=SHARD):
        convert_part(spec, names, str(tmp_path / "part"))


def test_an_index_rewritten_after_the_content_id_fails_the_build(weights, reference, cache_root, tmp_path):
    """The weight map a build follows is parsed from the index bytes the content id names."""
    working, pristine = _copies(weights, tmp_path)
    index = working / "model.safetensors.index.json"
    body = json.loads(index.read_text())
    body["weight_map"] = dict(reversed(body["weight_map"].items()))  # the same map, other bytes

    def rewrite() -> None:
        staged = tmp_path / "index.json"
        staged.write_text(json.dumps(body))
        subprocess.run(["mv", str(staged), str(index)], check=True)

    with on_log("cold build into", rewrite) as seen, pytest.raises(CheckpointChanged, match=index.name):
        LlamaLoader(working, precision="bfloat16").load()
    assert seen
    _assert_nothing_cached_then_own_build(pristine, reference)


RAY_DRIVER = """
import subprocess, sys
from models.common.device_env import ensure_host_cluster
ensure_host_cluster()
from models.llama import LlamaLoader
from models.seeding.ray_seed import SeedError, seed_on_ray
working, staged, shard, root = sys.argv[1:5]

class RenameOverBeforeTheTasks:  # start(): the driver planned the variant; no task has run yet
    def start(self, weights, nbytes):
        subprocess.run(["mv", staged, shard], check=True)
    def weight_done(self, name, nbytes):
        pass
    def finish(self):
        pass

try:
    seed_on_ray([LlamaLoader(working, precision="bfloat16", cache_root=root)], workers=1,
                progress=RenameOverBeforeTheTasks())
    print("SEEDED", flush=True)
except SeedError as error:
    print("SEED_ERROR", error, flush=True)
"""


@pytest.mark.slow  # a Ray instance: 30-60 s here; test_a_ray_task_reads_only_the_drivers_content is the short form
def test_a_ray_seed_of_a_shard_renamed_over_after_the_drivers_content_id_fails(weights, reference, cache_root,
                                                                                tmp_path):
    pytest.importorskip("ray")
    from models.testing.seed_child import REPO_ROOT, child_env

    working, pristine = _copies(weights, tmp_path)
    staged = tmp_path / "work" / "incoming.safetensors"
    shutil.copyfile(weights["new"] / SHARD, staged)
    driver = subprocess.run([sys.executable, "-c", RAY_DRIVER, str(working), str(staged), str(working / SHARD),
                             str(cache_root)], cwd=REPO_ROOT, env=child_env(), capture_output=True, text=True,
                            timeout=600)
    assert driver.returncode == 0, driver.stderr[-4000:]
    assert "SEED_ERROR" in driver.stdout and "CheckpointChanged" in driver.stdout and SHARD in driver.stdout, \
        driver.stdout[-2000:]
    assert not staged.exists()
    _assert_nothing_cached_then_own_build(pristine, reference)


def test_a_ray_task_refuses_a_config_changed_after_the_drivers_content_id(weights, cache_root, tmp_path):
    """The architecture a task builds comes from ``config.json`` read in the task: it must be the
    config the driver's content id counts."""
    from models.common.build_plan import plan_weights
    from models.seeding.ray_seed import LoaderSpec, convert_part

    working, _ = _copies(weights, tmp_path)
    driver = LlamaLoader(working, precision="bfloat16")
    spec = LoaderSpec.of(driver)
    names = [w.name for w in plan_weights(driver, driver.make_args(driver.model_config(), None))]
    config = json.loads((working / "config.json").read_text())
    config["rms_norm_eps"] = config["rms_norm_eps"] * 10  # same tensors, another model
    (working / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointChanged, match="config.json"):
        convert_part(spec, names, str(tmp_path / "part"))
