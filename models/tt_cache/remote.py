# SPDX-License-Identifier: Apache-2.0
"""``tt-cache push`` and ``tt-cache pull``: one warm cache for a fleet, through a shared store
(:mod:`models.common.weight_cache.remote`).

    tt-cache push DIR --to s3://BUCKET/PREFIX | STORE_DIR     send DIR's warm variants (missing objects only)
    tt-cache pull --from URL KEY [--cache-root ROOT]           fetch the variant key push printed
    tt-cache pull --from URL ROOT/MODEL[/PRECISION/MESH]       fetch every variant pushed from that dir
    tt-cache pull --from URL --manifest KEY_OR_FILE            fetch the variant a manifest names
    tt-cache gc s3://BUCKET/PREFIX | STORE_DIR --max-size 2T   evict whole variants, least recently used first

Progress goes to stderr as the seeding progress shows it (a bar on a terminal, else one line every
``--progress-every`` seconds). A store that cannot be used (unknown bucket, refused credentials, no
answer) is one line and exit 2; a store whose content is wrong (a missing or corrupt object) or a
variant that is cold is exit 1.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from models.common import envs
from models.tt_cache.common import EXIT_FAILED, EXIT_OK, CliError, add_command, emit, existing_dir, positive_int

_VARIANT_KEY = re.compile(r"[0-9a-f]{64}")


class TransferFailed(CliError):
    """The store's content or the local variant is not what the transfer needs (exit 1)."""

    exit_code = EXIT_FAILED


@contextlib.contextmanager
def _store_errors() -> Iterator[None]:
    """A store's errors as the CLI's: bad input exit 2, wrong or incomplete content exit 1."""
    from models.common.weight_cache.remote.pull import CacheNotWritable
    from models.common.weight_cache.remote.stores import RemoteStoreError, StoreUnavailable

    try:
        yield
    except (StoreUnavailable, CacheNotWritable) as error:
        raise CliError(str(error)) from None
    except RemoteStoreError as error:
        raise TransferFailed(str(error)) from None


@contextlib.contextmanager
def _progress(label: str, every: float) -> Iterator[Any]:
    """The seeding progress display, ticked from a thread while the transfer runs."""
    from models.seeding.progress import ProgressTracker

    tracker = ProgressTracker(label, log_every=every, unit="objects")
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(min(1.0, max(every, 0.05))):
            tracker.tick()

    ticker = threading.Thread(target=tick, name="progress", daemon=True)
    ticker.start()
    try:
        yield tracker
    finally:
        stop.set()
        ticker.join()
        tracker.close()


def cmd_push(args: argparse.Namespace) -> int:
    from models.common.weight_cache.remote.push import push_cache_dir
    from models.common.weight_cache.remote.stores import TRANSFER_THREADS
    from models.common.weight_cache.remote.urls import open_store

    cache_dir = existing_dir(args.cache_dir)
    with _store_errors():
        store = open_store(args.to, endpoint_url=args.endpoint_url, create=True)
        with _progress(f"push {cache_dir.name}", args.progress_every) as progress:
            results = push_cache_dir(cache_dir, store, progress=progress, threads=args.threads or TRANSFER_THREADS)
    lines = [result.summary() for result in results]
    lines += [f"  pull it with: tt-cache pull --from {args.to} {result.variant_key}" for result in results]
    emit(args, {"store": store.url, "variants": [result.as_json() for result in results]}, lines)
    return EXIT_OK


