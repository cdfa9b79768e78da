#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Benchmark of resynthesis training on the prefill cache (the real Gemma 3 270M by default).

Three parts, measured side by side in one run (``--parts`` picks some):

``epochs``    the training loop in this process, on the same prompts: epoch 1 computes every
              parent prefill and stores it; epoch 2 is served from memory; a fresh process is
              served from disk. Per-step time, the part spent getting the parent's side, bytes on
              disk per prompt, and the targets (a served step spends <= 1/100 of epoch 1's
              prefill time on parent features; storing a wave adds <= 10% to computing it).
``trainers``  real ``python -m models.demos.resynthesis`` processes: one trainer alone, two at
              once on separate caches, two at once on one cache (each prefill once in all), two
              at once as before this change (2 torch threads each, libgomp's default waiting),
              and two at once with 2 threads each but sleeping waits (the CPU share off). Per
              trainer: its prefill seconds and its process seconds; the target: two at once
              <= 2.2x one alone.
``storage``   bytes per sample with float32 and bfloat16 features, and the bfloat16 loss with
              the cache (computed + stored, then from disk in a fresh process) against the
              uncached bfloat16 run: bit-identical or not.

Results: markdown tables on stdout, ``docs/bench_resynthesis.json`` and PNGs through
``scripts/_bench_output.py``. Usage::

    TT_MODEL_DATA=... TT_CACHE_PATH=... .venv/bin/python scripts/bench_resynthesis.py [--parts epochs,trainers,storage]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the demo does, before torch starts OpenMP

from models.common.device_env import ensure_host_cluster  # noqa: E402
from _bench_output import DEFAULT_OUT_DIR, write_results  # noqa: E402

ensure_host_cluster()
PARTS = ("epochs", "trainers", "storage")


# ---------------------------------------------------------------------------------------------
# epochs: the training loop in process
# ---------------------------------------------------------------------------------------------


def run_phase(args: argparse.Namespace, epochs: int) -> dict:
    """Train ``epochs`` epochs on the prompt set; return the reports and what the cache holds."""
    from loguru import logger

    from models.demos.resynthesis import prompts as prompt_sets
    from models.demos.resynthesis.__main__ import resolve_model
    from models.demos.resynthesis.train import Trainer, TrainConfig
    from models.resynthesis.parent import FrozenParent
    from models.resynthesis.source import ParentFeatureSource
    from models.resynthesis.waves import FeatureProducer

    from models.resynthesis.threads import ThreadShare

    logger.remove()
    threads = ThreadShare().start()  # the demo's thread policy: a share of the CPUs other work leaves free
    model = resolve_model(args.model)
    parent = FrozenParent.load(model, precision=args.precision, cache_root=args.weight_cache)
    if args.prompt_kind == "text":
        prompts = prompt_sets.text(args.prompts, args.min_tokens, args.max_tokens, Path(model), args.seed)
    else:
        prompts = prompt_sets.synthetic(args.prompts, args.min_tokens, args.max_tokens, parent.vocab_size, args.seed)
    producer = FeatureProducer(parent, args.prefill_cache, threads=threads)
    source = ParentFeatureSource(producer, lru_capacity=len(prompts))
    config = TrainConfig(epochs=epochs, batch_size=args.batch_size, seed=args.seed)
    reports = Trainer(source, prompts, config).run(print_lines=True)
    threads.close()
    stored = [p for p in Path(args.prefill_cache).rglob("*") if p.is_file() and not p.name.endswith(".lock")]
    return {
        "epochs": [asdict(r) for r in reports],
        "prompt_tokens": [int(p.numel()) for p in prompts],
        "disk_bytes": sum(p.stat().st_size for p in stored),
        "parent": asdict(parent.identity),
        "threads": sorted({count for _, count in threads.history} - {0}),
    }


def bench_epochs(args: argparse.Namespace, temp: Path) -> dict:
    args.prefill_cache = temp / "epochs-prefill"
    filled = run_phase(args, epochs=2)
    command = [sys.executable, __file__, "--phase", "disk", "--prefill-cache", str(args.prefill_cache)]
    for name in ("model", "precision", "prompts", "min_tokens", "max_tokens", "prompt_kind", "batch_size", "seed",
                 "weight_cache"):
        value = getattr(args, name)
        if value is not None:
            command += [f"--{name.replace('_', '-')}", str(value)]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    disk = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT"))[6:])
    med = statistics.median
    epoch1, memory, fresh = filled["epochs"][0], filled["epochs"][1], disk["epochs"][0]

    def phase(report: dict) -> dict:
        lookups = report["lru_hits"] + report["lru_misses"]
        disk_lookups = report["disk_hits"] + report["disk_misses"]
        return {"step_s": med(report["step_seconds"]), "feature_step_s": med(report["feature_step_seconds"]),
                "head_step_s": report["head_seconds"] / report["steps"], "prefills": report["prefills"],
                "memory_hit_rate": report["lru_hits"] / lookups if lookups else 0.0,
                "disk_hit_rate": report["disk_hits"] / disk_lookups if disk_lookups else None, "loss": report["loss"]}

    prefill_per_step = epoch1["prefill_seconds"] / epoch1["steps"]
    summary = {
        "prompts": args.prompts, "min_tokens": args.min_tokens, "max_tokens": args.max_tokens,
        "prompt_tokens_total": sum(filled["prompt_tokens"]), "threads": filled["threads"],
        "epoch1": phase(epoch1), "memory": phase(memory), "disk": phase(fresh),
        "prefill_s_per_step_epoch1": prefill_per_step,
        "store_over_compute": epoch1["store_seconds"] / epoch1["prefill_seconds"],
        "disk_bytes_per_prompt": filled["disk_bytes"] / args.prompts,
    }
    summary["memory_feature_over_prefill"] = summary["memory"]["feature_step_s"] / prefill_per_step
    summary["disk_feature_over_prefill"] = summary["disk"]["feature_step_s"] / prefill_per_step
    print(f"\n## epochs: {args.prompts} {args.prompt_kind} prompts, {args.min_tokens}-{args.max_tokens} tokens "
          f"({summary['prompt_tokens_total']} in all), batch {args.batch_size}; medians per training step\n")
    print("| phase | step s | parent features s | parent logits from the LM head s | parent prefills | "
          "memory hit rate | disk hit rate |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for label, key in (("epoch 1: computed and stored", "epoch1"), ("epoch 2: from memory", "memory"),
                       ("fresh process: from disk", "disk")):
        p = summary[key]
        disk_rate = "-" if p["disk_hit_rate"] is None else f"{p['disk_hit_rate']:.0%}"
        print(f"| {label} | {p['step_s']:.3f} | {p['feature_step_s']:.5f} | {p['head_step_s']:.4f} | {p['prefills']} | "
              f"{p['memory_hit_rate']:.0%} | {disk_rate} |")
    print(f"\nprefill per step in epoch 1: {prefill_per_step:.3f} s; bytes on disk per prompt: "
          f"{summary['disk_bytes_per_prompt']:,.0f}")
    for label, key in (("from memory", "memory_feature_over_prefill"), ("from disk", "disk_feature_over_prefill")):
        ratio = summary[key]
        print(f"served step ({label}): parent features 1/{1 / ratio:,.0f} of epoch 1's prefill (target 1/100: "
              f"{'met' if ratio <= 0.01 else 'MISSED'})")
    ratio = summary["store_over_compute"]
    print(f"storing a wave: {ratio:.1%} of computing it (target 10%: {'met' if ratio <= 0.10 else 'MISSED'})")
    return {"summary": summary, "fill": filled, "disk": disk}


# ---------------------------------------------------------------------------------------------
# trainers: real demo processes side by side
# ---------------------------------------------------------------------------------------------


def _demo_command(args: argparse.Namespace, *extra: str) -> list[str]:
    command = [sys.executable, "-m", "models.demos.resynthesis", "--model", args.model, "--precision", args.precision,
               "--epochs", "1", "--batch-size", str(args.batch_size), "--seed", str(args.seed), *extra]
    return command + (["--weight-cache", str(args.weight_cache)] if args.weight_cache else [])


def _run_together(commands: list[tuple[list[str], dict[str, str]]]) -> tuple[float, list[dict]]:
    """Start every command at once; (wall seconds until the last exits, each one's JSON + seconds)."""
    start = time.perf_counter()
    running = [(subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True), time.perf_counter(), command) for command, env in commands]
    results = []
    for process, started, command in running:
        out, err = process.communicate()
        seconds = time.perf_counter() - started
        if process.returncode != 0:
            raise RuntimeError(f"{command} failed ({process.returncode}):\n{out[-2000:]}\n{err[-3000:]}")
        report_path = Path(command[command.index("--json") + 1])
        results.append({"process_s": seconds, **json.loads(report_path.read_text())})
    return time.perf_counter() - start, results


