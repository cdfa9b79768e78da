# SPDX-License-Identifier: Apache-2.0
"""Distributed seeding on Ray: one model's weights (and several variants) converted as Ray tasks.

Each variant is one :class:`~models.common.cold_build.ColdBuild`, held by the driver, as a
single-process seed is: the gate, the plan (headers only), the build lock and the gate again
under it, one fresh generation the tasks write into (readers keep the previous one meanwhile),
the host sidecar written by the driver, then the commit, which checks every planned file was
written and publishes the marker once; with ``$TT_CACHE_REMOTE`` a cold variant is first pulled
from the shared store and, with ``$TT_CACHE_REMOTE_PUSH``, a committed one pushed to it. What is
Ray's is the :class:`RayConverter`: it splits each plan into tasks of about equal checkpoint bytes
and submits every variant's before collecting any; each task (:func:`convert_part`) rebuilds the
loader in its worker and runs the family's ``convert`` converting only its own weights
(:func:`~models.common.converter.convert_units`, the loop a conversion thread runs too), returning
the files it wrote and their sizes. Nothing is marked unless every task of the variant succeeded,
and a variant that fails leaves no files behind. Every task, and the driver, reads the checkpoint
through a :class:`~models.common.weight_cache.checkpoint_proof.ProvenCheckpoint` of the driver's
identity (it travels in the :class:`LoaderSpec`): a task proves the files it reads hold the bytes
the variant's content id names, and checks them again after its last read; the driver checks its
own before the commit.

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


from models.common import envs
from models.common.build_plan import PlannedWeight, partition
from models.common.checkpoint import CheckpointError
from models.common.cold_build import ColdBuild
from models.common.converter import Build, Converted, convert_units, streaming_cache
from models.common.loader import SeedResult, WeightLoader, return_freed_buffers
from models.common.safetensors_file import CheckpointReader
from models.common.weight_cache.checkpoint_proof import ProvenCheckpoint
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
            "mesh_shape": tuple(loader.mesh_shape), "precision": loader.policy, "num_layers": loader.num_layers,
            "components": loader.components,
        }, loader.identity)

    def make(self) -> WeightLoader:
        import importlib

        module, name = self.loader_class.split(":")
        return getattr(importlib.import_module(module), name)(self.model, **self.options)


def convert_part(spec: LoaderSpec, names: list[str], target_dir: str,
                 plan: list[PlannedWeight] | None = None) -> dict[str, Any]:
    """One task: convert the weights ``names`` of ``spec``'s build into ``target_dir``; ``plan``:
    the driver's (else planned here, from the headers).

    Runs in a Ray worker (or anywhere): returns ``{"sizes": {file: bytes}, "from_torch": s,
    "pid": pid}``. Memory stays bounded as in the streaming seed."""
    from models.common.device_env import ensure_host_cluster

    ensure_host_cluster()
    return_freed_buffers()
    from models.common.build_plan import plan_weights, units_of
    from models.common.weight_cache.tensor_cache import conversion_threads

    loader = spec.make()
    if spec.identity is None:
        raise CheckpointError(f"{spec.model}: no checkpoint weights on the driver: nothing to convert")
    args = loader.make_args(loader.model_config(), loader.num_layers)
    with ProvenCheckpoint(spec.identity) as proof:
        proof.check_config(args.config)
        if plan is None:
            plan = plan_weights(loader, args, proof)
        reader = CheckpointReader(loader.checkpoint_dir, loader.key_rules, proof)
        with streaming_cache(loader, Path(target_dir)) as cache:
            with conversion_threads():
                done = convert_units(loader, args, reader, cache, plan, units_of(plan, names).__contains__)
            written = cache.finish()
        reader.close()
        proof.check()
    if cache.write_errors:
        raise OSError(f"cannot write {target_dir}: {cache.write_errors[0]}")
    if sorted(done) != sorted(names):
        raise RuntimeError(f"task converted {len(done)} of its {len(names)} weights")
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


class RayConverter:
    """The Ray strategy (a :class:`~models.common.converter.Converter`): each build's plan split
    into tasks of about equal checkpoint bytes, converted by :func:`convert_part` into the build's
    generation. :meth:`submit` every build first, so the tasks of all of them overlap; ``convert``
    then collects one build's tasks (every one, even after a failure: none still writes into a
    generation its transaction removes) and raises the first failure."""

    def __init__(self, ray: Any, remote_part: Any, parts: int) -> None:
        self.ray = ray
        self.remote_part = remote_part
        self.parts = parts
        self._tasks: dict[int, list[Any]] = {}

    def submit(self, build: Build) -> None:
        root = build.open()
        if root is None:
            raise OSError(f"cannot write {build.loader.cache_dir}")
        # the files as the driver's plan proved them: a task needs only their fstat
        spec = dataclasses.replace(LoaderSpec.of(build.loader), identity=build.proof.proven_identity())
        plan = self.ray.put(build.plan)  # planned once, by the driver
        self._tasks[id(build)] = [self.remote_part.remote(spec, names, os.fspath(root), plan)
                                  for names in partition(build.plan, self.parts)]

    def convert(self, build: Build) -> Converted:
        ray = self.ray
        if id(build) not in self._tasks:
            self.submit(build)
        waiting = self._tasks.pop(id(build))
        by_file = {tensorbin_name(w.name, w.fmt): w.name for w in build.plan}
        written: list[str] = []
        from_torch, failure = 0.0, None
        while waiting:
            done, waiting = ray.wait(waiting, num_returns=1)
            try:
                part = ray.get(done[0])
            except Exception as error:  # noqa: BLE001 - the build's failure, raised once all its tasks ended
                failure = failure or error
                continue
            from_torch += part["from_torch"]
            for relative, size in part["sizes"].items():
                written.append(relative)
                if build.on_written is not None:
                    build.on_written(by_file.get(relative, relative), size)
        if failure is not None:
            raise failure
        return Converted(written, timings={"convert": time.perf_counter() - build.start, "from_torch": from_torch})


class _Written:
    """Sums what one variant's tasks wrote and forwards each weight to the progress object."""

    def __init__(self, progress: Any) -> None:
        self.progress = progress
        self.files = 0
        self.bytes = 0

    def __call__(self, name: str, nbytes: int) -> None:
        self.files += 1
        self.bytes += nbytes
        if self.progress is not None:
            self.progress.weight_done(name, nbytes)


