# SPDX-License-Identifier: Apache-2.0
"""What makes a cache variant's bytes valid: one typed object, computed here and nowhere else.

**The rule: anything that changes the bytes of a cached file, or how they are read, is part of the
variant.** That is

* the build variant: which files a build writes and how it lays weights out (a family's name,
  precision policy (its label and full per-decoder map: :mod:`models.common.precision`) and layout
  version, :func:`family_variant`; a seed API caller's own mapping);
* the mesh shape: how every weight is cut into shards;
* the ttnn version that wrote the files, and the tensorbin format it writes: what
  ``ttnn.load_tensor`` must read (ttnn changed it in 2025-02, 2025-05 and 2026-09; a source build
  can change it without a new version string, so the format is probed, never looked up).

The device architecture is not: the same weight dumped under a Wormhole and a Blackhole cluster
is one file byte for byte, in every dtype and layout (host-side tensorbins carry no architecture;
``tests/ttnn/weight_cache/test_variant_identity.py`` holds ttnn to that). A cache moves between them.

The marker records a :class:`VariantIdentity`, the gate compares it (:meth:`VariantIdentity.mismatch`),
the variant's files are tagged by it (:attr:`VariantIdentity.tag`: the build variant's digest, so a
build under another ttnn replaces the old one in its dir and says why, instead of piling up beside
it) and ``tt-cache ls`` shows it.

**The probe.** A one-element tensor is dumped by ttnn's own writer and its header read back
(``<u64 length><flatbuffer header>``, as :mod:`~models.common.weight_cache.tensorbin` reads it): the
format is the header's kind, where the data starts after it, and a digest of the header bytes, so any
change in how ttnn encodes a header (a field, its padding) is another format. It runs once per process and
only where ttnn is imported already (about 1 ms); its result is recorded in the user state dir,
keyed by the installed ttnn (version, and the inode, size and mtime of its native library: found
without importing it), so a torch-free process (``tt-cache check``, ``seed --check``) compares the
format too. Where no record matches (ttnn reinstalled, no build here since) it compares the
version alone: the loader, which reads the bytes, always probes. Without ttnn installed (the light
install) there is no ttnn to compare with, and the gate judges the files only.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import struct
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.common import envs
from models.common.fileio import atomic_write_bytes, read_regular

PROBE_RECORDS = Path("ttnn")  # under the user state dir: one record per installed ttnn
MAX_PROBE_RECORD_BYTES = 4096
MAX_FORMAT_CHARS = 128
_HEADER_LENGTH = struct.Struct("<Q")


class TensorbinProbeError(RuntimeError):
    """ttnn wrote a file this module cannot read a header from."""


# --------------------------------------------------------------------------------------------
# The build variant (what the marker's tag is a digest of)
# --------------------------------------------------------------------------------------------


def family_variant(family: str, precision: str, layout_version: int,
                   policy: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A family's build variant: the options that decide which files its builds write. ``precision``
    is the precision policy's label; ``policy`` its full per-decoder map
    (:meth:`~models.common.precision.PrecisionPolicy.canonical`), absent where one dtype is every
    group's (so a plain-dtype build keeps the variant, and the cache, it always had)."""
    variant = {"family": family, "precision": precision, "layout_version": layout_version}
    if policy is not None:
        variant["policy"] = dict(policy)
    return variant


