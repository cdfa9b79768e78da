# SPDX-License-Identifier: Apache-2.0
"""The small files beside a cache's weights (markers, generation records, stamp indexes, use
records) are data: whoever can write the cache can put anything there, so one reader decides
how they are read, and every caller asks it.

* **Regular files only**, opened ``O_NONBLOCK`` and checked with ``fstat``
  (:func:`models.common.fileio.open_regular`): a FIFO, a device or a socket where a record is
  expected is refused at once instead of blocking the reader forever.
* **Bounded**: at most ``max_bytes`` are read, and JSON nested deeper than ``max_depth`` is refused
  before it is parsed (the parser would recurse once per level). A large document whose every
  field its caller validates (a marker) may pass ``max_depth=None``: the parser's own recursion
  guard then bounds it, and its free-form parts are checked with :func:`depth_within`.
* **Finite numbers**: ``NaN``, ``Infinity`` and numbers that overflow a float (``1e999``) are
  refused while parsing (ints are bounded by Python's digit limit); each caller range-checks its
  fields.

A file that is absent is ``None``; one that is refused is ``None`` with a warning naming it and
the problem. Nothing here raises: a bad side file only ever means "cold" (or "not recorded").
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Any

from loguru import logger

from models.common.fileio import read_regular

DEFAULT_MAX_DEPTH = 32

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)  # unrolled: one match per string, not per byte
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
_EMPTY_PAIR = re.compile(rb"\[\]|\{\}")


class SideFileError(ValueError):
    """A side file's bytes are not what its reader accepts; the message says why."""


def nesting_exceeds(raw: bytes, max_depth: int) -> bool:
    """Whether the JSON text ``raw`` nests arrays and objects deeper than ``max_depth`` (or its
    brackets do not pair up). Strings are dropped, then innermost pairs removed once per level,
    all in the regex engine: no recursion, and linear passes even for a hostile file."""
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    for _ in range(max_depth):
        if not brackets:
            return False
        brackets, removed = _EMPTY_PAIR.subn(b"", brackets)
        if not removed:
            return True  # unpaired: not JSON (the parser would say so too)
    return bool(brackets)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise SideFileError(f"number {text[:20]} is out of range")
    return value


def _no_constant(name: str) -> None:
    raise SideFileError(f"non-standard JSON constant {name}")


def parse_json(raw: bytes, max_depth: int | None = DEFAULT_MAX_DEPTH) -> Any:
    """Parse bounded JSON (see the module doc); raise :class:`SideFileError` saying why not."""
    if max_depth is not None and nesting_exceeds(raw, max_depth):
        raise SideFileError(f"nested deeper than {max_depth} levels")
    try:
        return json.loads(raw.decode("utf-8"), parse_float=_finite_float, parse_constant=_no_constant)
    except SideFileError:
        raise
    except RecursionError:
        raise SideFileError("nested deeper than the JSON parser recurses") from None
    except (UnicodeDecodeError, ValueError) as error:
        raise SideFileError(f"not UTF-8 JSON: {error}") from None


def depth_within(value: Any, max_depth: int) -> bool:
    """Whether a parsed JSON value nests at most ``max_depth`` arrays and objects (a walk that
    stops at the limit: for the small free-form parts of a document)."""
    level, depth = [value], 0
    while level:
        containers = [item for item in level if isinstance(item, (dict, list))]
        if not containers:
            return True
        depth += 1
        if depth > max_depth:
            return False
        level = [child for item in containers for child in (item.values() if isinstance(item, dict) else item)]
    return True


def read_side_file(path: str | os.PathLike, max_bytes: int, *, follow_symlinks: bool = True) -> bytes | None:
    """The bytes of a regular side file of at most ``max_bytes``; None when absent, or (with a
    warning) when it is not a regular file, too large or unreadable."""
    try:
        return read_regular(path, max_bytes, follow_symlinks=follow_symlinks)
    except FileNotFoundError:
        return None
    except OSError as error:
        logger.warning(f"{os.fspath(path)}: {error.strerror or error}; ignored")
        return None


def read_json_document(path: str | os.PathLike, max_bytes: int, max_depth: int = DEFAULT_MAX_DEPTH, *,
                       follow_symlinks: bool = True) -> Any | None:
    """The parsed JSON of a side file; None when absent, or (with a warning) when refused."""
    raw = read_side_file(path, max_bytes, follow_symlinks=follow_symlinks)
    if raw is None:
        return None
    try:
        return parse_json(raw, max_depth)
    except SideFileError as error:
        logger.warning(f"{os.fspath(path)}: {error}; ignored")
        return None


def read_json_record(path: str | os.PathLike, max_bytes: int, max_depth: int = DEFAULT_MAX_DEPTH, *,
                     follow_symlinks: bool = True) -> dict[str, Any] | None:
    """:func:`read_json_document` of a file that must hold one JSON object."""
    body = read_json_document(path, max_bytes, max_depth, follow_symlinks=follow_symlinks)
    if body is not None and not isinstance(body, dict):
        logger.warning(f"{os.fspath(path)}: not a JSON object; ignored")
        return None
    return body


def bounded_int(value: Any, low: int, high: int) -> bool:
    """Whether ``value`` is an int (not a bool, not a float) in ``[low, high]``."""
    return type(value) is int and low <= value <= high
