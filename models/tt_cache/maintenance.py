# SPDX-License-Identifier: Apache-2.0
"""``tt-cache ls``, ``gc`` and ``clean``: what is under the cache root, and removing what may go.
Torch- and ttnn-free."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from models.common.weight_cache.layout import CacheRoot
from models.tt_cache.common import EXIT_FAILED, EXIT_OK, CliError, emit, existing_dir, table

LS_COLUMNS = ("MODEL", "FAMILY", "PRECISION", "MESH", "COMPONENTS", "TTNN", "SIZE", "STATE", "BUILT IN", "LAST USED",
              "PATH")


def cmd_ls(args: argparse.Namespace) -> int:
    from models.common.units import format_size
    from models.tt_cache.humanize import format_age, format_duration
    from models.tt_cache.scan import scan_leftovers, scan_root

    start = time.perf_counter()
    root = existing_dir(args.root) if args.root else CacheRoot.default().path
    rows = [variant.as_json() for variant in (scan_root(root) if root.is_dir() else [])]
    leftovers = [build.as_json() for build in (scan_leftovers(root) if root.is_dir() else [])]
    total = sum(row["size_bytes"] for row in rows) + sum(b["size_bytes"] for b in leftovers)
    lines = table([LS_COLUMNS] + [
        (r["model"], r["family"], r["precision"], r["mesh"], ",".join(r["components"]) or "?", r["ttnn_version"] or "?",
         format_size(r["size_bytes"]), r["state"], format_duration(r["build_seconds"]), format_age(r["last_used"]),
         r["cache_dir"])
        for r in rows
    ] + [("(unfinished or replaced build)", "?", "?", "?", "?", "?", format_size(b["size_bytes"]), "leftover", "-",
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
    if not (rows or leftovers or prefill is not None):
        lines = [f"no weight caches under {root}"]
    data = _scan_model_data(args.model_root)
    needed = _needed_snapshots(data, rows, []) if data is not None else {}
    if data is not None and (data.snapshots or data.entries):
        lines += ["", *_model_data_lines(data, needed)]
    if rows or leftovers or prefill is not None:
        lines.append(f"\nDone in {time.perf_counter() - start:.2f}s. Scanned {len(rows)} variant(s) in "
                     f"{len({r['cache_dir'] for r in rows})} cache dir(s) under {root}, {format_size(total)} in total.")
    model_data = None if data is None else {**data.as_json(), "needed": {str(p): why for p, why in needed.items()}}
    emit(args, {"root": str(root), "size_bytes": total, "variants": rows, "leftovers": leftovers,
                "prefill": prefill.to_json() if prefill is not None else None, "model_data": model_data}, lines)
    return EXIT_OK


def _prefill_dir(root: Path) -> Path | None:

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


# --------------------------------------------------------------------------------------------
# Prepared model data ($TT_MODEL_DATA: models.demos.real_models.model_data)
# --------------------------------------------------------------------------------------------


MODEL_DATA_COLUMNS = ("MODEL", "WHAT", "REVISION", "FILES", "SIZE", "STATE", "PATH")


def _scan_model_data(model_root: Path | None) -> Any:
    """The prepared model data under ``--model-root`` ($TT_MODEL_DATA, else <repo>/model_data), or
    None when that directory does not exist."""
    from models.demos.real_models.model_data import scan_model_data
    from models.demos.real_models.prepare import PrepareError, resolve_model_root

    try:
        root = resolve_model_root(model_root)
    except PrepareError as error:
        raise CliError(str(error)) from None
    return scan_model_data(root) if root.is_dir() else None


def _needed_snapshots(data: Any, variants: Sequence[dict[str, Any]],
                      planned: Sequence[tuple[str, str]]) -> dict[Path, str]:
    """Snapshot -> why it stays. A weight cache needs a snapshot when a variant's marker records the
    snapshot's content id (the weight cache's key of the weights, computed from the snapshot's
    record); a marker without a content id, when it names the snapshot's repo. A ``--keep-plan``
    plan needs every snapshot of a model it names (by repo id, known name or a path into its repo
    dir). A snapshot whose content id cannot be told from its record stays (when in doubt, keep)."""
    by_content = {v["content_id"]: v for v in variants if v.get("content_id")}
    by_model = {v["model"]: v for v in variants if not v.get("content_id")}
    needed = {}
    for snapshot in data.snapshots:
        content_id, repo_dir = snapshot.content_id, snapshot.path.parent.parent
        variant = by_content.get(content_id) or by_model.get(snapshot.model.repo_id)
        if content_id is None:
            needed[snapshot.path] = "its record does not give its content id: kept (cannot prove no cache needs it)"
        elif variant is not None:
            needed[snapshot.path] = f"the weight cache {Path(variant['cache_dir']) / variant['marker']} was built from it"
        elif plan := next((plan for plan, model in planned if model in (snapshot.model.repo_id, snapshot.model.name)
                           or _inside(model, repo_dir)), None):
            needed[snapshot.path] = f"--keep-plan {plan} names {snapshot.model.repo_id}"
    return needed


def _inside(model: str, directory: Path) -> bool:
    path = Path(model).expanduser()
    if not path.exists():
        return False
    resolved, base = path.resolve(), directory.resolve()
    return resolved == base or base in resolved.parents


def _planned_models(plans: Sequence[str]) -> list[tuple[str, str]]:
    """(plan, model) of every combination of the ``--keep-plan`` plans; a bad plan stops the
    command before anything is removed."""
    from models.seeding.plan import PlanError, load_plan

    found = []
    for path in plans:
        try:
            found += [(path, combination.model) for combination in load_plan(Path(path)).combinations]
        except PlanError as error:
            raise CliError(f"--keep-plan {error}; nothing was removed") from None
    return found


def _model_data_lines(data: Any, needed: dict[Path, str]) -> list[str]:
    from models.common.units import format_size

    rows = [(s.model.name, "snapshot", s.revision[:12], s.files, format_size(s.size_bytes),
             ("needed" if s.path in needed else "current" if s.current else "stale") if s.complete else "incomplete",
             s.path) for s in data.snapshots]
    rows += [(e.model.name, e.kind, "-", e.files, format_size(e.size_bytes), "debris" if e.kind != "assembled gguf"
              else "rebuildable", e.path) for e in data.entries]
    return [f"model data {data.root}: {format_size(data.size_bytes)} (tt-cache clean --model-data removes what no cache "
            "needs)", *table([MODEL_DATA_COLUMNS, *rows])]


def _model_data_request(args: argparse.Namespace) -> list[tuple[str, str]]:
    """Check ``--model`` and read the ``--keep-plan`` plans before anything is removed."""
    from models.demos.real_models.known import KNOWN_MODELS

    unknown = sorted(set(args.model or []) - set(KNOWN_MODELS))
    if unknown:
        raise CliError(f"--model {', '.join(unknown)}: not a known model; known: {', '.join(KNOWN_MODELS)}")
    if (args.model or args.keep_plan) and not args.model_data:
        raise CliError("--model and --keep-plan go with --model-data")
    planned = _planned_models(args.keep_plan or [])
    _scan_model_data(args.model_root)  # a model root that is not a directory: nothing removed
    return planned


def _clean_model_data(args: argparse.Namespace, planned: list[tuple[str, str]]) -> tuple[dict[str, Any], list[str]]:
    from models.common.units import format_size
    from models.demos.real_models.model_data import remove_model_data
    from models.tt_cache.scan import scan_root

    cache_root = Path(args.cache_root) if args.cache_root else CacheRoot.default().path
    data = _scan_model_data(args.model_root)
    if data is None:
        return {"root": None, "removed": [], "removed_files": 0, "removed_bytes": 0, "kept": [], "skipped": [],
                "left": []}, \
            ["model data: none here (no model root)"]
    variants = [v.as_json() for v in scan_root(cache_root)] if cache_root.is_dir() else []
    needed = _needed_snapshots(data, variants, planned)
    result = remove_model_data(data, needed=needed, models=set(args.model) if args.model else None,
                               dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    lines = [f"{verb} {item.as_json()['kind']} {item.path} ({item.model.name}, {item.files} file(s), "
             f"{format_size(item.size_bytes)})" for item in result.removed]
    lines += [f"kept {path}: {why}" for path, why in result.kept]
    lines += [f"skipped {path}: {why}" for path, why in result.skipped]
    lines += [f"left {path}: {why}" for path, why in result.left]
    lines.append(f"model data {data.root}: {verb} {result.removed_files} file(s), {format_size(result.removed_bytes)}; "
                 f"kept {len(result.kept)} snapshot(s) a cache or plan needs")
    return {"root": str(data.root), "cache_root": str(cache_root), **result.as_json()}, lines


def cmd_clean(args: argparse.Namespace) -> int:
    """Weight cache debris under DIR and/or (``--model-data``) the prepared model data."""
    if args.cache_dir is None and not args.model_data:
        raise CliError("clean needs DIR (a weight cache dir or root) and/or --model-data")
    root = existing_dir(args.cache_dir) if args.cache_dir is not None else None
    planned = _model_data_request(args)
    document: dict[str, Any] = {"dry_run": args.dry_run}
    lines: list[str] = []
    failed = False
    if root is not None:
        failed = _clean_cache(args, root, document, lines)
    if args.model_data:
        document["model_data"], more = _clean_model_data(args, planned)
        lines += more
    emit(args, document, lines)
    return EXIT_FAILED if failed else EXIT_OK


def _clean_cache(args: argparse.Namespace, root: Path, document: dict[str, Any], lines: list[str]) -> bool:
    from models.common.units import format_size
    from models.tt_cache.clean import clean_cache_tree

    report = clean_cache_tree(root, invalidate=args.invalidate, dry_run=args.dry_run)
    if not report.cache_dirs:
        raise CliError(f"{root}: no weight cache in it (no completion marker, build lock or mesh_<r>x<c> dir)")
    verb = "would remove" if args.dry_run else "removed"
    lines += [f"{verb} {r.path} ({r.kind}: {r.files} file(s), {format_size(r.size_bytes)})" for r in report.removals]
    lines += [f"kept {path}: its writer is still running" for path in report.kept_live]
    lines += [f"kept {path}: a reader holds it (a later clean, gc or build removes it)" for path in report.leased]
    lines += [f"skipped {path}: a builder is at work in it" for path in report.busy]
    lines += [f"cannot remove {path}: {problem}" for path, problem in report.errors]
    lines.append(f"{verb} {report.removed_files} file(s), {format_size(report.removed_bytes)}, "
                 f"in {len(report.cache_dirs)} cache dir(s)")
    document.update(report.as_json())
    return bool(report.errors)


def _prefill_gc(root: Path, args: argparse.Namespace, older_than: float | None) -> Any:
    """gc of the prefill cache beside the weight caches: debris, objects unused ``--older-than``,
    then LRU beyond ``--prefill-max-size`` (default: its ``TT_PREFILL_CACHE_MAX_SIZE`` cap)."""
    from models.common.prefill_cache.layout import FrozenBackboneCacheError
    from models.common.prefill_cache.maintenance import gc, max_bytes_from_env
    from models.common.units import parse_size

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
    from models.tt_cache.gc import UsesError, collect_garbage, hand_over_uses, plan_eviction
    from models.tt_cache.humanize import parse_duration
    from models.tt_cache.remote import cmd_store_gc, is_store

    if args.root and is_store(args.root):
        return cmd_store_gc(args)
    if args.grace or args.endpoint_url:
        raise CliError("--grace and --endpoint-url go with a shared store (s3://BUCKET/PREFIX or a store directory)")
    root = existing_dir(args.root) if args.root else CacheRoot.default().path
    try:
        max_size = parse_size(args.max_size) if args.max_size else None
        older_than = parse_duration(args.older_than) if args.older_than else None
    except ValueError as error:
        raise CliError(str(error)) from None
    if max_size is None and older_than is None and not args.prefill_max_size:
        raise CliError("gc needs --max-size, --older-than and/or --prefill-max-size")
    keep = _kept_by_plans(args.keep_plan or [], root)
    try:
        handed = hand_over_uses([Path(report) for report in args.uses or []], root)
    except UsesError as error:
        raise CliError(f"--uses {error}; nothing was evicted") from None
    plan = plan_eviction(root, max_size=max_size, older_than=older_than, keep=keep)
    result = plan if args.dry_run else collect_garbage(plan)
    prefill = _prefill_gc(root, args, older_than)
    verb = "would evict" if args.dry_run else "evicted"
    lines = [f"{verb} {e.model} {e.precision} mesh {e.mesh} ({format_size(e.size_bytes)}, {e.why}): {e.marker_file}"
             for e in result.evicted]
    lines += [f"{'would remove' if args.dry_run else 'removed'} leftover build {b.cache_dir / b.name} "
              f"({format_size(b.size_bytes)})" for b in result.leftovers]
    lines += [f"recorded a use of {use.cache_dir} (--uses)" if use.recorded else
              f"ignored a use of {use.cache_dir} (--uses): {use.why}" for use in handed]
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
                "uses": [{"cache_dir": str(u.cache_dir), "variant_tag": u.variant_tag, "at": u.at, "recorded": u.recorded,
                          "why": u.why} for u in handed],
                "prefill": prefill.to_json() if prefill is not None else None}, lines)
    return EXIT_FAILED if result.errors else EXIT_OK
