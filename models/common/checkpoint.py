# SPDX-License-Identifier: Apache-2.0
"""Find a Hugging Face checkpoint and read its tensors lazily, under the loader's names.

A checkpoint reaches a loader in one of three spellings, all resolved here to one directory:

* an HF id, ``org/name``: looked up in the local hub cache (``$HF_HUB_CACHE``, else
  ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``) as ``models--org--name/snapshots/<rev>``
  with ``<rev>`` from ``refs/main``; nothing is ever downloaded;
* a local directory holding ``config.json``;
* a hub snapshot directory, the form vLLM hands over under ``HF_HUB_OFFLINE=1``.

Weights are read from safetensors only (single ``model.safetensors`` or shards listed in
``model.safetensors.index.json``), each file memory-mapped, each tensor materialized when the
loader asks for it. The transformers model object is never built just to read weights.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

SAFETENSORS_SINGLE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
CONFIG_FILE = "config.json"


class CheckpointError(RuntimeError):
    """The checkpoint cannot be found or read as asked."""


def hub_cache_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def _hub_snapshot(repo_id: str) -> Path | None:
    repo = hub_cache_dir() / f"models--{repo_id.replace('/', '--')}"
    ref = repo / "refs" / "main"
    if ref.is_file():
        snapshot = repo / "snapshots" / ref.read_text().strip()
        if snapshot.is_dir():
            return snapshot
    snapshots = sorted((repo / "snapshots").glob("*")) if (repo / "snapshots").is_dir() else []
    return snapshots[-1] if len(snapshots) == 1 else None


_HF_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


def resolve_checkpoint_dir(model: str | os.PathLike) -> Path | None:
    """The directory holding the checkpoint, or None when it is not on this machine.

    None is not an error: a warm start from a cache-only deploy needs no checkpoint."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    text = os.fspath(model)
    if _HF_ID.match(text) and not path.exists():
        return _hub_snapshot(text)
    return None


def read_config(checkpoint_dir: Path) -> dict[str, Any]:
    try:
        config = json.loads((checkpoint_dir / CONFIG_FILE).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{checkpoint_dir} has no {CONFIG_FILE}") from None
    except (OSError, ValueError) as error:
        raise CheckpointError(f"cannot read {checkpoint_dir / CONFIG_FILE}: {error}") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{checkpoint_dir / CONFIG_FILE} is not a JSON object")
    return config


def safetensors_files(checkpoint_dir: Path) -> dict[str, Path]:
    """Map every tensor name of the checkpoint to the file holding it."""
    index = checkpoint_dir / SAFETENSORS_INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise CheckpointError(f"cannot read {index}: {error}") from None
        return {name: checkpoint_dir / file for name, file in weight_map.items()}
    single = checkpoint_dir / SAFETENSORS_SINGLE
    if single.is_file():
        from safetensors import safe_open

        with safe_open(single, framework="pt") as reader:
            return {name: single for name in reader.keys()}
    raise CheckpointError(f"{checkpoint_dir} holds no {SAFETENSORS_SINGLE} or {SAFETENSORS_INDEX}")


def checkpoint_fingerprint(checkpoint_dir: Path) -> list[list[Any]]:
    """(name, bytes, mtime_ns) of the config and weight files: a stat-only identity of the
    checkpoint's content, recorded with the cache so a changed checkpoint makes the cache cold."""
    names = sorted({p.name for p in checkpoint_dir.glob("*.safetensors")} | {CONFIG_FILE, SAFETENSORS_INDEX})
    found = []
    for name in names:
        try:
            stat = (checkpoint_dir / name).stat()
        except FileNotFoundError:
            continue
        found.append([name, stat.st_size, stat.st_mtime_ns])
    return found


def checkpoint_changed(recorded: list[list[Any]], current: list[list[Any]]) -> bool:
    """True when a file present now differs from (or was absent in) the recorded fingerprint.

    Files missing now are no change: deleting the weights after seeding (a cache-only deploy)
    must keep the cache warm."""
    before = {entry[0]: entry for entry in recorded if isinstance(entry, list) and entry}
    return any(before.get(entry[0]) != entry for entry in current)


@dataclass(frozen=True)
class KeyRule:
    """One renaming rule: a regex over checkpoint names and its replacement."""

    pattern: str
    replacement: str


def remap_key(name: str, rules: Sequence[KeyRule]) -> str | None:
    """The loader's name for a checkpoint tensor (first matching rule), or None to skip it."""
    for rule in rules:
        renamed, count = re.subn(rule.pattern, rule.replacement, name)
        if count:
            return renamed or None
    return None


_SAFETENSORS_DTYPES = {
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F64": torch.float64,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


class CheckpointReader:
    """Lazy, renamed view of a safetensors checkpoint: ``keys()`` and ``get(key)``.

    Files are opened once and memory-mapped; a tensor's bytes are read when ``get`` is called,
    so peak host memory is one layer, not the model."""

    def __init__(self, checkpoint_dir: Path, rules: Sequence[KeyRule]) -> None:
        from safetensors import safe_open

        self.checkpoint_dir = checkpoint_dir
        self._location: dict[str, tuple[Path, str]] = {}
        for name, file in safetensors_files(checkpoint_dir).items():
            key = remap_key(name, rules)
            if key is not None:
                self._location[key] = (file, name)
        self._open = {file: safe_open(file, framework="pt") for file in {f for f, _ in self._location.values()}}

    def keys(self) -> list[str]:
        return list(self._location)

    def __contains__(self, key: str) -> bool:
        return key in self._location

    def spec(self, key: str) -> tuple[list[int], torch.dtype]:
        """Shape and dtype from the safetensors header, without reading the tensor."""
        file, name = self._location[key]
        view = self._open[file].get_slice(name)
        return list(view.get_shape()), _SAFETENSORS_DTYPES[view.get_dtype()]

    def get(self, key: str) -> torch.Tensor:
        try:
            file, name = self._location[key]
        except KeyError:
            raise CheckpointError(f"checkpoint {self.checkpoint_dir} has no tensor for {key!r}") from None
        return self._open[file].get_tensor(name)

    def items(self) -> Iterator[tuple[str, torch.Tensor]]:
        for key in self._location:
            yield key, self.get(key)

    def close(self) -> None:
        self._open.clear()
