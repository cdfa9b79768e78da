# SPDX-License-Identifier: Apache-2.0
"""The warm read serves exactly the files the gate verified: a host sidecar or a tensorbin
replaced after the gate, or renamed over at the moment ttnn opens it, is never served (the load
builds cold and returns the checkpoint's weights, or says why)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import ttnn

from models.common import weight_cache as wc
from models.common.checkpoint import CheckpointError
from models.common.weight_cache.host_sidecar import write_host_sidecar
from models.common.weight_cache.marker import read_marker
from models.gemma import Gemma3Loader
from models.gemma.loader import HOST_EMBEDDING
from models.llama import LlamaLoader
from models.testing.tiny_models import make_checkpoint, tensors_of


def same(a: dict[str, list[torch.Tensor]], b: dict[str, list[torch.Tensor]]) -> bool:
    return a.keys() == b.keys() and all(
        all(torch.equal(x, y) for x, y in zip(a[k], b[k], strict=True)) for k in a
    )


def zeroed_like(sidecar: Path, into: Path) -> None:
    """A sidecar with the same keys, shapes and dtypes as ``sidecar``, every value zero."""
    from models.common.safetensors_file import SafetensorsFile

    original = SafetensorsFile(sidecar)
    write_host_sidecar(into, {name: torch.zeros_like(original.tensor(name)) for name in original.names()})


def after_the_gate(loader, action) -> None:
    """Run ``action`` each time the loader's gate has just said warm (a replace in the window
    between the gate's verdict and the read)."""
    gate = loader.status

    def status(*args, **kwargs):
        verdict = gate(*args, **kwargs)
        if verdict.warm:
            action(verdict)
        return verdict

    loader.status = status


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory) -> Path:
    """A tiny Gemma 3 checkpoint: its token embedding is a host weight, kept in the sidecar."""
    return make_checkpoint("gemma3", tmp_path_factory.mktemp("gemma3") / "tiny-gemma3")


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return make_checkpoint("llama", tmp_path_factory.mktemp("llama") / "tiny-llama")


def test_a_host_sidecar_replaced_after_the_gate_is_never_served(gemma3, cache_root, tmp_path):
    checkpoint = gemma3
    reference = Gemma3Loader(checkpoint, precision="bfloat16").load()
    embedding = reference.host_weights[HOST_EMBEDDING]
    assert embedding.abs().sum() > 0
    loader = Gemma3Loader(checkpoint, precision="bfloat16")
    marker = read_marker(loader.paths)
    sidecar = loader.cache_dir / marker.host_sidecar.path
    zeros = tmp_path / "zeros.safetensors"
    zeroed_like(sidecar, zeros)

    def replace(_):
        if zeros.exists():
            os.replace(zeros, sidecar)  # same keys, same size: only the values differ

    after_the_gate(loader, replace)
    loaded = loader.load()
    assert not zeros.exists()  # the replace happened
    assert not loaded.warm and torch.equal(loaded.host_weights[HOST_EMBEDDING], embedding)
    assert Gemma3Loader(checkpoint, precision="bfloat16").load().warm


def test_a_host_sidecar_replaced_after_the_gate_is_never_served_cache_only(gemma3, cache_root, tmp_path):
    checkpoint = shutil.copytree(gemma3, tmp_path / "tiny-gemma3")
    Gemma3Loader(checkpoint, precision="bfloat16").load()
    for weights in checkpoint.glob("*.safetensors"):
        weights.unlink()  # a cache-only deploy: no cold fallback, so a clear error
    loader = Gemma3Loader(checkpoint, precision="bfloat16")
    marker = read_marker(loader.paths)
    sidecar = loader.cache_dir / marker.host_sidecar.path
    zeroed_like(sidecar, tmp_path / "zeros.safetensors")
    after_the_gate(loader, lambda _: os.replace(tmp_path / "zeros.safetensors", sidecar))
    with pytest.raises(wc.WeightCacheError, match="host sidecar .* changed after the gate"):
        loader.load()


def test_the_seed_api_never_serves_a_host_sidecar_replaced_after_the_gate(seeded_cache, tmp_path):
    sidecar = wc.VariantPaths(seeded_cache.root).host_sidecar
    assert wc.weight_cache_status(wc.VariantPaths(seeded_cache.root), **seeded_cache.gate_kwargs()).warm
    zeroed_like(sidecar, tmp_path / "zeros.safetensors")
    os.replace(tmp_path / "zeros.safetensors", sidecar)
    with pytest.raises(wc.WeightCacheError, match="host sidecar"):
        wc.build_cached_state_dict(seeded_cache.root)
    assert wc.load_host_sidecar(seeded_cache.root) is None


