#!/usr/bin/env python
# SPDX-License-Identifier: Apache-2.0
"""Offline inference with vLLM on the TT host platform, starting from the warm ttnn cache.

    HF_HUB_OFFLINE=1 HF_HOME=model_data .venv-vllm/bin/python scripts/offline_inference_tt.py \\
        --model google/gemma-3-270m --max_tokens 16 --greedy_sampling

Prints each completion and how the start-up time split: ``import vllm``, engine start (of which
the weight load, warm or cold and why, and reading the weights back for the host forward), and
the first token. The flags are those of vllm-tt-plugin's example; ``--report`` also writes it all
as JSON. Quiet by default (no ttnn/UMD log lines, progress bars or INFO logs of vLLM and the project);
``--verbose`` shows them. Exit status: 0 generated, 1 the engine failed to start or generate, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_PROMPTS = [
    "The capital of France is",
    "Hello, my name is",
    "The quick brown fox jumps over the lazy dog. Then the dog",
    "1, 2, 3,",
]


class UsageError(ValueError):
    """Bad input: reported in one line, exit status 2."""


def read_prompts(path: Path | None) -> list[Any]:
    """Prompts from a JSON list: strings, ``{"prompt": ...}`` or ``{"prompt_token_ids": [...]}``."""
    if path is None:
        return list(DEFAULT_PROMPTS)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise UsageError(f"--prompts_json {path}: {error}") from None
    if not isinstance(data, list) or not data:
        raise UsageError(f"--prompts_json {path}: expected a non-empty JSON list of prompts")
    prompts = []
    for item in data:
        if isinstance(item, str):
            prompts.append(item)
        elif isinstance(item, dict) and isinstance(item.get("prompt"), str):
            prompts.append(item["prompt"])
        elif isinstance(item, dict) and isinstance(item.get("prompt_token_ids"), list):
            prompts.append({"prompt_token_ids": [int(t) for t in item["prompt_token_ids"]]})
        else:
            raise UsageError(f"--prompts_json {path}: {item!r} is neither a string, nor has 'prompt' or 'prompt_token_ids'")
    return prompts


def precision_spec(text: str) -> str:
    from models.common.precision import spec_problem

    if problem := spec_problem(text):
        raise argparse.ArgumentTypeError(problem)
    return text


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="google/gemma-3-270m", help="HF id, local checkpoint or hub snapshot")
    parser.add_argument("--max_tokens", type=int, default=16)
    parser.add_argument("--max_seqs_in_batch", type=int, default=4, help="vLLM max_num_seqs")
    parser.add_argument("--max_model_len", type=int, default=512)
    parser.add_argument("--prompts_json", type=Path, help="JSON list of prompts (default: four built-in ones)")
    parser.add_argument("--greedy_sampling", action="store_true", help="temperature 0")
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top_p", type=float, default=0.95)
    parser.add_argument("--top_k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=None, help="per-request sampling seed")
    parser.add_argument("--precision", type=precision_spec, default=None,
                        help="a dtype (bfloat16, bfloat8_b, bfloat4_b), a precision policy or a policy file (.json) "
                             "(default: --optimizations' policy)")
    parser.add_argument("--optimizations", choices=["performance", "accuracy"], default="performance",
                        help="tt-metal's precision policy (per decoder and tensor group, docs/precision.md)")
    parser.add_argument("--mesh", help="MESH_DEVICE for this run (N150, N300, T3K, TG, '(r,c)')")
    parser.add_argument("--chat", action="store_true",
                        help="send each prompt as one user message through llm.chat (the model's chat template)")
    parser.add_argument("--skip_tokenizer_init", action="store_true", help="token-id prompts only, no tokenizer")
    parser.add_argument("--report", type=Path, help="also write the completions and timings here as JSON")
    parser.add_argument("--verbose", action="store_true",
                        help="also vLLM's, ttnn's and UMD's log lines, progress bars and INFO logs (quiet by default)")
    args = parser.parse_args(argv)
    if args.max_tokens < 1 or args.max_seqs_in_batch < 1 or args.max_model_len < 2:
        parser.error("--max_tokens and --max_seqs_in_batch must be >= 1, --max_model_len >= 2")
    return args


def run(args: argparse.Namespace, prompts: list[Any]) -> dict[str, Any]:
    start = time.perf_counter()
    from vllm import LLM, SamplingParams

    timings = {"import": time.perf_counter() - start}
    start = time.perf_counter()
    extra = {"optimizations": args.optimizations, **({"precision": args.precision} if args.precision else {})}
    llm = LLM(model=args.model, max_num_seqs=args.max_seqs_in_batch, max_model_len=args.max_model_len,
              skip_tokenizer_init=args.skip_tokenizer_init, additional_config=extra)
    timings["engine"] = time.perf_counter() - start
    startup = llm.collective_rpc("startup_report")[0]

    if args.greedy_sampling:
        params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    else:
        params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
                                max_tokens=args.max_tokens)
    start = time.perf_counter()
    llm.generate([prompts[0]], SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)
    timings["first_token"] = time.perf_counter() - start
    start = time.perf_counter()
    if args.chat:
        conversations = [[{"role": "user", "content": prompt}] for prompt in prompts]
        outputs = llm.chat(conversations, params, use_tqdm=False)
    else:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    timings["generate"] = time.perf_counter() - start
    completions = [{"prompt": p if isinstance(p, str) else p["prompt_token_ids"], "text": o.outputs[0].text,
                    "prompt_token_ids": list(o.prompt_token_ids or []),
                    "token_ids": list(o.outputs[0].token_ids), "finish_reason": o.outputs[0].finish_reason}
                   for p, o in zip(prompts, outputs)]
    return {"model": args.model, "timings": timings, "startup": startup, "completions": completions}


def print_report(report: dict[str, Any]) -> None:
    for item in report["completions"]:
        print(f"prompt: {item['prompt']!r}\n  -> {item['text']!r}")
    t, s = report["timings"], report["startup"]
    state = "warm" if s["warm"] else f"cold: {s['reason']}"
    print(f"\nstart-up of {report['model']} ({s['model']}, cache {s['cache_dir']})")
    print("| phase | seconds |\n| --- | --- |")
    print(f"| import vllm | {t['import']:.2f} |")
    print(f"| engine start | {t['engine']:.2f} |")
    print(f"| - weights ({state}) | {s['weights_seconds']:.3f} |")
    print(f"| - read back for the host forward | {s.get('materialize_seconds', 0.0):.2f} |")
    print(f"| first token | {t['first_token']:.2f} |")
    print(f"| generate {len(report['completions'])} prompts | {t['generate']:.2f} |")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from models.common.device_env import set_output

    set_output(verbose=args.verbose)  # before vLLM, ttnn, loguru or transformers is imported
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.mesh:
        os.environ["MESH_DEVICE"] = args.mesh
    try:
        prompts = read_prompts(args.prompts_json)
        if args.chat and not all(isinstance(prompt, str) for prompt in prompts):
            raise UsageError("--chat takes text prompts only (a chat template renders text)")
    except UsageError as error:
        print(f"offline_inference_tt: {error}", file=sys.stderr)
        return 2
    try:
        report = run(args, prompts)
    except Exception as error:  # the engine logs the root cause above; the user gets one line here
        print(f"offline_inference_tt: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    print_report(report)
    if args.report:
        args.report.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