def cmd_pull(args: argparse.Namespace) -> int:
    if bool(args.variant) == bool(args.manifest):
        raise CliError("give either a variant KEY (what push printed), a model or variant DIR, or --manifest")
    from models.common.weight_cache.remote.pull import pull_variant, trusted_manifest, variant_keys_at
    from models.common.weight_cache.remote.stores import TRANSFER_THREADS
    from models.common.weight_cache.remote.urls import open_store

    cache_root = Path(args.cache_root) if args.cache_root else envs.TT_CACHE_PATH
    results, skipped = [], []
    with _store_errors():
        store = open_store(getattr(args, "from"), endpoint_url=args.endpoint_url)
        if args.manifest:
            manifests = [_named_manifest(store, args.manifest)]
        elif _VARIANT_KEY.fullmatch(args.variant):
            manifests = [trusted_manifest(store, args.variant)]
        else:
            location = _location(Path(args.variant), cache_root)
            keys = variant_keys_at(store, location)
            if not keys:
                raise TransferFailed(f"{store.url}: no variant was pushed from {location}")
            manifests, skipped = _usable_here([trusted_manifest(store, key) for key in keys])
            if not manifests:
                raise TransferFailed(f"{store.url}: no variant pushed from {location} can be used here ({skipped[0]})")
        for manifest_key, manifest in manifests:
            with _progress(f"pull {manifest.location}", args.progress_every) as progress:
                results.append(pull_variant(store, manifest, cache_root, manifest_key=manifest_key,
                                            into=Path(args.into) if args.into else None, progress=progress,
                                            threads=args.threads or TRANSFER_THREADS))
    warm = all(result.warm for result in results)
    emit(args, {"store": store.url, "warm": warm, "variants": [result.as_json() for result in results],
                "skipped": skipped}, [result.summary() for result in results] + [f"skipped {why}" for why in skipped])
    return EXIT_OK if warm else EXIT_FAILED


def _usable_here(manifests: list[tuple[str, Any]]) -> tuple[list[tuple[str, Any]], list[str]]:
    """The manifests of a model or variant dir this host can use, and why each other one is not
    (another ttnn or tensorbin format: pushed by another host from the same place)."""
    from models.common.weight_cache.remote.pull import foreign_identity

    usable, skipped = [], []
    for manifest_key, manifest in manifests:
        why = foreign_identity(manifest)
        if why is None:
            usable.append((manifest_key, manifest))
        else:
            skipped.append(f"variant {manifest.variant_key[:16]} ({manifest.location}): {why}")
    return usable, skipped


def _location(directory: Path, cache_root: Path) -> str:
    """A model or variant dir as a location under the cache root (it need not exist yet)."""
    from models.common.weight_cache.remote.store_layout import ManifestError, check_location

    absolute, root = Path(os.path.abspath(directory)), Path(os.path.abspath(cache_root))
    if not absolute.is_relative_to(root) or absolute == root:
        raise CliError(f"{directory} is neither a variant key nor a dir under the cache root {root}")
    try:
        return check_location(absolute.relative_to(root).as_posix())
    except ManifestError as error:
        raise CliError(f"{directory}: {error}") from None


def _named_manifest(store: Any, name: str) -> tuple[str, Any]:
    """A manifest given by its key in the store, or as a local file; trusted only when every object
    it names is in the store."""
    from models.common.fileio import read_regular
    from models.common.weight_cache.remote.pull import missing_objects, read_manifest
    from models.common.weight_cache.remote.store_layout import (
        MAX_MANIFEST_BYTES,
        ManifestError,
        object_key,
        parse_manifest,
    )
    from models.common.weight_cache.remote.stores import StoreIntegrityError

    path = Path(name)
    if path.is_file():
        try:
            manifest = parse_manifest(read_regular(path, MAX_MANIFEST_BYTES))
        except OSError as error:
            raise CliError(f"{path}: cannot read the manifest ({error.strerror or error})") from None
        except ManifestError as error:
            raise CliError(f"{path}: not a manifest: {error}") from None
    else:
        manifest = read_manifest(store, name)
    missing = missing_objects(store, manifest)
    if missing:
        raise StoreIntegrityError(f"{store.url}: manifest {name} names {len(missing)} object(s) the store lacks "
                             f"(first: {object_key(missing[0])})")
    return name, manifest


def is_store(target: str) -> bool:
    """Whether ``gc``'s target is a shared store rather than a cache root: a URL (``s3://``,
    ``file://``, ``http(s)://``, which gc refuses), or a directory push wrote (``objects/`` or
    ``variants/`` at its top; a cache root's model dirs are ``<name>--<id>``)."""
    from models.common.weight_cache.remote.store_layout import OBJECTS, VARIANTS

    if re.match(r"[a-z][a-z0-9+.-]*://", target):
        return True
    return any((Path(target) / name).is_dir() for name in (OBJECTS, VARIANTS))


