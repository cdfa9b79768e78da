# SPDX-License-Identifier: Apache-2.0
"""The host forward's read-back (models.vllm_plugin.readback) against ``ttnn.to_torch``, bit for
bit: every (exponent, code) pair of bfloat8_b and bfloat4_b, bfloat16 / float32 tiles, the tensors it leaves to
ttnn, and every weight of real loads on several meshes. Needs no vLLM, so it runs in both environments."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import models.registry  # noqa: F401 - the mock cluster ttnn needs, before ttnn
import ttnn
from models.common.reference import CachedWeights
from models.registry import loader_class
from models.testing.tiny_models import make_checkpoint
from models.vllm_plugin.host_decoder import ServingWeights
from models.vllm_plugin.readback import BFP8_TILE_BYTES, _tile_decoder, device_tensors, read_back

EXPONENTS, CODES = 256, 256  # every shared exponent, every sign-and-mantissa byte
BFP4_TILE_BYTES = 64 + 512  # 64 shared exponents, then a nibble a value


def bits(t: torch.Tensor) -> torch.Tensor:
    """fp32 values as their bits (so -0.0 and NaN payloads count)."""
    return t.contiguous().view(torch.int32)


def read(tensor: ttnn.Tensor, threads: int = 2) -> list[torch.Tensor]:
    with ThreadPoolExecutor(threads) as pool:
        return [reading.result() for reading in read_back(tensor, pool)]


def assert_as_ttnn(tensor: ttnn.Tensor) -> None:
    (got,) = read(tensor)
    want = ttnn.to_torch(tensor).float()
    assert got.shape == want.shape
    assert torch.equal(bits(got), bits(want)), f"{int((bits(got) != bits(want)).sum())} values differ"


def bfp8_pairs(exponent_of_row) -> ttnn.Tensor:
    """A bfloat8_b tensor whose bytes are written directly: face row ``r`` gets exponent
    ``exponent_of_row(r)``, and the 256 codes of each exponent appear in 16 consecutive face rows."""
    rows = EXPONENTS * CODES // 16  # face rows of 16 values
    tensor = ttnn.from_torch(torch.zeros(32, rows * 16 // 32), dtype=ttnn.bfloat8_b, layout=ttnn.TILE_LAYOUT)
    raw = torch.from_dlpack(tensor.host_buffer().get_shard(ttnn.MeshCoordinate(0, 0))).view(-1, BFP8_TILE_BYTES)
    raw[:, :64] = exponent_of_row(torch.arange(rows)).to(torch.uint8).view(-1, 64)
    raw[:, 64:] = (torch.arange(rows * 16) % CODES).to(torch.uint8).view(-1, 1024)
    return tensor


def test_every_bfloat8_b_exponent_and_byte_reads_as_ttnn():
    """The formula for exponents 7-254 (asserted taken), ttnn's own rule for the rest (flushed
    small values, NaNs of 255), and the signed zero 0x80 as -0.0, as ttnn reads them."""
    every = bfp8_pairs(lambda row: row // 16)
    assert _tile_decoder(every) is None  # flushed and NaN codes present: ttnn decodes
    assert_as_ttnn(every)
    formula = bfp8_pairs(lambda row: 7 + (row // 16) % 248)
    assert _tile_decoder(formula) is not None
    assert_as_ttnn(formula)


def bfp4_pairs(exponent_of_row) -> ttnn.Tensor:
    """A bfloat4_b tensor whose bytes are written directly: face row ``r`` gets exponent
    ``exponent_of_row(r)`` and holds all 16 codes (two a byte, the first in the low nibble)."""
    rows = EXPONENTS  # face rows of 16 values
    tensor = ttnn.from_torch(torch.zeros(32, rows * 16 // 32), dtype=ttnn.bfloat4_b, layout=ttnn.TILE_LAYOUT)
    raw = torch.from_dlpack(tensor.host_buffer().get_shard(ttnn.MeshCoordinate(0, 0))).view(-1, BFP4_TILE_BYTES)
    raw[:, :64] = exponent_of_row(torch.arange(rows)).to(torch.uint8).view(-1, 64)
    codes = torch.arange(16, dtype=torch.uint8)
    raw[:, 64:] = (codes[0::2] | codes[1::2] << 4).repeat(rows).view(-1, 512)
    return tensor


def test_every_bfloat4_b_exponent_and_code_reads_as_ttnn():
    """The formula for exponents 3-254 (asserted taken), ttnn's own rule for the rest (flushed
    small values, NaNs of 255), and the signed zero (code 8) as -0.0, as ttnn reads them."""
    every = bfp4_pairs(lambda row: row)
    assert _tile_decoder(every) is None  # flushed and NaN codes present: ttnn decodes
    assert_as_ttnn(every)
    formula = bfp4_pairs(lambda row: 3 + row % 252)
    assert _tile_decoder(formula) is not None
    assert_as_ttnn(formula)


@pytest.mark.parametrize("dtype, tile_bytes, sign_only", [(ttnn.bfloat8_b, BFP8_TILE_BYTES, 0x80),
                                                           (ttnn.bfloat4_b, BFP4_TILE_BYTES, 0x88)])
def test_odd_exponents_with_zero_mantissas_keep_the_formula(dtype, tile_bytes, sign_only):
    """All-zero face rows (exponent 0) are common; they need no fallback. Signed zeros read as -0.0."""
    tensor = ttnn.from_torch(torch.zeros(64, 128), dtype=dtype, layout=ttnn.TILE_LAYOUT)
    raw = torch.from_dlpack(tensor.host_buffer().get_shard(ttnn.MeshCoordinate(0, 0))).view(-1, tile_bytes)
    raw[:, 64::3] = sign_only
    assert _tile_decoder(tensor) is not None
    assert_as_ttnn(tensor)


@pytest.mark.parametrize("dtype", [ttnn.bfloat16, ttnn.float32, ttnn.bfloat8_b, ttnn.bfloat4_b])
@pytest.mark.parametrize("shape", [(64, 96), (3, 32, 64), (1, 1, 96, 4096)])
def test_tile_tensors_read_as_ttnn(dtype, shape):
    torch.manual_seed(0)
    tensor = ttnn.from_torch(torch.randn(shape) * torch.logspace(-6, 6, shape[-1]), dtype=dtype, layout=ttnn.TILE_LAYOUT)
    assert _tile_decoder(tensor) is not None
    assert_as_ttnn(tensor)


@pytest.mark.parametrize("tensor", [
    pytest.param(lambda: ttnn.from_torch(torch.randn(40, 50), dtype=ttnn.bfloat8_b, layout=ttnn.TILE_LAYOUT), id="padded"),
    pytest.param(lambda: ttnn.from_torch(torch.randn(1, 1, 20, 32), dtype=ttnn.float32), id="row-major"),
    pytest.param(lambda: ttnn.from_torch(torch.randn(40, 50), dtype=ttnn.bfloat4_b, layout=ttnn.TILE_LAYOUT),
                 id="padded-bfloat4_b"),
])
def test_tensors_left_to_ttnn_read_as_ttnn(tensor):
    tensor = tensor()
    assert _tile_decoder(tensor) is None
    assert_as_ttnn(tensor)


@pytest.mark.parametrize("mesh", [(1, 1), (1, 2), (2, 1), (2, 2)])
@pytest.mark.parametrize("precision", ["bfloat16", "bfloat8_b", "bfloat4_b"])
def test_served_weights_are_the_cached_tensors_values(tmp_path_factory, mesh, precision):
    """Every weight of a loaded Gemma 3 and Qwen 3, per mesh column, equals the read-back through
    ``ttnn.to_torch`` (CachedWeights) bit for bit."""
    for family in ("gemma3", "qwen3"):
        checkpoint = make_checkpoint(family, tmp_path_factory.mktemp(family) / family)
        loaded = loader_class(family)(checkpoint, cache_root=tmp_path_factory.mktemp("cache"), mesh_shape=mesh,
                                      precision=precision).load()
        tiled = [s for t in loaded.weights.values() for s in device_tensors(t) if s.layout == ttnn.TILE_LAYOUT]
        assert tiled and all(_tile_decoder(s) is not None for s in tiled)  # only row-major norms go to ttnn
        served, reference = ServingWeights(loaded), CachedWeights(loaded)
        assert served.materialize() > 0
        for name in loaded.weights:
            got, want = served.columns(name), reference.columns(name)
            assert len(got) == len(want) == mesh[1]
            for column, (a, b) in enumerate(zip(got, want)):
                assert a.shape == b.shape and torch.equal(bits(a), bits(b)), f"{family} {name} column {column}"
