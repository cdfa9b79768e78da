# SPDX-License-Identifier: Apache-2.0
"""Where the project looks for hub snapshots is where ``huggingface_hub`` puts them: ``envs.HF_HUB_CACHE``
against ``huggingface_hub.constants.HF_HUB_CACHE``, each read in a fresh process (the library reads
its environment once, at import), for every variable of the rule, with ``~`` and ``$VARS``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from models.testing.tt_cache import REPO_ROOT

PROBE = """
import json
from huggingface_hub import constants
from models.common import envs
print(json.dumps([str(envs.HF_HUB_CACHE), constants.HF_HUB_CACHE]))
"""

RULE_VARIABLES = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")


@pytest.mark.parametrize("settings", [
    {},
    {"XDG_CACHE_HOME": "/x/cache"},
    {"HF_HOME": "~/hf-home"},
    {"HF_HOME": "$TEAM_ROOT/hf", "TEAM_ROOT": "/team"},
    {"HUGGINGFACE_HUB_CACHE": "/legacy/hub", "HF_HOME": "/ignored"},
    {"HF_HUB_CACHE": "${TEAM_ROOT}/hub", "TEAM_ROOT": "/team", "HUGGINGFACE_HUB_CACHE": "/legacy"},
    {"HF_HUB_CACHE": "~/hub"},
], ids=["defaults", "xdg", "hf-home-tilde", "hf-home-var", "legacy", "hub-cache-var", "hub-cache-tilde"])
def test_the_hub_cache_is_where_huggingface_hub_puts_it(settings, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in RULE_VARIABLES}
    env.update(settings, HOME=str(tmp_path), PYTHONPATH=str(REPO_ROOT))
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    ours, theirs = json.loads(out.stdout.strip().splitlines()[-1])
    assert ours == theirs
