# SPDX-License-Identifier: Apache-2.0
"""The warm ttnn weight cache: build a model from its ``.tensorbin`` files alone.

``ttnn.as_tensor(t, cache_file_name=...)`` loads the cached file and ignores ``t`` on a hit, so
once every converted weight of a model is on disk a loader needs no checkpoint at all: each
weight can be a *placeholder* with the right shape and dtype and no storage. This module is the
torch side of the cache: marking a build complete (with the real host-consumed weights in a
safetensors sidecar), and the warm state dict of placeholders. The marker's format, its
validation and the completeness gate are torch-free, in :mod:`models.common.marker`, and
re-exported here under the seed's names.

A placeholder lives on torch's ``meta`` device, so it costs no host memory and a cache miss on it
fails loudly instead of persisting garbage as a weight.
"""

from __future__ import annotations

import os
import re
from collections.abc import (
    Callable,
    Iterable,
    Iterator,
    Mapping,
    MutableMapping,
    Sequence,
)
from pathlib import Path
from typing import Any

import torch
from loguru import logger

from models.common.checkpoint import SafetensorsFile, checkpoint_name, write_safetensors  # noqa: F401
from models.common.fileio import atomic_output, atomic_write_bytes, content_digest_file
from models.common.marker import (  # noqa: F401 - the seed's public names live on here
    DEFAULT_FORCE_ENV,
    HOST_WEIGHTS_SIDECAR,
    MAX_MARKER_BYTES,
    TENSORBIN_SUFFIX,
    WEIGHT_CACHE_FORMAT_VERSION,
    WEIGHT_CACHE_MARKER,
    CacheStatus,
    FileRecord,
    MarkerFormatError,
    WeightCacheError,
    WeightCacheMarker,
    cache_bytes,
    canonical_variant,
    forget_markers,
    host_sidecar_name,
    host_sidecar_path,
    list_cache_files,
    marker_json,
    marker_path,
    normalize_components,
    normalize_mesh_shape,
    parse_marker,
    read_marker,
    safe_relative_path,
    stat_stamp,
    touch_last_used,
    variant_unverifiable,
    verify_weight_cache,
    weight_cache_status,
    weights_identity,
)

_TORCH_DTYPES = {str(v): v for v in vars(torch).values() if isinstance(v, torch.dtype)}


# --------------------------------------------------------------------------------------------
# The host-weights sidecar (safetensors: no code runs from a cache file)
# --------------------------------------------------------------------------------------------

_SIDECAR_MEMO: dict[tuple[str, int, int, int], dict[str, torch.Tensor]] = {}


def _sidecar_file(cache_path: str | os.PathLike, build_variant: Mapping[str, Any] | None) -> Path:
    """Where a variant's sidecar is: the marker says (a build generation's), else the top level."""
    try:
        marker = read_marker(cache_path, build_variant)
    except WeightCacheError:
        return host_sidecar_path(cache_path, build_variant)
    if marker.host_sidecar is None:
        return host_sidecar_path(cache_path, build_variant)
    return Path(cache_path) / marker.host_sidecar.path


def load_host_sidecar(
    cache_path: str | os.PathLike, *, consume: bool = False, build_variant: Mapping[str, Any] | None = None
) -> dict[str, torch.Tensor] | None:
    """The real host-consumed weights of a warm build, or None when absent or unreadable.

    Memoized on (path, inode, mtime, size); ``consume=True`` hands the tensors over and drops the
    memo. The tensors are zero-copy views of the mapped file (pages are read when touched)."""
    path = _sidecar_file(cache_path, build_variant)
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


# --------------------------------------------------------------------------------------------
# The gate, under the seed's name
# --------------------------------------------------------------------------------------------


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
    """True when a warm build from ``cache_path`` is safe (see :func:`weight_cache_status`)."""
    status = weight_cache_status(
        cache_path,
        model_name=model_name,
        n_layers=n_layers,
        mesh_shape=mesh_shape,
        components=components,
        build_variant=build_variant,
        force_env=force_env,
    )
    if not status.warm:
        logger.info(f"Weight cache {cache_path} is cold: {status.reason}")
    return status.warm


# --------------------------------------------------------------------------------------------
# Marking a build complete
# --------------------------------------------------------------------------------------------


