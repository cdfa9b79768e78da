# SPDX-License-Identifier: Apache-2.0
"""Distributed seeding on Ray: one model's weights (and several variants) converted as Ray tasks.

The driver plans each cold variant (:func:`~models.seeding.weights.plan_weights`, headers only),
splits the plan into tasks of about equal checkpoint bytes and submits them all; each task
rebuilds the loader in its worker, runs the family's ``convert`` converting only its own weights
(:class:`~models.seeding.weights.PartSink`) and writes them into the shared cache directory with
the same atomic publish as any cold build, returning the files it wrote and their sizes. Each
variant is one :class:`~models.common.weight_cache.build.BuildTransaction`, held by the driver:
the build lock from its check to its marker, one fresh generation the tasks write into (readers
keep the previous one meanwhile), the host sidecar written by the driver, then the commit, which
hashes and stamps every planned file (a missing one fails it) and publishes the marker once.
Nothing is marked unless every task of the variant succeeded, and a variant that fails leaves
no files behind. With ``$TT_CACHE_REMOTE`` a cold variant is first pulled from the shared store
and, with ``$TT_CACHE_REMOTE_PUSH``, a committed one pushed to it, as a single-process seed does. Every task, and the driver, reads the checkpoint through a
:class:`~models.common.weight_cache.checkpoint_proof.ProvenCheckpoint` of the driver's identity
(it travels in the :class:`LoaderSpec`): a task proves the files it reads hold the bytes the
variant's content id names, and checks them again after its last read; the driver checks its own
before the commit.

Ray is the scheduler (no home-made one): a worker killed mid-task is retried by Ray
(``max_retries``); the files a killed attempt already published are rewritten with identical
bytes, and its temp files are removed with the generation if the variant fails, or by
``tt-cache clean``.

* ``workers=N``: a local Ray instance with N CPUs (this host).
* ``address="ray://host:10001"`` or ``"auto"``: join an existing cluster. Every node then needs
  the project installed (same versions) and the cache directory and checkpoint on a shared
  file system at the same paths.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loguru import logger

from models.common import envs
from models.common.build_plan import PlannedWeight, partition, plan_weights
from models.common.checkpoint import CheckpointError
from models.common.loader import STREAM_PENDING_BYTES, SeedResult, WeightLoader, return_freed_buffers
from models.common.safetensors_file import CheckpointReader
from models.common.weight_cache.build import BuildTransaction
from models.common.weight_cache.remote.after_build import push_after_build
from models.common.weight_cache.checkpoint_proof import ProvenCheckpoint
from models.common.weight_cache.host_sidecar import write_host_sidecar
from models.common.weight_cache.identity import CheckpointIdentity
from models.common.weight_cache.marker import WeightCacheError
from models.common.weight_cache.tensor_cache import tensorbin_name

TASKS_PER_WORKER = 3  # a few tasks per worker: balance, and a retry redoes only a small part
TASK_RETRIES = 3
OBJECT_STORE_BYTES = 128 << 20  # tasks return only file names and sizes


class SeedError(RuntimeError):
    """A distributed seed could not finish every variant (the failed ones stay cold)."""


@dataclass(frozen=True)
class LoaderSpec:
    """What a worker needs to rebuild a driver's loader: its class and its options, and what the
    checkpoint's content id named on the driver (what the worker must read)."""

    loader_class: str  # "module:QualName"
    model: str
    options: dict[str, Any]
    identity: CheckpointIdentity | None = None

    @classmethod
    def of(cls, loader: WeightLoader) -> LoaderSpec:
        kind = type(loader)
        return cls(f"{kind.__module__}:{kind.__qualname__}", os.fspath(loader.model), {
            "mesh_shape": tuple(loader.mesh_shape), "precision": loader.precision, "num_layers": loader.num_layers,
            "components": loader.components,
        }, loader.identity)

    def make(self) -> WeightLoader:
        import importlib

        module, name = self.loader_class.split(":")
        return getattr(importlib.import_module(module), name)(self.model, **self.options)


