# SPDX-License-Identifier: Apache-2.0
"""The shared loader: warm-or-cold decided once, here; families only say how weights convert.

A load goes:

1. **Identity.** The cache of a model is named by what its weights are, not by a folder name:
   ``$TT_CACHE_PATH/<name>--<content id>/<precision>/mesh_<rows>x<cols>`` where the content id
   is a SHA-256 over the checkpoint's config and safetensors files' SHA-256s (hub blobs are named
   by theirs; local files are hashed once and then recognised by their stat stamps). The same
   weights reached as an HF id, a local copy or a hub snapshot share one cache; different
   weights under the same name never do. A ``num_layers`` build has a directory of its own.
   With no weights on this machine (a cache-only deploy) the cache is the one whose marker
   records the same model id (org included); none or several is a clear error.
2. **The gate** (:mod:`models.common.marker`). **Warm**: the state dict is
   :func:`build_cached_state_dict` (placeholders plus the real host weights), every tensor is
   loaded from the build generation the marker names, checked against the shape, dtype and
   layout the loader expects, and no checkpoint file is opened. A bad file means cold (or a
   clear error without a checkpoint).
3. **Cold**, under the cache dir's build lock (one builder at a time; a second one waits, then
   usually finds the cache warm): convert every weight into a fresh generation directory, publish
   the marker last, then retire generations no marker names and no reader holds. Readers never
   take the build lock and keep using the previous generation until the new marker is published.

A family subclasses :class:`WeightLoader` with its key renaming rules, its :class:`ModelArgs`
and its ``convert`` (see :mod:`models.common.decoder` for the layouts families share).
"""

from __future__ import annotations

import contextlib
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

import torch
import ttnn
from loguru import logger

from models.common.checkpoint import (
    CheckpointError,
    CheckpointReader,
    DigestStamps,
    KeyRule,
    checkpoint_name,
    content_id,
    has_weights,
    model_id,
    read_config,
    resolve_checkpoint_dir,
)
from models.common.generations import (
    build_lock,
    new_generation,
    reader_lease,
    retire_generations,
)
from models.common.marker import (
    build_relative,
    read_marker,
    touch_last_used,
    user_stamp_dir,
)
from models.common.mesh import MeshShape, parse_mesh_shape
from models.common.model_args import ModelArgs
from models.common.prefetch import Prefetcher, prefetch_threads
from models.common.tensor_cache import PRECISIONS, TensorCache, TensorFormat, conversion_threads
from models.common.weight_cache import (
    DEFAULT_FORCE_ENV,
    CacheStatus,
    WeightCacheError,
    build_cached_state_dict,
    mark_weight_cache_complete,
    placeholder,
    weight_cache_status,
    write_host_sidecar,
)