def test_a_tensorbin_renamed_over_as_ttnn_opens_it_is_never_served(llama, cache_root, tmp_path, monkeypatch):
    checkpoint = llama
    reference = tensors_of(LlamaLoader(checkpoint, precision="bfloat16").load())
    loader = LlamaLoader(checkpoint, precision="bfloat16")
    marker = read_marker(loader.paths)
    victim = loader.cache_dir / next(r.path for r in marker.files if "layers.0/attention.wqkv" in r.path)
    intruder = loader.cache_dir / next(r.path for r in marker.files if "layers.1/attention.wqkv" in r.path)
    spare = tmp_path / "intruder.tensorbin"
    shutil.copyfile(intruder, spare)  # another weight's file, the same size
    load = ttnn._ttnn.tensor.load_tensor_flatbuffer  # what ttnn.load_tensor and ttnn.as_tensor open files with
    renamed = []

    def racing_load(name, *args, **kwargs):
        if not renamed and "layers.0/attention.wqkv" in os.readlink(name):  # the sealed copy of the victim
            os.replace(spare, victim)  # the rename lands between every check and ttnn's own open
            renamed.append(name)
        return load(name, *args, **kwargs)

    monkeypatch.setattr(ttnn._ttnn.tensor, "load_tensor_flatbuffer", racing_load)
    loaded = loader.load()
    assert renamed
    assert loaded.warm and same(tensors_of(loaded), reference)  # ttnn maps the copy of the file the gate verified


def test_a_fifo_renamed_over_a_tensorbin_after_the_gate_is_cold_not_a_hang(llama, cache_root, tmp_path):
    checkpoint = llama
    reference = tensors_of(LlamaLoader(checkpoint, precision="bfloat16").load())
    loader = LlamaLoader(checkpoint, precision="bfloat16")
    marker = read_marker(loader.paths)
    victim = loader.cache_dir / marker.files[0].path
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    after_the_gate(loader, lambda _: fifo.exists() and os.replace(fifo, victim))
    loaded = loader.load()
    assert not loaded.warm and same(tensors_of(loaded), reference)


def test_a_tensorbin_renamed_over_after_the_gate_is_cold(llama, cache_root, tmp_path, captured_warnings):
    reference = tensors_of(LlamaLoader(llama, precision="bfloat16").load())
    loader = LlamaLoader(llama, precision="bfloat16")
    marker = read_marker(loader.paths)
    victim = loader.cache_dir / next(r.path for r in marker.files if "layers.0/attention.wqkv" in r.path)
    spare = tmp_path / "intruder.tensorbin"
    shutil.copyfile(loader.cache_dir / next(r.path for r in marker.files if "layers.1/attention.wqkv" in r.path), spare)
    after_the_gate(loader, lambda _: spare.exists() and os.replace(spare, victim))
    loaded = loader.load()
    assert not spare.exists()
    assert not loaded.warm and same(tensors_of(loaded), reference)
    assert f"{victim} changed after the gate verified it" in captured_warnings()


RACER = """
import os, sys, time
from pathlib import Path
victim, original, intruder, stop = map(Path, sys.argv[1:5])
temp = victim.with_name(".racer.tmp")
rounds = 0
print("racing", flush=True)
while not stop.exists():
    for source in (intruder, original):  # another weight's file over it, then its own again
        os.link(source, temp)
        os.replace(temp, victim)
        time.sleep(0.0005)
    rounds += 1
print(rounds, flush=True)
"""


@pytest.mark.slow
def test_a_racing_process_renaming_tensorbins_over_is_never_served(llama, cache_root, tmp_path):
    """A process renames another weight's tensorbin over one of a cache-only deploy's, and its own
    back, as fast as it can, for many warm loads: each load is the right weights or a clear error."""
    deploy = shutil.copytree(llama, tmp_path / "deploy")
    reference = tensors_of(LlamaLoader(deploy, precision="bfloat16").load())
    for weights in deploy.glob("*.safetensors"):
        weights.unlink()  # cache-only: no rebuild moves the files away from the racer
    loader = LlamaLoader(deploy, precision="bfloat16")
    marker = read_marker(loader.paths)
    victim = loader.cache_dir / next(r.path for r in marker.files if "layers.0/attention.wqkv" in r.path)
    original, intruder = tmp_path / "original.tensorbin", tmp_path / "intruder.tensorbin"
    os.link(victim, original)
    shutil.copyfile(loader.cache_dir / next(r.path for r in marker.files if "layers.1/attention.wqkv" in r.path),
                    intruder)
    stop = tmp_path / "stop"
    racer = subprocess.Popen([sys.executable, "-c", RACER, str(victim), str(original), str(intruder), str(stop)],
                             stdout=subprocess.PIPE, text=True)
    served = refused = 0
    try:
        assert racer.stdout.readline().strip() == "racing"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                loaded = LlamaLoader(deploy, precision="bfloat16").load()
            except (CheckpointError, wc.WeightCacheError):
                refused += 1
                continue
            assert loaded.warm and same(tensors_of(loaded), reference), f"wrong weights served after {served} loads"
            served += 1
    finally:
        stop.touch()
        rounds = int(racer.communicate(timeout=60)[0].split()[-1])
    assert rounds > 100 and served + refused > 20, (rounds, served, refused)


def test_a_warm_load_makes_its_variant_paths_once(llama, cache_root):
    """The gate, the warm read and the use record of one load share one ``VariantPaths``: the
    seed's ``(cache_dir, build_variant)`` pair is not rebuilt into paths along the way."""
    LlamaLoader(llama, precision="bfloat16").load()
    made = []
    post_init = wc.VariantPaths.__post_init__.__code__

    def count(frame, event, _arg):
        if event == "call" and frame.f_code is post_init:
            made.append(frame.f_locals["self"])

    loader = LlamaLoader(llama, precision="bfloat16")
    sys.setprofile(count)
    threading.setprofile(count)
    try:
        loaded = loader.load()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    assert loaded.warm
    assert made == [loader.paths], made
