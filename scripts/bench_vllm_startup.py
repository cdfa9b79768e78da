#!/usr/bin/env python
# SPDX-License-Identifier: Apache-2.0
"""vLLM offline start-up on Gemma 3 270M: cold cache vs warm cache vs transformers, fresh processes.

    .venv-vllm/bin/python scripts/bench_vllm_startup.py [--precision bfloat8_b] [--rounds 3] [--json F] [--png F]

Each round runs every case in a fresh process (round-robin, so machine noise hits all alike) and
the table shows medians:

* ``vllm cold``: ``scripts/offline_inference_tt.py`` with ``TT_TRANSFORMERS_FORCE_MODEL_LOAD=1``
  (the ttnn cache is rebuilt from the checkpoint);
* ``vllm warm``: the same start from the complete cache (no checkpoint file opened);
* ``vllm warm, before`` (with ``--baseline DIR``): the warm start with the code of another
  checkout (a worktree at the commit to compare with: its ``models`` and example script, this
  environment), in the same rounds, so a change is measured side by side, never against old numbers;
* ``transformers``: ``from_pretrained`` (fp32, as the host forward computes) + ``generate`` of
  one token: the stock path without vLLM. vLLM's own ``transformers`` model path does not apply
  here: the PyPI wheel is CUDA-built and has no CPU kernels.

Phases: ``import`` (``import vllm`` / ``import transformers``), ``engine`` (``LLM(...)`` whole),
``weights`` (the loader inside the engine, warm or cold), ``read-back`` (cached ttnn tensors read
back to fp32 for the host forward; a card would upload them instead) and ``first token``
(``generate`` of one token); the read-back's CPU seconds (every thread's) beside its wall time
show how long it waited for a core. Prints a table with the ratios to the targets, writes JSON and a PNG.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _bench_output import DEFAULT_OUT_DIR, Panel, figure, write_json

REPO_ROOT = Path(__file__).resolve().parents[1]
OFFLINE = REPO_ROOT / "scripts" / "offline_inference_tt.py"
PROMPT = "The capital of France is"
PHASES = ["import", "engine", "weights", "read-back", "first token"]
# The plugin's own part of a start (all inside "engine"): the model's init (the loader: weights,
# config, decoder), the host KV pages, and the warm-up (read-back and one forward).
PLUGIN_PARTS = {"model init": "runner_load_model_seconds", "KV pages": "runner_kv_cache_seconds",
                "warm-up": "runner_warm_up_seconds"}

TRANSFORMERS_CASE = """
import json, sys, time
start = time.perf_counter()
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
t = {"import": time.perf_counter() - start}
start = time.perf_counter()
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
t["weights"] = t["engine"] = time.perf_counter() - start
start = time.perf_counter()
with torch.no_grad():
    model.generate(**tokenizer(sys.argv[2], return_tensors="pt"), max_new_tokens=1, do_sample=False)
t["first token"] = time.perf_counter() - start
print("RESULT" + json.dumps(t))
"""


def run_vllm(snapshot: Path, precision: str, cache: Path, cold: bool, workdir: Path,
             code: Path = REPO_ROOT) -> dict[str, float]:
    """One offline start in a fresh process, with the code of checkout ``code``."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TT_CACHE_PATH": str(cache), "TT_TRANSFORMERS_FORCE_MODEL_LOAD": "1" if cold else ""}
    if code != REPO_ROOT:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(code), os.environ.get("PYTHONPATH")]))
    prompts, report = workdir / "prompts.json", workdir / "report.json"
    prompts.write_text(json.dumps([PROMPT]))
    report.unlink(missing_ok=True)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, str(code / OFFLINE.relative_to(REPO_ROOT)), "--model", str(snapshot), "--precision", precision,
                           "--greedy_sampling", "--max_tokens", "1", "--max_seqs_in_batch", "1", "--max_model_len", "128",
                           "--prompts_json", str(prompts), "--report", str(report)],
                          cwd=code, env=env, capture_output=True, text=True)
    if proc.returncode or not report.is_file():
        raise SystemExit(f"offline_inference_tt.py failed:\n{proc.stderr[-4000:]}")
    data = json.loads(report.read_text())
    if data["startup"]["warm"] == cold:
        raise SystemExit(f"expected a {'cold' if cold else 'warm'} start, got {data['startup']}")
    t, s = data["timings"], data["startup"]
    plugin = {part: s.get(key, 0.0) for part, key in PLUGIN_PARTS.items()}
    return {"import": t["import"], "engine": t["engine"], "weights": s["weights_seconds"],
            "read-back": s.get("materialize_seconds", 0.0), "read-back cpu": s.get("materialize_cpu_seconds", 0.0),
            "first token": t["first_token"],
            **plugin, "plugin": sum(plugin.values()), "process": time.perf_counter() - start}


