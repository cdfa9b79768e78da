# SPDX-License-Identifier: Apache-2.0
"""The shared loader: warm-or-cold decided once, here; families only say how weights convert.

A load goes:

1. **Which cache** (:class:`~models.common.weight_cache.request.CacheRequest`, torch-free): found
   by what the weights are, not by a folder name, ``$TT_CACHE_PATH/<name>--<content id>/<precision>/
   mesh_<rows>x<cols>``; the same weights under any name share one cache, different weights never
   do; a cache-only deploy is served by the cache of its model id, if its config agrees.
2. **The gate** (:mod:`models.common.weight_cache.gate`). **Warm**, inside one
   :class:`~models.common.weight_cache.warm_read.WarmRead`: the state dict is the cache's
   placeholders plus the real host weights, every tensor is loaded from the build generation the
   marker names under a reader lease, each file opened once and proved to be the one the gate
   verified, checked against the shape, dtype and layout the loader expects, and no checkpoint
   weight is read (the checkpoint's files were verified once, on first
   sight, and are recognised by their stamps). A bad file means cold (or a clear error without a
   checkpoint).
   **Pulled**: with ``$TT_CACHE_REMOTE`` set, a cold cache of a checkpoint first asks that shared
   store for its exact variant and pulls it into a new generation
   (:mod:`models.common.weight_cache.remote.cold_start`; a seed too); the gate then decides again. A
   cache-only deploy with no warm cache of its model id asks the store by that model id first.
3. **Cold**, one :class:`~models.common.cold_build.ColdBuild` (a seed's and a Ray seed's too):
   the checkpoint proved and planned once (a config that does not describe it builds nothing),
   the build lock (a second builder waits, then usually finds the cache warm: the gate's second
   and last look), every weight converted into a fresh generation (inline, or on every core),
   the drafted marker sealed and published, what it replaced retired. A failed build leaves
   nothing behind; with ``$TT_CACHE_REMOTE_PUSH`` on, the committed variant is then pushed to the
   store. On the host a cold load streams, as a seed does, and reads back what it committed;
   where the cache cannot be written (a full disk) it builds in memory and writes nothing (see
   :meth:`WeightLoader._load_cold`). :meth:`WeightLoader.seed` is the same build keeping nothing.

A family subclasses :class:`WeightLoader` with its key renaming rules, its :class:`ModelArgs`
and its ``convert`` (see :mod:`models.common.decoder` for the layouts families share).
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
import ttnn
from loguru import logger

from models.common import envs
from models.common.build_plan import PlannedWeight
from models.common.checkpoint import CheckpointError, KeyRule
from models.common.cold_build import ColdBuild, ColdBuilt, SeedResult, plan_checkpoint
from models.common.conversion import WeightSink
from models.common.convert_workers import convert_workers
from models.common.mesh import MeshShape, parse_mesh_shape
from models.common.model_args import ModelArgs
from models.common.precision import PrecisionPolicy
from models.common.file_snapshot import has_kept_copy, keeping_snapshots
from models.common.prefetch import Prefetcher, prefetch_threads
from models.common.weight_cache.gate import DEFAULT_FORCE_ENV, CacheStatus, is_forced
from models.common.weight_cache.marker import WeightCacheError
from models.common.weight_cache.remote.cold_start import StoreCannotServe, pull_cache_only, pull_on_cold_start
from models.common.weight_cache.request import CacheRequest
from models.common.weight_cache.tensor_cache import PRECISIONS, TensorFormat
from models.common.weight_cache.warm_read import WarmRead
from models.registry import family_facts


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
    streamed: bool = False  # a cold build that kept no weight: its caller reads the cache back


MMAP_THRESHOLD_BYTES = 4 << 20
_M_MMAP_THRESHOLD = -3  # glibc mallopt parameter


def return_freed_buffers() -> None:
    """Make glibc give every freed buffer of 4 MiB or more back to the system at once.

    By default glibc raises its mmap threshold each time a large buffer is freed (up to 32 MiB),
    after which weight-sized buffers come from the heap, whose freed space is kept: a streaming
    seed's peak would then grow with the model. A fixed threshold stops that. Process-wide and
    harmless elsewhere; a no-op off glibc."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    except (OSError, AttributeError):
        pass


class _WriteCounter:
    """Sums what a streaming seed wrote and forwards each weight to the caller's progress object."""

    def __init__(self, progress: Any) -> None:
        self.progress = progress
        self.files = 0
        self.bytes = 0
        self._lock = threading.Lock()  # conversion workers report from their own threads

    def __call__(self, name: str, nbytes: int) -> None:
        with self._lock:
            self.files += 1
            self.bytes += nbytes
            if self.progress is not None:
                self.progress.weight_done(name, nbytes)


