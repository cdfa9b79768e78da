# SPDX-License-Identifier: Apache-2.0
"""Resynthesis training from a frozen backbone's cached prefill features.

    python -m models.demos.resynthesis                      # the real Gemma 3 270M, 64 text prompts
    python -m models.demos.resynthesis --model DIR          # any checkpoint a loader reads (its tokenizer too)
    python -m models.demos.resynthesis --prompts FILE       # your prompts: text lines, or .jsonl text / token ids
    python -m models.demos.resynthesis --no-cache           # every step runs the parent's prefill

The parent is loaded through the project's loaders (warm from the ttnn weight cache), its
prefill features go to the durable prefill cache (``--prefill-cache``, default
``$TT_CACHE_PATH/prefill``; ``--prefill-cache-max-size`` or ``TT_PREFILL_CACHE_MAX_SIZE`` caps
it, least recently used objects are evicted) behind an in-memory LRU, and a small child head is
trained with KL to the parent's next-token distribution. Each epoch prints its loss, its parent
prefills and its memory/disk hit counts; the end prints what the prefill cache holds and its bytes
per sample. Trainers sharing a cache compute each prefill once in all (the second waits for the
first's features), and share the CPUs (``--threads auto``) instead of oversubscribing them. A
full disk under the cache does not stop training: the features stay in memory and the end says
what was not stored. ``--checkpoint`` keeps the child after every epoch; running again with the
same checkpoint continues where it stopped (``--epochs`` is the total) and refuses a checkpoint
of another parent, precision, feature dtype, prompt set or configuration.

Exit status: 0 done, 1 done but a requested checkpoint could not be written, 2 bad input (no such
model, bad sizes, an unusable prompt file, a checkpoint this run cannot resume).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from models.common import envs
from models.common.device_env import ensure_host_cluster
from models.common.units import format_bytes

ensure_host_cluster()
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Before torch starts OpenMP: a team thread that waits for work sleeps instead of spinning. A
# spinning thread steals the CPU that another process (another trainer, anything) needs, and a
# descheduled team member stalls the whole team: on this 2-core machine under load a 2-thread
# prefill of a small model took 20-100x its 1-thread time with spinning, 1-5x without.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

EXIT_OK, EXIT_UNSAVED, EXIT_BAD_INPUT = 0, 1, 2


class BadInput(Exception):
    """Input this run cannot use: printed as one ``error:`` line, exit 2."""


def _threads(text: str) -> int | None:
    if text == "auto":
        return None
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive thread count or 'auto', got {text!r}")
    return int(text)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # bad usage: exit 2 with one line, never a traceback
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = _Parser(prog="python -m models.demos.resynthesis", description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gemma3-270m", help="checkpoint dir / HF id, or gemma3-270m (prepared once)")
    parser.add_argument("--precision", default="bfloat16", choices=["bfloat16", "bfloat8_b", "bfloat4_b", "float32"])
    parser.add_argument("--weight-cache", type=Path, default=None, help="ttnn weight cache root ($TT_CACHE_PATH)")
    parser.add_argument("--prefill-cache", type=Path, default=None, help="prefill cache root")
    parser.add_argument("--prefill-cache-max-size", default=None, metavar="SIZE",
                        help="size cap of the prefill cache, e.g. 20G (default: $TT_PREFILL_CACHE_MAX_SIZE, "
                             "else none); least recently used objects are evicted")
    parser.add_argument("--prompts", default="64", metavar="FILE|N",
                        help="a prompt file (one text prompt per line; or .jsonl: a JSON string, a list of token "
                             "ids, {\"text\": ...} or {\"tokens\": [...]} per line), or N generated prompts")
    parser.add_argument("--min-tokens", type=int, default=128, help="length range of generated prompts")
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--prompt-kind", choices=["text", "synthetic"], default=None,
                        help="generated prompts: text (stdlib docstrings through the model's tokenizer) or "
                             "synthetic token ids; default: text when the checkpoint has a tokenizer")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--feature-dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="dtype the features are trained on and stored in (bfloat16 halves the bytes "
                             "per sample)")
    parser.add_argument("--threads", type=_threads, default=None, metavar="N|auto",
                        help="torch threads: auto (default) shares the CPUs this process may use "
                             "(sched_getaffinity, capped by OMP_NUM_THREADS) with the other trainers "
                             "computing at the same time; N fixes N")
    parser.add_argument("--no-cache", action="store_true", help="compute the parent's prefill at every step")
    parser.add_argument("--checkpoint", type=Path, default=None, help="child checkpoint (written every epoch)")
    parser.add_argument("--json", type=Path, default=None, help="also write the epoch reports here")
    return parser.parse_args(argv)


def resolve_model(name: str) -> Path | str:
    if name == "gemma3-270m":
        from models.demos.real_models.prepare import prepare_gemma3_270m

        return prepare_gemma3_270m()
    return name


def _check_sizes(args: argparse.Namespace) -> int | None:
    """The prefill cache's size cap; BadInput for sizes that make no sense."""
    from models.common.prefill_cache.maintenance import max_bytes_from_env
    from models.common.units import parse_size

    if args.epochs < 1 or args.batch_size < 1 or not 1 <= args.min_tokens <= args.max_tokens:
        raise BadInput("--epochs, --batch-size must be >= 1 and 1 <= --min-tokens <= --max-tokens")
    if args.width < 1:
        raise BadInput("--width must be >= 1")
    if args.json is not None and not args.json.parent.is_dir():
        raise BadInput(f"--json {args.json}: no such directory {args.json.parent}")
    try:
        return parse_size(args.prefill_cache_max_size) if args.prefill_cache_max_size else max_bytes_from_env()
    except ValueError as error:
        raise BadInput(str(error)) from None


