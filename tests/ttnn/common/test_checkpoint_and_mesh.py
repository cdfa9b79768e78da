# SPDX-License-Identifier: Apache-2.0
"""Checkpoint reading (zero-copy safetensors views, key remapping, identity) and mesh placement."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from models.common.checkpoint import (
    CheckpointError,
    KeyRule,
    checkpoint_name,
    model_id,
    remap_key,
    resolve_checkpoint_dir,
)
from models.common.mesh import COLUMN_PARALLEL, EXPERT_PARALLEL, REPLICATED, ROW_PARALLEL, parse_mesh_shape
from models.common.safetensors_file import SafetensorsFile
from models.common.sharding import shard, unshard


@pytest.fixture
def weights_file(tmp_path) -> Path:
    path = tmp_path / "model.safetensors"
    save_file({"a": torch.randn(64, 32).to(torch.bfloat16), "b": torch.arange(10, dtype=torch.int64),
               "empty": torch.zeros(0, 4)}, path)
    return path


def test_zero_copy_views_equal_safetensors_values(weights_file):
    expected = load_file(weights_file)
    reader = SafetensorsFile(weights_file)
    assert sorted(reader.names()) == sorted(expected)
    for name, value in expected.items():
        assert torch.equal(reader.tensor(name), value)
        assert reader.spec(name) == (list(value.shape), value.dtype)


def test_in_place_op_on_a_view_never_writes_the_checkpoint(weights_file):
    before = weights_file.read_bytes()
    SafetensorsFile(weights_file).tensor("a").mul_(0)
    assert weights_file.read_bytes() == before


def test_a_shard_mapped_when_first_read_is_the_file_whose_header_was_read(weights_file, tmp_path):
    """A reader maps each shard on its first read (a descriptor per mapping); a file replaced since
    its header was read is refused, never mapped under the old header."""
    reader = SafetensorsFile(weights_file, map_now=False)
    opened = len(list(Path("/proc/self/fd").iterdir()))
    assert torch.equal(reader.tensor("a"), load_file(weights_file)["a"])
    assert len(list(Path("/proc/self/fd").iterdir())) == opened + 1, "the mapping holds one descriptor"
    replaced = SafetensorsFile(weights_file, map_now=False)
    other = tmp_path / "other.safetensors"
    save_file({"a": torch.zeros(64, 32).to(torch.bfloat16), "b": torch.arange(10, dtype=torch.int64),
               "empty": torch.zeros(0, 4)}, other)
    other.replace(weights_file)
    with pytest.raises(CheckpointError, match="changed since its header was read"):
        replaced.tensor("a")


def _with_header(path: Path, header: dict, data: bytes) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


@pytest.mark.parametrize(
    "make",
    [
        lambda p: p.write_bytes(b"\x01\x02"),  # shorter than the length prefix
        lambda p: p.write_bytes(struct.pack("<Q", 1 << 40) + b"{}"),  # absurd header length
        lambda p: p.write_bytes(struct.pack("<Q", 4) + b"nope"),  # not JSON
        lambda p: _with_header(p, {"x": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 6]}}, b"\0" * 8),
        lambda p: _with_header(p, {"x": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}}, b"\0" * 4),
        lambda p: _with_header(p, {"x": {"dtype": "Q7", "shape": [4], "data_offsets": [0, 8]}}, b"\0" * 8),
        lambda p: _with_header(p, {"x": {"shape": [4]}}, b"\0" * 8),
    ],
    ids=["tiny", "huge-header", "not-json", "size-mismatch", "past-end", "unknown-dtype", "missing-fields"],
)
def test_malformed_safetensors_is_a_clear_checkpoint_error(make, tmp_path):
    path = tmp_path / "bad.safetensors"
    make(path)
    with pytest.raises(CheckpointError):
        SafetensorsFile(path)


def test_truncated_checkpoint_is_a_clear_error(weights_file):
    data = weights_file.read_bytes()
    weights_file.write_bytes(data[: len(data) - 7])
    with pytest.raises(CheckpointError, match="do not fit"):
        SafetensorsFile(weights_file)


def test_remap_key_first_rule_wins_and_unmatched_is_skipped():
    rules = (KeyRule(r"^model\.norm\.weight$", "norm.weight"), KeyRule(r"^model\.(.*)$", r"other.\1"))
    assert remap_key("model.norm.weight", rules) == "norm.weight"
    assert remap_key("model.x", rules) == "other.x"
    assert remap_key("rotary.inv_freq", rules) is None


def _weights_dir(path, value: float):
    path.mkdir(parents=True)
    (path / "config.json").write_text('{"model_type": "llama"}')
    save_file({"w": torch.full((4, 4), value)}, str(path / "model.safetensors"))
    return path


def test_model_id_keeps_the_org_and_local_paths_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert model_id("some-org/tiny-llama") == "some-org/tiny-llama"
    local = _weights_dir(tmp_path / "tiny-llama", 1.0)
    assert model_id(local) == str(local.resolve())
    assert model_id("tiny-llama") == str(local.resolve())
    assert checkpoint_name(".") == tmp_path.name


def test_unknown_hf_id_resolves_to_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    assert resolve_checkpoint_dir("acme/absent") is None


@pytest.mark.parametrize("mesh", [(1, 1), (1, 2), (1, 8), (8, 4), (2, 2)])
@pytest.mark.parametrize("placement", [REPLICATED, COLUMN_PARALLEL, ROW_PARALLEL, EXPERT_PARALLEL],
                         ids=["replicated", "column", "row", "expert"])
def test_shard_then_unshard_is_identity(mesh, placement):
    tensor = torch.randn(64, 128, 64) if placement is EXPERT_PARALLEL else torch.randn(256, 512)
    shards = shard(tensor, placement, mesh)
    assert len(shards) == (1 if placement is REPLICATED else mesh[0] * mesh[1])
    assert all(s.is_contiguous() for s in shards)
    assert torch.equal(unshard(shards, placement, mesh), tensor)


def test_column_parallel_gives_each_column_its_block():
    tensor = torch.arange(8 * 4).reshape(8, 4)
    shards = shard(tensor, COLUMN_PARALLEL, (2, 2))
    assert torch.equal(shards[1], tensor[:4, 2:])  # row 0, column 1
    assert torch.equal(shards[2], tensor[4:, :2])  # row 1, column 0


def test_indivisible_split_is_a_clear_error():
    with pytest.raises(ValueError, match="cannot split"):
        shard(torch.randn(10, 10), COLUMN_PARALLEL, (1, 3))


@pytest.mark.parametrize("text, expected", [("T3K", (1, 8)), ("tg", (8, 4)), ("1x2", (1, 2)), ((2, 4), (2, 4))])
def test_mesh_shape_spellings(text, expected):
    assert parse_mesh_shape(text) == expected


@pytest.mark.parametrize("bad", ["0x2", "1x2x3", "big"])
def test_bad_mesh_shape_is_a_clear_error(bad):
    with pytest.raises(ValueError):
        parse_mesh_shape(bad)


def test_written_safetensors_read_back_by_both_readers_with_shared_storage(tmp_path):
    from models.common.safetensors_file import write_safetensors

    base = torch.randn(8, 16).to(torch.bfloat16)
    tensors = {"embed": base, "head": base, "view": base.T, "ints": torch.arange(5), "empty": torch.zeros(0, 3)}
    path = tmp_path / "out.safetensors"
    write_safetensors(path, tensors)
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    for name, value in load_file(path).items():
        assert torch.equal(value, tensors[name]), name
    mapped = SafetensorsFile(path)
    assert all(torch.equal(mapped.tensor(n), tensors[n]) for n in tensors)


@pytest.mark.parametrize("shape", [(4096, 32), (64, 96), (8, 4)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_fast_contiguous_transpose_is_exact(shape, dtype):
    from models.common.sharding import contiguous

    source = torch.randn(*shape).to(dtype)
    for view in (source.T, source[:, 1:], source):
        result = contiguous(view)
        assert result.is_contiguous() and result.dtype == dtype and torch.equal(result, view)


def test_unreadable_shard_index_is_a_clear_checkpoint_error(tmp_path):
    from models.common.safetensors_file import safetensors_files

    (tmp_path / "model.safetensors.index.json").write_text('{"metadata": {}}')
    with pytest.raises(CheckpointError, match="weight_map"):
        safetensors_files(tmp_path)
    (tmp_path / "model.safetensors.index.json").unlink()
    with pytest.raises(CheckpointError, match="holds no"):
        safetensors_files(tmp_path)


def test_registry_maps_model_types_and_rejects_unknown_ones():
    from models.registry import family_of, loader_class

    assert family_of({"model_type": "gemma3_text"}) == "gemma3"
    assert loader_class("qwen3_moe").family == "qwen3_moe"
    with pytest.raises(ValueError, match="no loader for model_type"):
        family_of({"model_type": "bert"})
    with pytest.raises(ValueError, match="unknown family"):
        loader_class("bert")


def test_attention_heads_that_do_not_divide_the_columns_are_padded():
    from models.common.decoder import fuse_qkv
    from models.common.heads import kv_heads_per_column
    from models.common.model_args import ModelArgs

    assert kv_heads_per_column(2, 8) == [[0], [0], [0], [0], [1], [1], [1], [1]]
    with pytest.raises(ValueError, match="KV heads cannot be spread"):
        kv_heads_per_column(3, 2)
    args = ModelArgs.from_hf_config({"num_hidden_layers": 1, "num_attention_heads": 6, "hidden_size": 64,
                                     "vocab_size": 8, "head_dim": 8, "num_key_value_heads": 2})
    # 6 query heads / 2 KV heads on 4 columns: padded (2 query slots and 1 KV head a column), not refused
    fused = fuse_qkv(torch.ones(48, 64), torch.ones(16, 64), torch.ones(16, 64), args, cols=4)
    assert fused.shape == (64, 4 * (2 + 1 + 1) * 8)
    assert int((fused[0] == 0).sum()) == 2 * 8  # two padding query heads of zeros