def _record_file(root: Path, relative: str, digests: Mapping[str, str] | None) -> FileRecord:
    """Size, digest and the stat stamp of a published file (taken after its rename: a rename
    changes ctime)."""
    path = root / relative
    info = path.stat()
    digest = (digests or {}).get(relative) or content_digest_file(path)
    return FileRecord(relative, info.st_size, digest, stat_stamp(info))


def write_host_sidecar(
    cache_path: str | os.PathLike,
    host: Mapping[str, torch.Tensor],
    build_variant: Mapping[str, Any] | None = None,
    generation: str | None = None,
) -> dict[str, str]:
    """Publish the host weights' safetensors sidecar atomically (into a build ``generation``
    when given); returns ``{relative path: digest}`` for :func:`mark_weight_cache_complete`'s
    ``digests`` (so a loader can write it while converting)."""
    relative = f"{generation}/{host_sidecar_name(build_variant)}" if generation else host_sidecar_name(build_variant)
    sidecar = Path(cache_path) / relative
    sidecar.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(sidecar) as temp:
        write_safetensors(temp, {key: value.detach() for key, value in host.items()})
        digest = content_digest_file(temp)
    return {relative: digest}


def invalidate_weight_cache(cache_path: str | os.PathLike, build_variant: Mapping[str, Any] | None = None) -> None:
    """Withdraw a variant's marker: its files are no longer vouched for (``tt-cache clean
    --invalidate``, eviction, and callers of the seed API that rewrite files in place)."""
    try:
        marker_path(cache_path, build_variant).unlink(missing_ok=True)
    except OSError as error:
        logger.warning(f"Could not withdraw weight-cache marker in {cache_path}: {error}")
    forget_markers()


def _manifest(
    state_dict: Mapping[str, Any], is_host_weight: Callable[[str], bool] | None
) -> tuple[dict[str, tuple[tuple[int, ...], str]], dict[str, torch.Tensor]]:
    """Each weight's shape and dtype, and the real host weights among them."""
    manifest, host = {}, {}
    for key, value in state_dict.items():
        if not isinstance(value, torch.Tensor):
            continue
        manifest[key] = (tuple(value.shape), str(value.dtype))
        if is_host_weight is not None and is_host_weight(key):
            if value.is_meta:
                raise WeightCacheError(f"host weight {key!r} is a placeholder; a host weight must be real")
            host[key] = value.detach()
    return manifest, host


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
    digests: Mapping[str, str] | None = None,
    model_id: str | None = None,
    content_id: str | None = None,
    generation: str | None = None,
) -> bool:
    """Record that a full build of this variant wrote every tensorbin it needs. Returns success.

    Call it only after the whole model was built. ``state_dict`` gives the manifest (each
    weight's shape and dtype); weights matching ``is_host_weight`` are saved real to the
    safetensors sidecar. ``cache_files`` (relative paths, default: every tensorbin found) and
    ``digests`` (already computed by the loader) are recorded with their sizes and stat stamps;
    a sidecar the loader already wrote with :func:`write_host_sidecar` is recorded, not
    rewritten. ``model_id`` (how the model was named, org included), ``content_id`` (the
    checkpoint's content digest) and ``generation`` (the subdir this build wrote) identify the
    build. The marker is published last, by atomic rename, so a crash at any point leaves either
    the previous state or a complete one. Failing to write (read-only or full disk) only warns:
    the build it records has already succeeded."""
    if variant_unverifiable(build_variant):
        logger.warning(f"Not marking {cache_path} complete: its build variant could not be computed")
        return False
    root = Path(cache_path)
    marker = marker_path(root, build_variant)
    manifest, host = _manifest(state_dict, is_host_weight)
    try:
        if cache_files is not None:
            files = sorted({safe_relative_path(f) for f in cache_files})
        else:
            files = list_cache_files(root / generation if generation else root)
            files = [f"{generation}/{f}" for f in files] if generation else files
        if not files:
            logger.warning(f"Not marking {root} complete: no {TENSORBIN_SUFFIX} files in it")
            return False
        records = tuple(_record_file(root, rel, digests) for rel in files)
        sidecar_record = None
        if host:
            name = f"{generation}/{host_sidecar_name(build_variant)}" if generation else host_sidecar_name(build_variant)
            if name not in (digests or {}):  # else the loader published it while converting
                digests = {**(digests or {}), **write_host_sidecar(root, host, build_variant, generation)}
            sidecar_record = _record_file(root, name, digests)
        body = WeightCacheMarker(
            model_name=model_name,
            model_id=model_id or model_name,
            content_id=content_id,
            generation=generation,
            n_layers=n_layers,
            mesh_shape=normalize_mesh_shape(mesh_shape),
            components=tuple(normalize_components(components)),
            build_variant=canonical_variant(build_variant),
            is_moe=bool(is_moe),
            model_info=dict(model_info or {}),
            model_config=dict(model_config) if model_config is not None else None,
            files=records,
            host_weights=tuple(sorted(host)),
            host_sidecar=sidecar_record,
            weights=manifest,
        )
        atomic_write_bytes(marker, marker_json(body))
    except Exception as error:  # noqa: BLE001 - recording completion must never fail a finished build
        logger.warning(f"Could not mark weight cache {root} complete: {error}")
        return False
    forget_markers()
    logger.info(f"Marked weight cache complete: {marker} ({len(manifest)} weights, {len(host)} on host)")
    return True


