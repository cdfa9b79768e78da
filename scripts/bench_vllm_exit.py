#!/usr/bin/env python
# SPDX-License-Identifier: Apache-2.0
"""How fast a script using ``vllm.LLM`` lets go of its engines and exits: without the plugin's
two exit fixes, with the engine-core signal forwarding only (``TT_VLLM_FORWARD_SIGNALS``), and
with the heap also frozen at exit (``TT_VLLM_FREEZE_AT_EXIT``), side by side in one run.

    .venv-vllm/bin/python scripts/bench_vllm_exit.py [--rounds 9] [--offline-runs 9] [--model DIR] [--json F] [--png F]

Engines in one process: each variant is one fresh process (vLLM's default multiprocess engine) that builds ``--rounds``
engines on a tiny Llama one after the other, serves one request on each and shuts it down as the
end of a script does (SIGTERM to the engine core, SIGKILL 5 s later if it is still there); the last
engine is left to the interpreter's exit. Reported: each shutdown's seconds, how many engine cores
vLLM had to SIGKILL (exit code -9), and the seconds from the script's last line to its exit.
``--child MODEL ROUNDS`` is that process (``tests/ttnn/vllm/test_vllm_exit.py`` runs it too).

Offline runs (``--offline-runs N``): ``scripts/offline_inference_tt.py`` run N times per variant,
each a fresh process, as the issue counted them: how many ended with vLLM SIGKILLing the engine
core, the whole process's seconds, and the seconds from ``main()`` returning to the process's exit.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
FORWARD_ENV = "TT_VLLM_FORWARD_SIGNALS"
FREEZE_ENV = "TT_VLLM_FREEZE_AT_EXIT"
VARIANTS = {  # variant -> (forward signals, freeze the heap at exit)
    "neither (vLLM as shipped)": ("0", "0"),
    "signals forwarded": ("1", "0"),
    "signals forwarded + heap frozen": ("1", "1"),
}


FORCE_KILL_MESSAGE = "force killing remaining process "  # vLLM's warning before it SIGKILLs an engine core
FORCE_KILL_LINE = "FORCE-KILL "


def process_state(pid: int) -> str:
    """``alive``, or ``exited`` when the process is gone or a zombie (it ended by itself)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "exited"
    return "exited" if stat[stat.rindex(")") + 2] == "Z" else "alive"


class ForceKillWitness(logging.Handler):
    """Prints, at vLLM's force-kill warning and before its SIGKILL, whether the engine core was still alive.

    vLLM can warn and SIGKILL an engine core that already exited: its liveness-monitor thread and
    its shutdown both ``waitpid`` the process, and the one that loses the race reads "alive". Only
    an engine core alive after the grace period is one the SIGTERM did not end."""

    def emit(self, record: logging.LogRecord) -> None:
        if FORCE_KILL_MESSAGE in str(record.msg) and isinstance(record.args, tuple) and len(record.args) == 2:
            print(f"{FORCE_KILL_LINE}{record.args[1]} {process_state(int(record.args[1]))}", flush=True)


def watch_force_kills() -> None:
    """Attach one :class:`ForceKillWitness` to the logger of vLLM's process shutdown."""
    shutdown_logger = logging.getLogger("vllm.v1.utils")
    if not any(isinstance(handler, ForceKillWitness) for handler in shutdown_logger.handlers):
        shutdown_logger.addHandler(ForceKillWitness())


