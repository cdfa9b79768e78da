# SPDX-License-Identifier: Apache-2.0
"""The real Gemma 3 270M through the one prepare (models.demos.real_models.prepare): crash safety (its
short form on SmolLM2-135M) and assembly of a split GGUF, and the GGUF reader and conversion steps on tiny GGUF files.

The per-model checks every known model shares (layout, hub resolution, fast path, byte identity
with transformers' conversion) are in ``tests/real_models/test_prepare.py``. The crash test converts
again, into its own fresh root, because it has to: it kills a conversion and checks the next runs
finish it exactly once.

The GGUF reader and the conversion steps are tested on tiny GGUF files written here with the
``gguf`` package's own writer, against the ``gguf`` package's own reader.
"""

from __future__ import annotations

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

from models.demos.real_models import convert  # noqa: E402
from models.demos.real_models.gguf_file import GgufError, read_gguf  # noqa: E402
from models.demos.real_models.known import KnownModel, known_model  # noqa: E402
from models.demos.real_models.prepare import (  # noqa: E402
    WEIGHTS_NAME,
    PrepareError,
    model_snapshot,
    prepare_gemma3_270m,
    prepare_model,
    read_manifest,
    repo_cache_dir,
)
from models.testing import REPO_ROOT
from tests.ttnn.real_models.snapshots import assert_valid_snapshot, temp_entries  # noqa: E402

GEMMA = known_model("gemma3-270m")
SMOLLM2 = known_model("smollm2-135m")
real_model = pytest.mark.real_models(GEMMA.name)

# Where the crash lands, by form. The long form kills at a random moment of the longest conversion
# step (dequantization: a torn weights file in the temp dir), after the config is written. The short
# form kills at a random moment just after the temp dir is made (the conversion's imports and header
# read): what the temp dir holds by then differs, but the next run deletes it whole either way, and
# not waiting for dequantization saves the 10 s of imports and header read that lead up to it.
WORK_DIR_MADE = "working in "
DEQUANTIZE = "dequantize + write weights ..."
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


