# SPDX-License-Identifier: Apache-2.0
"""Cache operations for CI and fleets: scanning, seeding plans, reports, progress, eviction.

Modules that only read caches (:mod:`scan`, :mod:`gc`, :mod:`report`, :mod:`plan`,
:mod:`progress`) import neither torch nor ttnn, so ``tt-cache ls/check/verify/gc --dry-run``
start in a fraction of a second; :mod:`runner` and :mod:`worker` load models and import both.
"""