def convert_part(spec: LoaderSpec, names: list[str], target_dir: str) -> dict[str, Any]:
    """One task: convert the weights ``names`` of ``spec``'s build into ``target_dir``.

    Runs in a Ray worker (or anywhere): returns ``{"sizes": {file: bytes}, "from_torch": s,
    "pid": pid}``. Memory stays bounded as in the streaming seed."""
    from models.common.device_env import ensure_host_cluster

    ensure_host_cluster()
    return_freed_buffers()
    from models.common.build_plan import PartSink, PartState, units_of
    from models.common.weight_cache.tensor_cache import TensorCache, conversion_threads

    loader = spec.make()
    if spec.identity is None:
        raise CheckpointError(f"{spec.model}: no checkpoint weights on the driver: nothing to convert")
    args = loader.make_args(loader.model_config(), loader.num_layers)
    with ProvenCheckpoint(spec.identity) as proof:
        proof.check_config(args.config)
        plan = plan_weights(loader, args, proof)
        reader = CheckpointReader(loader.checkpoint_dir, loader.key_rules, proof)
        state = PartState(reader)
        with TensorCache(Path(target_dir), loader.mesh_shape, rebuild=True,
                         max_pending_bytes=STREAM_PENDING_BYTES) as cache:
            sink = PartSink(cache, state, plan, units_of(plan, names).__contains__)
            with conversion_threads():
                loader.convert(sink, args)
            written = cache.finish()
        reader.close()
        proof.check()
    if cache.write_errors:
        raise OSError(f"cannot write {target_dir}: {cache.write_errors[0]}")
    if sorted(sink.done) != sorted(names):
        raise RuntimeError(f"task converted {len(sink.done)} of its {len(names)} weights")
    sizes = {rel: os.stat(os.path.join(target_dir, rel)).st_size for rel in written}
    return {"sizes": sizes, "from_torch": cache.convert_seconds, "pid": os.getpid()}


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
    if envs.TT_METAL_MOCK_CLUSTER_DESC_PATH:
        env["TT_METAL_MOCK_CLUSTER_DESC_PATH"] = envs.TT_METAL_MOCK_CLUSTER_DESC_PATH
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
    build: BuildTransaction
    proof: ProvenCheckpoint
    root: Path
    start: float
    failed: str | None = None
    result: SeedResult | None = None


def _prepare(loader: WeightLoader, start: float, transactions: contextlib.ExitStack) -> _Variant | SeedResult:
    """The gate's verdict; for a cold variant, open its build transaction and its checkpoint proof
    (held in ``transactions`` until it is committed), check again under its lock, plan the build
    and open the generation the tasks write into."""
    args = loader.make_args(loader.model_config(), loader.num_layers)
    status = loader.status(args)
    if not status.warm and not loader.forced and loader._pulled_from_remote(args):  # the loader's cold start
        status = loader.status(args)
    if status.warm and not loader.forced:
        return SeedResult(loader.cache_dir, True, status.reason, True, 0, 0, time.perf_counter() - start)
    if not loader.has_checkpoint_weights:
        raise CheckpointError(f"{loader.model}: the cache is cold ({status.reason}) and no checkpoint weights are here")
    build = transactions.enter_context(BuildTransaction(loader.paths))
    if not build.locked:
        raise OSError(f"cannot take the build lock of {loader.cache_dir} ({build.lock.why})")
    again = loader.status(args)
    if again.warm and not loader.forced:  # another builder finished while this one waited
        return SeedResult(loader.cache_dir, True, again.reason, True, 0, 0, time.perf_counter() - start)
    proof = transactions.enter_context(ProvenCheckpoint(loader.identity))
    proof.check_config(args.config)
    plan = plan_weights(loader, args, proof)
    return _Variant(loader, args, status.reason, plan, build, proof, build.open_generation(), start)


def seed_on_ray(loaders: Sequence[WeightLoader], *, workers: int = 2, address: str | None = None,
                progress: Any = None, tasks_per_worker: int = TASKS_PER_WORKER) -> list[SeedResult]:
    """Seed every loader's cache with Ray tasks; one :class:`SeedResult` per loader, in order.

    Raises :class:`SeedError` after committing every variant that did succeed, if any failed."""
    with contextlib.ExitStack() as transactions:
        start = time.perf_counter()
        prepared: list[_Variant | SeedResult | None] = []
        failed: list[str] = []
        for loader in loaders:
            try:
                prepared.append(_prepare(loader, start, transactions))
            except (CheckpointError, WeightCacheError, ValueError, OSError) as error:
                prepared.append(None)
                failed.append(f"{loader.cache_dir}: {type(error).__name__}: {error}")
        variants = [v for v in prepared if isinstance(v, _Variant)]
        if variants:
            failed += _run(variants, workers, address, progress, tasks_per_worker, time.perf_counter() - start)
    if failed:
        raise SeedError("distributed seed failed for " + "; ".join(failed))
    return [p.result if isinstance(p, _Variant) else p for p in prepared]  # type: ignore[misc]


