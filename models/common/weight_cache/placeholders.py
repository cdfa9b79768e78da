# SPDX-License-Identifier: Apache-2.0
"""The warm ``state_dict``: real host weights plus storage-free placeholders for everything else.

``ttnn.as_tensor(t, cache_file_name=...)`` loads the cached file and ignores ``t`` on a hit, so once
every converted weight of a model is on disk a loader needs no checkpoint: each weight can be a
*placeholder* with the right shape and dtype and no storage. A placeholder lives on torch's
``meta`` device, so it costs no host memory, and a cache miss on one fails loudly (the tensor
cache refuses to persist it) instead of writing garbage as a weight.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from typing import Any

import torch
from loguru import logger

from models.common.weight_cache.marker import WeightCacheError, WeightCacheMarker

_TORCH_DTYPES = {str(v): v for v in vars(torch).values() if isinstance(v, torch.dtype)}


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


def cached_state_dict(marker: WeightCacheMarker, host: Mapping[str, torch.Tensor], args: Any = None,
                      where: str | os.PathLike = "the cache") -> CachedStateDict:
    """The warm ``state_dict`` of the build ``marker`` records, with its real ``host`` weights
    (each must be the recorded key, shape and dtype). ``args`` (a ModelArgs-like) gets
    ``is_mixture_of_experts``, ``moe``, ``num_experts``, ``fuse_qkv`` and ``fuse_mlp`` restored,
    since a warm build never sees the checkpoint keys they are normally sniffed from."""
    if set(host) != set(marker.host_weights):
        raise WeightCacheError(f"host sidecar of {where} does not hold the recorded host weights")
    for key, value in host.items():
        recorded = marker.weights.get(key)
        if recorded is not None and (tuple(value.shape), str(value.dtype)) != (tuple(recorded[0]), recorded[1]):
            raise WeightCacheError(f"host weight {key} of {where} is {tuple(value.shape)} {value.dtype}, "
                                   f"the manifest says {tuple(recorded[0])} {recorded[1]}")
    if args is not None and hasattr(args, "__dict__"):
        _restore_model_facts(args, marker)
    logger.info(f"Warm weight cache {where}: {len(marker.weights)} weights, {len(host)} real on host, "
                "no checkpoint read")
    return CachedStateDict(marker.weights, host)


def manifest_of(
    state_dict: Mapping[str, Any], is_host_weight: Callable[[str], bool] | None
) -> tuple[dict[str, tuple[tuple[int, ...], str]], dict[str, torch.Tensor]]:
    """Each weight's shape and dtype, and the real host weights among them (a host weight must be
    real: it is written to the sidecar)."""
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
