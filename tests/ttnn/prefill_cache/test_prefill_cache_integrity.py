# SPDX-License-Identifier: Apache-2.0
"""Issue 8, prefill cache: a cache root that is moved, copied, restored or is not a directory;
a full disk mid-store; dead and live writers' debris; manifests that point outside their object;
old-format objects; and in-memory hits that a consumer tries to change.

Everything runs on real files with real tools (``mv``, ``cp -a``, a small tmpfs, ``unshare``)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from models.common.fileio import lock_held_elsewhere
from models.common.prefill_cache import (
    FROZEN_BACKBONE_SIDECAR_SCHEMA,
    FROZEN_BACKBONE_SIDECAR_SCHEMA_V1,
    BaseForwardCache,
    BaseForwardCacheEntry,
    FrozenBackboneCacheError,
    FrozenBackboneFeatureSidecar,
    ReadOnlyTensor,
    ReadOnlyTensorError,
    base_forward_cache_key_boundary,
    layout,
    maintenance,
)
from models.common.prefill_cache.sidecar import _clear_validation_proofs
from models.testing import REPO_ROOT
from models.testing.prefill_factories import row, same_bytes


def _store_rows(root: Path, count: int, **kwargs) -> list:
    rows = [row(root, index, **kwargs) for index in range(count)]
    FrozenBackboneFeatureSidecar.store_batch_boundary(tuple(rows))
    return rows


def _all_exact(root: Path, count: int, **kwargs) -> bool:
    _clear_validation_proofs()
    for index in range(count):
        sidecar, features = row(root, index, **kwargs)
        found = sidecar.lookup_boundary()
        if found is None or not same_bytes(found, features):
            return False
    return True


def _downgrade_to_v1(sidecar: FrozenBackboneFeatureSidecar) -> None:
    """Rewrite a stored object's manifest the way the v1 writer did: absolute paths plus the
    device, inode and mtime of each artifact."""
    manifest = json.loads(sidecar.paths.manifest.read_bytes())
    manifest["schema"] = FROZEN_BACKBONE_SIDECAR_SCHEMA_V1
    for name, path in zip(layout.ARTIFACT_NAMES, sidecar.paths.artifacts, strict=True):
        facts = path.stat()
        manifest["artifacts"][name].update(
            path=str(path), device=facts.st_dev, inode=facts.st_ino, mtimeNs=facts.st_mtime_ns
        )
    sidecar.paths.manifest.write_bytes(layout.canonical_json(manifest) + b"\n")


# ---------------------------------------------------------------------------------------------
# Moved, copied, restored
# ---------------------------------------------------------------------------------------------


def test_manifest_records_paths_relative_to_the_object(tmp_path):
    sidecar, features = row(tmp_path, 1)
    sidecar.store_boundary(features)
    manifest = json.loads(sidecar.paths.manifest.read_bytes())
    assert manifest["schema"] == FROZEN_BACKBONE_SIDECAR_SCHEMA
    for name, path in zip(layout.ARTIFACT_NAMES, sidecar.paths.artifacts, strict=True):
        record = manifest["artifacts"][name]
        assert record["path"] == path.name
        assert not {"device", "inode", "mtimeNs"} & set(record)
    assert str(tmp_path) not in sidecar.paths.manifest.read_text()


@pytest.mark.parametrize("fmt", ["v2", "v1"])
def test_moved_cache_root_stays_valid(tmp_path, fmt):
    old, new = tmp_path / "old-root", tmp_path / "elsewhere" / "new-root"
    rows = _store_rows(old, 4)
    if fmt == "v1":
        for sidecar, _ in rows:
            _downgrade_to_v1(sidecar)
    assert _all_exact(old, 4)
    new.parent.mkdir()
    subprocess.run(["mv", str(old), str(new)], check=True)
    assert _all_exact(new, 4)  # other path, same inodes: re-validated, not "corrupt"
    assert not old.exists()


@pytest.mark.parametrize("fmt", ["v2", "v1"])
def test_cp_a_and_rsync_style_copies_stay_valid(tmp_path, fmt):
    source, copy = tmp_path / "source", tmp_path / "copy"
    rows = _store_rows(source, 4)
    if fmt == "v1":
        for sidecar, _ in rows:
            _downgrade_to_v1(sidecar)
    subprocess.run(["cp", "-a", str(source), str(copy)], check=True)
    probe = next(copy.rglob("summary_hidden.*.bin"))
    assert probe.stat().st_ino != (source / probe.relative_to(copy)).stat().st_ino  # other inodes
    assert _all_exact(copy, 4) and _all_exact(source, 4)
    shutil.rmtree(source)  # the copy does not depend on the original
    assert _all_exact(copy, 4)


def test_restored_files_with_new_mtimes_are_rehashed_not_rejected(tmp_path):
    sidecar, features = row(tmp_path, 1)
    sidecar.store_boundary(features)
    _downgrade_to_v1(sidecar)  # v1 recorded stamps: restore changes every one of them
    for path in sidecar.paths.artifacts:  # a backup restore: same bytes, new inode and mtime
        data = path.read_bytes()
        path.unlink()
        path.write_bytes(data)
    _clear_validation_proofs()
    assert same_bytes(sidecar.lookup_boundary(), features)
    sidecar.paths.artifacts[1].write_bytes(b"\1" * sidecar.paths.artifacts[1].stat().st_size)
    _clear_validation_proofs()
    with pytest.raises(FrozenBackboneCacheError, match="does not match its SHA-256"):
        sidecar.lookup_boundary()  # re-validated means re-hashed: a changed byte is still caught


@pytest.mark.parametrize("fmt", ["v2", "v1"])
def test_a_manifest_path_that_leaves_its_object_dir_raises(tmp_path, fmt):
    (victim, features), (other, other_features) = row(tmp_path, 1), row(tmp_path, 2)
    victim.store_boundary(features)
    other.store_boundary(other_features)
    if fmt == "v1":
        _downgrade_to_v1(victim)
    good = victim.paths.manifest.read_bytes()
    name = victim.paths.artifacts[1].name
    escapes = [
        f"../../{other.authority_sha256[:2]}/{other.authority_sha256}/{name}",
        str(other.paths.artifacts[1]),  # another object's own file
        str(victim.paths.root / ".." / victim.paths.root.name / name),
        f"/etc/{name}",
        f"./{name}" if fmt == "v2" else name,
    ]
    for escape in escapes:
        manifest = json.loads(good)
        manifest["artifacts"]["summaryHidden"]["path"] = escape
        victim.paths.manifest.write_bytes(layout.canonical_json(manifest) + b"\n")
        _clear_validation_proofs()
        with pytest.raises(FrozenBackboneCacheError, match="path"):
            victim.lookup_boundary()
    victim.paths.manifest.write_bytes(good)
    assert same_bytes(victim.lookup_boundary(), features)


def test_old_format_object_is_served_and_not_rewritten_by_a_store(tmp_path):
    sidecar, features = row(tmp_path, 1)
    sidecar.store_boundary(features)
    _downgrade_to_v1(sidecar)
    before = sidecar.paths.manifest.read_bytes()
    _clear_validation_proofs()
    assert same_bytes(sidecar.lookup_boundary(), features)
    assert same_bytes(sidecar.store_boundary(features), features)
    assert sidecar.paths.manifest.read_bytes() == before
    infos = maintenance.list_objects(tmp_path)
    assert [(i.state, i.schema, i.legacy) for i in infos] == [("complete", FROZEN_BACKBONE_SIDECAR_SCHEMA_V1, True)]
    assert maintenance.verify(tmp_path).failures == []


# ---------------------------------------------------------------------------------------------
# Every OSError on a lookup path is the documented error
# ---------------------------------------------------------------------------------------------


def test_cache_root_that_is_a_regular_file(tmp_path):
    root = tmp_path / "root"
    root.write_bytes(b"not a directory")
    sidecar, features = row(root, 1)
    with pytest.raises(FrozenBackboneCacheError, match="Not a directory"):
        sidecar.lookup_boundary()
    with pytest.raises(FrozenBackboneCacheError):
        sidecar.progress_boundary()
    with pytest.raises(OSError):  # a store says why it cannot write, and writes nothing
        sidecar.store_boundary(features)
    with pytest.raises(FrozenBackboneCacheError):
        maintenance.list_objects(root)
    assert root.read_bytes() == b"not a directory"


def test_objects_dir_or_shard_that_is_a_file(tmp_path):
    sidecar, _ = row(tmp_path, 1)
    (tmp_path / "objects").mkdir()
    sidecar.paths.root.parent.write_bytes(b"x")  # objects/<aa> is a file
    with pytest.raises(FrozenBackboneCacheError):
        sidecar.lookup_boundary()


def test_artifact_replaced_by_a_directory_or_vanishing_after_proof(tmp_path):
    sidecar, features = row(tmp_path, 1)
    sidecar.store_boundary(features)
    time.sleep(0.05)
    assert same_bytes(sidecar.lookup_boundary(), features)  # proven
    summary = sidecar.paths.artifacts[1]
    data = summary.read_bytes()
    summary.unlink()
    summary.mkdir()
    with pytest.raises(FrozenBackboneCacheError):
        sidecar.lookup_boundary()
    summary.rmdir()
    summary.write_bytes(data)
    assert same_bytes(sidecar.lookup_boundary(), features)


def test_symlink_loop_root_is_the_documented_error(tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(FrozenBackboneCacheError):
        row(loop, 1)[0].lookup_boundary()


# ---------------------------------------------------------------------------------------------
# A full disk: a failed store removes what it wrote
# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _small_tmpfs(tmp_path: Path, size: str):
    mount_point = tmp_path / f"tmpfs-{uuid.uuid4().hex[:8]}"
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root or CAP_SYS_ADMIN): {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def _used_kib(path: Path) -> int:
    facts = os.statvfs(path)
    return (facts.f_blocks - facts.f_bfree) * facts.f_frsize // 1024


def _files_under(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("mode", ["single", "batch"])
def test_enospc_mid_store_removes_its_partials(tmp_path, mode):
    with _small_tmpfs(tmp_path, "512k") as mount_point:
        root = mount_point / "cache"
        big = dict(hidden=256, positions=640)  # bf16 summary: 320 KiB
        rows = [row(root, index, **big) for index in range(2)]  # 640 KiB in all: does not fit
        empty_kib = _used_kib(mount_point)
        with pytest.raises(OSError) as caught:
            if mode == "single":
                for sidecar, features in rows:
                    sidecar.store_boundary(features)
            else:
                FrozenBackboneFeatureSidecar.store_batch_boundary(tuple(rows))
        assert caught.value.errno == errno.ENOSPC
        leftovers = [n for n in _files_under(root) if n.endswith(".partial") or ".tmp." in n or n == "progress.json"]
        assert leftovers == []
        published = [s for s, _ in rows if s.paths.manifest.exists()]
        for sidecar, features in rows:  # a published row is exact, the rest are plain misses
            found = sidecar.lookup_boundary()
            assert (found is None) == (sidecar not in published)
            if found is not None:
                assert same_bytes(found, features)
            else:
                assert not any(p.exists() for p in sidecar.paths.artifacts)
        expected_kib = sum(sum(p.stat().st_size for p in s.paths.artifacts) for s in published) // 1024
        assert _used_kib(mount_point) - empty_kib <= expected_kib + 64  # no stray bytes kept
        # Space freed, the same store completes.
        for sidecar in published:
            shutil.rmtree(sidecar.paths.root)
        for sidecar, features in rows[:1]:
            assert same_bytes(sidecar.store_boundary(features), features)


# ---------------------------------------------------------------------------------------------
# Dead and live writers: liveness by the lock they hold
# ---------------------------------------------------------------------------------------------

_HOLD_LOCK = """
import sys, time
from pathlib import Path
from models.common.fileio import file_lock
root = Path(sys.argv[1])
with file_lock(root / ".writer.lock"):
    (root / "final_hidden.bfloat16.bin.partial").write_bytes(b"live writer")
    print("holding", flush=True)
    time.sleep(120)
