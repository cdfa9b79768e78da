# SPDX-License-Identifier: Apache-2.0
"""The environment table: every variable that can be set wrong is refused in one line naming it
and what it accepts, by every entry point before any work (exit 2 from a command line, a
``ValueError`` from the loaders); the values it accepts arrive parsed; ``tt-cache env`` shows a
refused value with why. The one home of the project's bad-configuration tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from models.common import envs
from models.registry import loader_class
from models.testing.tt_cache import cli_env, error_line, json_out, tt_cache

# one bad value per variable that has any (text and paths accept everything)
BAD_VALUES = {
    "TT_TRANSFORMERS_FORCE_MODEL_LOAD": "maybe",
    "TT_CONVERT_WORKERS": "eight",
    "TT_PREFETCH_THREADS": "eight",
    "TT_CACHE_REMOTE": "ftp://store.example/caches",
    "TT_CACHE_REMOTE_PUSH": "sometimes",
    "TT_CACHE_REMOTE_RETRY_S": "a while",
    "AWS_ENDPOINT_URL": "localhost:9000",
    "TT_CACHE_DEBUG": "verbose",
    "TT_PREFILL_CACHE_MAX_SIZE": "lots",
    "NNF_RESYNTHESIS_BASE_FORWARD_CACHE": "flase",
    "NNF_RESYNTHESIS_BASE_FORWARD_CACHE_ENTRIES": "0",
    "OMP_NUM_THREADS": "4,two",
    "TT_VLLM_HOST_PLATFORM": "2",
    "TT_VLLM_FORWARD_SIGNALS": "nope",
    "TT_VLLM_FREEZE_AT_EXIT": "-1",
    "TT_HOST_THREADS": "eight",
    "MESH_DEVICE": "N301",
    "TT_MOCK_BOARD": "grayskull",
}

# what a good value arrives as
PARSED = [
    ("TT_TRANSFORMERS_FORCE_MODEL_LOAD", "Yes", True),
    ("TT_VLLM_HOST_PLATFORM", "", True),
    ("TT_VLLM_HOST_PLATFORM", "off", False),
    ("TT_CONVERT_WORKERS", "", None),
    ("TT_PREFETCH_THREADS", " 3 ", 3),
    ("TT_PREFILL_CACHE_MAX_SIZE", "64M", 64 << 20),
    ("TT_PREFILL_CACHE_MAX_SIZE", " ", None),
    ("OMP_NUM_THREADS", "4,2", 4),
    ("MESH_DEVICE", "t3k", (1, 8)),
    ("MESH_DEVICE", "2x4", (2, 4)),
    ("TT_MOCK_BOARD", "P150", "p150"),
    ("TT_CACHE_REMOTE", "s3://bucket/prefix", "s3://bucket/prefix"),
    ("TT_CACHE_REMOTE", "/srv/caches", "/srv/caches"),
    ("AWS_ENDPOINT_URL", "http://127.0.0.1:8333", "http://127.0.0.1:8333"),
    ("TT_CPU_SHARE_DIR", "~/share", Path("~/share").expanduser()),
]


def _refusal(name: str) -> str:
    """The start of the one line that refuses ``BAD_VALUES[name]``."""
    return f"{name}={BAD_VALUES[name]!r}: expected "


def test_every_variable_that_can_be_wrong_has_a_bad_value_here():
    refusable = {name for name, variable in envs.ENVIRONMENT_VARIABLES.items()
                 if variable.reader is None and not isinstance(variable.kind, (envs.Text, envs.PathValue))}
    assert refusable == set(BAD_VALUES)


@pytest.mark.parametrize("name", sorted(BAD_VALUES))
def test_a_bad_value_exits_2_naming_the_variable(name, tmp_path, monkeypatch):
    out = tt_cache("ls", str(tmp_path), env={**cli_env(tmp_path), name: BAD_VALUES[name]}, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    line = error_line(out, "ls")
    assert _refusal(name) in line and envs.ENVIRONMENT_VARIABLES[name].kind.accepts in line, line
    monkeypatch.setenv(name, BAD_VALUES[name])
    with pytest.raises(ValueError, match=f"^{_refusal(name)}"):  # a loader, before it looks at anything
        loader_class("llama")(tmp_path / "no-checkpoint", cache_root=tmp_path)


# every entry point, with a variable each one reads
ENTRY_POINTS = {
    "tt-cache build": ("TT_CONVERT_WORKERS", ["-m", "models.tt_cache.cli", "build", "no-such-model"]),
    "tt-cache seed": ("TT_PREFETCH_THREADS", ["-m", "models.tt_cache.cli", "seed", "--plan", "no-such-plan.yaml"]),
    "tt-cache prefill": ("TT_PREFILL_CACHE_MAX_SIZE", ["-m", "models.tt_cache.cli", "prefill", "ls", "."]),
    "run_demo.sh's python": ("TT_MOCK_BOARD", ["-m", "models.demos.real_models.demo", "--model", "smollm2-135m"]),
    "the resynthesis demo": ("OMP_NUM_THREADS", ["-m", "models.demos.resynthesis", "--epochs", "1"]),
    "the vLLM plugin": ("TT_HOST_THREADS", ["-c", "from models.vllm_plugin import register; register()"]),
}


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_every_entry_point_exits_2_before_any_work(entry, tmp_path):
    name, argv = ENTRY_POINTS[entry]
    out = subprocess.run([sys.executable, *argv], env={**cli_env(tmp_path / "cache"), name: BAD_VALUES[name]},
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    assert [line for line in out.stderr.splitlines() if _refusal(name) in line], out.stderr[-2000:]
    assert not (tmp_path / "cache").exists(), "nothing was written"


@pytest.mark.parametrize("name, text, value", PARSED)
def test_a_good_value_arrives_parsed(name, text, value, monkeypatch):
    monkeypatch.setenv(name, text)
    assert getattr(envs, name) == value


def test_tt_cache_env_shows_a_bad_value_refused(tmp_path):
    out = tt_cache("env", "--json", env=cli_env(tmp_path, TT_PREFETCH_THREADS="off"))
    assert out.returncode == 0, out.stderr[-2000:]
    shown = {row["name"]: row["value"] for row in json_out(out)["variables"]}["TT_PREFETCH_THREADS"]
    assert shown.startswith("refused: TT_PREFETCH_THREADS='off': expected a whole number"), shown
