# SPDX-License-Identifier: Apache-2.0
"""The cold build: the one way a cold load, a seed and a Ray seed build a cache (the twin of
:class:`~models.common.weight_cache.warm_read.WarmRead`).

::

    with ColdBuild(loader, args) as build:      # the gate (unless the caller ran it: ``cold=``);
        if build.warm:                          # cold: the checkpoint proved and planned (once), the
            return <warm: build.status>          # build lock, the gate again under it
        built = build.run()                      # open a generation, start the host sidecar, convert
                                                 # every planned weight through one Converter (inline,
                                                 # threads, Ray), check every planned file was written,
                                                 # commit the drafted marker, push it ($TT_CACHE_REMOTE_PUSH)
    report = build.seed_result()                 # how it went (the committed marker: no gate after)

The rules, each kept here once:

* **The gate runs once before the lock and once under it** (another builder may have finished
  while this one waited); the build's own commit is what says it is complete, never a third gate.
  A cold cache of a checkpoint asks the shared store first (``$TT_CACHE_REMOTE``).
* **The plan is made once**, through the build's one
  :class:`~models.common.weight_cache.checkpoint_proof.ProvenCheckpoint`, before the lock: a
  checkpoint its ``config.json`` does not describe builds nothing. Every reader of the build (the
  host sidecar's, each converter's) reads through that proof, checked again before the commit.
* **The strategy is chosen in one place** (:func:`choose_converter`; the Ray seed brings its own).
* **Nothing is published unless every planned file was written**; anything raised before the
  commit removes the generation (the :class:`~models.common.weight_cache.build.BuildTransaction`).
  A cache that cannot be written (a full disk, a read-only directory) only warns: the build goes
  on in memory and the cache stays cold.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
import ttnn
from loguru import logger

from models.common.build_plan import PlannedWeight, plan_weights
from models.common.conversion import LazyStateDict
from models.common.convert_inline import InlineConverter
from models.common.convert_workers import ThreadsConverter
from models.common.converter import Converted, Converter, host_weights
from models.common.safetensors_file import CheckpointReader
from models.common.weight_cache.build import BuildTransaction
from models.common.weight_cache.checkpoint_proof import ProvenCheckpoint
from models.common.weight_cache.gate import CacheStatus
from models.common.weight_cache.host_sidecar import write_host_sidecar
from models.common.weight_cache.marker import WeightCacheMarker, draft_marker
from models.common.weight_cache.placeholders import manifest_of
from models.common.weight_cache.remote.after_build import push_after_build
from models.common.weight_cache.tensor_cache import TensorFormat, tensorbin_name
from models.common.weight_cache.usage import touch_last_used


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


@dataclass
class ColdBuilt:
    """What :meth:`ColdBuild.run` did: ``cached`` (committed), ``streamed`` (nothing kept: read
    the cache back), what it kept otherwise, and its ``timings``: ``convert`` (from the build's
    start to the last weight converted), ``from_torch``, ``writer_wait``, ``dump``, ``fsync``, the
    workers' (``workers``, ``workers_wall``), ``finish`` (the last writes, then ``seal``,
    ``publish``, ``retire``)."""

    cached: bool
    streamed: bool
    seconds: float
    timings: dict[str, float]
    weights: dict[str, ttnn.Tensor] = field(default_factory=dict)
    formats: dict[str, TensorFormat] = field(default_factory=dict)
    host: dict[str, torch.Tensor] = field(default_factory=dict)
    failed: str | None = None  # why the cache could not be written or completed


def plan_checkpoint(loader: Any, args: Any, proof: ProvenCheckpoint | None = None) -> list[PlannedWeight]:
    """The build's plan, from the checkpoint's headers read through ``proof`` (else a proof of its
    own): a checkpoint whose tensors are not the shapes its ``config.json`` implies is refused
    (:class:`~models.common.checkpoint.CheckpointShapeError`), nothing converted."""
    if proof is None:
        with ProvenCheckpoint(loader.identity) as proof:
            return plan_weights(loader, args, proof)
    return plan_weights(loader, args, proof)


def draft_build_marker(loader: Any, args: Any, state: LazyStateDict, host: dict[str, torch.Tensor]) -> WeightCacheMarker:
    """The marker of a build of ``loader`` before its files are sealed (its transaction fills them in):
    the manifest from ``state``'s headers, the host weights already read (``host``) real."""
    manifest, host = manifest_of(state.manifest_view(host), loader.is_host_weight)
    return draft_marker(
        model_name=loader.model_name, model_id=loader.model_id, content_id=loader.content_id, n_layers=args.n_layers,
        mesh_shape=loader.mesh_shape, components=loader.components, build_variant=loader.build_variant,
        is_moe=bool(args.is_mixture_of_experts), model_info=loader.model_info(args, state), model_config=args.config,
        weights=manifest, host_weights=host)


