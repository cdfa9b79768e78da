# SPDX-License-Identifier: Apache-2.0
"""Distributed seeding on Ray: one model's weights (and several variants) converted as Ray tasks.

The driver plans each cold variant (:func:`~models.seeding.weights.plan_weights`, headers only),
splits the plan into tasks of about equal checkpoint bytes and submits them all; each task
rebuilds the loader in its worker, runs the family's ``convert`` converting only its own weights
(:class:`~models.seeding.weights.PartSink`) and writes them into the shared cache directory with
the same atomic publish as any cold build, returning ``{file: digest}``. As in any cold build,
the driver holds each variant's build lock from its check to its marker and the tasks write into
a fresh build generation (readers keep the previous one meanwhile). The driver writes the host
sidecar, then, per variant, checks that every planned file is there with the reported size and
content digest, writes the marker once and retires old generations. Nothing is marked unless
every task of the variant succeeded.

Ray is the scheduler (no home-made one): a worker killed mid-task is retried by Ray
(``max_retries``); the files a killed attempt already published are rewritten with identical
bytes, and its temp files are debris no reader opens (``tt-cache clean`` removes them).

* ``workers=N``: a local Ray instance with N CPUs (this host).
* ``address="ray://host:10001"`` or ``"auto"``: join an existing cluster. Every node then needs
  the project installed (same versions) and the cache directory and checkpoint on a shared
  file system at the same paths.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loguru import logger

from models.common.checkpoint import CheckpointError, CheckpointReader
from models.common.fileio import content_digest_file
from models.common.generations import build_lock, new_generation, retire_generations
from models.common.loader import STREAM_PENDING_BYTES, LazyStateDict, WeightLoader
from models.common.tensor_cache import tensorbin_name
from models.common.weight_cache import WeightCacheError, write_host_sidecar
from models.seeding.stream import SeedResult, return_freed_buffers
from models.seeding.weights import PlannedWeight, partition, plan_weights

TASKS_PER_WORKER = 3  # a few tasks per worker: balance, and a retry redoes only a small part
TASK_RETRIES = 3
OBJECT_STORE_BYTES = 128 << 20  # tasks return only digests


class SeedError(RuntimeError):
    """A distributed seed could not finish every variant (the failed ones stay cold)."""


@dataclass(frozen=True)
class LoaderSpec:
    """What a worker needs to rebuild a driver's loader: its class and its options."""

    loader_class: str  # "module:QualName"
    model: str
    options: dict[str, Any]

    @classmethod
    def of(cls, loader: WeightLoader) -> LoaderSpec:
        kind = type(loader)
        return cls(f"{kind.__module__}:{kind.__qualname__}", os.fspath(loader.model), {
            "mesh_shape": tuple(loader.mesh_shape), "precision": loader.precision, "num_layers": loader.num_layers,
            "components": loader.components,
        })

    def make(self) -> WeightLoader:
        import importlib

        module, name = self.loader_class.split(":")
        return getattr(importlib.import_module(module), name)(self.model, **self.options)


def convert_part(spec: LoaderSpec, names: list[str], target_dir: str) -> dict[str, Any]:
    """One task: convert the weights ``names`` of ``spec``'s build into ``target_dir``.

    Runs in a Ray worker (or anywhere): returns ``{"digests": {file: digest}, "sizes": {file:
    bytes}, "from_torch": s, "pid": pid}``. Memory stays bounded as in the streaming seed."""
    from models.common.device_env import ensure_host_cluster

    ensure_host_cluster()
    return_freed_buffers()
    from models.common.tensor_cache import TensorCache, conversion_threads
    from models.seeding.weights import PartSink, PartState

    loader = spec.make()
    args = loader.make_args(loader.model_config(), loader.num_layers)
    plan = plan_weights(loader, args)
    reader = CheckpointReader(loader.checkpoint_dir, loader.key_rules)
    lazy = LazyStateDict(reader)
    state = PartState(lazy, {key: reader.spec(key) for key in reader.keys()})
    cache = TensorCache(Path(target_dir), loader.mesh_shape, rebuild=True, max_pending_bytes=STREAM_PENDING_BYTES)
    sink = PartSink(cache, state, plan, set(names), after_put=lambda _: lazy.release_read())
    try:
        with conversion_threads():
            loader.convert(sink, args)
    except BaseException:
        cache.abort()
        raise
    digests = cache.finish()
    reader.close()
    if cache.write_errors:
        raise OSError(f"cannot write {target_dir}: {cache.write_errors[0]}")
    if sorted(sink.done) != sorted(names):
        raise RuntimeError(f"task converted {len(sink.done)} of its {len(names)} weights")
    sizes = {rel: os.stat(os.path.join(target_dir, rel)).st_size for rel in digests}
    return {"digests": digests, "sizes": sizes, "from_torch": cache.convert_seconds, "pid": os.getpid()}


