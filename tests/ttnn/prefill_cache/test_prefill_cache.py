# SPDX-License-Identifier: Apache-2.0
"""Behaviour of models.common.prefill_cache on real files: identity, packets, store/lookup,
batches, legacy objects, validation proofs and the in-memory tier.

Crash, concurrency and corruption suites live in test_prefill_cache_reliability.py."""

from __future__ import annotations

import json
import os
import random
import time

import pytest
import torch

from models.common.weight_cache.stamps import FINE_TICK_NS, FileStamp
from models.common import prefill_cache as pc
from models.common.prefill_cache import sidecar as sidecar_module
from models.common.fileio import atomic_write_bytes
from models.common.prefill_cache import (
    BaseForwardCache,
    BaseForwardCacheEntry,
    FrozenBackboneCacheAuthority,
    FrozenBackboneCacheError,
    FrozenBackboneFeatureSidecar,
    FrozenBackbonePrefillPacket,
    base_forward_cache_allowed_boundary,
    base_forward_cache_capacity_boundary,
    base_forward_cache_enabled_boundary,
    base_forward_cache_key_boundary,
    frozen_backbone_position_policy_sha256_boundary,
    frozen_backbone_prompt_mask_sha256_boundary,
)
from models.testing.prefill_factories import authority, hex_of, packet, row, same_bytes

# ---------------------------------------------------------------------------------------------
# Identity
# ---------------------------------------------------------------------------------------------


def test_prompt_mask_hash_binds_dtype_shape_and_bytes():
    ids = torch.tensor([[1, 2, 3, 4]])
    mask = torch.ones_like(ids)
    base = frozen_backbone_prompt_mask_sha256_boundary(ids, mask)
    assert base == frozen_backbone_prompt_mask_sha256_boundary(ids.clone(), mask.clone())
    variants = [
        (ids.reshape(2, 2), mask.reshape(2, 2)),
        (ids.to(torch.int32), mask),
        (ids, mask.bool()),
        (ids, torch.tensor([[1, 1, 1, 0]])),
        (torch.tensor([[1, 2, 3, 5]]), mask),
    ]
    digests = {frozen_backbone_prompt_mask_sha256_boundary(i, m) for i, m in variants}
    assert len(digests) == len(variants) and base not in digests


@pytest.mark.parametrize(
    "ids, mask",
    [
        (torch.tensor([1, 2]), torch.tensor([1, 1])),
        (torch.zeros((1, 0), dtype=torch.long), torch.zeros((1, 0), dtype=torch.long)),
        (torch.tensor([[1.0, 2.0]]), torch.tensor([[1, 1]])),
        (torch.tensor([[1, 2]]), torch.tensor([[1, 1, 1]])),
        (torch.tensor([[1, 2]]), torch.tensor([[1.0, 1.0]])),
    ],
)
def test_prompt_mask_hash_rejects_bad_inputs(ids, mask):
    with pytest.raises(ValueError, match="prompt/mask identity"):
        frozen_backbone_prompt_mask_sha256_boundary(ids, mask)


POLICY = dict(
    final_hidden_adapter_id="adapter-a",
    dual_chunk_pretrain_length=8192,
    dual_chunk_local_size=1024,
    pretrained_rope_band_tokens=4096,
    prefill_tile_tokens=512,
    prefill_summaries_per_tile=4,
)


def test_position_policy_hash_covers_every_field():
    base = frozen_backbone_position_policy_sha256_boundary(**POLICY)
    assert base == frozen_backbone_position_policy_sha256_boundary(**POLICY)
    for name, value in POLICY.items():
        changed = dict(POLICY, **{name: value + "x" if isinstance(value, str) else value + 1})
        assert frozen_backbone_position_policy_sha256_boundary(**changed) != base, name