def bench_trainers(args: argparse.Namespace, temp: Path) -> dict:
    prompts = ("--prompts", str(args.trainer_prompts), "--min-tokens", str(args.trainer_min_tokens),
               "--max-tokens", str(args.trainer_max_tokens))
    base_env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), TT_CPU_SHARE_DIR=str(temp / "cpu-share"))
    base_env.pop("OMP_NUM_THREADS", None)
    base_env.pop("OMP_WAIT_POLICY", None)
    # Build/warm the weight cache and the tokenizer's files once, outside every measurement.
    _run_together([(_demo_command(args, "--prompts", "1", "--no-cache", "--json", str(temp / "warmup.json")),
                    base_env)])

    def trainer(name: str, cache: str, *extra: str, **env: str) -> tuple[list[str], dict[str, str]]:
        command = _demo_command(args, *prompts, "--prefill-cache", str(temp / cache), "--json",
                                str(temp / f"{name}.json"), *extra)
        return command, {**base_env, **env}

    scenarios = {
        "one alone": [trainer("alone", "alone")],
        "two at once, separate caches": [trainer("sep-a", "sep-a"), trainer("sep-b", "sep-b")],
        "two at once, one cache": [trainer("one-a", "shared"), trainer("one-b", "shared")],
        "one alone, 2 threads": [trainer("alone2", "alone2", "--threads", "2")],
        "two at once, 2 threads each, no spinning": [
            trainer("passive-a", "passive-a", "--threads", "2"), trainer("passive-b", "passive-b", "--threads", "2")],
        # Before this change: 2 torch threads each and libgomp's default wait policy (an empty
        # OMP_WAIT_POLICY keeps the demo from choosing PASSIVE; libgomp warns and uses its default).
        "two at once, before (2 threads each, OpenMP default)": [
            trainer("old-a", "old-a", "--threads", "2", OMP_WAIT_POLICY=""),
            trainer("old-b", "old-b", "--threads", "2", OMP_WAIT_POLICY="")],
    }
    runs: dict[str, list[dict]] = {label: [] for label in scenarios}
    for round_index in range(args.rounds):  # interleaved, so a change of the machine's load hits every scenario
        for label, commands in scenarios.items():
            if label.startswith("two at once, before") and round_index >= args.before_rounds:
                continue
            for name in ("cache-alone", "alone", "alone2", "sep-a", "sep-b", "shared", "passive-a", "passive-b",
                         "old-a", "old-b"):
                shutil.rmtree(temp / name, ignore_errors=True)  # every round starts from empty caches
            wall, results = _run_together(commands)
            runs[label].append({
                "wall_s": wall, "load_average": os.getloadavg()[0],
                "prefill_s": [sum(e["prefill_seconds"] for e in r["epochs"]) for r in results],
                "feature_s": [sum(e["feature_seconds"] for e in r["epochs"]) for r in results],
                "process_s": [r["process_s"] for r in results],
                "prefills": [sum(e["prefills"] for e in r["epochs"]) for r in results],
                "waited": [sum(e["waited"] for e in r["epochs"]) for r in results],
                "threads": [sorted({t for _, t in r["threads"]["history"]} - {0}) for r in results],
            })
            print(f"  round {round_index + 1}, {label}: {runs[label][-1]}", flush=True)
    med = statistics.median
    measured = {}
    for label, rounds in runs.items():
        measured[label] = {
            "rounds": rounds,
            "wall_s": med(r["wall_s"] for r in rounds),
            "prefill_s": [med(r["prefill_s"][i] for r in rounds) for i in range(len(rounds[0]["prefill_s"]))],
            "feature_s": [med(r["feature_s"][i] for r in rounds) for i in range(len(rounds[0]["feature_s"]))],
            "process_s": [med(r["process_s"][i] for r in rounds) for i in range(len(rounds[0]["process_s"]))],
            "prefills": rounds[-1]["prefills"], "waited": rounds[-1]["waited"], "threads": rounds[-1]["threads"],
        }
    alone = measured["one alone"]
    print(f"\n## trainers: {args.trainer_prompts} text prompts of {args.trainer_min_tokens}-{args.trainer_max_tokens} "
          f"tokens, 1 epoch each, real processes started together; median of {args.rounds} interleaved rounds "
          f"({args.before_rounds} for 'before')\n")
    print("| scenario | parent prefills (each) | prefill s per trainer | vs alone | features s per trainer | "
          "process s per trainer | wall s | threads used |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for label, m in measured.items():
        ratio = max(m["feature_s"]) / alone["feature_s"][0]
        m["features_vs_alone"] = ratio
        m["wall_vs_alone"] = m["wall_s"] / alone["wall_s"]
        print(f"| {label} | {' + '.join(map(str, m['prefills']))} | "
              f"{' / '.join(f'{s:.1f}' for s in m['prefill_s'])} | {ratio:.2f}x | "
              f"{' / '.join(f'{s:.1f}' for s in m['feature_s'])} | {' / '.join(f'{s:.1f}' for s in m['process_s'])} | "
              f"{m['wall_s']:.1f} | {' / '.join(map(str, m['threads']))} |")
    ratio = measured["two at once, separate caches"]["features_vs_alone"]
    print(f"\ntwo at once vs one alone (parent features per trainer, separate caches): {ratio:.2f}x "
          f"(target <= 2.2x: {'met' if ratio <= 2.2 else 'MISSED'}); before this change: "
          f"{measured['two at once, before (2 threads each, OpenMP default)']['features_vs_alone']:.2f}x")
    return measured


# ---------------------------------------------------------------------------------------------
# storage: bytes per sample, float32 vs bfloat16
# ---------------------------------------------------------------------------------------------


def bench_storage(args: argparse.Namespace, temp: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), TT_CPU_SHARE_DIR=str(temp / "cpu-share"))
    prompts = ("--prompts", str(args.storage_prompts), "--min-tokens", str(args.min_tokens),
               "--max-tokens", str(args.max_tokens))
    runs = {}
    for name, extra in (("float32", ("--prefill-cache", str(temp / "f32"))),
                        ("bfloat16", ("--feature-dtype", "bfloat16", "--prefill-cache", str(temp / "bf16"))),
                        ("bfloat16 from disk", ("--feature-dtype", "bfloat16", "--prefill-cache", str(temp / "bf16"))),
                        ("bfloat16 uncached", ("--feature-dtype", "bfloat16", "--no-cache"))):
        command = _demo_command(args, *prompts, *extra, "--json", str(temp / f"storage-{name}.json"))
        command[command.index("--epochs") + 1] = "2"
        _, (result,) = _run_together([(command, env)])
        runs[name] = result
    f32, bf16 = runs["float32"]["storage"], runs["bfloat16"]["storage"]
    losses = {name: [e["losses"] for e in r["epochs"]] for name, r in runs.items()}
    summary = {
        "bytes_per_sample": {"float32": f32["bytes_per_sample"], "bfloat16": bf16["bytes_per_sample"]},
        "feature_bytes_per_sample": {"float32": f32["feature_bytes_per_sample"],
                                     "bfloat16": bf16["feature_bytes_per_sample"]},
        "bfloat16_over_float32": bf16["bytes_per_sample"] / f32["bytes_per_sample"],
        "bfloat16_cached_equals_uncached": losses["bfloat16"] == losses["bfloat16 uncached"]
        == losses["bfloat16 from disk"],
        "loss": {name: [r["epochs"][-1]["loss"]] for name, r in runs.items()},
        "float32_minus_bfloat16_final_loss": (runs["float32"]["epochs"][-1]["loss"]
                                              - runs["bfloat16"]["epochs"][-1]["loss"]),
    }
    print(f"\n## storage: {args.storage_prompts} text prompts of {args.min_tokens}-{args.max_tokens} tokens, "
          "2 epochs\n")
    print("| features | bytes per sample | of which features | final loss |")
    print("| --- | --- | --- | --- |")
    for name in ("float32", "bfloat16"):
        s = runs[name]["storage"]
        print(f"| {name} | {s['bytes_per_sample']:,.0f} | {s['feature_bytes_per_sample']:,.0f} | "
              f"{runs[name]['epochs'][-1]['loss']:.6f} |")
    print(f"\nbfloat16 / float32 bytes per sample: {summary['bfloat16_over_float32']:.3f}; bfloat16 loss with the "
          "cache (computed + stored, from memory, from disk in a fresh process) bit-identical to the uncached "
          f"bfloat16 run: {summary['bfloat16_cached_equals_uncached']}")
    return {"summary": summary, "runs": runs}


