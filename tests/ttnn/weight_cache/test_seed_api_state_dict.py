# SPDX-License-Identifier: Apache-2.0
"""The seed API's warm state dict, model-args facts and temp files.

The caches they use: tests/weight_cache/seed_api.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from models.common import weight_cache as wc
from models.common.weight_cache.placeholders import placeholder
from models.testing import weight_cache_seeder as seeder
from tests.ttnn.weight_cache.seed_api import (
    status,
)

# --------------------------------------------------------------------------------------------
# the warm state dict
# --------------------------------------------------------------------------------------------


@pytest.fixture
def warm_sd(seeded_cache) -> wc.CachedStateDict:
    assert status(seeded_cache).warm
    return wc.build_cached_state_dict(seeded_cache.root)


def test_warm_state_dict_is_a_truthy_mutable_mapping_flagged_as_placeholder(warm_sd, seeded_cache) -> None:
    from collections.abc import MutableMapping

    assert isinstance(warm_sd, MutableMapping)
    assert warm_sd.is_placeholder is True and bool(warm_sd)
    assert set(warm_sd) == set(seeded_cache.state_dict) and len(warm_sd) == len(seeded_cache.state_dict)
    assert "norm.weight" in warm_sd and "missing.weight" not in warm_sd and 3 not in warm_sd
    assert warm_sd.get("missing.weight") is None
    with pytest.raises(KeyError):
        warm_sd["missing.weight"]


def test_warm_state_dict_host_keys_are_real(warm_sd, seeded_cache) -> None:
    assert warm_sd.host_keys() == frozenset(seeder.HOST_KEYS)
    real = warm_sd["tok_embeddings.weight"]
    assert not real.is_meta and torch.equal(real, seeded_cache.state_dict["tok_embeddings.weight"])


def test_warm_state_dict_overrides_shadow_the_manifest_and_the_host_weights(warm_sd) -> None:
    derived = torch.zeros(4)
    warm_sd["norm.weight"] = derived
    warm_sd["tok_embeddings.weight"] = derived
    warm_sd["extra.weight"] = derived
    assert warm_sd["norm.weight"] is derived and warm_sd["tok_embeddings.weight"] is derived
    keys = list(warm_sd)
    assert len(keys) == len(set(keys)) == len(warm_sd)
    assert warm_sd.setdefault("extra.weight", torch.ones(1)) is derived
    assert warm_sd.setdefault("new.weight", derived) is derived


def test_warm_state_dict_deletes_hide_keys_until_set_again(warm_sd) -> None:
    count = len(warm_sd)
    del warm_sd["layers.0.attention.wq.weight"]
    del warm_sd["tok_embeddings.weight"]
    assert "layers.0.attention.wq.weight" not in warm_sd and len(warm_sd) == count - 2
    assert "tok_embeddings.weight" not in list(warm_sd)
    with pytest.raises(KeyError):
        warm_sd["layers.0.attention.wq.weight"]
    with pytest.raises(KeyError):
        del warm_sd["layers.0.attention.wq.weight"]
    with pytest.raises(KeyError):
        del warm_sd["never.existed"]
    warm_sd["layers.0.attention.wq.weight"] = torch.ones(2)
    assert torch.equal(warm_sd["layers.0.attention.wq.weight"], torch.ones(2)) and len(warm_sd) == count - 1
    assert warm_sd.pop("norm.weight").is_meta and "norm.weight" not in warm_sd


def test_warm_state_dict_items_are_placeholders_without_storage(warm_sd) -> None:
    for key, value in warm_sd.items():
        assert value.is_meta == (key not in seeder.HOST_KEYS)


def test_build_cached_state_dict_without_a_marker_raises(built_cache) -> None:
    with pytest.raises(wc.WeightCacheError):
        wc.build_cached_state_dict(built_cache.root)


def test_build_cached_state_dict_raises_when_the_sidecar_vanished(seeded_cache) -> None:
    wc.VariantPaths(seeded_cache.root).host_sidecar.unlink()
    with pytest.raises(wc.WeightCacheError, match="vanished"):
        wc.build_cached_state_dict(seeded_cache.root)


def test_build_cached_state_dict_uses_a_given_host_dict(seeded_cache) -> None:
    host = {"tok_embeddings.weight": torch.zeros(96, 64, dtype=torch.bfloat16)}
    sd = wc.build_cached_state_dict(seeded_cache.root, host=host)
    assert sd["tok_embeddings.weight"] is host["tok_embeddings.weight"]


def _moe_state_dict(n_experts: int) -> dict[str, torch.Tensor]:
    sd = {"tok_embeddings.weight": torch.zeros(96, 64, dtype=torch.bfloat16)}
    for e in range(n_experts):
        sd[f"layers.0.block_sparse_moe.experts.{e}.w1.weight"] = placeholder((128, 64), torch.bfloat16)
    sd["layers.0.attention.wqkv.weight"] = placeholder((192, 64), torch.bfloat16)
    return sd


def test_args_facts_are_restored_from_the_manifest_with_more_than_ten_experts(built_cache) -> None:
    assert seeder.mark(built_cache.root, _moe_state_dict(16), is_moe=True, model_info={})
    args = SimpleNamespace(num_experts=0)
    wc.build_cached_state_dict(built_cache.root, args=args)
    assert args.is_mixture_of_experts is True and args.moe is True
    assert args.num_experts == 16
    assert args.fuse_qkv is True and args.fuse_mlp is False


def test_args_facts_from_model_info_win_over_key_sniffing(built_cache) -> None:
    info = {"num_experts": 64, "fuse_qkv": False, "fuse_mlp": True}
    assert seeder.mark(built_cache.root, _moe_state_dict(3), is_moe=True, model_info=info)
    args = SimpleNamespace()
    wc.build_cached_state_dict(built_cache.root, args=args)
    assert (args.num_experts, args.fuse_qkv, args.fuse_mlp) == (64, False, True)


def test_args_num_experts_is_not_clobbered_when_nothing_says_otherwise(built_cache) -> None:
    sd = {"tok_embeddings.weight": torch.zeros(96, 64, dtype=torch.bfloat16),
          "layers.0.feed_forward.experts.gate_up_proj": placeholder((8, 64, 256), torch.bfloat16)}
    assert seeder.mark(built_cache.root, sd, is_moe=True, model_info={})
    args = SimpleNamespace(num_experts=8)
    wc.build_cached_state_dict(built_cache.root, args=args)
    assert args.num_experts == 8 and args.moe is True
    with_local = SimpleNamespace(num_local_experts=32)
    wc.build_cached_state_dict(built_cache.root, args=with_local)
    assert with_local.num_experts == 32


def test_dense_model_args_are_not_flagged_moe(seeded_cache) -> None:
    args = SimpleNamespace()
    wc.build_cached_state_dict(seeded_cache.root, args=args)
    assert args.is_mixture_of_experts is False and not hasattr(args, "moe")
    assert args.fuse_qkv is False and args.fuse_mlp is False


# --------------------------------------------------------------------------------------------
# rule 6 (in process): temp files
# --------------------------------------------------------------------------------------------


def test_no_temp_file_is_left_after_a_successful_mark(seeded_cache) -> None:
    assert seeded_cache.mark()
    leftovers = [p for p in seeded_cache.root.rglob("*") if ".tmp." in p.name]
    assert leftovers == []


def test_placeholder_safe_transforms_give_shapes_on_placeholders_and_values_on_real_tensors():
    from models.common.weight_cache.placeholders import concat, fp32_elementwise, placeholder, stack

    real = [torch.randn(4, 3).to(torch.bfloat16), torch.randn(2, 3).to(torch.bfloat16)]
    fake = [placeholder(t.shape, t.dtype) for t in real]
    assert torch.equal(concat(real), torch.cat(real))
    joined = concat(fake)
    assert joined.is_meta and tuple(joined.shape) == (6, 3) and joined.dtype == torch.bfloat16
    same = [real[0], real[0].clone()]
    assert torch.equal(stack(same), torch.stack(same))
    stacked = stack([fake[0], fake[0]])
    assert stacked.is_meta and tuple(stacked.shape) == (2, 4, 3)
    assert torch.equal(fp32_elementwise(real[0], lambda w: w + 1.0), real[0].float() + 1.0)
    shifted = fp32_elementwise(fake[0], lambda w: w + 1.0)
    assert shifted.is_meta and shifted.dtype == torch.float32 and tuple(shifted.shape) == (4, 3)


def test_the_default_variants_sidecar_has_the_upstream_name(tmp_path) -> None:
    assert wc.VariantPaths(tmp_path).host_sidecar.name == wc.HOST_WEIGHTS_SIDECAR == ".host_weights.safetensors"
    assert wc.VariantPaths(tmp_path, {"precision": "bfloat16"}).host_sidecar.name != wc.HOST_WEIGHTS_SIDECAR
