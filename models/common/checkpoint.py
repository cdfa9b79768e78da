# SPDX-License-Identifier: Apache-2.0
"""Find a Hugging Face checkpoint and read its tensors lazily, under the loader's names.

A checkpoint reaches a loader in one of three spellings, all resolved here to one directory:

* an HF id, ``org/name``: looked up in the local hub cache (``$HF_HUB_CACHE``, else
  ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``) as ``models--org--name/snapshots/<rev>``
  with ``<rev>`` from ``refs/main``; nothing is ever downloaded;
* a local directory holding ``config.json``;
* a hub snapshot directory, the form vLLM hands over under ``HF_HUB_OFFLINE=1``.

Weights are read from safetensors only (single ``model.safetensors`` or shards listed in
``model.safetensors.index.json``), each file memory-mapped and each tensor a zero-copy view of the
mapping (:class:`SafetensorsFile`). The transformers model object is never built just to read weights.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import re
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from models.common.fileio import (
    atomic_write_bytes,
    sha256_bytes,
    sha256_file,
    write_all,
)

SAFETENSORS_SINGLE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
CONFIG_FILE = "config.json"


class CheckpointError(RuntimeError):
    """The checkpoint cannot be found or read as asked."""


def hub_cache_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def _hub_snapshot(repo_id: str) -> Path | None:
    repo = hub_cache_dir() / f"models--{repo_id.replace('/', '--')}"
    ref = repo / "refs" / "main"
    if ref.is_file():
        snapshot = repo / "snapshots" / ref.read_text().strip()
        if snapshot.is_dir():
            return snapshot
    snapshots = sorted((repo / "snapshots").glob("*")) if (repo / "snapshots").is_dir() else []
    return snapshots[-1] if len(snapshots) == 1 else None


_HF_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


def resolve_checkpoint_dir(model: str | os.PathLike) -> Path | None:
    """The directory holding the checkpoint, or None when it is not on this machine.

    None is not an error: a warm start from a cache-only deploy needs no checkpoint."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    text = os.fspath(model)
    if _HF_ID.match(text) and not path.exists():
        return _hub_snapshot(text)
    return None