# --------------------------------------------------------------------------------------------
# The warm state dict
# --------------------------------------------------------------------------------------------


def placeholder(shape: Iterable[int], dtype: torch.dtype) -> torch.Tensor:
    """A tensor with this shape and dtype and no storage (torch ``meta``).

    Host-side reshapes, transposes, permutes, cats, chunks and dtype casts work on it (loaders
    use :func:`concat`, :func:`stack` and :func:`fp32_elementwise`, which skip torch's slow meta
    kernels); reading its values, or converting it to a ttnn tensor, raises."""
    return torch.empty(tuple(shape), dtype=dtype, device="meta")


def is_placeholder_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_meta


# Host transforms that stay cheap on placeholders. Views (reshape, transpose, narrow, chunk) are
# free on torch ``meta`` tensors, but ``cat`` and arithmetic go through torch's meta kernels, whose
# first use imports its decomposition machinery: about 4 s on every warm start. Loaders use these
# instead; on placeholders they compute only the result's shape and dtype.


def concat(tensors: Sequence[torch.Tensor], dim: int = 0) -> torch.Tensor:
    """``torch.cat``, shape-only on placeholders."""
    if all(is_placeholder_tensor(t) for t in tensors):
        shape = list(tensors[0].shape)
        shape[dim] = sum(t.shape[dim] for t in tensors)
        return placeholder(shape, tensors[0].dtype)
    return torch.cat(list(tensors), dim=dim)


