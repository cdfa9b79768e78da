# SPDX-License-Identifier: Apache-2.0
"""The seed API's placeholders (no host memory, never persisted) and content checks (not just presence).

The caches they use: tests/weight_cache/seed_api.py.
"""

from __future__ import annotations

import os

import blake3
import pytest
import torch
import ttnn

from models.common import weight_cache as wc
from models.common.weight_cache.placeholders import is_placeholder_tensor, placeholder
from models.testing import weight_cache_seeder as seeder
from tests.ttnn.weight_cache.seed_api import (
    as_tensor_prefix,
    marker_body,
    rewrite_marker,
    status,
)

# --------------------------------------------------------------------------------------------
# rule 1: placeholders cost no host memory and can never be persisted
# --------------------------------------------------------------------------------------------


def test_non_host_keys_are_storage_free_placeholders_of_the_manifest_shape(seeded_cache) -> None:
    sd = wc.build_cached_state_dict(seeded_cache.root)
    for key, real in seeded_cache.state_dict.items():
        value = sd[key]
        assert value.shape == real.shape and value.dtype == real.dtype
        if key in seeder.HOST_KEYS:
            assert not value.is_meta
        else:
            assert value.is_meta and is_placeholder_tensor(value)


def test_a_placeholder_of_terabytes_allocates_nothing() -> None:
    huge = placeholder((1 << 20, 1 << 20), torch.bfloat16)  # 2 TiB if it had storage
    assert huge.is_meta and huge.numel() == 1 << 40
    with pytest.raises((NotImplementedError, RuntimeError)):
        huge.sum().item()


def test_placeholders_accept_host_side_reshapes_and_casts() -> None:
    w = placeholder((64, 128), torch.bfloat16)
    assert w.reshape(8, 8, 128).shape == (8, 8, 128)
    assert w.transpose(0, 1).shape == (128, 64) and w.T.shape == (128, 64)
    assert w.view(2, 32, 128).permute(2, 0, 1).shape == (128, 2, 32)
    assert torch.cat([w, w], dim=-1).shape == (64, 256)
    assert [c.shape for c in torch.chunk(w, 4, dim=0)] == [(16, 128)] * 4
    assert w.to(torch.float32).dtype == torch.float32 and w.float().is_meta
    assert w.unsqueeze(0).unsqueeze(0).contiguous().shape == (1, 1, 64, 128)


def test_as_tensor_hit_ignores_the_placeholder_and_loads_the_cached_weight(seeded_cache, tiny_expected) -> None:
    sd = wc.build_cached_state_dict(seeded_cache.root)
    for key in ("layers.0.attention.wq.weight", "layers.1.attention.wo.weight", "norm.weight"):
        spec = seeder.weight_specs()[key]
        loaded = ttnn.as_tensor(
            sd[key],
            dtype=seeder._ttnn_dtype(spec.dtype),
            layout=ttnn.TILE_LAYOUT,
            device=None,
            cache_file_name=as_tensor_prefix(seeded_cache, key),
        )
        assert torch.equal(ttnn.to_torch(loaded), tiny_expected[key])


def test_as_tensor_miss_on_a_placeholder_fails_loudly_and_writes_nothing(seeded_cache) -> None:
    sd = wc.build_cached_state_dict(seeded_cache.root)
    key = "layers.0.attention.wq.weight"
    seeded_cache.path(key).unlink()
    before = set(wc.list_cache_files(seeded_cache.root))
    with pytest.raises(TypeError):
        ttnn.as_tensor(
            sd[key], dtype=ttnn.bfloat8_b, layout=ttnn.TILE_LAYOUT, device=None,
            cache_file_name=as_tensor_prefix(seeded_cache, key),
        )
    assert set(wc.list_cache_files(seeded_cache.root)) == before
    assert not seeded_cache.path(key).exists()


def test_as_tensor_on_a_corrupt_hit_with_a_placeholder_does_not_overwrite_it(seeded_cache) -> None:
    key = "layers.1.attention.wo.weight"
    path = seeded_cache.path(key)
    path.write_bytes(path.read_bytes()[:100])
    sd = wc.build_cached_state_dict(seeded_cache.root)
    with pytest.raises(TypeError):
        ttnn.as_tensor(
            sd[key], dtype=ttnn.bfloat16, layout=ttnn.TILE_LAYOUT, device=None,
            cache_file_name=as_tensor_prefix(seeded_cache, key),
        )
    assert path.stat().st_size == 100


# --------------------------------------------------------------------------------------------
# rule 2: content, not just presence
# --------------------------------------------------------------------------------------------