def _prompt_source(args: argparse.Namespace) -> Path | int:
    """``--prompts``: an existing file, else a count of generated prompts."""
    path = Path(args.prompts)
    if path.is_file():
        return path
    if args.prompts.isdigit() and int(args.prompts) >= 1:
        return int(args.prompts)
    if path.exists():
        raise BadInput(f"--prompts {args.prompts}: not a file")
    raise BadInput(f"--prompts {args.prompts}: no such prompt file (or give a count of generated prompts >= 1)")


def load_prompts(args: argparse.Namespace, model: Path | str, parent: Any) -> tuple[list, str]:
    """The run's prompts and what they are; BadInput when they cannot be had."""
    from models.common.checkpoint import resolve_checkpoint_dir
    from models.demos.resynthesis import prompts as prompt_sets

    source = _prompt_source(args)
    checkpoint_dir = resolve_checkpoint_dir(model)
    tokenizer = None
    if prompt_sets.has_tokenizer(checkpoint_dir) and (isinstance(source, Path) or args.prompt_kind != "synthetic"):
        try:
            tokenizer = prompt_sets.load_tokenizer(checkpoint_dir)
        except Exception as error:  # noqa: BLE001 - transformers raises many types for a bad tokenizer
            raise BadInput(f"cannot load the tokenizer of {checkpoint_dir}: {type(error).__name__}: "
                           f"{str(error)[:300]}") from None
    if isinstance(source, Path):
        try:
            return prompt_sets.from_file(source, tokenizer, parent.vocab_size), f"file {source}"
        except prompt_sets.PromptFileError as error:
            raise BadInput(str(error)) from None
    kind = args.prompt_kind or ("text" if tokenizer is not None else "synthetic")
    if kind == "text":
        if tokenizer is None:
            raise BadInput(f"--prompt-kind text needs a tokenizer, and {args.model} has none "
                           f"(looked for {', '.join(prompt_sets.TOKENIZER_FILES)})")
        prompts = prompt_sets.text(source, args.min_tokens, args.max_tokens, tokenizer, args.seed)
    else:
        prompts = prompt_sets.synthetic(source, args.min_tokens, args.max_tokens, parent.vocab_size, args.seed)
    return prompts, f"{kind} prompts of {args.min_tokens}-{args.max_tokens} tokens"


