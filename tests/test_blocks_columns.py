"""lpsim.blocks.columns: blocks down the columns of a 2-D float32 array, without a
transposing copy, equal bit for bit to the transposed copy's blocks (values and scales),
in the array's own layout."""

import numpy as np
import pytest

import lpsim
from lpsim.blocks import BlockStats, columns, quantize_blocks
from lpsim.blocks.kernels import SERIAL_BELOW
from lpsim.rounding import MODES
from lpsim.stats import FIELDS


def _data(shape, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * np.exp(2 * rng.standard_normal(shape))).astype(np.float32)
    flat = x.reshape(-1)
    if flat.size > 15:
        flat[[0, 7, 11]] = [np.nan, np.inf, -np.inf]    # blocks the word kernel's slow path takes
        flat[13:15] = [1e-40, -3e-39]                   # float32 subnormals
        x[:, -1] = 0.0                                  # a column of zero blocks
    return x


def _by_transpose(x, fmt, rounding, **kw):
    return quantize_blocks(np.ascontiguousarray(x.T), fmt, rounding, axis=-1,
                           want_elements=False, want_counts=False, **kw)


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp4"])
# nearest and one directed mode (each mode compiles a kernel of its own, ~10 s in CI)
@pytest.mark.parametrize("rounding", ["nearest", "stochastic", "down"])
@pytest.mark.parametrize("shape", [(64, 48), (100, 37), (33, 17), (1, 5), (2, 1), (80, 250)])
def test_columns_equal_the_transposed_copys_blocks(fmt, rounding, shape):
    """Rows not a multiple of the block (a shorter last block row) nor of a tile, columns
    not a multiple of a tile, NaN, inf, subnormals and zero blocks (stochastic rounding
    keeps the general route, with a nonzero offset and stream)."""
    x = _data(shape)
    kw = dict(seed=3, stream=5, offset=7)
    got = quantize_blocks(x, fmt, rounding, axis=0, want_elements=False, want_counts=False,
                          **kw)
    want = _by_transpose(x, fmt, rounding, **kw)
    if rounding != "stochastic":        # the columns, in C order (SR: the general route)
        assert got.values.flags.c_contiguous
    np.testing.assert_array_equal(got.values.view(np.int32), want.values.T.view(np.int32))
    np.testing.assert_array_equal(got.scales, want.scales)


def test_columns_of_a_large_array_split_over_threads_equal_one_call():
    """An array above SERIAL_BELOW elements runs block rows on lpsim's threads: the same
    bits as the transposed copy's."""
    rows = 512 + 17
    cols = -(-SERIAL_BELOW // rows) + 3
    x = _data((rows, cols), seed=1)
    got = lpsim.quantize(x, "mxfp8_e4m3", axis=0)
    want = _by_transpose(x, "mxfp8_e4m3", "nearest")
    np.testing.assert_array_equal(got.view(np.int32), want.values.T.view(np.int32))


def test_which_calls_take_the_columns():
    """2-D float32 C-contiguous arrays blocked along axis 0, without counters or element
    values, of formats without a tensor scale; the others keep the general route."""
    from lpsim.blocks.decisions import block_params
    from lpsim.blocks.formats import parse_block_format
    x = np.zeros((64, 8), np.float32)
    bp = block_params(parse_block_format("mxfp8_e4m3"))
    near, sr = MODES["nearest"], MODES["stochastic"]
    assert columns.takes_columns(x, 0, bp, near, False, False, False)
    assert columns.takes_columns(x, -2, bp, MODES["down"], False, False, False)
    assert not columns.takes_columns(x, 1, bp, near, False, False, False)
    assert not columns.takes_columns(x, 0, bp, sr, False, False, False)       # counters
    assert not columns.takes_columns(x.T, 0, bp, near, False, False, False)   # not C order
    assert not columns.takes_columns(x.astype(np.float64), 0, bp, near, False, False, False)
    assert not columns.takes_columns(x[None], 0, bp, near, False, False, False)   # 3-D
    assert not columns.takes_columns(x, 0, bp, near, True, False, False)     # NVFP4's scale
    assert columns.takes_columns(x, 0, bp, near, False, False, "totals")      # sums, nearest
    assert not columns.takes_columns(x, 0, bp, MODES["down"], False, False, "totals")
    assert not columns.takes_columns(x, 0, bp, near, False, False, True)     # per block
    assert not columns.takes_columns(x, 0, bp, near, False, True, False)     # element values


def _stats(stats):
    return {f: getattr(stats, f) for f in FIELDS + BlockStats.BLOCK_FIELDS}


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp4"])
@pytest.mark.parametrize("shape", [(64, 48), (100, 37), (33, 17), (2, 1), (80, 250),
                                   (64, 1030)])
def test_counted_columns_equal_the_transposed_copys_counts(fmt, shape):
    """stats to nearest (simulated training's telemetry) down the columns: the values and
    every counter of the transposed copy's call (NaN and inf blocks, subnormals, zero
    blocks, elements that overflow or underflow, a strip boundary at 1024 columns)."""
    x = _data(shape, seed=5)
    x[: min(3, shape[0]), 0] *= np.float32(2.0 ** 100)   # an overflow and flushed neighbours
    if shape[1] > 2:
        x[:, 1] = np.float32(1e-45)     # blocks of the least subnormal: clipped, flushed
    got_stats, want_stats = BlockStats(), BlockStats()
    got = lpsim.quantize(x, fmt, axis=0, stats=got_stats)
    want = lpsim.quantize(np.ascontiguousarray(x.T), fmt, axis=-1, stats=want_stats)
    np.testing.assert_array_equal(got.view(np.int32), want.T.view(np.int32))
    assert _stats(got_stats) == _stats(want_stats)
    assert got_stats.elements == x.size


def test_counted_columns_of_a_large_array_split_over_threads_equal_one_call():
    """Above SERIAL_BELOW each thread's range returns its sums: their total is the
    transposed copy's, one call's."""
    rows = 512 + 17
    x = _data((rows, -(-SERIAL_BELOW // rows) + 3), seed=6)
    got_stats, want_stats = BlockStats(), BlockStats()
    got = lpsim.quantize(x, "mxfp4", axis=0, stats=got_stats)
    want = lpsim.quantize(np.ascontiguousarray(x.T), "mxfp4", axis=-1, stats=want_stats)
    np.testing.assert_array_equal(got.view(np.int32), want.T.view(np.int32))
    assert _stats(got_stats) == _stats(want_stats)


def test_a_counted_or_tensor_scaled_call_down_the_columns_is_unchanged():
    """SR with stats and NVFP4 take the general route: the same values as the transposed
    copy."""
    x = _data((64, 20), seed=2)
    stats = BlockStats()
    got = lpsim.quantize(x, "mxfp4", "stochastic", axis=0, seed=4, stats=stats)
    want = _by_transpose(x, "mxfp4", "stochastic", seed=4)
    np.testing.assert_array_equal(got.view(np.int32), want.values.T.view(np.int32))
    assert stats.elements == x.size
    got = lpsim.quantize(x, "nvfp4", axis=0)
    np.testing.assert_array_equal(got.view(np.int32),
                                  _by_transpose(x, "nvfp4", "nearest").values.T.view(np.int32))
