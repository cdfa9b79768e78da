# SPDX-License-Identifier: Apache-2.0
"""Every JSON document ``tt-cache`` prints or writes carries ``schema_version`` and snake_case keys,
errors included: dashboards parse one format."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from models.testing.tiny_models import make_checkpoint
from models.testing.tt_cache import cli_env, json_out, tt_cache

SNAKE = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)*")


def _bad_keys(document: Any, where: str = "") -> list[str]:
    """Every key anywhere in the document that is not snake_case, with where it is."""
    bad = []
    if isinstance(document, dict):
        for key, value in document.items():
            if not SNAKE.fullmatch(key):
                bad.append(f"{where}.{key}")
            bad += _bad_keys(value, f"{where}.{key}")
    elif isinstance(document, list):
        for index, value in enumerate(document):
            bad += _bad_keys(value, f"{where}[{index}]")
    return bad


def _one_format(document: dict, command: str) -> None:
    assert document.get("schema_version") == 1, (command, document)
    assert not _bad_keys(document), (command, _bad_keys(document))


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("json-documents")
    checkpoint = make_checkpoint("llama", root / "tiny-llama")
    env = cli_env(root / "cache")
    build = tt_cache("build", str(checkpoint), "--precision", "bfloat16", "--json", env=env)
    assert build.returncode == 0, build.stderr[-2000:]
    plan = root / "plan.yaml"
    plan.write_text(json.dumps({"models": [{"model": str(checkpoint), "meshes": ["N150"], "precisions": ["bfloat16"]}]}))
    (cache_dir,) = {path.parent for path in (root / "cache").rglob(".weights_complete.*")}
    return {"root": root, "env": env, "build": build, "plan": plan, "cache_dir": cache_dir}


def test_every_command_prints_one_versioned_snake_case_document(built):
    root, env, cache_dir = built["root"], built["env"], built["cache_dir"]
    _one_format(json_out(built["build"]), "build")
    commands = {
        "ls": ["ls"], "check": ["check", str(cache_dir)], "verify": ["verify", str(cache_dir)],
        "gc": ["gc", "--max-size", "1T", "--dry-run", "--keep-plan", str(built["plan"])],
        "clean": ["clean", str(root / "cache")], "env": ["env"],
        "seed --check": ["seed", "--plan", str(built["plan"]), "--check", "--report", str(root / "check.json")],
        "prefill ls": ["prefill", "ls", str(root / "cache")],
    }
    for name, words in commands.items():
        out = tt_cache(*words, "--json", env=env)
        assert out.returncode == 0, (name, out.stderr[-2000:])
        _one_format(json_out(out), name)
    _one_format(json.loads((root / "check.json").read_text()), "seed --report")


@pytest.mark.parametrize("words", [
    ["ls", "/nowhere/at/all"], ["check", "/nowhere/at/all"], ["verify", "/nowhere/at/all"],
    ["clean", "/nowhere/at/all"], ["gc", "--max-size", "1G", "/nowhere/at/all"], ["gc", "--max-size", "lots"],
    ["gc", "--max-size", "1G", "--bogus-option"], ["seed", "--plan", "/nowhere/plan.yaml", "--check"],
    ["build", "/nowhere/model"], ["prefill", "ls", "/nowhere/at/all"],
])
def test_errors_under_json_are_versioned_json_too(tmp_path, words):
    out = tt_cache(*words, "--json", env=cli_env(tmp_path / "cache"))
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    document = json_out(out)
    _one_format(document, " ".join(words))
    assert document["error"]
    if words[0] != "prefill":  # the prefill CLI's errors carry no exit code (its own documented format)
        assert document["exit_code"] == 2
