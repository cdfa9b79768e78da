# SPDX-License-Identifier: Apache-2.0
"""Identity covers everything that changes the weights, through the public loaders: the bytes of
every shard the index names (in any subfolder), hub blobs checked against their names, the weights
behind a fixed ``cache_dir=``, a same-size rewrite inside one tick of a coarse file-system clock,
and a cache-only deploy whose config computes another model. The same weights under two folder
names share one cache."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from models.common.checkpoint import CheckpointError, checkpoint_files
from models.common.weight_cache.identity import BOOKKEEPING_CONFIG_FIELDS, content_id
from models.common.weight_cache.layout import CacheRoot
from models.common.weight_cache.stamps import FINE_TICK_NS, FileStamp, StampIndex
from models.llama import LlamaLoader
from models.testing.mounts import ext4
from models.testing.tiny_models import as_hub_snapshot, make_checkpoint, tensors_of


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("identity-models")
    return {"a": make_checkpoint("llama", base / "a" / "tiny-llama", seed=0),
            "b": make_checkpoint("llama", base / "b" / "tiny-llama", seed=1)}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(all(x.equal(y) for x, y in zip(a[k], b[k], strict=True)) for k in a)


def copy_checkpoint(source: Path, target: Path) -> Path:
    return shutil.copytree(source, target, copy_function=shutil.copyfile)  # cp -r: new inodes, new times


def ident(directory: Path, tmp_path: Path) -> str:
    return content_id(directory, StampIndex(tmp_path / "stamps.json"))


# -- the content id ---------------------------------------------------------------------------


def test_content_id_follows_bytes_not_names_or_stamps(models, tmp_path):
    original = ident(models["a"], tmp_path)
    assert ident(copy_checkpoint(models["a"], tmp_path / "copy" / "elsewhere"), tmp_path) == original
    assert ident(models["b"], tmp_path) != original  # same folder name, other weights
    os.utime(models["a"] / "model.safetensors")  # touched, same bytes: re-hashed, same id
    assert ident(models["a"], tmp_path) == original


def perturbed(value):
    """Another value of the same kind (a number moved, a flag flipped, a text, list or table grown)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value * 2 + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, list):
        return [*value, value[-1] if value else 1]
    if isinstance(value, dict):
        return {**value, "added": 1}
    return 1  # None


def with_config(source: Path, target: Path, config: dict) -> Path:
    """A copy of ``source`` whose config.json is ``config``."""
    checkpoint = copy_checkpoint(source, target)
    (checkpoint / "config.json").write_text(json.dumps(config, indent=2))
    return checkpoint


@pytest.fixture(scope="module")
def gemma_model(tmp_path_factory) -> Path:
    return make_checkpoint("gemma3", tmp_path_factory.mktemp("identity-gemma") / "tiny-gemma3")


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_every_config_field_but_the_bookkeeping_ones_changes_the_content_id(family, models, gemma_model, tmp_path):
    """One list (``BOOKKEEPING_CONFIG_FIELDS``) says which config.json fields cannot change the
    computation; every other field of a real config, changed or dropped, and a field added, is
    another id. The listed ones (the transformers version of the environment that wrote it), and
    the layout of the JSON, are not."""
    source = models["a"] if family == "llama" else gemma_model
    config = json.loads((source / "config.json").read_text())
    original = ident(source, tmp_path)
    assert {"num_attention_heads", "num_key_value_heads", "vocab_size", "dtype", "transformers_version"} <= set(config)
    assert '"rope_theta"' in json.dumps(config)
    for index, (key, value) in enumerate(config.items()):
        changed = with_config(source, tmp_path / f"changed-{index}", {**config, key: perturbed(value)})
        dropped = with_config(source, tmp_path / f"dropped-{index}", {k: v for k, v in config.items() if k != key})
        expect_same = key in BOOKKEEPING_CONFIG_FIELDS
        assert (ident(changed, tmp_path) == original) == expect_same, key
        assert (ident(dropped, tmp_path) == original) == expect_same, key
    for key in sorted(BOOKKEEPING_CONFIG_FIELDS):
        added = with_config(source, tmp_path / f"added-{key}", {**config, key: "4.57.1"})
        assert ident(added, tmp_path) == original, key
    assert ident(with_config(source, tmp_path / "new-field", {**config, "new_field": 1}), tmp_path) != original
    rope = json.loads(json.dumps(config).replace('"rope_theta": ', '"rope_theta": 1'))  # every rope_theta, nested too
    assert ident(with_config(source, tmp_path / "rope", rope), tmp_path) != original
    reordered = with_config(source, tmp_path / "reordered", dict(reversed(list(config.items()))))
    (reordered / "config.json").write_text(json.dumps(dict(reversed(list(config.items())))))  # no indent either
    assert ident(reordered, tmp_path) == original


