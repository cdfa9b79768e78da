# SPDX-License-Identifier: Apache-2.0
"""The in-memory tier: complete frozen-parent prefill outputs in (pinned) CPU memory, in an LRU.

A hit is shared by every later step, so its consumer must not be able to change it: a consumer
that applies a temperature in place (``hit.logits.div_(0.7)``) would silently change what the
next hit returns. Entries therefore own private copies (taken once, at store) and every hit hands
out *read-only views* of them (:class:`ReadOnlyTensor`): any in-place torch operation on one, or
on a view of one, raises :class:`ReadOnlyTensorError` before touching the memory, and results of
ordinary operations are plain tensors. Views cost a few microseconds per hit where a copy costs
a memcpy of every tensor (``scripts/bench_prefill_cache.py`` measures both). Low-level escape
hatches (``untyped_storage()``, ``data_ptr()``, DLPack) are not policed.

Keys include the parent model's identity (``parent_identity``), so one LRU never serves the
prefill of one parent to another.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

import torch
from torch.utils._pytree import tree_flatten, tree_map

from models.common import envs
from models.common.prefill_cache.identity import tensor_bytes
from models.common.prefill_cache.layout import FrozenBackboneCacheError, canonical_json, is_int

BASE_FORWARD_CACHE_SCHEMA: Final = "nnf.resynthesis.base_forward_cache.v1"
BASE_FORWARD_CACHE_ENV: Final = "NNF_RESYNTHESIS_BASE_FORWARD_CACHE"
BASE_FORWARD_CACHE_ENTRIES_ENV: Final = "NNF_RESYNTHESIS_BASE_FORWARD_CACHE_ENTRIES"
BASE_FORWARD_CACHE_DEFAULT_ENTRIES: Final = envs.BASE_FORWARD_CACHE_ENTRIES.default
_KEY_DOMAIN: Final = b"nnf.resynthesis.base_forward_cache_key.v3\x00"


# ---------------------------------------------------------------------------------------------
# Read-only views
# ---------------------------------------------------------------------------------------------


class ReadOnlyTensorError(RuntimeError):
    """An in-place change of a cached tensor was refused."""


_INPLACE_DUNDERS: Final = frozenset({
    "__setitem__", "__delitem__", "__set__", "__iadd__", "__isub__", "__imul__", "__itruediv__",
    "__ifloordiv__", "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__",
    "__irshift__", "__imatmul__",
})
_HARMLESS_UNDERSCORED: Final = frozenset({"requires_grad_", "retain_grad"})


@functools.cache
def _inplace_position(func) -> int | None:
    """Index of a function's ``inplace`` parameter (``F.relu(x, True)``), None if it has none."""
    try:
        names = list(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        return None
    return names.index("inplace") if "inplace" in names else None


def _mutation(func, args: tuple, kwargs: dict) -> str | None:
    """Why ``func(*args, **kwargs)`` would write into a read-only tensor, or None. In-place
    operations write into their first argument (``t.div_(x)``, ``t[i] = x``, ``F.relu(t, True)``),
    ``out=`` into its tensors; reading a read-only tensor into another one is fine."""
    name = getattr(func, "__name__", "")
    if any(isinstance(t, ReadOnlyTensor) for t in tree_flatten(kwargs.get("out"))[0]):
        return f"{name}(out=...)"
    if not args or not isinstance(args[0], ReadOnlyTensor):
        return None
    if name in _INPLACE_DUNDERS or (name.endswith("_") and not name.endswith("__") and name not in _HARMLESS_UNDERSCORED):
        return name
    position = _inplace_position(func)
    if kwargs.get("inplace") is True or (position is not None and len(args) > position and args[position] is True):
        return f"{name}(inplace=True)"
    return None


def _storage_key(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


class ReadOnlyTensor(torch.Tensor):
    """A view of cached memory: every in-place operation raises :class:`ReadOnlyTensorError`.

    Operations that return views of it (indexing, ``view``, ``.data``, a no-op ``.float()``)
    return read-only views again; everything else returns plain tensors."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        why = _mutation(func, args, kwargs)
        if why is not None:
            raise ReadOnlyTensorError(
                f"{why} would change a tensor served by the prefill cache (shared by every later "
                "hit); use .clone() first"
            )
        guarded = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, ReadOnlyTensor)]
        with torch._C.DisableTorchFunctionSubclass():
            versions = [t._version for t in guarded]
            result = func(*args, **kwargs)
            if [t._version for t in guarded] != versions:  # a path the names above missed
                raise ReadOnlyTensorError(f"{getattr(func, '__name__', func)} changed a cached tensor in place")
            shared = {_storage_key(t) for t in guarded}
            return tree_map(lambda value: _rewrap(value, shared), result)


def _rewrap(value: object, shared: set[int]) -> object:
    if isinstance(value, torch.Tensor) and not isinstance(value, ReadOnlyTensor):
        if value.layout == torch.strided and value.device.type != "meta" and _storage_key(value) in shared:
            return value.as_subclass(ReadOnlyTensor)
        return value
    if hasattr(value, "setflags") and hasattr(value, "base"):  # a numpy array from .numpy()
        value.setflags(write=False)
    return value


def read_only_view(tensor: torch.Tensor) -> ReadOnlyTensor:
    """A fresh read-only view of ``tensor`` (shares its memory; its own Python object, so even
    attribute assignments on one hit never reach the next)."""
    with torch._C.DisableTorchFunctionSubclass():
        return tensor.detach().as_subclass(ReadOnlyTensor)


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------


def base_forward_cache_enabled_boundary() -> bool:
    """Whether the in-memory frozen-parent prefill cache is on (``NNF_RESYNTHESIS_BASE_FORWARD_CACHE``)."""
    try:
        return envs.NNF_RESYNTHESIS_BASE_FORWARD_CACHE
    except envs.BadValue as error:
        raise FrozenBackboneCacheError(str(error)) from None


def base_forward_cache_capacity_boundary() -> int:
    """LRU capacity in entries (``NNF_RESYNTHESIS_BASE_FORWARD_CACHE_ENTRIES``, default 512)."""
    try:
        return envs.NNF_RESYNTHESIS_BASE_FORWARD_CACHE_ENTRIES
    except envs.BadValue as error:
        raise FrozenBackboneCacheError(str(error)) from None


def base_forward_cache_allowed_boundary(
    *, input_mask: torch.Tensor | None, use_past: bool, parent_trainable: bool
) -> bool:
    """Whether a prefill may be served from the cache.

    Only a batched training prefill qualifies: it has an explicit attention mask, continues no
    KV state and runs a frozen parent. A decode arm must run live to populate its KV cache."""
    if input_mask is None or use_past or parent_trainable:
        return False
    return base_forward_cache_enabled_boundary()


def base_forward_cache_key_boundary(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    parent_identity: str | None = None,
) -> tuple[str, str]:
    """(SHA-256 hex, its 16-hex display prefix) of the parent model, a prompt, its mask and
    their shapes.

    ``parent_identity`` names the frozen parent (e.g. its weights' SHA-256 plus precision); a
    key made without one never equals a key made with one. :meth:`BaseForwardCache.key_boundary`
    fills it in from the cache's own parent."""
    if input_ids.ndim != 2 or input_ids.shape[1] < 1:
        raise ValueError(f"base forward cache key needs [batch, sequence], got {tuple(input_ids.shape)}")
    if attention_mask is not None and attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention mask {tuple(attention_mask.shape)} differs from input ids {tuple(input_ids.shape)}"
        )
    if parent_identity is not None and (not isinstance(parent_identity, str) or not parent_identity):
        raise ValueError(f"parent_identity must be a non-empty string, got {parent_identity!r}")
    hasher = hashlib.sha256(_KEY_DOMAIN)
    hasher.update(canonical_json(parent_identity) + b"\x00")
    for tensor in (input_ids, attention_mask):
        if tensor is None:
            hasher.update(b"no-mask\x00")
            continue
        hasher.update(canonical_json(list(tensor.shape)) + b"\x00")
        hasher.update(tensor_bytes(tensor.detach().to(device="cpu", dtype=torch.long)))
    full = hasher.hexdigest()
    return full, full[:16]


# ---------------------------------------------------------------------------------------------
# Entries and the LRU
# ---------------------------------------------------------------------------------------------


@functools.cache
def _host_can_pin() -> bool:
    try:
        torch.empty(1).pin_memory()
    except RuntimeError:
        return False
    return True


def _private_host_copy(value: torch.Tensor) -> torch.Tensor:
    """A detached contiguous CPU copy that aliases nothing, page-locked when the host has an
    accelerator."""
    with torch._C.DisableTorchFunctionSubclass():
        detached = value.detach()
        if _host_can_pin():
            return detached.to(device="cpu").contiguous().pin_memory()  # pin_memory copies
        return detached.to(device="cpu", copy=True, memory_format=torch.contiguous_format)


def _owned(value: torch.Tensor) -> ReadOnlyTensor:
    """What the cache keeps: memory nobody else can write (a copy, unless already read-only)."""
    return read_only_view(value if isinstance(value, ReadOnlyTensor) else _private_host_copy(value))


def _map_optional(function, value: torch.Tensor | None) -> torch.Tensor | None:
    return function(value) if isinstance(value, torch.Tensor) else None


@dataclass(frozen=True)
class BaseForwardCacheEntry:
    """One complete frozen-parent prefill output, held in CPU memory."""

    hidden: torch.Tensor  # decoder output hidden states
    logits: torch.Tensor  # parent logits
    parent_context_hidden: torch.Tensor  # context features fed to the child
    parent_expert_routes: torch.Tensor  # MoE routing of the parent
    parent_layer_routes: torch.Tensor  # per-layer routing
    kv_prefix_positions: torch.Tensor  # positions already in the KV cache
    kv_new_positions: torch.Tensor  # positions this prefill appended
    parent_prefill_hidden: torch.Tensor | None  # optional tiled prefill features
    parent_prefill_input_positions: torch.Tensor | None  # optional positions of those
    sha16: str  # display prefix of the prompt key

    _REQUIRED = (
        "hidden", "logits", "parent_context_hidden", "parent_expert_routes",
        "parent_layer_routes", "kv_prefix_positions", "kv_new_positions",
    )
    _OPTIONAL = ("parent_prefill_hidden", "parent_prefill_input_positions")

    def _mapped(self, function) -> BaseForwardCacheEntry:
        values = {name: function(getattr(self, name)) for name in self._REQUIRED}
        values.update({name: _map_optional(function, getattr(self, name)) for name in self._OPTIONAL})
        return BaseForwardCacheEntry(sha16=self.sha16, **values)

    @classmethod
    def from_forward_boundary(
        cls,
        *,
        hidden: torch.Tensor,  # required outputs of the forward ...
        logits: torch.Tensor,
        parent_context_hidden: torch.Tensor,
        parent_expert_routes: torch.Tensor,  # ... routing ...
        parent_layer_routes: torch.Tensor,
        kv_prefix_positions: torch.Tensor,  # ... and KV geometry
        kv_new_positions: torch.Tensor,
        parent_prefill_hidden: torch.Tensor | None,  # optional tiled prefill outputs
        parent_prefill_input_positions: torch.Tensor | None,
        sha16: str,
    ) -> BaseForwardCacheEntry:
        """Capture a forward's outputs as private, read-only CPU copies (pinned where possible):
        the forward's own tensors may be changed afterwards without reaching the cache."""
        live = cls(
            hidden, logits, parent_context_hidden, parent_expert_routes, parent_layer_routes,
            kv_prefix_positions, kv_new_positions, parent_prefill_hidden,
            parent_prefill_input_positions, sha16,
        )
        return live._mapped(_owned)

    def to_device_boundary(self, device: torch.device) -> BaseForwardCacheEntry:
        """The entry on the compute device (asynchronous copies from pinned memory on CUDA); on
        the CPU the tensors stay read-only views."""
        device = torch.device(device)
        return self._mapped(lambda t: t.to(device=device, non_blocking=device.type == "cuda"))

    @property
    def nbytes(self) -> int:
        values = (getattr(self, name) for name in (*self._REQUIRED, *self._OPTIONAL))
        return sum(value.nbytes for value in values if isinstance(value, torch.Tensor))


class BaseForwardCache:
    """Thread-safe LRU of complete frozen-parent prefill outputs, with hit/miss telemetry.

    Entries are owned (private copies) and every hit is a fresh entry of read-only views, so no
    consumer can change what the next hit returns. ``parent_identity`` names the frozen parent
    whose prefills this cache holds; :meth:`key_boundary` binds it into every key."""

    def __init__(self, *, capacity: int, parent_identity: str | None = None) -> None:
        if not is_int(capacity) or capacity < 1:
            raise ValueError(f"base forward cache capacity must be a positive integer, got {capacity!r}")
        if parent_identity is not None and (not isinstance(parent_identity, str) or not parent_identity):
            raise ValueError(f"parent_identity must be a non-empty string, got {parent_identity!r}")
        self._capacity = capacity
        self.parent_identity = parent_identity
        self._entries: OrderedDict[str, BaseForwardCacheEntry] = OrderedDict()
        self._lock = threading.Lock()
        self._hits = 0
        self._misses = 0

    hits = property(lambda self: self._hits, doc="Lookups that found their key.")
    misses = property(lambda self: self._misses, doc="Lookups that did not.")

    def key_boundary(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> tuple[str, str]:
        """:func:`base_forward_cache_key_boundary` bound to this cache's parent."""
        return base_forward_cache_key_boundary(input_ids, attention_mask, parent_identity=self.parent_identity)

    def clear(self) -> None:
        """Drop every entry (the counters keep counting)."""
        with self._lock:
            self._entries.clear()

    def lookup(self, cache_key: str) -> BaseForwardCacheEntry | None:
        """A read-only view of the entry for ``cache_key`` (now the most recently used), or
        None; counted."""
        with self._lock:
            entry = self._entries.pop(cache_key, None)
            if entry is None:
                self._misses += 1
                return None
            self._hits += 1
            self._entries[cache_key] = entry
        return entry._mapped(read_only_view)

    def store(self, cache_key: str, entry: BaseForwardCacheEntry) -> None:
        """Insert or refresh ``cache_key`` (owning the entry's tensors: copied unless they came
        from :meth:`BaseForwardCacheEntry.from_forward_boundary`), evicting the least recently
        used beyond capacity."""
        owned = entry._mapped(_owned)
        with self._lock:
            self._entries.pop(cache_key, None)
            self._entries[cache_key] = owned
            if len(self._entries) > self._capacity:
                del self._entries[next(iter(self._entries))]

    def telemetry_boundary(self) -> dict[str, object]:
        """Counters for run logs: schema, enabled, capacity, entries, hits, misses, parent."""
        with self._lock:
            return dict(
                schema=BASE_FORWARD_CACHE_SCHEMA,
                enabled=base_forward_cache_enabled_boundary(),
                capacity=self._capacity,
                entries=len(self._entries),
                hits=self._hits,
                misses=self._misses,
                parentIdentity=self.parent_identity,
            )