@pytest.mark.parametrize(
    "override",
    [{"final_hidden_adapter_id": ""}, {"final_hidden_adapter_id": 3}, {"prefill_tile_tokens": 0},
     {"dual_chunk_local_size": True}, {"prefill_summaries_per_tile": 2.0}],
)
def test_position_policy_hash_rejects_malformed(override):
    with pytest.raises(ValueError, match="position policy is malformed"):
        frozen_backbone_position_policy_sha256_boundary(**dict(POLICY, **override))


def test_authority_identity_ignores_source_tree_but_binds_everything_else():
    base = authority(1)
    assert base.sha256_boundary() == authority(1, source="another tree").sha256_boundary()
    assert base == authority(1, source="another tree")
    record = base.record_boundary()
    assert "parentSourceBundleSha256" not in record
    assert record["parentCheckpointId"] == "resynthesis-native-parent:" + hex_of("parent weights")
    others = [authority(2), authority(1, hidden=16), authority(1, positions=4), authority(1, dtype="float32")]
    from dataclasses import replace

    others += [replace(base, token_dtype="int32"), replace(base, position_policy_sha256=hex_of("p2")),
               replace(base, parent_model_artifact_sha256=hex_of("w2"))]
    assert len({a.sha256_boundary() for a in others} | {base.sha256_boundary()}) == len(others) + 1
    encoded = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
    assert base.sha256_boundary() == hex_of(encoded.decode())


def test_authority_legacy_record_is_source_bound():
    base = authority(1)
    legacy = base.legacy_v1_record_boundary()
    assert legacy["schema"] == pc.FROZEN_BACKBONE_AUTHORITY_SCHEMA_V1
    assert legacy["parentCheckpointId"] == "parent-ckpt-7"
    assert base.legacy_v1_sha256_boundary() != authority(1, source="other").legacy_v1_sha256_boundary()
    assert authority(1, source=None).legacy_v1_record_boundary() is None


def test_malformed_authority_names_its_fields():
    from dataclasses import replace

    bad = replace(authority(1), prompt_sha256="nope", hidden_size=0, feature_dtype="int8")
    with pytest.raises(ValueError, match="prompt_sha256.*feature_dtype.*hidden_size"):
        bad.sha256_boundary()


def test_digest_tensors():
    auth = authority(3)
    key, work, mask = auth.digest_tensors_boundary()
    assert key.dtype == torch.uint8 and key.shape == (1, 32)
    assert bytes(key[0].tolist()).hex() == auth.sha256_boundary()
    assert bytes(work[0].tolist()).hex() == hex_of("run/work-3")
    assert bytes(mask[0].tolist()).hex() == auth.prompt_mask_sha256


# ---------------------------------------------------------------------------------------------
# Packet
# ---------------------------------------------------------------------------------------------


def test_packet_from_features_stack_and_move():
    rows = [packet(authority(i), i) for i in range(3)]
    stacked = FrozenBackbonePrefillPacket.stack_boundary(tuple(rows))
    assert stacked.final_hidden_t.shape == (3, 1, 8) and stacked.summary_hidden_t.shape == (3, 3, 8)
    assert stacked.input_positions_t.tolist() == [1, 2, 3]
    assert stacked.cache_key_sha256_t.shape == (3, 32)
    moved = stacked.to_device_boundary(torch.device("cpu"))
    assert same_bytes(moved, stacked)
    assert moved.final_hidden_t.data_ptr() != stacked.final_hidden_t.data_ptr()


def test_packet_rejects_bad_geometry_and_values():
    auth = authority(1)
    good = packet(auth, 1)
    with pytest.raises(ValueError, match="geometry"):
        FrozenBackbonePrefillPacket.from_features_boundary(
            authority=auth, final_hidden_t=good.final_hidden_t.float(),
            summary_hidden_t=good.summary_hidden_t, input_positions_t=torch.tensor([1]))
    from dataclasses import replace

    with pytest.raises(ValueError, match="summary mask"):
        replace(good, summary_mask_t=good.summary_mask_t.long()).validate_boundary()
    with pytest.raises(RuntimeError, match="positive"):
        replace(good, input_positions_t=torch.tensor([0])).validate_boundary()
    with pytest.raises(ValueError, match="differ"):
        FrozenBackbonePrefillPacket.stack_boundary((good, packet(authority(2, hidden=16), 2)))
    with pytest.raises(ValueError, match="empty"):
        FrozenBackbonePrefillPacket.stack_boundary(())


