# SPDX-License-Identifier: Apache-2.0
"""Model loaders for Tenstorrent hardware built on a warm ttnn weight cache."""

from models.common import envs
from models.common.device_env import ensure_host_cluster

try:
    ensure_host_cluster()
except envs.BadValue:
    pass  # a bad TT_MOCK_BOARD: every entry point refuses it in one line (envs.check) before any work
