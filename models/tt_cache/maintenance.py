# SPDX-License-Identifier: Apache-2.0
"""``tt-cache ls``, ``gc`` and ``clean``: what is under the cache root, and removing what may go.
Torch- and ttnn-free."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from models.tt_cache.common import EXIT_FAILED, EXIT_OK, CliError, default_cache_root, emit, existing_dir, table

LS_COLUMNS = ("MODEL", "FAMILY", "PRECISION", "MESH", "COMPONENTS", "SIZE", "STATE", "BUILT IN", "LAST USED", "PATH")


def cmd_ls(args: argparse.Namespace) -> int:
    from models.common.units import format_size
    from models.tt_cache.humanize import format_age, format_duration
    from models.tt_cache.scan import scan_leftovers, scan_root

    start = time.perf_counter()
    root = existing_dir(args.root) if args.root else default_cache_root()
    rows = [variant.as_json() for variant in (scan_root(root) if root.is_dir() else [])]
    leftovers = [build.as_json() for build in (scan_leftovers(root) if root.is_dir() else [])]
    total = sum(row["size_bytes"] for row in rows) + sum(b["size_bytes"] for b in leftovers)
    lines = table([LS_COLUMNS] + [
        (r["model"], r["family"], r["precision"], r["mesh"], ",".join(r["components"]) or "?",
         format_size(r["size_bytes"]), r["state"], format_duration(r["build_seconds"]), format_age(r["last_used"]),
         r["cache_dir"])
        for r in rows
    ] + [("(unfinished or replaced build)", "?", "?", "?", "?", format_size(b["size_bytes"]), "leftover", "-",
          format_age(b["created_ns"] / 1e9), f"{b['cache_dir']}/{b['generation']}") for b in leftovers])
    lines += [f"  {r['marker']}: {r['reason']}" for r in rows if r["state"] != "warm"]
    if leftovers:
        lines.append("  leftover builds are removed by the next build of their variant, by gc and by clean")
    prefill = _prefill_summary(root)
    if prefill is not None:
        per_sample = format_size(prefill.bytes_per_sample) if prefill.bytes_per_sample else "-"
        cap = f", cap {format_size(prefill.max_bytes)}{' (over)' if prefill.over_cap else ''}" if prefill.max_bytes else ""
        lines.append(f"prefill cache {prefill.root}: {prefill.objects} object(s), {format_size(prefill.bytes)}, "
                     f"{per_sample} per sample{cap} (tt-cache prefill ls for more)")
        total += prefill.bytes
    lines.append(f"\nDone in {time.perf_counter() - start:.2f}s. Scanned {len(rows)} variant(s) in "
                 f"{len({r['cache_dir'] for r in rows})} cache dir(s) under {root}, {format_size(total)} in total.")
    emit(args, {"root": str(root), "size_bytes": total, "variants": rows, "leftovers": leftovers,
                "prefill": prefill.to_json() if prefill is not None else None},
         lines if rows or leftovers or prefill is not None else [f"no weight caches under {root}"])
    return EXIT_OK


def _prefill_dir(root: Path) -> Path | None:
    from models.common.weight_cache.layout import CacheRoot

    directory = CacheRoot(root).prefill_dir
    return directory if directory.is_dir() else None


def _prefill_summary(root: Path) -> Any:
    """The prefill cache beside the weight caches (``<root>/prefill``), summarized, or None."""
    from models.common.prefill_cache.layout import FrozenBackboneCacheError
    from models.common.prefill_cache.maintenance import summarize

    directory = _prefill_dir(root)
    if directory is None:
        return None
    try:
        return summarize(directory)
    except (FrozenBackboneCacheError, ValueError) as error:
        raise CliError(f"{directory}: {error}") from None


def cmd_clean(args: argparse.Namespace) -> int:
    from models.common.units import format_size
    from models.tt_cache.clean import clean_cache_tree

    root = existing_dir(args.cache_dir)
    report = clean_cache_tree(root, invalidate=args.invalidate, dry_run=args.dry_run)
    if not report.cache_dirs:
        raise CliError(f"{root}: no weight cache in it (no completion marker, build lock or mesh_<r>x<c> dir)")
    verb = "would remove" if args.dry_run else "removed"
    lines = [f"{verb} {r.path} ({r.kind}: {r.files} file(s), {format_size(r.size_bytes)})" for r in report.removals]
    lines += [f"kept {path}: its writer is still running" for path in report.kept_live]
    lines += [f"kept {path}: a reader holds it (a later clean, gc or build removes it)" for path in report.leased]
    lines += [f"skipped {path}: a builder is at work in it" for path in report.busy]
    lines += [f"cannot remove {path}: {problem}" for path, problem in report.errors]
    lines.append(f"{verb} {report.removed_files} file(s), {format_size(report.removed_bytes)}, "
                 f"in {len(report.cache_dirs)} cache dir(s)")
    emit(args, report.as_json(), lines)
    return EXIT_FAILED if report.errors else EXIT_OK


def _prefill_gc(root: Path, args: argparse.Namespace, older_than: float | None) -> Any:
    """gc of the prefill cache beside the weight caches: debris, objects unused ``--older-than``,
    then LRU beyond ``--prefill-max-size`` (default: its ``TT_PREFILL_CACHE_MAX_SIZE`` cap)."""
    from models.common.prefill_cache.layout import FrozenBackboneCacheError
    from models.common.prefill_cache.maintenance import gc, max_bytes_from_env, parse_size

    directory = _prefill_dir(root)
    if directory is None:
        return None
    try:
        cap = parse_size(args.prefill_max_size) if args.prefill_max_size else max_bytes_from_env()
        return gc(directory, older_than_days=None if older_than is None else older_than / 86400, max_bytes=cap,
                  dry_run=args.dry_run)
    except (FrozenBackboneCacheError, ValueError) as error:
        raise CliError(f"{directory}: {error}") from None


def _kept_by_plans(plans: Sequence[str], root: Path) -> set[Path]:
    """The markers of every variant the ``--keep-plan`` plans name; a bad plan stops gc before
    anything is deleted."""
    if not plans:
        return set()
    from models.seeding.plan import PlanError, load_plan
    from models.seeding.runner import SeedInputError, plan_markers

    keep: set[Path] = set()
    for path in plans:
        try:
            keep |= plan_markers(load_plan(Path(path)), root)
        except (PlanError, SeedInputError) as error:
            raise CliError(f"--keep-plan {error}; nothing was evicted") from None
    return keep


def cmd_gc(args: argparse.Namespace) -> int:
    from models.common.units import format_size, parse_size
    from models.tt_cache.gc import collect_garbage, plan_eviction
    from models.tt_cache.humanize import parse_duration

    root = existing_dir(args.root) if args.root else default_cache_root()
    try:
        max_size = parse_size(args.max_size) if args.max_size else None
        older_than = parse_duration(args.older_than) if args.older_than else None
    except ValueError as error:
        raise CliError(str(error)) from None
    if max_size is None and older_than is None and not args.prefill_max_size:
        raise CliError("gc needs --max-size, --older-than and/or --prefill-max-size")
    keep = _kept_by_plans(args.keep_plan or [], root)
    plan = plan_eviction(root, max_size=max_size, older_than=older_than, keep=keep)
    result = plan if args.dry_run else collect_garbage(plan)
    prefill = _prefill_gc(root, args, older_than)
    verb = "would evict" if args.dry_run else "evicted"
    lines = [f"{verb} {e.model} {e.precision} mesh {e.mesh} ({format_size(e.size_bytes)}, {e.why}): {e.marker_file}"
             for e in result.evicted]
    lines += [f"{'would remove' if args.dry_run else 'removed'} leftover build {b.cache_dir / b.name} "
              f"({format_size(b.size_bytes)})" for b in result.leftovers]
    lines += [f"kept {path}: named by --keep-plan" for path in result.protected]
    lines += [f"skipped {path}: {why}" for path, why in result.skipped]
    lines += [f"deferred {path}: {why}" for path, why in result.deferred]
    lines += [f"cannot evict {path}: {error}" for path, error in result.errors]
    lines.append(f"{verb} {len(result.evicted)} variant(s), {'would free' if args.dry_run else 'freed'} "
                 f"{format_size(result.freed_bytes)}; {format_size(result.kept_bytes)} kept in {result.kept} variant(s)")
    if prefill is not None:
        lines.append(f"prefill cache: {verb} {prefill.removed_objects} object(s) and {prefill.removed_files} file(s) of "
                     f"debris, {format_size(prefill.removed_bytes)}; {format_size(prefill.bytes_after)} kept")
    emit(args, {**result.as_json(), "dry_run": args.dry_run,
                "prefill": prefill.to_json() if prefill is not None else None}, lines)
    return EXIT_FAILED if result.errors else EXIT_OK
