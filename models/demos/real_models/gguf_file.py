# SPDX-License-Identifier: Apache-2.0
"""Read a GGUF file's metadata and tensors fast, and dequantize them with the ``gguf`` package.

Why not ``gguf.GGUFReader``: its constructor builds a numpy view for every element of every
metadata array, and Gemma 3's vocabulary has 262,144 strings (plus as many scores and token types),
so opening the 270M model takes 10-25 s here before a single weight is read. The container itself
is simple (magic, version, counts, key/value pairs, a tensor table, aligned data), so this module
walks it with ``struct`` and leaves big arrays as counts unless asked for (about 0.1 s). Everything
about *quantization* (type ids, block sizes, the dequantizers) is the ``gguf`` package's.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, dequantize, quant_shape_to_byte_shape

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
LONG_ARRAY = 1024  # metadata arrays longer than this are returned as their length unless asked for

_SCALAR_FORMATS = {
    GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H", GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i", GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "Q", GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d",
}
# Types stored as plain values (one element each), as numpy reads them.
_PLAIN_DTYPES = {
    GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16, GGMLQuantizationType.F64: np.float64,
    GGMLQuantizationType.I8: np.int8, GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}


class GgufError(ValueError):
    """The file is not a GGUF this reader can read (bad magic, version, type, or a truncated file)."""


@dataclass(frozen=True)
class GgufTensor:
    """One tensor: its GGUF name, storage type, shape (torch order) and raw bytes (a view of the map)."""

    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]
    raw: np.ndarray

    def dequantize(self) -> np.ndarray:
        """Float32 values in ``shape`` (the same ``gguf.dequantize`` call transformers' GGUF loader makes)."""
        return dequantize(self.raw, self.qtype).reshape(self.shape)


@dataclass(frozen=True)
class GgufFile:
    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, GgufTensor]


class _Cursor:
    """A read position in the mapped file; every read checks the file is long enough."""

    def __init__(self, blob: np.ndarray, path: Path) -> None:
        self.blob, self.path, self.pos = blob, path, 0

    def take(self, fmt: str) -> tuple:
        size = struct.calcsize("<" + fmt)
        if self.pos + size > len(self.blob):
            raise GgufError(f"{self.path}: truncated GGUF header (needs byte {self.pos + size:,}, file has {len(self.blob):,})")
        values = struct.unpack_from("<" + fmt, self.blob, self.pos)
        self.pos += size
        return values

    def string(self) -> str:
        (length,) = self.take("Q")
        if self.pos + length > len(self.blob):
            raise GgufError(f"{self.path}: truncated GGUF header (a {length:,}-byte string at byte {self.pos:,})")
        text = bytes(self.blob[self.pos : self.pos + length])
        self.pos += length
        try:
            return text.decode("utf-8")
        except UnicodeDecodeError as error:
            raise GgufError(f"{self.path}: a metadata string at byte {self.pos - length:,} is not UTF-8") from error

    def skip_strings(self, count: int) -> None:
        for _ in range(count):
            (length,) = self.take("Q")
            self.pos += length
        if self.pos > len(self.blob):
            raise GgufError(f"{self.path}: truncated GGUF header (a string array runs past the end)")

    def value(self, value_type: int, keep: bool) -> Any:
        """One metadata value; arrays of strings are returned as their length unless ``keep``."""
        kind = _value_type(value_type, self.path)
        if kind in _SCALAR_FORMATS:
            return self.take(_SCALAR_FORMATS[kind])[0]
        if kind == GGUFValueType.STRING:
            return self.string()
        element_type, count = self.take("IQ")
        element = _value_type(element_type, self.path)
        skip = not keep and count > LONG_ARRAY  # e.g. 262,144 token scores: nothing here needs them
        if element in _SCALAR_FORMATS:
            fmt = _SCALAR_FORMATS[element]
            if skip:
                self.pos += count * struct.calcsize(fmt)
                return count
            return list(self.take(f"{count}{fmt}"))
        if element == GGUFValueType.STRING:
            if skip:
                self.skip_strings(count)
                return count
            return [self.string() for _ in range(count)]
        raise GgufError(f"{self.path}: metadata arrays of {element.name} are not supported")


