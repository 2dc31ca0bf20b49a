"""lpsim.blocks.layout: the tiled copy that moves a block axis last equals numpy's copy byte
for byte (NaN payloads and signed zeros included), for every axis, partial tiles, both
dtypes, and falls back for what it does not take; block quantization along a first axis
equals that of the transposed copy along its last."""

import numpy as np
import pytest

import lpsim
from lpsim.blocks.layout import TILED_FROM, moved_contiguous


def _data(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(dtype)
    flat = x.reshape(-1)
    flat[::97] = -0.0
    flat[5::101] = np.nan
    bits = flat.view(np.uint32 if dtype == np.float32 else np.uint64)
    bits[7::211] |= 0x1234                      # NaN payloads: a copy keeps every bit
    return x


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: d.__name__)
@pytest.mark.parametrize("shape", [(2048, 96), (257, 300), (3, 100, 70, 50), (7, 1, 9363)],
                         ids=str)
def test_moved_copy_equals_numpys(shape, dtype):
    x = _data(shape, dtype, len(shape))
    assert x.size >= TILED_FROM                 # the tiled route
    for axis in range(len(shape)):
        got = moved_contiguous(x, axis)
        want = np.ascontiguousarray(np.moveaxis(x, axis, -1))
        assert got.flags.c_contiguous and got.shape == want.shape, axis
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), axis


def test_what_it_does_not_tile_is_numpys_copy():
    """Small, non-contiguous, other dtypes and the last axis take numpy's copy."""
    big = _data((512, 256), np.float32, 1)
    for x, axis in ((big[:, ::2], 0), (big[:8, :8], 0), (big.astype(np.float16), 0),
                    (big, 1), (big.T, 0)):
        got = moved_contiguous(x, axis)
        want = np.ascontiguousarray(np.moveaxis(x, axis, -1))
        assert got.flags.c_contiguous and np.array_equal(got.view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("fmt,rounding", [("nvfp4", "nearest"), ("mxfp8", "stochastic")])
def test_blocks_along_the_first_axis_equal_the_transposes(fmt, rounding):
    x = _data((512, 384), np.float32, 2)
    got = lpsim.quantize(x, fmt, rounding, axis=0, seed=3)
    want = lpsim.quantize(np.ascontiguousarray(x.T), fmt, rounding, seed=3).T
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
