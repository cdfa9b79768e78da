# SPDX-License-Identifier: Apache-2.0
"""Builds under a precision policy: every weight in its group's dtype for its decoder, each file the
bytes ``ttnn.as_tensor`` writes for that weight and dtype; a per-decoder override on its decoder only;
one cache per per-decoder map, whatever its spelling; warm equal to cold under every policy; bad
policies refused in one line (exit 2) before anything is built.

The expected dtypes are written out here from tt-transformers' policy (``model_config.py``), not
taken from :mod:`models.common.precision`, so a wrong group table fails."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
import ttnn

from models.common.conversion import LazyStateDict, WeightSink
from models.common.safetensors_file import CheckpointReader
from models.common.weight_cache.checkpoint_proof import ProvenCheckpoint
from models.common.weight_cache.layout import list_cache_files
from models.common.weight_cache.tensor_cache import tensorbin_name
from models.registry import loader_class
from models.testing.tiny_models import as_hub_snapshot, make_checkpoint
from models.testing.tt_cache import cli_env, tt_cache

# tt-transformers' performance policy: gate/up (MoE experts' too) bfloat4_b, every other linear bfloat8_b;
# embeddings, norms and routers as the device code reads them
PERFORMANCE = (
    (r"layers\.\d+\.feed_forward\.(experts\.)?w[13]", "BFLOAT4_B"),
    (r"layers\.\d+\.feed_forward\.(experts\.)?w2|layers\.\d+\.attention\.w(qkv|o)|output", "BFLOAT8_B"),
    (r"tok_embeddings|norm|layers\.\d+\.(attention_norm|ffn_norm|attention\.[qk]_norm|feed_forward\.gate)",
     "BFLOAT16"),
)


def expected_dtype(name: str, table=PERFORMANCE, decoder_overrides: dict[int, str] | None = None) -> str:
    layer = re.match(r"layers\.(\d+)\.feed_forward\.(experts\.)?w[13]$", name)
    if layer and decoder_overrides and int(layer.group(1)) in decoder_overrides:
        return decoder_overrides[int(layer.group(1))]
    for pattern, dtype in table:
        if re.fullmatch(pattern, name):
            return dtype
    raise AssertionError(f"no expected dtype for {name}")


class Capture(WeightSink):
    """Each weight as ``convert`` hands it over: the host tensor ``ttnn.as_tensor`` would be given."""

    def __init__(self, state) -> None:
        super().__init__(None, state, [])
        self.tensors: dict[str, tuple[torch.Tensor, object]] = {}

    def put(self, name, tensor, fmt) -> None:
        self.tensors[name] = (tensor.clone(), fmt)


def host_tensors(loader, args) -> dict[str, tuple[torch.Tensor, object]]:
    with ProvenCheckpoint(loader.identity) as proof:
        reader = CheckpointReader(loader.checkpoint_dir, loader.key_rules, proof)
        sink = Capture(LazyStateDict(reader))
        loader.convert(sink, args)
        reader.close()
    return sink.tensors


def generation_files(loader) -> Path:
    marker = loader.status().marker
    assert marker is not None and loader.status().warm
    return loader.cache_dir / marker.generation if marker.generation else loader.cache_dir


def loader_for(checkpoint: Path, precision, cache_root: Path, family: str = "llama"):
    return loader_class(family)(str(checkpoint), precision=precision, cache_root=cache_root)


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return make_checkpoint("llama", tmp_path_factory.mktemp("policy") / "tiny-llama")


@pytest.fixture(scope="module")
def moe(tmp_path_factory) -> Path:
    return make_checkpoint("qwen3_moe", tmp_path_factory.mktemp("policy") / "tiny-qwen3-moe")


@pytest.mark.parametrize("family", ["llama", "qwen3_moe"])
def test_a_performance_build_writes_each_group_in_its_dtype_byte_for_byte_as_ttnn(family, llama, moe, tmp_path):
    checkpoint = llama if family == "llama" else moe
    loader = loader_for(checkpoint, "performance", tmp_path / "cache", family)
    loader.seed()
    assert loader.cache_dir.parent.name == "performance"
    root = generation_files(loader)
    args = loader.make_args(loader.model_config(), None)
    captured = host_tensors(loader, args)
    if family == "qwen3_moe":
        assert "layers.1.feed_forward.experts.w1" in captured  # the MoE layer's experts are in the build
    written = set(list_cache_files(root))
    for name, (tensor, fmt) in captured.items():
        assert fmt.dtype.name == expected_dtype(name), name
        relative = tensorbin_name(name, fmt)
        assert relative in written, relative
        reference = tmp_path / "as_tensor" / name
        reference.parent.mkdir(parents=True, exist_ok=True)
        ttnn.as_tensor(tensor, dtype=getattr(ttnn, expected_dtype(name).lower()), layout=fmt.layout,
                       cache_file_name=str(reference))
        produced = reference.parent / f"{reference.name}_dtype_{fmt.dtype.name}_layout_{fmt.layout.name}.tensorbin"
        assert (root / relative).read_bytes() == produced.read_bytes(), name
    assert len(written) == len(captured)


def test_a_per_decoder_override_lands_on_its_decoder_only(llama, tmp_path) -> None:
    policy = tmp_path / "decoder1.json"
    policy.write_text(json.dumps({"decoders": {"1": {"precision_cfg": {"FF1_FF3": "BFP8"}}}}))
    performance = loader_for(llama, "performance", tmp_path / "cache")
    override = loader_for(llama, policy, tmp_path / "cache")
    performance.seed(), override.seed()
    ours, theirs = generation_files(override), generation_files(performance)
    files, base = list_cache_files(ours), list_cache_files(theirs)
    changed = {"layers.1/feed_forward.w1", "layers.1/feed_forward.w3"}
    for relative in files:
        stem = relative.split("_dtype_")[0]
        if stem in changed:
            assert "_dtype_BFLOAT8_B_" in relative, relative
        else:  # every other file: the performance build's, byte for byte
            assert relative in base and (ours / relative).read_bytes() == (theirs / relative).read_bytes(), relative
    assert {r.split("_dtype_")[0] for r in files if "BFLOAT4_B" in r} == {"layers.0/feed_forward.w1",
                                                                         "layers.0/feed_forward.w3"}


def test_a_models_own_override_from_tt_transformers_lands_on_decoder_31(tmp_path) -> None:
    """Llama-3.1-8B-Instruct's performance_decoder_config.json: decoder 31 keeps gate/up at bfloat8_b."""
    checkpoint = make_checkpoint("llama", tmp_path / "src", num_hidden_layers=32, hidden_size=64, head_dim=16,
                                 intermediate_size=64, vocab_size=64)
    snapshot = as_hub_snapshot(checkpoint, tmp_path / "hub", "meta-llama/Llama-3.1-8B-Instruct")
    loader = loader_for(snapshot, "performance", tmp_path / "cache")
    loader.seed()
    files = list_cache_files(generation_files(loader))
    gate_up = {r.split("_dtype_")[0]: r for r in files if re.search(r"feed_forward\.w[13]_", r)}
    assert len(gate_up) == 64
    for stem, relative in gate_up.items():
        assert ("BFLOAT8_B" if stem.startswith("layers.31/") else "BFLOAT4_B") in relative, relative