# ---------------------------------------------------------------------------------------------
# Store and lookup
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_store_then_lookup_is_bit_exact(tmp_path, dtype):
    sidecar, features = row(tmp_path, 1, dtype=dtype)
    assert sidecar.lookup_boundary() is None
    stored = sidecar.store_boundary(features)
    assert same_bytes(stored, features)
    found = FrozenBackboneFeatureSidecar(cache_root=tmp_path, authority=authority(1, dtype=dtype)).lookup_boundary()
    assert same_bytes(found, features)
    names = sorted(path.name for path in sidecar.paths.root.iterdir())
    assert names == sorted(
        [".writer.lock", "manifest.json", f"final_hidden.{dtype}.bin", f"summary_hidden.{dtype}.bin",
         "input_positions.i64le"]
    )
    sha = sidecar.authority_sha256
    assert sidecar.paths.root == tmp_path.resolve() / "objects" / sha[:2] / sha
    paths = sidecar.paths
    assert paths.artifact_paths_boundary() == (paths.final_hidden, paths.summary_hidden, paths.input_positions)
    raw = (sidecar.paths.root / f"summary_hidden.{dtype}.bin").read_bytes()
    assert raw == bytes(features.summary_hidden_t.contiguous().view(torch.uint8).reshape(-1).numpy())
    manifest = json.loads(sidecar.paths.manifest.read_bytes())
    assert manifest["authoritySha256"] == sha and manifest["rows"] == 1
    assert manifest["artifacts"]["inputPositions"]["bytes"] == 8


def test_store_of_existing_object_returns_it_untouched(tmp_path):
    sidecar, features = row(tmp_path, 1)
    sidecar.store_boundary(features)
    before = {p.name: os.stat(p) for p in sidecar.paths.root.iterdir()}
    again = sidecar.store_boundary(packet(authority(1), 99))  # different features, same identity
    assert same_bytes(again, features)
    after = {p.name: os.stat(p) for p in sidecar.paths.root.iterdir()}
    assert {k: (v.st_ino, v.st_mtime_ns) for k, v in before.items()} == {
        k: (v.st_ino, v.st_mtime_ns) for k, v in after.items()
    }


def test_store_refuses_foreign_packet_before_touching_disk(tmp_path):
    sidecar, _ = row(tmp_path, 1)
    with pytest.raises(ValueError, match="identity"):
        sidecar.store_boundary(packet(authority(2), 2))
    with pytest.raises(ValueError, match="does not match"):
        sidecar.store_boundary(packet(authority(1, positions=5), 1))
    assert not (tmp_path / "objects").exists()


def test_store_rebuilds_a_corrupt_object(tmp_path):
    sidecar, features = row(tmp_path, 1)
    sidecar.store_boundary(features)
    path = sidecar.paths.artifacts[1]
    path.write_bytes(b"\0" * path.stat().st_size)
    with pytest.raises(FrozenBackboneCacheError, match="is invalid"):
        sidecar.lookup_boundary()
    assert same_bytes(sidecar.store_boundary(features), features)
    assert same_bytes(sidecar.lookup_boundary(), features)


