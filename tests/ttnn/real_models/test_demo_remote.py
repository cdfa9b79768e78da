# SPDX-License-Identifier: Apache-2.0
"""The demo (``python -m models.demos.real_models.demo``, what ``scripts/run_demo.sh`` runs) with a
shared store (``--remote``, a real SeaweedFS S3 server on 127.0.0.1): the machine that has the
weights builds and pushes (``--push``); a fresh machine (new HOME, empty cache, the prepared
snapshot's config and tokenizer only) starts warm from the store and prints the building machine's
tokens. A store without the variant, or one that cannot be reached, is one line and exit 2.

The round trip builds, pushes and pulls a real model (about a minute): ``slow``. The refusals ask
the store and stop, and stay in the default suite."""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from models.demos.real_models.known import KNOWN_MODELS
from models.demos.real_models.prepare import prepare_model
from models.testing import REPO_ROOT
from models.testing.object_store import SeaweedServer, free_ports, running_seaweed
from tests.ttnn.real_models.conftest import model_params

MODEL = KNOWN_MODELS["smollm2-135m"]  # the smallest known model
STEPS = "6"


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory) -> Iterator[SeaweedServer]:
    with running_seaweed(tmp_path_factory.mktemp("seaweed")) as server:
        yield server


@pytest.fixture
def fresh_machine(tmp_path) -> Path:
    """A model root holding the prepared snapshot's files but its weights (config, tokenizer), at
    the snapshot's place; the HOME beside it is new."""
    snapshot = prepare_model(MODEL.name)
    deployed = tmp_path / "model_data" / snapshot.relative_to(snapshot.parents[3])
    shutil.copytree(snapshot, deployed, ignore=shutil.ignore_patterns("*.safetensors"))
    assert (deployed / "config.json").is_file() and (deployed / "tokenizer.json").is_file()
    return tmp_path


def demo(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "models.demos.real_models.demo", "--model", MODEL.name, *args],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1200)


def fresh_env(seaweed: SeaweedServer, machine: Path) -> dict[str, str]:
    """Nothing but the store's credentials (standard AWS variables) and a new HOME: the default
    cache root is empty."""
    env = seaweed.client_env(HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO_ROOT), HOME=str(machine / "home"),
                             TT_MODEL_DATA=str(machine / "model_data"))
    for name in ("TT_CACHE_PATH", "XDG_CACHE_HOME", "TT_USER_STATE", "TT_CACHE_REMOTE", "TT_CACHE_REMOTE_PUSH",
                 "TT_TRANSFORMERS_FORCE_MODEL_LOAD"):
        env.pop(name, None)
    return env


def one_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("demo: ") and "Traceback" not in done.stdout, done.stderr[-3000:]
    return lines[0]


def token_ids(out: str) -> str:
    return next(line for line in out.splitlines() if "its token ids:" in line).split(":", 1)[1].strip()


@pytest.mark.parametrize("model", model_params(names=(MODEL.name,), marks=(pytest.mark.slow,)))
def test_a_fresh_machine_starts_the_demo_warm_from_the_store(model, seaweed, fresh_machine, tmp_path):
    url = f"s3://{seaweed.bucket}/demo-{uuid.uuid4().hex[:12]}"
    common = ("--precision", "bfloat16", "--steps", STEPS)
    building = seaweed.client_env(HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO_ROOT), TT_CACHE_PATH=str(tmp_path / "cache"))
    building.pop("TT_TRANSFORMERS_FORCE_MODEL_LOAD", None)
    built = demo(*common, "--remote", url, "--push", env=building)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert f"pushed the cold build's variant to {url}" in built.stdout

    started = demo(*common, "--remote", url, env=fresh_env(seaweed, fresh_machine))
    assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]
    out = started.stdout
    print(out)
    assert "(config and tokenizer only), cache from " + url in out and "| warm start from the store" in out
    assert "| cold build |" not in out and "nothing converted" in out
    assert "verify: every file matches its recorded digest" in out
    assert token_ids(out) == token_ids(built.stdout)
    ours = next(line for line in out.splitlines() if "from the warm cache (host reference forward):" in line)
    assert ours in built.stdout
    assert str(fresh_machine / "home") in out  # the cache went under the fresh HOME
    assert not list((fresh_machine / "model_data").rglob("*.safetensors"))


def test_a_store_without_the_variant_is_one_line_naming_the_push(seaweed, fresh_machine):
    url = f"s3://{seaweed.bucket}/empty-{uuid.uuid4().hex[:12]}"
    line = one_line(demo("--precision", "bfloat16", "--remote", url, env=fresh_env(seaweed, fresh_machine)))
    assert f"the shared store TT_CACHE_REMOTE={url} has no variant of {MODEL.repo_id} for this host" in line, line
    assert f"tt-cache push VARIANT_DIR --to {url}" in line, line
    assert not list((fresh_machine / "home").rglob("*.tensorbin"))


def test_an_unreachable_store_is_one_line(seaweed, fresh_machine):
    (dead_port,) = free_ports(1)
    env = fresh_env(seaweed, fresh_machine)
    env.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{dead_port}", AWS_MAX_ATTEMPTS="1")
    url = f"s3://{seaweed.bucket}/any"
    line = one_line(demo("--precision", "bfloat16", "--remote", url, env=env))
    assert f"the shared store TT_CACHE_REMOTE={url} could not be asked for it (" in line, line
    assert "cannot reach the store (EndpointConnectionError" in line, line


def test_push_without_a_store_is_refused(fresh_machine, seaweed):
    line = one_line(demo("--push", env=fresh_env(seaweed, fresh_machine)))
    assert line == "demo: --push needs a store: --remote URL (or TT_CACHE_REMOTE)"


def test_config_and_tokenizer_without_a_store_is_one_line_naming_remote(seaweed, fresh_machine):
    """Not a prepare over the deployed files: the demo says which store option is missing."""
    line = one_line(demo(env=fresh_env(seaweed, fresh_machine)))
    assert "holds smollm2-135m's config and tokenizer but not its weights: name the shared store" in line, line
    assert "(--remote URL, or TT_CACHE_REMOTE)" in line, line
    assert not (fresh_machine / "home").exists() or not list((fresh_machine / "home").rglob("*.tensorbin"))


def test_a_malformed_store_url_is_one_line_by_the_tables_rule(seaweed, fresh_machine):
    """``--remote`` is checked by the rule ``$TT_CACHE_REMOTE`` has in the environment table."""
    line = one_line(demo("--remote", "ftp://somewhere/x", env=fresh_env(seaweed, fresh_machine)))
    assert "--remote='ftp://somewhere/x': expected s3://BUCKET[/PREFIX]" in line, line
    assert not (fresh_machine / "home").exists() or not list((fresh_machine / "home").rglob("*.tensorbin"))
