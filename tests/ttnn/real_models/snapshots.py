# SPDX-License-Identifier: Apache-2.0
"""What a prepared snapshot of a known model must look like (shared by the prepare tests)."""

from __future__ import annotations

import json
from pathlib import Path

from models.common.fileio import is_temp_path
from models.demos.real_models.convert import MODEL_TYPES
from models.demos.real_models.known import KnownModel
from models.demos.real_models.prepare import MANIFEST_NAME, WEIGHTS_NAME, read_manifest, revision, verify_manifest_digests

FILES = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", WEIGHTS_NAME}


def temp_entries(snapshots: Path) -> list[Path]:
    return [entry for entry in snapshots.iterdir() if is_temp_path(entry)] if snapshots.is_dir() else []


def weights_header(path: Path) -> dict[str, str]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as weights:
        return {name: weights.get_slice(name).get_dtype() for name in weights.keys()}


def assert_valid_snapshot(snapshot: Path, model: KnownModel) -> None:
    """Hub-cache layout, a sealed record whose digests match, a plain bfloat16 checkpoint of the family."""
    repo_dir = snapshot.parents[1]
    assert snapshot.parent.name == "snapshots"
    assert repo_dir.name == model.cache_name and repo_dir.parent.name == "hub"
    assert (repo_dir / "refs" / "main").read_text() == snapshot.name == revision(model)
    assert len(snapshot.name) == 40 and int(snapshot.name, 16) >= 0

    names = {path.name for path in snapshot.iterdir()}
    assert FILES | {MANIFEST_NAME} <= names
    assert ("chat_template.jinja" in names) == model.chat  # the instruct models' GGUFs carry their template
    manifest = read_manifest(snapshot)
    assert set(manifest["files"]) == names - {MANIFEST_NAME}
    assert manifest["source"]["gguf_sha256"] == model.sha256
    verify_manifest_digests(snapshot)
    assert not temp_entries(snapshot.parent)

    config = json.loads((snapshot / "config.json").read_text())
    assert config["model_type"] == MODEL_TYPES.get(model.architecture, model.architecture)
    assert config["dtype"] == "bfloat16"
    assert "quantization_config" not in config

    dtypes = weights_header(snapshot / WEIGHTS_NAME)
    assert set(dtypes.values()) == {"BF16"}
    assert ("lm_head.weight" not in dtypes) == config["tie_word_embeddings"]
    layers = {name.split(".")[2] for name in dtypes if name.startswith("model.layers.")}
    assert layers == {str(i) for i in range(config["num_hidden_layers"])}
