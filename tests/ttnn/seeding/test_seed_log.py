# SPDX-License-Identifier: Apache-2.0
"""``tt-cache seed`` prints each variant's line once, whether a CI log holds stdout and stderr
together (``2>&1``) or stdout alone."""

from __future__ import annotations

import json
import subprocess
import sys

from models.testing.tt_cache import REPO_ROOT, cli_env


def test_each_variant_line_is_printed_once_with_stderr_merged_into_stdout(tiny_checkpoints, tmp_path):
    llama, qwen = tiny_checkpoints["llama"], tiny_checkpoints["qwen3"]
    plan = tmp_path / "plan.yaml"
    plan.write_text(json.dumps({"models": [
        {"model": str(llama), "meshes": ["N150", "N300"], "precisions": ["bfloat16"]},
        {"model": str(qwen), "meshes": ["N150"], "precisions": ["bfloat16"]},
    ]}))
    command = [sys.executable, "-m", "models.tt_cache.cli", "seed", "--plan", str(plan), "--check"]
    env = cli_env(tmp_path / "cache")
    merged = subprocess.run(command, env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, timeout=300)
    alone = subprocess.run(command, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    cases = [f"{llama} [N150 bfloat16]: cold: ", f"{llama} [N300 bfloat16]: cold: ", f"{qwen} [N150 bfloat16]: cold: "]
    verdict = f"FAILED: 3 combination(s) of {plan}: 3 cold in "
    for out, text in ((merged, merged.stdout), (alone, alone.stdout)):
        assert out.returncode == 1, text[-3000:]
        lines = text.splitlines()
        assert [sum(line.startswith(case) for line in lines) for case in cases] == [1, 1, 1], text[-3000:]
        assert sum(line.startswith(verdict) for line in lines) == 1, text[-3000:]
    assert not any(case in alone.stderr for case in cases), "a variant's line on stderr as well as on stdout"
    document = subprocess.run([*command, "--json"], env=env, cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=300)
    assert json.loads(document.stdout)["counts"] == {"cold": 3}  # --json: stdout is the document alone
    assert [sum(line.startswith(case) for line in document.stderr.splitlines()) for case in cases] == [1, 1, 1]
    printed = [line for line in alone.stdout.splitlines() if line]
    assert [line.split(": cold: ")[0] for line in printed[:3]] == [case.split(": cold: ")[0] for case in cases]
    assert printed[3].startswith(verdict) and len(printed) == 4