def child(model: str, rounds: int) -> None:
    """Build, use and shut down ``rounds`` engines; print their shutdowns, then the end time."""
    from vllm import LLM, SamplingParams

    results = []
    for index in range(rounds):
        llm = LLM(model=model, skip_tokenizer_init=True, max_model_len=64, max_num_seqs=2,
                  additional_config={"precision": "bfloat16"})
        watch_force_kills()  # after the engine is built: building it configures vLLM's logging anew
        llm.generate([{"prompt_token_ids": [1, 2, 3]}], SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)
        if index == rounds - 1:
            break  # the last engine is shut down by the interpreter's exit, as at the end of a script
        client = llm.llm_engine.engine_core
        process = client.resources.engine_manager.processes[0]
        start = time.monotonic()
        client.shutdown()
        shutdown_seconds = time.monotonic() - start
        results.append({"shutdown_seconds": shutdown_seconds, "exitcode": exit_code(process)})
        del llm
    print("ROUNDS " + json.dumps(results), flush=True)
    print(f"END {time.time():.6f}", flush=True)


def exit_code(process: Any, timeout: float = 10.0) -> int | None:
    """The engine core's exit code (-9: SIGKILLed), waited for: vLLM's monitor thread may be the
    one that reaps it, and sets the code a moment after the shutdown returned."""
    deadline = time.monotonic() + timeout
    while process.exitcode is None and time.monotonic() < deadline:
        time.sleep(0.01)
    return process.exitcode


def run_child(model: Path, rounds: int, env: dict[str, str]) -> dict[str, Any]:
    """One child process: its rounds, its exit seconds after the last line, its output."""
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--child", str(model), str(rounds)],
                            cwd=REPO_ROOT, env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1", **env},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, end = [], None
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("END "):
            end = float(line.split()[1])
    proc.wait(timeout=1800)
    exited = time.time()
    output = "".join(lines)
    if proc.returncode != 0 or end is None:
        raise RuntimeError(f"exit child failed ({proc.returncode}):\n{output[-4000:]}")
    rounds_line = next(line for line in lines if line.startswith("ROUNDS "))
    return {"rounds": json.loads(rounds_line[len("ROUNDS "):]), "exit_seconds": exited - end,
            "force_killed": sum(line.split()[-1] == "alive" for line in lines if line.startswith(FORCE_KILL_LINE)),
            "force_kill_warnings": output.count(FORCE_KILL_MESSAGE), "output": output}


OFFLINE_WRAPPER = """
import runpy, sys, time
script = runpy.run_path(sys.argv[1], run_name="offline_example")
code = script["main"](sys.argv[2:])
print("END %.6f" % time.time(), flush=True)
sys.exit(code)
"""


def offline_run(model: Path, env: dict[str, str]) -> dict[str, Any]:
    """One run of the offline example (vLLM's multiprocess engine), timed from outside."""
    args = ["--model", str(model), "--skip_tokenizer_init", "--prompts_json", str(_token_prompts()), "--greedy_sampling",
            "--max_tokens", "4", "--precision", "bfloat16", "--max_model_len", "64"]
    start = time.time()
    proc = subprocess.run([sys.executable, "-c", OFFLINE_WRAPPER, str(REPO_ROOT / "scripts" / "offline_inference_tt.py"),
                           *args], cwd=REPO_ROOT, env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1", **env},
                          capture_output=True, text=True, timeout=1800)
    exited = time.time()
    output = proc.stdout + proc.stderr
    end = next((float(line.split()[1]) for line in proc.stdout.splitlines() if line.startswith("END ")), None)
    if proc.returncode != 0 or end is None:
        raise RuntimeError(f"offline example failed ({proc.returncode}):\n{output[-4000:]}")
    return {"process_seconds": exited - start, "exit_seconds_after_main": exited - end,
            "sigkilled": FORCE_KILL_MESSAGE in output}


def _token_prompts() -> Path:
    path = Path(tempfile.gettempdir()) / "bench_vllm_exit_prompts.json"
    path.write_text(json.dumps([{"prompt_token_ids": [1, 5, 77, 300]}, {"prompt_token_ids": [7, 8, 9]}]))
    return path