def test_store_resumes_from_a_durable_frontier_and_sweeps_debris(tmp_path, monkeypatch):
    sidecar, features = row(tmp_path, 1)
    staged = sidecar._staged(features)
    sidecar.paths.root.mkdir(parents=True)
    for partial, payload in zip(sidecar.paths.partials, staged.payloads):
        partial.write_bytes(payload)
    atomic_write_bytes(sidecar.paths.progress, json.dumps(sidecar._progress_payload(staged)).encode())
    debris = sidecar.paths.root / ".manifest.json.tmp.123.abc.deadbeef"
    debris.write_bytes(b"{")
    inodes = [p.stat().st_ino for p in sidecar.paths.partials]
    assert sidecar.progress_boundary()["completedRows"] == 1
    assert sidecar.lookup_boundary() is None  # in flight: a plain miss
    sidecar.store_boundary(features)
    assert [p.stat().st_ino for p in sidecar.paths.artifacts] == inodes  # reused, not rewritten
    assert not debris.exists() and not sidecar.paths.progress.exists()
    assert same_bytes(sidecar.lookup_boundary(), features)


def test_store_ignores_a_frontier_that_does_not_match_the_files(tmp_path):
    sidecar, features = row(tmp_path, 1)
    staged = sidecar._staged(features)
    sidecar.paths.root.mkdir(parents=True)
    for partial, payload in zip(sidecar.paths.partials, staged.payloads):
        partial.write_bytes(bytes(len(payload)))  # right size, wrong bytes
    atomic_write_bytes(sidecar.paths.progress, json.dumps(sidecar._progress_payload(staged)).encode())
    sidecar.store_boundary(features)
    assert same_bytes(sidecar.lookup_boundary(), features)


def test_batch_store_publishes_every_row_and_skips_existing(tmp_path):
    rows = [row(tmp_path, i) for i in range(12)]
    rows[3][0].store_boundary(rows[3][1])
    existing = rows[3][0].paths.manifest.stat().st_ino
    assert FrozenBackboneFeatureSidecar.store_batch_boundary(tuple(rows[::-1])) == 12
    for sidecar, features in rows:
        assert same_bytes(sidecar.lookup_boundary(), features)
        assert not sidecar.paths.progress.exists()
        assert not [p for p in sidecar.paths.root.iterdir() if "tmp" in p.name or "partial" in p.name]
    assert rows[3][0].paths.manifest.stat().st_ino == existing
    assert FrozenBackboneFeatureSidecar.store_batch_boundary(()) == 0


def test_batch_store_rejects_duplicates_and_foreign_rows_before_writing(tmp_path):
    a, b = row(tmp_path, 1), row(tmp_path, 2)
    with pytest.raises(ValueError, match="more than once"):
        FrozenBackboneFeatureSidecar.store_batch_boundary((a, b, a))
    with pytest.raises(ValueError, match="identity"):
        FrozenBackboneFeatureSidecar.store_batch_boundary((a, (b[0], a[1])))
    assert not (tmp_path / "objects").exists()


def test_batch_failure_before_renames_leaves_plain_misses(tmp_path, monkeypatch):
    rows = [row(tmp_path, i) for i in range(4)]

    def fail(fds, **kwargs):
        raise OSError("disk on fire")

    from models.common.prefill_cache import publish

    monkeypatch.setattr(publish, "fsync_fds", fail)  # the wave's flush of its artifacts
    with pytest.raises(OSError, match="disk on fire"):
        FrozenBackboneFeatureSidecar.store_batch_boundary(tuple(rows))
    monkeypatch.undo()
    assert all(sidecar.lookup_boundary() is None for sidecar, _ in rows)
    FrozenBackboneFeatureSidecar.store_batch_boundary(tuple(rows))
    assert all(same_bytes(sidecar.lookup_boundary(), features) for sidecar, features in rows)


def test_threads_storing_and_looking_up_the_same_objects(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    def work(seed: int) -> None:
        order = list(range(10))
        random.Random(seed).shuffle(order)
        if seed % 2:
            FrozenBackboneFeatureSidecar.store_batch_boundary(tuple(row(tmp_path, i) for i in order))
        for index in order:
            sidecar, features = row(tmp_path, index)
            found = sidecar.lookup_boundary()
            assert found is None or same_bytes(found, features)
            assert same_bytes(sidecar.store_boundary(features), features)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(work, range(4)))
    for index in range(10):
        sidecar, features = row(tmp_path, index)
        assert same_bytes(sidecar.lookup_boundary(), features)


