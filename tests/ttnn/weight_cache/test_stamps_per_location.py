# SPDX-License-Identifier: Apache-2.0
"""Checkpoints that share a folder name (``a/model``, ``b/model``, ...) keep their own stamps: started
in turn, each is hashed once, never again on every start."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

from models.common.weight_cache.stamps import STAMPS_PER_PATH
from models.testing.tiny_models import make_checkpoint
from models.testing.tt_cache import REPO_ROOT, cli_env

# ``tt-cache seed --check`` of one plan, round after round in one process (the imports are done by the
# first round); prints the bytes (the kernel's count) each round read.
ROUNDS = """
import json, sys
from models.tt_cache.cli import main
def rchar():
    return int(next(l for l in open('/proc/self/io') if l.startswith('rchar:')).split()[1])
reads = []
for _ in range(int(sys.argv[2])):
    before = rchar()
    main(["seed", "--plan", sys.argv[1], "--check", "--json"])
    reads.append(rchar() - before)
print(json.dumps(reads), file=sys.stderr)
"""


def test_same_named_checkpoints_started_in_turn_are_hashed_once_each(tmp_path):
    """More same-named checkpoints than one index keeps stamps per file for: one index per location."""
    first = make_checkpoint("llama", tmp_path / "first" / "model")
    places = [first] + [shutil.copytree(first, tmp_path / f"place-{i}" / "model") for i in range(STAMPS_PER_PATH)]
    time.sleep(0.1)  # let the copies' stamps settle: a stamp taken in its file's racy tick is never recorded
    plan = tmp_path / "plan.yaml"
    plan.write_text(json.dumps({"models": [{"model": str(p), "meshes": ["N150"], "precisions": ["bfloat16"]}
                                           for p in places]}))
    out = subprocess.run([sys.executable, "-c", ROUNDS, str(plan), "3"], env=cli_env(tmp_path / "cache"),
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    reads = json.loads(out.stderr.strip().splitlines()[-1])
    weights = sum((place / "model.safetensors").stat().st_size for place in places)
    assert reads[0] >= weights, reads  # every checkpoint hashed once
    assert all(read < weights // 4 for read in reads[1:]), (reads, weights)  # and then recognised by its stamps
