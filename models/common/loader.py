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
3. **Cold**, inside one :class:`~models.common.weight_cache.build.BuildTransaction`: under the
   build lock (a second builder waits, then usually finds the cache warm), convert every weight into
   a fresh generation, seal and publish the marker, retire what it replaced. A failed build leaves
   nothing behind; with ``$TT_CACHE_REMOTE_PUSH`` on, the committed variant is then pushed to the
   store (:mod:`models.common.weight_cache.remote.after_build`). Every checkpoint byte it converts
   is read through one :class:`~models.common.weight_cache.checkpoint_proof.ProvenCheckpoint`: the
   bytes the content id names, proved at open and again before the marker is published. :meth:`WeightLoader.seed`
   is the same build streaming: nothing kept, memory flat.
   Before any of it, the checkpoint is checked against its ``config.json`` (every tensor's shape,
   :meth:`WeightLoader.check_checkpoint`): a config that does not describe it builds nothing.
   Where the cache cannot be written (a full disk), the load builds in memory and writes nothing:
   a weight kept on the host is never a mapping of a cache file (see :meth:`WeightLoader._build`).

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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
import ttnn
from loguru import logger

from models.common import envs
from models.common.build_plan import PlannedWeight, plan_weights
from models.common.checkpoint import CheckpointError, KeyRule
from models.common.conversion import LazyStateDict, WeightSink
from models.common.convert_workers import convert_in_workers, convert_workers
from models.common.mesh import MeshShape, parse_mesh_shape
from models.common.model_args import ModelArgs
from models.common.prefetch import Prefetcher, prefetch_threads
from models.common.safetensors_file import CheckpointReader
from models.common.weight_cache.build import BuildTransaction
from models.common.weight_cache.checkpoint_proof import ProvenCheckpoint
from models.common.weight_cache.gate import DEFAULT_FORCE_ENV, CacheStatus, is_forced
from models.common.weight_cache.host_sidecar import write_host_sidecar
from models.common.weight_cache.layout import CacheRoot
from models.common.weight_cache.marker import WeightCacheError, WeightCacheMarker, draft_marker
from models.common.weight_cache.placeholders import manifest_of
from models.common.weight_cache.remote.after_build import push_after_build
from models.common.weight_cache.remote.cold_start import pull_cache_only, pull_on_cold_start
from models.common.weight_cache.request import CacheRequest
from models.common.weight_cache.tensor_cache import PRECISIONS, TensorCache, TensorFormat, conversion_threads
from models.common.weight_cache.usage import touch_last_used
from models.common.weight_cache.warm_read import WarmRead
from models.registry import family_facts

STREAM_PENDING_BYTES = 64 << 20  # a streaming seed's converted weights queued behind the newest, at most


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