def choose_converter(loader: Any, root: Path | None, streaming: bool) -> Converter:
    """The strategy: threads when the build streams into a generation on the host with more than
    one worker (:mod:`models.common.convert_workers`), else inline."""
    if streaming and root is not None and loader.workers > 1 and loader.mesh_device is None:
        return ThreadsConverter(loader.workers)
    return InlineConverter()


class ColdBuild:
    """One cold build of one variant, from the gate to the commit (see the module doc).

    ``cold``: the caller's gate already said cold, and why (a load's warm read); None: the build
    asks the gate. ``stream``: keep no weight (a seed); None: stream when the cache can be written
    and no ``mesh_device`` holds the weights (a cold load on the host, which then reads the cache
    back). ``write=False``: build in memory, no lock, nothing written (a load's last resort).
    ``converter``: the strategy (default: :func:`choose_converter`). ``on_written(name, bytes)``:
    as each file is written."""

    def __init__(self, loader: Any, args: Any, *, cold: str | None = None, stream: bool | None = False,
                 write: bool = True, converter: Converter | None = None,
                 on_written: Callable[[str, int], None] | None = None, start: float | None = None) -> None:
        self.loader = loader
        self.args = args
        self.verdict = CacheStatus(False, cold) if cold is not None else None  # the gate before the lock
        self.status = self.verdict  # the gate's latest
        self.stream = stream if stream is not None or loader.mesh_device is None else False
        self.write = write
        self.converter = converter
        self.on_written = on_written
        self.start = start if start is not None else time.perf_counter()
        self.plan: list[PlannedWeight] = []
        self.proof: ProvenCheckpoint | None = None
        self.reader: CheckpointReader | None = None
        self.transaction: BuildTransaction | None = None
        self.root: Path | None = None
        self.host: dict[str, torch.Tensor] = {}
        self.sidecar: Future | None = None  # the host sidecar's write
        self.sidecar_name: str | None = None
        self.built: ColdBuilt | None = None
        self._opened = False
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> ColdBuild:
        loader = self.loader
        if self.verdict is None:  # the gate before the lock; a cold cache first asks the shared store
            self.verdict = self.status = loader.status(self.args)
            if not self.verdict.warm and not loader.forced and loader.pull_from_remote(self.args):
                self.verdict = self.status = loader.status(self.args)
            if self.warm:
                touch_last_used(loader.paths)
                return self
        with contextlib.ExitStack() as entered:  # a failure here leaves nothing held
            loader.require_weights(self.reason)
            logger.info(f"{loader.model_name}: cold build into {loader.cache_dir} ({self.reason})")
            self.proof = entered.enter_context(ProvenCheckpoint(loader.identity))
            self.proof.check_config(self.args.config)
            self.plan = plan_checkpoint(loader, self.args, self.proof)
            self.reader = CheckpointReader(loader.checkpoint_dir, loader.key_rules, self.proof)
            entered.callback(self.reader.close)
            if self.write:
                self.transaction = entered.enter_context(BuildTransaction(loader.paths))
                if self.transaction.locked and not loader.forced:  # another builder may have finished meanwhile
                    self.status = loader.status(self.args)
                    if self.status.warm:
                        logger.info(f"{loader.model_name}: {loader.cache_dir} was built while this build waited")
            self._stack = entered.pop_all()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        try:
            if self.sidecar is not None:
                self.sidecar.exception()  # the generation goes only once its writer is done with it
            if kind is not None:  # the checkpoint's descriptors go before a failed generation is deleted:
                for opened in (self.reader, self.proof):  # a build that ran out of them can still clean up
                    if opened is not None:
                        opened.close()
        finally:
            self._stack.close()

    # -- what the gate said -----------------------------------------------------------------

    @property
    def warm(self) -> bool:
        """The gate's latest verdict (before the lock, or under it): this exact build is warm, and
        not forced. A caller may still :meth:`run` (its warm read failed)."""
        return self.status is not None and self.status.warm and not self.loader.forced

    @property
    def reason(self) -> str:
        """Why the build is cold: the gate's verdict before the lock (or the caller's)."""
        return self.verdict.reason if self.verdict is not None else "not entered"

    @property
    def streaming(self) -> bool:
        """Nothing kept: a seed, or a cold load on the host whose generation can be written."""
        return self.stream if self.stream is not None else self.root is not None

    # -- the build --------------------------------------------------------------------------

    def open(self) -> Path | None:
        """The generation the converters write into; None: the cache cannot be written (in memory)."""
        if not self._opened:
            self._opened = True
            try:
                self.root = self.transaction.open_generation() if self.transaction is not None else None
            except OSError as error:
                logger.warning(f"{self.loader.model_name}: building in memory only; nothing will be cached ({error})")
        return self.root

    def run(self) -> ColdBuilt:
        """Convert every planned weight and commit (see the module doc)."""
        loader = self.loader
        self.status = self.verdict  # building: whatever the gate said under the lock, this build is cold
        root = self.open()
        self._start_host_sidecar(root)
        converter = self.converter or choose_converter(loader, root, self.streaming)
        converted = converter.convert(self)
        write_errors = converted.write_errors + self._sidecar_errors()
        self.proof.check()  # the bytes converted are still the ones the content id names
        failed = write_errors[0] if write_errors else None
        if root is not None and failed is None:
            failed = self._commit(converted)
        elif root is not None:
            logger.warning(f"{loader.model_name}: built in memory; {loader.cache_dir} stays cold ({failed})")
        cached = root is not None and failed is None
        if cached:  # committed: share it when $TT_CACHE_REMOTE_PUSH asks (a failed push only warns)
            push_after_build(loader.paths, loader.model_name)
        seconds = time.perf_counter() - self.start
        logger.info(f"{loader.model_name}: cold build in {seconds:.3f} s")
        timings = {**converted.timings, "finish": seconds - converted.timings.get("convert", seconds),
                   **(self.transaction.timings if self.transaction is not None else {})}
        self.built = ColdBuilt(cached, self.streaming and root is not None, seconds, timings, converted.weights,
                               converted.formats, self.host, failed)
        return self.built

    def _start_host_sidecar(self, root: Path | None) -> None:
        """The host weights, read once; written to the sidecar on a thread of its own, beside the
        conversion (whose sink keeps their pages until it is done)."""
        self.host = host_weights(self.loader, self.reader)
        if not self.host or root is None:
            return
        self.sidecar_name = self.loader.paths.host_sidecar_name
        writer = ThreadPoolExecutor(1, thread_name_prefix="host-sidecar")
        self.sidecar = writer.submit(write_host_sidecar, root / self.sidecar_name, self.host)
        writer.shutdown(wait=False)

    def _sidecar_errors(self) -> list[str]:
        error = self.sidecar.exception() if self.sidecar is not None else None
        if error is None:
            return []
        if not isinstance(error, (OSError, RuntimeError)):
            raise error
        logger.warning(f"Cannot write the weight cache {self.loader.cache_dir} ({error}); building in memory only")
        return [str(error)]

    def planned_files(self) -> list[str]:
        """Every file the plan names, in build order (relative to the generation)."""
        return [tensorbin_name(w.name, w.fmt) for w in self.plan]

    def _commit(self, converted: Converted) -> str | None:
        """Every planned file written, then seal and publish the drafted marker; None, or why the
        cache could not be completed (a full disk: only a warning, the build stands, the cache stays
        cold and the transaction removes what it wrote)."""
        files = self.planned_files()
        written = set(converted.written)
        missing = [name for name in files if name not in written]
        if missing:
            raise RuntimeError(f"{len(missing)} planned files were not written (first: {missing[0]})")
        try:
            marker = self.draft_marker()
            self.transaction.commit(marker, files, self.sidecar_name)
        except OSError as error:
            logger.warning(f"{self.loader.model_name}: built, but could not complete the cache "
                           f"{self.loader.cache_dir} ({error})")
            return str(error)
        return None

    def draft_marker(self) -> WeightCacheMarker:
        """The build's marker before its files are sealed (the transaction fills them in)."""
        return draft_build_marker(self.loader, self.args, LazyStateDict(self.reader), self.host)

    # -- how it went ------------------------------------------------------------------------

    @property
    def committed(self) -> WeightCacheMarker | None:
        """The marker this build published (None: nothing was)."""
        return self.transaction.committed if self.transaction is not None else None

    def seed_result(self, files: int = 0, written_bytes: int = 0, timings: dict[str, float] | None = None) -> SeedResult:
        """The seed's report: ``files`` and ``written_bytes`` the converters wrote (the sidecar
        is added here); complete is what this build committed, or what the gate found warm."""
        loader, seconds = self.loader, time.perf_counter() - self.start
        if self.warm:
            logger.info(f"{loader.model_name}: cache {loader.cache_dir} is warm; nothing to seed")
            return SeedResult(loader.cache_dir, True, self.reason, True, 0, 0, seconds)
        committed = self.committed
        sidecar = committed.host_sidecar if committed is not None else None
        logger.info(f"{loader.model_name}: seeded {files} files, {written_bytes / 2**20:,.0f} MiB in {seconds:.2f} s "
                    f"({'warm' if committed is not None else 'not complete'})")
        return SeedResult(loader.cache_dir, False, self.reason, committed is not None, files + (sidecar is not None),
                          written_bytes + (sidecar.bytes if sidecar else 0), seconds, timings or {})
