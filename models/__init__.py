# SPDX-License-Identifier: Apache-2.0
"""Model loaders for Tenstorrent hardware built on a warm ttnn weight cache."""

from models.common.device_env import ensure_host_cluster

ensure_host_cluster()