@dataclass(frozen=True)
class SeedResult:
    """How a seed went. ``warm``: the cache was already complete and nothing was built;
    ``reason``: the gate's verdict before seeding; ``complete``: the cache is warm now."""

    cache_dir: Path
    warm: bool
    reason: str
    complete: bool
    files: int
    bytes_written: int
    seconds: float
    timings: dict[str, float] = field(default_factory=dict)  # phases, where a seeder reports them


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
        precision: str = "bfloat8_b",
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
        if precision not in PRECISIONS:
            raise ValueError(f"precision {precision!r}: expected one of {sorted(PRECISIONS)}")
        if num_layers is not None and (type(num_layers) is not int or num_layers < 1):
            raise ValueError(f"num_layers {num_layers!r}: expected a positive int")
        self.model = model
        self.mesh_shape = parse_mesh_shape(mesh_shape)
        self.precision = precision
        self.num_layers = num_layers
        self.all_components = family_facts(self.family).components
        self.components = tuple(sorted(set(components or self.all_components)))
        unknown = set(self.components) - set(self.all_components)
        if unknown:
            raise ValueError(f"{self.family} has no components {sorted(unknown)}; it has {self.all_components}")
        self.mesh_device = mesh_device
        self.force = force
        self.force_env = force_env
        self.cache_root = Path(cache_root or CacheRoot.default().path)
        self.request = CacheRequest(model, self.build_variant, precision, self.mesh_shape, num_layers, self.cache_root,
                                    Path(cache_dir) if cache_dir is not None else None)
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
        return family_facts(self.family).build_variant(self.precision)

    @property
    def forced(self) -> bool:
        return is_forced(self.force, self.force_env)

    def precision_dtype(self) -> Any:
        return PRECISIONS[self.precision]

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
        if not self.has_checkpoint_weights and not self.forced:
            self._pull_cache_only()
        args = self.make_args(self.model_config(), self.num_layers)
        if self.forced:
            why = "force=True" if self.force else f"{self.force_env}={envs.raw(self.force_env or '')}"
            return self._load_cold(args, f"cold build forced by {why}", start)
        loaded, reason = self._try_warm(args, start)
        if loaded is None and self._pulled_from_remote(args):
            loaded, reason = self._try_warm(args, start)
        if loaded is not None:
            return loaded
        return self._load_cold(args, reason, start)

    def _pulled_from_remote(self, args: ModelArgs) -> bool:
        """A cold cache of this checkpoint: the shared store (``$TT_CACHE_REMOTE``) may hold this
        exact variant; pull it (:mod:`models.common.weight_cache.remote.cold_start`)."""
        return pull_on_cold_start(
            self.cache_dir, model_name=self.model_name,
            content_id=self.content_id if self.has_checkpoint_weights else None, n_layers=args.n_layers,
            mesh_shape=self.mesh_shape, components=self.components, build_variant=self.build_variant)

    def _pull_cache_only(self) -> None:
        """A cache-only deploy with no warm cache of its model id here: the shared store
        (``$TT_CACHE_REMOTE``) may hold one (:func:`~models.common.weight_cache.remote.cold_start.pull_cache_only`);
        the request then finds it as it finds a local one, and the gate decides."""
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
        pull_cache_only(self.request.content_dir, model_id=self.model_id, n_layers=args.n_layers,
                        mesh_shape=self.mesh_shape, components=self.components, build_variant=self.build_variant)
        self.request.find_again()

    def seed(self, progress: Any = None) -> SeedResult:
        """Make the cache warm, keeping no weight: the explicit cache-only alternative to
        :meth:`load`. A cold cache is built streaming, each weight read, converted, written and
        released, so peak memory does not grow with the model. ``progress`` gets ``start(weights,
        bytes)``, ``weight_done(name, bytes)`` and ``finish()`` (see :mod:`models.seeding.progress`)."""
        return_freed_buffers()
        start = time.perf_counter()
        args = self.make_args(self.model_config(), self.num_layers)
        status = self.status(args)
        if not status.warm and not self.forced and self._pulled_from_remote(args):
            status = self.status(args)
        if status.warm and not self.forced:
            touch_last_used(self.paths)
            logger.info(f"{self.model_name}: cache {self.cache_dir} is warm; nothing to seed")
            return SeedResult(self.cache_dir, True, status.reason, True, 0, 0, time.perf_counter() - start)
        counter = _WriteCounter(progress)
        self._require_weights(status.reason)
        plan = self.check_checkpoint(args)
        if progress is not None:
            progress.start(len(plan), sum(w.estimated_bytes for w in plan))
        loaded = self._load_cold(args, status.reason, start, plan, stream=True, on_written=counter)
        if progress is not None:
            progress.finish()
        after = self.status(args)
        sidecar = after.marker.host_sidecar if after.warm and after.marker is not None else None
        seconds = time.perf_counter() - start
        logger.info(f"{self.model_name}: seeded {counter.files} files, {counter.bytes / 2**20:,.0f} MiB in {seconds:.2f} s "
                    f"({'warm' if after.warm else 'not complete: ' + after.reason})")
        return SeedResult(loaded.cache_dir, loaded.warm, status.reason, after.warm,
                          counter.files + (sidecar is not None), counter.bytes + (sidecar.bytes if sidecar else 0),
                          seconds)

    def _try_warm(self, args: ModelArgs, start: float, prefetch: bool = True) -> tuple[LoadedModel | None, str]:
        """A warm build if the gate passes and every file loads as expected, else (None, why).
        ``prefetch=False``: files just written (a cold load's read-back) are in the page cache."""
        with WarmRead(self.paths, lambda: self.status(args)) as read:
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
            prefetcher.add(read.files())
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

    def _load_cold(self, args: ModelArgs, reason: str, start: float, plan: list[PlannedWeight] | None = None,
                   **build: Any) -> LoadedModel:
        """``plan``: :meth:`check_checkpoint`'s, when the caller made it; ``build``: the streaming
        options of :meth:`_build` (a seed).

        A cold :meth:`load` costs what a seed costs: on the host (no ``mesh_device``) it builds
        streaming, keeping no converted weight, then reads the new generation back as a warm start
        does (bit-identical: the same files). Where the cache cannot be written it builds in
        memory, keeping every weight; with a ``mesh_device`` each weight is kept on the device."""
        self._require_weights(reason)
        plan = plan if plan is not None else self.check_checkpoint(args)
        read_back = not build and self.mesh_device is None
        with BuildTransaction(self.paths) as transaction:
            if transaction.locked and not self.forced:  # another builder may have finished while this one waited
                loaded, _ = self._try_warm(args, start)
                if loaded is not None:
                    return loaded
            logger.info(f"{self.model_name}: cold build into {self.cache_dir} ({reason})")
            built = self._build(args, reason, start, transaction, stream_if_cached=read_back, plan=plan, **build)
        if built.cached:  # committed: share it when $TT_CACHE_REMOTE_PUSH asks (a failed push only warns)
            push_after_build(self.paths, self.model_name)
        if not built.streamed:
            return built
        loaded, why = (self._try_warm(args, time.perf_counter(), prefetch=False) if built.cached
                       else (None, "it could not be written"))
        if loaded is None:  # a full disk; or a racing rebuild or eviction of what was published a moment ago
            logger.warning(f"{self.model_name}: the cache just built cannot be read back ({why}); building in memory")
            return self._build(args, reason, start, None)
        return dataclasses.replace(loaded, warm=False, reason=reason, seconds=time.perf_counter() - start,
                                   timings={**built.timings, "read_back": loaded.seconds})

    def _require_weights(self, reason: str) -> None:
        if not self.has_checkpoint_weights:
            raise CheckpointError(
                f"{self.model}: the cache {self.cache_dir} is cold ({reason}) and no checkpoint weights are on this machine"
            )

    def check_checkpoint(self, args: ModelArgs) -> list[PlannedWeight]:
        """Refuse a checkpoint whose tensors are not the shapes its ``config.json`` implies
        (:class:`~models.common.checkpoint.CheckpointShapeError`, one line naming the first): planned
        from the headers (read through a :class:`ProvenCheckpoint`), before any lock is taken or
        anything converted (:mod:`models.common.build_plan`). Returns the plan (the conversion
        workers share it out)."""
        with ProvenCheckpoint(self.identity) as proof:
            return plan_weights(self, args, proof)

    def _build(self, args: ModelArgs, reason: str, start: float, transaction: BuildTransaction | None, *,
               stream: bool = False, stream_if_cached: bool = False,
               on_written: Callable[[str, int], None] | None = None,
               plan: list[PlannedWeight] | None = None) -> LoadedModel:
        """Convert every weight into the transaction's generation and commit it. ``timings`` of the
        result: ``convert`` (wall time of the family's convert: checkpoint reads, transforms,
        ``from_torch``, waits for the writer), ``dump`` and ``fsync`` (the writer thread, overlapped),
        ``finish`` (after convert: the last writes, then ``seal``, ``publish`` and ``retire``).

        ``stream`` (a seed): keep no converted weight, at most :data:`STREAM_PENDING_BYTES` of
        writes queued, checkpoint pages released after each weight (host weights excepted: the
        sidecar writer still reads them); ``on_written(name, bytes)`` as each file is written.
        ``stream_if_cached`` (a cold load): stream too when the generation can be written; the
        result is then ``streamed`` (no weights: the caller reads the cache back).

        ``transaction=None``: in memory, nothing written (a cold load's fallback when the cache it
        built cannot be read back: a full disk). A weight kept on the host must never be a mapping of
        a cache file: a large weight is written block by block and handed back mapped, and a
        generation that is then removed (the disk filled up further on) would leave its deleted files
        taking the disk's space, seen by no ``ls``, ``gc`` or ``clean``, for as long as the model lives.

        Every reader of the build goes through one :class:`ProvenCheckpoint`, checked again once
        the last weight is converted, before anything is published: a checkpoint file changed since
        the content id was computed aborts the build (:class:`CheckpointChanged`, naming it)."""
        with ProvenCheckpoint(self.identity) as proof:
            return self._build_proven(proof, args, reason, start, transaction, stream=stream,
                                      stream_if_cached=stream_if_cached, on_written=on_written, plan=plan)

    def _build_proven(self, proof: ProvenCheckpoint, args: ModelArgs, reason: str, start: float,
                      transaction: BuildTransaction | None, *, stream: bool, stream_if_cached: bool,
                      on_written: Callable[[str, int], None] | None,
                      plan: list[PlannedWeight] | None) -> LoadedModel:
        proof.check_config(args.config)
        reader = CheckpointReader(self.checkpoint_dir, self.key_rules, proof)
        state = LazyStateDict(reader)
        root = None
        try:
            root = transaction.open_generation() if transaction is not None else None
        except OSError as error:
            logger.warning(f"{self.model_name}: building in memory only; nothing will be cached ({error})")
        stream = stream or (stream_if_cached and root is not None)
        parallel = stream and root is not None and self.workers > 1 and self.mesh_device is None
        with TensorCache(root, self.mesh_shape, rebuild=True, mesh_device=self.mesh_device,
                         max_pending_bytes=STREAM_PENDING_BYTES if stream else None, on_written=on_written) as cache:
            sink = WeightSink(cache, state, [k for k in state if self.is_host_weight(k)], keep=not stream)
            sidecar = self.paths.host_sidecar_name if sink.host and root is not None else None
            if sidecar:  # first on the writer thread; the sink keeps the host weights' pages until it is done
                sink.sidecar = cache.submit_file(_write_sidecar, root, sidecar, sink.host)
            with conversion_threads():
                if parallel:
                    workers = convert_in_workers(self, args, root, self.workers, proof=proof,
                                                 max_pending_bytes=STREAM_PENDING_BYTES, on_written=on_written,
                                                 plan=plan)
                else:
                    self.convert(sink, args)
            convert_seconds = time.perf_counter() - start
            cache.finish()
        proof.check()
        files, write_errors = (workers.files, cache.write_errors + workers.write_errors) if parallel else \
            (cache.files, cache.write_errors)
        cached = root is not None and not write_errors
        if cached and transaction is not None:
            cached = self._commit(transaction, args, state, sink.host, files, sidecar)
        elif root is not None:
            logger.warning(f"{self.model_name}: built in memory; {self.cache_dir} stays cold ({write_errors[0]})")
        reader.close()
        seconds = time.perf_counter() - start
        logger.info(f"{self.model_name}: cold build in {seconds:.3f} s")
        timings = {"convert": convert_seconds, "from_torch": cache.convert_seconds, "writer_wait": cache.wait_seconds,
                   "dump": cache.dump_seconds, "fsync": cache.fsync_seconds, "finish": seconds - convert_seconds,
                   **(workers.timings if parallel else {}), **(transaction.timings if transaction else {})}
        return LoadedModel(args, sink.weights, sink.formats, sink.host, self.cache_dir, self.mesh_shape, False,
                           reason, seconds, timings, cached=cached, streamed=stream_if_cached and stream)

    def draft_marker(self, args: ModelArgs, state: LazyStateDict, host: dict[str, torch.Tensor]) -> WeightCacheMarker:
        """The marker of a build of this loader, before its files are sealed (the transaction fills them in)."""
        manifest, host = manifest_of(state.manifest_view(host), self.is_host_weight)
        return draft_marker(
            model_name=self.model_name, model_id=self.model_id, content_id=self.content_id, n_layers=args.n_layers,
            mesh_shape=self.mesh_shape, components=self.components, build_variant=self.build_variant,
            is_moe=bool(args.is_mixture_of_experts), model_info=self.model_info(args, state),
            model_config=args.config, weights=manifest, host_weights=host)

    def _commit(self, transaction: BuildTransaction, args: ModelArgs, state: LazyStateDict,
                host: dict[str, torch.Tensor], files: list[str], sidecar: str | None) -> bool:
        """Seal and publish; a cache that cannot be written at the end (a full disk) only warns:
        the model is built, the cache stays cold and the transaction removes what it wrote."""
        try:
            transaction.commit(self.draft_marker(args, state, host), files, sidecar)
        except OSError as error:
            logger.warning(f"{self.model_name}: built, but could not complete the cache {self.cache_dir} ({error})")
            return False
        return True


def _write_sidecar(root: Path, name: str, host: dict[str, torch.Tensor]) -> list[str]:
    write_host_sidecar(root / name, host)
    return [name]