class WeightLoader(ABC):
    """One family's loader. Subclasses set ``family``, ``key_rules`` and implement
    :meth:`make_args` and :meth:`convert`; everything about the cache happens here."""

    family: ClassVar[str]  # its entry in models.registry: components, layout version
    key_rules: ClassVar[Sequence[KeyRule]]

    def __init__(
        self,
        model: str | os.PathLike,
        *,
        mesh_shape: str | Sequence[int] = (1, 1),
        precision: str | os.PathLike | PrecisionPolicy = "bfloat8_b",
        cache_root: str | os.PathLike | None = None,
        num_layers: int | None = None,
        components: Iterable[str] | None = None,
        mesh_device: Any = None,
        force: bool | None = None,
        force_env: str | None = DEFAULT_FORCE_ENV,
        cache_dir: str | os.PathLike | None = None,
        prefetch: int | None = None,
        workers: int | None = None,
    ) -> None:
        """``force``: build cold even when the cache is warm (default: ``$TT_TRANSFORMERS_FORCE_MODEL_LOAD``,
        read from ``force_env``). ``cache_dir``: this exact directory instead of one under
        ``cache_root`` (still checked to be this checkpoint's). ``prefetch``: threads reading a warm
        cache's files ahead of use (default ``$TT_PREFETCH_THREADS``, else 4; 0: off; 0 to 64). ``workers``:
        threads converting a cold build that streams (a seed, a cold load on the host; default
        ``$TT_CONVERT_WORKERS``, else one per CPU this process may use; 0 to 256; never more than the
        plan's units of work; see :mod:`models.common.convert_workers`). A bad count, or a bad value of
        any variable of :mod:`models.common.envs`, is a ``ValueError`` naming it."""
        envs.check()
        self.policy = family_facts(self.family).policy(precision, model)  # PolicyError: a ValueError
        if num_layers is not None and (type(num_layers) is not int or num_layers < 1):
            raise ValueError(f"num_layers {num_layers!r}: expected a positive int")
        self.model = model
        self.mesh_shape = parse_mesh_shape(mesh_shape)
        self.precision = self.policy.label
        self.num_layers = num_layers
        self.all_components = family_facts(self.family).components
        self.components = tuple(sorted(set(components or self.all_components)))
        unknown = set(self.components) - set(self.all_components)
        if unknown:
            raise ValueError(f"{self.family} has no components {sorted(unknown)}; it has {self.all_components}")
        self.mesh_device = mesh_device
        self.force = force
        self.force_env = force_env
        self.request = CacheRequest(model, self.build_variant, self.precision, self.mesh_shape, num_layers,
                                    Path(cache_root) if cache_root else None,
                                    Path(cache_dir) if cache_dir is not None else None)
        self.cache_root = self.request.cache_root
        self.checkpoint_dir = self.request.checkpoint_dir
        self.prefetch = prefetch_threads(prefetch)
        self.workers = convert_workers(workers)

    # -- what a family provides -------------------------------------------------------------

    @abstractmethod
    def make_args(self, config: dict[str, Any], num_layers: int | None) -> ModelArgs:
        """The family's architecture facts from ``config.json``."""

    @abstractmethod
    def convert(self, sink: WeightSink, args: ModelArgs) -> None:
        """Convert every weight of this build (``sink.state``) and ``sink.put`` it."""

    @abstractmethod
    def tensor_shape_problem(self, key: str, shape: Sequence[int], args: ModelArgs) -> str | None:
        """How checkpoint tensor ``key``'s shape differs from the one ``config.json`` implies, or
        None (every family's: :data:`models.common.decoder.CHECKPOINT_SHAPES`)."""

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
        return family_facts(self.family).build_variant(self.policy)

    @property
    def forced(self) -> bool:
        return is_forced(self.force, self.force_env)

    def precision_dtype(self, weight: str | None = None) -> Any:
        """The ttnn dtype of a weight (its loader name) under this build's precision policy; without
        a name, the one dtype of a single-dtype policy."""
        if weight is None:
            if self.policy.uniform is None:
                raise ValueError(f"precision {self.precision} has no single dtype: name the weight")
            return PRECISIONS[self.policy.uniform]
        return PRECISIONS[self.policy.dtype_of(weight)]

    # which cache, and whether it is warm: the torch-free CacheRequest decides
    model_name = property(lambda self: self.request.model_name)
    model_id = property(lambda self: self.request.model_id)
    has_checkpoint_weights = property(lambda self: self.request.has_checkpoint_weights)
    content_id = property(lambda self: self.request.content_id)
    identity = property(lambda self: self.request.identity)
    cache_dir = property(lambda self: self.request.cache_dir)
    paths = property(lambda self: self.request.paths)

    def model_config(self) -> dict[str, Any]:
        """``config.json`` of this model (see :meth:`CacheRequest.model_config`)."""
        return self.request.model_config()

    def status(self, args: ModelArgs | None = None) -> CacheStatus:
        """The gate's verdict on this build's cache (``force`` does not change it: it is about the cache)."""
        args = args or self.make_args(self.model_config(), self.num_layers)
        return self.request.status(args.n_layers, self.components)

    # -- the load ---------------------------------------------------------------------------

    def load(self) -> LoadedModel:
        """Build the model: warm from the cache when the gate says so, else cold (and cache it)."""
        start = time.perf_counter()
        with keeping_snapshots():  # a pull here hands the warm read after it its copies (no second fill)
            if not self.has_checkpoint_weights and not self.forced:
                self._pull_cache_only()
            args = self.make_args(self.model_config(), self.num_layers)
            self.policy.check_decoders(args.full_n_layers)
            if self.forced:
                why = "force=True" if self.force else f"{self.force_env}={envs.raw(self.force_env or '')}"
                return self._load_cold(args, f"cold build forced by {why}", start)
            loaded, reason = self._try_warm(args, start)
            if loaded is None and self.pull_from_remote(args):
                loaded, reason = self._try_warm(args, start)
        if loaded is not None:
            return loaded
        return self._load_cold(args, reason, start)

    def pull_from_remote(self, args: ModelArgs) -> bool:
        """A cold cache of this checkpoint: the shared store (``$TT_CACHE_REMOTE``) may hold this
        exact variant; pull it (:mod:`models.common.weight_cache.remote.cold_start`)."""
        return pull_on_cold_start(
            self.paths, model_name=self.model_name,
            content_id=self.content_id if self.has_checkpoint_weights else None, n_layers=args.n_layers,
            mesh_shape=self.mesh_shape, components=self.components)

    def _pull_cache_only(self) -> None:
        """A cache-only deploy with no warm cache of its model id here: the shared store
        (``$TT_CACHE_REMOTE``) may hold one (:func:`~models.common.weight_cache.remote.cold_start.pull_cache_only`);
        the request then finds it as it finds a local one, and the gate decides. With no cache of
        it here either, what the store answered is the error."""
        if not envs.TT_CACHE_REMOTE or self.request.named_cache_dir is not None:
            return
        found = self.request.cache_only_dirs()
        if len(found) > 1:
            return  # the request's error lists them
        if found:
            args = self.make_args(self.model_config(), self.num_layers)
            if self.status(args).warm:
                return
        else:
            config = self.request.deployed_config()
            if config is None:
                return
            args = self.make_args(config, self.num_layers)
        why_not = pull_cache_only(self.request.content_dir, model_id=self.model_id, n_layers=args.n_layers,
                                  mesh_shape=self.mesh_shape, components=self.components,
                                  build_variant=self.build_variant)
        if why_not is not None and not found:
            raise StoreCannotServe(f"{self.request.model}: no checkpoint weights on this machine, no "
                                   f"{self.request.variant_subdir} cache of it under {self.cache_root}, and {why_not}")
        self.request.find_again()

    def seed(self, progress: Any = None) -> SeedResult:
        """Make the cache warm, keeping no weight: the explicit cache-only alternative to
        :meth:`load`. A cold cache is built streaming, each weight read, converted, written and
        released, so peak memory does not grow with the model. ``progress`` gets ``start(weights,
        bytes)``, ``weight_done(name, bytes)`` and ``finish()`` (see :mod:`models.seeding.progress`)."""
        return_freed_buffers()
        args = self.make_args(self.model_config(), self.num_layers)
        self.policy.check_decoders(args.full_n_layers)
        counter = _WriteCounter(progress)
        with ColdBuild(self, args, stream=True, on_written=counter) as build:
            if progress is not None and build.plan:
                progress.start(len(build.plan), sum(w.estimated_bytes for w in build.plan))
            if not build.warm:
                build.run()
            if progress is not None and build.plan:
                progress.finish()
        return build.seed_result(counter.files, counter.bytes)

    def _try_warm(self, args: ModelArgs, start: float, prefetch: bool = True,
                  status: CacheStatus | None = None) -> tuple[LoadedModel | None, str]:
        """A warm build if the gate passes and every file loads as expected, else (None, why).
        ``prefetch=False``: files just written (a cold load's read-back) are in the page cache.
        ``status``: the gate's verdict, when it was just asked (under the build lock) or the build
        just committed it (the read-back): not asked again."""
        gate = (lambda: status) if status is not None else (lambda: self.status(args))
        with WarmRead(self.paths, gate) as read:
            if not read.warm:
                return None, read.reason
            try:
                return self._load_warm(args, read, start, prefetch), "complete"
            except WeightCacheError as error:
                if not self.has_checkpoint_weights:
                    raise
                logger.warning(f"Warm build of {self.model_name} failed ({error}); building cold")
                return None, str(error)

    def _load_warm(self, args: ModelArgs, read: WarmRead, start: float, prefetch: bool = True) -> LoadedModel:
        prefetcher = None
        if self.prefetch and prefetch:  # the files the gate verified, in the order the build wrote them (the loader's)
            prefetcher = Prefetcher(self.prefetch)
            prefetcher.add([path for path in read.files() if not has_kept_copy(path)])  # a pull's copies need no disk
        try:
            state = read.state_dict(args)
            sink = WeightSink(read.tensor_cache(self.mesh_shape, self.mesh_device), state, state.host_keys())
            self.convert(sink, args)
        except BaseException:
            if prefetcher is not None:
                prefetcher.cancel()
            raise
        read.used(self.model_id if self.content_id is not None else None)
        seconds = time.perf_counter() - start
        logger.info(f"{self.model_name}: warm build from {read.root} in {seconds:.3f} s")
        return LoadedModel(args, sink.weights, sink.formats, sink.host, self.cache_dir, self.mesh_shape, True,
                           "complete", seconds, prefetch=prefetcher)

    def _load_cold(self, args: ModelArgs, reason: str, start: float) -> LoadedModel:
        """One :class:`~models.common.cold_build.ColdBuild`.

        A cold :meth:`load` costs what a seed costs: on the host (no ``mesh_device``) it builds
        streaming, keeping no converted weight, then reads the new generation back as a warm start
        does (bit-identical: the same files; what it committed, not a third gate). Where the cache
        cannot be written it builds in memory, keeping every weight; with a ``mesh_device`` each
        weight is kept on the device.

        A weight kept on the host must never be a mapping of a cache file: a large weight is
        written block by block and handed back mapped, and a generation that is then removed (the
        disk filled up further on) would leave its deleted files taking the disk's space, seen by
        no ``ls``, ``gc`` or ``clean``, for as long as the model lives. So a read-back that fails
        builds again in memory, writing nothing."""
        with ColdBuild(self, args, cold=reason, stream=None, start=start) as build:
            if build.warm:  # another builder finished while this one waited
                loaded, _ = self._try_warm(args, start, status=build.status)
                if loaded is not None:
                    return loaded
            built = build.run()
        if not built.streamed:
            return self._cold_loaded(args, built, reason)
        committed = CacheStatus(True, "complete", build.committed) if built.cached else None
        loaded, why = (self._try_warm(args, time.perf_counter(), prefetch=False, status=committed) if committed
                       else (None, "it could not be written"))
        if loaded is None:  # a full disk; or a racing rebuild or eviction of what was published a moment ago
            logger.warning(f"{self.model_name}: the cache just built cannot be read back ({why}); building in memory")
            with ColdBuild(self, args, cold=reason, write=False, start=start) as memory:
                return self._cold_loaded(args, memory.run(), reason)
        return dataclasses.replace(loaded, warm=False, reason=reason, seconds=time.perf_counter() - start,
                                   timings={**built.timings, "read_back": loaded.seconds})

    def _cold_loaded(self, args: ModelArgs, built: ColdBuilt, reason: str) -> LoadedModel:
        return LoadedModel(args, built.weights, built.formats, built.host, self.cache_dir, self.mesh_shape, False,
                           reason, built.seconds, built.timings, cached=built.cached, streamed=built.streamed)

    def require_weights(self, reason: str) -> None:
        if not self.has_checkpoint_weights:
            raise CheckpointError(
                f"{self.model}: the cache {self.cache_dir} is cold ({reason}) and no checkpoint weights are on this machine"
            )

    def check_checkpoint(self, args: ModelArgs) -> list[PlannedWeight]:
        """Refuse a checkpoint whose tensors are not the shapes its ``config.json`` implies
        (:class:`~models.common.checkpoint.CheckpointShapeError`, one line naming the first): planned
        from the headers, nothing converted (:func:`~models.common.cold_build.plan_checkpoint`; a
        cold build plans so, once, before its lock). Returns the plan."""
        return plan_checkpoint(self, args)