def test_marker_records_every_tensorbin_with_its_size_and_blake3_digest(seeded_cache) -> None:
    body = marker_body(seeded_cache.root)
    assert body["digest_algorithm"] == "blake3"
    recorded = {f["path"]: f for f in body["files"]}
    assert set(recorded) == set(seeded_cache.files.values())
    for relative, record in recorded.items():
        data = (seeded_cache.root / relative).read_bytes()
        assert record["bytes"] == len(data)
        assert record["digest"] == blake3.blake3(data).hexdigest()


def test_marker_records_exactly_the_given_cache_files_with_their_digests(built_cache) -> None:
    chosen = sorted(built_cache.files.values())[:3]
    assert built_cache.mark(cache_files=chosen + [chosen[0]])
    files = marker_body(built_cache.root)["files"]
    assert [f["path"] for f in files] == chosen
    assert files[0]["digest"] == blake3.blake3(built_cache.root.joinpath(chosen[0]).read_bytes()).hexdigest()
    assert status(built_cache).warm


def test_marking_absolute_or_escaping_cache_files_fails_instead_of_writing_a_dead_marker(
    built_cache, captured_warnings
) -> None:
    absolute = str(built_cache.path("norm.weight"))
    assert built_cache.mark(cache_files=[absolute]) is False
    assert not wc.marker_path(built_cache.root).exists()
    assert built_cache.mark(cache_files=["../cache/" + built_cache.files["norm.weight"]]) is False
    assert "Could not mark" in captured_warnings()


def test_marking_an_empty_cache_dir_fails_and_writes_no_marker(tmp_path, tiny_state_dict, captured_warnings) -> None:
    assert seeder.mark(tmp_path, tiny_state_dict) is False
    assert not wc.marker_path(tmp_path).exists()
    assert "no .tensorbin files" in captured_warnings()


def test_gate_is_cold_when_a_tensorbin_is_missing(seeded_cache) -> None:
    key = "layers.1.feed_forward.w1.weight"
    seeded_cache.path(key).unlink()
    result = status(seeded_cache)
    assert not result.warm
    assert seeded_cache.files[key] in result.reason and "missing" in result.reason


def test_gate_is_cold_when_a_tensorbin_is_truncated(seeded_cache) -> None:
    path = seeded_cache.path("layers.0.attention.wq.weight")
    os.truncate(path, path.stat().st_size - 1)
    result = status(seeded_cache)
    assert not result.warm and "marker says" in result.reason


def test_gate_is_cold_when_a_tensorbin_grew(seeded_cache) -> None:
    path = seeded_cache.path("output.weight")
    with open(path, "ab") as stream:
        stream.write(b"\0" * 32)
    assert not status(seeded_cache).warm


def test_gate_is_cold_when_a_recorded_path_is_a_directory(seeded_cache) -> None:
    body = marker_body(seeded_cache.root)
    body["files"][0] = {
        "path": "layers.0",
        "bytes": (seeded_cache.root / "layers.0").stat().st_size,
        "digest": "0" * 64,
    }
    rewrite_marker(seeded_cache.root, body)
    assert not status(seeded_cache).warm
    assert any("layers.0" in p for p in wc.verify_weight_cache(wc.VariantPaths(seeded_cache.root)))


def test_same_size_corruption_is_rehashed_by_the_gate_and_deep_verify_names_the_file(seeded_cache) -> None:
    path = seeded_cache.path("layers.0.feed_forward.w1.weight")
    data = bytearray(path.read_bytes())
    data[-7] ^= 0xFF
    path.write_bytes(bytes(data))  # same size, but a new mtime/ctime: the gate re-hashes it
    result = status(seeded_cache)
    assert not result.warm and "content differs" in result.reason
    problems = wc.verify_weight_cache(wc.VariantPaths(seeded_cache.root))
    assert len(problems) == 1 and seeded_cache.files["layers.0.feed_forward.w1.weight"] in problems[0]


def test_deep_verify_of_an_intact_cache_is_empty_and_names_missing_files(seeded_cache) -> None:
    assert wc.verify_weight_cache(wc.VariantPaths(seeded_cache.root)) == []
    seeded_cache.path("norm.weight").unlink()
    problems = wc.verify_weight_cache(wc.VariantPaths(seeded_cache.root))
    assert len(problems) == 1 and seeded_cache.files["norm.weight"] in problems[0]


def test_deep_verify_without_a_marker_says_so(built_cache) -> None:
    problems = wc.verify_weight_cache(wc.VariantPaths(built_cache.root))
    assert len(problems) == 1 and "no completion marker" in problems[0]


def test_every_seeded_tensorbin_loads_back_with_the_checkpoint_values(seeded_cache, tiny_expected) -> None:
    assert seeder.cache_mismatches(seeded_cache.root, seeded_cache.state_dict) == []
    sharded = ttnn.load_tensor(str(seeded_cache.path("layers.0.feed_forward.w1.weight")))
    assert len(ttnn.get_device_tensors(sharded)) == 2