# ---------------------------------------------------------------------------------------------
# Validation proofs
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def hash_calls(monkeypatch):
    """The artifacts a lookup hashed (each content check follows a hash of the bytes read)."""
    calls = []
    real = sidecar_module.digest_matches

    def counting(root, spec, *args):
        calls.append(spec.name)
        return real(root, spec, *args)

    monkeypatch.setattr(sidecar_module, "digest_matches", counting)
    return calls


def test_proof_is_reused_while_stamps_hold_and_dropped_when_a_file_changes(tmp_path, hash_calls):
    sidecar, features = row(tmp_path, 1)
    sidecar.store_boundary(features)
    time.sleep(0.05)  # step past the coarse file-system clock tick of the writes
    sidecar.lookup_boundary()
    assert len(hash_calls) == 3
    for _ in range(3):
        assert same_bytes(sidecar.lookup_boundary(), features)
    assert len(hash_calls) == 3  # proven: no re-hash
    target = sidecar.paths.artifacts[0]
    data = bytearray(target.read_bytes())
    data[0] ^= 0x01
    with open(target, "r+b") as stream:  # same inode, same size
        stream.write(data)
    with pytest.raises(FrozenBackboneCacheError):
        sidecar.lookup_boundary()


def test_no_proof_is_kept_for_files_changed_within_a_clock_tick():
    changed = 10**18
    stamp = FileStamp(1, 3, changed, changed)
    small = sidecar_module._Small(torch.zeros(4), torch.ones(1, dtype=torch.long))
    proofs = sidecar_module._ProofCache(capacity=8, byte_budget=1 << 20)
    proofs.remember(("m", "a"), (stamp,), small, started_ns=changed + FINE_TICK_NS - 1, tick_ns=FINE_TICK_NS)
    assert proofs.holds(("m", "a"), (stamp,)) is None  # a rewrite in that tick would keep the stamp
    proofs.remember(("m", "a"), (stamp,), small, started_ns=changed + FINE_TICK_NS, tick_ns=FINE_TICK_NS)
    assert proofs.holds(("m", "a"), (stamp,)) is small


def test_proof_cache_is_bounded_by_entries_and_bytes():
    stamp = FileStamp(2, 3, 0, 0)
    small = sidecar_module._Small(torch.zeros(256, dtype=torch.float32), torch.ones(1, dtype=torch.long))  # 1032 B
    proofs = sidecar_module._ProofCache(capacity=3, byte_budget=2 * small.nbytes)
    for index in range(3):
        proofs.remember((f"m{index}", "a"), (stamp,), small, started_ns=10**19, tick_ns=FINE_TICK_NS)
    assert proofs.holds(("m0", "a"), (stamp,)) is None  # evicted by the byte budget
    assert proofs.holds(("m2", "a"), (stamp,)) is small
    assert proofs.holds(("m2", "a"), (stamp._replace(ctime_ns=1),)) is None  # changed: dropped
    assert proofs.holds(("m2", "a"), (stamp,)) is None
    proofs = sidecar_module._ProofCache(capacity=2, byte_budget=1 << 30)
    for index in range(3):
        proofs.remember((f"m{index}", "a"), (stamp,), small, started_ns=10**19, tick_ns=FINE_TICK_NS)
    assert [proofs.holds((f"m{i}", "a"), (stamp,)) is not None for i in range(3)] == [False, True, True]


# ---------------------------------------------------------------------------------------------
# Legacy objects
# ---------------------------------------------------------------------------------------------