# ---------------------------------------------------------------------------------------------


def charts(results: dict) -> dict[str, dict]:
    found = {}
    if "epochs" in results:
        s = results["epochs"]["summary"]
        phases = {"epoch 1 (computed + stored)": "epoch1", "epoch 2 (from memory)": "memory",
                  "fresh process (from disk)": "disk"}
        found[""] = dict(groups={
            label: {"step": s[key]["step_s"], "parent features": s[key]["feature_step_s"]}
            for label, key in phases.items()},
            title=f"Resynthesis on Gemma 3 270M: {s['prompts']} prompts, {s['min_tokens']}-{s['max_tokens']} tokens",
            ylabel="seconds per training step (median, log)", log=True)
    if "trainers" in results:
        found["trainers"] = dict(groups={
            label.replace(", ", ",\n"): {"parent features s per trainer (max)": max(m["feature_s"]),
                                          "wall s": m["wall_s"]}
            for label, m in results["trainers"].items()},
            title="Two trainers at once vs one alone (real processes, Gemma 3 270M)", ylabel="seconds", log=True)
    if "storage" in results:
        s = results["storage"]["summary"]
        found["storage"] = dict(groups={
            dtype: {"bytes per sample": s["bytes_per_sample"][dtype],
                    "of which features": s["feature_bytes_per_sample"][dtype]}
            for dtype in ("float32", "bfloat16")},
            title="Prefill cache: bytes per sample (Gemma 3 270M)", ylabel="bytes")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {', '.join(PARTS)}")
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--precision", default="bfloat16")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--min-tokens", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--prompt-kind", choices=["text", "synthetic"], default="text")
    parser.add_argument("--trainer-prompts", type=int, default=32)
    parser.add_argument("--trainer-min-tokens", type=int, default=64)
    parser.add_argument("--trainer-max-tokens", type=int, default=128)
    parser.add_argument("--storage-prompts", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of the trainers part")
    parser.add_argument("--before-rounds", type=int, default=1, help="of which with the old thread policy (slow)")
    parser.add_argument("--out-name", default="bench_resynthesis", help="<out-dir>/<name>.json and PNGs")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--weight-cache", type=Path, default=None)
    parser.add_argument("--prefill-cache", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--phase", choices=["disk"], default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    args = parser.parse_args()
    if args.phase == "disk":  # the fresh process of the epochs part
        print("RESULT" + json.dumps(run_phase(args, epochs=1)), flush=True)
        return
    parts = [part for part in args.parts.split(",") if part]
    unknown = set(parts) - set(PARTS)
    if unknown:
        parser.error(f"unknown parts {sorted(unknown)}")
    if args.model == "gemma3-270m":  # prepared once, outside every measurement
        from models.demos.real_models.prepare import prepare_gemma3_270m

        prepare_gemma3_270m()
    results: dict = {"model": args.model, "precision": args.precision,
                     "load_average": os.getloadavg(), "cpus": len(os.sched_getaffinity(0))}
    with tempfile.TemporaryDirectory(prefix="bench-resynthesis-") as temp:
        for part in parts:
            results[part] = {"epochs": bench_epochs, "trainers": bench_trainers, "storage": bench_storage}[part](
                args, Path(temp))
    results["load_average_after"] = os.getloadavg()
    write_results(args.out_dir, args.out_name, results, charts(results))


if __name__ == "__main__":
    main()
