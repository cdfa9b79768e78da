# SPDX-License-Identifier: Apache-2.0
"""What the tests and benchmarks share: tiny checkpoints, cache seeders, child processes, fixtures.

Installed with the project, so tests and ``scripts/`` import it like any module (no ``sys.path``
edits); :mod:`models.testing.fixtures` is the pytest plugin the root ``conftest.py`` loads.
"""