"""


def _killed_writer_debris(sidecar: FrozenBackboneFeatureSidecar, features) -> None:
    """What a writer killed after flushing its partials leaves behind."""
    staged = sidecar._staged(features)
    sidecar.paths.root.mkdir(parents=True, exist_ok=True)
    for partial, payload in zip(sidecar.paths.partials, staged.payloads, strict=True):
        partial.write_bytes(payload)
    (sidecar.paths.root / ".manifest.json.tmp.999999.1.abcd0123").write_bytes(b"{")


def test_gc_removes_dead_writers_debris_and_spares_a_live_writer_in_another_pid_namespace(tmp_path):
    dead, dead_features = row(tmp_path, 1)
    _killed_writer_debris(dead, dead_features)
    live, _ = row(tmp_path, 2)
    live.paths.root.mkdir(parents=True)
    kept, kept_features = row(tmp_path, 3)
    kept.store_boundary(kept_features)
    (kept.paths.root / "summary_hidden.bfloat16.bin.partial").write_bytes(b"stale")
    command = [sys.executable, "-c", _HOLD_LOCK, str(live.paths.root)]
    if shutil.which("unshare") and subprocess.run(["unshare", "--pid", "--fork", "true"]).returncode == 0:
        command = ["unshare", "--pid", "--fork", *command]  # its pid means nothing out here
    else:
        pytest.skip("unshare --pid --fork is not permitted here (needs root or user namespaces)")
    writer = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT,
                              env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)), start_new_session=True)
    try:
        assert writer.stdout.readline().strip() == "holding"
        states = {i.sha256: i.state for i in maintenance.list_objects(tmp_path)}
        assert states == {dead.authority_sha256: "debris", live.authority_sha256: "in-flight",
                          kept.authority_sha256: "complete"}
        result = maintenance.gc(tmp_path)
        assert result.skipped_live == 1 and result.removed_objects == 0
        assert (live.paths.root / "final_hidden.bfloat16.bin.partial").read_bytes() == b"live writer"
        assert sorted(p.name for p in dead.paths.root.iterdir()) == [".writer.lock"]
        assert not (kept.paths.root / "summary_hidden.bfloat16.bin.partial").exists()
        assert same_bytes(kept.lookup_boundary(), kept_features)
    finally:
        os.killpg(writer.pid, signal.SIGKILL)
        writer.wait()
    deadline = time.monotonic() + 10  # the namespace's init exits just after unshare itself
    while lock_held_elsewhere(live.paths.lock) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert maintenance.gc(tmp_path).skipped_live == 0  # its lock died with it
    assert not (live.paths.root / "final_hidden.bfloat16.bin.partial").exists()
    assert same_bytes(dead.store_boundary(dead_features), dead_features)  # the dir is still usable


def test_sigkilled_store_debris_is_removed_by_the_next_store_or_gc(tmp_path):
    sidecar, features = row(tmp_path, 1, hidden=512, positions=512)
    for attempt in range(20):  # kill a real writer until one dies mid-store
        pid = os.fork()
        if pid == 0:
            try:
                sidecar.store_boundary(features)
            finally:
                os._exit(0)
        time.sleep(0.002 * attempt)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        if any(p.name.endswith(".partial") for p in sidecar.paths.root.glob("*")) and not sidecar.paths.manifest.exists():
            break
        shutil.rmtree(tmp_path / "objects", ignore_errors=True)
    else:
        pytest.skip("no kill landed between the partials and the manifest in 20 tries")
    assert sidecar.lookup_boundary() is None
    result = maintenance.gc(tmp_path)
    assert result.removed_files >= 1
    assert sorted(p.name for p in sidecar.paths.root.iterdir()) == [".writer.lock"]
    assert same_bytes(sidecar.store_boundary(features), features)


def test_gc_removes_objects_unused_for_n_days(tmp_path):
    rows = _store_rows(tmp_path, 3)
    old = rows[0][0].paths.manifest
    stale = time.time() - 10 * 86_400
    os.utime(old, (stale, stale))
    os.utime(old.parent, (stale, stale))  # its last use (a lookup touches the object directory)
    assert maintenance.gc(tmp_path, older_than_days=30).removed_objects == 0
    result = maintenance.gc(tmp_path, older_than_days=7)
    assert result.removed_objects == 1 and result.removed_files == 4
    assert rows[0][0].lookup_boundary() is None
    assert all(same_bytes(s.lookup_boundary(), f) for s, f in rows[1:])
    with pytest.raises(ValueError):
        maintenance.gc(tmp_path, older_than_days=-1)


def test_verify_finds_a_flipped_byte_that_ls_does_not_hash(tmp_path):
    rows = _store_rows(tmp_path, 2)
    target = rows[1][0].paths.artifacts[1]
    data = bytearray(target.read_bytes())
    data[3] ^= 0x10
    target.write_bytes(bytes(data))
    assert [i.state for i in maintenance.list_objects(tmp_path)] == ["complete", "complete"]
    result = maintenance.verify(tmp_path)
    assert result.checked == 2 and len(result.failures) == 1
    assert result.failures[0][0] == str(rows[1][0].paths.root) and "SHA-256" in result.failures[0][1]


# ---------------------------------------------------------------------------------------------
# In-memory hits cannot be changed by their consumer
# ---------------------------------------------------------------------------------------------


def _forward_entry(seed: int) -> BaseForwardCacheEntry:
    g = torch.Generator().manual_seed(seed)
    return BaseForwardCacheEntry.from_forward_boundary(
        hidden=torch.randn(1, 4, 8, generator=g), logits=torch.randn(1, 4, 16, generator=g),
        parent_context_hidden=torch.randn(1, 4, 8, generator=g),
        parent_expert_routes=torch.zeros(1, 4, 2, dtype=torch.long),
        parent_layer_routes=torch.zeros(1, 2, dtype=torch.int32),
        kv_prefix_positions=torch.arange(4), kv_new_positions=torch.arange(4, 8),
        parent_prefill_hidden=torch.randn(1, 2, 8, generator=g),
        parent_prefill_input_positions=torch.tensor([3]), sha16="0123456789abcdef",
    )


def _mutations():
    def out_kwarg(t):
        torch.add(t, 1, out=t)

    def iadd(t):
        t += 1

    def setitem(t):
        t[0] = 0

    return {
        "div_": lambda t: t.div_(0.7),
        "temperature on a view": lambda t: t[0].div_(0.7),
        "setitem": setitem,
        "+=": iadd,
        "out=": out_kwarg,
        "copy_": lambda t: t.copy_(torch.zeros_like(t)),
        "relu inplace kw": lambda t: F.relu(t, inplace=True),
        "relu inplace positional": lambda t: F.relu(t, True),
        "dropout inplace": lambda t: F.dropout(t, 0.5, True, True),
        ".data.mul_": lambda t: t.data.mul_(2),
        "view then zero_": lambda t: t.view(-1).zero_(),
        "float() alias then sub_": lambda t: t.float().sub_(1),
        "torch.exp_": lambda t: torch.exp_(t),
        "clamp_ via functional": lambda t: torch.clamp_(t, 0, 1),
    }


@pytest.mark.parametrize("name", sorted(_mutations()))
def test_lru_hit_mutated_in_place_is_refused_and_the_next_hit_is_unchanged(name):
    cache = BaseForwardCache(capacity=4, parent_identity="parent-a")
    key, _ = cache.key_boundary(torch.tensor([[1, 2, 3, 4]]), torch.ones(1, 4))
    cache.store(key, _forward_entry(1))
    reference = _forward_entry(1).logits.clone()
    hit = cache.lookup(key)
    assert isinstance(hit.logits, ReadOnlyTensor)
    with pytest.raises(ReadOnlyTensorError):
        _mutations()[name](hit.logits)
    assert torch.equal(cache.lookup(key).logits, reference)
    assert torch.equal(hit.logits, reference)


def test_numpy_of_a_hit_is_read_only_and_flags_stay_with_one_hit():
    cache = BaseForwardCache(capacity=2)
    cache.store("k", _forward_entry(2))
    reference = _forward_entry(2)
    hit = cache.lookup("k")
    array = hit.hidden.numpy()
    with pytest.raises(ValueError, match="read-only"):
        array[0, 0, 0] = 5.0
    with pytest.raises(ReadOnlyTensorError):
        hit.logits.data = torch.zeros(3)
    hit.logits.requires_grad_(True)  # a flag of this hit's own view
    assert not cache.lookup("k").logits.requires_grad
    assert torch.equal(cache.lookup("k").logits, reference.logits)


def test_ordinary_results_of_a_hit_are_plain_writable_tensors():
    cache = BaseForwardCache(capacity=2)
    cache.store("k", _forward_entry(3))
    hit = cache.lookup("k")
    scaled = hit.logits / 0.7
    assert type(scaled) is torch.Tensor
    scaled.div_(2)  # the consumer's own tensor
    probabilities = F.softmax(hit.logits.float(), dim=-1)
    assert type(probabilities) is torch.Tensor
    clone = hit.logits.clone()
    clone.zero_()
    assert type(clone) is torch.Tensor
    assert torch.equal(cache.lookup("k").logits, _forward_entry(3).logits)
    moved = hit.to_device_boundary(torch.device("cpu"))
    with pytest.raises(ReadOnlyTensorError):
        moved.logits.mul_(2)


def test_producer_changing_its_tensors_after_store_does_not_reach_the_cache():
    logits = torch.randn(1, 4, 16)
    reference = logits.clone()
    entry = BaseForwardCacheEntry.from_forward_boundary(
        hidden=logits, logits=logits, parent_context_hidden=logits, parent_expert_routes=logits,
        parent_layer_routes=logits, kv_prefix_positions=torch.arange(2), kv_new_positions=torch.arange(2),
        parent_prefill_hidden=None, parent_prefill_input_positions=None, sha16="x",
    )
    raw = BaseForwardCacheEntry(logits, logits, logits, logits, logits, torch.arange(2), torch.arange(2),
                                None, None, "y")  # built without from_forward_boundary: aliases
    cache = BaseForwardCache(capacity=2)
    cache.store("a", entry)
    cache.store("b", raw)
    logits.mul_(-1)
    assert torch.equal(cache.lookup("a").logits, reference)
    assert torch.equal(cache.lookup("b").logits, reference)


def test_key_includes_the_parent_model_identity():
    ids, mask = torch.tensor([[5, 6, 7]]), torch.ones(1, 3)
    keys = {
        base_forward_cache_key_boundary(ids, mask)[0],
        base_forward_cache_key_boundary(ids, mask, parent_identity="weights-a/bfloat16")[0],
        base_forward_cache_key_boundary(ids, mask, parent_identity="weights-b/bfloat16")[0],
        base_forward_cache_key_boundary(ids, mask, parent_identity="weights-a/float32")[0],
    }
    assert len(keys) == 4
    a = BaseForwardCache(capacity=2, parent_identity="weights-a/bfloat16")
    assert a.key_boundary(ids, mask)[0] == base_forward_cache_key_boundary(
        ids, mask, parent_identity="weights-a/bfloat16")[0]
    assert a.telemetry_boundary()["parentIdentity"] == "weights-a/bfloat16"
    with pytest.raises(ValueError, match="parent_identity"):
        base_forward_cache_key_boundary(ids, mask, parent_identity="")
    with pytest.raises(ValueError, match="parent_identity"):
        BaseForwardCache(capacity=2, parent_identity=3)  # type: ignore[arg-type]


def test_layout_module_imports_without_torch():
    code = ("import sys; import models.common.prefill_cache.maintenance; "
            "bad = {'torch', 'ttnn'} & set(sys.modules); print(sorted(bad)); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_hit_may_be_copied_into_the_consumers_own_tensors():
    cache = BaseForwardCache(capacity=2)
    cache.store("k", _forward_entry(4))
    hit = cache.lookup("k")
    mine = torch.zeros(2, 4, 16)
    mine[1] = hit.logits[0]  # __setitem__ on a plain tensor, a read-only value
    mine[0].copy_(hit.logits[0])
    torch.add(hit.logits[0], 1, out=mine[0])
    assert torch.equal(mine[1], _forward_entry(4).logits[0])


def test_a_store_that_finds_its_object_removes_dead_writers_leftovers(tmp_path):
    sidecar, features = row(tmp_path, 1)
    sidecar.store_boundary(features)
    leftovers = [*sidecar.paths.partials[:2], sidecar.paths.root / ".manifest.json.tmp.1.2.abcd0123"]
    for path in leftovers:
        path.write_bytes(b"left by a killed writer")
    assert same_bytes(sidecar.store_boundary(features), features)
    assert not any(path.exists() for path in leftovers)