def _warm_worker(seconds: float) -> int:
    """Start a worker and pay its imports (torch, ttnn) before any timing starts."""
    from models.common.device_env import ensure_host_cluster

    ensure_host_cluster()
    import torch  # noqa: F401
    import ttnn  # noqa: F401

    time.sleep(seconds)  # held briefly, so each of these lands on its own worker
    return os.getpid()


def start_ray(workers: int, address: str | None) -> float:
    """``ray.init`` a local instance of ``workers`` CPUs, or join ``address``; returns seconds."""
    import ray

    start = time.perf_counter()
    if ray.is_initialized():
        return 0.0
    repo = os.fspath(Path(__file__).resolve().parents[2])
    env = {"PYTHONPATH": os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p)}
    if os.environ.get("TT_METAL_MOCK_CLUSTER_DESC_PATH"):
        env["TT_METAL_MOCK_CLUSTER_DESC_PATH"] = os.environ["TT_METAL_MOCK_CLUSTER_DESC_PATH"]
    kwargs: dict[str, Any] = {"runtime_env": {"env_vars": env}, "log_to_driver": False}
    if address is None:
        kwargs |= {"num_cpus": workers, "include_dashboard": False, "object_store_memory": OBJECT_STORE_BYTES}
    ray.init(address=address, **kwargs)
    return time.perf_counter() - start


@dataclass
class _Variant:
    loader: WeightLoader
    args: Any
    reason: str
    plan: list[PlannedWeight]
    generation: str
    start: float
    failed: str | None = None
    result: SeedResult | None = None

    @property
    def root(self) -> Path:
        return self.loader.cache_dir / self.generation


def _prepare(loader: WeightLoader, start: float, locks: contextlib.ExitStack) -> _Variant | SeedResult:
    """The gate's verdict; for a cold variant, take its build lock (held in ``locks`` until it is
    marked), check again, plan the build and open a fresh generation for it."""
    args = loader.make_args(loader.model_config(), loader.num_layers)
    status = loader.status(args)
    if status.warm:
        return SeedResult(loader.cache_dir, True, status.reason, True, 0, 0, time.perf_counter() - start)
    if not loader.has_checkpoint_weights:
        raise CheckpointError(f"{loader.model}: the cache is cold ({status.reason}) and no checkpoint weights are here")
    if not locks.enter_context(build_lock(loader.cache_dir)):
        raise OSError(f"cannot take the build lock of {loader.cache_dir} (not writable)")
    forced = bool(loader.force_env) and os.environ.get(loader.force_env) == "1"
    again = loader.status(args)
    if again.warm and not forced:  # another builder finished while this one waited
        return SeedResult(loader.cache_dir, True, again.reason, True, 0, 0, time.perf_counter() - start)
    plan = plan_weights(loader, args)
    return _Variant(loader, args, status.reason, plan, new_generation(loader.cache_dir), start)


def seed_on_ray(loaders: Sequence[WeightLoader], *, workers: int = 2, address: str | None = None,
                progress: Any = None, tasks_per_worker: int = TASKS_PER_WORKER) -> list[SeedResult]:
    """Seed every loader's cache with Ray tasks; one :class:`SeedResult` per loader, in order.

    Raises :class:`SeedError` after marking every variant that did succeed, if any failed."""
    with contextlib.ExitStack() as locks:
        start = time.perf_counter()
        prepared: list[_Variant | SeedResult | None] = []
        failed: list[str] = []
        for loader in loaders:
            try:
                prepared.append(_prepare(loader, start, locks))
            except (CheckpointError, WeightCacheError, ValueError, OSError) as error:
                prepared.append(None)
                failed.append(f"{loader.cache_dir}: {type(error).__name__}: {error}")
        variants = [v for v in prepared if isinstance(v, _Variant)]
        if variants:
            failed += _run(variants, workers, address, progress, tasks_per_worker)
    if failed:
        raise SeedError("distributed seed failed for " + "; ".join(failed))
    return [p.result if isinstance(p, _Variant) else p for p in prepared]  # type: ignore[misc]


