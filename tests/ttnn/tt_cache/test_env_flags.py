# SPDX-License-Identifier: Apache-2.0
"""One reading of an on/off variable: what ``tt-cache env`` shows is what the gate, the loaders
and the CLI act on (``TT_TRANSFORMERS_FORCE_MODEL_LOAD=yes`` forces a cold build, as ``1`` does)."""

from __future__ import annotations

from pathlib import Path

import pytest

from models.testing.tt_cache import built_tiny_llama, cli_env, json_out, tt_cache

FORCE = "TT_TRANSFORMERS_FORCE_MODEL_LOAD"


@pytest.fixture(scope="module")
def warm(tmp_path_factory) -> tuple[Path, Path]:
    """(checkpoint, cache root) of a tiny llama whose cache is warm."""
    return built_tiny_llama(tmp_path_factory.mktemp("env-flags"))


def _shown(value: str) -> str:
    out = tt_cache("env", "--json", env={**cli_env(), FORCE: value})
    assert out.returncode == 0, out.stderr[-2000:]
    return {row["name"]: row["value"] for row in json_out(out)["variables"]}[FORCE]


@pytest.mark.parametrize("value, forced", [("1", True), ("yes", True), ("TRUE", True), ("no", False)])
def test_the_force_switch_does_what_tt_cache_env_shows(warm, value, forced):
    checkpoint, root = warm
    assert _shown(value) == str(forced)
    out = tt_cache("build", str(checkpoint), "--precision", "bfloat16", "--json", env={**cli_env(root), FORCE: value})
    assert out.returncode == 0, out.stderr[-2000:]
    report = json_out(out)
    if forced:
        assert report["outcome"] == "seeded" and f"cold build forced by {FORCE}" in report["reason"], report
    else:
        assert report["outcome"] == "warm", report