def storage_summary(producer: Any, prompts: list, cache: bool) -> tuple[dict[str, Any], list[str]]:
    """What the prefill cache holds for this run, for the JSON report and the closing lines."""
    from models.common.prefill_cache import FrozenBackboneCacheError
    from models.common.prefill_cache.maintenance import describe, summarize

    if not cache:
        return {"cache": False}, ["prefill cache off: nothing stored"]
    storage = producer.storage
    run_bytes, feature_bytes, run_objects = 0, 0, 0
    for paths in {producer.sidecar(tokens).paths for tokens in prompts}:
        try:
            info = describe(paths.root)
            if info.state != "complete":  # unstored, evicted or unreadable
                continue
            feature_bytes += sum(path.stat().st_size for path in paths.artifacts[:2])
        except OSError:
            continue  # never stored
        run_bytes += info.bytes
        run_objects += 1
    per_sample = run_bytes / run_objects if run_objects else None
    report: dict[str, Any] = {"cache": True, **storage.to_json(), "run_objects": run_objects, "run_bytes": run_bytes,
                              "bytes_per_sample": per_sample,
                              "feature_bytes_per_sample": feature_bytes / run_objects if run_objects else None}
    lines = []
    if run_objects:
        lines.append(f"prefill cache: {run_objects} of this run's {len(prompts)} prompts stored, "
                     f"{format_bytes(run_bytes)}: "
                     f"{per_sample:,.0f} bytes per sample, of which {feature_bytes / run_objects:,.0f} "
                     f"{producer.feature_dtype} features")
    try:
        root = summarize(producer.cache_root, max_bytes=storage.max_bytes)
        report["summary"] = root.to_json()
        cap = f" of a {format_bytes(root.max_bytes)} cap" if root.max_bytes is not None else ""
        lines.append(f"prefill cache {root.root}: {root.objects} objects, {format_bytes(root.bytes)}{cap}"
                     f"{f'; {storage.evicted} evicted by this run' if storage.evicted else ''}")
    except (FrozenBackboneCacheError, OSError) as error:
        lines.append(f"prefill cache {producer.cache_root}: cannot be listed: {error}")
    if storage.unstored:
        shown = ", ".join(sha[:12] for sha in storage.unstored[:5])
        lines.append(f"WARNING: the features of {len(storage.unstored)} prompts were NOT stored in "
                     f"{producer.cache_root} ({storage.store_error}); this run served them from memory, the next "
                     f"one computes them again (prompt sha256 {shown}{', ...' if len(storage.unstored) > 5 else ''})")
    return report, lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        envs.check()
        max_bytes = _check_sizes(args)
        _prompt_source(args)
    except (BadInput, envs.BadValue) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    from models.resynthesis.threads import ThreadShare

    with ThreadShare(args.threads) as threads:
        try:
            code, results = run(args, max_bytes, threads)
        except BadInput as error:
            print(f"error: {error}", file=sys.stderr)
            return EXIT_BAD_INPUT
    if args.json:  # after the CPU share is given back, so its history is complete
        results["threads"] = {"setting": args.threads or "auto", "cap": threads.cap, "cpus": sorted(threads.cpus),
                              "history": threads.history}
        args.json.write_text(json.dumps(results, indent=2))
    return code


def run(args: argparse.Namespace, max_bytes: int | None, threads: Any) -> tuple[int, dict[str, Any]]:
    """Train; returns the exit status and the JSON report."""
    from models.common.checkpoint import CheckpointError
    from models.common.weight_cache.layout import CacheRoot
    from models.demos.resynthesis.train import ChildCheckpointError, TrainConfig, Trainer
    from models.resynthesis.parent import FrozenParent
    from models.resynthesis.source import ParentFeatureSource
    from models.resynthesis.waves import FeatureProducer

    try:
        model = resolve_model(args.model)
        parent = FrozenParent.load(model, precision=args.precision, cache_root=args.weight_cache)
    except (CheckpointError, ValueError, OSError) as error:
        raise BadInput(f"cannot load {args.model}: {error}") from None
    print(f"parent: {parent.identity.checkpoint_id} ({args.precision}, {'warm' if parent.loaded.warm else 'cold'} "
          f"load in {parent.loaded.seconds:.2f} s), weights sha256 {parent.identity.weights_sha256[:16]}...")
    prompts, kind = load_prompts(args, model, parent)
    prefill_root = args.prefill_cache or (CacheRoot(Path(args.weight_cache)) if args.weight_cache else CacheRoot.default()).prefill_dir
    cap = f", cap {format_bytes(max_bytes)}" if max_bytes is not None else ""
    print(f"prompts: {len(prompts)} {kind}; prefill cache {'off' if args.no_cache else str(prefill_root) + cap}; "
          f"threads {'auto' if args.threads is None else args.threads} (cap {threads.cap} of "
          f"{len(threads.cpus)} CPUs)")
    producer = FeatureProducer(parent, prefill_root, feature_dtype=args.feature_dtype, threads=threads,
                               max_bytes=max_bytes)
    source = ParentFeatureSource(producer, cache=not args.no_cache, lru_capacity=max(len(prompts), 1))
    config = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, learning_rate=args.learning_rate,
                         width=args.width, seed=args.seed)
    trainer = Trainer(source, prompts, config, args.checkpoint)
    try:
        history = trainer.run()
    except ChildCheckpointError as error:
        raise BadInput(str(error)) from None
    storage, lines = storage_summary(producer, prompts, not args.no_cache)
    for line in lines:
        print(line)
    for epoch, why in trainer.unsaved:
        print(f"WARNING: the child checkpoint of epoch {epoch} was NOT written to {args.checkpoint}: {why}")
    results = {"parent": asdict(parent.identity), "prompts": len(prompts), "kind": kind,
               "prompts_sha256": trainer.binding["prompts"]["sha256"], "cache": not args.no_cache,
               "feature_dtype": args.feature_dtype, "storage": storage,
               "unsaved_checkpoints": [{"epoch": epoch, "error": why} for epoch, why in trainer.unsaved],
               "epochs": [asdict(r) for r in history]}
    return (EXIT_UNSAVED if trainer.unsaved else EXIT_OK), results


if __name__ == "__main__":
    sys.exit(main())