def _run(variants: list[_Variant], workers: int, address: str | None, progress: Any,
         tasks_per_worker: int) -> list[str]:
    """Submit every variant's tasks, collect, verify and mark; return the failures."""
    import ray

    timings = {"ray_start": start_ray(workers, address)}
    remote_warm = ray.remote(num_cpus=1)(_warm_worker)
    t = time.perf_counter()
    ray.get([remote_warm.remote(0.5) for _ in range(workers if address is None else 0)])
    timings["workers_ready"] = time.perf_counter() - t
    if progress is not None:
        plans = [w for v in variants for w in v.plan]
        progress.start(len(plans), sum(w.estimated_bytes for w in plans))
    t = time.perf_counter()
    remote_part = ray.remote(num_cpus=1, max_retries=TASK_RETRIES)(convert_part)
    owner: dict[Any, _Variant] = {}
    for variant in variants:
        spec = LoaderSpec.of(variant.loader)
        for names in partition(variant.plan, workers * tasks_per_worker):
            owner[remote_part.remote(spec, names, os.fspath(variant.root))] = variant
    host = {id(v): _write_sidecar(v) for v in variants}  # the driver's share, overlapped with the tasks
    collected = {id(v): {"digests": dict(host[id(v)][1]), "sizes": {}, "from_torch": 0.0} for v in variants}
    waiting = list(owner)
    while waiting:
        done, waiting = ray.wait(waiting, num_returns=1)
        variant = owner[done[0]]
        try:
            part = ray.get(done[0])
        except Exception as error:  # noqa: BLE001 - a task's failure is its variant's, reported below
            variant.failed = variant.failed or f"{type(error).__name__}: {error}"
            continue
        got = collected[id(variant)]
        got["digests"] |= part["digests"]
        got["sizes"] |= part["sizes"]
        got["from_torch"] += part["from_torch"]
        if progress is not None:
            by_file = {tensorbin_name(w.name, w.fmt): w.name for w in variant.plan}
            for relative, size in part["sizes"].items():
                progress.weight_done(by_file.get(relative, relative), size)
    timings["convert"] = time.perf_counter() - t
    if progress is not None:
        progress.finish()
    for variant in variants:
        got = collected[id(variant)]
        variant.result = _finish(variant, host[id(variant)][0], got, dict(timings, from_torch=got["from_torch"]))
    return [f"{v.loader.cache_dir}: {v.failed}" for v in variants if v.failed]


def _write_sidecar(variant: _Variant) -> tuple[dict[str, Any], dict[str, str]]:
    """The host weights (read from the checkpoint) and their sidecar's digest, written now."""
    loader = variant.loader
    reader = CheckpointReader(loader.checkpoint_dir, loader.key_rules)
    host = {key: reader.get(key) for key in reader.keys() if loader.is_host_weight(key)}
    if not host:
        return host, {}
    return host, write_host_sidecar(variant.root, host, loader.build_variant)


def _finish(variant: _Variant, host: dict[str, Any], got: dict[str, Any], timings: dict[str, float]) -> SeedResult:
    """Verify every planned file against what the workers reported; mark the variant once."""
    loader = variant.loader
    written = sum(got["sizes"].values())
    files = [tensorbin_name(w.name, w.fmt) for w in variant.plan]
    complete = False
    if variant.failed is None:
        t = time.perf_counter()
        problem = _verify(variant.root, files, got)
        timings["verify"] = time.perf_counter() - t
        if problem:
            variant.failed = problem
        else:
            reader = CheckpointReader(loader.checkpoint_dir, loader.key_rules)
            recorded = [f"{variant.generation}/{name}" for name in files]
            loader._mark_complete(variant.args, LazyStateDict(reader), host, recorded, got["digests"], variant.generation)
            complete = loader.status(variant.args).warm
    retire_generations(loader.cache_dir)  # the previous generation once marked; this one if it failed
    sidecar = sum(os.stat(variant.root / name).st_size for name in got["digests"]
                  if name not in got["sizes"] and (variant.root / name).exists())
    seconds = time.perf_counter() - variant.start
    logger.info(f"{loader.model_name}: Ray seed {'complete' if complete else 'not complete'}, {len(got['sizes'])} "
                f"files, {written / 2**20:,.0f} MiB in {seconds:.2f} s")
    return SeedResult(loader.cache_dir, False, variant.reason, complete, len(got["digests"]), written + sidecar,
                      seconds, timings)


def _verify(root: Path, files: list[str], got: dict[str, Any]) -> str | None:
    """Every planned file written, with the size and content the worker reported (re-hashed here)."""
    missing = [f for f in files if f not in got["digests"]]
    if missing:
        return f"{len(missing)} planned files were not written (first: {missing[0]})"
    for relative in files:
        path = root / relative
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return f"{relative} reported written but is missing"
        if size != got["sizes"][relative]:
            return f"{relative} is {size} bytes, its worker reported {got['sizes'][relative]}"
        if content_digest_file(path) != got["digests"][relative]:
            return f"{relative} differs from the digest its worker reported"
    return None
