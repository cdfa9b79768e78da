# SPDX-License-Identifier: Apache-2.0
"""The mock cluster is set only when needed, in one place every entry point goes through."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from models.testing import REPO_ROOT

PROBE = "import os, models; print(os.environ.get('TT_METAL_MOCK_CLUSTER_DESC_PATH', '-'))"


def probe(**env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("TT_METAL_MOCK_CLUSTER_DESC_PATH", "TT_MOCK_BOARD")}
    return subprocess.run([sys.executable, "-c", PROBE], env={**base, **env, "PYTHONPATH": str(REPO_ROOT)},
                          cwd=REPO_ROOT, capture_output=True, text=True)


def test_without_a_card_import_models_points_ttnn_at_the_shipped_descriptor():
    if Path("/dev/tenstorrent").is_dir():
        pytest.skip("a Tenstorrent card is present: no mock descriptor is set")
    default, blackhole = probe(), probe(TT_MOCK_BOARD="p150")
    assert default.stdout.strip().endswith("mock_clusters/wormhole_N150.yaml")
    assert blackhole.stdout.strip().endswith("mock_clusters/blackhole_P150.yaml")
    assert Path(blackhole.stdout.strip()).is_file()


def test_a_user_set_descriptor_is_left_alone():
    assert probe(TT_METAL_MOCK_CLUSTER_DESC_PATH="/opt/mine.yaml").stdout.strip() == "/opt/mine.yaml"