def read_config(checkpoint_dir: Path) -> dict[str, Any]:
    try:
        config = json.loads((checkpoint_dir / CONFIG_FILE).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{checkpoint_dir} has no {CONFIG_FILE}") from None
    except (OSError, ValueError) as error:
        raise CheckpointError(f"cannot read {checkpoint_dir / CONFIG_FILE}: {error}") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{checkpoint_dir / CONFIG_FILE} is not a JSON object")
    return config


def safetensors_files(checkpoint_dir: Path) -> dict[str, Path]:
    """Map every tensor name of the checkpoint to the file holding it."""
    index = checkpoint_dir / SAFETENSORS_INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise CheckpointError(f"cannot read {index}: {error}") from None
        return {name: checkpoint_dir / file for name, file in weight_map.items()}
    single = checkpoint_dir / SAFETENSORS_SINGLE
    if single.is_file():
        return {name: single for name in SafetensorsFile(single).names()}
    raise CheckpointError(f"{checkpoint_dir} holds no {SAFETENSORS_SINGLE} or {SAFETENSORS_INDEX}")


# --------------------------------------------------------------------------------------------
# Identity: how the model was named, and what its weights are
# --------------------------------------------------------------------------------------------

_HF_SNAPSHOT = re.compile(r"models--(?:(?P<org>[^/]+?)--)?(?P<name>[^/]+)/snapshots/[^/]+$")
_SHA256_NAME = re.compile(r"[0-9a-f]{64}")


def checkpoint_name(model_path: str | os.PathLike) -> str:
    """The repo's base name however the checkpoint is addressed (``org/name``, ``/data/name``,
    ``.../models--org--name/snapshots/<rev>``): the readable part of a cache dir's name."""
    text = os.fspath(model_path).rstrip("/")
    snapshot = _HF_SNAPSHOT.search(text)
    name = snapshot.group("name") if snapshot else text.rsplit("/", 1)[-1]
    return name if name not in ("", ".", "..") else Path(text).resolve().name or "model"


def model_id(model: str | os.PathLike) -> str:
    """How a model was asked for, org included: ``org/name`` for an HF id or a hub snapshot
    (``models--org--name/snapshots/<rev>``), else the local directory's absolute path.

    A cache-only load (no weights on this machine) is served only by a cache whose marker
    records this same id."""
    text = os.fspath(model).rstrip("/")
    path = Path(text).expanduser()
    snapshot = _HF_SNAPSHOT.search(os.fspath(path.resolve()) if path.exists() else text)
    if snapshot:
        org = snapshot.group("org")
        return f"{org}/{snapshot.group('name')}" if org else snapshot.group("name")
    if _HF_ID.match(text) and not path.exists():
        return text
    return os.fspath(path.resolve())


def identity_files(checkpoint_dir: Path) -> list[str]:
    """The files whose bytes decide the converted weights: config, shard index, safetensors."""
    names = {p.name for p in checkpoint_dir.glob("*.safetensors")} | {CONFIG_FILE, SAFETENSORS_INDEX}
    return sorted(name for name in names if (checkpoint_dir / name).is_file())


def has_weights(checkpoint_dir: Path | None) -> bool:
    return checkpoint_dir is not None and (
        (checkpoint_dir / SAFETENSORS_INDEX).is_file() or (checkpoint_dir / SAFETENSORS_SINGLE).is_file()
    )


class DigestStamps:
    """SHA-256 of checkpoint files, remembered per (device, inode, size, mtime, ctime).

    A file is hashed once; later starts ``stat`` it and reuse the digest while every stamp field
    is unchanged. A copy (``cp -r``, another node's copy) is hashed once more and then shares the
    cache of its original. Stored as one small JSON file per checkpoint directory; when that
    cannot be written (read-only cache root) digests are simply recomputed next time."""

    def __init__(self, store_dir: Path, checkpoint_dir: Path) -> None:
        key = sha256_bytes(os.fspath(checkpoint_dir.resolve()).encode())[:24]
        self.path = Path(store_dir) / f"{key}.json"
        self._known: dict[str, list[Any]] = {}
        try:
            body = json.loads(self.path.read_bytes())
            if isinstance(body, dict):
                self._known = body
        except (OSError, ValueError):
            pass
        self._dirty = False

    def digest(self, file: Path) -> str:
        blob = _hub_blob_digest(file)
        if blob:
            return blob
        info = file.stat()
        stamp = [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns]
        entry = self._known.get(file.name)
        if isinstance(entry, list) and len(entry) == 6 and entry[:5] == stamp and isinstance(entry[5], str):
            return entry[5]
        digest = sha256_file(file)
        self._known[file.name] = [*stamp, digest]
        self._dirty = True
        return digest

    def save(self) -> None:
        if not self._dirty:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(self.path, json.dumps(self._known, sort_keys=True).encode(), durable=False)
        except OSError:
            pass


def _hub_blob_digest(file: Path) -> str | None:
    """A hub snapshot's LFS file is a symlink to ``blobs/<sha256 of its content>``: the name is the digest."""
    if not file.is_symlink():
        return None
    target = Path(os.readlink(file)).name
    return target if _SHA256_NAME.fullmatch(target) else None


def content_id(checkpoint_dir: Path, stamps: DigestStamps) -> str:
    """SHA-256 over the checkpoint's weight and config files' SHA-256s: the same for the same
    weights however they are reached (HF id, local copy, hub snapshot), different for any other."""
    lines = [f"{name}:{stamps.digest(checkpoint_dir / name)}" for name in identity_files(checkpoint_dir)]
    stamps.save()
    return sha256_bytes("\n".join(lines).encode())


@dataclass(frozen=True)
class KeyRule:
    """One renaming rule: a regex over checkpoint names and its replacement."""

    pattern: str
    replacement: str


def remap_key(name: str, rules: Sequence[KeyRule]) -> str | None:
    """The loader's name for a checkpoint tensor (first matching rule), or None to skip it."""
    for rule in rules:
        renamed, count = re.subn(rule.pattern, rule.replacement, name)
        if count:
            return renamed or None
    return None


_SAFETENSORS_DTYPES = {
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F64": torch.float64,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


_MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)
_DTYPE_NAMES = {dtype: name for name, dtype in _SAFETENSORS_DTYPES.items()}


def write_safetensors(path: Path, tensors: Mapping[str, torch.Tensor]) -> None:
    """Write ``tensors`` in the format :class:`SafetensorsFile` reads (the ``safetensors``
    package reads it too), straight from each tensor's memory: no staging copy, and tensors that
    share storage (tied weights, views of one mapped file) are simply written twice."""
    names = sorted(tensors)
    header: dict[str, Any] = {}
    offset = 0
    for name in names:
        tensor = tensors[name]
        size = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": _DTYPE_NAMES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, struct.pack("<Q", len(raw)) + raw)
        for name in names:
            tensor = tensors[name].detach().cpu().contiguous()
            if tensor.numel():
                write_all(fd, tensor.reshape(-1).view(torch.uint8).numpy())
    finally:
        os.close(fd)


class SafetensorsFile:
    """One safetensors file, memory-mapped; tensors are zero-copy views of the mapping.

    Format: an 8-byte little-endian header length ``N``, ``N`` bytes of JSON mapping each tensor
    name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets relative to the byte
    after the header), then the data. The mapping is private copy-on-write: the pages are the
    page cache's (no copy, reclaimable under memory pressure), and an in-place op on a tensor
    writes to a private copy, never to the checkpoint."""

    MAX_HEADER_BYTES = 100 << 20

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        with open(self.path, "rb") as stream:
            size = os.fstat(stream.fileno()).st_size
            raw = stream.read(8)
            length = struct.unpack("<Q", raw)[0] if len(raw) == 8 else -1
            if not 0 < length <= min(self.MAX_HEADER_BYTES, size - 8):
                raise CheckpointError(f"{self.path} is not a safetensors file (header length {length})")
            try:
                header = json.loads(stream.read(length))
            except ValueError as error:
                raise CheckpointError(f"{self.path}: unreadable safetensors header ({error})") from None
            self._mmap = mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_COPY) if size > 8 + length else None
        header.pop("__metadata__", None)
        self._base = 8 + length
        self._entries = {name: self._entry(name, info, size - self._base) for name, info in header.items()}

    def _entry(self, name: str, info: Any, data_bytes: int) -> tuple[list[int], torch.dtype, int, int]:
        try:
            dtype = _SAFETENSORS_DTYPES[info["dtype"]]
            shape = [int(d) for d in info["shape"]]
            begin, end = (int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{self.path}: bad header entry for {name!r}: {info!r}") from None
        count = math.prod(shape)
        if not 0 <= begin <= end <= data_bytes or end - begin != count * dtype.itemsize:
            raise CheckpointError(f"{self.path}: {name!r} offsets {begin}..{end} do not fit its shape or the file")
        return shape, dtype, begin, count

    def names(self) -> list[str]:
        return list(self._entries)

    def spec(self, name: str) -> tuple[list[int], torch.dtype]:
        shape, dtype, _, _ = self._entries[name]
        return shape, dtype

    def tensor(self, name: str, *, populate: bool = False) -> torch.Tensor:
        """A view of ``name``'s bytes; ``populate`` maps its pages now (the caller is about to
        read all of them), else they fault in when touched (lazy: warm starts)."""
        shape, dtype, begin, count = self._entries[name]
        if count == 0:
            return torch.empty(shape, dtype=dtype)
        if populate:
            self._populate(self._base + begin, count * dtype.itemsize)
        flat = torch.frombuffer(self._mmap, dtype=dtype, count=count, offset=self._base + begin)
        return flat.reshape(shape)

    def release(self, name: str) -> None:
        """Drop ``name``'s pages from this process and from the page cache (a streaming seed reads
        each tensor once). Safe while views of it live: the mapping is private and unmodified,
        so a later touch reads the bytes from the file again."""
        _, dtype, begin, count = self._entries[name]
        if count == 0 or self._mmap is None:
            return
        offset = self._base + begin
        start = offset - offset % mmap.PAGESIZE
        length = offset + count * dtype.itemsize - start
        try:
            self._mmap.madvise(mmap.MADV_DONTNEED, start, length)
            with open(self.path, "rb") as stream:
                os.posix_fadvise(stream.fileno(), start, length, os.POSIX_FADV_DONTNEED)
        except (OSError, ValueError):
            pass  # only memory is at stake: the pages then stay until the mapping is closed

    def _populate(self, offset: int, length: int) -> None:
        """Map the tensor's pages in one call (``MADV_POPULATE_READ``, Linux 5.14+): a third
        faster than taking one page fault per 4 KiB while the loader transposes it."""
        start = offset - offset % mmap.PAGESIZE
        try:
            self._mmap.madvise(_MADV_POPULATE_READ, start, offset + length - start)
        except (OSError, ValueError):
            pass  # older kernel: the pages fault in on first touch instead


class CheckpointReader:
    """Lazy, renamed view of a safetensors checkpoint: ``keys()``, ``spec(key)`` and ``get(key)``.

    Files are memory-mapped once; a tensor is a view of the mapping whose bytes are read when the
    loader touches them, so peak host memory is what is being converted, not the model."""

    def __init__(self, checkpoint_dir: Path, rules: Sequence[KeyRule]) -> None:
        self.checkpoint_dir = checkpoint_dir
        self._location: dict[str, tuple[Path, str]] = {}
        for name, file in safetensors_files(checkpoint_dir).items():
            key = remap_key(name, rules)
            if key is not None:
                self._location[key] = (file, name)
        self._open = {file: SafetensorsFile(file) for file in {f for f, _ in self._location.values()}}
        self._read: list[str] = []  # keys read and not released yet (a streaming seed)
        self._keep: set[str] = set()
        self._release_due = False

    def keys(self) -> list[str]:
        return list(self._location)

    def __contains__(self, key: str) -> bool:
        return key in self._location

    def spec(self, key: str) -> tuple[list[int], torch.dtype]:
        """Shape and dtype from the safetensors header, without reading the tensor."""
        file, name = self._location[key]
        return self._open[file].spec(name)

    def get(self, key: str) -> torch.Tensor:
        try:
            file, name = self._location[key]
        except KeyError:
            raise CheckpointError(f"checkpoint {self.checkpoint_dir} has no tensor for {key!r}") from None
        if self._release_due:
            self._release_now()
        self._read.append(key)
        return self._open[file].tensor(name, populate=True)

    def release_read(self, keep: Iterable[str] = ()) -> None:
        """Release the pages of every tensor read so far but those in ``keep`` when the next read
        begins (see :meth:`SafetensorsFile.release`): until then a weight may still be put from
        a tensor read before an earlier put (a family reads gate and up, then puts both)."""
        self._keep = set(keep)
        self._release_due = True

    def _release_now(self) -> None:
        for key in self._read:
            if key not in self._keep:
                file, name = self._location[key]
                self._open[file].release(name)
        self._read.clear()
        self._release_due = False

    def items(self) -> Iterator[tuple[str, torch.Tensor]]:
        for key in self._location:
            yield key, self.get(key)

    def close(self) -> None:
        self._open.clear()