def variant_tag(build_variant: Mapping[str, Any] | None) -> str:
    """A short, stable digest of a build variant (``none`` for the seed API's default)."""
    if build_variant is None:
        return "none"
    canonical = json.dumps(build_variant, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def canonical_variant(build_variant: Mapping[str, Any] | None) -> Any:
    """The build variant as the marker stores it (JSON: tuples become lists, other objects strings),
    so the gate compares like with like."""
    if build_variant is None:
        return None
    return json.loads(json.dumps(build_variant, sort_keys=True, default=str))


def variant_unverifiable(build_variant: Mapping[str, Any] | None) -> bool:
    return isinstance(build_variant, Mapping) and bool(build_variant.get("unverifiable"))


def normalize_mesh_shape(mesh_shape: Any) -> str:
    """``(1, 8)``, ``[1, 8]`` and ``ttnn.MeshShape(1, 8)`` all encode as ``"(1, 8)"``."""
    try:
        return str(tuple(int(d) for d in mesh_shape))
    except (TypeError, ValueError):
        return str(mesh_shape)


# --------------------------------------------------------------------------------------------
# This process's ttnn
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TtnnRuntime:
    """The ttnn that writes (or would read) a cache's files here. ``tensorbin_format`` is None
    where it was not probed and no record of this install stands in for the probe."""

    version: str
    tensorbin_format: str | None

    def describe(self) -> str:
        return f"ttnn {self.version} (tensorbin format {self.tensorbin_format or 'not probed on this machine yet'})"


def tensorbin_format_of(raw: bytes) -> str:
    """The format of a probe tensorbin from its bytes: ``<kind>-d<data offset>-<header digest>``.

    ``kind`` is ``flatbuffer`` when the header's root offset lies inside it (else ``framed``); the
    data offset is where the data region starts (8 + the header's length, its padding included);
    the digest is over both, so any change in how ttnn encodes the probe's header is another format."""
    if len(raw) < _HEADER_LENGTH.size + 4:
        raise TensorbinProbeError(f"a tensorbin of {len(raw)} bytes has no header")
    (length,) = _HEADER_LENGTH.unpack_from(raw)
    end = _HEADER_LENGTH.size + length
    if not 4 <= length <= len(raw) - _HEADER_LENGTH.size:
        raise TensorbinProbeError(f"tensorbin header length {length} does not fit its {len(raw)}-byte file")
    (root,) = struct.unpack_from("<I", raw, _HEADER_LENGTH.size)
    kind = "flatbuffer" if 4 <= root < length else "framed"
    return f"{kind}-d{end}-{hashlib.sha256(raw[:end]).hexdigest()[:8]}"


def probe_tensorbin_format() -> str:
    """The format this process's ttnn writes: one bfloat16 element dumped by ttnn's own writer (its
    local mode: the same bytes as ``ttnn.dump_tensor`` for a host tensor, without its distributed
    set-up) and its header read back."""
    import torch
    import ttnn

    tensor = ttnn.from_torch(torch.tensor([[1.5]], dtype=torch.bfloat16))
    with tempfile.TemporaryDirectory(prefix="tt-tensorbin-probe-") as directory:
        path = os.path.join(directory, "probe.tensorbin")
        ttnn._ttnn.tensor.dump_tensor_flatbuffer(path, tensor, ttnn.DumpTensorMode.LOCAL)
        raw = Path(path).read_bytes()
    return tensorbin_format_of(raw)


@functools.cache
def installed_ttnn() -> tuple[str, str] | None:
    """(version, install key) of the installed ttnn, without importing it: the key names the native
    library that writes tensorbins (its inode, size and mtime), so a reinstall is another key.
    None when ttnn is not installed. Once per process (about 1 ms: ``tt-cache ls`` asks per variant)."""
    try:
        spec = importlib.util.find_spec("ttnn")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    try:
        version = importlib.metadata.version("ttnn")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    stamps = []
    for location in spec.submodule_search_locations or [os.path.dirname(spec.origin or "")]:
        with contextlib.suppress(OSError), os.scandir(location) as entries:
            for entry in entries:
                if entry.name.startswith("_ttnn") and entry.name.endswith(".so"):
                    info = entry.stat()
                    stamps.append(f"{entry.name}:{info.st_dev}:{info.st_ino}:{info.st_size}:{info.st_mtime_ns}")
    return version, f"{version}|" + "|".join(sorted(stamps))


def probe_record_path(key: str) -> Path:
    """Where the probe of the ttnn installed as ``key`` is recorded (one file per install, so two
    environments of one user never overwrite each other's)."""
    name = hashlib.sha256(key.encode()).hexdigest()[:16]
    return envs.TT_USER_STATE / PROBE_RECORDS / f"tensorbin-format.{name}.json"


def _recorded_format(key: str) -> str | None:
    try:
        body = json.loads(read_regular(probe_record_path(key), MAX_PROBE_RECORD_BYTES))
    except (OSError, ValueError):
        return None
    recorded = body.get("tensorbin_format") if isinstance(body, dict) and body.get("key") == key else None
    return recorded if isinstance(recorded, str) and 0 < len(recorded) <= MAX_FORMAT_CHARS else None


def _record_format(key: str, runtime: TtnnRuntime) -> None:
    if _recorded_format(key) == runtime.tensorbin_format:
        return
    path = probe_record_path(key)
    body = {"key": key, "ttnn_version": runtime.version, "tensorbin_format": runtime.tensorbin_format}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, json.dumps(body).encode(), durable=False)
    except OSError as error:  # a read-only home: torch-free processes compare the version alone
        from loguru import logger  # imported late: the CLI sets its level first (device_env.set_output)

        logger.debug(f"could not record the tensorbin format in {path}: {error}")


