# SPDX-License-Identifier: Apache-2.0
"""``tt-cache prefill ls|verify|gc ROOT``: the prefill cache from the command line.

    prefill ls ROOT [--json]                       objects, bytes, schemas, legacy entries, debris
    prefill verify ROOT [--json]                   re-hash every object; exit 1 naming the bad ones
    prefill gc ROOT [--older-than-days N] [--json] remove dead writers' debris (and unused objects)

Exit status: 0 all good, 1 a check failed, 2 bad usage or input (no such root, not a directory).
Torch-free and ttnn-free: ``add_prefill_commands`` plugs these into any ``argparse`` CLI
(``tt-cache``), ``main`` runs them standalone.
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
from models.common.prefill_cache.maintenance import gc, list_objects, verify

T = TypeVar("T")

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


def _root(args: argparse.Namespace) -> Path | None:
    """The ROOT argument, or None after printing why it cannot be a prefill cache."""
    root = Path(args.root)
    if not root.exists():
        print(f"error: {root}: no such directory", file=sys.stderr)
        return None
    if not root.is_dir():
        print(f"error: {root}: not a directory", file=sys.stderr)
        return None
    return root


def _read_root(args: argparse.Namespace, read: Callable[[Path], T]) -> tuple[Path, T] | None:
    """``(root, read(root))``, or None after printing why ROOT cannot be read as a prefill cache."""
    root = _root(args)
    if root is None:
        return None
    try:
        return root, read(root)
    except FrozenBackboneCacheError as error:
        print(f"error: {error}", file=sys.stderr)
        return None


def _emit(args: argparse.Namespace, payload: dict[str, object], lines: list[str]) -> None:
    print(json.dumps(payload, indent=2, sort_keys=True) if args.json else "\n".join(lines))


def _size(n: int) -> str:
    return f"{n / (1 << 20):,.2f} MiB" if n >= 1 << 20 else f"{n:,} B"


def cmd_ls(args: argparse.Namespace) -> int:
    read = _read_root(args, list_objects)
    if read is None:
        return EXIT_BAD_INPUT
    root, infos = read
    states: dict[str, int] = {}
    schemas: dict[str, int] = {}
    for info in infos:
        states[info.state] = states.get(info.state, 0) + 1
        if info.schema:
            schemas[info.schema] = schemas.get(info.schema, 0) + 1
    summary = {"root": str(root), "objects": sum(1 for i in infos if i.state == "complete"),
               "bytes": sum(i.bytes for i in infos), "debrisBytes": sum(i.debris_bytes for i in infos),
               "legacy": sum(1 for i in infos if i.legacy), "states": states, "schemas": schemas}
    lines = [f"{i.sha256[:16]}  {i.state:9}  {_size(i.bytes):>12}  "
             f"{(i.schema or '-').rsplit('.', 1)[-1]}{'  legacy' if i.legacy else ''}"
             f"{'  ' + i.problem if i.problem else ''}" for i in infos]
    lines.append(f"{summary['objects']} objects, {_size(summary['bytes'])} ({_size(summary['debrisBytes'])} debris), "
                 f"{summary['legacy']} legacy, states {states}, schemas {schemas}")
    _emit(args, {**summary, "entries": [i.to_json() for i in infos]}, lines)
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    read = _read_root(args, verify)
    if read is None:
        return EXIT_BAD_INPUT
    root, result = read
    lines = [f"BAD {path}: {problem}" for path, problem in result.failures]
    lines.append(f"{result.checked} objects checked, {len(result.failures)} bad")
    _emit(args, {"root": str(root), "checked": result.checked,
                 "failures": [{"path": p, "problem": m} for p, m in result.failures]}, lines)
    return EXIT_FAILED if result.failures else EXIT_OK


def cmd_gc(args: argparse.Namespace) -> int:
    if args.older_than_days is not None and not args.older_than_days >= 0:
        print(f"error: --older-than-days must be >= 0, got {args.older_than_days}", file=sys.stderr)
        return EXIT_BAD_INPUT
    read = _read_root(args, lambda root: gc(root, older_than_days=args.older_than_days, now=time.time()))
    if read is None:
        return EXIT_BAD_INPUT
    root, result = read
    payload = {"root": str(root), "removedFiles": result.removed_files, "removedBytes": result.removed_bytes,
               "removedObjects": result.removed_objects, "skippedLiveWriters": result.skipped_live}
    _emit(args, payload, [f"removed {result.removed_files} files ({_size(result.removed_bytes)}), "
                          f"{result.removed_objects} unused objects; {result.skipped_live} objects have a live "
                          "writer and were left alone"])
    return EXIT_OK


def add_prefill_commands(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``prefill ls|verify|gc`` to a CLI's subparsers; each sets ``func``."""
    prefill = subparsers.add_parser("prefill", help="the frozen-backbone prefill cache",
                                    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = prefill.add_subparsers(dest="prefill_command", required=True, metavar="ls|verify|gc")
    for name, func, help_text in (
        ("ls", cmd_ls, "objects, bytes, schema versions, legacy entries"),
        ("verify", cmd_verify, "re-hash every object against its manifest"),
        ("gc", cmd_gc, "remove debris of dead writers (and objects unused for N days)"),
    ):
        command = commands.add_parser(name, help=help_text)
        command.add_argument("root", metavar="ROOT", help="prefill cache root")
        command.add_argument("--json", action="store_true", help="machine-readable output")
        if name == "gc":
            command.add_argument("--older-than-days", type=float, default=None, metavar="N",
                                 help="also remove objects not used for N days")
        command.set_defaults(func=func)
    return prefill


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # bad usage: exit 2 with one line, never a traceback
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(prog="tt-cache", description="prefill cache commands")
    add_prefill_commands(parser.add_subparsers(dest="command", required=True, parser_class=_Parser))
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
