# SPDX-License-Identifier: Apache-2.0
"""``vllm.LLM`` on real checkpoints, as a user starts it: ``HF_HUB_OFFLINE=1``, the model id, a hub
cache, ``TT_CACHE_PATH``. Every start is a fresh process running the offline example (vLLM's
default multiprocess engine), so warm means warm from disk, not from this process.

The hub cache is a private copy of the prepared snapshot in the hub's own layout (weights in
``blobs/<sha256>``), which the tests strip of its weights or zero. Adding a model is one entry in
:data:`REAL_MODELS`: its hub id and the function that prepares its snapshot.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from models.common.fileio import sha256_file
from models.demos.real_models.prepare import prepare_model
from models.testing.environments import run_module, run_python
from models.testing.tiny_models import pcc
from tests.ttnn.vllm.engines import run_offline


@dataclass(frozen=True)
class RealModel:
    name: str  # in models/demos/real_models/known.py
    hub_id: str  # what LLM(model=...) is given
    chat: bool  # instruct models: prompts go through llm.chat and the model's chat template
    once: bool = False  # also the cases run on one real model only: the refusals and the bfloat8_b start

    def prepare(self) -> Path:
        """The prepared hub snapshot directory (models--org--name/snapshots/<rev>)."""
        return prepare_model(self.name)


REAL_MODELS = [
    RealModel("gemma3-270m", "google/gemma-3-270m", chat=False),
    RealModel("smollm2-135m", "HuggingFaceTB/SmolLM2-135M-Instruct", chat=True, once=True),
    RealModel("qwen2.5-coder-0.5b", "Qwen/Qwen2.5-Coder-0.5B-Instruct", chat=True),
]
PROMPTS = [  # four lengths, one batch
    "The capital of France is",
    "Hello, my name is",
    "The quick brown fox jumps over the lazy dog. Then the dog",
    "1, 2, 3,",
]
STEPS = 8


@pytest.fixture(scope="module", params=[pytest.param(m, id=m.name, marks=pytest.mark.real_models(m.name))
                                        for m in REAL_MODELS])
def real_model(request) -> RealModel:
    return request.param


@pytest.fixture(scope="module")
def source(real_model) -> Path:
    return real_model.prepare()


def start(model: RealModel, env: dict[str, str], report: Path, precision: str = "bfloat16",
          prefix: tuple[str, ...] = ()):
    chat = ("--chat",) if model.chat else ()
    return run_offline("--model", model.hub_id, "--greedy_sampling", "--max_tokens", str(STEPS), "--precision", precision,
                       "--max_model_len", "256", *chat, env=env, report=report, prefix=prefix)


def hub_env(hub: Path, cache: Path) -> dict[str, str]:
    return {"HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1", "TT_CACHE_PATH": str(cache),
            "TT_TRANSFORMERS_FORCE_MODEL_LOAD": ""}


def weight_files(snapshot: Path) -> list[Path]:
    return sorted(snapshot.glob("*.safetensors"))


def copy_repo(source: Path, destination: Path, *, weights: bool) -> Path:
    """The prepared hub repo copied under ``destination/hub``, laid out as the hub lays it out: each
    weights file a symlink to ``blobs/<sha256>`` (verified against that name on first sight);
    ``weights=False``: config and tokenizer only. Returns the hub."""
    repo = destination / "hub" / source.parents[1].name
    shutil.copytree(source, repo / "snapshots" / source.name, ignore=shutil.ignore_patterns("*.safetensors"))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(source.name)
    if weights:
        snapshot = snapshot_of(destination / "hub")
        (repo / "blobs").mkdir(exist_ok=True)
        for file in weight_files(source):
            blob = repo / "blobs" / sha256_file(file)
            shutil.copy2(file, blob)
            (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    return destination / "hub"


def snapshot_of(hub: Path) -> Path:
    repo = next(hub.glob("models--*"))
    return repo / "snapshots" / (repo / "refs" / "main").read_text().strip()


def assert_greedy(report: dict, expected: list[list[int]], prompts: list[list[int]] | None = None) -> None:
    """vLLM's tokens are transformers' (up to an end-of-sequence stop), from the same prompt ids."""
    if prompts is not None:
        assert [item["prompt_token_ids"] for item in report["completions"]] == prompts
    for item, want in zip(report["completions"], expected):
        got = item["token_ids"]
        assert got == want[: len(got)], (item["prompt"], got, want)
        assert len(got) == STEPS or item["finish_reason"] == "stop"


def assert_started(proc: subprocess.CompletedProcess, report: dict | None) -> dict:
    assert proc.returncode == 0 and report is not None, proc.stderr[-4000:]
    return report


@pytest.fixture(scope="module")
def hub(source, tmp_path_factory) -> Iterator[Path]:
    """A full copy, weights included (a gigabyte for the 0.5B model): deleted when the model's tests end."""
    destination = tmp_path_factory.mktemp("hub-full")
    yield copy_repo(source, destination, weights=True)
    shutil.rmtree(destination, ignore_errors=True)


