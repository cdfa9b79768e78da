# SPDX-License-Identifier: Apache-2.0
"""A cold build's conversion of one shard: the staged path for large block-float weights writes
the very bytes ``ttnn.from_torch`` writes, for every shape and view a family hands it."""

from __future__ import annotations

import pytest
import torch
import ttnn

from models.common.mesh import Placement
from models.common.weight_cache.tensor_cache import TensorFormat, convert_shard


def _bytes(tensor: ttnn.Tensor, path) -> bytes:
    ttnn.dump_tensor(path, tensor)
    return path.read_bytes()


@pytest.mark.parametrize("dtype", ["bfloat8_b", "bfloat4_b"])
@pytest.mark.parametrize("shape, view", [((256, 96), "plain"), ((96, 256), "transposed"), ((333, 70), "transposed"),
                                         ((1000, 45), "plain"), ((2, 40, 72), "plain")])
def test_staged_block_float_conversion_writes_the_same_bytes(tmp_path, dtype, shape, view):
    generator = torch.Generator().manual_seed(sum(shape))
    weight = (torch.randn(*shape, generator=generator) * 0.05).to(torch.bfloat16)
    weight[0, ..., 0] = 3e4  # one large value per block row: shared exponents differ across blocks
    if view == "transposed":
        weight = weight.transpose(-2, -1)
    fmt = TensorFormat(getattr(ttnn, dtype), ttnn.TILE_LAYOUT, Placement())
    direct = ttnn.from_torch(weight, dtype=fmt.dtype, layout=fmt.layout)
    staged = convert_shard(weight, fmt, staged_from=0)
    assert staged.dtype == direct.dtype and staged.layout == direct.layout
    assert tuple(staged.shape) == tuple(direct.shape) == tuple(weight.shape)
    assert _bytes(staged, tmp_path / "staged.tensorbin") == _bytes(direct, tmp_path / "direct.tensorbin")


def test_only_bf16_weights_bound_for_a_block_float_are_staged(tmp_path):
    """A float32 weight is rounded once, straight to the block float (through bf16 it could round
    twice); bf16 and row-major targets are plain conversions already."""
    weight32 = torch.randn(64, 64, generator=torch.Generator().manual_seed(1)) * 0.05
    for tensor, fmt in ((weight32, TensorFormat(ttnn.bfloat8_b, ttnn.TILE_LAYOUT, Placement())),
                        (weight32.to(torch.bfloat16), TensorFormat(ttnn.bfloat16, ttnn.TILE_LAYOUT, Placement())),
                        (weight32.to(torch.bfloat16), TensorFormat(ttnn.bfloat16, ttnn.ROW_MAJOR_LAYOUT, Placement()))):
        direct = ttnn.from_torch(tensor, dtype=fmt.dtype, layout=fmt.layout)
        converted = convert_shard(tensor, fmt, staged_from=0)
        assert _bytes(converted, tmp_path / "a.tensorbin") == _bytes(direct, tmp_path / "b.tensorbin")
