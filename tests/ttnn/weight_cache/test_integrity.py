# SPDX-License-Identifier: Apache-2.0
"""Integrity of the warm cache through the public loaders: a load returns the weights it was
asked for, or builds cold, or says why — never another model's.

Each test is one way a user meets the cache: folders with the same name, swapped or
rewritten files, copies, debug builds, cache-only deploys, concurrent builders and re-seeds."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from models.common.checkpoint import CheckpointError
from models.common.mesh import parse_mesh_shape
from models.common.weight_cache import WeightCacheError, build_cached_state_dict, marker_path, read_marker
from models.common.weight_cache.marker import build_relative
from models.common.weight_cache.placeholders import placeholder
from models.common.weight_cache.tensor_cache import TensorCache
from models.llama import LlamaLoader
from models.qwen3 import Qwen3Loader
from models.testing import REPO_ROOT
from models.testing.tiny_models import as_hub_snapshot, make_checkpoint, tensors_of


def same(a: dict[str, list[torch.Tensor]], b: dict[str, list[torch.Tensor]]) -> bool:
    return a.keys() == b.keys() and all(
        all(torch.equal(x, y) for x, y in zip(a[k], b[k], strict=True)) for k in a
    )


@pytest.fixture(scope="module")
def twins(tmp_path_factory) -> dict[str, Path]:
    """Checkpoints whose folders share the name ``model``: two families, and two weights of one."""
    root = tmp_path_factory.mktemp("twins")
    return {
        "llama": make_checkpoint("llama", root / "run1" / "model"),
        "qwen3": make_checkpoint("qwen3", root / "run2" / "model"),
        "llama_b": make_checkpoint("llama", root / "run3" / "model", seed=5),
    }


@pytest.fixture(scope="module")
def references(twins, tmp_path_factory) -> dict[str, dict[str, list[torch.Tensor]]]:
    """Each twin's tensors from a cold build in a cache of its own."""
    loaders = {"llama": LlamaLoader, "qwen3": Qwen3Loader, "llama_b": LlamaLoader}
    return {
        name: tensors_of(loaders[name](path, precision="bfloat16", cache_root=tmp_path_factory.mktemp(name)).load())
        for name, path in twins.items()
    }


def test_same_folder_name_of_two_families_never_shares_a_cache(twins, references, cache_root):
    LlamaLoader(twins["llama"], precision="bfloat16").load()
    Qwen3Loader(twins["qwen3"], precision="bfloat16").load()
    again = LlamaLoader(twins["llama"], precision="bfloat16").load()
    assert again.warm and same(tensors_of(again), references["llama"])
    assert same(tensors_of(Qwen3Loader(twins["qwen3"], precision="bfloat16").load()), references["qwen3"])


def test_same_folder_name_of_two_weights_of_one_family_never_shares_a_cache(twins, references, cache_root):
    first, second = LlamaLoader(twins["llama"], precision="bfloat16"), LlamaLoader(twins["llama_b"], precision="bfloat16")
    assert first.cache_dir != second.cache_dir and first.model_name == second.model_name == "model"
    first.load()
    second.load()
    assert same(tensors_of(LlamaLoader(twins["llama"], precision="bfloat16").load()), references["llama"])
    assert same(tensors_of(LlamaLoader(twins["llama_b"], precision="bfloat16").load()), references["llama_b"])


BUILD = """
import sys
from models.llama import LlamaLoader
for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 1):  # argv[2]: loads, one after another
    loaded = LlamaLoader(sys.argv[1], precision="bfloat16").load()
    print("BUILT", "warm" if loaded.warm else "cold", flush=True)
"""


