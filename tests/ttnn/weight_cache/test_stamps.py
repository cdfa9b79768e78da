# SPDX-License-Identifier: Apache-2.0
"""Stamps on real file systems and mounts: indexes stay bounded over re-seeds, hosts that see one
export on different devices never re-hash what another verified, and a read-only cache root falls
back to the user's own stamps."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from models.common.weight_cache import read_marker
from models.common.weight_cache.layout import CacheRoot, VariantPaths
from models.common.weight_cache.stamps import StampIndex
from models.llama import LlamaLoader
from models.testing.tiny_models import make_checkpoint
from models.testing.tt_cache import REPO_ROOT

# A fresh process computing a checkpoint's content id: prints the id, the checkpoint's device and the
# bytes the process read (the kernel's count) while doing it.
PROBE = """
import os, sys, json
from pathlib import Path
from models.llama import LlamaLoader
def rchar():
    return int(next(l for l in open('/proc/self/io') if l.startswith('rchar:')).split()[1])
loader = LlamaLoader(sys.argv[1], precision="bfloat16", cache_root=sys.argv[2])
before = rchar()
ident = loader.content_id
print(json.dumps({"id": ident, "read": rchar() - before, "dev": os.stat(sys.argv[1]).st_dev}))
"""


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    path = make_checkpoint("llama", tmp_path_factory.mktemp("stamp-models") / "tiny-llama")
    time.sleep(0.1)  # let the files' stamps settle before any test hashes them
    return path


def probe(checkpoint: str, cache_root: Path, prefix: list[str] | None = None, env: dict | None = None) -> dict:
    result = subprocess.run([*(prefix or []), sys.executable, "-c", PROBE, checkpoint, str(cache_root)], cwd=REPO_ROOT,
                            env=dict(os.environ, PYTHONPATH=str(REPO_ROOT), **(env or {})), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(next(line for line in result.stdout.splitlines() if line.startswith("{")))


def test_stamp_indexes_stay_bounded_over_many_reseeds(checkpoint, cache_root):
    """Forced re-seeds, each followed by a copy-like restamp of every file (rsync -a would give
    new inodes), then a warm start: the variant's index holds only the current build's files."""
    loader = LlamaLoader(checkpoint, precision="bfloat16")
    sizes = []
    for _ in range(4):
        assert LlamaLoader(checkpoint, precision="bfloat16", force=True).seed().complete
        marker = read_marker(loader.paths)
        time.sleep(0.05)
        for record in marker.all_files():
            os.utime(loader.cache_dir / record.path)  # a new stamp: re-hashed and recorded by the next start
        time.sleep(0.05)
        assert LlamaLoader(checkpoint, precision="bfloat16").load().warm
        sizes.append(len(StampIndex(VariantPaths(loader.cache_dir, loader.build_variant).stamp_index)))
        assert sizes[-1] == len(marker.all_files()), sizes
    checkpoint_stamps = list((cache_root / ".stamps" / "checkpoints").iterdir())
    # one entry, the weights' file: config.json is read each time (its canonical form), never stamped
    assert len(checkpoint_stamps) == 1 and len(StampIndex(checkpoint_stamps[0])) == 1


@pytest.fixture
def one_export_on_two_devices(tmp_path, checkpoint):
    """One ext4 image holding the checkpoint, attached to two loop devices: what two hosts mounting
    one export see (same files, inodes and times; another ``st_dev``). Root only; skipped elsewhere."""
    image = tmp_path / "export.img"
    with open(image, "wb") as stream:
        stream.truncate(64 << 20)
    staging = tmp_path / "staging"
    shutil.copytree(checkpoint, staging / "tiny-llama")
    made = subprocess.run(["mkfs.ext4", "-q", "-F", "-d", str(staging), str(image)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"mkfs.ext4 -d is not usable here: {made.stderr.strip()}")
    devices = []
    for _ in range(2):
        attached = subprocess.run(["losetup", "-f", "--show", "-r", str(image)], capture_output=True, text=True)
        if attached.returncode != 0:
            pytest.skip(f"cannot attach a loop device here (needs root): {attached.stderr.strip()}")
        devices.append(attached.stdout.strip())
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is missing: cannot give each 'host' its own mount namespace")
    yield devices
    for device in devices:
        subprocess.run(["losetup", "-d", device], check=False)


def test_hosts_that_see_one_export_on_different_devices_never_rehash(one_export_on_two_devices, tmp_path):
    """Each 'host' is a mount namespace mounting the image at the same path from its own loop
    device; they share one cache root. Only the first start reads the checkpoint."""
    mount_point = tmp_path / "mnt"
    mount_point.mkdir()
    cache_root = tmp_path / "shared-cache"
    seen = []
    first, second = one_export_on_two_devices
    for device in (first, second, first):  # the second device's first start and the first's second read nothing
        host = ["unshare", "-m", "--propagation", "private", "sh", "-c",
                f'mount -o ro,noload {device} {mount_point} && exec "$@"', "host"]
        seen.append(probe(str(mount_point / "tiny-llama"), cache_root, prefix=host))
    size = (tmp_path / "staging" / "tiny-llama" / "model.safetensors").stat().st_size
    assert len({s["id"] for s in seen}) == 1 and len({s["dev"] for s in seen}) == 2
    assert seen[0]["read"] >= size
    assert all(s["read"] < size // 2 for s in seen[1:]), seen


def test_a_read_only_cache_root_keeps_checkpoint_stamps_per_user(checkpoint, cache_root, readonly_view, tmp_path):
    LlamaLoader(checkpoint, precision="bfloat16").load()
    shutil.rmtree(cache_root / ".stamps")  # the seeder's stamps gone: the reader must keep its own
    view = readonly_view(cache_root)
    env = {"TT_USER_STATE": str(tmp_path / "user-state")}
    first, second = (probe(str(checkpoint), view, env=env) for _ in range(2))
    size = (checkpoint / "model.safetensors").stat().st_size
    assert first["read"] >= size and second["read"] < size // 2
    assert first["id"] == second["id"] == LlamaLoader(checkpoint, precision="bfloat16").content_id


def test_a_reader_on_a_read_only_mount_reuses_the_seeders_verification(checkpoint, cache_root, readonly_view, tmp_path):
    """The seeder leaves its checkpoint stamps in the cache root: a validate job on a read-only
    mount with a fresh HOME reads no checkpoint byte."""
    LlamaLoader(checkpoint, precision="bfloat16").load()
    view = readonly_view(cache_root)
    fresh_home = tmp_path / "home"
    fresh_home.mkdir()
    seen = probe(str(checkpoint), view, env={"HOME": str(fresh_home), "XDG_CACHE_HOME": str(fresh_home / ".cache")})
    assert seen["read"] < (checkpoint / "model.safetensors").stat().st_size // 2
    assert seen["id"] == LlamaLoader(checkpoint, precision="bfloat16").content_id
    assert CacheRoot(view).checkpoint_stamps("tiny-llama", checkpoint).is_file()