def stack(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """``torch.stack`` along a new first dim, shape-only on placeholders."""
    return concat([t.unsqueeze(0) for t in tensors], dim=0)


def fp32_elementwise(weight: torch.Tensor, transform: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``transform(weight.float())`` for an elementwise transform (same shape, float32 result),
    shape-only on placeholders."""
    if is_placeholder_tensor(weight):
        return placeholder(weight.shape, torch.float32)
    return transform(weight.float())


class MissingWeightError(WeightCacheError, KeyError):
    """A warm build asked for a weight the marker's manifest lacks: the cache is not this model's
    (a ``KeyError`` too, so ``Mapping.get`` and ``in`` keep their meaning)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class CachedStateDict(MutableMapping):
    """The ``state_dict`` of a warm build: real host weights plus storage-free placeholders.

    Keys in the host sidecar give real tensors; every other key of the manifest gives a fresh
    :func:`placeholder`. Mutable (loaders ``setdefault`` derived weights) and truthy.
    Branch on ``is_placeholder`` to tell it from a real state dict, never on truthiness."""

    is_placeholder = True

    def __init__(
        self,
        manifest: Mapping[str, tuple[Iterable[int], torch.dtype | str]],
        host: Mapping[str, torch.Tensor] | None,
    ) -> None:
        self._manifest = {key: (tuple(shape), _as_dtype(dtype)) for key, (shape, dtype) in manifest.items()}
        self._host = dict(host or {})
        self._overrides: dict[str, Any] = {}
        self._deleted: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        if key in self._deleted:
            raise KeyError(key)
        for source in (self._overrides, self._host):
            if key in source:
                return source[key]
        try:
            shape, dtype = self._manifest[key]
        except KeyError:
            raise MissingWeightError(f"the cache's manifest has no weight {key!r}") from None
        return placeholder(shape, dtype)

    def __setitem__(self, key: str, value: Any) -> None:
        self._deleted.discard(key)
        self._overrides[key] = value

    def __delitem__(self, key: str) -> None:
        if key not in self:
            raise KeyError(key)
        self._overrides.pop(key, None)
        self._deleted.add(key)

    def __contains__(self, key: object) -> bool:
        return key not in self._deleted and (key in self._overrides or key in self._host or key in self._manifest)

    def __iter__(self) -> Iterator[str]:
        for source in (self._overrides, self._host, self._manifest):
            for key in source:
                if key in self._deleted:
                    continue
                if source is not self._overrides and key in self._overrides:
                    continue
                if source is self._manifest and key in self._host:
                    continue
                yield key

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def host_keys(self) -> frozenset[str]:
        return frozenset(self._host)


def _as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _TORCH_DTYPES:
        raise WeightCacheError(f"unknown dtype {dtype!r} in weight manifest")
    return _TORCH_DTYPES[dtype]


def _restore_model_facts(args: Any, marker: WeightCacheMarker) -> None:
    """Put back on ``args`` what a cold build learns from checkpoint keys and a warm build skips."""
    info = marker.model_info
    args.is_mixture_of_experts = marker.is_moe
    keys = marker.weights.keys()
    args.fuse_qkv = bool(info["fuse_qkv"]) if "fuse_qkv" in info else any("qkv" in k for k in keys)
    args.fuse_mlp = bool(info["fuse_mlp"]) if "fuse_mlp" in info else any("gate_up" in k for k in keys)
    if marker.is_moe:
        args.moe = True
        if type(info.get("num_experts")) is int and info["num_experts"] >= 1:
            args.num_experts = info["num_experts"]
        else:
            counted = _count_experts(keys)
            if counted:
                args.num_experts = counted
            elif hasattr(args, "num_local_experts"):
                args.num_experts = args.num_local_experts


_EXPERT_INDEX = re.compile(r"\.experts\.(\d+)\.")


def _count_experts(keys: Iterable[str]) -> int:
    indices = [int(m.group(1)) for k in keys if (m := _EXPERT_INDEX.search(k))]
    return max(indices) + 1 if indices else 0


def build_cached_state_dict(
    cache_path: str | os.PathLike,
    host: Mapping[str, torch.Tensor] | None = None,
    args: Any = None,
    build_variant: Mapping[str, Any] | None = None,
) -> CachedStateDict:
    """The warm ``state_dict`` from the marker's manifest and the host sidecar.

    ``host`` may be the sidecar the gate already loaded; otherwise it is taken (and released)
    from the gate's memo. ``args`` (a ModelArgs-like) gets ``is_mixture_of_experts``, ``moe``,
    ``num_experts``, ``fuse_qkv`` and ``fuse_mlp`` restored, since a warm build never sees the
    checkpoint keys they are normally sniffed from."""
    marker = read_marker(cache_path, build_variant)
    if args is not None and hasattr(args, "__dict__"):
        _restore_model_facts(args, marker)
    if host is None and marker.host_weights:
        host = load_host_sidecar(cache_path, consume=True, build_variant=build_variant)
        if host is None:
            raise WeightCacheError(f"host sidecar of {cache_path} is unreadable or vanished after the gate passed")
    if set(host or {}) != set(marker.host_weights):
        raise WeightCacheError(f"host sidecar of {cache_path} does not hold the recorded host weights")
    logger.info(
        f"Warm weight cache {cache_path}: {len(marker.weights)} weights, "
        f"{len(host or {})} real on host, no checkpoint read"
    )
    return CachedStateDict(marker.weights, host)


def cached_model_config(cache_path: str | os.PathLike, build_variant: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The checkpoint ``config.json`` kept with the marker (for warm starts without a checkpoint)."""
    config = read_marker(cache_path, build_variant).model_config
    if config is None:
        raise WeightCacheError(f"marker in {cache_path} keeps no model config")
    return config