def _failure(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def seed_on_ray(loaders: Sequence[WeightLoader], *, workers: int = 2, address: str | None = None,
                progress: Any = None, tasks_per_worker: int = TASKS_PER_WORKER) -> list[SeedResult]:
    """Seed every loader's cache with Ray tasks; one :class:`SeedResult` per loader, in order:
    one :class:`~models.common.cold_build.ColdBuild` each (its gate, its lock and plan held until
    its commit), converted by one :class:`RayConverter`.

    Raises :class:`SeedError` after committing every variant that did succeed, if any failed."""
    start = time.perf_counter()
    results: list[SeedResult | None] = [None] * len(loaders)
    failed: list[str] = []
    with contextlib.ExitStack() as held:
        builds: dict[int, tuple[ColdBuild, _Written]] = {}
        for index, loader in enumerate(loaders):
            written = _Written(progress)
            try:
                args = loader.make_args(loader.model_config(), loader.num_layers)
                build = held.enter_context(ColdBuild(loader, args, stream=True, on_written=written, start=start))
                if build.warm:
                    results[index] = build.seed_result()
                elif build.transaction is None or not build.transaction.locked:
                    raise OSError(f"cannot take the build lock of {loader.cache_dir} "
                                  f"({build.transaction.lock.why if build.transaction else 'no transaction'})")
                else:
                    builds[index] = build, written
            except (CheckpointError, WeightCacheError, ValueError, OSError) as error:
                failed.append(f"{loader.cache_dir}: {_failure(error)}")
        if builds:
            timings = {"prepare": time.perf_counter() - start}
            converter = _start(workers, address, tasks_per_worker, timings)
            if progress is not None:
                plans = [w for build, _ in builds.values() for w in build.plan]
                progress.start(len(plans), sum(w.estimated_bytes for w in plans))
            for index, (build, _) in list(builds.items()):
                try:
                    converter.submit(build)
                except OSError as error:
                    failed.append(f"{build.loader.cache_dir}: {_failure(error)}")
                    del builds[index]
            converting = time.perf_counter()
            for index, (build, written) in builds.items():
                why = _run(build)
                if why is not None:
                    failed.append(f"{build.loader.cache_dir}: {why}")
                timings["convert"] = time.perf_counter() - converting
                built = build.built.timings if build.built is not None else {}
                results[index] = build.seed_result(written.files, written.bytes, {**built, **timings})
            if progress is not None:
                progress.finish()
    if failed:
        raise SeedError("distributed seed failed for " + "; ".join(failed))
    return results  # type: ignore[return-value]


def _start(workers: int, address: str | None, tasks_per_worker: int, timings: dict[str, float]) -> RayConverter:
    """Ray, started or joined, its workers' imports paid: the converter every build's tasks go through."""
    t = time.perf_counter()
    import ray

    timings["ray_import"] = time.perf_counter() - t
    timings["ray_start"] = start_ray(workers, address)
    remote_warm = ray.remote(num_cpus=1)(_warm_worker)
    t = time.perf_counter()
    ray.get([remote_warm.remote(0.5) for _ in range(workers if address is None else 0)])
    timings["workers_ready"] = time.perf_counter() - t
    return RayConverter(ray, ray.remote(num_cpus=1, max_retries=TASK_RETRIES)(convert_part), workers * tasks_per_worker)


def _run(build: ColdBuild) -> str | None:
    """Build one variant; why it failed, or None."""
    try:
        built = build.run()
    except Exception as error:  # noqa: BLE001 - a task's failure (Ray's error type too) is its variant's
        return _failure(error)
    if not built.cached:
        return f"cannot complete the cache ({built.failed})"
    return None