def _race_same_named_builders(twins, references, rounds: int) -> None:
    """Two builders of each of two same-named checkpoints at once, ``rounds`` times over one cache root."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    for _ in range(rounds):
        builds = [
            subprocess.Popen([sys.executable, "-c", BUILD, str(twins[name])], env=env, cwd=REPO_ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for name in ("llama", "llama_b", "llama", "llama_b")
        ]
        for build in builds:
            out, err = build.communicate(timeout=300)
            assert build.returncode == 0 and "BUILT" in out, err[-2000:]
        for name in ("llama", "llama_b"):
            loaded = LlamaLoader(twins[name], precision="bfloat16").load()
            assert loaded.warm and same(tensors_of(loaded), references[name])


def test_concurrent_cold_builders_of_same_named_checkpoints_each_get_their_own(twins, references, cache_root):
    _race_same_named_builders(twins, references, rounds=1)


@pytest.mark.slow
def test_concurrent_cold_builders_of_same_named_checkpoints_many_rounds(twins, references, cache_root):
    _race_same_named_builders(twins, references, rounds=5)


def test_cache_only_load_needs_the_same_model_id(twins, cache_root, tmp_path, monkeypatch):
    local = shutil.copytree(twins["llama"], tmp_path / "tiny-llama")
    LlamaLoader(local, precision="bfloat16").load()
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    with pytest.raises(CheckpointError, match="some-org/tiny-llama") as error:
        LlamaLoader("some-org/tiny-llama", precision="bfloat16").load()
    assert str(local.resolve()) in str(error.value)  # says which model the same-named cache is for
    for weights in local.glob("*.safetensors"):
        weights.unlink()  # a cache-only deploy of the local model itself: served from its cache
    assert LlamaLoader(local, precision="bfloat16").load().warm


def test_cache_only_load_of_an_ambiguous_id_lists_the_candidates(twins, cache_root, tmp_path, monkeypatch):
    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    first = as_hub_snapshot(twins["llama"], hub, "acme/model", revision="a" * 40)
    LlamaLoader("acme/model", precision="bfloat16").load()
    shutil.rmtree(hub)
    as_hub_snapshot(twins["llama_b"], hub, "acme/model", revision="b" * 40)  # the repo got new weights
    built = LlamaLoader("acme/model", precision="bfloat16")
    built.load()
    shutil.rmtree(hub)
    with pytest.raises(CheckpointError, match="2 .* were built from 'acme/model'") as error:
        LlamaLoader("acme/model", precision="bfloat16").load()
    assert str(built.cache_dir) in str(error.value)
    named = LlamaLoader("acme/model", precision="bfloat16", cache_dir=built.cache_dir).load()
    assert named.warm and first.name == "a" * 40


def test_a_swapped_tensorbin_of_the_same_size_is_never_served(twins, references, cache_root):
    loader = LlamaLoader(twins["llama"], precision="bfloat16")
    loader.load()
    generation = loader.cache_dir / read_marker(loader.paths).generation
    wq = next(generation.glob("layers.0/attention.wqkv*"))
    other = next(generation.glob("layers.1/attention.wqkv*"))
    assert wq.stat().st_size == other.stat().st_size
    shutil.copyfile(other, wq)  # another weight's file, same size
    status = loader.status()
    assert not status.warm and "content differs" in status.reason
    rebuilt = LlamaLoader(twins["llama"], precision="bfloat16").load()
    assert not rebuilt.warm and same(tensors_of(rebuilt), references["llama"])


def test_a_byte_identical_copy_of_the_checkpoint_stays_warm(twins, cache_root, tmp_path):
    LlamaLoader(twins["llama"], precision="bfloat16").load()
    copy = tmp_path / "elsewhere" / "model"
    copy.parent.mkdir()
    subprocess.run(["cp", "-r", str(twins["llama"]), str(copy)], check=True)  # new inodes and mtimes
    for _ in range(3):
        assert LlamaLoader(copy, precision="bfloat16").load().warm
        assert LlamaLoader(twins["llama"], precision="bfloat16").load().warm


def test_tampered_marker_fields_mean_cold_not_a_crash(twins, references, cache_root):
    loader = LlamaLoader(twins["llama"], precision="bfloat16")
    loader.load()
    marker = marker_path(loader.cache_dir, loader.build_variant)
    original = marker.read_bytes()

    for tamper in (
        lambda body: body["weights"].pop(next(k for k in body["weights"] if k.startswith("layers.0."))),
        lambda body: body["model_info"].update(num_experts="8"),
        lambda body: body["model_info"].update(fuse_qkv=[1]),
        lambda body: body.update(mesh_shape="N300"),
        lambda body: body.update(build_variant=["x"]),
    ):
        body = json.loads(original)
        tamper(body)
        marker.write_bytes(json.dumps(body).encode())
        loaded = LlamaLoader(twins["llama"], precision="bfloat16").load()
        assert not loaded.warm and same(tensors_of(loaded), references["llama"])


# --------------------------------------------------------------------------------------------
# Bad tensorbin headers: whatever bytes, a clear error, never other values or MemoryError
# --------------------------------------------------------------------------------------------


def _wqkv_file(loader) -> Path:
    marker = read_marker(loader.paths)
    return loader.cache_dir / next(r.path for r in marker.files if "layers.0/attention.wqkv" in r.path)


def test_fuzzed_tensorbin_headers_give_the_weights_or_a_clear_error(twins, references, cache_root, tmp_path):
    """A flipped byte anywhere in the header (and at random data offsets): the load rebuilds and
    returns the reference weights; without a checkpoint it is a clear error. ttnn itself can
    crash the process on such a file, so the gate must never let one through to it."""
    deploy = shutil.copytree(twins["llama"], tmp_path / "deploy")
    LlamaLoader(twins["llama"], precision="bfloat16").load()
    LlamaLoader(deploy, precision="bfloat16").load()
    for weights in deploy.glob("*.safetensors"):
        weights.unlink()  # a cache-only twin of the same content: no cold fallback there
    rng = random.Random(11)
    size = _wqkv_file(LlamaLoader(twins["llama"], precision="bfloat16")).stat().st_size
    offsets = list(range(96)) + rng.sample(range(96, size), 16)
    for offset in offsets:
        flip = rng.choice((0x01, 0x80, 0xFF))
        loader, cache_only = LlamaLoader(twins["llama"], precision="bfloat16"), LlamaLoader(deploy, precision="bfloat16")
        assert loader.cache_dir == cache_only.cache_dir  # the same weights: one cache
        _flip(_wqkv_file(loader), offset, flip)
        with pytest.raises(CheckpointError, match="content differs"):
            cache_only.load()
        _flip(_wqkv_file(loader), offset, flip)  # restored: re-hashed, and warm again
        assert same(tensors_of(cache_only.load()), references["llama"])
        _flip(_wqkv_file(loader), offset, flip)
        rebuilt = loader.load()
        assert not rebuilt.warm and same(tensors_of(rebuilt), references["llama"]), offset


def _flip(path: Path, offset: int, mask: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))


def test_a_file_replaced_after_the_gate_is_never_opened(twins, cache_root):
    loader = LlamaLoader(twins["llama"], precision="bfloat16")
    loaded = loader.load()
    status = loader.status()
    assert status.warm
    marker = status.marker
    path = _wqkv_file(loader)
    data = bytearray(path.read_bytes())
    data[3] ^= 0xFF
    path.write_bytes(bytes(data))  # after the gate, before the load
    recorded = {build_relative(p, marker.generation): s for p, s in status.verified_stamps().items()}
    cache = TensorCache(loader.cache_dir / marker.generation, parse_mesh_shape((1, 1)), rebuild=False,
                        recorded=recorded)
    name = "layers.0.attention.wqkv"
    with pytest.raises(WeightCacheError, match="changed after the gate"):
        cache.as_tensor(name, placeholder((1, 1), torch.bfloat16), loaded.formats[name])


def test_a_load_error_without_a_checkpoint_names_the_file(twins, cache_root, tmp_path):
    local = shutil.copytree(twins["llama"], tmp_path / "deploy")
    loader = LlamaLoader(local, precision="bfloat16")
    loader.load()
    for weights in local.glob("*.safetensors"):
        weights.unlink()
    marker = read_marker(loader.paths)
    victim = loader.cache_dir / marker.files[0].path
    victim.write_bytes(b"\0" * victim.stat().st_size)
    with pytest.raises(CheckpointError, match="cold .*content differs"):
        LlamaLoader(local, precision="bfloat16").load()


def test_a_host_sidecar_that_lost_a_weight_is_cold(cache_root, tmp_path):
    from models.gemma import Gemma3Loader

    checkpoint = make_checkpoint("gemma3", tmp_path / "tiny-gemma3")
    loader = Gemma3Loader(checkpoint, precision="bfloat16")
    loader.load()
    marker = read_marker(loader.paths)
    assert marker.host_weights
    with pytest.raises(WeightCacheError):
        build_cached_state_dict(loader.cache_dir, host={}, build_variant=loader.build_variant)


# --------------------------------------------------------------------------------------------
# Re-seeding under readers
# --------------------------------------------------------------------------------------------

READER = """
import json, sys
from pathlib import Path
import torch
from models.llama import LlamaLoader
from models.common.weight_cache.tensor_cache import host_shards
reference = torch.load(sys.argv[2])
loads = warm = wrong = 0
print("STARTED", flush=True)
while not Path(sys.argv[3]).exists() or loads == 0:
    loaded = LlamaLoader(sys.argv[1], precision="bfloat16").load()
    loads += 1
    warm += loaded.warm
    for name, shards in reference.items():
        if not all(torch.equal(a, b) for a, b in zip(host_shards(loaded.weights[name]), shards)):
            wrong += 1
