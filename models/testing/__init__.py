# SPDX-License-Identifier: Apache-2.0
"""What the tests and benchmarks share: tiny checkpoints, cache seeders, child processes, fixtures.

Installed with the project, so tests and ``scripts/`` import it like any module (no ``sys.path``
edits); :mod:`models.testing.fixtures` is the pytest plugin the root ``conftest.py`` loads.
"""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout: tests and scripts run its files and scripts
