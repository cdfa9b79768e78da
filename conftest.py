# SPDX-License-Identifier: Apache-2.0
"""Root pytest configuration: point ttnn at a mock cluster before any test imports it, and load
the shared fixtures (an installed module, so tests need no ``sys.path`` edits)."""

from models.common.device_env import ensure_host_cluster

ensure_host_cluster()

pytest_plugins = ["models.testing.fixtures"]