@pytest.fixture(scope="module")
def deploy_hub(source, tmp_path_factory) -> Iterator[Path]:
    """A cache-only deploy: the snapshot's config and tokenizer, no weights."""
    destination = tmp_path_factory.mktemp("hub-deploy")
    yield copy_repo(source, destination, weights=False)
    shutil.rmtree(destination, ignore_errors=True)


@pytest.fixture(scope="module")
def transformers_reference(real_model, hub, tmp_path_factory) -> dict[str, list]:
    """transformers' fp32 greedy tokens, first-step logits and prompt ids (the chat template
    rendered to text and tokenized without special tokens, as ``llm.chat`` does), computed in the
    default environment: never by the transformers of the environment under test, so a tokenizer
    or config fault of this one fails the tests instead of agreeing with itself."""
    logits = tmp_path_factory.mktemp("reference") / "logits.pt"
    report = run_module("default", "models.testing.transformers_reference", str(snapshot_of(hub)), json.dumps(PROMPTS),
                        *(("--chat",) if real_model.chat else ()), "--steps", str(STEPS), "--logits", str(logits))
    assert Path(report["python"]) != Path(sys.executable)
    rows = report["prompts"]
    return {"tokens": [row["tokens"] for row in rows], "logits": list(torch.load(logits)),
            "ids": [row["ids"] for row in rows]}


@pytest.fixture(scope="module")
def bf16_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tt-cache-bf16")


@pytest.fixture(scope="module")
def cold_start(real_model, hub, bf16_cache, tmp_path_factory) -> dict:
    proc, report = start(real_model, hub_env(hub, bf16_cache), tmp_path_factory.mktemp("cold") / "report.json")
    return assert_started(proc, report)


def test_cold_start_generates_transformers_greedy_tokens(real_model, cold_start, transformers_reference):
    assert cold_start["startup"]["warm"] is False
    assert_greedy(cold_start, transformers_reference["tokens"], transformers_reference["ids"])
    cache_dir = Path(cold_start["startup"]["cache_dir"])
    assert cache_dir.parts[-2:] == ("bfloat16", "mesh_1x1") and cache_dir.parts[-3].startswith(real_model.hub_id.split("/")[1])


def zero_tensor_data(path: Path) -> None:
    """Overwrite every tensor byte with zeros, keeping the header and the blob's name (a torn
    download, or an edit through the snapshot symlink, looks like this)."""
    with path.open("r+b") as file:
        data_start = 8 + struct.unpack("<Q", file.read(8))[0]
        file.seek(data_start)
        remaining, block = path.stat().st_size - data_start, bytes(1 << 20)
        while remaining > 0:
            remaining -= file.write(block[: min(remaining, len(block))])


def skip_unless_once(model: RealModel, why: str) -> None:
    """Cases run on one real model: each start is a fresh vLLM process (45-95 s here)."""
    if not model.once:
        pytest.skip(f"{why}: checked on {next(m.name for m in REAL_MODELS if m.once)}")


def test_a_fresh_copy_starts_warm(real_model, source, cold_start, bf16_cache, transformers_reference, tmp_path):
    """A fresh copy of the weights is verified once and served by the warm cache."""
    hub = copy_repo(source, tmp_path / "fresh", weights=True)
    proc, report = start(real_model, hub_env(hub, bf16_cache), tmp_path / "fresh.json")
    report = assert_started(proc, report)
    assert report["startup"]["warm"] is True, report["startup"]
    assert_greedy(report, transformers_reference["tokens"])


def test_a_cache_built_in_the_default_environment_starts_warm(real_model, source, hub, transformers_reference,
                                                            tmp_path):
    """One cache for both environments: the model prepared and its cache built in the default
    environment (its transformers writes the configs), then vLLM's start here is warm."""
    skip_unless_once(real_model, "one cache for both environments")
    prepared = run_python("default", "-m", "models.demos.real_models.prepare", real_model.name)
    assert prepared.returncode == 0 and Path(prepared.stdout.split()[-1]) == source, prepared.stderr[-4000:]
    cache = tmp_path / "default-environment-cache"
    built = run_python("default", "-m", "models.tt_cache.cli", "build", real_model.hub_id, "--precision", "bfloat16",
                       "--cache-root", str(cache), env={"HF_HUB_CACHE": str(hub), "TT_CACHE_PATH": str(cache)})
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-4000:]
    proc, report = start(real_model, hub_env(hub, cache), tmp_path / "report.json")
    report = assert_started(proc, report)
    assert report["startup"]["warm"] is True, report["startup"]
    assert_greedy(report, transformers_reference["tokens"], transformers_reference["ids"])


