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
"""

from __future__ import annotations

import os
from pathlib import Path

from models.common import envs

MOCK_CLUSTER_ENV = "TT_METAL_MOCK_CLUSTER_DESC_PATH"
LOG_LEVEL_ENV = "LOGURU_LEVEL"
DEFAULT_LOG_LEVEL = "INFO"
MOCK_BOARD_ENV = "TT_MOCK_BOARD"
MOCK_CLUSTER_DIR = Path(__file__).resolve().parent / "mock_clusters"
MOCK_CLUSTERS = {
    "n150": MOCK_CLUSTER_DIR / "wormhole_N150.yaml",
    "p150": MOCK_CLUSTER_DIR / "blackhole_P150.yaml",
}
TT_DEVICE_NODES = Path("/dev/tenstorrent")


def tenstorrent_card_present() -> bool:
    """True when the kernel driver exposes at least one Tenstorrent device."""
    return TT_DEVICE_NODES.is_dir() and any(TT_DEVICE_NODES.iterdir())


def ensure_host_cluster() -> str | None:
    """Set the mock cluster descriptor when needed; return the descriptor path in force (None on a card).

    ``TT_MOCK_BOARD`` picks the shipped descriptor (``n150`` Wormhole, default; ``p150`` Blackhole).
    Also defaults ``LOGURU_LEVEL`` to INFO (see the module doc: no ttnn CONFIG banner)."""
    os.environ.setdefault(LOG_LEVEL_ENV, DEFAULT_LOG_LEVEL)
    if envs.TT_METAL_MOCK_CLUSTER_DESC_PATH:
        return envs.TT_METAL_MOCK_CLUSTER_DESC_PATH
    if tenstorrent_card_present():
        return None
    board = envs.TT_MOCK_BOARD.lower()
    if board not in MOCK_CLUSTERS:
        raise ValueError(f"{MOCK_BOARD_ENV}={board!r}: expected one of {sorted(MOCK_CLUSTERS)}")
    os.environ[MOCK_CLUSTER_ENV] = str(MOCK_CLUSTERS[board])
    return os.environ[MOCK_CLUSTER_ENV]
