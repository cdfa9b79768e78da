# SPDX-License-Identifier: Apache-2.0
"""Run a seeding plan: a stat-only gate check per combination, then a cold build of each cold
one in its own worker process, watched for progress and stalls.

A worker process per seed keeps one model's failure (an exception, a crash in native code, the
OOM killer, a hang) from touching the others, and lets the watchdog end a stalled seed for
sure (SIGKILL of its process group) instead of hoping a blocked thread notices an interrupt.
The check itself imports neither torch nor ttnn (:class:`~models.common.weight_cache.request.
CacheRequest`): ``seed --check`` runs on a light install. Only ``tt-cache build`` loads a model here.

With ``$TT_CACHE_REMOTE`` set, a worker's seed first pulls its cold variant from the shared store
(the case is :data:`PULLED`: nothing built), and with ``$TT_CACHE_REMOTE_PUSH`` on it pushes what it
built; the case records what the store answered and the bytes each way, as the worker reported them.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import models
from models.common import envs
from models.common.checkpoint import (
    CONFIG_FILE,
    CheckpointError,
    hub_cache_dir,
    model_id,
    read_config,
    resolve_checkpoint_dir,
)
from models.common.mesh import MESH_SPELLINGS, parse_mesh_shape
from models.common.model_args import ModelArgs
from models.common.precision import PolicyError, spec_problem
from models.common.weight_cache.layout import CacheRoot, VariantPaths, variant_subdir
from models.common.weight_cache.marker import WeightCacheError, iter_markers
from models.common.weight_cache.remote.after_build import HIT
from models.common.weight_cache.request import CacheRequest
from models.common.weight_cache.usage import answers_to, touch_last_used
from models.common.weight_cache.variant import variant_tag
from models.registry import FAMILY_LOADERS, family_facts, family_of, loader_class

if TYPE_CHECKING:
    from models.common.loader import WeightLoader
from models.seeding.plan import Combination, Plan
from models.seeding.progress import EventDecoder, ProgressTracker, StallWatchdog
from models.seeding.report import (
    COLD,
    FAILED,
    INTERRUPTED,
    PARTIAL,
    PULLED,
    SEEDED,
    SKIPPED,
    STALLED,
    WARM,
    CaseResult,
    SeedReport,
    signal_name,
)


class SeedInputError(ValueError):
    """A model, config.json, mesh or precision that cannot be used as given (one line, names the file)."""


@dataclass(frozen=True)
class SeedOptions:
    check_only: bool = False
    cache_root: str | None = None
    stall_timeout: float | None = None
    log_every: float = 30.0
    progress: bool = True
    workers: int = 1  # >= 2: a local Ray instance of that many CPUs per seed (models.seeding.ray_seed)
    address: str | None = None  # an existing Ray cluster


# -- one model -----------------------------------------------------------------------------------


def _family(combination: Combination) -> tuple[str, Path | None]:
    checkpoint = resolve_checkpoint_dir(combination.model)
    if combination.family is not None:
        return combination.family, checkpoint
    if checkpoint is None:
        raise SeedInputError(
            f"{combination.model}: no checkpoint on this machine (no such directory, and no snapshot under "
            f"{hub_cache_dir()}); name its family to use its cache alone"
        )
    try:
        return family_of(read_config(checkpoint)), checkpoint
    except CheckpointError as error:
        raise SeedInputError(str(error)) from None
    except ValueError as error:
        raise SeedInputError(f"{checkpoint / CONFIG_FILE}: {error}") from None


@dataclass(frozen=True)
class OpenedRequest:
    """A combination's cache, as far as it can be known without torch: the request, and the
    layers and components a build of it holds."""

    request: CacheRequest
    n_layers: int
    components: tuple[str, ...]

    def status(self) -> Any:
        return self.request.status(self.n_layers, self.components)


def open_request(combination: Combination, cache_root: str | None = None) -> OpenedRequest:
    """The combination's cache request (torch-free), or :class:`SeedInputError` naming what is wrong."""
    family, checkpoint = _family(combination)
    try:
        facts = family_facts(family)
        policy = facts.policy(combination.precision, combination.model)
        request = CacheRequest(combination.model, facts.build_variant(policy), policy.label,
                               parse_mesh_shape(combination.mesh), None, Path(cache_root or envs.TT_CACHE_PATH))
        config = request.model_config()
        request.cache_dir  # noqa: B018 - resolved now: a cache-only model may have none, or several
        components = tuple(sorted(set(combination.components or facts.default_components(config))))
    except CheckpointError as error:
        raise SeedInputError(str(error)) from None
    except ValueError as error:
        raise SeedInputError(f"{combination.model}: {error}") from None
    unknown = set(components) - set(facts.components)
    if unknown:
        raise SeedInputError(f"{combination.model}: {family} has no components {sorted(unknown)}; it has "
                             f"{list(facts.components)}")
    where = checkpoint / CONFIG_FILE if checkpoint else f"{combination.model} (config kept with its cache)"
    try:
        n_layers = ModelArgs.from_hf_config(config).n_layers
        policy.check_decoders(n_layers)
    except PolicyError as error:
        raise SeedInputError(f"{combination.model}: {error}") from None
    except KeyError as error:
        raise SeedInputError(f"{where}: missing field {error} that a {family} model needs") from None
    except (TypeError, ValueError) as error:
        raise SeedInputError(f"{where}: unusable for a {family} model ({error})") from None
    return OpenedRequest(request, n_layers, components)