def cmd_store_gc(args: argparse.Namespace) -> int:
    """``tt-cache gc STORE``: plan, then (unless ``--dry-run``) carry the plan out."""
    from models.common.units import format_size, parse_size
    from models.common.weight_cache.remote.store_gc import GRACE_S, collect_store_garbage, plan_store_gc
    from models.common.weight_cache.remote.urls import open_store
    from models.tt_cache.humanize import parse_duration

    if args.uses or args.keep_plan or args.prefill_max_size:
        raise CliError("--uses, --keep-plan and --prefill-max-size go with a cache root, not a shared store")
    try:
        max_size = parse_size(args.max_size) if args.max_size else None
        older_than = parse_duration(args.older_than) if args.older_than else None
        grace = parse_duration(args.grace) if args.grace else GRACE_S
    except ValueError as error:
        raise CliError(str(error)) from None
    if max_size is None and older_than is None:
        raise CliError("gc needs --max-size and/or --older-than")
    with _store_errors():
        store = open_store(args.root, endpoint_url=args.endpoint_url)
        plan = plan_store_gc(store, max_size=max_size, older_than=older_than, grace=grace)
        result = plan if args.dry_run else collect_store_garbage(store, plan, grace=grace)
    verb = "would evict" if args.dry_run else "evicted"
    lines = [f"{verb} variant {e.variant.variant_key[:16]} {e.variant.location or '(no location)'} "
             f"({format_size(e.freed_bytes)}, {e.why})" for e in result.evicted]
    lines += [f"{'would delete' if args.dry_run else 'deleted'} {len(result.objects)} object(s), "
              f"{format_size(sum(result.objects.values()))}; {len(result.dangling)} record(s) of withdrawn variants"]
    lines += [f"kept {key}: written within the grace period" for key in result.young]
    lines += [f"kept {key}: named again since the plan" for key in result.kept_objects]
    lines += [f"kept variant {key[:16]}: pushed again during gc" for key in result.repushed]
    lines += [f"deferred {key}: the gc's deadline came first (the next gc deletes it)" for key in result.deferred]
    lines += [f"left alone {key}: not a key of the store's layout" for key in result.foreign]
    freed = "would free" if args.dry_run else "freed"
    lines.append(f"{verb} {len(result.evicted)} variant(s), {freed} {format_size(result.freed_bytes)}; "
                 f"{format_size(result.kept_bytes)} kept in {result.kept} variant(s)")
    emit(args, {**result.as_json(), "dry_run": args.dry_run}, lines)
    return EXIT_OK


def add_remote_commands(sub: argparse._SubParsersAction) -> None:
    push = add_command(sub, "push", cmd_push, "send a variant dir's warm variants to a shared store "
                       "(only the objects it lacks; the manifest last)")
    push.add_argument("cache_dir", metavar="DIR", help="a variant dir (<root>/<model>/<precision>/mesh_RxC)")
    push.add_argument("--to", required=True, metavar="URL",
                      help="s3://BUCKET/PREFIX, or a directory (any static web server can serve it as a mirror)")
    pull = add_command(sub, "pull", cmd_pull, "fetch a variant from a shared store into a new local generation")
    pull.add_argument("variant", nargs="?", metavar="KEY_OR_DIR",
                      help="the variant key push printed, or a model or variant dir under the cache root (every "
                      "variant pushed from there; S3 and directory stores)")
    pull.add_argument("--from", required=True, metavar="URL", help="s3://BUCKET/PREFIX, http(s)://MIRROR or a directory")
    pull.add_argument("--manifest", metavar="KEY_OR_FILE", help="pull the variant this manifest names (its key in "
                      "the store, or a local file) instead of the newest complete one")
    pull.add_argument("--cache-root", help="where the variant goes, at the place it had (default: $TT_CACHE_PATH)")
    pull.add_argument("--into", metavar="DIR", help="the variant dir to pull into (instead of its place under the root)")
    for command in (push, pull):
        command.add_argument("--endpoint-url", metavar="URL", help="the S3 endpoint (default: $AWS_ENDPOINT_URL, "
                             "else AWS); credentials come only from the standard AWS chain")
        command.add_argument("--threads", type=positive_int, metavar="N",
                             help="objects moved at once (default: the stores' TRANSFER_THREADS, 8)")
        command.add_argument("--progress-every", type=float, default=30.0, metavar="S",
                             help="seconds between progress lines when stderr is not a terminal (default 30)")

