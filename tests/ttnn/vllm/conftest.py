# SPDX-License-Identifier: Apache-2.0
"""The vLLM tests run in the vLLM environment (``scripts/run_vllm_tests.sh``, ``.venv-vllm``).

vLLM is an optional extra: where it is not installed (the default environment and test suite),
only the tests that prove the plugin inert are collected, and nothing here imports vLLM."""

from __future__ import annotations

import importlib.util

VLLM_INSTALLED = importlib.util.find_spec("vllm") is not None
# test_vllm_*.py start vLLM engines; test_tt_models.py, test_plugin_options.py, test_plugin_inert.py,
# test_paged_attention.py and test_readback.py need no vLLM and run everywhere.
collect_ignore_glob = [] if VLLM_INSTALLED else ["test_vllm_*.py"]

if VLLM_INSTALLED:
    import os

    # Engines built inside the test process run their engine core in-process (no second
    # ``import vllm`` per engine); the start-up tests run the example script with vLLM's default
    # multiprocess engine instead (tests.vllm.engines.run_offline).
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no hub here: nothing may wait on one
