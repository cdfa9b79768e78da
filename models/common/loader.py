# SPDX-License-Identifier: Apache-2.0
"""The shared loader: warm-or-cold decided once, here; families only say how weights convert.

A load goes:

1. Resolve the checkpoint (HF id, local dir or hub snapshot: one cache identity for all three)
   and the cache directory ``$TT_CACHE_PATH/<model>/<precision>/mesh_<rows>x<cols>``.
2. Read the architecture from the checkpoint's ``config.json``, or, when the checkpoint is gone,
   from the copy kept with the completion marker (a cache-only deploy).
3. Ask the gate. **Warm**: the state dict is :func:`build_cached_state_dict` (placeholders plus the
   real host weights) and no checkpoint file is opened. **Cold**: withdraw the marker, read the
   checkpoint lazily, convert every weight, and mark complete only after a full build (never for
   a ``num_layers`` build). A warm build that meets a bad file falls back to cold.

A family subclasses :class:`WeightLoader` with its key renaming rules, its :class:`ModelArgs`
and its ``convert`` (see :mod:`models.common.decoder` for the layouts families share).
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
import ttnn
from loguru import logger

from models.common.checkpoint import (
    CheckpointError,
    CheckpointReader,
    KeyRule,
    checkpoint_changed,
    checkpoint_fingerprint,
    read_config,
    resolve_checkpoint_dir,
)
from models.common.mesh import MeshShape, parse_mesh_shape
from models.common.model_args import ModelArgs
from models.common.tensor_cache import PRECISIONS, TensorCache, TensorFormat
from models.common.weight_cache import (
    DEFAULT_FORCE_ENV,
    CacheStatus,
    WeightCacheError,
    build_cached_state_dict,
    cached_model_config,
    checkpoint_name,
    invalidate_weight_cache,
    mark_weight_cache_complete,
    placeholder,
    weight_cache_status,
    write_host_sidecar,
)

CACHE_ROOT_ENV = "TT_CACHE_PATH"


def default_cache_root() -> Path:
    return Path(os.environ.get(CACHE_ROOT_ENV) or Path.home() / ".cache" / "tt-warm-loaders")


class LazyStateDict(Mapping):
    """The checkpoint as a read-only ``state_dict`` whose tensors are read when indexed."""

    def __init__(self, reader: CheckpointReader) -> None:
        self._reader = reader
        self._keys = reader.keys()

    def __getitem__(self, key: str) -> torch.Tensor:
        return self._reader.get(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._reader

    def release_read(self) -> None:
        """Drop the pages of the tensors read so far (a streaming seed, after each weight)."""
        self._reader.release_read()

    def manifest_view(self, host: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Shapes and dtypes of every tensor (as placeholders), with the host weights already
        read for the build (``host``) real: nothing is read again."""
        return {key: host[key] if key in host else placeholder(*self._reader.spec(key)) for key in self._keys}


@dataclass
class LoadedModel:
    """A built model's ttnn weights, how each is laid out, and how the load went."""

    args: ModelArgs
    weights: dict[str, ttnn.Tensor]
    formats: dict[str, TensorFormat]
    host_weights: dict[str, torch.Tensor]
    cache_dir: Path
    mesh_shape: MeshShape
    warm: bool
    reason: str
    seconds: float
    timings: dict[str, float] = field(default_factory=dict)


class WeightSink:
    """What ``convert`` writes into: ``put`` a weight in the form the device consumes.

    ``keep=False`` (a streaming seed) drops each converted weight once it is handed to the cache
    and calls ``after_put`` (which releases the checkpoint pages it was made from)."""

    def __init__(
        self,
        cache: TensorCache,
        state: Mapping[str, Any],
        host_keys: Iterable[str],
        *,
        keep: bool = True,
        after_put: Callable[[str], None] | None = None,
    ) -> None:
        self._cache = cache
        self.state = state
        self.keep = keep
        self.after_put = after_put
        self.weights: dict[str, ttnn.Tensor] = {}
        self.formats: dict[str, TensorFormat] = {}
        self.host: dict[str, torch.Tensor] = {k: state[k] for k in host_keys if k in state}

    def put(self, name: str, tensor: torch.Tensor, fmt: TensorFormat) -> None:
        if name in self.formats:
            raise ValueError(f"weight {name!r} converted twice")
        converted = self._cache.as_tensor(name, tensor, fmt)
        self.formats[name] = fmt
        if self.keep:
            self.weights[name] = converted
        if self.after_put is not None:
            self.after_put(name)