def test_a_stamped_checkpoint_is_not_read_again(models, tmp_path):
    checkpoint = copy_checkpoint(models["a"], tmp_path / "model")
    time.sleep(0.1)  # past the file system's clock tick: the stamps settle
    stamps = StampIndex(tmp_path / "stamps.json")
    content_id(checkpoint, stamps)
    assert len(stamps) == 1  # the weights, hashed once (config.json is read each time: a few hundred bytes)
    before = _read_bytes()
    content_id(checkpoint, StampIndex(tmp_path / "stamps.json"))
    assert _read_bytes() - before < (checkpoint / "model.safetensors").stat().st_size // 2


def test_a_stamp_is_recorded_only_once_it_has_settled(tmp_path):
    """The racy-clock rule itself: a hash begun within a tick of the file's last change vouches
    for nothing later (a rewrite in that tick keeps the stamp)."""
    path = tmp_path / "file"
    path.write_bytes(b"x" * 100)
    stamp = FileStamp.of(path.stat())
    index = StampIndex(tmp_path / "stamps.json")
    index.record("file", stamp, "d" * 64, verified_ns=stamp.mtime_ns + FINE_TICK_NS - 1, tick_ns=FINE_TICK_NS)
    assert index.lookup("file", stamp) is None
    index.record("file", stamp, "d" * 64, verified_ns=max(stamp.mtime_ns, stamp.ctime_ns) + FINE_TICK_NS,
                 tick_ns=FINE_TICK_NS)
    assert index.lookup("file", stamp) == "d" * 64
    index.save(keep=[])
    assert len(StampIndex(tmp_path / "stamps.json")) == 0  # pruned to the files its owner keeps


def _read_bytes() -> int:
    """Bytes this process read through read(2) so far (the kernel's own count)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


# -- scenarios, through the loader ------------------------------------------------------------


def test_a_hub_blob_whose_bytes_differ_from_its_name_never_poisons_a_shared_cache(models, tmp_path, monkeypatch):
    """Two hosts share one cache root: host A's blob was edited through its snapshot symlink
    (same size, other bytes), host B's is genuine. A builds first; B must get the genuine weights."""
    cache_root = tmp_path / "shared-cache"
    monkeypatch.setenv("TT_CACHE_PATH", str(cache_root))
    hubs = {}
    for host in ("a", "b"):
        hubs[host] = tmp_path / f"hub-{host}"
        snapshot = as_hub_snapshot(models["a"], hubs[host], "acme/tiny-llama")
        blob = hubs[host] / "models--acme--tiny-llama" / "blobs" / _sha256(snapshot / "model.safetensors")
        blob.parent.mkdir(exist_ok=True)
        os.replace(snapshot / "model.safetensors", blob)
        (snapshot / "model.safetensors").symlink_to(os.path.relpath(blob, snapshot))
    blob_a = (hubs["a"] / "models--acme--tiny-llama" / "snapshots" / "0123456789abcdef" / "model.safetensors").resolve()
    data = bytearray(blob_a.read_bytes())
    data[-4096:] = bytes(4096)  # an edit through the snapshot symlink: same size, other weights
    blob_a.write_bytes(bytes(data))

    monkeypatch.setenv("HF_HUB_CACHE", str(hubs["a"]))
    host_a = LlamaLoader("acme/tiny-llama", precision="bfloat16")
    assert not host_a.load().warm
    monkeypatch.setenv("HF_HUB_CACHE", str(hubs["b"]))
    host_b = LlamaLoader("acme/tiny-llama", precision="bfloat16")
    assert host_b.content_id != host_a.content_id
    loaded = host_b.load()
    genuine = LlamaLoader(models["a"], precision="bfloat16", cache_root=tmp_path / "reference").load()
    assert not loaded.warm and same(tensors_of(loaded), tensors_of(genuine))


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_new_weights_behind_a_fixed_cache_dir_build_cold(models, tmp_path):
    """tt-metal's habit: one fixed cache dir per model. Replacing the weights at the same path is
    another content id: cold, and the new weights."""
    checkpoint = copy_checkpoint(models["a"], tmp_path / "model")
    fixed = tmp_path / "fixed-cache"
    assert not LlamaLoader(checkpoint, precision="bfloat16", cache_dir=fixed).load().warm
    shutil.copyfile(models["b"] / "model.safetensors", checkpoint / "model.safetensors")
    loaded = LlamaLoader(checkpoint, precision="bfloat16", cache_dir=fixed).load()
    reference = LlamaLoader(models["b"], precision="bfloat16", cache_root=tmp_path / "reference").load()
    assert not loaded.warm and "other weights" in loaded.reason and same(tensors_of(loaded), tensors_of(reference))