def _write_legacy(root, index, *, source="src-v1"):
    """Write object ``index`` the way a v1 writer did: named by the source-bound record."""
    auth = authority(index, source=source)
    features = packet(auth, index)
    legacy = FrozenBackboneFeatureSidecar(cache_root=root, authority=auth)
    legacy_paths = legacy.legacy_paths
    legacy.paths = legacy_paths
    legacy.authority_sha256 = legacy.legacy_authority_sha256
    legacy.authority_record = legacy.legacy_authority_record
    legacy.store_boundary(features)
    return legacy_paths, features


def _tree_state(root):
    return {p: (p.stat().st_ino, p.stat().st_mtime_ns, p.stat().st_size) for p in root.rglob("*")}


@pytest.mark.parametrize("probe", ["direct", "index"])
def test_legacy_objects_are_found_read_only(tmp_path, probe):
    legacy_paths, features = _write_legacy(tmp_path, 5)
    state = _tree_state(tmp_path)
    source = "src-v1" if probe == "direct" else "a newer source tree"
    sidecar = FrozenBackboneFeatureSidecar(cache_root=tmp_path, authority=authority(5, source=source))
    assert sidecar.paths.root != legacy_paths.root
    found = sidecar.lookup_boundary()
    assert same_bytes(found, features)
    assert found.cache_key_sha256_t[0].numpy().tobytes().hex() == sidecar.authority_sha256
    assert _tree_state(tmp_path) == state  # nothing written, renamed or created
    other = FrozenBackboneFeatureSidecar(cache_root=tmp_path, authority=authority(6, source=source))
    assert other.lookup_boundary() is None


def test_corrupt_legacy_object_raises(tmp_path):
    legacy_paths, _ = _write_legacy(tmp_path, 5)
    legacy_paths.artifacts[2].write_bytes(b"\xff" * 8)
    sidecar = FrozenBackboneFeatureSidecar(cache_root=tmp_path, authority=authority(5))
    with pytest.raises(FrozenBackboneCacheError):
        sidecar.lookup_boundary()


# ---------------------------------------------------------------------------------------------
# In-memory tier
# ---------------------------------------------------------------------------------------------


def _entry(seed: int, *, optional: bool = True) -> BaseForwardCacheEntry:
    g = torch.Generator().manual_seed(seed)
    t = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    return BaseForwardCacheEntry.from_forward_boundary(
        hidden=t(1, 4, 8), logits=t(1, 4, 16), parent_context_hidden=t(1, 4, 8),
        parent_expert_routes=torch.zeros(1, 4, 2, dtype=torch.long),
        parent_layer_routes=torch.zeros(1, 2, dtype=torch.int32),
        kv_prefix_positions=torch.arange(4), kv_new_positions=torch.arange(4, 8),
        parent_prefill_hidden=t(1, 2, 8) if optional else None,
        parent_prefill_input_positions=torch.tensor([3]) if optional else None,
        sha16="0123456789abcdef",
    )


def _same_entry(x: BaseForwardCacheEntry, y: BaseForwardCacheEntry) -> bool:
    names = (*BaseForwardCacheEntry._REQUIRED, *BaseForwardCacheEntry._OPTIONAL)
    pairs = [(getattr(x, name), getattr(y, name)) for name in names]
    return x.sha16 == y.sha16 and all(
        (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b)) for a, b in pairs
    )


def test_base_forward_cache_lru_and_telemetry(monkeypatch):
    monkeypatch.delenv(pc.BASE_FORWARD_CACHE_ENV, raising=False)
    cache = BaseForwardCache(capacity=2)
    a, b, c = _entry(1), _entry(2, optional=False), _entry(3)
    assert cache.lookup("a") is None
    cache.store("a", a)
    cache.store("b", b)
    assert _same_entry(cache.lookup("a"), a)  # a is now most recent
    cache.store("c", c)  # evicts b
    assert cache.lookup("b") is None and _same_entry(cache.lookup("c"), c)
    assert cache.telemetry_boundary() == {
        "schema": pc.BASE_FORWARD_CACHE_SCHEMA, "enabled": True, "capacity": 2, "entries": 2,
        "hits": 2, "misses": 2, "parentIdentity": None,
    }
    cache.clear()
    assert cache.telemetry_boundary()["entries"] == 0 and cache.hits == 2 and cache.misses == 2
    with pytest.raises(ValueError):
        BaseForwardCache(capacity=0)


