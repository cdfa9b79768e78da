# SPDX-License-Identifier: Apache-2.0
"""What every ``tt-cache`` command shares: exit codes, the one-line error, ``--json`` output and
the small argument types. Torch- and ttnn-free (``ls``, ``check``, ``gc``, ``clean`` stay light)."""

from __future__ import annotations

import argparse
import json
import signal
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
EXIT_CLOSED_PIPE = 128 + signal.SIGPIPE
SCHEMA_VERSION = 1  # of every --json document; bumped when a key changes meaning


class CliError(Exception):
    """Bad usage or bad input: printed as one line naming the file and the problem, exit 2.
    ``document``: what the command had to say besides the error, for ``--json``."""

    exit_code = EXIT_BAD_INPUT
    document: dict[str, Any] | None = None


def add_command(sub: argparse._SubParsersAction, name: str, run: Callable[[argparse.Namespace], int],
                help_text: str) -> argparse.ArgumentParser:
    """One ``tt-cache`` command (``prefill``'s included): the ``--json`` and ``--verbose`` every
    command takes, and ``run``, called with the parsed arguments."""
    command = sub.add_parser(name, help=help_text, description=help_text)
    command.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    command.add_argument("--verbose", action="store_true", help="also ttnn's and UMD's native log lines, progress "
                         "bars and INFO logs (quiet by default: models.common.device_env.set_output)")
    command.set_defaults(run=run)
    return command


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


def table(rows: Sequence[Sequence[Any]]) -> list[str]:
    """Left-aligned columns two spaces apart (``hf cache scan`` style)."""
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
