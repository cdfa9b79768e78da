# SPDX-License-Identifier: Apache-2.0
"""Every environment variable the project reads, in one table (after vLLM's ``envs.py``).

Read them as attributes, ``envs.TT_CACHE_PATH``: each read consults ``os.environ`` anew, so a test
or a parent process that sets a variable is seen at once, and no module keeps a stale copy.
``describe()`` prints the table (``tt-cache env``).

A variable whose value is a count declares its type in the table (:class:`WholeNumber`: the range
it accepts and what unset means), and the one rule for it lives there: every read parses it, and a
value outside it is a :class:`BadValue` naming the variable and what it accepts, never a silent
default. The Python arguments the variables stand in for (a loader's ``workers=``, ``prefetch=``)
are checked by the same declaration (:meth:`WholeNumber.check`), so both accept the same values.

Variables owned by other programs (the Hugging Face hub's, ttnn's) are read here by their owners'
rules, so the project agrees with them about where things are.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_REPO_ROOT = Path(__file__).resolve().parents[2]

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})


def parse_flag(text: str | None) -> bool:
    """The one reading of an on/off variable: ``1``, ``true``, ``yes`` or ``on`` in any case is on,
    anything else (unset, empty, ``0``, ``no``) off; ``tt-cache env`` shows what the code acts on."""
    return (text or "").strip().lower() in TRUE_WORDS


def flag(name: str) -> bool:
    """Whether the on/off variable ``name`` is on (for switches whose name a caller may choose,
    as the loaders' ``force_env``; the table's own flags read the same as attributes)."""
    return parse_flag(os.environ.get(name))


def _flag(name: str) -> Callable[[], bool]:
    return lambda: flag(name)


def _text(name: str, default: str | None = None) -> Callable[[], str | None]:
    return lambda: os.environ.get(name) or default


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
            raise BadValue(f"{name}={text!r}: expected {self.accepts}")
        return int(text)

    def check(self, what: str, value: object) -> int:
        """``value`` of the argument ``what`` (``workers=``), accepted as the variable's value is:
        an ``int`` in range (not a bool, not a float)."""
        if type(value) is not int or not self.low <= value <= self.high:
            raise BadValue(f"{what}{value!r}: expected {self.accepts}")
        return value


def _whole_number(name: str, kind: WholeNumber) -> Callable[[], int | None]:
    return lambda: kind.parse(name, os.environ.get(name))


@dataclass(frozen=True)
class EnvVar:
    read: Callable[[], Any]
    help: str
    kind: WholeNumber | None = None  # a typed variable: read() parses (and refuses) by it

    @classmethod
    def count(cls, name: str, kind: WholeNumber, help: str) -> EnvVar:
        """A count variable: its help ends with what it accepts."""
        return cls(_whole_number(name, kind), f"{help}: {kind.accepts}", kind)


MAX_CONVERT_WORKERS = 256  # a worker holds about 0.5 GB at 70B shapes: far past any host's memory
MAX_PREFETCH_THREADS = 64  # streams at once: past this a disk only seeks
CONVERT_WORKERS = WholeNumber(0, MAX_CONVERT_WORKERS, None, "unset: one per CPU", "0 or 1: one worker")
PREFETCH_THREADS = WholeNumber(0, MAX_PREFETCH_THREADS, 4, "unset: 4", "0: off")
REMOTE_RETRY_S = WholeNumber(0, 3600, 30, "unset: 30", "0: no retry")


ENVIRONMENT_VARIABLES: dict[str, EnvVar] = {
    # -- the weight cache ---------------------------------------------------------------------
    "TT_CACHE_PATH": EnvVar(
        lambda: Path(os.environ.get("TT_CACHE_PATH") or _user_cache_home() / "tt-warm-loaders"),
        "root of the ttnn weight cache (default ~/.cache/tt-warm-loaders)"),
    "TT_TRANSFORMERS_FORCE_MODEL_LOAD": EnvVar(
        _flag("TT_TRANSFORMERS_FORCE_MODEL_LOAD"),
        "1/true/yes: every load builds cold, as if no cache existed (tt-metal's name; loaders also take force=)"),
    "TT_CONVERT_WORKERS": EnvVar.count(
        "TT_CONVERT_WORKERS", CONVERT_WORKERS,
        "threads converting a cold build's weights, at most one per unit of work (loaders also take workers=)"),
    "TT_PREFETCH_THREADS": EnvVar.count(
        "TT_PREFETCH_THREADS", PREFETCH_THREADS,
        "threads reading a warm cache's files ahead of use (loaders also take prefetch=)"),
    "TT_CACHE_REMOTE": EnvVar(
        _text("TT_CACHE_REMOTE", ""), "a shared store of warm caches (s3://BUCKET/PREFIX, an http(s) mirror or a "
        "directory): a cold load first pulls its exact variant from it, a cache-only deploy the newest of its model id "
        "(tt-cache push fills it)"),
    "TT_CACHE_REMOTE_PUSH": EnvVar(
        _flag("TT_CACHE_REMOTE_PUSH"), "1/true/yes: a cold build that completes its cache pushes the new variant to "
        "$TT_CACHE_REMOTE (a failed push is one warning; the local cache stays warm)"),
    "TT_CACHE_REMOTE_RETRY_S": EnvVar.count(
        "TT_CACHE_REMOTE_RETRY_S", REMOTE_RETRY_S,
        "seconds an object transfer to or from a shared store that stopped answering is retried, with backoff from "
        "0.5 s doubling to 8 s, before it fails"),
    "AWS_ENDPOINT_URL": EnvVar(
        _text("AWS_ENDPOINT_URL", ""), "the S3 endpoint of s3:// stores (boto3's variable; credentials come only from "
        "the standard AWS chain and are never shown)"),
    "TT_USER_STATE": EnvVar(
        lambda: Path(os.environ.get("TT_USER_STATE") or _user_cache_home() / "tt-warm-loaders-state"),
        "per-user state kept outside shared caches: stamps, locks and use records where a cache is read-only"),
    # -- tools --------------------------------------------------------------------------------
    "TT_CACHE_DEBUG": EnvVar(_flag("TT_CACHE_DEBUG"), "1/true/yes: tt-cache prints the traceback of an internal error"),
    "TT_MODEL_DATA": EnvVar(_text("TT_MODEL_DATA"), "where prepared real checkpoints live (default <repo>/model_data)"),
    "GITHUB_STEP_SUMMARY": EnvVar(
        _text("GITHUB_STEP_SUMMARY", ""), "set by GitHub Actions: tt-cache seed appends its statistics there (Markdown)"),
    "GITHUB_OUTPUT": EnvVar(
        _text("GITHUB_OUTPUT", ""), "set by GitHub Actions: tt-cache seed appends cache-hit, warm, cold, built, failed"),
    "TT_VENV": EnvVar(
        lambda: Path(os.environ.get("TT_VENV") or _REPO_ROOT / ".venv").expanduser(),
        "the default environment (transformers' reference for the vLLM tests; default <repo>/.venv)"),
    "TT_VLLM_VENV": EnvVar(
        lambda: Path(os.environ.get("TT_VLLM_VENV") or _REPO_ROOT / ".venv-vllm").expanduser(),
        "the vLLM environment scripts/setup_vllm_env.sh builds (default <repo>/.venv-vllm)"),
    "TT_GGUF_CACHE": EnvVar(
        lambda: Path(os.environ.get("TT_GGUF_CACHE") or _user_cache_home() / "tt-warm-loaders-gguf").expanduser(),
        "where split GGUFs of the real models are assembled, shared by every model root"),
    # -- the prefill cache and resynthesis -------------------------------------------------------
    "TT_PREFILL_CACHE_MAX_SIZE": EnvVar(
        _text("TT_PREFILL_CACHE_MAX_SIZE", ""), "size cap of the prefill cache (e.g. 20G): producers evict LRU beyond it"),
    "NNF_RESYNTHESIS_BASE_FORWARD_CACHE": EnvVar(
        _text("NNF_RESYNTHESIS_BASE_FORWARD_CACHE", ""), "the in-memory prefill LRU: on/off/auto (the seed's name)"),
    "NNF_RESYNTHESIS_BASE_FORWARD_CACHE_ENTRIES": EnvVar(
        _text("NNF_RESYNTHESIS_BASE_FORWARD_CACHE_ENTRIES", ""), "entries of the in-memory prefill LRU (the seed's name)"),
    "TT_CPU_SHARE_DIR": EnvVar(
        _text("TT_CPU_SHARE_DIR", ""), "where trainers on one host register to share the CPUs (default: a per-user dir)"),
    "OMP_NUM_THREADS": EnvVar(_text("OMP_NUM_THREADS", ""), "OpenMP's thread count: host forwards use at most this many"),
    # -- vLLM ------------------------------------------------------------------------------------
    "TT_VLLM_HOST_PLATFORM": EnvVar(_text("TT_VLLM_HOST_PLATFORM", "1"), "0: leave the platform choice to vLLM"),
    "TT_VLLM_FORWARD_SIGNALS": EnvVar(
        _text("TT_VLLM_FORWARD_SIGNALS", "1"), "0: do not forward the engine core's SIGTERM to its main thread"),
    "TT_VLLM_FREEZE_AT_EXIT": EnvVar(_text("TT_VLLM_FREEZE_AT_EXIT", "1"), "0: do not freeze the heap at exit"),
    "TT_HOST_THREADS": EnvVar(_text("TT_HOST_THREADS", "1"), "torch threads of the vLLM worker's host forward"),
    "MESH_DEVICE": EnvVar(_text("MESH_DEVICE", ""), "tt-metal's mesh name (N150, N300, T3K, TG, ...) a vLLM model is laid out for"),
    "HF_MODEL": EnvVar(_text("HF_MODEL", ""), "tt-metal's checkpoint override; honoured by vLLM only for the model it was asked for"),
    "MODEL_WEIGHTS_DIR": EnvVar(_text("MODEL_WEIGHTS_DIR", ""), "like HF_MODEL"),
    # -- the host (no card) ---------------------------------------------------------------------
    "TT_METAL_MOCK_CLUSTER_DESC_PATH": EnvVar(
        _text("TT_METAL_MOCK_CLUSTER_DESC_PATH"), "ttnn's mock cluster descriptor (set by the project when no card is present)"),
    "LOGURU_LEVEL": EnvVar(
        _text("LOGURU_LEVEL", ""), "loguru's stderr level (loguru's own variable); the project defaults it to INFO, the tools "
        "to WARNING unless --verbose; DEBUG shows ttnn's CONFIG banner at import"),
    "TT_LOGGER_LEVEL": EnvVar(
        _text("TT_LOGGER_LEVEL", ""), "ttnn's and UMD's C++ log level (tt-metal's variable); the tools set error unless "
        "--verbose: no mock cluster / device driver lines"),
    "HF_HUB_DISABLE_PROGRESS_BARS": EnvVar(
        _text("HF_HUB_DISABLE_PROGRESS_BARS", ""), "1: no hub or transformers progress bars (the hub's variable); the "
        "tools set it unless --verbose"),
    "TRANSFORMERS_VERBOSITY": EnvVar(
        _text("TRANSFORMERS_VERBOSITY", ""), "transformers' log level (its variable); the tools set error unless --verbose"),
    "VLLM_LOGGING_LEVEL": EnvVar(
        _text("VLLM_LOGGING_LEVEL", ""), "vLLM's log level (its variable); the vLLM example sets WARNING unless --verbose"),
    "TT_OUTPUT_DEFAULTS": EnvVar(
        _text("TT_OUTPUT_DEFAULTS", ""), "set by the project: which of the output variables above it set itself (a "
        "child tells them from the user's, which always win)"),
    "TT_MOCK_BOARD": EnvVar(_text("TT_MOCK_BOARD", "n150"), "which shipped mock cluster to use: n150 (Wormhole) or p150 (Blackhole)"),
    # -- the Hugging Face hub (its rules) --------------------------------------------------------
    "HF_HUB_CACHE": EnvVar(_hub_cache, "the hub cache holding models--org--name/snapshots (hub rules: HF_HUB_CACHE, HF_HOME, XDG_CACHE_HOME)"),
    "XDG_CACHE_HOME": EnvVar(_user_cache_home, "the user's cache home (default ~/.cache)"),
}


def __getattr__(name: str) -> Any:
    variable = ENVIRONMENT_VARIABLES.get(name)
    if variable is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return variable.read()


def __dir__() -> list[str]:
    return sorted(ENVIRONMENT_VARIABLES)


def check() -> None:
    """Read every typed variable: the first bad value is a :class:`BadValue` (the CLI checks them
    before it starts a build, so a bad one is refused at once, never midway)."""
    for variable in ENVIRONMENT_VARIABLES.values():
        if variable.kind is not None:
            variable.read()


def describe() -> list[tuple[str, str, str]]:
    """(name, current value, what it does) for every variable; a bad value is shown with why."""
    return [(name, _shown(variable), variable.help) for name, variable in ENVIRONMENT_VARIABLES.items()]


def _shown(variable: EnvVar) -> str:
    try:
        value = variable.read()
    except BadValue as error:
        return f"refused: {error}"
    return "" if value is None and variable.kind is not None else str(value)  # unset: the reader's own default