@functools.cache
def _probed() -> TtnnRuntime:
    install = installed_ttnn()
    version, key = install or (str(getattr(sys.modules["ttnn"], "__version__", "unknown")), "")
    runtime = TtnnRuntime(version, probe_tensorbin_format())
    if install is not None:
        _record_format(key, runtime)
    return runtime


def ttnn_runtime(*, probe: bool = False) -> TtnnRuntime | None:
    """This process's ttnn: probed (once) where ttnn is imported, or ``probe`` asks for it (a
    writer); else the installed ttnn's version and its recorded format; None without ttnn."""
    if probe or "ttnn" in sys.modules:
        if "ttnn" not in sys.modules:
            if importlib.util.find_spec("ttnn") is None:
                return None
            from models.common.device_env import ensure_host_cluster

            ensure_host_cluster()
        if probe:
            return _probed()  # a writer records what it wrote, or nothing
        try:
            return _probed()
        except Exception as error:  # noqa: BLE001 - a reader then compares what it can
            from loguru import logger  # imported late: the CLI sets its level first (device_env.set_output)

            logger.warning(f"could not probe ttnn's tensorbin format ({error}); comparing what is recorded")
    install = installed_ttnn()
    if install is None:
        return None
    version, key = install
    return TtnnRuntime(version, _recorded_format(key))


# --------------------------------------------------------------------------------------------
# The identity
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VariantIdentity:
    """Everything that makes a variant's bytes valid (see the module doc), as the marker records it.

    ``ttnn_version`` and ``tensorbin_format`` are None only for a wanted identity where no ttnn is
    installed (nothing to compare) or not probed (the format)."""

    build_variant: Any  # canonical JSON (:func:`canonical_variant`)
    mesh_shape: str  # :func:`normalize_mesh_shape`
    ttnn_version: str | None
    tensorbin_format: str | None

    @classmethod
    def of(cls, build_variant: Mapping[str, Any] | None, mesh_shape: Any,
           runtime: TtnnRuntime | None) -> VariantIdentity:
        return cls(canonical_variant(build_variant), normalize_mesh_shape(mesh_shape),
                   runtime.version if runtime else None, runtime.tensorbin_format if runtime else None)

    @classmethod
    def here(cls, build_variant: Mapping[str, Any] | None, mesh_shape: Any, *, probe: bool = False) -> VariantIdentity:
        """The identity a build of this variant has in this process (``probe``: a writer's, probed)."""
        return cls.of(build_variant, mesh_shape, ttnn_runtime(probe=probe))

    @property
    def tag(self) -> str:
        """The tag of the variant's marker and side files: its build variant's digest."""
        return variant_tag(self.build_variant)

    @property
    def runtime(self) -> TtnnRuntime | None:
        return None if self.ttnn_version is None else TtnnRuntime(self.ttnn_version, self.tensorbin_format)

    def mismatch(self, wanted: VariantIdentity) -> str | None:
        """Why a cache recorded with this identity cannot serve ``wanted``, in words (None: it can).
        A ttnn ``wanted`` does not know (none installed, a format not probed) is not compared."""
        if self.mesh_shape != wanted.mesh_shape:
            return f"marker is for mesh {self.mesh_shape}, not {wanted.mesh_shape}"
        if self.build_variant != wanted.build_variant:
            return f"marker variant {self.build_variant!r} != {wanted.build_variant!r}"
        if self.runtime is None:
            return "marker records no ttnn version (its files' format is unknown)"
        if wanted.runtime is None:
            return None
        if self.ttnn_version != wanted.ttnn_version or (
                wanted.tensorbin_format is not None and self.tensorbin_format != wanted.tensorbin_format):
            return f"built with {self.runtime.describe()}; this is {wanted.runtime.describe()}"
        return None

    def describe(self) -> str:
        """The ttnn part, for people (``tt-cache ls``)."""
        return "no ttnn recorded" if self.runtime is None else self.runtime.describe()
