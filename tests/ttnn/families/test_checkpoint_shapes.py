# SPDX-License-Identifier: Apache-2.0
"""A ``config.json`` that does not describe its checkpoint is refused before anything is built: every
family, each of the sizes a conversion lays weights out by (head size, MLP width, vocabulary, KV
heads) set wrong, is one line naming the tensor, its shape and the one the config implies (the
loader's :class:`CheckpointShapeError`, ``tt-cache build``'s exit 2), and no cache dir, no lock, no
file of a build. Without the check, most of these built, cached and served warm a model whose
forward then failed in a matmul."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from models.common.checkpoint import CheckpointShapeError
from models.common.safetensors_file import SafetensorsFile, safetensors_files
from models.registry import family_of, loader_class
from models.testing.tiny_gemma4 import make_multimodal_checkpoint, make_text_checkpoint
from models.testing.tiny_models import make_checkpoint
from models.testing.tt_cache import cli_env, error_line, json_out, tt_cache

MAKERS: dict[str, Callable[[Path], Path]] = {
    **{family: (lambda d, f=family: make_checkpoint(f, d))
       for family in ("llama", "mistral", "phi3", "qwen2", "qwen3", "qwen3_moe", "gemma3")},
    **{f"gemma4_{variant}": (lambda d, v=variant: make_text_checkpoint(d, v)) for variant in ("kv_shared", "k_eq_v", "moe")},
    "gemma4_vision": make_multimodal_checkpoint,
}
FIELDS = ("head_dim", "intermediate_size", "vocab_size", "num_key_value_heads")
MESSAGE = re.compile(r"tensor (\S+) has shape \[([\d, ]*)\]; config\.json implies \[(.*)\] = \[([\d, ]*)\]$")


def _set_wrong(text: dict, field: str) -> None:
    """``field`` of a (text) config changed so that it still passes the config checks."""
    heads, kv = text["num_attention_heads"], text["num_key_value_heads"]
    if field == "head_dim":
        text["head_dim"] = 2 * (text.get("head_dim") or text["hidden_size"] // heads)
    elif field == "num_key_value_heads":
        text[field] = 2 * kv if heads % (2 * kv) == 0 else kv // 2
    elif field == "global head_dim":  # Gemma 4's wider global layers
        layer, override = next(iter(text["per_layer_config"].items()))
        text["per_layer_config"][layer] = {**override, "head_dim": 2 * override["head_dim"]}
    else:
        text[field] *= 2


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Callable[[str], Path]:
    """Each family's good checkpoint, made when first asked for."""
    root, made = tmp_path_factory.mktemp("good-shapes"), {}

    def get(name: str) -> Path:
        if name not in made:
            made[name] = MAKERS[name](root / name)
        return made[name]

    return get


def _wrong_checkpoint(good: Path, dest: Path, field: str) -> Path:
    shutil.copytree(good, dest)
    config = json.loads((dest / "config.json").read_text())
    _set_wrong(config.get("text_config") or config, field)
    (dest / "config.json").write_text(json.dumps(config))
    return dest


def _assert_names_the_tensor(message: str, checkpoint: Path, field: str) -> None:
    """One line naming a tensor of the checkpoint with its real shape, and a different expected shape
    whose expression holds the size set wrong."""
    assert "\n" not in message and str(checkpoint) in message, message
    found = MESSAGE.search(message)
    assert found, message
    name, shape, implied, expected = found.groups()
    real = next(SafetensorsFile(file).spec(name)[0] for file in set(safetensors_files(checkpoint).values())
                if name in SafetensorsFile(file).names())
    assert shape == ", ".join(map(str, real)) and expected != shape, message
    assert field.split()[-1] in implied, message
    if field == "global head_dim":
        assert ".layers.1." in name, message


def _assert_nothing_built(cache_root: Path) -> None:
    """No variant dir (so no lock file, generation or tensorbin): only the checkpoint's stamps, which
    identify it whatever its config says."""
    left = [p.name for p in cache_root.iterdir()] if cache_root.exists() else []
    assert set(left) <= {".stamps"}, left
    assert not [p for p in cache_root.rglob("*") if "tensorbin" in p.name or p.name == ".build.lock"]


CASES = [(name, field) for name in MAKERS for field in FIELDS] + [("gemma4_k_eq_v", "global head_dim")]


@pytest.mark.parametrize("name, field", CASES)
def test_a_loader_refuses_a_config_that_does_not_describe_its_checkpoint(good, tmp_path, name, field):
    checkpoint = _wrong_checkpoint(good(name), tmp_path / "model", field)
    cls = loader_class(family_of(json.loads((checkpoint / "config.json").read_text())))
    loader = cls(checkpoint, precision="bfloat16", cache_root=tmp_path / "cache", mesh_shape=(1, 2))
    with pytest.raises(CheckpointShapeError) as refused:
        loader.load()
    _assert_names_the_tensor(str(refused.value), checkpoint, field)
    _assert_nothing_built(tmp_path / "cache")


def test_the_good_checkpoints_pass_the_check(good, tmp_path):
    """Every family's tensors match the table (the check refuses nothing the conversion accepts)."""
    for name in MAKERS:
        checkpoint = good(name)
        loader = loader_class(family_of(json.loads((checkpoint / "config.json").read_text())))(
            checkpoint, precision="bfloat16", cache_root=tmp_path / "cache")
        loader.check_checkpoint(loader.make_args(loader.model_config(), None))


def _build_exits_2(good, tmp_path: Path, name: str, field: str) -> None:
    checkpoint = _wrong_checkpoint(good(name), tmp_path / "model", field)
    out = tt_cache("build", str(checkpoint), "--precision", "bfloat16", env=cli_env(tmp_path / "cache"))
    assert out.returncode == 2, out.stderr[-2000:]
    _assert_names_the_tensor(error_line(out, "build"), checkpoint, field)
    _assert_nothing_built(tmp_path / "cache")


@pytest.mark.parametrize("name, field", [(name, FIELDS[i % len(FIELDS)]) for i, name in enumerate(MAKERS)])
def test_tt_cache_build_of_a_config_that_does_not_describe_its_checkpoint_is_exit_2(good, tmp_path, name, field):
    """One size per family here (each a process importing ttnn); every one of them in the slow form."""
    _build_exits_2(good, tmp_path, name, field)


@pytest.mark.slow
@pytest.mark.parametrize("name, field", CASES)
def test_tt_cache_build_refuses_every_wrong_size_of_every_family(good, tmp_path, name, field):
    _build_exits_2(good, tmp_path, name, field)


def test_tt_cache_seed_fails_the_case_naming_the_tensor_and_builds_nothing(good, tmp_path):
    """A seed's case of such a checkpoint fails with the same line (the plan's other cases would still
    run: a failed case is exit 1, as for any bad model of a plan), and nothing is built."""
    checkpoint = _wrong_checkpoint(good("qwen3_moe"), tmp_path / "model", "intermediate_size")
    plan = tmp_path / "plan.yaml"
    plan.write_text(json.dumps({"models": [{"model": str(checkpoint), "meshes": ["N150"], "precisions": ["bfloat16"]}]}))
    out = tt_cache("seed", "--plan", str(plan), "--json", env=cli_env(tmp_path / "cache"))
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    (case,) = json_out(out)["cases"]
    assert case["outcome"] == "failed", case
    _assert_names_the_tensor(case["reason"], checkpoint, "intermediate_size")
    _assert_nothing_built(tmp_path / "cache")