class WeightLoader(ABC):
    """One family's loader. Subclasses set ``family``, ``key_rules`` and implement
    :meth:`make_args` and :meth:`convert`; everything about the cache happens here."""

    family: ClassVar[str]
    key_rules: ClassVar[Sequence[KeyRule]]
    # Bump when a family changes how it lays weights out: old caches then read as cold.
    layout_version: ClassVar[int] = 1
    all_components: ClassVar[tuple[str, ...]] = ("text",)

    def __init__(
        self,
        model: str | os.PathLike,
        *,
        mesh_shape: str | Sequence[int] = (1, 1),
        precision: str = "bfloat8_b",
        cache_root: str | os.PathLike | None = None,
        num_layers: int | None = None,
        components: Iterable[str] | None = None,
        mesh_device: Any = None,
        force_env: str | None = DEFAULT_FORCE_ENV,
    ) -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision {precision!r}: expected one of {sorted(PRECISIONS)}")
        self.model = model
        self.model_name = checkpoint_name(model)
        self.mesh_shape = parse_mesh_shape(mesh_shape)
        self.precision = precision
        self.num_layers = num_layers
        self.components = tuple(sorted(set(components or self.all_components)))
        unknown = set(self.components) - set(self.all_components)
        if unknown:
            raise ValueError(f"{self.family} has no components {sorted(unknown)}; it has {self.all_components}")
        self.mesh_device = mesh_device
        self.force_env = force_env
        rows, cols = self.mesh_shape
        self.cache_dir = Path(cache_root or default_cache_root()) / self.model_name / precision / f"mesh_{rows}x{cols}"
        self.checkpoint_dir = resolve_checkpoint_dir(model)

    # -- what a family provides -------------------------------------------------------------

    @abstractmethod
    def make_args(self, config: dict[str, Any], num_layers: int | None) -> ModelArgs:
        """The family's architecture facts from ``config.json``."""

    @abstractmethod
    def convert(self, sink: WeightSink, args: ModelArgs) -> None:
        """Convert every weight of this build (``sink.state``) and ``sink.put`` it."""

    def is_host_weight(self, key: str) -> bool:
        """Weights the device code consumes on the host; kept real in warm builds."""
        return False

    def model_info(self, args: ModelArgs, keys: Iterable[str]) -> dict[str, Any]:
        """Facts a warm build cannot sniff from checkpoint keys; restored onto ``args``."""
        return {"fuse_qkv": args.fuse_qkv, "fuse_mlp": args.fuse_mlp, "num_experts": args.num_experts}

    # -- identity ---------------------------------------------------------------------------

    @property
    def build_variant(self) -> dict[str, Any]:
        """Options that change which files a build writes, matched exactly by the gate."""
        return {"family": self.family, "precision": self.precision, "layout_version": self.layout_version}

    def precision_dtype(self) -> Any:
        return PRECISIONS[self.precision]

    def model_config(self) -> dict[str, Any]:
        """``config.json`` from the checkpoint, else the copy kept with the cache."""
        if self.checkpoint_dir is not None:
            return read_config(self.checkpoint_dir)
        try:
            return cached_model_config(self.cache_dir, self.build_variant)
        except WeightCacheError as error:
            raise CheckpointError(
                f"{self.model}: no checkpoint on this machine and no usable cache ({error})"
            ) from None

    def status(self, args: ModelArgs | None = None) -> CacheStatus:
        """The gate's verdict for this build, with the checkpoint's fingerprint checked too."""
        args = args or self.make_args(self.model_config(), self.num_layers)
        status = weight_cache_status(
            self.cache_dir,
            model_name=self.model_name,
            n_layers=args.n_layers,
            mesh_shape=self.mesh_shape,
            components=self.components,
            build_variant=self.build_variant,
            force_env=self.force_env,
        )
        if status.warm and self.checkpoint_dir is not None:
            recorded = status.marker.model_info.get("checkpoint_fingerprint")
            if isinstance(recorded, list) and checkpoint_changed(recorded, checkpoint_fingerprint(self.checkpoint_dir)):
                return CacheStatus(False, f"checkpoint {self.checkpoint_dir} changed since the cache was built")
        return status

    # -- the load ---------------------------------------------------------------------------

    def load(self) -> LoadedModel:
        start = time.perf_counter()
        args = self.make_args(self.model_config(), self.num_layers)
        status = self.status(args)
        if status.warm:
            try:
                return self._load_warm(args, start)
            except WeightCacheError as error:
                logger.warning(f"Warm build of {self.model_name} failed ({error}); building cold")
                status = CacheStatus(False, str(error))
        return self._load_cold(args, status.reason, start)

    def _load_warm(self, args: ModelArgs, start: float) -> LoadedModel:
        state = build_cached_state_dict(self.cache_dir, args=args, build_variant=self.build_variant)
        cache = TensorCache(self.cache_dir, self.mesh_shape, rebuild=False, mesh_device=self.mesh_device)
        sink = WeightSink(cache, state, state.host_keys())
        self.convert(sink, args)
        seconds = time.perf_counter() - start
        logger.info(f"{self.model_name}: warm build from {self.cache_dir} in {seconds:.3f} s")
        return LoadedModel(args, sink.weights, sink.formats, sink.host, self.cache_dir, self.mesh_shape, True,
                           "complete", seconds)

    def seed(self, progress: Any = None) -> Any:
        """Make the cache warm and return a :class:`~models.seeding.stream.SeedResult`, keeping
        no weight: the explicit cache-only alternative to :meth:`load` (which returns host
        tensors). A cold cache is built streaming, each weight read, converted, written and
        released, so peak memory does not grow with the model. ``progress``: see
        :mod:`models.seeding.progress`."""
        from models.seeding.stream import seed_streaming

        return seed_streaming(self, progress)

    def _load_cold(
        self, args: ModelArgs, reason: str, start: float, *, stream: bool = False,
        on_written: Callable[[str, int], None] | None = None,
    ) -> LoadedModel:
        """``stream``: keep no converted weight, at most one write queued, checkpoint pages
        released after each weight (:meth:`seed`); ``on_written(name, bytes)`` per file written."""
        if self.checkpoint_dir is None:
            raise CheckpointError(f"{self.model}: the cache is cold ({reason}) and no checkpoint is on this machine")
        logger.info(f"{self.model_name}: cold build into {self.cache_dir} ({reason})")
        invalidate_weight_cache(self.cache_dir, self.build_variant)
        # Taken before reading: a checkpoint replaced mid-build then reads as changed next time.
        fingerprint = checkpoint_fingerprint(self.checkpoint_dir)
        reader = CheckpointReader(self.checkpoint_dir, self.key_rules)
        state = LazyStateDict(reader)
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
        except OSError as error:  # the writes below report it once and the build goes on
            logger.warning(f"Cannot create {self.cache_dir}: {error}")
        cache = TensorCache(self.cache_dir, self.mesh_shape, rebuild=True, mesh_device=self.mesh_device,
                            max_pending=1 if stream else None, on_written=on_written)
        sink = WeightSink(cache, state, [k for k in state if self.is_host_weight(k)], keep=not stream,
                          after_put=(lambda _: state.release_read()) if stream else None)
        if sink.host and not args.partial:
            cache.submit_file(write_host_sidecar, self.cache_dir, sink.host, self.build_variant)
        try:
            self.convert(sink, args)
        except BaseException:
            cache.abort()
            raise
        convert_seconds = time.perf_counter() - start
        digests = cache.finish()
        if args.partial:
            logger.info(f"{self.model_name}: {args.n_layers}-layer build; cache not marked complete")
        elif cache.write_errors:
            logger.warning(f"{self.model_name}: built in memory; {self.cache_dir} stays cold (not writable)")
        else:
            self._mark_complete(args, state, sink.host, cache.files, digests, fingerprint)
        reader.close()
        seconds = time.perf_counter() - start
        logger.info(f"{self.model_name}: cold build in {seconds:.3f} s")
        timings = {"from_torch": cache.convert_seconds, "convert": convert_seconds, "finish": seconds - convert_seconds}
        return LoadedModel(args, sink.weights, sink.formats, sink.host, self.cache_dir, self.mesh_shape, False,
                           reason, seconds, timings)

    def _mark_complete(self, args: ModelArgs, state: LazyStateDict, host: Mapping[str, torch.Tensor],
                       files: list[str], digests: dict[str, str], fingerprint: list[list[Any]]) -> None:
        mark_weight_cache_complete(
            self.cache_dir,
            state.manifest_view(host),
            model_name=self.model_name,
            n_layers=args.n_layers,
            mesh_shape=self.mesh_shape,
            components=self.components,
            build_variant=self.build_variant,
            is_moe=args.is_mixture_of_experts,
            is_host_weight=self.is_host_weight,
            model_config=args.config,
            model_info={**self.model_info(args, state), "checkpoint_fingerprint": fingerprint},
            cache_files=files,
            digests=digests,
        )