def _value_type(raw: int, path: Path) -> GGUFValueType:
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise GgufError(f"{path}: unknown GGUF metadata value type {raw}") from None


def _qtype(raw: int, name: str, path: Path) -> GGMLQuantizationType:
    try:
        return GGMLQuantizationType(raw)
    except ValueError:
        raise GgufError(f"{path}: tensor {name} has unknown ggml type {raw}") from None


def read_gguf(path: Path | str, keep_arrays: tuple[str, ...] = ()) -> GgufFile:
    """Parse ``path``'s header and tensor table; tensor bytes stay in the memory map until used.

    Metadata arrays longer than ``LONG_ARRAY`` elements come back as their length unless named in
    ``keep_arrays`` (the vocabulary is 262,144 strings: reading it is the slow part of a header)."""
    path = Path(path)
    try:
        blob = np.memmap(path, mode="r", dtype=np.uint8)
    except (OSError, ValueError) as error:  # ValueError: an empty file cannot be mapped
        raise GgufError(f"{path}: cannot map the file ({error})") from error
    cursor = _Cursor(blob, path)
    if len(blob) < 4 or bytes(blob[:4]) != GGUF_MAGIC:
        raise GgufError(f"{path}: not a GGUF file (the first bytes are {bytes(blob[:4])!r}, not {GGUF_MAGIC!r})")
    cursor.pos = 4
    (version,) = cursor.take("I")
    if version not in SUPPORTED_VERSIONS:
        raise GgufError(f"{path}: GGUF version {version}; this reader handles versions {SUPPORTED_VERSIONS}")
    tensor_count, kv_count = cursor.take("QQ")

    metadata: dict[str, Any] = {}
    for _ in range(kv_count):
        key = cursor.string()
        (value_type,) = cursor.take("I")
        metadata[key] = cursor.value(value_type, keep=key in keep_arrays)

    table = []
    for _ in range(tensor_count):
        name = cursor.string()
        (n_dims,) = cursor.take("I")
        dims = cursor.take(f"{n_dims}Q")
        raw_type, offset = cursor.take("IQ")
        table.append((name, tuple(reversed(dims)), _qtype(raw_type, name, path), offset))

    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
    if alignment <= 0 or alignment & (alignment - 1):
        raise GgufError(f"{path}: general.alignment {alignment} is not a power of two")
    data_start = -(-cursor.pos // alignment) * alignment
    tensors = {}
    for name, shape, qtype, offset in table:
        if name in tensors:
            raise GgufError(f"{path}: tensor {name} appears twice")
        tensors[name] = GgufTensor(name, qtype, shape, _tensor_bytes(blob, path, name, shape, qtype, data_start + offset))
    return GgufFile(path, version, metadata, tensors)


def _tensor_bytes(blob: np.ndarray, path: Path, name: str, shape: tuple[int, ...], qtype: GGMLQuantizationType,
                  start: int) -> np.ndarray:
    """The tensor's bytes as the dequantizers want them: values for plain types, block rows otherwise."""
    if qtype in _PLAIN_DTYPES:
        dtype = np.dtype(_PLAIN_DTYPES[qtype])
        byte_shape, nbytes = shape, prod(shape) * dtype.itemsize
    else:
        if qtype not in GGML_QUANT_SIZES:
            raise GgufError(f"{path}: tensor {name} has ggml type {qtype.name}, which gguf cannot dequantize")
        try:
            byte_shape = quant_shape_to_byte_shape(shape, qtype)
        except ValueError as error:
            raise GgufError(f"{path}: tensor {name}: {error}") from error
        dtype, nbytes = np.dtype(np.uint8), prod(byte_shape)
    if start + nbytes > len(blob):
        raise GgufError(f"{path}: tensor {name} ends at byte {start + nbytes:,}, past the end of the file "
                        f"({len(blob):,} bytes): the file is truncated")
    return blob[start : start + nbytes].view(dtype).reshape(byte_shape)