def test_a_changed_shard_in_a_subfolder_is_a_new_identity(models, tmp_path, cache_root):
    checkpoint = tmp_path / "sharded"
    (checkpoint / "weights").mkdir(parents=True)
    shutil.copyfile(models["a"] / "config.json", checkpoint / "config.json")
    state = load_file(models["a"] / "model.safetensors")
    names = sorted(state)
    halves = {"weights/model-00001-of-00002.safetensors": names[::2], "weights/model-00002-of-00002.safetensors": names[1::2]}
    for shard, keys in halves.items():
        save_file({k: state[k] for k in keys}, str(checkpoint / shard))
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: shard for shard, keys in halves.items() for k in keys}}))
    assert "weights/model-00002-of-00002.safetensors" in checkpoint_files(checkpoint).identity_files
    first = LlamaLoader(checkpoint, precision="bfloat16").load()
    other = load_file(models["b"] / "model.safetensors")
    save_file({k: other[k] for k in halves["weights/model-00002-of-00002.safetensors"]},
              str(checkpoint / "weights/model-00002-of-00002.safetensors"))
    second = LlamaLoader(checkpoint, precision="bfloat16").load()
    assert not second.warm and not same(tensors_of(first), tensors_of(second))


def test_an_index_naming_a_file_outside_the_checkpoint_is_a_clear_error(models, tmp_path, cache_root):
    checkpoint = copy_checkpoint(models["a"], tmp_path / "escaping")
    os.replace(checkpoint / "model.safetensors", tmp_path / "model.safetensors")
    names = list(load_file(tmp_path / "model.safetensors"))
    (checkpoint / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {name: "../model.safetensors" for name in names}}))
    with pytest.raises(CheckpointError, match="outside the checkpoint directory"):
        LlamaLoader(checkpoint, precision="bfloat16").load()


@pytest.fixture
def coarse_clock_dir(tmp_path) -> Path:
    """A real file system with a one-second clock (ext4 with 128-byte inodes keeps whole seconds,
    as FAT and many NFS servers do), loop-mounted; skipped where mounting is not allowed."""
    with ext4(tmp_path / "coarse", 64, mkfs_options=("-I", "128")) as mount_point:
        yield mount_point