def run_transformers(snapshot: Path) -> dict[str, float]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", TRANSFORMERS_CASE, str(snapshot), PROMPT], cwd=REPO_ROOT,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT")]
    if proc.returncode or not lines:
        raise SystemExit(f"transformers case failed:\n{proc.stderr[-4000:]}")
    return {**json.loads(lines[-1][6:]), "read-back": 0.0, "read-back cpu": 0.0, **dict.fromkeys(PLUGIN_PARTS, 0.0), "plugin": 0.0,
            "process": time.perf_counter() - start}


def medians(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}


def print_table(results: dict[str, dict[str, float]]) -> None:
    columns = [*PHASES, "process"]
    print("| case | " + " | ".join(f"{c} s" for c in columns) + " |")
    print("|" + " --- |" * (len(columns) + 1))
    for case, row in results.items():
        print(f"| {case} | " + " | ".join(f"{row[c]:.3f}" for c in columns) + " |")
    cold, warm = results["vllm cold"], results["vllm warm"]
    print(f"\nwarm weights / cold weights: 1/{cold['weights'] / warm['weights']:.0f} (target <= 1/20)")
    share = warm["import"] / warm["process"]
    print(f"warm start: import vllm {warm['import']:.1f} s of {warm['process']:.1f} s ({share:.0%}), weights "
          f"{warm['weights']:.3f} s ({warm['weights'] / warm['process']:.1%})")
    print(f"warm vLLM process / transformers process: {warm['process'] / results['transformers']['process']:.2f}x")
    print("\nthe plugin's own part of each vLLM start (inside engine):")
    print("| case | " + " | ".join(f"{part} s" for part in PLUGIN_PARTS) + " | plugin s | of process |")
    print("|" + " --- |" * (len(PLUGIN_PARTS) + 3))
    vllm_cases = [case for case in results if case.startswith("vllm")]
    for case in vllm_cases:
        row = results[case]
        print(f"| {case} | " + " | ".join(f"{row[part]:.3f}" for part in PLUGIN_PARTS)
              + f" | {row['plugin']:.3f} | {row['plugin'] / row['process']:.1%} |")
    print(f"warm start: the plugin's part {warm['plugin'] / warm['process']:.1%} of the process (target <= 10%)")
    for case in vllm_cases:
        cpu = results[case]["read-back cpu"]
        print(f"{case}: read-back {results[case]['read-back']:.2f} s" + (f", {cpu:.2f} s CPU (every thread)" if cpu else ""))


def plot(results: dict[str, dict[str, float]], path: Path) -> None:
    """Each case's start-up as stacked parts: import, engine, weights, read-back, first token."""
    parts = {case: {"import": row["import"], "engine other": max(0.0, row["engine"] - row["weights"] - row["read-back"]),
                    "weights": row["weights"], "read-back": row["read-back"], "first token": row["first token"]}
             for case, row in results.items()}
    figure(path, [Panel("stacked", parts, title="vLLM offline start-up, Gemma 3 270M",
                        xlabel="seconds (median of fresh processes)", width=1.6)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--precision", default="bfloat8_b", choices=["bfloat16", "bfloat8_b"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="a checkout whose code runs as the 'vllm warm, before' case")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "tt-bench-vllm")
    parser.add_argument("--json", type=Path, default=DEFAULT_OUT_DIR / "bench_vllm_startup.json")
    parser.add_argument("--png", type=Path, default=DEFAULT_OUT_DIR / "bench_vllm_startup.png")
    opts = parser.parse_args()
    if opts.rounds < 1:
        parser.error("--rounds must be >= 1")

    from models.demos.real_models.prepare import prepare_gemma3_270m

    snapshot = prepare_gemma3_270m()
    opts.workdir.mkdir(parents=True, exist_ok=True)
    cache = opts.workdir / "tt-cache"
    run_vllm(snapshot, opts.precision, cache, cold=True, workdir=opts.workdir)  # the cache exists for warm rounds
    cases = ["vllm cold", "vllm warm", *(["vllm warm, before"] if opts.baseline else []), "transformers"]
    rounds: dict[str, list[dict[str, float]]] = {case: [] for case in cases}
    for i in range(opts.rounds):
        rounds["vllm cold"].append(run_vllm(snapshot, opts.precision, cache, cold=True, workdir=opts.workdir))
        rounds["vllm warm"].append(run_vllm(snapshot, opts.precision, cache, cold=False, workdir=opts.workdir))
        if opts.baseline:
            rounds["vllm warm, before"].append(run_vllm(snapshot, opts.precision, cache, cold=False, workdir=opts.workdir,
                                                        code=opts.baseline.resolve()))
        rounds["transformers"].append(run_transformers(snapshot))
        print(f"round {i + 1}/{opts.rounds} done", file=sys.stderr)
    results = {case: medians(r) for case, r in rounds.items()}
    print(f"Gemma 3 270M, {opts.precision}, median of {opts.rounds} fresh processes per case\n")
    print_table(results)
    report: dict[str, Any] = {"model": str(snapshot), "precision": opts.precision, "rounds": rounds, "medians": results,
                              "baseline": str(opts.baseline) if opts.baseline else None}
    write_json(opts.json, report)
    plot(results, opts.png)
    print(f"\nwrote {opts.json} and {opts.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