def test_a_tampered_copy_never_gets_the_cache(real_model, source, cold_start, bf16_cache, tmp_path):
    """A copy whose blobs hold zeros under the genuine names is other weights: it never gets the
    cache of the genuine ones."""
    skip_unless_once(real_model, "a refusal no model changes")
    genuine_cache = cold_start["startup"]["cache_dir"]
    tampered = copy_repo(source, tmp_path / "tampered", weights=True)
    for weights in weight_files(snapshot_of(tampered)):
        zero_tensor_data(weights.resolve())
        with safe_open(str(weights), framework="pt") as reader:
            assert not any(reader.get_tensor(name).any() for name in list(reader.keys())[:3])
    shared = shutil.copytree(bf16_cache, tmp_path / "shared-cache")  # the same cache, left as the other tests need it
    proc, report = start(real_model, hub_env(tampered, shared), tmp_path / "tampered.json")
    report = assert_started(proc, report)
    genuine_copy = str(shared / Path(genuine_cache).relative_to(bf16_cache))
    assert report["startup"]["warm"] is False and report["startup"]["cache_dir"] != genuine_copy


def test_cache_only_deploy_starts_and_generates(real_model, cold_start, deploy_hub, bf16_cache, transformers_reference,
                                                tmp_path):
    assert not weight_files(snapshot_of(deploy_hub))
    proc, report = start(real_model, hub_env(deploy_hub, bf16_cache), tmp_path / "report.json")
    report = assert_started(proc, report)
    assert report["startup"]["warm"] is True
    assert_greedy(report, transformers_reference["tokens"])


def test_cold_cache_without_weights_is_a_clear_error(real_model, deploy_hub, tmp_path):
    skip_unless_once(real_model, "a refusal no model changes")
    proc, report = start(real_model, hub_env(deploy_hub, tmp_path / "empty-cache"), tmp_path / "report.json")
    assert proc.returncode == 1 and report is None
    assert "no warm ttnn cache" in proc.stderr and "no checkpoint weights" in proc.stderr
    assert "Traceback" not in proc.stderr.split("offline_inference_tt:")[-1]  # the script's own line is one line


def test_bfloat8_b_first_token_agrees_and_logits_pcc(real_model, hub, transformers_reference, tmp_path, monkeypatch):
    skip_unless_once(real_model, "the block-float path of the plugin; every model's bfloat8_b parity: tests/real_models")
    cache = tmp_path / "tt-cache-bf8"
    proc, report = start(real_model, hub_env(hub, cache), tmp_path / "report.json", precision="bfloat8_b")
    report = assert_started(proc, report)
    first = [item["token_ids"][0] for item in report["completions"]]
    assert first == [tokens[0] for tokens in transformers_reference["tokens"]]

    # The logits of the same warm bfloat8_b cache, through the same TT model interface the engine ran.
    from transformers import AutoConfig

    from models.vllm_plugin import tt_models
    from models.vllm_plugin.architectures import tt_architecture

    monkeypatch.setenv("TT_CACHE_PATH", str(cache))
    config = AutoConfig.from_pretrained(snapshot_of(hub))
    tt_class = getattr(tt_models, tt_architecture(config.architectures[0]))
    model = tt_class.initialize_vllm_model(config, None, len(PROMPTS), 256, precision="bfloat8_b")
    assert model.loaded.warm
    ids = transformers_reference["ids"]
    kv = model.allocate_kv_cache((len(PROMPTS) * 2 + 1, 1, 32, 1), torch.float32, len(model.decoder.kv_layout()))
    tokens = torch.zeros(len(ids), max(map(len, ids)), dtype=torch.long)
    for i, prompt in enumerate(ids):
        tokens[i, : len(prompt)] = torch.tensor(prompt)
    table = torch.arange(1, 2 * len(ids) + 1).reshape(len(ids), 2)
    logits = model.prefill_forward(tokens, table, kv, [len(p) for p in ids])
    for ours, theirs in zip(logits[:, 0], transformers_reference["logits"]):
        assert pcc(ours, theirs) >= 0.99
