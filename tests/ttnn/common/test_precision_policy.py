# SPDX-License-Identifier: Apache-2.0
"""Precision policies as tt-transformers defines them, and as the cache identity sees them.

The named policies hold tt-transformers' settings per group and decoder (``model_config.py``'s
``ModelOptimizations`` and the per-model decoder files); every spelling of one per-decoder map is
one build variant, and any difference in it another; a plain dtype keeps the variant it always had."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from models.common.precision import PolicyError, group_of, spec_problem
from models.common.weight_cache.variant import variant_tag
from models.registry import FAMILIES, family_facts

DECODER_GROUPS = ("wqkv", "wo", "ff1_ff3", "ff2")


def resolve_policy(spec, family: str, model: str):
    return family_facts(family).policy(spec, model)


def variant(spec, family: str = "llama", model: str = "SmolLM2-135M") -> dict:
    return family_facts(family).build_variant(resolve_policy(spec, family, model))


def write(path: Path, body: dict) -> Path:
    path.write_text(json.dumps(body))
    return path


@pytest.mark.parametrize("family", [f.name for f in FAMILIES])
def test_performance_is_bfp4_gate_up_and_bfp8_elsewhere_for_every_family(family) -> None:
    policy = resolve_policy("performance", family, "SmolLM2-135M")
    assert policy.label == "performance" and not policy.decoders
    assert {g: policy.dtype(g, 0) for g in DECODER_GROUPS} == {
        "wqkv": "bfloat8_b", "wo": "bfloat8_b", "ff1_ff3": "bfloat4_b", "ff2": "bfloat8_b"}
    assert policy.dtype("lm_head") == "bfloat8_b"


@pytest.mark.parametrize("model, attention", [
    ("SmolLM2-135M", "bfloat16"), ("Qwen2.5-Coder-0.5B-Instruct", "bfloat16"), ("gemma-3-270m", "bfloat16"),
    ("Llama-3.2-1B-Instruct", "bfloat8_b"), ("Mistral-7B-Instruct-v0.3", "bfloat8_b"), ("phi-4", "bfloat8_b"),
])
def test_accuracy_keeps_attention_bf16_except_where_tt_transformers_found_it_insensitive(model, attention) -> None:
    policy = resolve_policy("accuracy", "llama", model)
    assert (policy.dtype("wqkv", 3), policy.dtype("wo", 3)) == (attention, attention)
    assert (policy.dtype("ff1_ff3", 3), policy.dtype("ff2", 3)) == ("bfloat8_b", "bfloat8_b")
    # where every group is bfloat8_b, accuracy *is* the bfloat8_b build: one map, one name, one cache
    assert policy.label == ("accuracy" if attention == "bfloat16" else "bfloat8_b")


def test_per_model_rules_and_decoder_overrides_follow_tt_transformers() -> None:
    llama8b = resolve_policy("performance", "llama", "Llama-3.1-8B-Instruct")
    assert llama8b.label == "performance" and llama8b.dtype("ff1_ff3", 31) == "bfloat8_b"
    assert {llama8b.dtype("ff1_ff3", d) for d in range(31)} == {"bfloat4_b"}
    assert llama8b.dtype("ff1_ff3", 30) == "bfloat4_b" and llama8b.dtype("wqkv", 31) == "bfloat8_b"
    qwen7b = resolve_policy("performance", "qwen2", "Qwen2.5-7B-Instruct")
    assert (qwen7b.dtype("wqkv", 0), qwen7b.dtype("ff1_ff3", 0)) == ("bfloat16", "bfloat8_b")
    qwen32b = resolve_policy("performance", "qwen3", "Qwen3-32B")
    assert qwen32b.label == "performance" and {qwen32b.dtype(g, d) for g in DECODER_GROUPS for d in range(64)} == \
        {"bfloat4_b"} and qwen32b.dtype("lm_head") == "bfloat8_b"
    big = resolve_policy("accuracy", "llama", "Llama-3.1-70B-Instruct")
    assert (big.dtype("ff1_ff3", 0), big.dtype("wqkv", 0)) == ("bfloat4_b", "bfloat8_b")


def test_every_loader_weight_is_in_the_group_its_name_says() -> None:
    assert group_of("output") == ("lm_head", None)
    assert group_of("layers.7.attention.wqkv") == ("wqkv", 7)
    assert group_of("layers.7.attention.wqk") == ("wqkv", 7)  # Gemma 4's KV-shared layers
    assert group_of("layers.7.attention.wo") == ("wo", 7)
    for name in ("feed_forward.w1", "feed_forward.w3", "feed_forward.experts.w1", "moe.experts.w3"):
        assert group_of(f"layers.2.{name}") == ("ff1_ff3", 2)
    for name in ("feed_forward.w2", "feed_forward.experts.w2", "moe.experts.w2"):
        assert group_of(f"layers.2.{name}") == ("ff2", 2)
    assert group_of("vision.layers.3.attention.wq") == ("vision", None)
    assert group_of("layers.4.per_layer_input_gate") == ("per_layer_input", None)
    with pytest.raises(LookupError):
        group_of("layers.0.attention_norm")  # norms are not a policy's: stored as the device reads them


def test_a_plain_dtype_keeps_the_variant_it_always_had() -> None:
    for dtype in ("bfloat16", "bfloat8_b", "bfloat4_b", "float32"):
        assert variant(dtype) == {"family": "llama", "precision": dtype, "layout_version": 1}
        assert family_facts("llama").build_variant(dtype) == variant(dtype)


def test_two_spellings_of_one_policy_are_one_variant(tmp_path) -> None:
    tt_spelling = write(tmp_path / "tt.json", {"decoders": {"1": {"precision_cfg": {"FF1_FF3": "BFP8"},
                                                                   "fidelity_cfg": {"LI_FF1_FF3": "LOFI"}}}})
    our_spelling = write(tmp_path / "ours.json", {
        "base": "performance", "decoders": {"1": {"precision_cfg": {"ff1_ff3": "bfloat8_b", "wo": "BFP8",
                                                                     "KV_CACHE": "BFP8"}}}})
    assert variant(tt_spelling) == variant(our_spelling)
    assert variant(tt_spelling)["precision"].startswith("custom-")
    assert variant(tt_spelling)["policy"]["decoders"] == {"1": {"ff1_ff3": "bfloat8_b"}}
    # the performance map spelled out as a file is performance
    spelled = write(tmp_path / "perf.json", {"base": "bfloat8_b", "groups": {"FF1_FF3": "BFP4"}})
    assert variant(spelled) == variant("performance") and variant(spelled)["precision"] == "performance"
    # a model's own override written out is that model's performance policy
    own = write(tmp_path / "llama8b.json", {"decoders": {"31": {"precision_cfg": {"FF1_FF3": "BFP8"}}}})
    assert variant(own, model="Llama-3.1-8B-Instruct") == variant("performance", model="Llama-3.1-8B-Instruct")
    # every group in one dtype is that dtype's build, with the variant it always had
    flat = write(tmp_path / "flat.json", {"base": "bfloat16", "groups": {"wqkv": "BF16"}})
    assert variant(flat) == variant("bfloat16")


def test_a_one_decoder_difference_is_another_variant(tmp_path) -> None:
    one = write(tmp_path / "one.json", {"decoders": {"1": {"precision_cfg": {"FF1_FF3": "BFP8"}}}})
    other = write(tmp_path / "other.json", {"decoders": {"0": {"precision_cfg": {"FF1_FF3": "BFP8"}}}})
    tags = {variant_tag(variant(spec)) for spec in (one, other, "performance", "accuracy", "bfloat8_b")}
    assert len(tags) == 5
    assert variant(one)["precision"] != variant(other)["precision"]  # custom-<digest8>: another dir too


@pytest.mark.parametrize("body, problem", [
    ({"decoders": {"0": {"precision_cfg": {"FF4": "BFP8"}}}}, "unknown tensor group 'FF4'"),
    ({"groups": {"vision": "BFP8"}}, "unknown tensor group 'vision' (llama has: wqkv, wo, ff1_ff3, ff2, lm_head)"),
    ({"decoders": {"0": {"precision_cfg": {"WO": "int8"}}}}, "dtype 'int8' cannot be stored"),
    ({"decoders": {"x": {}}}, "decoders.x: expected a decoder number"),
    ({"base": "fast"}, "base 'fast' is no policy"),
    ({"decoders": {"0": {"precision_cfg": {"lm_head": "BF16"}}}}, "only wqkv, wo, ff1_ff3, ff2 are set per decoder"),
])
def test_a_bad_policy_file_is_one_line_naming_the_spot(tmp_path, body, problem) -> None:
    path = write(tmp_path / "bad.json", body)
    with pytest.raises(PolicyError) as raised:
        resolve_policy(path, "llama", "SmolLM2-135M")
    assert problem in str(raised.value) and str(path) in str(raised.value) and "\n" not in str(raised.value)


def test_bad_names_and_out_of_range_decoders_are_refused(tmp_path) -> None:
    assert "unknown precision 'fast'" in spec_problem("fast")
    assert spec_problem("performance") is None and spec_problem("bfloat4_b") is None
    assert "cannot read" in spec_problem(str(tmp_path / "missing.json"))
    assert "expected an object" in spec_problem(str(write(tmp_path / "empty.json", {})))
    (tmp_path / "torn.json").write_text('{"decoders": {')
    assert "not a JSON precision policy" in spec_problem(str(tmp_path / "torn.json"))
    far = resolve_policy(write(tmp_path / "far.json", {"decoders": {"40": {"precision_cfg": {"WO": "BF16"}}}}),
                         "llama", "SmolLM2-135M")
    far.check_decoders(41)
    with pytest.raises(PolicyError, match="decoder 40 is out of range .the model has 30 decoders, 0 to 29."):
        far.check_decoders(30)


def test_a_file_overriding_every_decoder_is_the_group_setting_it_spells(tmp_path) -> None:
    """tt-transformers' Qwen3-32B file lists all 64 decoders; over the model's decoders (its
    config.json) that is one map with a group setting, and one variant with its shorter spelling."""
    model = tmp_path / "Qwen3-4B"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen3", "num_hidden_layers": 4}))
    every = write(tmp_path / "every.json", {"decoders": {str(d): {"precision_cfg": {
        "WQKV": "BFP4", "WO": "BFP4", "FF1_FF3": "BFP4", "FF2": "BFP4"}} for d in range(4)}})
    short = write(tmp_path / "short.json", {"base": "bfloat4_b", "groups": {"lm_head": "BFP8"}})
    three = write(tmp_path / "three.json", {"decoders": {str(d): {"precision_cfg": {
        "WQKV": "BFP4", "WO": "BFP4", "FF1_FF3": "BFP4", "FF2": "BFP4"}} for d in range(3)}})
    facts = family_facts("qwen3")
    assert facts.build_variant(facts.policy(every, model)) == facts.build_variant(facts.policy(short, model))
    assert facts.policy(every, model).decoders == ()
    assert variant_tag(facts.build_variant(facts.policy(three, model))) != \
        variant_tag(facts.build_variant(facts.policy(short, model)))
    with pytest.raises(PolicyError, match="decoder 4 is out of range .the model has 4 decoders"):
        facts.policy(write(tmp_path / "far.json", {"decoders": {"4": {"precision_cfg": {}}}}), model)