def test_two_spellings_share_a_cache_and_a_one_decoder_difference_does_not(llama, tmp_path) -> None:
    spelled = tmp_path / "spelled.json"  # performance, written out as a base and a group
    spelled.write_text(json.dumps({"base": "bfloat8_b", "groups": {"ff1_ff3": "BFP4"}}))
    first = loader_for(llama, "performance", tmp_path / "cache").load()
    again = loader_for(llama, spelled, tmp_path / "cache").load()
    assert not first.warm and again.warm and again.cache_dir == first.cache_dir
    one_decoder = tmp_path / "one-decoder.json"
    one_decoder.write_text(json.dumps({"decoders": {"0": {"precision_cfg": {"WO": "BF16", "FF1_FF3": "BFP4"}}}}))
    other = loader_for(llama, one_decoder, tmp_path / "cache")
    loaded = other.load()
    assert not loaded.warm and loaded.cache_dir != first.cache_dir
    assert loaded.cache_dir.parent.name == other.precision and other.precision.startswith("custom-")
    assert loaded.formats["layers.0.attention.wo"].dtype == ttnn.bfloat16
    assert loaded.formats["layers.1.attention.wo"].dtype == ttnn.bfloat8_b
    marker = other.status().marker
    recorded = marker.build_variant["policy"]  # the marker records the map: wo per decoder
    assert [recorded["decoders"].get(str(d), {}).get("wo", recorded["groups"]["wo"]) for d in (0, 1)] == \
        ["bfloat16", "bfloat8_b"]
    env = cli_env(tmp_path / "cache")
    listed, checked = tt_cache("ls", env=env).stdout, tt_cache("check", str(tmp_path / "cache"), env=env).stdout
    for name in ("performance", other.precision):  # custom-<digest8>: the digest of the map
        assert re.search(rf" {name} +1x1 ", listed) and f": warm [{name}]" in checked, listed + checked


