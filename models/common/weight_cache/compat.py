# SPDX-License-Identifier: Apache-2.0
"""The seed design's public API, in one place, built on the cache's own internals.

Callers of the seed API write the tensorbins themselves (``ttnn.as_tensor(cache_file_name=...)``
anywhere in a variant dir: its top, ``layers.<n>/``, a fork's ``layer_<n>/`` or ``vision/``), then
record the build with :func:`mark_weight_cache_complete`; a later start asks
:func:`weight_cache_is_complete` and builds from :func:`build_cached_state_dict`. The project's own
loads go through :class:`~models.common.weight_cache.build.BuildTransaction` and
:class:`~models.common.weight_cache.warm_read.WarmRead`.

**Verified wherever written, deleted only where proven written.** A marker records, for the gate,
every tensorbin below the variant dir at any depth (or exactly the files the caller names), so a
build's file missing or changed anywhere is a cold start; never one below a directory that holds
a cache of its own (a nested cache, a generation), which is neither verified as this variant's nor
deleted. Of those files, ``tt-cache gc`` may delete only the ones the build provably wrote,
recorded ``owned``: the files the caller names, and the ones where the seed API's builds write
(the top of the dir and ``layers.<n>/``). A tensorbin found in any other subfolder may be a
user's, so it is recorded for the gate only and survives every eviction: a fork that wants ``gc``
to reclaim its ``layer_<n>/`` names its files (``cache_files``). At deletion ``gc`` proves each
owned file is still the recorded one (:mod:`models.tt_cache.gc`).

The seed's ``(cache_path, build_variant)`` pair stops here: each function makes the variant's
:class:`~models.common.weight_cache.layout.VariantPaths` once and hands it to the internals, which
take nothing else. Torch is imported only by the functions that return tensors, so the gate's name
stays torch-free.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loguru import logger

from models.common.weight_cache.build import publish_marker, seal_files
from models.common.weight_cache.gate import DEFAULT_FORCE_ENV, weight_cache_status
from models.common.weight_cache.layout import (
    TENSORBIN_SUFFIX,
    VariantPaths,
    in_seed_layout,
    nested_cache,
    tensorbins_below,
)
from models.common.weight_cache.marker import (
    WeightCacheError,
    draft_marker,
    forget_markers,
    read_marker,
    safe_relative_path,
)
from models.common.weight_cache.usage import touch_last_used
from models.common.weight_cache.variant import variant_unverifiable

if TYPE_CHECKING:
    import torch

    from models.common.weight_cache.placeholders import CachedStateDict


def weight_cache_is_complete(
    cache_path: str | os.PathLike,
    *,
    model_name: str,
    n_layers: int,
    mesh_shape: Any,
    components: str | Iterable[str] | None = None,
    build_variant: Mapping[str, Any] | None = None,
    force_env: str | None = DEFAULT_FORCE_ENV,
) -> bool:
    """True when a warm build from ``cache_path`` is safe (the seed's name for
    :func:`~models.common.weight_cache.gate.weight_cache_status`, which also says why not)."""
    status = weight_cache_status(VariantPaths(Path(cache_path), build_variant), model_name=model_name,
                                 n_layers=n_layers, mesh_shape=mesh_shape, components=components, force_env=force_env)
    if not status.warm:
        logger.info(f"Weight cache {cache_path} is cold: {status.reason}")
    return status.warm


def variant_files(paths: VariantPaths, named: Iterable[str] | None) -> dict[str, bool]:
    """The tensorbins a marker of this variant records, each with whether its build provably wrote
    it (the rule in the module doc): ``named`` (relative paths the caller wrote), all owned; else
    every tensorbin below the dir, owned where :func:`~models.common.weight_cache.layout.in_seed_layout`.
    Variants sharing the dir may record the same files (``gc`` keeps what another marker records).
    Raises :class:`WeightCacheError` for a named file inside a directory that holds a cache of its
    own (recording it would let ``gc`` of this variant delete that cache's files)."""
    if named is None:
        return {relative: in_seed_layout(relative) for relative in tensorbins_below(paths.cache_dir)}
    files = sorted({safe_relative_path(relative) for relative in named})
    for relative in files:
        inside = nested_cache(paths.cache_dir, relative)
        if inside is not None:
            raise WeightCacheError(f"{relative} is inside {inside}, which holds a cache of its own")
    return dict.fromkeys(files, True)


def mark_weight_cache_complete(
    cache_path: str | os.PathLike,
    state_dict: Mapping[str, Any],
    *,
    model_name: str,
    n_layers: int,
    mesh_shape: Any,
    components: str | Iterable[str] | None = None,
    build_variant: Mapping[str, Any] | None = None,
    is_moe: bool = False,
    is_host_weight: Callable[[str], bool] | None = None,
    model_config: Mapping[str, Any] | None = None,
    model_info: Mapping[str, Any] | None = None,
    cache_files: Iterable[str] | None = None,
    model_id: str | None = None,
    content_id: str | None = None,
) -> bool:
    """Record that a full build of this variant wrote every tensorbin it needs. Returns success.

    Call it only after the whole model was built. ``state_dict`` gives the manifest (each weight's
    shape and dtype); weights matching ``is_host_weight`` are saved real to the safetensors
    sidecar. ``cache_files`` (relative paths) are the files the build wrote; by default, every
    tensorbin below ``cache_path`` but a nested cache's (the module doc says which of them ``gc``
    may delete). They are hashed and stamped, and the marker is published last, by atomic rename.
    Failing to write (read-only or full disk) only warns: the build it records succeeded."""
    from models.common.weight_cache.host_sidecar import write_host_sidecar
    from models.common.weight_cache.placeholders import manifest_of

    paths = VariantPaths(Path(cache_path), build_variant)
    if variant_unverifiable(build_variant):
        logger.warning(f"Not marking {cache_path} complete: its build variant could not be computed")
        return False
    manifest, host = manifest_of(state_dict, is_host_weight)
    try:
        files = variant_files(paths, cache_files)
        if not files:
            logger.warning(f"Not marking {paths.cache_dir} complete: no {TENSORBIN_SUFFIX} files of this variant in it")
            return False
        if host:
            write_host_sidecar(paths.file(paths.host_sidecar_name), host)
        sealed, verified_ns = seal_files(paths.cache_dir, [*files, *([paths.host_sidecar_name] if host else [])])
        records = [dataclasses.replace(record, owned=owned) for record, owned in zip(sealed, files.values())]
        draft = draft_marker(
            model_name=model_name, model_id=model_id or model_name, content_id=content_id, n_layers=n_layers,
            mesh_shape=mesh_shape, components=components, build_variant=build_variant, is_moe=is_moe,
            model_info=model_info, model_config=model_config, weights=manifest, host_weights=host)
        publish_marker(paths, dataclasses.replace(draft, files=tuple(records), verified_ns=verified_ns,
                                                  host_sidecar=sealed[len(files)] if host else None))
    except Exception as error:  # noqa: BLE001 - recording completion must never fail a finished build
        logger.warning(f"Could not mark weight cache {paths.cache_dir} complete: {error}")
        return False
    touch_last_used(paths)
    logger.info(f"Marked weight cache complete: {paths.marker} ({len(manifest)} weights, {len(host)} on host)")
    return True


def invalidate_weight_cache(cache_dir: str | os.PathLike, build_variant: Mapping[str, Any] | None = None) -> None:
    """Withdraw a variant's marker: its files are no longer vouched for (``tt-cache clean
    --invalidate``, eviction, and callers of the seed API that rewrite files in place)."""
    try:
        VariantPaths(Path(cache_dir), build_variant).marker.unlink(missing_ok=True)
    except OSError as error:
        logger.warning(f"Could not withdraw weight-cache marker in {cache_dir}: {error}")
    forget_markers()


def load_host_sidecar(
    cache_path: str | os.PathLike, *, consume: bool = False, build_variant: Mapping[str, Any] | None = None
) -> dict[str, torch.Tensor] | None:
    """The real host-consumed weights of a warm build, or None when absent or unreadable.

    The file read is the one the marker records (its stamp, or its digest when the stamp moved: a
    sidecar swapped for another is never served). Memoized on the opened file's identity;
    ``consume=True`` hands the tensors over and drops the memo. The tensors are zero-copy views
    of the mapped file (pages are read when touched)."""
    from models.common.weight_cache.host_sidecar import forget_host_sidecar, read_host_sidecar

    paths = VariantPaths(Path(cache_path), build_variant)
    try:
        record = read_marker(paths).host_sidecar
    except WeightCacheError:
        record = None
    path = paths.file(record.path) if record is not None else paths.file(paths.host_sidecar_name)
    try:
        if record is None:
            raise WeightCacheError(f"no marker records a host sidecar in {paths.cache_dir}")
        tensors = read_host_sidecar(path, record.stamp, record.digest)
    except WeightCacheError as error:
        if path.exists():
            logger.warning(f"Host-weights sidecar {path} is unreadable: {error}")
        return None
    if consume:
        forget_host_sidecar(tensors)
    return tensors


def build_cached_state_dict(
    cache_path: str | os.PathLike,
    host: Mapping[str, torch.Tensor] | None = None,
    args: Any = None,
    build_variant: Mapping[str, Any] | None = None,
) -> CachedStateDict:
    """The warm ``state_dict`` from the marker's manifest and the host sidecar.

    ``host`` may be sidecar tensors already loaded; otherwise the sidecar the marker records is
    read (and its memo released), proved to be the recorded file. ``args``: see
    :func:`~models.common.weight_cache.placeholders.cached_state_dict`."""
    from models.common.weight_cache.placeholders import cached_state_dict

    marker = read_marker(VariantPaths(Path(cache_path), build_variant))
    if host is None and marker.host_weights:
        host = load_host_sidecar(cache_path, consume=True, build_variant=build_variant)
        if host is None:
            raise WeightCacheError(f"host sidecar of {cache_path} is unreadable or vanished after the gate passed")
    return cached_state_dict(marker, host or {}, args, cache_path)