print("READER", json.dumps({"loads": loads, "warm": warm, "wrong": wrong}), flush=True)
"""


def test_readers_stay_warm_and_right_while_another_process_reseeds(twins, references, cache_root, tmp_path):
    LlamaLoader(twins["llama"], precision="bfloat16").load()
    reference_file = tmp_path / "reference.pt"
    torch.save(references["llama"], reference_file)
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    stop = tmp_path / "stop"
    reader = subprocess.Popen([sys.executable, "-c", READER, str(twins["llama"]), str(reference_file), str(stop)],
                              env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    forced = dict(env, TT_TRANSFORMERS_FORCE_MODEL_LOAD="1")
    try:
        assert reader.stdout.readline().strip() == "STARTED"
        reseeds = subprocess.run([sys.executable, "-c", BUILD, str(twins["llama"]), "10"], env=forced,
                                 cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)  # ten cold rebuilds
        assert reseeds.returncode == 0 and reseeds.stdout.count("BUILT cold") == 10, reseeds.stderr[-3000:]
    finally:
        stop.touch()
    out, err = reader.communicate(timeout=300)
    line = next((row for row in out.splitlines() if row.startswith("READER")), None)
    assert line, err[-3000:]
    counts = json.loads(line.split(" ", 1)[1])
    assert counts["loads"] > 0 and counts["warm"] == counts["loads"] and counts["wrong"] == 0, counts