def open_model(combination: Combination, cache_root: str | None = None, num_layers: int | None = None,
               force: bool | None = None) -> tuple[WeightLoader, ModelArgs]:
    """The combination's loader and architecture, or :class:`SeedInputError` naming what is wrong."""
    family, checkpoint = _family(combination)
    try:
        loader = loader_class(family)(combination.model, mesh_shape=combination.mesh,
                                      precision=combination.precision, cache_root=cache_root,
                                      num_layers=num_layers, components=combination.components, force=force)
        config = loader.model_config()
        loader.cache_dir  # noqa: B018 - resolved now: a cache-only model may have none, or several
    except CheckpointError as error:
        raise SeedInputError(str(error)) from None
    except ValueError as error:
        raise SeedInputError(f"{combination.model}: {error}") from None
    where = checkpoint / CONFIG_FILE if checkpoint else f"{combination.model} (config kept with its cache)"
    try:
        return loader, loader.make_args(config, num_layers)
    except KeyError as error:
        raise SeedInputError(f"{where}: missing field {error} that a {family} model needs") from None
    except (TypeError, ValueError) as error:
        raise SeedInputError(f"{where}: unusable for a {family} model ({error})") from None


def build_one(combination: Combination, *, cache_root: str | None = None, num_layers: int | None = None,
              force: bool | None = None) -> CaseResult:
    """``tt-cache build``: load in this process (warm or cold) and say whether the cache is now warm."""
    start = time.perf_counter()
    loader, args = open_model(combination, cache_root, num_layers, force)
    try:
        loaded = loader.load()
    except CheckpointError as error:
        raise SeedInputError(str(error)) from None
    except WeightCacheError as error:  # cache-only, and the cache is unusable: a failed check, not bad input
        return CaseResult(combination, FAILED, str(error), time.perf_counter() - start, str(loader.cache_dir))
    seconds = time.perf_counter() - start
    done = f"{len(loaded.weights)} tensors in {loaded.seconds:.3f} s"
    if loaded.warm:
        return CaseResult(combination, WARM, f"warm, {done}", seconds, str(loaded.cache_dir))
    if args.partial:
        return CaseResult(combination, PARTIAL, f"built {args.n_layers} of {args.full_n_layers} layers "
                          f"({done}); a partial build is never marked complete", seconds, str(loaded.cache_dir))
    after = loader.status(args)
    if not after.warm:
        return CaseResult(combination, FAILED, f"built in memory ({done}) but nothing was cached: {after.reason}",
                          seconds, str(loaded.cache_dir))
    return CaseResult(combination, SEEDED, f"cold ({loaded.reason}), {done}", seconds, str(loaded.cache_dir))


# -- the worker process --------------------------------------------------------------------------


def _worker_command(combination: Combination, options: SeedOptions, fd: int) -> list[str]:
    spec = {"combination": combination.as_json(), "cache_root": options.cache_root,
            "workers": options.workers, "address": options.address}
    return [sys.executable, "-m", "models.seeding.worker", json.dumps(spec), str(fd)]


def _worker_env() -> dict[str, str]:
    package_parent = str(Path(models.__file__).resolve().parents[1])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": package_parent + (os.pathsep + path if path else "")}