def _run_prepare_cli(model: KnownModel, model_root: Path, log: Path) -> subprocess.Popen:
    """Start ``python -m models.demos.real_models.prepare MODEL`` with its log going to ``log``."""
    with open(log, "wb") as stream:
        return subprocess.Popen(
            [sys.executable, "-m", "models.demos.real_models.prepare", model.name, "--model-root", str(model_root)],
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


def _temp_entries(model: KnownModel, model_root: Path) -> list[Path]:
    return temp_entries(repo_cache_dir(model_root, model) / "snapshots")


def _kill_then_resume_twice(model: KnownModel, kill_step: str, tmp_path: Path, shared: Path) -> None:
    """SIGKILL ``model``'s preparer at a random moment of ``kill_step``, then start two preparers at
    once: the stale temp dir is removed, the conversion runs once (the other preparer waits on the
    lock and finds it done), a split GGUF's assembled file is reused, and the result is the same
    checkpoint as the ``shared`` one."""
    root = tmp_path / "model_data"
    delay_s = random.uniform(0.0, KILL_WINDOW_S)

    victim_log = tmp_path / "victim.log"
    victim = _run_prepare_cli(model, root, victim_log)
    _wait_for_line(victim, victim_log, kill_step, CONVERSION_TIMEOUT_S)
    time.sleep(delay_s)
    assert victim.poll() is None, f"preparer finished before the kill ({kill_step!r} + {delay_s:.2f} s)"
    print(f"killing the preparer {delay_s:.2f} s into {kill_step!r}")
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    victim.stdout.close()

    debris = _temp_entries(model, root)
    assert len(debris) == 1 and f".tmp.{victim.pid}." in debris[0].name, debris
    assert model_snapshot(model.name, root) is None

    logs = [tmp_path / "resume-a.log", tmp_path / "resume-b.log"]
    resumers = [_run_prepare_cli(model, root, log) for log in logs]
    outputs = [process.communicate(timeout=CONVERSION_TIMEOUT_S)[0].decode() for process in resumers]
    texts = [log.read_text() for log in logs]
    assert [process.returncode for process in resumers] == [0, 0], texts

    resumed = model_snapshot(model.name, root)
    assert resumed is not None
    assert {Path(out.strip().splitlines()[-1]) for out in outputs} == {resumed}
    combined = "\n".join(texts)
    assert combined.count(f"preparing {model.repo_id} into") == 1, combined
    assert combined.count("removing stale temp") == 1, combined
    if len(model.parts) > 1:
        assert "reusing assembled" in combined, combined
    assert not debris[0].exists()
    assert_valid_snapshot(resumed, model)

    # Same source, same recipe: the same weights and config as the shared snapshot.
    fresh, first = read_manifest(resumed)["files"], read_manifest(shared)["files"]
    for name in (WEIGHTS_NAME, "config.json"):
        assert fresh[name] == first[name], name


@pytest.mark.real_models(SMOLLM2.name)
def test_killed_prepare_is_completed_once_by_the_next_runs(tmp_path: Path) -> None:
    """The short form, on the smallest known model (one conversion: 13 s against Gemma's 22 s),
    killed as soon as its temp dir exists."""
    _kill_then_resume_twice(SMOLLM2, WORK_DIR_MADE, tmp_path, prepare_model(SMOLLM2.name))


@real_model
@pytest.mark.slow  # 38-55 s; in CI's real-model suite (-m "real_models and (on_demand or slow) ...")
def test_killed_gemma_prepare_mid_dequantization_is_completed_once_by_the_next_runs(tmp_path: Path,
                                                                                      snapshot: Path) -> None:
    """The long form: the split-GGUF model, killed while it writes its weights."""
    _kill_then_resume_twice(GEMMA, DEQUANTIZE, tmp_path, snapshot)


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
    computed here from ``gguf.GGUFReader``."""
    from concurrent.futures import ThreadPoolExecutor

    import gguf
    import torch
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS

    monkeypatch.setattr(convert, "CHUNK_BYTES", 4096)  # many chunks per tensor
    source = convert.read_source(tiny_gguf, "gemma3")
    processor = TENSOR_PROCESSORS["gemma3"](config=convert.gguf_config_dict(source))
    with ThreadPoolExecutor(max_workers=4) as pool:
        converted = {name: convert.convert_tensor(tensor, processor, pool) for name, tensor in source.tensors.items()}
    for tensor in gguf.GGUFReader(str(tiny_gguf)).tensors:
        values = gguf.dequantize(tensor.data, tensor.tensor_type)
        if "norm.weight" in tensor.name:
            values = values - 1
        expected = torch.from_numpy(np.ascontiguousarray(values)).to(torch.bfloat16)
        assert len(convert._row_chunks(tuple(expected.shape))) > 1 or expected.dim() == 1
        assert torch.equal(converted[tensor.name].reshape(expected.shape), expected), tensor.name


def test_config_follows_transformers_key_table(tiny_gguf: Path) -> None:
    config = convert.gguf_config_dict(convert.read_source(tiny_gguf, "gemma3"))
    assert config["model_type"] == "gemma3_text"
    assert config["num_hidden_layers"] == 1 and config["hidden_size"] == 256
    assert config["vocab_size"] == TINY_VOCAB  # from the vocabulary's length, as transformers does
    assert config["tie_word_embeddings"] is True  # no output.weight
    assert config["_model_name_or_path"] == "tiny"


def test_wrong_architecture_unknown_and_missing_tensors_are_refused(tmp_path: Path) -> None:
    llama = tmp_path / "llama.gguf"
    _write_tiny_gguf(llama, arch="llama")
    with pytest.raises(PrepareError, match="architecture 'llama', expected 'gemma3'"):
        convert.read_source(llama, "gemma3")
    bert = tmp_path / "bert.gguf"
    _write_tiny_gguf(bert, arch="bert")
    with pytest.raises(PrepareError, match="architecture 'bert' is not supported; supported: "):
        convert.read_source(bert, "bert")
    odd = tmp_path / "odd.gguf"
    _write_tiny_gguf(odd, extra_tensor="blk.0.mystery.weight")
    source = convert.read_source(odd, "gemma3")
    with pytest.raises(PrepareError, match="GGUF tensor 'blk.0.mystery.weight' has no gemma3_text counterpart"):
        convert.tensor_plan(source, convert.hf_config(source))
    partial = convert.read_source(tmp_path / "llama.gguf", "llama")  # the tiny file has no k/v projections
    with pytest.raises(PrepareError, match=r"no GGUF tensor for model\.layers\.0\..*parameters missing"):
        convert.tensor_plan(partial, convert.hf_config(partial))


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
        convert.read_source(tmp_path / "data.gguf", "gemma3")
