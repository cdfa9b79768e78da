# SPDX-License-Identifier: Apache-2.0
"""The vLLM tests run in the vLLM environment (``scripts/run_vllm_tests.sh``, ``.venv-vllm``).

vLLM is an optional extra: where it is not installed (the default environment and test suite),
only the tests that prove the plugin inert are collected, and nothing here imports vLLM."""

from __future__ import annotations

import importlib.util

VLLM_INSTALLED = importlib.util.find_spec("vllm") is not None
collect_ignore_glob = [] if VLLM_INSTALLED else ["test_vllm_*.py"]
