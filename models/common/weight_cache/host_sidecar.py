# SPDX-License-Identifier: Apache-2.0
"""The host-weights sidecar: the few weights device code consumes on the host, kept real.

Some families read a weight on the host (a token embedding used through ``F.embedding``, a
per-layer scalar read with ``.item()``), so a warm build needs those tensors for real while every
other weight is a placeholder. A build writes them into one safetensors file in its generation
(no code runs from a cache file, unlike a pickle), recorded and hashed like any tensorbin.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from models.common.fileio import atomic_output
from models.common.safetensors_file import SafetensorsFile, write_safetensors
from models.common.weight_cache.marker import WeightCacheError
from models.common.weight_cache.stamps import FileStamp
from models.common.weight_cache.verified_open import open_verified

_SIDECAR_MEMO: dict[tuple[str, FileStamp], dict[str, torch.Tensor]] = {}


def write_host_sidecar(path: Path, host: Mapping[str, torch.Tensor]) -> None:
    """Publish the host weights at ``path`` atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(path) as temp:
        write_safetensors(temp, {key: value.detach() for key, value in host.items()})


def read_host_sidecar(path: Path, verified: FileStamp | None, digest: str | None = None) -> dict[str, torch.Tensor]:
    """The host weights of the sidecar at ``path``, opened once and proved to be the file verified
    (its stamp ``verified``, else bytes hashing to ``digest``: see
    :func:`~models.common.weight_cache.verified_open.open_verified`), mapped from the sealed copy
    taken through that very open. Raises :class:`WeightCacheError`. Memoized on the opened file's
    identity."""
    with open_verified(path, verified, what="host sidecar", digest=digest) as opened:
        key = (opened.source, opened.stamp)
        tensors = _SIDECAR_MEMO.get(key)
        if tensors is None:
            try:
                sidecar = SafetensorsFile(Path(opened.path))  # views of the sealed copy, never of the file
                tensors = {name: sidecar.tensor(name) for name in sidecar.names()}
            except (OSError, ValueError, RuntimeError) as error:
                raise WeightCacheError(f"host sidecar {path} is unreadable: {error}") from None
            _SIDECAR_MEMO.clear()
            _SIDECAR_MEMO[key] = tensors
    return tensors


def forget_host_sidecar(tensors: Mapping[str, torch.Tensor]) -> None:
    """Drop the memo of a sidecar whose tensors were handed over (a builder took them)."""
    for key, memo in list(_SIDECAR_MEMO.items()):
        if memo is tensors:
            del _SIDECAR_MEMO[key]
