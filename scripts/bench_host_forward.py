#!/usr/bin/env python
# SPDX-License-Identifier: Apache-2.0
"""Host forward throughput: ``vllm.LLM.generate`` with the plugin against transformers' own batched
``generate`` on the same model, at 1, 8 and 32 sequences, side by side in one run.

    .venv-vllm/bin/python scripts/bench_host_forward.py [--sequences 1 8 32] [--tokens 64] [--rounds 3]
        [--threads 1] [--model smollm2-135m] [--precision bfloat16] [--baseline REV] [--json F] [--png F]

Three engines, each in its own process started once (the start-up is off the clock), driven in
turn round by round so machine noise hits all alike:

* ``transformers``: ``AutoModelForCausalLM`` from the same prepared snapshot in fp32 (the dtype the
  host forward computes in, from the cached weights of ``--precision``), batched ``generate``;
* ``vllm batched``: ``vllm.LLM`` with the plugin of this checkout;
* ``vllm per-sequence``: the same with the plugin of ``--baseline`` (exported with ``git archive``;
  its attention loops over the sequences), unless ``--baseline ''``.

Each engine gets the same ``--threads`` (``torch.set_num_threads``; the plugin's ``TT_HOST_THREADS``),
the same equal-length token prompts (no padding anywhere) and greedy decoding of exactly
``--tokens`` tokens (EOS does not stop: vLLM's ``ignore_eos``, transformers without an EOS id).
Per measurement ``generate`` runs twice: one token (the prefill) and ``--tokens``; decode tokens/s is
``sequences * (tokens - 1) / (t_all - t_first)``, end-to-end tokens/s ``sequences * tokens / t_all``.
The table shows medians over the rounds, the ratios, and how many sequences' tokens equal
transformers'. Prefix caching is off (the rounds repeat their prompts).
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
from typing import IO, Any

REPO_ROOT = Path(__file__).resolve().parents[1]
# The last commit whose host attention looped over the sequences of a batch.
PER_SEQUENCE_REV = "ca738f74eedda799b3df8fa052b45252ec159b0f"
PROMPT_TOKENS = 16
MARK = "BENCH "
ENGINES = ("transformers", "vllm per-sequence", "vllm batched")


# -- a worker: one engine, answering "<sequences> <tokens>" lines with its timings ------------------

def prompts_for(count: int, vocab: int) -> list[list[int]]:
    """``count`` distinct prompts of PROMPT_TOKENS token ids well inside the vocabulary."""
    span = vocab - 2000
    return [[1000 + (7919 * (i * PROMPT_TOKENS + j + 1)) % span for j in range(PROMPT_TOKENS)] for i in range(count)]


def vllm_generator(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    import torch
    from vllm import LLM, SamplingParams

    llm = LLM(model=args.snapshot, skip_tokenizer_init=True, max_num_seqs=max(args.sequences),
              max_model_len=PROMPT_TOKENS + args.tokens + 16, enable_prefix_caching=False,
              additional_config={"precision": args.precision})

    def generate(prompts: list[list[int]], tokens: int) -> list[list[int]]:
        params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outputs]

    vocab = llm.llm_engine.model_config.get_vocab_size()
    return generate, {"vocab": vocab, "threads": torch.get_num_threads()}


def transformers_generator(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.snapshot, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # exactly max_new_tokens, EOS may be sampled (vLLM's ignore_eos)

    @torch.no_grad()
    def generate(prompts: list[list[int]], tokens: int) -> list[list[int]]:
        ids = torch.tensor(prompts)
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens,
                             do_sample=False, pad_token_id=0)
        return out[:, ids.shape[1]:].tolist()

    return generate, {"vocab": model.config.vocab_size, "threads": torch.get_num_threads(),
                      "transformers": __import__("transformers").__version__}


def worker(args: argparse.Namespace) -> int:
    generate, facts = (transformers_generator if args.worker == "transformers" else vllm_generator)(args)
    generate(prompts_for(1, facts["vocab"]), 2)  # the engine's first request: off the clock
    print(MARK + json.dumps(facts), flush=True)
    for line in sys.stdin:
        count, tokens = map(int, line.split())
        prompts = prompts_for(count, facts["vocab"])
        start = time.perf_counter()
        generate(prompts, 1)
        first = time.perf_counter() - start
        start = time.perf_counter()
        out = generate(prompts, tokens)
        total = time.perf_counter() - start
        print(MARK + json.dumps({"first_seconds": first, "all_seconds": total, "tokens": out}), flush=True)
    return 0


# -- the driver -------------------------------------------------------------------------------------

class Engine:
    """A worker process of one engine, spoken to line by line."""

    def __init__(self, name: str, root: Path, args: argparse.Namespace, snapshot: Path, scratch: Path) -> None:
        self.name = name
        self.log = scratch / f"{name.replace(' ', '-')}.log"
        env = {**os.environ, "PYTHONPATH": str(root), "TT_HOST_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1",
               "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TT_CACHE_PATH": str(scratch / "tt-cache")}
        kind = "transformers" if name == "transformers" else "vllm"
        command = [sys.executable, str(Path(__file__).resolve()), "--worker", kind, "--snapshot", str(snapshot),
                   "--precision", args.precision, "--threads", str(args.threads), "--tokens", str(args.tokens),
                   "--sequences", *map(str, args.sequences)]
        self.stderr = self.log.open("w")
        self.proc = subprocess.Popen(command, cwd=root, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr, text=True)
        start = time.perf_counter()
        self.facts = self._answer()
        self.facts["start_seconds"] = time.perf_counter() - start
        print(f"{name}: ready in {self.facts['start_seconds']:.0f} s ({self.facts['threads']} torch threads)", flush=True)

    def _answer(self) -> dict[str, Any]:
        out: IO[str] = self.proc.stdout  # type: ignore[assignment]
        for line in out:
            if line.startswith(MARK):
                return json.loads(line[len(MARK):])
        raise RuntimeError(f"{self.name} ended (exit {self.proc.wait()}); its log: {self.log}\n"
                           + self.log.read_text()[-3000:])

    def run(self, sequences: int, tokens: int) -> dict[str, Any]:
        self.proc.stdin.write(f"{sequences} {tokens}\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        return self._answer()

    def close(self) -> None:
        self.proc.stdin.close()  # type: ignore[union-attr]
        self.proc.wait(timeout=120)
        self.stderr.close()


def export_baseline(rev: str, scratch: Path) -> Path:
    """The ``models`` package of ``rev`` in a directory of its own (nothing in the checkout changes)."""
    root = scratch / "baseline"
    root.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", rev, "models"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive.stdout, check=True)
    return root


def summarize(measure: list[dict[str, Any]], sequences: int, tokens: int) -> dict[str, float]:
    first = statistics.median(m["first_seconds"] for m in measure)
    decode = statistics.median(sequences * (tokens - 1) / (m["all_seconds"] - m["first_seconds"]) for m in measure)
    end_to_end = statistics.median(sequences * tokens / m["all_seconds"] for m in measure)
    return {"decode_tokens_per_s": decode, "end_to_end_tokens_per_s": end_to_end, "prefill_seconds": first}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="a known model (prepared in TT_MODEL_DATA)")
    parser.add_argument("--sequences", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of every engine (the plugin's default: 1)")
    parser.add_argument("--precision", default="bfloat16", choices=["bfloat16", "bfloat8_b"])
    parser.add_argument("--baseline", default=PER_SEQUENCE_REV, help="git revision of the per-sequence plugin ('' : none)")
    parser.add_argument("--json", type=Path, default=REPO_ROOT / "docs" / "bench_host_forward.json")
    parser.add_argument("--png", type=Path, default=REPO_ROOT / "docs" / "bench_host_forward.png")
    parser.add_argument("--worker", choices=["vllm", "transformers"], help=argparse.SUPPRESS)
    parser.add_argument("--snapshot", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    if args.tokens < 2 or args.rounds < 1 or min(args.sequences) < 1:
        parser.error("--tokens must be >= 2, --rounds and --sequences >= 1")

    from _bench_output import Panel, figure, write_json

    from models.demos.real_models.prepare import prepare_model

    snapshot = prepare_model(args.model)
    engines = [e for e in ENGINES if args.baseline or e != "vllm per-sequence"]
    with tempfile.TemporaryDirectory(prefix="bench-host-forward-") as tmp:
        scratch = Path(tmp)
        roots = {"transformers": REPO_ROOT, "vllm batched": REPO_ROOT,
                 "vllm per-sequence": export_baseline(args.baseline, scratch) if args.baseline else REPO_ROOT}
        running = {name: Engine(name, roots[name], args, snapshot, scratch) for name in engines}
        measured: dict[str, dict[int, list[dict[str, Any]]]] = {name: {n: [] for n in args.sequences} for name in engines}
        try:
            for round_index in range(args.rounds):
                for n in args.sequences:
                    for name in engines:
                        measured[name][n].append(running[name].run(n, args.tokens))
                        m = measured[name][n][-1]
                        print(f"round {round_index + 1}, {n} sequences, {name}: prefill {m['first_seconds']:.2f} s, "
                              f"{args.tokens} tokens {m['all_seconds']:.2f} s", flush=True)
        finally:
            facts = {name: engine.facts for name, engine in running.items()}
            for engine in running.values():
                engine.close()

    results = {name: {n: summarize(measured[name][n], n, args.tokens) for n in args.sequences} for name in engines}
    reference = {n: measured["transformers"][n][-1]["tokens"] for n in args.sequences}
    for name in engines:
        for n in args.sequences:
            results[name][n]["sequences_equal_to_transformers"] = sum(
                a == b for a, b in zip(measured[name][n][-1]["tokens"], reference[n]))
    print(f"\n{args.model} ({snapshot.name[:12]}), cache {args.precision}, fp32 compute, {args.threads} torch thread(s), "
          f"{PROMPT_TOKENS}-token prompts, {args.tokens} greedy tokens, median of {args.rounds} rounds\n")
    header = " | ".join(f"{name} tok/s" for name in engines)
    vllm_names = " / ".join(name.removeprefix("vllm ") for name in engines if name != "transformers")
    print(f"| sequences | {header} | batched / transformers | batched / per-sequence | "
          f"sequences whose tokens = transformers' ({vllm_names}) |")
    print("| --- |" + " --- |" * (len(engines) + 3))
    for n in args.sequences:
        row = {name: results[name][n]["decode_tokens_per_s"] for name in engines}
        vs_base = f"{row['vllm batched'] / row['vllm per-sequence']:.2f}x" if "vllm per-sequence" in row else "-"
        equal = "/".join(f"{results[name][n]['sequences_equal_to_transformers']}" for name in engines if name != "transformers")
        print(f"| {n} | " + " | ".join(f"{v:.1f}" for v in row.values())
              + f" | {row['vllm batched'] / row['transformers']:.2f}x | {vs_base} | {equal} of {n} |")
    print("\n(decode tokens/s; end to end, prefill included:)")
    for n in args.sequences:
        print(f"  {n:>3} sequences: " + ", ".join(f"{name} {results[name][n]['end_to_end_tokens_per_s']:.1f}"
                                                  for name in engines))
    write_json(args.json, {"model": args.model, "snapshot": str(snapshot), "precision": args.precision,
                           "threads": args.threads, "tokens": args.tokens, "prompt_tokens": PROMPT_TOKENS,
                           "rounds": args.rounds, "baseline": args.baseline, "engines": facts,
                           "results": {name: {str(n): r for n, r in rows.items()} for name, rows in results.items()},
                           "measurements": {name: {str(n): [{k: v for k, v in m.items() if k != "tokens"} for m in ms]
                                                   for n, ms in rows.items()} for name, rows in measured.items()}})
    panels = [Panel("bars", {f"{n} seq": {name: results[name][n][key] for name in engines} for n in args.sequences},
                    title=title, ylabel="tokens/s", value_format="{:.1f}")
              for key, title in (("decode_tokens_per_s", "decode"), ("end_to_end_tokens_per_s", "end to end (prefill included)"))]
    figure(args.png, panels, title=f"{args.model}: {args.tokens} greedy tokens per sequence, "
                                   f"{args.threads} thread(s), {args.precision} cache, fp32 compute")
    print(f"wrote {args.json}\nwrote {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
