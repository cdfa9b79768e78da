# SPDX-License-Identifier: Apache-2.0
"""Every environment variable the project reads, in one table (after vLLM's ``envs.py``).

Read them as attributes, ``envs.TT_CACHE_PATH``: each read consults ``os.environ`` anew, so a test
or a parent process that sets a variable is seen at once, and no module keeps a stale copy.
``describe()`` prints the table (``tt-cache env``).

**Typed in the table.** Every variable declares its kind and default here (:class:`Text`,
:class:`Flag`, :class:`WholeNumber`, :class:`Size`, :class:`Choice`, :class:`ThreadCounts`,
:class:`PathValue`, :class:`StoreUrl`, :class:`MeshName`), and the one rule for reading it lives
there: every read parses it, and a value outside what it accepts is a :class:`BadValue` naming the
variable and what it accepts (``TT_HOST_THREADS='eight': expected a whole number from 1 to
1024``), never a silent default. :func:`check` reads them all: every entry point (``tt-cache``,
its ``build`` and ``seed`` included, the demos, the vLLM plugin, the loaders) calls it before any work, so
a bad value is refused at once (exit 2 from a command line), never midway. The Python arguments
the variables stand in for (a loader's ``workers=``, ``prefetch=``) are checked by the same
declaration (:meth:`WholeNumber.check`), so both accept the same values.

Variables owned by other programs (the Hugging Face hub's, ttnn's, OpenMP's) are read here by their
owners' rules, so the project agrees with them about where things are.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_REPO_ROOT = Path(__file__).resolve().parents[2]

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off", ""})


def parse_flag(text: str | None) -> bool:
    """The one lenient reading of an on/off word: ``1``, ``true``, ``yes`` or ``on`` in any case is
    on, anything else off (for switches whose name a caller chooses; the table's flags are strict)."""
    return (text or "").strip().lower() in TRUE_WORDS


def flag(name: str) -> bool:
    """Whether the on/off variable ``name`` is on: the table's :class:`Flag` when it declares
    ``name`` (a bad value is refused), else :func:`parse_flag` (a loader's own ``force_env``)."""
    variable = ENVIRONMENT_VARIABLES.get(name)
    if variable is not None and isinstance(variable.kind, Flag):
        return bool(variable.read())
    return parse_flag(os.environ.get(name))


def raw(name: str) -> str:
    """The text of ``name`` as set (empty when unset), for messages that quote what the user set."""
    return os.environ.get(name, "").strip()


def _user_cache_home() -> Path:
    """``$XDG_CACHE_HOME``, else ``~/.cache`` (the XDG rule the hub and pip follow too)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")


def _hub_cache() -> Path:
    """The Hugging Face hub cache by ``huggingface_hub.constants``' own rule, read when asked:
    ``$HF_HUB_CACHE``, else the legacy ``$HUGGINGFACE_HUB_CACHE``, else ``$HF_HOME/hub`` where
    ``$HF_HOME`` defaults to ``$XDG_CACHE_HOME/huggingface``; ``~`` and ``$VARS`` expanded, a set but
    empty variable taken as set, all as the library does (a test holds this against its constants
    in fresh processes)."""
    def expand(path: str) -> str:
        return os.path.expandvars(os.path.expanduser(path))

    xdg = os.environ.get("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache"))
    home = expand(os.environ.get("HF_HOME", os.path.join(xdg, "huggingface")))
    legacy = os.environ.get("HUGGINGFACE_HUB_CACHE", os.path.join(home, "hub"))
    return Path(expand(os.environ.get("HF_HUB_CACHE", legacy)))


class BadValue(ValueError):
    """A variable or argument outside what it accepts: one line naming it and what it accepts
    (the CLI's exit 2, a ``ValueError`` from the Python API)."""


def _refuse(name: str, text: str, accepts: str) -> BadValue:
    return BadValue(f"{name}={text!r}: expected {accepts}")


# --------------------------------------------------------------------------------------------
# Kinds: what a variable accepts, and its value when unset or empty
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Text:
    """Any text (another program's variable the project passes on or quotes)."""

    default: str | None = ""
    accepts = "any text"

    def parse(self, name: str, text: str | None) -> str | None:
        return text if text else self.default


@dataclass(frozen=True)
class Flag:
    """On (``1``, ``true``, ``yes``, ``on``) or off (``0``, ``false``, ``no``, ``off``), any case."""

    default: bool = False
    accepts = "1/true/yes/on or 0/false/no/off"

    def parse(self, name: str, text: str | None) -> bool:
        word = (text or "").strip().lower()
        if not word:
            return self.default
        if word in TRUE_WORDS:
            return True
        if word in FALSE_WORDS:
            return False
        raise _refuse(name, text or "", self.accepts)


@dataclass(frozen=True)
class WholeNumber:
    """A count: a whole number from ``low`` to ``high``; unset or empty is ``default`` (None: the
    reader's own default, ``unset`` says which)."""

    low: int
    high: int
    default: int | None
    unset: str  # what unset means, for the help and the error lines
    meaning: str = ""  # what particular values mean ("0: off")

    @property
    def accepts(self) -> str:
        extra = f"; {self.meaning}" if self.meaning else ""
        return f"a whole number from {self.low} to {self.high} ({self.unset}{extra})"

    def parse(self, name: str, text: str | None) -> int | None:
        """The value of variable ``name`` set to ``text``."""
        text = (text or "").strip()
        if not text:
            return self.default
        if not (text.isascii() and text.isdigit()) or not self.low <= int(text) <= self.high:
            raise _refuse(name, text, self.accepts)
        return int(text)

    def check(self, what: str, value: object) -> int:
        """``value`` of the argument ``what`` (``workers=``), accepted as the variable's value is:
        an ``int`` in range (not a bool, not a float)."""
        if type(value) is not int or not self.low <= value <= self.high:
            raise BadValue(f"{what}{value!r}: expected {self.accepts}")
        return value


@dataclass(frozen=True)
class Size:
    """A size in bytes as ``du -h`` prints it (``512K``, ``64M``, ``20G``; :mod:`models.common.units`)."""

    default: int | None = None
    accepts = "a size: a number with an optional K/M/G/T/P unit (e.g. 64M, 20G)"

    def parse(self, name: str, text: str | None) -> int | None:
        from models.common.units import parse_size

        if not (text or "").strip():
            return self.default
        try:
            return parse_size(text)
        except ValueError:
            raise _refuse(name, text, self.accepts) from None


@dataclass(frozen=True)
class Choice:
    """One of ``choices`` (any case; the value is the choice as declared)."""

    choices: tuple[str, ...]
    default: str

    @property
    def accepts(self) -> str:
        return f"one of {', '.join(self.choices)} (unset: {self.default})"

    def parse(self, name: str, text: str | None) -> str:
        word = (text or "").strip()
        if not word:
            return self.default
        for choice in self.choices:
            if word.lower() == choice.lower():
                return choice
        raise _refuse(name, text or "", self.accepts)


@dataclass(frozen=True)
class PathValue:
    """A path (``~`` expanded); unset or empty is ``default()`` (None: none)."""

    default: Callable[[], Path] | None = None
    accepts = "a path"

    def parse(self, name: str, text: str | None) -> Path | None:
        if text:
            return Path(text).expanduser()
        return self.default() if self.default is not None else None


@dataclass(frozen=True)
class StoreUrl:
    """A URL of one of ``schemes`` with a host (``s3://BUCKET``, ``http://HOST``), or where
    ``directories`` a directory (a path or ``file://``); unset or empty is none (``""``)."""

    schemes: tuple[str, ...]
    directories: bool = False

    @property
    def accepts(self) -> str:
        forms = [f"{scheme}://HOST..." if scheme != "s3" else "s3://BUCKET[/PREFIX]" for scheme in self.schemes]
        return " or ".join([", ".join(forms), *(["a directory"] if self.directories else [])])

    def parse(self, name: str, text: str | None) -> str:
        url = (text or "").strip()
        if not url:
            return ""
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme in self.schemes and parsed.netloc:
            return url
        if self.directories and (parsed.scheme == "file" or (not parsed.scheme and not parsed.netloc)):
            return url
        raise _refuse(name, url, self.accepts)


@dataclass(frozen=True)
class MeshName:
    """A mesh as tt-metal names it (``N150``, ``T3K``, ...) or ``RxC``; the value is ``(rows, cols)``,
    None when unset (:func:`models.common.mesh.parse_mesh_shape`, the one reading of a mesh name)."""

    @property
    def accepts(self) -> str:
        from models.common.mesh import KNOWN_MESHES, MESH_ALIASES

        return f"RxC or one of {', '.join([*KNOWN_MESHES, *MESH_ALIASES])}"

    def parse(self, name: str, text: str | None) -> tuple[int, int] | None:
        from models.common.mesh import MeshError, parse_mesh_shape

        if not (text or "").strip():
            return None
        try:
            return parse_mesh_shape(text)
        except MeshError:
            raise _refuse(name, text, self.accepts) from None


@dataclass(frozen=True)
class ThreadCounts:
    """OpenMP's ``OMP_NUM_THREADS``: positive counts, one per nesting level (``4`` or ``4,2``); the
    value is the first level's, None when unset."""

    accepts = "a positive whole number, or a comma-separated list of them (OpenMP's form, e.g. 4,2)"

    def parse(self, name: str, text: str | None) -> int | None:
        text = (text or "").strip()
        if not text:
            return None
        levels = [level.strip() for level in text.split(",")]
        if not all(level.isascii() and level.isdigit() and int(level) >= 1 for level in levels):
            raise _refuse(name, text, self.accepts)
        return int(levels[0])


Kind = Text | Flag | WholeNumber | Size | Choice | PathValue | StoreUrl | MeshName | ThreadCounts


@dataclass(frozen=True)
class EnvVar:
    name: str
    kind: Kind
    help: str
    reader: Callable[[], Any] | None = None  # another program's own rule for its variable

    def read(self) -> Any:
        if self.reader is not None:
            return self.reader()
        return self.kind.parse(self.name, os.environ.get(self.name))


MAX_CONVERT_WORKERS = 256  # a worker holds about 0.5 GB at 70B shapes: far past any host's memory
MAX_PREFETCH_THREADS = 64  # streams at once: past this a disk only seeks
MAX_HOST_THREADS = 1024
MAX_LRU_ENTRIES = 1 << 20
CONVERT_WORKERS = WholeNumber(0, MAX_CONVERT_WORKERS, None, "unset: one per CPU", "0 or 1: one worker")
PREFETCH_THREADS = WholeNumber(0, MAX_PREFETCH_THREADS, 4, "unset: 4", "0: off")
REMOTE_RETRY_S = WholeNumber(0, 3600, 30, "unset: 30", "0: no retry")
HOST_THREADS = WholeNumber(1, MAX_HOST_THREADS, 1, "unset: 1")
BASE_FORWARD_CACHE_ENTRIES = WholeNumber(1, MAX_LRU_ENTRIES, 512, "unset: 512")
MOCK_BOARDS = ("n150", "p150")


def _table(*variables: EnvVar) -> dict[str, EnvVar]:
    return {variable.name: variable for variable in variables}


ENVIRONMENT_VARIABLES: dict[str, EnvVar] = _table(
    # -- the weight cache ---------------------------------------------------------------------
    EnvVar("TT_CACHE_PATH", PathValue(lambda: _user_cache_home() / "tt-warm-loaders"),
           "root of the ttnn weight cache (default ~/.cache/tt-warm-loaders)"),
    EnvVar("TT_TRANSFORMERS_FORCE_MODEL_LOAD", Flag(False),
           "every load builds cold, as if no cache existed (tt-metal's name; loaders also take force=)"),
    EnvVar("TT_CONVERT_WORKERS", CONVERT_WORKERS,
           "threads converting a cold build's weights, at most one per unit of work (loaders also take workers=)"),
    EnvVar("TT_PREFETCH_THREADS", PREFETCH_THREADS,
           "threads reading a warm cache's files ahead of use (loaders also take prefetch=)"),
    EnvVar("TT_CACHE_REMOTE", StoreUrl(("s3", "http", "https"), directories=True),
           "a shared store of warm caches (s3://BUCKET/PREFIX, an http(s) mirror or a directory): a cold load first "
           "pulls its exact variant from it, a cache-only deploy the newest of its model id (tt-cache push fills it)"),
    EnvVar("TT_CACHE_REMOTE_PUSH", Flag(False),
           "a cold build that completes its cache pushes the new variant to $TT_CACHE_REMOTE (a failed push is one "
           "warning; the local cache stays warm)"),
    EnvVar("TT_CACHE_REMOTE_RETRY_S", REMOTE_RETRY_S,
           "seconds an object transfer to or from a shared store that stopped answering is retried, with backoff "
           "from 0.5 s doubling to 8 s, before it fails"),
    EnvVar("AWS_ENDPOINT_URL", StoreUrl(("http", "https")),
           "the S3 endpoint of s3:// stores (boto3's variable; credentials come only from the standard AWS chain and "
           "are never shown)"),
    EnvVar("TT_USER_STATE", PathValue(lambda: _user_cache_home() / "tt-warm-loaders-state"),
           "per-user state kept outside shared caches: stamps, locks and use records where a cache is read-only"),
    # -- tools --------------------------------------------------------------------------------
    EnvVar("TT_CACHE_DEBUG", Flag(False), "tt-cache prints the traceback of an internal error"),
    EnvVar("TT_MODEL_DATA", PathValue(), "where prepared real checkpoints live (default <repo>/model_data)"),
    EnvVar("GITHUB_STEP_SUMMARY", PathValue(),
           "set by GitHub Actions: tt-cache seed appends its statistics there (Markdown)"),
    EnvVar("GITHUB_OUTPUT", PathValue(),
           "set by GitHub Actions: tt-cache seed appends cache-hit, warm, cold, built, failed"),
    EnvVar("TT_VENV", PathValue(lambda: _REPO_ROOT / ".venv"),
           "the default environment (transformers' reference for the vLLM tests; default <repo>/.venv)"),
    EnvVar("TT_VLLM_VENV", PathValue(lambda: _REPO_ROOT / ".venv-vllm"),
           "the vLLM environment scripts/setup_vllm_env.sh builds (default <repo>/.venv-vllm)"),
    EnvVar("TT_GGUF_CACHE", PathValue(lambda: _user_cache_home() / "tt-warm-loaders-gguf"),
           "where split GGUFs of the real models are assembled, shared by every model root"),
    # -- the prefill cache and resynthesis -------------------------------------------------------
    EnvVar("TT_PREFILL_CACHE_MAX_SIZE", Size(None),
           "size cap of the prefill cache (e.g. 20G): producers evict LRU beyond it (unset: no cap)"),
    EnvVar("NNF_RESYNTHESIS_BASE_FORWARD_CACHE", Flag(True), "the in-memory prefill LRU on or off (the seed's name)"),
    EnvVar("NNF_RESYNTHESIS_BASE_FORWARD_CACHE_ENTRIES", BASE_FORWARD_CACHE_ENTRIES,
           "entries of the in-memory prefill LRU (the seed's name)"),
    EnvVar("TT_CPU_SHARE_DIR", PathValue(), "where trainers on one host register to share the CPUs (default: a per-user dir)"),
    EnvVar("OMP_NUM_THREADS", ThreadCounts(), "OpenMP's thread count: host forwards use at most this many"),
    # -- vLLM ------------------------------------------------------------------------------------
    EnvVar("TT_VLLM_HOST_PLATFORM", Flag(True), "off: leave the platform choice to vLLM"),
    EnvVar("TT_VLLM_FORWARD_SIGNALS", Flag(True), "off: do not forward the engine core's SIGTERM to its main thread"),
    EnvVar("TT_VLLM_FREEZE_AT_EXIT", Flag(True), "off: do not freeze the heap at exit"),
    EnvVar("TT_HOST_THREADS", HOST_THREADS, "torch threads of the vLLM worker's host forward"),
    EnvVar("MESH_DEVICE", MeshName(), "tt-metal's mesh name (N150, N300, T3K, TG, ...) a vLLM model is laid out for"),
    EnvVar("HF_MODEL", Text(), "tt-metal's checkpoint override; honoured by vLLM only for the model it was asked for"),
    EnvVar("MODEL_WEIGHTS_DIR", Text(), "like HF_MODEL"),
    # -- the host (no card) ---------------------------------------------------------------------
    EnvVar("TT_METAL_MOCK_CLUSTER_DESC_PATH", Text(None),
           "ttnn's mock cluster descriptor (set by the project when no card is present)"),
    EnvVar("LOGURU_LEVEL", Text(), "loguru's stderr level (loguru's own variable); the project defaults it to INFO, the "
           "tools to WARNING unless --verbose; DEBUG shows ttnn's CONFIG banner at import"),
    EnvVar("TT_LOGGER_LEVEL", Text(), "ttnn's and UMD's C++ log level (tt-metal's variable); the tools set error unless "
           "--verbose: no mock cluster / device driver lines"),
    EnvVar("HF_HUB_DISABLE_PROGRESS_BARS", Text(), "1: no hub or transformers progress bars (the hub's variable); the "
           "tools set it unless --verbose"),
    EnvVar("TRANSFORMERS_VERBOSITY", Text(), "transformers' log level (its variable); the tools set error unless --verbose"),
    EnvVar("VLLM_LOGGING_LEVEL", Text(), "vLLM's log level (its variable); the vLLM example sets WARNING unless --verbose"),
    EnvVar("TT_OUTPUT_DEFAULTS", Text(), "set by the project: which of the output variables above it set itself (a "
           "child tells them from the user's, which always win)"),
    EnvVar("TT_MOCK_BOARD", Choice(MOCK_BOARDS, "n150"), "which shipped mock cluster to use: n150 (Wormhole) or p150 (Blackhole)"),
    # -- the Hugging Face hub (its rules) --------------------------------------------------------
    EnvVar("HF_HUB_CACHE", PathValue(), "the hub cache holding models--org--name/snapshots (hub rules: HF_HUB_CACHE, "
           "HF_HOME, XDG_CACHE_HOME)", _hub_cache),
    EnvVar("XDG_CACHE_HOME", PathValue(), "the user's cache home (default ~/.cache)", _user_cache_home),
)

def __getattr__(name: str) -> Any:
    variable = ENVIRONMENT_VARIABLES.get(name)
    if variable is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return variable.read()


def __dir__() -> list[str]:
    return sorted(ENVIRONMENT_VARIABLES)


def check() -> None:
    """Read every variable: the first bad value is a :class:`BadValue` (every entry point calls it
    before any work, so a bad value is refused at once, never midway)."""
    for variable in ENVIRONMENT_VARIABLES.values():
        variable.read()


def check_or_exit() -> None:
    """:func:`check` for a command line: a bad value is one line on stderr and exit 2 (no traceback)."""
    try:
        check()
    except BadValue as error:
        import sys

        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None


def describe() -> list[tuple[str, str, str]]:
    """(name, current value, what it does and accepts) for every variable; a bad value is shown with why."""
    return [(name, _shown(variable), _help(variable)) for name, variable in ENVIRONMENT_VARIABLES.items()]


def _help(variable: EnvVar) -> str:
    return variable.help if isinstance(variable.kind, (Text, PathValue)) or variable.reader else f"{variable.help}: {variable.kind.accepts}"


def _shown(variable: EnvVar) -> str:
    try:
        value = variable.read()
    except BadValue as error:
        return f"refused: {error}"
    return "" if value is None else str(value)  # unset without a default: the reader's own
