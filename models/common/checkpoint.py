# SPDX-License-Identifier: Apache-2.0
"""Find a Hugging Face checkpoint and list the files it is made of; no torch.

A checkpoint reaches a loader in one of three spellings, all resolved here to one directory:

* an HF id, ``org/name``: looked up in the local hub cache (:data:`models.common.envs.HF_HUB_CACHE`,
  the hub's own rule) as ``models--org--name/snapshots/<rev>`` with ``<rev>`` from ``refs/main``;
  nothing is ever downloaded;
* a local directory holding ``config.json``;
* a hub snapshot directory, the form vLLM hands over under ``HF_HUB_OFFLINE=1``.

Weights are safetensors only: one ``model.safetensors``, or the shards that
``model.safetensors.index.json`` names (in any subfolder of the checkpoint, never outside it).
:func:`checkpoint_files` is the one place that decides which files those are: the weight cache's
identity hashes exactly them, and the reader (:mod:`models.common.safetensors_file`) reads them.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from models.common import envs
from models.common.fileio import read_regular

SAFETENSORS_SINGLE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
CONFIG_FILE = "config.json"
MAX_INDEX_BYTES = 64 << 20
MAX_CONFIG_BYTES = 16 << 20


class CheckpointError(RuntimeError):
    """The checkpoint cannot be found or read as asked; the message names the file."""


class CheckpointShapeError(CheckpointError):
    """A checkpoint tensor whose shape is not the one its ``config.json`` implies (one line naming
    the tensor, its shape and the expected one: :data:`models.common.decoder.CHECKPOINT_SHAPES`)."""


def hub_cache_dir() -> Path:
    return envs.HF_HUB_CACHE


def _hub_snapshot(repo_id: str) -> Path | None:
    repo = hub_cache_dir() / f"models--{repo_id.replace('/', '--')}"
    ref = repo / "refs" / "main"
    if ref.is_file():
        snapshot = repo / "snapshots" / ref.read_text().strip()
        if snapshot.is_dir():
            return snapshot
    snapshots = sorted((repo / "snapshots").iterdir()) if (repo / "snapshots").is_dir() else []
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
    try:  # a regular file only: a FIFO named config.json would block the read forever
        config = json.loads(read_regular(checkpoint_dir / CONFIG_FILE, MAX_CONFIG_BYTES))
    except FileNotFoundError:
        raise CheckpointError(f"{checkpoint_dir} has no {CONFIG_FILE}") from None
    except (OSError, ValueError, RecursionError) as error:
        raise CheckpointError(f"cannot read {checkpoint_dir / CONFIG_FILE}: {error}") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{checkpoint_dir / CONFIG_FILE} is not a JSON object")
    return config


def has_weights(checkpoint_dir: Path | None) -> bool:
    return checkpoint_dir is not None and (
        (checkpoint_dir / SAFETENSORS_INDEX).is_file() or (checkpoint_dir / SAFETENSORS_SINGLE).is_file()
    )


# --------------------------------------------------------------------------------------------
# Which files make the checkpoint
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckpointFiles:
    """The files whose bytes decide a checkpoint's weights, as POSIX paths relative to ``directory``.

    ``weight_map`` (tensor name -> shard) comes from the index; None for a single file, whose
    tensor names are in its own header."""

    directory: Path
    shards: tuple[str, ...]
    index: str | None
    weight_map: dict[str, str] | None

    @property
    def identity_files(self) -> list[str]:
        """config, index and every shard: what the content id hashes."""
        return sorted({CONFIG_FILE, *([self.index] if self.index else []), *self.shards})


def inside_relative(value: Any, where: str) -> str:
    """``value`` as a normalised relative POSIX path that stays inside its directory, else
    :class:`CheckpointError` naming ``where`` (an index may name shards in subfolders, never
    ``../`` or absolute paths)."""
    if not isinstance(value, str) or not value or "\x00" in value or "\\" in value:
        raise CheckpointError(f"{where}: {value!r} is not a file name")
    path = PurePosixPath(value)
    if path.is_absolute() or any(part in ("..", "") for part in path.parts) or value.endswith("/"):
        raise CheckpointError(f"{where}: {value!r} is outside the checkpoint directory")
    return path.as_posix()


def _read_index(checkpoint_dir: Path) -> dict[str, str]:
    index = checkpoint_dir / SAFETENSORS_INDEX
    try:
        raw = read_regular(index, MAX_INDEX_BYTES)
    except OSError as error:
        raise CheckpointError(f"cannot read {index}: {error.strerror or error}") from None
    return parse_index(raw, index)


def parse_index(raw: bytes, index: Path) -> dict[str, str]:
    """The weight map (tensor name -> shard) of the shard index ``index`` holding ``raw``."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as error:
        raise CheckpointError(f"{index} is not JSON: {error}") from None
    weight_map = body.get("weight_map") if isinstance(body, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index}: 'weight_map' is not a non-empty object of tensor name -> file")
    if not all(isinstance(name, str) and isinstance(file, str) for name, file in weight_map.items()):
        raise CheckpointError(f"{index}: 'weight_map' maps a tensor name to something other than a file name")
    return {name: inside_relative(file, str(index)) for name, file in weight_map.items()}