def summary(result: dict[str, Any]) -> dict[str, Any]:
    shutdowns = [r["shutdown_seconds"] for r in result["rounds"]]
    return {"shutdown_seconds": shutdowns, "median_shutdown_seconds": statistics.median(shutdowns),
            "max_shutdown_seconds": max(shutdowns), "engines_sigkilled": result["force_killed"],
            "engines": len(shutdowns) + 1, "exit_seconds_after_last_line": result["exit_seconds"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "ROUNDS"), help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=9, help="engines per variant (default 9)")
    parser.add_argument("--offline-runs", type=int, default=0, help="offline example runs per variant (default 0: none)")
    parser.add_argument("--model", type=Path, help="checkpoint (default: a tiny random Llama)")
    parser.add_argument("--json", type=Path, default=REPO_ROOT / "docs" / "bench_vllm_exit.json")
    parser.add_argument("--png", type=Path, default=REPO_ROOT / "docs" / "bench_vllm_exit.png")
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]))
        return 0
    from _bench_output import bar_chart, write_json

    with tempfile.TemporaryDirectory(prefix="bench-vllm-exit-") as scratch:
        model = args.model
        if model is None:
            from models.testing.tiny_models import make_checkpoint

            model = make_checkpoint("llama", Path(scratch) / "tiny-llama")
        env = {"TT_CACHE_PATH": str(Path(scratch) / "tt-cache")}
        results: dict[str, Any] = {}
        offline: dict[str, Any] = {}
        for variant, (forward, freeze) in VARIANTS.items():
            print(f"{variant}: {args.rounds} engines ...", flush=True)
            variant_env = {**env, FORWARD_ENV: forward, FREEZE_ENV: freeze}
            results[variant] = summary(run_child(model, args.rounds, variant_env))
        for index in range(args.offline_runs):  # round-robin: machine noise hits every variant alike
            for variant, (forward, freeze) in VARIANTS.items():
                print(f"offline run {index + 1}/{args.offline_runs}, {variant} ...", flush=True)
                offline.setdefault(variant, []).append(offline_run(model, {**env, FORWARD_ENV: forward, FREEZE_ENV: freeze}))
    print("\nengines in one process:\n")
    print("| variant | engines | SIGKILLed by vLLM | shutdown median s | shutdown max s | exit after last line s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for variant, r in results.items():
        print(f"| {variant} | {r['engines']} | {r['engines_sigkilled']} | {r['median_shutdown_seconds']:.2f} | "
              f"{r['max_shutdown_seconds']:.2f} | {r['exit_seconds_after_last_line']:.2f} |")
    offline_summary = {variant: {"runs": len(runs), "sigkilled": sum(r["sigkilled"] for r in runs),
                                 "median_process_seconds": statistics.median(r["process_seconds"] for r in runs),
                                 "median_exit_seconds_after_main": statistics.median(r["exit_seconds_after_main"] for r in runs),
                                 "runs_detail": runs}
                       for variant, runs in offline.items()}
    if offline_summary:
        print("\noffline example runs (fresh process each):\n")
        print("| variant | runs | engine core SIGKILLed by vLLM | process s (median) | exit after main() s (median) |")
        print("| --- | --- | --- | --- | --- |")
        for variant, r in offline_summary.items():
            print(f"| {variant} | {r['runs']} | {r['sigkilled']} | {r['median_process_seconds']:.2f} | "
                  f"{r['median_exit_seconds_after_main']:.2f} |")
    write_json(args.json, {"rounds": args.rounds, "results": results, "offline_runs": offline_summary})
    charts = {v: {"shutdown median s": r["median_shutdown_seconds"], "shutdown max s": r["max_shutdown_seconds"],
                  "exit after last line s": r["exit_seconds_after_last_line"]} for v, r in results.items()}
    for variant, r in offline_summary.items():
        charts[variant]["offline: exit after main() s"] = r["median_exit_seconds_after_main"]
    bar_chart(args.png, charts, title=f"vllm.LLM shutdown and script exit ({args.rounds} engines, "
                                      f"{args.offline_runs} offline runs per variant)", ylabel="seconds")
    print(f"wrote {args.json}\nwrote {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