CACHE_ROOT_ENV = "TT_CACHE_PATH"
STREAM_PENDING_BYTES = 64 << 20  # a streaming seed's converted weights queued behind the newest, at most
CHECKPOINT_STAMPS_DIR = ".checkpoint-stamps"
WARM_LOAD_ATTEMPTS = 3  # a generation retired between gate and lease: read the newer marker


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

    def release_read(self, keep: Iterable[str] = ()) -> None:
        """Drop the pages of the tensors read so far but ``keep`` (a streaming seed, after each weight)."""
        self._reader.release_read(keep)

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
    cached: bool = True  # False: a cold build that could not write the cache (it stays cold)
    prefetch: Prefetcher | None = None  # warm: still reading the cache's files ahead (``wait()`` for it)


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
        cache_dir: str | os.PathLike | None = None,
        prefetch: int | None = None,
    ) -> None:
        """``prefetch``: threads reading a warm cache's files ahead of use (default
        ``$TT_PREFETCH_THREADS``, else 0: off), see :mod:`models.common.prefetch`."""
        if precision not in PRECISIONS:
            raise ValueError(f"precision {precision!r}: expected one of {sorted(PRECISIONS)}")
        if num_layers is not None and (type(num_layers) is not int or num_layers < 1):
            raise ValueError(f"num_layers {num_layers!r}: expected a positive int")
        self.model = model
        self.model_name = checkpoint_name(model)
        self.model_id = model_id(model)
        self.mesh_shape = parse_mesh_shape(mesh_shape)
        self.precision = precision
        self.num_layers = num_layers
        self.components = tuple(sorted(set(components or self.all_components)))
        unknown = set(self.components) - set(self.all_components)
        if unknown:
            raise ValueError(f"{self.family} has no components {sorted(unknown)}; it has {self.all_components}")
        self.mesh_device = mesh_device
        self.force_env = force_env
        self.cache_root = Path(cache_root or default_cache_root())
        self.checkpoint_dir = resolve_checkpoint_dir(model)
        self._named_cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.prefetch = prefetch_threads(prefetch)

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

    @property
    def has_checkpoint_weights(self) -> bool:
        return has_weights(self.checkpoint_dir)

    @cached_property
    def content_id(self) -> str | None:
        """The checkpoint's content digest (None without weights on this machine)."""
        if not self.has_checkpoint_weights:
            return None
        root_writable = os.access(self.cache_root, os.W_OK) or not self.cache_root.exists()
        store = self.cache_root / CHECKPOINT_STAMPS_DIR if root_writable else user_stamp_dir() / "checkpoints"
        try:
            return content_id(self.checkpoint_dir, DigestStamps(store, self.checkpoint_dir))
        except OSError as error:
            raise CheckpointError(f"cannot read checkpoint {self.checkpoint_dir}: {error}") from None

    def _variant_dir(self) -> Path:
        rows, cols = self.mesh_shape
        mesh = f"mesh_{rows}x{cols}" + (f"-layers{self.num_layers}" if self.num_layers is not None else "")
        return Path(self.precision) / mesh

    @cached_property
    def cache_dir(self) -> Path:
        """This build's cache dir: named by the user, else by the checkpoint's content, else
        (cache-only) the one cache whose marker records this model id."""
        if self._named_cache_dir is not None:
            return self._named_cache_dir
        if self.content_id is not None:
            return self.cache_root / f"{self.model_name}--{self.content_id[:16]}" / self._variant_dir()
        return self._cache_only_dir()

    def _cache_only_dir(self) -> Path:
        candidates, others = [], []
        for directory in sorted(self.cache_root.glob(f"{self.model_name}--*/{self._variant_dir()}")):
            try:
                recorded = read_marker(directory, self.build_variant).model_id
            except WeightCacheError:
                continue
            (candidates if recorded == self.model_id else others).append((directory, recorded))
        if len(candidates) == 1:
            return candidates[0][0]
        where = f"{self.precision} {self._variant_dir().name} caches under {self.cache_root}"
        if not candidates:
            seen = "; caches of that name are for " + ", ".join(sorted({r for _, r in others})) if others else ""
            raise CheckpointError(
                f"{self.model}: no checkpoint weights on this machine and no {where} built from "
                f"model id {self.model_id!r}{seen}"
            )
        listed = "\n  ".join(str(d) for d, _ in candidates)
        raise CheckpointError(
            f"{self.model}: no checkpoint weights on this machine and {len(candidates)} {where} were built "
            f"from {self.model_id!r} (different weights); name one with cache_dir=:\n  {listed}"
        )

    def model_config(self) -> dict[str, Any]:
        """``config.json`` from the checkpoint, else the copy kept with the cache."""
        if self.checkpoint_dir is not None and (self.checkpoint_dir / "config.json").is_file():
            return read_config(self.checkpoint_dir)
        try:
            config = read_marker(self.cache_dir, self.build_variant).model_config
        except WeightCacheError as error:
            raise CheckpointError(f"{self.model}: no checkpoint on this machine and no usable cache ({error})") from None
        if config is None:
            raise CheckpointError(f"{self.model}: no checkpoint config and the cache keeps none")
        return config

    def status(self, args: ModelArgs | None = None) -> CacheStatus:
        """The gate's verdict for this build."""
        args = args or self.make_args(self.model_config(), self.num_layers)
        return weight_cache_status(
            self.cache_dir,
            model_name=self.model_name,
            n_layers=args.n_layers,
            mesh_shape=self.mesh_shape,
            components=self.components,
            build_variant=self.build_variant,
            force_env=self.force_env,
        )

    # -- the load ---------------------------------------------------------------------------

    def load(self) -> LoadedModel:
        """Build the model: warm from the cache when the gate says so, else cold (and cache it)."""
        start = time.perf_counter()
        args = self.make_args(self.model_config(), self.num_layers)
        loaded, reason = self._try_warm(args, start)
        if loaded is not None:
            return loaded
        return self._load_cold(args, reason, start)

    def _try_warm(self, args: ModelArgs, start: float) -> tuple[LoadedModel | None, str]:
        """A warm build if the gate passes and every file loads as expected, else (None, why)."""
        reason = "generation retired while loading"
        for _ in range(WARM_LOAD_ATTEMPTS):
            status = self.status(args)
            if not status.warm:
                return None, status.reason
            with reader_lease(self.cache_dir, status.marker.generation) as leased:
                if not leased:
                    continue
                try:
                    return self._load_warm(args, status, start), "complete"
                except WeightCacheError as error:
                    if not self.has_checkpoint_weights:
                        raise
                    logger.warning(f"Warm build of {self.model_name} failed ({error}); building cold")
                    return None, str(error)
        return None, reason

    def _load_warm(self, args: ModelArgs, status: CacheStatus, start: float) -> LoadedModel:
        marker = status.marker
        state = build_cached_state_dict(self.cache_dir, args=args, build_variant=self.build_variant)
        recorded = {build_relative(path, marker.generation): stamp for path, stamp in status.verified_stamps().items()}
        root = self.cache_dir / marker.generation if marker.generation else self.cache_dir
        prefetcher = Prefetcher(self.prefetch) if self.prefetch else None
        cache = TensorCache(root, self.mesh_shape, rebuild=False, mesh_device=self.mesh_device, recorded=recorded,
                            prefetch=prefetcher)
        sink = WeightSink(cache, state, state.host_keys())
        self.convert(sink, args)
        if prefetcher is not None and marker.host_sidecar is not None:
            prefetcher.add([self.cache_dir / marker.host_sidecar.path])
        touch_last_used(self.cache_dir, self.build_variant)
        seconds = time.perf_counter() - start
        logger.info(f"{self.model_name}: warm build from {root} in {seconds:.3f} s")
        return LoadedModel(args, sink.weights, sink.formats, sink.host, self.cache_dir, self.mesh_shape, True,
                           "complete", seconds, prefetch=prefetcher)

    def seed(self, progress: Any = None) -> Any:
        """Make the cache warm and return a :class:`~models.seeding.stream.SeedResult`, keeping
        no weight: the explicit cache-only alternative to :meth:`load` (which returns host
        tensors). A cold cache is built streaming, each weight read, converted, written and
        released, so peak memory does not grow with the model. ``progress``: see
        :mod:`models.seeding.progress`."""
        from models.seeding.stream import seed_streaming

        return seed_streaming(self, progress)

    def _load_cold(self, args: ModelArgs, reason: str, start: float, **build: Any) -> LoadedModel:
        """``build``: the streaming options of :meth:`_build` (a seed)."""
        if not self.has_checkpoint_weights:
            raise CheckpointError(
                f"{self.model}: the cache {self.cache_dir} is cold ({reason}) and no checkpoint weights are on this machine"
            )
        forced = bool(self.force_env) and os.environ.get(self.force_env) == "1"
        with build_lock(self.cache_dir) as locked:
            if locked and not forced:  # another builder may have finished while this one waited
                loaded, reason = self._try_warm(args, start)
                if loaded is not None:
                    return loaded
            logger.info(f"{self.model_name}: cold build into {self.cache_dir} ({reason})")
            loaded = self._build(args, reason, start, locked, **build)
            if locked:
                retire_generations(self.cache_dir)
        return loaded

    def _build(self, args: ModelArgs, reason: str, start: float, locked: bool, *, stream: bool = False,
               on_written: Callable[[str, int], None] | None = None) -> LoadedModel:
        """``stream`` (a seed): keep no converted weight, at most :data:`STREAM_PENDING_BYTES` of
        writes queued, checkpoint pages released after each weight (host weights excepted: the
        sidecar writer still reads them); ``on_written(name, bytes)`` as each file is written."""
        reader = CheckpointReader(self.checkpoint_dir, self.key_rules)
        state = LazyStateDict(reader)
        generation = None
        if locked:
            with contextlib.suppress(OSError):  # unwritable: the writes below report it once
                generation = new_generation(self.cache_dir)
        root = self.cache_dir / generation if generation else self.cache_dir
        cache = TensorCache(root, self.mesh_shape, rebuild=True, mesh_device=self.mesh_device,
                            max_pending_bytes=STREAM_PENDING_BYTES if stream else None, on_written=on_written)
        if generation is None:
            cache.write_errors.append(f"{self.cache_dir} is not writable")
        sink = WeightSink(cache, state, [k for k in state if self.is_host_weight(k)], keep=not stream,
                          after_put=(lambda _: state.release_read(keep=sink.host)) if stream else None)
        if sink.host and generation:
            cache.submit_file(write_host_sidecar, root, sink.host, self.build_variant)
        try:
            with conversion_threads():
                self.convert(sink, args)
        except BaseException:
            cache.abort()
            raise
        convert_seconds = time.perf_counter() - start
        digests = cache.finish()
        if cache.write_errors:
            logger.warning(f"{self.model_name}: built in memory; {self.cache_dir} stays cold (not writable)")
        else:
            files = [f"{generation}/{name}" for name in cache.files]
            self._mark_complete(args, state, sink.host, files, digests, generation)
        reader.close()
        seconds = time.perf_counter() - start
        logger.info(f"{self.model_name}: cold build in {seconds:.3f} s")
        timings = {"from_torch": cache.convert_seconds, "convert": convert_seconds, "finish": seconds - convert_seconds,
                   "writer_wait": cache.wait_seconds}
        return LoadedModel(args, sink.weights, sink.formats, sink.host, self.cache_dir, self.mesh_shape, False,
                           reason, seconds, timings, cached=not cache.write_errors)

    def _mark_complete(self, args: ModelArgs, state: LazyStateDict, host: Mapping[str, torch.Tensor],
                       files: list[str], digests: dict[str, str], generation: str) -> None:
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
            model_info=self.model_info(args, state),
            cache_files=files,
            digests={f"{generation}/{name}": digest for name, digest in digests.items()},
            model_id=self.model_id,
            content_id=self.content_id,
            generation=generation,
        )
        touch_last_used(self.cache_dir, self.build_variant)
