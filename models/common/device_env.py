# SPDX-License-Identifier: Apache-2.0
"""Point ttnn at a mock cluster when this machine has no Tenstorrent card.

ttnn's host-side conversions (TILE layout with a dtype change, bfloat8_b/bfloat4_b packing) ask
the cluster for the chip architecture and die with ``No chips detected`` when there is none.
With ``TT_METAL_MOCK_CLUSTER_DESC_PATH`` naming a UMD cluster descriptor, ttnn mocks the driver
and all of that host work runs. The variable must be set before ttnn first touches the cluster,
so every entry point (``import models``, ``conftest.py``, the scripts, ``tt-cache``) goes
through :func:`ensure_host_cluster` here. On a machine with a card, or when the user has set the
variable, nothing changes.

The same spot quiets ttnn's import: ``import ttnn`` logs its whole ``CONFIG`` through loguru at
DEBUG (dozens of lines in every seed worker's log). Loguru's default handler takes its level from
``LOGURU_LEVEL`` when loguru is first imported, so that variable defaults to INFO here, before
anything imports loguru, for this process and every child it starts; ``LOGURU_LEVEL=DEBUG``
brings the banner (and the project's own DEBUG lines) back.

Quiet by default, ``--verbose`` for everything: :func:`set_output` is the one rule for the tools
(``tt-cache``, the real-model demo, the vLLM example). Quiet sets :data:`QUIET_OUTPUT` in
``os.environ`` (ttnn's and UMD's C++ logger at ``error``: no "mock cluster" / "Opening user mode
device driver" lines; loguru at WARNING; no hub or transformers progress bars such as
``Loading weights``; vLLM's INFO lines); verbose leaves them to their owners (native output, loguru at INFO). Either
way a value the user set before the process started wins, and children inherit the choice.
"""

from __future__ import annotations

import os
from pathlib import Path

from models.common import envs

MOCK_CLUSTER_ENV = "TT_METAL_MOCK_CLUSTER_DESC_PATH"
LOG_LEVEL_ENV = "LOGURU_LEVEL"
DEFAULT_LOG_LEVEL = "INFO"
MOCK_CLUSTER_DIR = Path(__file__).resolve().parent / "mock_clusters"
MOCK_CLUSTERS = {
    "n150": MOCK_CLUSTER_DIR / "wormhole_N150.yaml",
    "p150": MOCK_CLUSTER_DIR / "blackhole_P150.yaml",
}
TT_DEVICE_NODES = Path("/dev/tenstorrent")
# What a quiet run sets (each read by its owner when it is first imported: set them before
# ttnn, loguru and transformers are).
QUIET_OUTPUT = {
    "TT_LOGGER_LEVEL": "error",
    LOG_LEVEL_ENV: "WARNING",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "VLLM_LOGGING_LEVEL": "WARNING",
}
PROJECT_SET_ENV = "TT_OUTPUT_DEFAULTS"  # NAME=value of the output variables the project set (children inherit it)


def tenstorrent_card_present() -> bool:
    """True when the kernel driver exposes at least one Tenstorrent device."""
    return TT_DEVICE_NODES.is_dir() and any(TT_DEVICE_NODES.iterdir())


def ensure_host_cluster() -> str | None:
    """Set the mock cluster descriptor when needed; return the descriptor path in force (None on a card).

    ``TT_MOCK_BOARD`` picks the shipped descriptor (``n150`` Wormhole, default; ``p150`` Blackhole).
    Also defaults ``LOGURU_LEVEL`` to INFO (see the module doc: no ttnn CONFIG banner)."""
    if not envs.LOGURU_LEVEL:
        _set_default(LOG_LEVEL_ENV, DEFAULT_LOG_LEVEL)
    if envs.TT_METAL_MOCK_CLUSTER_DESC_PATH:
        return envs.TT_METAL_MOCK_CLUSTER_DESC_PATH
    if tenstorrent_card_present():
        return None
    descriptor = str(MOCK_CLUSTERS[envs.TT_MOCK_BOARD])  # the table refuses other boards
    os.environ[MOCK_CLUSTER_ENV] = descriptor
    return descriptor


def _project_set() -> dict[str, str]:
    """The output variables the project set, with the value it set (``NAME=value,...``)."""
    pairs = (item.partition("=") for item in envs.TT_OUTPUT_DEFAULTS.split(",") if item)
    return {name: value for name, _, value in pairs}


def _set_default(name: str, value: str | None) -> None:
    """Set (None: unset) an output variable as the project's default, remembered as not the user's."""
    defaults = _project_set()
    defaults.pop(name, None)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = defaults[name] = value
    os.environ[PROJECT_SET_ENV] = ",".join(f"{n}={v}" for n, v in sorted(defaults.items()))


def user_set(name: str) -> bool:
    """Whether the user set ``name``: it is set, and not to the value this project (in this process
    or a parent) set it to."""
    value = envs.raw(name)
    return bool(value) and _project_set().get(name) != value


def set_output(*, verbose: bool) -> None:
    """Quiet (the default of the tools) or verbose output for this process and its children; call
    before ttnn, loguru or transformers is imported. The user's own values are never replaced."""
    for name, quiet in QUIET_OUTPUT.items():
        if not user_set(name):
            _set_default(name, None if verbose else quiet)
    if verbose and not user_set(LOG_LEVEL_ENV):
        _set_default(LOG_LEVEL_ENV, DEFAULT_LOG_LEVEL)
