# SPDX-License-Identifier: Apache-2.0
"""The host-weights sidecar: the few weights device code consumes on the host, kept real.

Some families read a weight on the host (a token embedding used through ``F.embedding``, a
per-layer scalar read with ``.item()``), so a warm build needs those tensors for real while every
other weight is a placeholder. A build writes them into one safetensors file in its generation
(no code runs from a cache file, unlike a pickle), recorded and hashed like any tensorbin.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from loguru import logger

from models.common.fileio import atomic_output
from models.common.safetensors_file import SafetensorsFile, write_safetensors
from models.common.weight_cache.layout import VariantPaths
from models.common.weight_cache.marker import WeightCacheError, read_marker

_SIDECAR_MEMO: dict[tuple[str, int, int, int], dict[str, torch.Tensor]] = {}


def write_host_sidecar(path: Path, host: Mapping[str, torch.Tensor]) -> None:
    """Publish the host weights at ``path`` atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(path) as temp:
        write_safetensors(temp, {key: value.detach() for key, value in host.items()})


def sidecar_file(cache_dir: str | os.PathLike, build_variant: Mapping[str, Any] | None) -> Path:
    """Where a variant's sidecar is: the marker says (a build generation's), else the top level."""
    paths = VariantPaths(Path(cache_dir), build_variant)
    try:
        marker = read_marker(paths.cache_dir, build_variant)
    except WeightCacheError:
        return paths.file(paths.host_sidecar_name)
    if marker.host_sidecar is None:
        return paths.file(paths.host_sidecar_name)
    return paths.file(marker.host_sidecar.path)


def load_host_sidecar(
    cache_path: str | os.PathLike, *, consume: bool = False, build_variant: Mapping[str, Any] | None = None
) -> dict[str, torch.Tensor] | None:
    """The real host-consumed weights of a warm build, or None when absent or unreadable.

    Memoized on (path, inode, mtime, size); ``consume=True`` hands the tensors over and drops the
    memo. The tensors are zero-copy views of the mapped file (pages are read when touched)."""
    path = sidecar_file(cache_path, build_variant)
    try:
        stat = path.stat()
        key = (str(path), stat.st_ino, stat.st_mtime_ns, stat.st_size)
        tensors = _SIDECAR_MEMO.get(key)
        if tensors is None:
            sidecar = SafetensorsFile(path)  # zero-copy views: a warm start maps, never copies
            tensors = {name: sidecar.tensor(name) for name in sidecar.names()}
            _SIDECAR_MEMO.clear()
            _SIDECAR_MEMO[key] = tensors
        if consume:
            _SIDECAR_MEMO.pop(key, None)
        return tensors
    except (OSError, ValueError, RuntimeError) as error:
        if not isinstance(error, FileNotFoundError):
            logger.warning(f"Host-weights sidecar {path} is unreadable: {error}")
        return None
