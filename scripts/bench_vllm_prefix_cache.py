#!/usr/bin/env python
# SPDX-License-Identifier: Apache-2.0
"""Prefix caching through ``vllm.LLM`` on the host platform: a prompt whose long prefix another
request already computed (hit) against one whose prefix is new (miss), side by side in one run.

    .venv-vllm/bin/python scripts/bench_vllm_prefix_cache.py [--prefix-tokens 1024] [--rounds 3]
        [--model google/gemma-3-270m] [--precision bfloat16] [--json F] [--png F]

Each round takes a prefix no earlier request has used, then times ``generate`` of one token for
``prefix + suffix A`` (miss: every position computed) and right after for ``prefix + suffix B``
(hit: vLLM finds the prefix's full blocks by block hash and the runner computes only the rest).
The runner's own counters give the positions computed and found cached for each. One engine, in
this process; the default model is Gemma 3 270M (prepared on first use).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
SUFFIX_TOKENS = 16


def prompts_of(vocab: int, prefix_tokens: int, round_index: int) -> tuple[list[int], list[int]]:
    """Two prompts sharing a ``prefix_tokens`` prefix no other round uses (token ids well inside the
    vocabulary, away from the special tokens at its start)."""
    span = min(vocab, 200_000) - 1000
    prefix = [1000 + (7919 * (i + 1) + 104_729 * (round_index + 1)) % span for i in range(prefix_tokens)]
    first = prefix + [1000 + (31 * i + 5) % span for i in range(SUFFIX_TOKENS)]
    second = prefix + [1000 + (37 * i + 11) % span for i in range(SUFFIX_TOKENS)]
    return first, second


def timed(llm: Any, prompt: list[int]) -> dict[str, float]:
    from vllm import SamplingParams

    before = llm.collective_rpc("runner_stats")[0]
    start = time.perf_counter()
    output = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)[0]
    seconds = time.perf_counter() - start
    after = llm.collective_rpc("runner_stats")[0]
    return {"seconds": seconds, "computed": after["prompt_tokens_computed"] - before["prompt_tokens_computed"],
            "cached": after["prompt_tokens_cached"] - before["prompt_tokens_cached"],
            "vllm_num_cached_tokens": output.num_cached_tokens or 0, "token": output.outputs[0].token_ids[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="google/gemma-3-270m", help="HF id (hub cache), checkpoint or snapshot")
    parser.add_argument("--prefix-tokens", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--precision", default="bfloat16", choices=["bfloat16", "bfloat8_b"])
    parser.add_argument("--json", type=Path, default=REPO_ROOT / "docs" / "bench_vllm_prefix_cache.json")
    parser.add_argument("--png", type=Path, default=REPO_ROOT / "docs" / "bench_vllm_prefix_cache.png")
    args = parser.parse_args()
    if args.prefix_tokens < 64 or args.rounds < 1:
        parser.error("--prefix-tokens must be >= 64 and --rounds >= 1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process
    model = args.model
    if model == "google/gemma-3-270m":
        from models.demos.real_models.prepare import prepare_gemma3_270m

        model = str(prepare_gemma3_270m())
    from _bench_output import bar_chart, write_json
    from vllm import LLM

    with tempfile.TemporaryDirectory(prefix="bench-vllm-prefix-") as scratch:
        os.environ.setdefault("TT_CACHE_PATH", str(Path(scratch) / "tt-cache"))
        llm = LLM(model=model, max_model_len=args.prefix_tokens + 2 * SUFFIX_TOKENS + 64, max_num_seqs=2,
                  skip_tokenizer_init=True, additional_config={"precision": args.precision})
        vocab = llm.llm_engine.model_config.get_vocab_size()
        timed(llm, prompts_of(vocab, 64, 10_000)[0])  # first request of the engine: off the clock
        rounds = []
        for index in range(args.rounds):
            first, second = prompts_of(vocab, args.prefix_tokens, index)
            rounds.append({"miss": timed(llm, first), "hit": timed(llm, second)})
            r = rounds[-1]
            print(f"round {index + 1}: miss {r['miss']['seconds']:.3f} s ({r['miss']['computed']} computed), "
                  f"hit {r['hit']['seconds']:.3f} s ({r['hit']['computed']} computed, {r['hit']['cached']} cached)",
                  flush=True)
        block = llm.llm_engine.vllm_config.cache_config.block_size
        del llm

    miss = statistics.median(r["miss"]["seconds"] for r in rounds)
    hit = statistics.median(r["hit"]["seconds"] for r in rounds)
    prompt_tokens = args.prefix_tokens + SUFFIX_TOKENS
    print(f"\n{model}, {args.precision}, prompts of {prompt_tokens} tokens sharing {args.prefix_tokens}, "
          f"block {block}, median of {args.rounds} rounds\n")
    print("| request | prompt tokens computed | found in the prefix cache | generate(1 token) s |")
    print("| --- | --- | --- | --- |")
    print(f"| miss (new prefix) | {rounds[0]['miss']['computed']} | {rounds[0]['miss']['cached']} | {miss:.3f} |")
    print(f"| hit (same prefix) | {rounds[0]['hit']['computed']} | {rounds[0]['hit']['cached']} | {hit:.3f} |")
    print(f"\nhit / miss: {hit / miss:.3f}x ({miss / hit:.1f}x faster)")
    write_json(args.json, {"model": args.model, "precision": args.precision, "prefix_tokens": args.prefix_tokens,
                           "suffix_tokens": SUFFIX_TOKENS, "block_size": block, "rounds": rounds,
                           "median_miss_seconds": miss, "median_hit_seconds": hit, "hit_over_miss": hit / miss})
    bar_chart(args.png, {f"round {i + 1}": {"miss": r["miss"]["seconds"], "hit": r["hit"]["seconds"]}
                         for i, r in enumerate(rounds)},
              title=f"prefix cache: {prompt_tokens}-token prompts sharing {args.prefix_tokens} tokens ({args.precision})",
              ylabel="generate(1 token) seconds")
    print(f"wrote {args.json}\nwrote {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
