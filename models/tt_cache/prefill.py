# SPDX-License-Identifier: Apache-2.0
"""``tt-cache prefill ls|verify|gc ROOT``: the prefill cache from the command line.

    prefill ls ROOT [--json]                      objects, bytes, bytes per sample, size cap, debris
    prefill verify ROOT [--json]                  re-hash every object; exit 1 naming the bad ones
    prefill gc ROOT [--older-than 30d] [--max-size SIZE] [--dry-run] [--json]
                                                  dead writers' debris, objects unused that long, least
                                                  recently used objects beyond SIZE (e.g. 20G)

The commands are ``tt-cache`` commands like the others: the same exit codes, one-line errors,
``--json`` documents and ``--verbose`` (:mod:`models.tt_cache.common`), and durations and sizes
spelled as in ``tt-cache gc`` (``30d``, ``12h``; ``20G``), parsed by the same functions. ``ls``
shows the size cap producers are given by ``TT_PREFILL_CACHE_MAX_SIZE``; ``gc`` applies it when
``--max-size`` is not given. Torch-free and ttnn-free; the prefill cache itself is imported only
when a command runs.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from models.common.units import format_bytes, parse_size
from models.tt_cache.common import EXIT_FAILED, EXIT_OK, CliError, add_command, emit, existing_dir
from models.tt_cache.humanize import parse_duration

T = TypeVar("T")

def _read(args: argparse.Namespace, read: Callable[[Path], T]) -> tuple[Path, T]:
    """``(ROOT, read(ROOT))``; a ROOT that is not a readable prefill cache is bad input."""
    from models.common.prefill_cache.layout import FrozenBackboneCacheError

    root = existing_dir(args.root)
    try:
        return root, read(root)
    except (FrozenBackboneCacheError, ValueError) as error:
        raise CliError(str(error)) from None


def cmd_ls(args: argparse.Namespace) -> int:
    from models.common.prefill_cache.maintenance import list_objects, summarize

    _, (infos, summary) = _read(args, lambda root: (infos := list_objects(root), summarize(root, infos=infos)))
    lines = [f"{i.sha256[:16]}  {i.state:9}  {format_bytes(i.bytes):>12}  {i.feature_dtype or '-':8}  "
             f"{(i.schema or '-').rsplit('.', 1)[-1]}{'  legacy' if i.legacy else ''}"
             f"{'  ' + i.problem if i.problem else ''}" for i in infos]
    per_sample = "-" if summary.bytes_per_sample is None else f"{summary.bytes_per_sample:,.0f} B"
    cap = "no size cap" if summary.max_bytes is None else (
        f"cap {format_bytes(summary.max_bytes)}{' (OVER)' if summary.over_cap else ''}")
    lines.append(f"{summary.objects} objects, {format_bytes(summary.bytes)} "
                 f"({format_bytes(summary.debris_bytes)} debris), "
                 f"{per_sample} per sample, {cap}; {summary.legacy} legacy, states {summary.states}")
    emit(args, {**summary.to_json(), "entries": [i.to_json() for i in infos]}, lines)
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    from models.common.prefill_cache.maintenance import verify

    root, result = _read(args, verify)
    lines = [f"BAD {path}: {problem}" for path, problem in result.failures]
    lines.append(f"{result.checked} objects checked, {len(result.failures)} bad")
    emit(args, {"root": str(root), "checked": result.checked,
                "failures": [{"path": p, "problem": m} for p, m in result.failures]}, lines)
    return EXIT_FAILED if result.failures else EXIT_OK


def cmd_gc(args: argparse.Namespace) -> int:
    from models.common.prefill_cache.maintenance import gc, max_bytes_from_env

    if args.older_than_days is not None:
        raise CliError(f"--older-than-days is now --older-than {args.older_than_days}d (tt-cache gc's syntax)")
    try:
        older_than_days = parse_duration(args.older_than) / 86400 if args.older_than is not None else None
        max_bytes = parse_size(args.max_size) if args.max_size is not None else max_bytes_from_env()
    except ValueError as error:
        raise CliError(str(error)) from None
    root, result = _read(args, lambda root: gc(root, older_than_days=older_than_days, max_bytes=max_bytes,
                                               dry_run=args.dry_run, now=time.time()))
    verb = "would remove" if result.dry_run else "removed"
    cap = "" if max_bytes is None else (
        f", {result.evicted_objects} least recently used beyond {format_bytes(max_bytes)}")
    emit(args, {"root": str(root), "max_bytes": max_bytes, **result.to_json()},
         [f"{verb} {result.removed_files} files ({format_bytes(result.removed_bytes)}), "
          f"{result.removed_objects} objects{cap}; {format_bytes(result.bytes_before)} -> "
          f"{format_bytes(result.bytes_after)}; {result.skipped_live} objects "
          "have a live writer or producer and were left alone"])
    return EXIT_OK


def add_prefill_commands(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``prefill ls|verify|gc`` under a ``tt-cache`` parser's subcommands."""
    prefill = sub.add_parser("prefill", help="the frozen-backbone prefill cache: ls, verify, gc",
                             description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = prefill.add_subparsers(dest="prefill_command", required=True, metavar="ls|verify|gc")
    added: dict[str, argparse.ArgumentParser] = {}
    for name, run, help_text in (
        ("ls", cmd_ls, "objects, bytes, bytes per sample, size cap, schema versions, legacy entries"),
        ("verify", cmd_verify, "re-hash every object against its manifest"),
        ("gc", cmd_gc, "remove debris of dead writers, objects unused that long, LRU objects beyond a size"),
    ):
        added[name] = add_command(commands, name, run, help_text)
        added[name].add_argument("root", metavar="ROOT", help="prefill cache root")
    gc = added["gc"]
    gc.add_argument("--older-than", default=None, metavar="DURATION",
                    help="also remove objects not used for that long (e.g. 30d, 12h)")
    gc.add_argument("--older-than-days", default=None, help=argparse.SUPPRESS)  # the earlier spelling: a clear error
    gc.add_argument("--max-size", default=None, metavar="SIZE",
                    help="evict least recently used objects until ROOT holds at most SIZE "
                         "(e.g. 20G; default $TT_PREFILL_CACHE_MAX_SIZE, else no cap)")
    gc.add_argument("--dry-run", action="store_true", help="remove nothing; say what would go")
    return prefill