def test_a_same_size_rewrite_within_one_clock_tick_is_not_missed(models, tmp_path, cache_root, coarse_clock_dir):
    """Hashed, then rewritten in place with other bytes of the same size within the same second:
    the stamp cannot show it, so the stamp must not have been trusted (git's racy clean)."""
    for_a = LlamaLoader(models["a"], precision="bfloat16")
    for_a.load()  # a warm cache of weights A, which a stale digest would serve
    checkpoint = coarse_clock_dir / "tiny-llama"
    checkpoint.mkdir()
    shutil.copyfile(models["a"] / "config.json", checkpoint / "config.json")
    weights_b = (models["b"] / "model.safetensors").read_bytes()
    time.sleep(1 - time.time() % 1)  # start of a second: the steps below fit in one
    shutil.copyfile(models["a"] / "model.safetensors", checkpoint / "model.safetensors")
    assert LlamaLoader(checkpoint, precision="bfloat16").content_id == for_a.content_id  # hashed and stamped
    with open(checkpoint / "model.safetensors", "r+b") as stream:  # in place: same inode, same size
        stream.write(weights_b)
    assert time.time() % 1 < 0.9, "the rewrite did not fall in the second of the hash: rerun"
    loaded = LlamaLoader(checkpoint, precision="bfloat16").load()
    reference = LlamaLoader(models["b"], precision="bfloat16", cache_root=tmp_path / "reference").load()
    assert not loaded.warm and same(tensors_of(loaded), tensors_of(reference))


def test_a_cache_only_deploy_with_another_config_is_a_clear_error(models, tmp_path, cache_root):
    """The deploy keeps config and tokenizer, no weights; its config says another rope theta for
    the same tensor shapes: served warm it would compute another model on the old weights."""
    deploy = copy_checkpoint(models["a"], tmp_path / "deploy" / "tiny-llama")
    LlamaLoader(deploy, precision="bfloat16").load()
    for weights in deploy.glob("*.safetensors"):
        weights.unlink()
    assert LlamaLoader(deploy, precision="bfloat16").load().warm  # the deploy as built: served
    config = json.loads((deploy / "config.json").read_text())
    rope = config.get("rope_parameters") or config
    rope["rope_theta"] = 123.0
    config["eos_token_id"] = 7  # a generation setting: may differ, and is not named
    (deploy / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="differs from the config") as error:
        LlamaLoader(deploy, precision="bfloat16").load()
    field = "rope_parameters" if "rope_parameters" in config else "rope_theta"
    assert field in str(error.value) and "eos_token_id" not in str(error.value)


def test_the_same_weights_under_two_folder_names_share_one_cache(models, tmp_path, cache_root):
    elsewhere = copy_checkpoint(models["a"], tmp_path / "data" / "llama-3.2-1b")
    first = LlamaLoader(models["a"], precision="bfloat16")
    assert not first.load().warm
    second = LlamaLoader(elsewhere, precision="bfloat16")
    assert second.cache_dir == first.cache_dir and second.load().warm
    assert len(CacheRoot(cache_root).model_dirs()) == 1
    for weights in elsewhere.glob("*.safetensors"):
        weights.unlink()  # now a cache-only deploy under the second name: it finds the shared cache
    assert LlamaLoader(elsewhere, precision="bfloat16").load().warm


WARM_READS = """
import sys
from models.llama import LlamaLoader
def rchar():
    return int(next(l for l in open('/proc/self/io') if l.startswith('rchar:')).split()[1])
loader = LlamaLoader(sys.argv[1], precision="bfloat16", prefetch=0)
before = rchar()
loaded = loader.load()
copied = sum(p.stat().st_size for p in loaded.cache_dir.rglob("*") if p.is_file() and not p.name.startswith(".build"))
print("WARM" if loaded.warm else "COLD", rchar() - before - copied)
"""


def test_a_warm_start_of_a_verified_checkpoint_reads_none_of_its_weights(models, tmp_path, cache_root):
    """Verified once, recognised by its stamps afterwards: a warm start in a fresh process reads
    a fraction of the weights' bytes besides the cache's own files (each copied once, as read)."""
    import subprocess
    import sys

    checkpoint = copy_checkpoint(models["a"], tmp_path / "verified")
    time.sleep(0.1)  # past the clock tick of the copy
    LlamaLoader(checkpoint, precision="bfloat16").load()
    out = subprocess.run([sys.executable, "-c", WARM_READS, str(checkpoint)], capture_output=True, text=True,
                         env=dict(os.environ), timeout=300)
    state, read = next(line for line in out.stdout.splitlines() if line.startswith(("WARM", "COLD"))).split()
    assert state == "WARM" and int(read) < (checkpoint / "model.safetensors").stat().st_size // 4, out.stdout
