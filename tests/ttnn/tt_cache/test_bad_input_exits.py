# SPDX-License-Identifier: Apache-2.0
"""Bad input is exit 2 in one line naming what is wrong, never exit 3 ("a bug") or a traceback: a
``config.json`` no model can be built from (every bad config is tested here, through ``build``, ``seed``
and ``seed --check``), and a model root that cannot be written."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from models.testing import REPO_ROOT
from models.testing.fixtures import DROP_FILE_PERMISSION_BYPASS
from models.testing.tt_cache import built_tiny_llama, cli_env, error_line, json_out, tt_cache


def _without_head_dim(config: dict, **values) -> dict:
    return {**{k: v for k, v in config.items() if k != "head_dim"}, **values}


# Every config.json a model cannot be built from, in one table: name -> (its text, from the good
# config; what the one line must say).
BAD_CONFIGS = {
    "missing num_hidden_layers": (lambda c: json.dumps({k: v for k, v in c.items() if k != "num_hidden_layers"}),
                                  "missing field 'num_hidden_layers'"),
    "invalid JSON": (lambda c: '{"model_type": ', "config.json: Expecting"),
    "model_type bert": (lambda c: json.dumps({**c, "model_type": "bert"}), "no loader for model_type 'bert'"),
    "no heads": (lambda c: json.dumps(_without_head_dim(c, num_attention_heads=0)), "field 'num_attention_heads' is 0"),
    "rope_parameters 5": (lambda c: json.dumps({**c, "rope_parameters": 5}), "field 'rope_parameters' is 5"),
    "vocab_size 1e400": (lambda c: json.dumps({**c, "vocab_size": 7}).replace('"vocab_size": 7', '"vocab_size": 1e400'),
                         "field 'vocab_size' is inf"),
    "8 heads, 3 KV heads": (lambda c: json.dumps({**c, "num_attention_heads": 8, "num_key_value_heads": 3}),
                            "field 'num_key_value_heads' is 3"),
}


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> tuple[Path, Path]:
    """(checkpoint, cache root) of a tiny llama whose cache ``tt-cache build`` made: a plan's good case."""
    return built_tiny_llama(tmp_path_factory.mktemp("bad-configs"))


def _bad_checkpoint(good: Path, dest: Path, kind: str) -> Path:
    shutil.copytree(good, dest)
    config = dest / "config.json"
    config.write_text(BAD_CONFIGS[kind][0](json.loads(config.read_text())))
    return dest


@pytest.mark.parametrize("kind", list(BAD_CONFIGS))
def test_build_with_a_bad_config_is_bad_input_naming_it(good, tmp_path, kind):
    checkpoint = _bad_checkpoint(good[0], tmp_path / "model", kind)
    out = tt_cache("build", str(checkpoint), "--precision", "bfloat16", env=cli_env(tmp_path / "cache"))
    assert out.returncode == 2, out.stderr[-2000:]
    line = error_line(out, "build")
    assert str(checkpoint / "config.json") in line and BAD_CONFIGS[kind][1] in line, line
    assert not list((tmp_path / "cache").rglob("*.tensorbin")) and not list((tmp_path / "cache").rglob("mesh_*"))


@pytest.mark.parametrize("check", [False, True], ids=["seed", "seed --check"])
def test_a_plan_with_bad_configs_fails_those_cases_only_naming_each(good, tmp_path, check):
    """Each bad case fails with its reason and the plan's good case is still answered: exit 1, not 3."""
    checkpoints = {kind: _bad_checkpoint(good[0], tmp_path / f"model-{i}", kind) for i, kind in enumerate(BAD_CONFIGS)}
    plan = tmp_path / "plan.yaml"
    entries = [{"model": str(path), "meshes": ["N150"], "precisions": ["bfloat16"]} for path in checkpoints.values()]
    entries.append({"model": str(good[0]), "meshes": ["N150"], "precisions": ["bfloat16"]})
    plan.write_text(json.dumps({"models": entries}))  # JSON is YAML
    out = tt_cache("seed", "--plan", str(plan), *(["--check"] if check else []), "--json", env=cli_env(good[1]))
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    cases = {case["model"]: case for case in json_out(out)["cases"]}
    assert cases[str(good[0])]["outcome"] == "warm"
    for kind, checkpoint in checkpoints.items():
        case = cases[str(checkpoint)]
        assert case["outcome"] == "failed" and str(checkpoint / "config.json") in case["reason"], case
        assert BAD_CONFIGS[kind][1] in case["reason"], case


@pytest.mark.parametrize("kind", ["fifo", "deep"])
def test_a_config_json_that_is_a_fifo_or_nested_deep_is_bad_input(good, tmp_path, kind):
    checkpoint = shutil.copytree(good[0], tmp_path / "model")
    config = checkpoint / "config.json"
    config.unlink()
    if kind == "fifo":
        os.mkfifo(config)  # a plain read would wait for a writer forever
    else:
        config.write_bytes(b"[" * 100_000 + b"]" * 100_000)
    out = tt_cache("build", str(checkpoint), "--precision", "bfloat16", env=cli_env(tmp_path / "cache"), timeout=60)
    assert out.returncode == 2, out.stderr[-2000:]
    assert str(config) in error_line(out, "build")


PREPARE = {
    "prepare": [sys.executable, "-m", "models.demos.real_models.prepare"],
    "tt-cache prepare": [sys.executable, "-m", "models.tt_cache.cli", "prepare"],
}


@pytest.mark.parametrize("command", list(PREPARE))
def test_prepare_into_an_unwritable_model_root_is_one_line_exit_2(tmp_path, command):
    """Run without CAP_DAC_OVERRIDE (root writes anywhere), so the mode bits apply."""
    root = tmp_path / "model-root"
    root.mkdir()
    root.chmod(0o555)
    out = subprocess.run([*DROP_FILE_PERMISSION_BYPASS, *PREPARE[command], "smollm2-135m", "--model-root", str(root)],
                         env=cli_env(), cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-3000:]
    lines = [line for line in out.stderr.splitlines() if str(root) in line]
    assert len(lines) == 1 and "cannot write" in lines[0] and "Permission denied" in lines[0], out.stderr[-3000:]
    assert list(root.iterdir()) == []