def checkpoint_files(checkpoint_dir: Path) -> CheckpointFiles:
    """The checkpoint's weight files, each checked to exist: a partial download (a shard the index
    names but the directory lacks) is a :class:`CheckpointError` naming the shard."""
    if (checkpoint_dir / SAFETENSORS_INDEX).is_file():
        weight_map = _read_index(checkpoint_dir)
        shards = tuple(sorted(set(weight_map.values())))
        _require_files(checkpoint_dir, shards, f"named by {SAFETENSORS_INDEX}")
        return CheckpointFiles(checkpoint_dir, shards, SAFETENSORS_INDEX, weight_map)
    if (checkpoint_dir / SAFETENSORS_SINGLE).is_file():
        return CheckpointFiles(checkpoint_dir, (SAFETENSORS_SINGLE,), None, None)
    raise CheckpointError(f"{checkpoint_dir} holds no {SAFETENSORS_SINGLE} or {SAFETENSORS_INDEX}")


def _require_files(checkpoint_dir: Path, names: Sequence[str], why: str) -> None:
    missing = [name for name in names if not (checkpoint_dir / name).is_file()]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise CheckpointError(
            f"{checkpoint_dir}: shard {missing[0]}{more} {why} is missing (an incomplete download?)"
        )


# --------------------------------------------------------------------------------------------
# How the model was named
# --------------------------------------------------------------------------------------------

_HF_SNAPSHOT = re.compile(r"models--(?:(?P<org>[^/]+?)--)?(?P<name>[^/]+)/snapshots/[^/]+$")


def checkpoint_name(model_path: str | os.PathLike) -> str:
    """The repo's base name however the checkpoint is addressed (``org/name``, ``/data/name``,
    ``.../models--org--name/snapshots/<rev>``): the readable part of a cache dir's name."""
    text = os.fspath(model_path).rstrip("/")
    snapshot = _HF_SNAPSHOT.search(text)
    name = snapshot.group("name") if snapshot else text.rsplit("/", 1)[-1]
    return name if name not in ("", ".", "..") else Path(text).resolve().name or "model"


def model_id(model: str | os.PathLike) -> str:
    """How a model was asked for, org included: ``org/name`` for an HF id or a hub snapshot
    (``models--org--name/snapshots/<rev>``), else the local directory's absolute path.

    A cache-only load (no weights on this machine) is served only by a cache whose marker
    records this same id."""
    text = os.fspath(model).rstrip("/")
    path = Path(text).expanduser()
    snapshot = _HF_SNAPSHOT.search(os.fspath(path.resolve()) if path.exists() else text)
    if snapshot:
        org = snapshot.group("org")
        return f"{org}/{snapshot.group('name')}" if org else snapshot.group("name")
    if _HF_ID.match(text) and not path.exists():
        return text
    return os.fspath(path.resolve())


# --------------------------------------------------------------------------------------------
# Checkpoint key names -> loader names
# --------------------------------------------------------------------------------------------


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
