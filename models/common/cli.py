# SPDX-License-Identifier: Apache-2.0
"""``tt-cache``: look at, check, verify, build and clean warm ttnn weight caches.

    tt-cache ls [ROOT]                 every cache under ROOT ($TT_CACHE_PATH by default) and its state
    tt-cache check DIR                 the completeness gate of each variant in DIR, with the reason
    tt-cache verify DIR                re-hash every recorded file; exit 1 naming the ones that differ
    tt-cache build MODEL [options]     build (cold) or load (warm) a model's cache and report
    tt-cache clean DIR [--invalidate]  remove temp files of dead writers; --invalidate also drops markers

Exit status: 0 all good, 1 a check failed (cold cache, differing files), 2 bad usage.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from models.common.device_env import ensure_host_cluster
from models.common.fileio import is_temp_path, temp_writer_alive

ensure_host_cluster()


def _markers(cache_dir: Path) -> Iterator[Path]:
    from models.common.weight_cache import WEIGHT_CACHE_MARKER

    yield from sorted(p for p in cache_dir.glob(f"{WEIGHT_CACHE_MARKER}.*") if not is_temp_path(p))


def _cache_dirs(root: Path) -> Iterator[Path]:
    from models.common.weight_cache import WEIGHT_CACHE_MARKER

    seen = set()
    for marker in sorted(root.rglob(f"{WEIGHT_CACHE_MARKER}.*")):
        if not is_temp_path(marker) and marker.parent not in seen:
            seen.add(marker.parent)
            yield marker.parent


def _variant_states(cache_dir: Path) -> Iterator[tuple[Path, object, str]]:
    """(marker, parsed marker or None, gate verdict) for each variant's marker in a cache dir."""
    from models.common.weight_cache import MarkerFormatError, parse_marker, weight_cache_status

    for marker_file in _markers(cache_dir):
        try:
            marker = parse_marker(marker_file.read_bytes())
        except (OSError, MarkerFormatError) as error:
            yield marker_file, None, f"cold: {error}"
            continue
        status = weight_cache_status(
            cache_dir,
            model_name=marker.model_name,
            n_layers=marker.n_layers,
            mesh_shape=_mesh_tuple(marker.mesh_shape),
            components=marker.components,
            build_variant=marker.build_variant,
            force_env=None,
        )
        yield marker_file, marker, "warm" if status.warm else f"cold: {status.reason}"


def _mesh_tuple(text: str) -> tuple[int, ...] | str:
    try:
        return tuple(int(d) for d in text.strip("()").split(",") if d.strip())
    except ValueError:
        return text


def cmd_ls(args: argparse.Namespace) -> int:
    from models.common.loader import default_cache_root
    from models.common.weight_cache import cache_bytes

    root = Path(args.root or default_cache_root())
    rows = 0
    for cache_dir in _cache_dirs(root):
        for _, marker, verdict in _variant_states(cache_dir):
            rows += 1
            what = "?" if marker is None else (
                f"{marker.model_name} layers={marker.n_layers} mesh={marker.mesh_shape} "
                f"components={','.join(marker.components)} files={len(marker.files)}"
            )
            print(f"{cache_dir}  {cache_bytes(cache_dir) / 2**20:,.1f} MiB  {what}  {verdict}")
    if not rows:
        print(f"no weight caches under {root}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    cache_dir = Path(args.cache_dir)
    states = list(_variant_states(cache_dir))
    if not states:
        print(f"{cache_dir}: cold: no completion marker")
        return 1
    for marker_file, _, verdict in states:
        print(f"{marker_file.name}: {verdict}")
    return 0 if all(verdict == "warm" for _, _, verdict in states) else 1


def cmd_verify(args: argparse.Namespace) -> int:
    from models.common.weight_cache import verify_weight_cache

    cache_dir = Path(args.cache_dir)
    failed = False
    states = list(_variant_states(cache_dir))
    for marker_file, marker, _ in states:
        problems = ["marker unreadable"] if marker is None else verify_weight_cache(cache_dir, marker.build_variant)
        failed |= bool(problems)
        print(f"{marker_file.name}: " + ("intact" if not problems else f"{len(problems)} problem(s)"))
        for problem in problems:
            print(f"  {problem}")
    return 1 if failed or not states else 0


def cmd_build(args: argparse.Namespace) -> int:
    from models.common.checkpoint import read_config, resolve_checkpoint_dir
    from models.registry import family_of, loader_class

    family = args.family
    if family is None:
        checkpoint = resolve_checkpoint_dir(args.model)
        if checkpoint is None:
            print(f"{args.model}: no checkpoint here; name the --family to load from its cache", file=sys.stderr)
            return 2
        family = family_of(read_config(checkpoint))
    if args.force:
        os.environ["TT_TRANSFORMERS_FORCE_MODEL_LOAD"] = "1"
    loader = loader_class(family)(
        args.model,
        mesh_shape=args.mesh,
        precision=args.precision,
        cache_root=args.cache_root,
        num_layers=args.num_layers,
        components=args.components,
    )
    loaded = loader.load()
    state = "warm" if loaded.warm else f"cold ({loaded.reason})"
    print(f"{loader.model_name} [{family}, {args.precision}, mesh {args.mesh}]: {state}, "
          f"{len(loaded.weights)} tensors in {loaded.seconds:.3f} s -> {loaded.cache_dir}")
    return 0


def cmd_clean(args: argparse.Namespace) -> int:
    cache_dir = Path(args.cache_dir)
    removed = [p for p in cache_dir.rglob("*") if p.is_file() and is_temp_path(p) and not temp_writer_alive(p)]
    if args.invalidate:
        removed += list(_markers(cache_dir))
    for path in removed:
        path.unlink(missing_ok=True)
        print(f"removed {path}")
    print(f"{len(removed)} file(s) removed")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tt-cache", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    ls = sub.add_parser("ls", help="list caches and their state")
    ls.add_argument("root", nargs="?")
    ls.set_defaults(run=cmd_ls)
    for name, run, text in (("check", cmd_check, "gate verdict (stat only)"), ("verify", cmd_verify, "deep re-hash")):
        command = sub.add_parser(name, help=text)
        command.add_argument("cache_dir")
        command.set_defaults(run=run)
    build = sub.add_parser("build", help="build or warm-load a model")
    build.add_argument("model", help="HF id, checkpoint dir or hub snapshot dir")
    build.add_argument("--family", help="loader family (default: from config.json)")
    build.add_argument("--precision", default="bfloat8_b")
    build.add_argument("--mesh", default="1x1", help="N150, N300, T3K, TG or RxC")
    build.add_argument("--components", nargs="+")
    build.add_argument("--num-layers", type=int)
    build.add_argument("--cache-root")
    build.add_argument("--force", action="store_true", help="cold build even when the cache is complete")
    build.set_defaults(run=cmd_build)
    clean = sub.add_parser("clean", help="remove temp files left by killed writers")
    clean.add_argument("cache_dir")
    clean.add_argument("--invalidate", action="store_true", help="also remove completion markers")
    clean.set_defaults(run=cmd_clean)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
