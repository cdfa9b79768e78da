# SPDX-License-Identifier: Apache-2.0
"""``tt-cache prefill ls|verify|gc ROOT``: the prefill cache from the command line.

    prefill ls ROOT [--json]                      objects, bytes, bytes per sample, size cap, debris
    prefill verify ROOT [--json]                  re-hash every object; exit 1 naming the bad ones
    prefill gc ROOT [--older-than 30d] [--max-size SIZE] [--dry-run] [--json]
                                                  dead writers' debris, objects unused that long, least
                                                  recently used objects beyond SIZE (e.g. 20G)

Durations and sizes are spelled as in ``tt-cache gc`` (``30d``, ``12h``; ``20G``), parsed by the
same functions. ``--older-than-days N``, the earlier spelling, still works.

``ls`` shows the size cap producers are given by ``TT_PREFILL_CACHE_MAX_SIZE``; ``gc`` applies
it when ``--max-size`` is not given. JSON output carries ``schema_version`` and snake_case keys,
and errors are JSON too under ``--json`` (``{"schema_version": 1, "error": ..., "exit_code": 2}``), as
every other ``tt-cache`` command's.

Exit status: 0 all good, 1 a check failed, 2 bad usage or input (no such root, not a directory,
not a size). Torch-free and ttnn-free: ``add_prefill_commands`` plugs these into any ``argparse``
CLI (``tt-cache``), ``main`` runs them standalone.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from models.common.prefill_cache.layout import FrozenBackboneCacheError
from models.common.prefill_cache.maintenance import (
    MAX_SIZE_ENV,
    gc,
    list_objects,
    max_bytes_from_env,
    summarize,
    verify,
)
from models.common.units import format_bytes, parse_size
from models.tt_cache.humanize import parse_duration

T = TypeVar("T")

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
SCHEMA_VERSION = 1


def _fail(args: argparse.Namespace, message: str) -> int:
    """Report bad input (one line, or a JSON error object under ``--json``); exit status 2."""
    if getattr(args, "json", False):
        print(json.dumps({"schema_version": SCHEMA_VERSION, "error": message, "exit_code": EXIT_BAD_INPUT},
                         sort_keys=True))
    print(f"error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _read_root(args: argparse.Namespace, read: Callable[[Path], T]) -> tuple[Path, T] | str:
    """``(root, read(root))``, or why ROOT cannot be read as a prefill cache."""
    root = Path(args.root)
    if not root.exists():
        return f"{root}: no such directory"
    if not root.is_dir():
        return f"{root}: not a directory"
    try:
        return root, read(root)
    except (FrozenBackboneCacheError, ValueError) as error:
        return str(error)


def _emit(args: argparse.Namespace, payload: dict[str, object], lines: list[str]) -> None:
    if args.json:
        print(json.dumps({"schema_version": SCHEMA_VERSION, **payload}, indent=2, sort_keys=True))
    else:
        print("\n".join(lines))


def cmd_ls(args: argparse.Namespace) -> int:
    read = _read_root(args, lambda root: (infos := list_objects(root), summarize(root, infos=infos)))
    if isinstance(read, str):
        return _fail(args, read)
    _, (infos, summary) = read
    lines = [f"{i.sha256[:16]}  {i.state:9}  {format_bytes(i.bytes):>12}  {i.feature_dtype or '-':8}  "
             f"{(i.schema or '-').rsplit('.', 1)[-1]}{'  legacy' if i.legacy else ''}"
             f"{'  ' + i.problem if i.problem else ''}" for i in infos]
    per_sample = "-" if summary.bytes_per_sample is None else f"{summary.bytes_per_sample:,.0f} B"
    cap = "no size cap" if summary.max_bytes is None else (
        f"cap {format_bytes(summary.max_bytes)}{' (OVER)' if summary.over_cap else ''}")
    lines.append(f"{summary.objects} objects, {format_bytes(summary.bytes)} "
                 f"({format_bytes(summary.debris_bytes)} debris), "
                 f"{per_sample} per sample, {cap}; {summary.legacy} legacy, states {summary.states}")
    _emit(args, {**summary.to_json(), "entries": [i.to_json() for i in infos]}, lines)
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    read = _read_root(args, verify)
    if isinstance(read, str):
        return _fail(args, read)
    root, result = read
    lines = [f"BAD {path}: {problem}" for path, problem in result.failures]
    lines.append(f"{result.checked} objects checked, {len(result.failures)} bad")
    _emit(args, {"root": str(root), "checked": result.checked,
                 "failures": [{"path": p, "problem": m} for p, m in result.failures]}, lines)
    return EXIT_FAILED if result.failures else EXIT_OK


def _older_than_days(args: argparse.Namespace) -> float | None:
    """``--older-than DURATION`` (``tt-cache gc``'s syntax) or ``--older-than-days N``, in days."""
    if args.older_than is not None and args.older_than_days is not None:
        raise ValueError("give --older-than or --older-than-days, not both")
    if args.older_than is not None:
        return parse_duration(args.older_than) / 86400
    if args.older_than_days is not None and not args.older_than_days >= 0:
        raise ValueError(f"--older-than-days must be >= 0, got {args.older_than_days}")
    return args.older_than_days


def cmd_gc(args: argparse.Namespace) -> int:
    try:
        older_than_days = _older_than_days(args)
    except ValueError as error:
        return _fail(args, str(error))
    try:
        max_bytes = parse_size(args.max_size) if args.max_size is not None else max_bytes_from_env()
    except ValueError as error:
        return _fail(args, f"--max-size: {error}")
    read = _read_root(args, lambda root: gc(root, older_than_days=older_than_days, max_bytes=max_bytes,
                                            dry_run=args.dry_run, now=time.time()))
    if isinstance(read, str):
        return _fail(args, read)
    root, result = read
    verb = "would remove" if result.dry_run else "removed"
    cap = "" if max_bytes is None else (
        f", {result.evicted_objects} least recently used beyond {format_bytes(max_bytes)}")
    _emit(args, {"root": str(root), "max_bytes": max_bytes, **result.to_json()},
          [f"{verb} {result.removed_files} files ({format_bytes(result.removed_bytes)}), "
           f"{result.removed_objects} objects{cap}; {format_bytes(result.bytes_before)} -> "
           f"{format_bytes(result.bytes_after)}; {result.skipped_live} objects "
           "have a live writer or producer and were left alone"])
    return EXIT_OK


def add_prefill_commands(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``prefill ls|verify|gc`` to a CLI's subparsers; each sets ``func``."""
    prefill = subparsers.add_parser("prefill", help="the frozen-backbone prefill cache",
                                    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = prefill.add_subparsers(dest="prefill_command", required=True, metavar="ls|verify|gc")
    for name, func, help_text in (
        ("ls", cmd_ls, "objects, bytes, bytes per sample, size cap, schema versions, legacy entries"),
        ("verify", cmd_verify, "re-hash every object against its manifest"),
        ("gc", cmd_gc, "remove debris of dead writers, objects unused for N days, LRU objects beyond a size"),
    ):
        command = commands.add_parser(name, help=help_text)
        command.add_argument("root", metavar="ROOT", help="prefill cache root")
        command.add_argument("--json", action="store_true", help="machine-readable output")
        if name == "gc":
            command.add_argument("--older-than", default=None, metavar="DURATION",
                                 help="also remove objects not used for that long (e.g. 30d, 12h)")
            command.add_argument("--older-than-days", type=float, default=None, metavar="N",
                                 help="the same in days (the earlier spelling)")
            command.add_argument("--max-size", default=None, metavar="SIZE",
                                 help=f"evict least recently used objects until ROOT holds at most SIZE "
                                      f"(e.g. 20G; default ${MAX_SIZE_ENV}, else no cap)")
            command.add_argument("--dry-run", action="store_true", help="remove nothing; say what would go")
        command.set_defaults(func=func)
    return prefill


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # bad usage: exit 2 with one line, never a traceback
        self.print_usage(sys.stderr)
        raise _UsageError(f"{self.prog}: {message}")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _Parser(prog="tt-cache", description="prefill cache commands")
    add_prefill_commands(parser.add_subparsers(dest="command", required=True, parser_class=_Parser))
    try:
        args = parser.parse_args(argv)
    except _UsageError as error:
        return _fail(argparse.Namespace(json="--json" in argv), str(error))
    except SystemExit as exit_:  # --help
        return int(exit_.code or 0)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
