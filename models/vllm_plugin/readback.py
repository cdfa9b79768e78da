# SPDX-License-Identifier: Apache-2.0
"""Cached ttnn tensors read back to fp32 torch for the host forward: on every core, each value
bit-identical to ``ttnn.to_torch(t).float()``.

``ttnn.to_torch`` unpacks a tile tensor on one thread, through two full-size buffers before the
torch result: Gemma 3's LM head (640 x 262,144 bfloat8_b) takes 1.1 s alone, half of it page
faults, and in vLLM's engine core, on a shared 2-core host, one thread gets a fraction of a core
(docs/vllm.md, "Start-up"). Here a tile tensor's packed bytes (ttnn's own host buffer, through
DLPack: no copy) are decoded block by block of tile rows, the blocks of every weight spread over a
thread pool (torch releases the GIL), each written once into its place in the result.

Tile bytes, as ttnn stores them: 32 x 32 tiles in row-major order, each four 16 x 16 faces (top
left, top right, bottom left, bottom right), row-major inside a face. bfloat16 and float32 tiles
are that permutation of the values. A block-float tile is 64 shared exponents (one per face row of
16 values, faces in the same order), then a code per value: a sign and a mantissa of ``m`` bits,
bfloat8_b a byte a value (``m`` = 7), bfloat4_b a nibble a value, the first value of a byte in its
low nibble (``m`` = 3). A value is ``+-mantissa * 2**(exponent - 127 - (m - 1))``. ttnn flushes
some values of exponents below ``m`` to zero and turns some of exponent 255 into NaNs; a tensor
holding any of those is left to ``ttnn.to_torch`` (the rule stays ttnn's). A bfloat4_b block is
widened to bfloat8_b's bytes (each nibble's sign to bit 7, its mantissa to the low bits) and
decoded as one. ``tests/ttnn/vllm/test_readback.py`` checks every (exponent, code) pair of both,
and real weights on several meshes, against ``ttnn.to_torch``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from functools import cached_property, lru_cache

import torch
import ttnn

from models.common.cpus import usable_cpus

TILE = 32
FACE = 16
BFP8_EXPONENT_BYTES = 64
BFP8_TILE_BYTES = BFP8_EXPONENT_BYTES + TILE * TILE
BLOCK_BYTES = 8 << 20  # fp32 output per task: small enough to spread, large enough to amortise a task
TILE_DTYPES = {ttnn.DataType.BFLOAT16: torch.bfloat16, ttnn.DataType.FLOAT32: torch.float32}
_thread_buffers = threading.local()
_UNIT = torch.complex128  # 16 bytes: a bfloat8_b face row's codes, moved as one element


@dataclass(frozen=True)
class BlockFloat:
    """A block-float tile format: 64 shared exponents, then ``bits`` bits a value (sign and mantissa)."""

    bits: int

    @property
    def tile_bytes(self) -> int:
        return BFP8_EXPONENT_BYTES + TILE * TILE * self.bits // 8

    @property
    def exponents(self) -> tuple[int, int]:
        """The shared exponents whose every value decodes by the formula (else ttnn's rule)."""
        return self.bits - 1, 254

    @property
    def mantissa_mask(self) -> int:
        """The mantissa bits of one code byte (two codes a byte for bfloat4_b)."""
        return 0x7F if self.bits == 8 else 0x77

    @cached_property
    def powers(self) -> torch.Tensor:
        """``2**(exponent - 127 - (m - 1))`` for every exponent (``m`` mantissa bits)."""
        return torch.pow(2.0, torch.arange(256, dtype=torch.float64) - 127 - (self.bits - 2)).float()


BLOCK_FLOATS = {ttnn.DataType.BFLOAT8_B: BlockFloat(8), ttnn.DataType.BFLOAT4_B: BlockFloat(4)}


def read_threads() -> int:
    """One read-back thread per CPU this process may use (its affinity mask and its cgroup's quota)."""
    return usable_cpus()


def device_tensors(tensor: ttnn.Tensor) -> list[ttnn.Tensor]:
    """A host tensor's per-device tensors (itself for one device), in ``host_shards``'s order."""
    devices = ttnn.get_device_tensors(tensor)
    return devices if len(devices) > 1 else [tensor]


@dataclass
class Reading:
    """A shard being read back: its result (filled block by block) and the pool's tasks filling it."""

    tasks: list[Future]
    values: torch.Tensor | None = None  # None: the one task returns the shard

    def result(self) -> torch.Tensor:
        done = [task.result() for task in self.tasks]
        return done[0] if self.values is None else self.values


def read_back(tensor: ttnn.Tensor, pool: Executor) -> list[Reading]:
    """Each device shard of a host ``tensor`` read back to fp32 on ``pool``: the values of
    ``[ttnn.to_torch(s).float() for s in host_shards(tensor)]``."""
    return [_read_shard(shard, pool) for shard in device_tensors(tensor)]


def _read_shard(shard: ttnn.Tensor, pool: Executor) -> Reading:
    decode = _tile_decoder(shard)
    if decode is None:
        return Reading([pool.submit(lambda: ttnn.to_torch(shard).float())])
    rows, width, run = decode
    values = torch.empty(rows * TILE, width)
    per_task = max(1, BLOCK_BYTES // (width * TILE * 4))
    tasks = [pool.submit(run, values, first, min(first + per_task, rows)) for first in range(0, rows, per_task)]
    return Reading(tasks, values.view(tuple(shard.shape)))


Decode = Callable[[torch.Tensor, int, int], None]  # (result, first tile row, last): fills those rows


def _tile_decoder(shard: ttnn.Tensor) -> tuple[int, int, Decode] | None:
    """(tile rows, width, block decoder) of a tile tensor this module decodes, or
    None for ttnn's own read-back (row-major, padded, other dtypes or tiles, flushed exponents)."""
    tile = shard.tile
    if shard.layout != ttnn.TILE_LAYOUT or list(tile.tile_shape) != [TILE, TILE] or list(tile.face_shape) != [FACE, FACE]:
        return None
    shape, padded = tuple(shard.shape), tuple(shard.padded_shape)
    if shape != padded or len(shape) < 2:
        return None
    width = shape[-1]
    rows = shard.logical_volume() // (width * TILE)
    raw = torch.from_dlpack(shard.host_buffer().get_shard(ttnn.MeshCoordinate(0, 0)))
    if shard.dtype in TILE_DTYPES:
        dtype = TILE_DTYPES[shard.dtype]
        itemsize = dtype.itemsize
        return (rows, width, _detile(raw, itemsize, dtype)) if raw.numel() == rows * TILE * width * itemsize else None
    block = BLOCK_FLOATS.get(shard.dtype)
    if block is None or raw.numel() != rows * (width // TILE) * block.tile_bytes:
        return None
    return (rows, width, _decode_block_float(raw, block)) if _by_formula(raw, block) else None


@lru_cache(maxsize=64)
def _face_rows(count: int, columns: int, tile_units: int, header_units: int) -> torch.Tensor:
    """Where each face row of ``count`` tile rows of ``columns`` tiles sits in tile order, listed in
    row order (tile row, face row, row, tile, face column); in units of one face row."""
    tile_row, face_row, row, tile, face_column = torch.meshgrid(
        *(torch.arange(n) for n in (count, 2, FACE, columns, 2)), indexing="ij")
    return ((tile_row * columns + tile) * tile_units + header_units + (face_row * 2 + face_column) * FACE + row).reshape(-1)


def _in_row_order(raw: torch.Tensor, count: int, columns: int, itemsize: int, header_bytes: int = 0) -> torch.Tensor:
    """The face rows of ``count`` tile rows (``raw``: their bytes) gathered into row order, each
    moved whole (16 bytes a unit): ``[count * 32, columns * 32 * itemsize]`` bytes."""
    unit = FACE * itemsize // _UNIT.itemsize
    tile_units = (header_bytes + TILE * TILE * itemsize) // (FACE * itemsize)
    units = raw.view(_UNIT).view(-1, unit)
    index = _face_rows(count, columns, tile_units, header_bytes // (FACE * itemsize))
    gathered = _scratch(0, index.numel() * unit * _UNIT.itemsize).view(_UNIT).view(-1, unit)
    return torch.index_select(units, 0, index, out=gathered).view(torch.uint8).view(count * TILE, -1)


def _scratch(slot: int, nbytes: int) -> torch.Tensor:
    """This thread's byte buffer ``slot``, reused from block to block: fresh memory costs a page
    fault every 4 KiB, and the allocator hands blocks of this size back to the system when freed."""
    buffers = _thread_buffers.__dict__.setdefault("buffers", {})
    if slot not in buffers or buffers[slot].numel() < nbytes:
        buffers[slot] = torch.empty(nbytes, dtype=torch.uint8)
    return buffers[slot][:nbytes]


def _detile(raw: torch.Tensor, itemsize: int, dtype: torch.dtype) -> Decode:
    def run(out: torch.Tensor, first: int, last: int) -> None:
        """Tile rows ``[first, last)`` of a bfloat16 / float32 tile tensor into ``out``: a permutation."""
        columns = out.shape[1] // TILE
        size = columns * TILE * TILE * itemsize
        rows = _in_row_order(raw[first * size:last * size], last - first, columns, itemsize)
        out[first * TILE:last * TILE].copy_(rows.view(dtype))
    return run


def _by_formula(raw: torch.Tensor, block: BlockFloat) -> bool:
    """Whether every value of a block-float tensor decodes by the formula: no face row with an
    exponent outside ``block.exponents`` holds a nonzero mantissa."""
    tiles = raw.view(-1, block.tile_bytes)
    exponents = tiles[:, :BFP8_EXPONENT_BYTES]
    low, high = block.exponents
    odd = (exponents < low) | (exponents > high)
    if not bool(odd.any()):
        return True
    mantissas = tiles[:, BFP8_EXPONENT_BYTES:].reshape(-1, 4 * FACE, FACE * block.bits // 8)
    return not bool((mantissas[odd] & block.mantissa_mask).any())


def _as_bfp8_tiles(tiles: torch.Tensor, block: BlockFloat) -> torch.Tensor:
    """Block-float tiles in bfloat8_b's bytes (this thread's scratch): bfloat8_b's are themselves;
    a bfloat4_b nibble ``s mmm`` becomes the byte ``s 0000 mmm``, low nibble first."""
    if block.bits == 8:
        return tiles
    packed = tiles.view(-1, block.tile_bytes)
    wide = _scratch(2, packed.shape[0] * BFP8_TILE_BYTES).view(-1, BFP8_TILE_BYTES)
    wide[:, :BFP8_EXPONENT_BYTES].copy_(packed[:, :BFP8_EXPONENT_BYTES])
    codes = wide[:, BFP8_EXPONENT_BYTES:].view(packed.shape[0], -1, 2)
    nibbles = packed[:, BFP8_EXPONENT_BYTES:]
    codes[:, :, 0].copy_(nibbles & 0x0F)
    codes[:, :, 1].copy_(nibbles >> 4)
    signs = wide[:, BFP8_EXPONENT_BYTES:] & 0x08
    wide[:, BFP8_EXPONENT_BYTES:].bitwise_and_(0x07).bitwise_or_(signs.bitwise_left_shift_(4))
    return wide.view(-1)


def _decode_block_float(raw: torch.Tensor, block: BlockFloat) -> Decode:
    def run(out: torch.Tensor, first: int, last: int) -> None:
        """Tile rows ``[first, last)`` of a block-float tile tensor into ``out``: its tiles in
        bfloat8_b's bytes, the sign-and-mantissa bytes put in row order first (a byte a value),
        made two's complement, widened, scaled."""
        count, columns = last - first, out.shape[1] // TILE
        tiles = _as_bfp8_tiles(raw[first * columns * block.tile_bytes:last * columns * block.tile_bytes], block)
        codes = _in_row_order(tiles, count, columns, 1, BFP8_EXPONENT_BYTES)
        exponents = tiles.view(count, columns, BFP8_TILE_BYTES)[:, :, :BFP8_EXPONENT_BYTES]
        exponents = exponents.reshape(count, columns, 2, 2, FACE).permute(0, 2, 4, 1, 3).reshape(-1)
        negative_zero = _holds_sign_only(codes)
        negative = torch.bitwise_right_shift(codes.view(torch.int8), 7,
                                           out=_scratch(1, codes.numel()).view(torch.int8).view(codes.shape))
        # negative: -1 where the sign bit is set, else 0
        signed = codes.bitwise_and_(0x7F).view(torch.int8).bitwise_xor_(negative).sub_(negative)
        rows = out[first * TILE:last * TILE]
        rows.copy_(signed)
        scale = torch.index_select(block.powers, 0, exponents.int())  # one a face row, in row order
        rows.view(-1, FACE).mul_(scale.unsqueeze(-1))
        if negative_zero:  # ttnn reads a sign with a zero mantissa as -0.0; two's complement has no -0
            rows.masked_fill_((negative < 0) & (signed == 0), -0.0)
    return run


def _holds_sign_only(codes: torch.Tensor) -> bool:
    """Whether any code is 0x80 (a sign and a zero mantissa): the one byte that is -128 as int8."""
    return int(codes.view(torch.int8).min()) == -128