def _kill_group(pid: int) -> None:
    """SIGKILL a worker's whole session (a Ray instance it started goes with it)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # gone already


@dataclass(frozen=True)
class WorkerEnd:
    """How a worker ended: ``outcome`` None when it finished without error, else :data:`STALLED` or
    :data:`FAILED` and why; ``store``: what it pulled from or pushed to the shared store (the
    ``result`` event's :class:`~models.common.weight_cache.remote.after_build.StoreLedger` fields)."""

    outcome: str | None
    reason: str = ""
    store: dict[str, Any] = field(default_factory=dict)


def run_worker(combination: Combination, options: SeedOptions, tracker: ProgressTracker) -> WorkerEnd:
    """Seed one combination in a worker process (see :class:`WorkerEnd`)."""
    watchdog = StallWatchdog(options.stall_timeout)
    read_end, write_end = os.pipe()
    try:
        worker = subprocess.Popen(_worker_command(combination, options, write_end), pass_fds=(write_end,),
                                  stdin=subprocess.DEVNULL, stdout=sys.stderr.fileno(), env=_worker_env(),
                                  start_new_session=True)
    finally:
        os.close(write_end)
    decoder, result, stalled = EventDecoder(), None, None
    try:
        with selectors.DefaultSelector() as selector, os.fdopen(read_end, "rb", buffering=0) as pipe:
            selector.register(pipe, selectors.EVENT_READ)
            while True:
                eof = False
                for _ in selector.select(timeout=0.5):
                    data = pipe.read(1 << 16)
                    eof = not data
                    for event in decoder.feed(data or b""):
                        if event.get("event") == "result":
                            result = event
                        else:
                            tracker.handle(event)
                tracker.tick()
                if eof:
                    break
                stalled = watchdog.check(tracker.snapshot())
                if stalled:
                    break
    finally:  # a stall, or this process interrupted (CI cancelled the job): the seed never outlives it
        if stalled or worker.poll() is None:
            _kill_group(worker.pid)
    code = worker.wait()
    tracker.close()
    if stalled:
        return WorkerEnd(STALLED, stalled)
    if result is not None:
        store = {name: result[name] for name in STORE_FIELDS if name in result}
        if result.get("ok"):
            return WorkerEnd(None, "", store)
        return WorkerEnd(FAILED, str(result.get("reason", "")), store)
    last = tracker.snapshot()
    after = f"after {last.weights_done} weights (last {last.last_weight})" if last.last_weight else "before any weight"
    how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
    return WorkerEnd(FAILED, f"seed worker died ({how}) {after}")


# -- the plan ------------------------------------------------------------------------------------


def validate_plan(plan: Plan) -> None:
    """Names that cannot work anywhere (a mesh, precision or family typo) stop the run before it starts."""
    problems = []
    for combination in plan.combinations:
        try:
            parse_mesh_shape(combination.mesh)
        except ValueError:
            problems.append(f"mesh {combination.mesh!r} (known: {MESH_SPELLINGS})")
        if problem := spec_problem(combination.precision):
            problems.append(problem.removeprefix("unknown "))
        if combination.family is not None and combination.family not in FAMILY_LOADERS:
            problems.append(f"family {combination.family!r} (known: {', '.join(sorted(FAMILY_LOADERS))})")
    if problems:
        raise SeedInputError(f"{plan.path}: unknown {'; '.join(dict.fromkeys(problems))}")


@dataclass
class PlannedVariant:
    """One cache variant a plan names: the first plan entry that names it, the later ones merged
    into it (another spelling of the mesh, the family's default components written out, another
    name for the same weights), and its request, or why it cannot be opened."""

    combination: Combination
    opened: OpenedRequest | None
    problem: str = ""
    open_seconds: float = 0.0
    merged: list[Combination] = field(default_factory=list)

    @property
    def key(self) -> tuple:
        """What makes two plan entries one variant: the cache it resolves to (the weights' content,
        else the cache dir; precision, mesh, layers; build variant; components), or, when it cannot
        be opened, the entry in canonical form (mesh as (rows, cols), components as a set)."""
        combination, opened = self.combination, self.opened
        if opened is None:
            components = tuple(sorted(set(combination.components))) if combination.components else None
            return ("plan", combination.model, parse_mesh_shape(combination.mesh), combination.precision,
                    combination.family, components)
        request = opened.request
        return ("cache", request.content_id or str(request.cache_dir), str(request.variant_subdir),
                variant_tag(request.build_variant), opened.components, opened.n_layers)


def plan_variants(plan: Plan, options: SeedOptions) -> list[PlannedVariant]:
    """Every variant of the plan once, in plan order (validate the plan first)."""
    variants: dict[tuple, PlannedVariant] = {}
    for combination in plan.combinations:
        start = time.perf_counter()
        try:
            planned = PlannedVariant(combination, open_request(combination, options.cache_root))
        except SeedInputError as error:
            planned = PlannedVariant(combination, None, str(error))
        planned.open_seconds = time.perf_counter() - start
        first = variants.setdefault(planned.key, planned)
        if first is not planned:
            first.merged.append(combination)
    return list(variants.values())


def _marker_facts(status: Any) -> dict[str, Any]:
    """The variant's size and the cold build time its marker recorded (for the run's statistics)."""
    marker = getattr(status, "marker", None)
    if marker is None:
        return {}
    return {"cache_bytes": sum(record.bytes for record in marker.all_files()), "build_seconds": marker.build_seconds}


STORE_FIELDS = ("store", "bytes_pulled", "bytes_pushed", "push_error")  # of a worker's result event


def _store_facts(store: dict[str, Any]) -> dict[str, Any]:
    """A worker's store traffic as the case records it."""
    return {"store": str(store.get("store", "")), "bytes_pulled": int(store.get("bytes_pulled", 0)),
            "bytes_pushed": int(store.get("bytes_pushed", 0))}


def _use(opened: OpenedRequest, options: SeedOptions) -> dict[str, Any] | None:
    """A warm hit as the report hands it to the writer's ``gc --uses``: the variant dir relative to
    the cache root (a read-only runner's mount path is not the writer's), its tag and the time."""
    root = Path(os.path.abspath(options.cache_root or envs.TT_CACHE_PATH))
    try:
        relative = Path(os.path.abspath(opened.request.cache_dir)).relative_to(root)
    except ValueError:
        return None  # an explicit cache dir outside the root: the writer's gc does not see it either
    return {"cache_dir": relative.as_posix(), "variant_tag": opened.request.paths.tag, "at": time.time()}


def run_combination(variant: PlannedVariant, options: SeedOptions) -> CaseResult:
    combination = variant.combination
    start = time.perf_counter() - variant.open_seconds

    def result(outcome: str, reason: str = "", cache_dir: Any = None, tracker: ProgressTracker | None = None,
               status: Any = None, use: dict[str, Any] | None = None, store: dict[str, Any] | None = None):
        written = tracker.snapshot() if tracker else None
        return CaseResult(combination, outcome, reason, time.perf_counter() - start,
                          str(cache_dir) if cache_dir else None,
                          written.weights_done if written else 0, written.bytes_done if written else 0,
                          tuple(variant.merged), **_marker_facts(status), use=use, **_store_facts(store or {}))

    opened = variant.opened
    if opened is None:
        return result(FAILED, variant.problem)
    cache_dir = opened.request.cache_dir
    status = opened.status()
    if status.warm:
        touch_last_used(opened.request.paths)  # a CI check that finds the cache warm is a use: gc keeps it
        return result(WARM, "", cache_dir, status=status, use=_use(opened, options))
    if options.check_only:
        return result(COLD, status.reason, cache_dir)
    tracker = ProgressTracker(combination.case_name, log_every=options.log_every, show=options.progress)
    try:
        end = run_worker(combination, options, tracker)
    except KeyboardInterrupt as interrupt:  # the worker is gone (run_worker's finally): say how far it got
        tracker.close()
        last = tracker.snapshot()
        done = (f"after {last.weights_done}/{last.total_weights or '?'} weights (last {last.last_weight})"
                if last.last_weight else "before any weight was written")
        interrupt.case = result(INTERRUPTED, f"interrupted by {signal_name(interrupt)} while it ran, {done}",
                                cache_dir, tracker)  # type: ignore[attr-defined]
        raise
    if end.outcome is not None:
        return result(end.outcome, end.reason, cache_dir, tracker, store=end.store)
    after = opened.status()
    if not after.warm:
        return result(FAILED, f"seed finished but the cache is still cold: {after.reason}", cache_dir, tracker,
                      store=end.store)
    pulled = end.store.get("store") == HIT
    push_error = f"built and warm here, but the push to the shared store failed: {end.store['push_error']}" \
        if end.store.get("push_error") else ""
    return result(PULLED if pulled else SEEDED, push_error, cache_dir, tracker, after, store=end.store)


def _print_case(case: CaseResult) -> None:
    print(case.summary(), file=sys.stderr, flush=True)


def run_plan(plan: Plan, options: SeedOptions, report: SeedReport | None = None,
             on_case: Callable[[CaseResult], None] | None = None) -> SeedReport:
    """Every variant, in plan order; one failing model never stops the others. ``report`` (made
    here when not given) gets each case as it finishes, so a caller interrupted mid-run still has
    the finished ones; ``on_case`` (default: its line on stderr, with ``options.progress``) is
    called with each, once."""
    on_case = on_case or (_print_case if options.progress else None)
    validate_plan(plan)
    report = report if report is not None else SeedReport(str(plan.path), options.check_only)
    start, first = time.perf_counter(), len(report.cases)
    variants: list[PlannedVariant] = []
    try:
        variants = plan_variants(plan, options)
        for variant in variants:
            if variant.merged:
                also = "; ".join(c.where for c in variant.merged)
                print(f"{plan.path}: {also}: the same variant as {variant.combination.where}; merged into one case",
                      file=sys.stderr, flush=True)
        for variant in variants:
            case = run_combination(variant, options)
            report.cases.append(case)
            report.seconds = time.perf_counter() - start
            if on_case is not None:
                on_case(case)
    except KeyboardInterrupt as interrupt:
        report.seconds = time.perf_counter() - start
        _report_the_rest(report, variants or [PlannedVariant(c, None) for c in plan.combinations],
                         len(report.cases) - first, interrupt)
        raise
    report.seconds = time.perf_counter() - start
    return report


def _report_the_rest(report: SeedReport, variants: list[PlannedVariant], done: int,
                     interrupt: KeyboardInterrupt) -> None:
    """An interrupted run still reports every planned variant: the one running (or next) when the
    signal came as :data:`INTERRUPTED`, the others as :data:`SKIPPED`, each saying why."""
    why = f"{report.command} was interrupted by {signal_name(interrupt)}"
    for index, variant in enumerate(variants[done:]):
        merged = tuple(variant.merged)
        if index == 0:
            running = getattr(interrupt, "case", None)
            report.cases.append(running or CaseResult(variant.combination, INTERRUPTED,
                                                      f"interrupted by {signal_name(interrupt)} before it started",
                                                      merged=merged))
        else:
            report.cases.append(CaseResult(variant.combination, SKIPPED, f"not run: {why}", merged=merged))


# -- what a plan keeps (tt-cache gc --keep-plan) --------------------------------------------------


def _markers_of_model(combination: Combination, cache_root: Path) -> set[Path]:
    """Every variant built from this model id at the combination's precision and mesh (of its
    family, if the plan names one): what a combination that cannot be opened may still name."""
    wanted = model_id(combination.model)
    mesh_dir = variant_subdir("-", parse_mesh_shape(combination.mesh)).name
    found = set()
    for model_dir in CacheRoot(cache_root).model_dirs():
        for path, marker, _ in (m for d in sorted(model_dir.glob(f"*/{mesh_dir}")) for m in iter_markers(d)):
            if marker is None or (combination.family is not None and marker.family != combination.family):
                continue
            if marker.precision == _policy_label(combination, marker.family) and \
                    answers_to(VariantPaths(path.parent, marker.build_variant), marker.model_id, wanted):
                found.add(path)
    return found


def _policy_label(combination: Combination, family: str | None) -> str | None:
    """The variant dir name of the combination's precision for a model of ``family`` (a named
    policy may be a dtype's build: Llama 3's accuracy is bfloat8_b), None when it names none."""
    try:
        return family_facts(family or "").policy(combination.precision, combination.model).label
    except ValueError:
        return None


def plan_markers(plan: Plan, cache_root: Path) -> set[Path]:
    """The marker files of every variant ``plan`` names under ``cache_root`` (some may not exist
    yet): each combination's cache as the loader resolves it, or, when it cannot be opened (no
    checkpoint here and no family named, an ambiguous cache-only model), every variant built
    from its model id at its precision and mesh. Raises :class:`SeedInputError` for a plan
    naming a mesh, precision or family that does not exist."""
    validate_plan(plan)
    markers: set[Path] = set()
    for combination in plan.combinations:
        try:
            markers.add(open_request(combination, str(cache_root)).request.paths.marker)
        except SeedInputError:
            markers |= _markers_of_model(combination, cache_root)
    return markers