def test_base_forward_cache_entry_is_a_detached_host_copy():
    source = torch.randn(1, 4, 8, requires_grad=True)
    entry = BaseForwardCacheEntry.from_forward_boundary(
        hidden=source, logits=source, parent_context_hidden=source, parent_expert_routes=source,
        parent_layer_routes=source, kv_prefix_positions=torch.arange(2), kv_new_positions=torch.arange(2),
        parent_prefill_hidden=None, parent_prefill_input_positions=None, sha16="x",
    )
    assert not entry.hidden.requires_grad and entry.parent_prefill_hidden is None
    moved = entry.to_device_boundary(torch.device("cpu"))
    assert torch.equal(moved.logits, source.detach()) and moved.sha16 == "x"


def test_base_forward_cache_key():
    ids = torch.tensor([[1, 2, 3, 4]])
    full, short = base_forward_cache_key_boundary(ids, torch.ones_like(ids))
    assert len(full) == 64 and short == full[:16]
    assert full == base_forward_cache_key_boundary(ids.int(), torch.ones_like(ids).bool())[0]
    others = {
        base_forward_cache_key_boundary(ids, None)[0],
        base_forward_cache_key_boundary(ids.reshape(2, 2), torch.ones(2, 2))[0],
        base_forward_cache_key_boundary(ids, torch.tensor([[1, 1, 1, 0]]))[0],
    }
    assert len(others) == 3 and full not in others
    with pytest.raises(ValueError):
        base_forward_cache_key_boundary(ids[0], None)
    with pytest.raises(ValueError):
        base_forward_cache_key_boundary(ids, torch.ones(1, 3))


def test_base_forward_cache_env_configuration(monkeypatch):
    mask = torch.ones(1, 2)
    monkeypatch.delenv(pc.BASE_FORWARD_CACHE_ENV, raising=False)
    monkeypatch.delenv(pc.BASE_FORWARD_CACHE_ENTRIES_ENV, raising=False)
    assert base_forward_cache_enabled_boundary() and base_forward_cache_capacity_boundary() == 512
    assert base_forward_cache_allowed_boundary(input_mask=mask, use_past=False, parent_trainable=False)
    assert not base_forward_cache_allowed_boundary(input_mask=None, use_past=False, parent_trainable=False)
    assert not base_forward_cache_allowed_boundary(input_mask=mask, use_past=True, parent_trainable=False)
    assert not base_forward_cache_allowed_boundary(input_mask=mask, use_past=False, parent_trainable=True)
    monkeypatch.setenv(pc.BASE_FORWARD_CACHE_ENV, "Off")
    assert not base_forward_cache_allowed_boundary(input_mask=mask, use_past=False, parent_trainable=False)
    monkeypatch.setenv(pc.BASE_FORWARD_CACHE_ENV, "flase")
    with pytest.raises(FrozenBackboneCacheError, match=pc.BASE_FORWARD_CACHE_ENV):
        base_forward_cache_enabled_boundary()
    monkeypatch.setenv(pc.BASE_FORWARD_CACHE_ENTRIES_ENV, "64")
    assert base_forward_cache_capacity_boundary() == 64
    for bad in ("0", "-3", "many", "1.5"):
        monkeypatch.setenv(pc.BASE_FORWARD_CACHE_ENTRIES_ENV, bad)
        with pytest.raises(FrozenBackboneCacheError, match=pc.BASE_FORWARD_CACHE_ENTRIES_ENV):
            base_forward_cache_capacity_boundary()


def test_authority_type_is_frozen():
    with pytest.raises(Exception):
        authority(1).hidden_size = 3  # type: ignore[misc]
    assert isinstance(authority(1), FrozenBackboneCacheAuthority)