def _run(variants: list[_Variant], workers: int, address: str | None, progress: Any,
         tasks_per_worker: int, prepare_seconds: float) -> list[str]:
    """Submit every variant's tasks, collect, then commit each variant; return the failures."""
    t = time.perf_counter()
    import ray

    timings = {"prepare": prepare_seconds, "ray_import": time.perf_counter() - t}
    timings["ray_start"] = start_ray(workers, address)
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
    for variant in variants:  # the files as the driver's plan proved them: a task needs only their fstat
        spec = dataclasses.replace(LoaderSpec.of(variant.loader), identity=variant.proof.proven_identity())
        for names in partition(variant.plan, workers * tasks_per_worker):
            owner[remote_part.remote(spec, names, os.fspath(variant.root))] = variant
    submitted = time.perf_counter()
    host = {}
    for variant in variants:  # the driver's share, overlapped with the tasks
        try:
            host[id(variant)] = _write_sidecar(variant)
        except CheckpointError as error:
            variant.failed, host[id(variant)] = f"{type(error).__name__}: {error}", ({}, None)
    timings["sidecar"] = time.perf_counter() - submitted
    collected = {id(v): {"sizes": {}, "from_torch": 0.0} for v in variants}
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
        variant.result = _finish(variant, *host[id(variant)], got, dict(timings, from_torch=got["from_torch"]))
    return [f"{v.loader.cache_dir}: {v.failed}" for v in variants if v.failed]


def _write_sidecar(variant: _Variant) -> tuple[dict[str, Any], str | None]:
    """The host weights (read from the checkpoint) and their sidecar's name, written now."""
    loader = variant.loader
    reader = CheckpointReader(loader.checkpoint_dir, loader.key_rules, variant.proof)
    host = {key: reader.get(key) for key in reader.keys() if loader.is_host_weight(key)}
    if not host:
        return host, None
    name = variant.build.paths.host_sidecar_name
    write_host_sidecar(variant.root / name, host)
    return host, name


def _finish(variant: _Variant, host: dict[str, Any], sidecar: str | None, got: dict[str, Any],
            timings: dict[str, float]) -> SeedResult:
    """Commit the variant (its transaction hashes every planned file; a missing one fails it)."""
    from models.common.conversion import LazyStateDict

    loader = variant.loader
    written = sum(got["sizes"].values())
    files = [tensorbin_name(w.name, w.fmt) for w in variant.plan]
    complete = False
    if variant.failed is None:
        t = time.perf_counter()
        missing = [f for f in files if f not in got["sizes"]]
        if missing:
            variant.failed = f"{len(missing)} planned files were not written (first: {missing[0]})"
        else:
            try:
                reader = CheckpointReader(loader.checkpoint_dir, loader.key_rules, variant.proof)
                marker = loader.draft_marker(variant.args, LazyStateDict(reader), host)
                variant.proof.check()  # the host weights and headers the driver read, still the content id's
                variant.build.commit(marker, files, sidecar)
                complete = loader.status(variant.args).warm
                if complete:  # shared when $TT_CACHE_REMOTE_PUSH asks, as the loader's own cold build is
                    push_after_build(loader.paths, loader.model_name)
            except CheckpointError as error:
                variant.failed = f"{type(error).__name__}: {error}"
            except OSError as error:
                variant.failed = f"cannot complete the cache ({error})"
        timings["commit"] = time.perf_counter() - t
    sidecar_bytes = os.stat(variant.root / sidecar).st_size if complete and sidecar else 0
    seconds = time.perf_counter() - variant.start
    logger.info(f"{loader.model_name}: Ray seed {'complete' if complete else 'not complete'}, {len(got['sizes'])} "
                f"files, {written / 2**20:,.0f} MiB in {seconds:.2f} s")
    return SeedResult(loader.cache_dir, False, variant.reason, complete, len(got["sizes"]) + bool(sidecar_bytes),
                      written + sidecar_bytes, seconds, timings)