@pytest.mark.parametrize("precision", ["performance", "accuracy", "bfloat16", "bfloat8_b", "bfloat4_b", "file"])
def test_warm_equals_cold_under_every_policy(precision, llama, tmp_path) -> None:
    if precision == "file":
        precision = tmp_path / "custom.json"
        precision.write_text(json.dumps({"base": "accuracy", "groups": {"lm_head": "BF16"},
                                         "decoders": {"1": {"precision_cfg": {"FF2": "BFP4"}}}}))
    cold = loader_for(llama, precision, tmp_path / "cache").load()
    warm = loader_for(llama, precision, tmp_path / "cache").load()
    assert not cold.warm and warm.warm and warm.cache_dir == cold.cache_dir
    assert warm.formats == cold.formats
    for name, weight in cold.weights.items():
        assert torch.equal(ttnn.to_torch(warm.weights[name]), ttnn.to_torch(weight)), name


BAD_POLICIES = {
    "name": ("fast", None, "unknown precision 'fast': expected a dtype"),
    "group": (None, {"decoders": {"0": {"precision_cfg": {"FF4": "BFP8"}}}}, "unknown tensor group 'FF4'"),
    "family group": (None, {"groups": {"vision": "BFP8"}}, "unknown tensor group 'vision' (llama has:"),
    "decoder": (None, {"decoders": {"2": {"precision_cfg": {"WO": "BF16"}}}},
                "decoder 2 is out of range (the model has 2 decoders, 0 to 1)"),
    "dtype": (None, {"decoders": {"0": {"precision_cfg": {"WO": "int8"}}}}, "dtype 'int8' cannot be stored"),
    "json": (None, "{not json", "not a JSON precision policy"),
    "missing": ("missing.json", None, "cannot read the precision policy"),
}


@pytest.mark.parametrize("kind", list(BAD_POLICIES))
def test_every_bad_policy_is_one_line_exit_2_before_any_work(kind, llama, tmp_path) -> None:
    spec, body, problem = BAD_POLICIES[kind]
    if body is not None:
        spec = tmp_path / "bad.json"
        spec.write_text(body if isinstance(body, str) else json.dumps(body))
    elif spec.endswith(".json"):
        spec = tmp_path / spec
    env = cli_env(tmp_path / "cache")
    plan = tmp_path / "plan.yaml"
    plan.write_text(f"models:\n  - {{model: {llama}, meshes: [N150], precisions: [performance, '{spec}']}}\n")
    for command in (("build", str(llama), "--precision", str(spec)), ("seed", "--plan", str(plan))):
        done = tt_cache(*command, env=env)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and problem in lines[0], done.stderr[-2000:]
        assert lines[0].startswith(f"tt-cache {command[0]}: ") and "Traceback" not in done.stdout + done.stderr
    assert not (tmp_path / "cache").exists()  # nothing built, nothing locked


def test_gc_keep_plan_keeps_a_cache_only_models_policy_under_the_dir_its_map_names(llama, tmp_path) -> None:
    """A plan's ``accuracy`` for a Llama 3 is the bfloat8_b build (every group bfloat8_b: one map):
    with its checkpoint gone (the entry cannot be opened) gc still finds and keeps that variant."""
    gone = tmp_path / "Llama-3.2-1B"
    shutil.copytree(llama, gone)
    root = tmp_path / "cache"
    kept = loader_for(gone, "accuracy", root)
    assert kept.precision == "bfloat8_b" and not kept.load().warm
    other = loader_for(llama, "performance", root)
    other.load()
    shutil.rmtree(gone)
    plan = tmp_path / "plan.yaml"
    plan.write_text(f"models:\n  - {{model: {gone}, meshes: [N150], precisions: [accuracy]}}\n")
    gc = tt_cache("gc", str(root), "--max-size", "0", "--keep-plan", str(plan), "--json", env=cli_env())
    assert gc.returncode == 0, gc.stderr[-2000:]
    assert json.loads(gc.stdout)["protected"] == [str(kept.paths.marker)]
    assert {str(p) for p in root.rglob(".weights_complete.*")} == {str(kept.paths.marker)}
