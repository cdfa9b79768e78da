# SPDX-License-Identifier: Apache-2.0
"""What a checkpoint's weights are: its content id, the key of its cache; no torch.

The content id is a SHA-256 over ``<relative path>:<SHA-256>`` of every file that decides the
converted weights: ``config.json``, the shard index and every shard it names (any subfolder), or
the single ``model.safetensors`` (:func:`models.common.checkpoint.checkpoint_files`). The same
weights reached as an HF id, a local copy or a hub snapshot get one id; any changed byte another.
``config.json`` counts by its content without :data:`BOOKKEEPING_CONFIG_FIELDS` (canonical JSON):
the same checkpoint written by two transformers versions (the default environment and the vLLM
one) is one checkpoint and shares one cache; every other field, added, dropped or changed, is
another id.

Every file is hashed once, on first sight, and recognised afterwards by its stamp
(:mod:`~models.common.weight_cache.stamps`), kept in the cache root where every client of the
same export finds what the seeder verified. Hub blobs are hashed too, not trusted by their name:
a blob whose bytes differ from its SHA-256 name (a torn download, an edit through the snapshot
symlink) is identified by what it holds, so it can never pass for the genuine weights.

A build reads the checkpoint after its content id was computed: :class:`CheckpointIdentity` keeps
what each weight file was seen as (stamp, SHA-256, whether the stamp alone vouches for the bytes),
so the build can prove it reads those bytes (:mod:`~models.common.weight_cache.checkpoint_proof`).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from loguru import logger

from models.common.checkpoint import CONFIG_FILE, CheckpointError, checkpoint_files, read_config
from models.common.fileio import sha256_bytes
from models.common.weight_cache.stamps import FileStamp, StampIndex, hash_stamped, timestamp_tick_ns

_SHA256_NAME = re.compile(r"[0-9a-f]{64}")
# config.json fields that record how and by what a checkpoint was written, never what it computes:
# the one list the content id leaves out (anything else may change the forward, so it counts).
BOOKKEEPING_CONFIG_FIELDS = frozenset({"transformers_version", "_name_or_path", "_commit_hash"})


def hub_blob_name(path: Path) -> str | None:
    """The SHA-256 a hub snapshot's symlink claims for its file (``blobs/<sha256>``), if any."""
    if not path.is_symlink():
        return None
    target = Path(os.readlink(path)).name
    return target if _SHA256_NAME.fullmatch(target) else None


class IdentifiedFile(NamedTuple):
    """One weight file as its content id saw it. ``settled``: the stamp alone vouches for
    ``digest`` (it was verified a racy tick after the file's last change, see
    :meth:`FileStamp.settled`); else only hashing the file again proves its bytes."""

    stamp: FileStamp
    digest: str
    settled: bool


@dataclass(frozen=True)
class CheckpointIdentity:
    """A checkpoint's content id and what each of its weight files (index and shards, by relative
    path) was seen as when it was computed: what a build must read (picklable: a Ray task gets it)."""

    directory: Path
    content_id: str
    files: dict[str, IdentifiedFile]
    config_sha256: str  # config.json as the content id counts it (:func:`config_sha256`)


def file_sha256(path: Path, relative: str, stamps: StampIndex) -> str:
    """A checkpoint file's SHA-256: from ``stamps`` while its stamp is unchanged, else hashed."""
    return identify_file(path, relative, stamps).digest


def identify_file(path: Path, relative: str, stamps: StampIndex) -> IdentifiedFile:
    """A checkpoint file's stamp and SHA-256: from ``stamps`` while its stamp is unchanged (only
    settled stamps are recorded), else hashed."""
    try:
        info = os.stat(path)
        stamp = FileStamp.of(info)
        known = stamps.lookup(relative, stamp)
        if known is not None:
            return IdentifiedFile(stamp, known, True)
        stamp, digest, verified_ns = hash_stamped(path, "sha256")
    except OSError as error:
        raise CheckpointError(f"cannot read checkpoint file {path}: {error.strerror or error}") from None
    claimed = hub_blob_name(path)
    if claimed is not None and claimed != digest:
        logger.warning(f"{path}: the hub blob named {claimed[:12]}... holds other bytes (SHA-256 {digest[:12]}...): "
                       f"a torn download or an edit through the snapshot; its cache is that content's, not the blob's")
    tick = timestamp_tick_ns(path, info)
    stamps.record(relative, stamp, digest, verified_ns, tick)
    return IdentifiedFile(stamp, digest, stamp.settled(verified_ns, tick))


def config_sha256(checkpoint_dir: Path) -> str:
    """SHA-256 of ``config.json`` as canonical JSON without the bookkeeping fields (a few hundred
    bytes: read each time, no stamp)."""
    return canonical_config_sha256(read_config(checkpoint_dir))


def canonical_config_sha256(config: dict[str, Any]) -> str:
    """SHA-256 of a config as the content id counts it (see :func:`config_sha256`)."""
    kept = {key: value for key, value in config.items() if key not in BOOKKEEPING_CONFIG_FIELDS}
    return sha256_bytes(json.dumps(kept, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode())


def content_id(checkpoint_dir: Path, stamps: StampIndex) -> str:
    """SHA-256 over the checkpoint's weight-deciding files' SHA-256s (see the module doc)."""
    return checkpoint_identity(checkpoint_dir, stamps).content_id


def checkpoint_identity(checkpoint_dir: Path, stamps: StampIndex) -> CheckpointIdentity:
    """The content id, with what each weight file was seen as (see :class:`CheckpointIdentity`)."""
    names = checkpoint_files(checkpoint_dir).identity_files
    weights = {name: identify_file(checkpoint_dir / name, name, stamps) for name in names if name != CONFIG_FILE}
    stamps.save(keep=weights)
    config = config_sha256(checkpoint_dir)
    digests = {CONFIG_FILE: config} | {name: seen.digest for name, seen in weights.items()}
    return CheckpointIdentity(checkpoint_dir, content_id_of(names, digests), weights, config)


def content_id_of(names: list[str], digests: dict[str, str]) -> str:
    """The content id over the identity files ``names`` and their SHA-256s (``config.json``'s by
    :func:`config_sha256`): for a caller that knows the weights' digests already (a prepared
    snapshot's completion record)."""
    return sha256_bytes("\n".join(f"{name}:{digests[name]}" for name in names).encode())
