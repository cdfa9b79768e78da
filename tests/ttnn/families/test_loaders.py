# SPDX-License-Identifier: Apache-2.0
"""Family loaders end to end on real ttnn (host side, mock cluster) and real safetensors checkpoints.

The layout proof: a tensor-parallel host forward that reads the weights back from the cached ttnn
tensors must reproduce transformers' logits of the same checkpoint."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from models.common.checkpoint import CheckpointError
from models.common.reference import ReferenceDecoder
from models.common.weight_cache.tensor_cache import host_shards
from models.common.weight_cache import DEFAULT_FORCE_ENV, marker_path, read_marker, verify_weight_cache
from models.gemma import Gemma3Loader
from models.llama import LlamaLoader
from models.qwen3 import Qwen3Loader, Qwen3MoeLoader
from models.testing.tiny_models import WARM_START_PROBE, as_hub_snapshot, hf_greedy, hf_logits, make_checkpoint, pcc, tensors_of

LOADERS = {"llama": LlamaLoader, "qwen3": Qwen3Loader, "qwen3_moe": Qwen3MoeLoader, "gemma3": Gemma3Loader}
PROMPT = [1, 5, 77, 300, 12, 9, 400, 33]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("checkpoints")
    made = {family: make_checkpoint(family, root / f"tiny-{family}") for family in LOADERS}
    # One checkpoint sharded into several files with an index.
    made["llama_sharded"] = make_checkpoint("llama", root / "tiny-llama-sharded", max_shard_size="200KB")
    return made


@pytest.fixture(scope="module")
def reference_logits(checkpoints) -> dict[str, torch.Tensor]:
    return {family: hf_logits(checkpoints[family], PROMPT) for family in LOADERS}


@pytest.mark.parametrize("family", list(LOADERS))
@pytest.mark.parametrize("mesh", [(1, 1), (1, 2)])
def test_bfloat16_cache_reproduces_transformers_logits(family, mesh, checkpoints, reference_logits, cache_root):
    loaded = LOADERS[family](checkpoints[family], mesh_shape=mesh, precision="bfloat16").load()
    assert not loaded.warm
    logits = ReferenceDecoder(loaded).logits(PROMPT)
    expected = reference_logits[family]
    assert (logits - expected).abs().max().item() < 1e-3  # same bf16 weights, fp32 math either side
    assert torch.equal(logits.argmax(-1), expected.argmax(-1))


@pytest.mark.parametrize("family", list(LOADERS))
def test_bfloat16_warm_cache_greedy_matches_transformers_for_8_steps(family, checkpoints, cache_root):
    LOADERS[family](checkpoints[family], mesh_shape=(1, 2), precision="bfloat16").load()
    warm = LOADERS[family](checkpoints[family], mesh_shape=(1, 2), precision="bfloat16").load()
    assert warm.warm
    assert ReferenceDecoder(warm).greedy(PROMPT, 8) == hf_greedy(checkpoints[family], PROMPT, 8)


@pytest.mark.parametrize("family", list(LOADERS))
@pytest.mark.parametrize("mesh", [(1, 1), (1, 8)])
def test_bfloat8_b_cache_logits_pcc(family, mesh, checkpoints, reference_logits, cache_root):
    loaded = LOADERS[family](checkpoints[family], mesh_shape=mesh, precision="bfloat8_b").load()
    assert pcc(ReferenceDecoder(loaded).logits(PROMPT), reference_logits[family]) >= 0.99


def test_galaxy_mesh_2d_layout_reproduces_logits(checkpoints, reference_logits, cache_root):
    loaded = Qwen3MoeLoader(checkpoints["qwen3_moe"], mesh_shape="TG", precision="bfloat16").load()
    assert len(host_shards(loaded.weights["layers.0.attention.wqkv"])) == 32
    logits = ReferenceDecoder(loaded).logits(PROMPT)
    assert (logits - reference_logits["qwen3_moe"]).abs().max().item() < 1e-3


@pytest.mark.parametrize("family", list(LOADERS))
def test_warm_build_is_bit_identical_to_cold(family, checkpoints, cache_root):
    cold = LOADERS[family](checkpoints[family], mesh_shape=(1, 2), precision="bfloat8_b").load()
    warm = LOADERS[family](checkpoints[family], mesh_shape=(1, 2), precision="bfloat8_b").load()
    assert not cold.warm and warm.warm
    cold_tensors, warm_tensors = tensors_of(cold), tensors_of(warm)
    assert cold_tensors.keys() == warm_tensors.keys()
    for name in cold_tensors:
        assert all(torch.equal(a, b) for a, b in zip(cold_tensors[name], warm_tensors[name], strict=True)), name


def test_warm_build_reads_no_checkpoint_file(checkpoints, cache_root, tmp_path):
    checkpoint = shutil.copytree(checkpoints["qwen3"], tmp_path / "tiny-qwen3")
    cold = Qwen3Loader(checkpoint, precision="bfloat16").load()
    for weights in checkpoint.glob("*.safetensors"):
        weights.unlink()
    warm = Qwen3Loader(checkpoint, precision="bfloat16").load()
    assert warm.warm
    assert torch.equal(ReferenceDecoder(warm).logits(PROMPT), ReferenceDecoder(cold).logits(PROMPT))


def test_cache_only_deploy_needs_no_checkpoint_at_all(checkpoints, cache_root, tmp_path):
    checkpoint = shutil.copytree(checkpoints["llama"], tmp_path / "tiny-llama")
    LlamaLoader(checkpoint, precision="bfloat16").load()
    shutil.rmtree(checkpoint)
    warm = LlamaLoader(checkpoint, precision="bfloat16").load()
    assert warm.warm and warm.args.n_layers == 2 and warm.args.rope_scaling["rope_type"] == "llama3"


def test_cold_cache_without_checkpoint_is_a_clear_error(cache_root, tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint"):
        LlamaLoader(tmp_path / "nowhere", precision="bfloat16").load()


@pytest.mark.parametrize(
    "change",
    [dict(mesh_shape=(1, 2)), dict(precision="bfloat16"), dict(num_layers=1)],
    ids=["other-mesh", "other-precision", "fewer-layers"],
)
def test_a_different_build_is_cold(change, checkpoints, cache_root):
    LlamaLoader(checkpoints["llama"], mesh_shape=(1, 1), precision="bfloat8_b").load()
    options = dict(mesh_shape=(1, 1), precision="bfloat8_b") | change
    assert not LlamaLoader(checkpoints["llama"], **options).load().warm


def test_num_layers_build_lives_apart_and_never_touches_the_full_build(checkpoints, cache_root):
    full = LlamaLoader(checkpoints["llama"], precision="bfloat16")
    full.load()
    full_marker = marker_path(full.cache_dir, full.build_variant)
    before = full_marker.stat()
    debug = LlamaLoader(checkpoints["llama"], num_layers=1, precision="bfloat16")
    loaded = debug.load()
    assert loaded.args.n_layers == 1 and not loaded.warm
    assert debug.cache_dir != full.cache_dir and not debug.cache_dir.is_relative_to(full.cache_dir)
    assert LlamaLoader(checkpoints["llama"], num_layers=1, precision="bfloat16").load().warm
    after = full_marker.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    again = LlamaLoader(checkpoints["llama"], precision="bfloat16").load()
    assert again.warm and again.args.n_layers == 2


def test_force_env_rebuilds_and_remarks(checkpoints, cache_root, monkeypatch):
    loader = LlamaLoader(checkpoints["llama"], precision="bfloat16")
    loader.load()
    before = marker_path(loader.cache_dir, loader.build_variant).stat().st_ino
    monkeypatch.setenv(DEFAULT_FORCE_ENV, "1")
    forced = LlamaLoader(checkpoints["llama"], precision="bfloat16").load()
    assert not forced.warm and DEFAULT_FORCE_ENV in forced.reason
    assert marker_path(loader.cache_dir, loader.build_variant).stat().st_ino != before
    monkeypatch.delenv(DEFAULT_FORCE_ENV)
    assert LlamaLoader(checkpoints["llama"], precision="bfloat16").load().warm


def test_moe_facts_restored_on_warm_build_with_more_than_ten_experts(checkpoints, cache_root):
    Qwen3MoeLoader(checkpoints["qwen3_moe"], precision="bfloat16").load()
    loader = Qwen3MoeLoader(checkpoints["qwen3_moe"], precision="bfloat16")
    marker = read_marker(loader.paths)
    assert marker.is_moe and marker.model_info["num_experts"] == 12
    warm = loader.load()
    assert warm.warm and warm.args.is_mixture_of_experts and warm.args.num_experts == 12
    assert warm.args.moe_layers == (1,)
    assert tuple(warm.weights["layers.1.feed_forward.experts.w1"].shape)[0] == 12


def test_sharded_checkpoint_loads_like_single_file(checkpoints, cache_root):
    assert len(list(checkpoints["llama_sharded"].glob("*.safetensors"))) > 1
    sharded = LlamaLoader(checkpoints["llama_sharded"], precision="bfloat16").load()
    expected = hf_logits(checkpoints["llama_sharded"], PROMPT)
    assert (ReferenceDecoder(sharded).logits(PROMPT) - expected).abs().max().item() < 1e-3


def test_hf_id_local_dir_and_hub_snapshot_share_one_cache(checkpoints, cache_root, tmp_path, monkeypatch):
    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snapshot = as_hub_snapshot(checkpoints["qwen3"], hub, "acme/tiny-qwen3")
    local = shutil.copytree(checkpoints["qwen3"], tmp_path / "tiny-qwen3")
    by_snapshot = Qwen3Loader(snapshot, precision="bfloat16")
    by_id = Qwen3Loader("acme/tiny-qwen3", precision="bfloat16")
    by_dir = Qwen3Loader(local, precision="bfloat16")
    assert by_snapshot.cache_dir == by_id.cache_dir == by_dir.cache_dir
    assert by_id.checkpoint_dir == snapshot
    assert not by_snapshot.load().warm
    assert by_id.load().warm


def test_changed_checkpoint_makes_the_cache_cold(checkpoints, cache_root, tmp_path):
    checkpoint = shutil.copytree(checkpoints["llama"], tmp_path / "tiny-llama")
    LlamaLoader(checkpoint, precision="bfloat16").load()
    before = LlamaLoader(checkpoint, precision="bfloat16").cache_dir
    make_checkpoint("llama", checkpoint, seed=1)  # same name, new weights
    loader = LlamaLoader(checkpoint, precision="bfloat16")
    rebuilt = loader.load()
    assert not rebuilt.warm and loader.cache_dir != before  # the content names the cache
    assert torch.allclose(ReferenceDecoder(rebuilt).logits(PROMPT), hf_logits(checkpoint, PROMPT), atol=1e-3)


def test_truncated_tensorbin_makes_gate_cold_and_rebuild_repairs(checkpoints, cache_root):
    loader = LlamaLoader(checkpoints["llama"], precision="bfloat16")
    loader.load()
    victim = next(loader.cache_dir.rglob("*wqkv*.tensorbin"))
    os.truncate(victim, victim.stat().st_size // 2)
    status = loader.status()
    assert not status.warm and victim.name in status.reason
    assert not LlamaLoader(checkpoints["llama"], precision="bfloat16").load().warm
    assert verify_weight_cache(loader.paths) == []
    assert LlamaLoader(checkpoints["llama"], precision="bfloat16").load().warm


def test_rewritten_tensorbin_of_the_right_size_is_rehashed_and_cold(checkpoints, cache_root):
    loader = LlamaLoader(checkpoints["llama"], precision="bfloat16")
    loader.load()
    victim = next(loader.cache_dir.rglob("*wqkv*.tensorbin"))
    victim.write_bytes(b"\xff" * victim.stat().st_size)  # same size, new mtime/ctime: re-hashed
    status = loader.status()
    assert not status.warm and "content differs" in status.reason
    rebuilt = LlamaLoader(checkpoints["llama"], precision="bfloat16").load()
    assert not rebuilt.warm and "content differs" in rebuilt.reason
    assert verify_weight_cache(loader.paths) == []


def test_deep_verify_names_a_same_size_corrupted_file(checkpoints, cache_root):
    loader = LlamaLoader(checkpoints["llama"], precision="bfloat16")
    loader.load()
    victim = next(loader.cache_dir.rglob("output_*.tensorbin"))
    data = bytearray(victim.read_bytes())
    data[-5] ^= 0x40
    victim.write_bytes(bytes(data))
    problems = verify_weight_cache(loader.paths)
    assert len(problems) == 1 and victim.name in problems[0]


@pytest.mark.parametrize("family", ["llama", "qwen3_moe", "gemma3"])
def test_warm_start_process_imports_nothing_heavy(family, checkpoints, cache_root):
    """A warm start pays only for torch + ttnn: no transformers, and no torch machinery that
    arithmetic on placeholders would drag in (seconds of imports per start)."""
    import subprocess
    import sys

    LOADERS[family](checkpoints[family], precision="bfloat8_b").load()
    out = subprocess.run([sys.executable, "-c", WARM_START_PROBE, family, str(checkpoints[family])],
                         env=dict(os.environ), capture_output=True, text=True)
    report = [line for line in out.stdout.splitlines() if line.startswith(("WARM", "COLD"))]
    assert report == ["WARM -"], out.stdout[-2000:] + out.stderr[-2000:]


def test_warm_build_from_a_read_only_cache(checkpoints, cache_root, readonly_view):
    LlamaLoader(checkpoints["llama"], precision="bfloat16").load()
    view = readonly_view(cache_root)
    warm = LlamaLoader(checkpoints["llama"], precision="bfloat16", cache_root=view).load()
    assert warm.warm and warm.cache_dir.is_relative_to(view)


def test_cold_build_into_a_read_only_cache_warns_and_still_builds(checkpoints, cache_root, readonly_view,
                                                                  captured_warnings):
    cache_root.mkdir(parents=True)
    view = readonly_view(cache_root)
    loaded = LlamaLoader(checkpoints["llama"], precision="bfloat16", cache_root=view).load()
    assert not loaded.warm and "not writable" in captured_warnings()
    expected = hf_logits(checkpoints["llama"], PROMPT)
    assert (ReferenceDecoder(loaded).logits(PROMPT) - expected).abs().max().item() < 1e-3
    assert not any(view.rglob("*.tensorbin")) and not any(view.rglob(".weights_complete*"))


@pytest.mark.parametrize("options, message", [(dict(precision="fp8"), "precision"),
                                              (dict(components=["audio"]), "no components")])
def test_bad_loader_options_are_clear_errors(options, message, checkpoints, cache_root):
    with pytest.raises(ValueError, match=message):
        LlamaLoader(checkpoints["llama"], **options)
