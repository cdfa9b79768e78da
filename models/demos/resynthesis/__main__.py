# SPDX-License-Identifier: Apache-2.0
"""Resynthesis training from a frozen backbone's cached prefill features.

    python -m models.demos.resynthesis                      # the real Gemma 3 270M, 64 text prompts
    python -m models.demos.resynthesis --model DIR          # any checkpoint a loader reads
    python -m models.demos.resynthesis --no-cache           # every step runs the parent's prefill

The parent is loaded through the project's loaders (warm from the ttnn weight cache), its
prefill features go to the durable prefill cache (``--prefill-cache``, default
``$TT_CACHE_PATH/prefill``) behind an in-memory LRU, and a small child head is trained with
KL to the parent's next-token distribution. Each epoch prints its loss, its parent prefills and
its memory/disk hit counts. ``--checkpoint`` keeps the child after every epoch; running again
with the same checkpoint continues where it stopped (``--epochs`` is the total).
Exit status: 0 done, 2 bad input (no such model, bad sizes).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

from models.common.device_env import ensure_host_cluster

ensure_host_cluster()
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m models.demos.resynthesis", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gemma3-270m", help="checkpoint dir / HF id, or gemma3-270m (prepared once)")
    parser.add_argument("--precision", default="bfloat16", choices=["bfloat16", "bfloat8_b", "bfloat4_b", "float32"])
    parser.add_argument("--weight-cache", type=Path, default=None, help="ttnn weight cache root ($TT_CACHE_PATH)")
    parser.add_argument("--prefill-cache", type=Path, default=None, help="prefill cache root")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--min-tokens", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--prompt-kind", choices=["text", "synthetic"], default=None,
                        help="text (stdlib docstrings through the model's tokenizer) or synthetic token ids; "
                             "default: text when the checkpoint has a tokenizer")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--feature-dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--no-cache", action="store_true", help="compute the parent's prefill at every step")
    parser.add_argument("--checkpoint", type=Path, default=None, help="child checkpoint (written every epoch)")
    parser.add_argument("--json", type=Path, default=None, help="also write the epoch reports here")
    return parser.parse_args(argv)


def resolve_model(name: str) -> Path | str:
    if name == "gemma3-270m":
        from models.demos.real_models.prepare import prepare_gemma3_270m

        return prepare_gemma3_270m()
    return name


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.prompts < 1 or args.epochs < 1 or args.batch_size < 1 or not 1 <= args.min_tokens <= args.max_tokens:
        print("error: --prompts, --epochs, --batch-size must be >= 1 and 1 <= --min-tokens <= --max-tokens",
              file=sys.stderr)
        return 2
    import torch

    from models.common.checkpoint import CheckpointError
    from models.common.loader import default_cache_root
    from models.demos.resynthesis import prompts as prompt_sets
    from models.demos.resynthesis.train import Trainer, TrainConfig
    from models.resynthesis.parent import FrozenParent
    from models.resynthesis.source import ParentFeatureSource
    from models.resynthesis.waves import FeatureProducer

    torch.set_num_threads(max(1, min(torch.get_num_threads(), 2)))
    try:
        model = resolve_model(args.model)
        parent = FrozenParent.load(model, precision=args.precision, cache_root=args.weight_cache)
    except (CheckpointError, ValueError, OSError) as error:
        print(f"error: cannot load {args.model}: {error}", file=sys.stderr)
        return 2
    print(f"parent: {parent.identity.checkpoint_id} ({args.precision}, {'warm' if parent.loaded.warm else 'cold'} "
          f"load in {parent.loaded.seconds:.2f} s), weights sha256 {parent.identity.weights_sha256[:16]}...")
    kind = args.prompt_kind or ("text" if isinstance(model, Path) and (Path(model) / "tokenizer.json").exists() else "synthetic")
    if kind == "text":
        prompts = prompt_sets.text(args.prompts, args.min_tokens, args.max_tokens, Path(model), args.seed)
    else:
        prompts = prompt_sets.synthetic(args.prompts, args.min_tokens, args.max_tokens, parent.vocab_size, args.seed)
    prefill_root = args.prefill_cache or Path(args.weight_cache or default_cache_root()) / "prefill"
    print(f"prompts: {len(prompts)} {kind} prompts of {args.min_tokens}-{args.max_tokens} tokens; "
          f"prefill cache {'off' if args.no_cache else prefill_root}")
    producer = FeatureProducer(parent, prefill_root, feature_dtype=args.feature_dtype)
    source = ParentFeatureSource(producer, cache=not args.no_cache, lru_capacity=max(len(prompts), 1))
    config = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, learning_rate=args.learning_rate,
                         width=args.width, seed=args.seed)
    history = Trainer(source, prompts, config, args.checkpoint).run()
    if args.json:
        args.json.write_text(json.dumps({"parent": asdict(parent.identity), "prompts": len(prompts), "kind": kind,
                                         "cache": not args.no_cache, "epochs": [asdict(r) for r in history]},
                                        indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
