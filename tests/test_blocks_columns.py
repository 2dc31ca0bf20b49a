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


def _takes_columns(x, rounding, offset):
    """Whether the call runs down the columns (else the general route): random counters
    need runs that start Philox blocks."""
    return rounding != "stochastic" or (x.shape[0] % 4 == 0 and offset % 4 == 0)


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp4", "nvfp4"])
# nearest and one directed mode (each mode compiles a kernel of its own, ~10 s in CI)
@pytest.mark.parametrize("rounding", ["nearest", "stochastic", "down"])
@pytest.mark.parametrize("shape", [(64, 48), (100, 37), (33, 17), (1, 5), (2, 1), (80, 250)])
@pytest.mark.parametrize("offset", [8, 7])
def test_columns_equal_the_transposed_copys_blocks(fmt, rounding, shape, offset):
    """Rows not a multiple of the block (a shorter last block row) nor of a tile, columns
    not a multiple of a tile, NaN, inf, subnormals and zero blocks, NVFP4's tensor scale,
    stochastic rounding with a stream and an offset (7: a run that does not start a Philox
    block, which keeps the general route)."""
    x = _data(shape)
    kw = dict(seed=3, stream=5, offset=offset)
    got = quantize_blocks(x, fmt, rounding, axis=0, want_elements=False, want_counts=False,
                          **kw)
    want = _by_transpose(x, fmt, rounding, **kw)
    # the columns write C order; the general route returns the transposed copy's transpose
    if min(shape) > 1:
        assert got.values.flags.c_contiguous == _takes_columns(x, rounding, offset)
    np.testing.assert_array_equal(got.values.view(np.int32), want.values.T.view(np.int32))
    np.testing.assert_array_equal(got.scales, want.scales)
    assert got.tensor_scale == want.tensor_scale


@pytest.mark.parametrize("fmt, rounding", [("mxfp8_e4m3", "nearest"),
                                           ("nvfp4", "stochastic")])
def test_columns_of_a_large_array_split_over_threads_equal_one_call(fmt, rounding):
    """An array above SERIAL_BELOW elements runs block rows on lpsim's threads: the same
    bits as the transposed copy's."""
    rows = 512 + 16
    cols = -(-SERIAL_BELOW // rows) + 3
    x = _data((rows, cols), seed=1)
    got = lpsim.quantize(x, fmt, rounding, axis=0, seed=2)
    want = _by_transpose(x, fmt, rounding, seed=2)
    np.testing.assert_array_equal(got.view(np.int32), want.values.T.view(np.int32))


def test_which_calls_take_the_columns():
    """2-D float32 C-contiguous arrays blocked along axis 0, without element values or
    counters per block, random roundings where each column's run of counters starts a
    Philox block; the others keep the general route."""
    from lpsim.blocks.decisions import block_params
    from lpsim.blocks.formats import parse_block_format
    x = np.zeros((64, 8), np.float32)
    bp = block_params(parse_block_format("mxfp8_e4m3"))
    near, sr = MODES["nearest"], MODES["stochastic"]
    assert columns.takes_columns(x, 0, bp, near, False, False)
    assert columns.takes_columns(x, -2, bp, MODES["down"], False, False)
    assert not columns.takes_columns(x, 1, bp, near, False, False)
    assert columns.takes_columns(x, 0, bp, sr, False, False, 64)
    assert not columns.takes_columns(x, 0, bp, sr, False, False, 2)         # counters apart
    assert not columns.takes_columns(x[:62], 0, bp, sr, False, False)
    assert columns.takes_columns(x[:62], 0, bp, near, False, False)
    assert not columns.takes_columns(x.T, 0, bp, near, False, False)   # not C order
    assert not columns.takes_columns(x.astype(np.float64), 0, bp, near, False, False)
    assert not columns.takes_columns(x[None], 0, bp, near, False, False)   # 3-D
    nvfp4 = block_params(parse_block_format("nvfp4"))
    assert columns.takes_columns(x, 0, nvfp4, sr, False, "totals")          # the telemetry
    assert columns.takes_columns(x, 0, bp, near, False, "totals")           # sums
    assert columns.takes_columns(x, 0, bp, MODES["down"], False, "totals")
    assert not columns.takes_columns(x, 0, bp, near, False, True)     # per block
    assert not columns.takes_columns(x, 0, bp, near, True, False)     # element values


def _stats(stats):
    return {f: getattr(stats, f) for f in FIELDS + BlockStats.BLOCK_FIELDS}


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp4", "nvfp4"])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic", "down"])
@pytest.mark.parametrize("shape", [(64, 48), (100, 37), (33, 17), (2, 1), (80, 250),
                                   (64, 1030)])
def test_counted_columns_equal_the_transposed_copys_counts(fmt, rounding, shape):
    """stats (simulated training's telemetry) down the columns: the values and every
    counter of the transposed copy's call (NaN and inf blocks, subnormals, zero blocks,
    elements that overflow or underflow, blocks flushed to 0 by stochastic rounding, a
    strip boundary at 1024 columns)."""
    x = _data(shape, seed=5)
    x[: min(3, shape[0]), 0] *= np.float32(2.0 ** 100)   # an overflow and flushed neighbours
    if shape[1] > 2:
        x[:, 1] = np.float32(1e-45)     # blocks of the least subnormal: clipped, flushed
    got_stats, want_stats = BlockStats(), BlockStats()
    kw = dict(seed=9, stream=2, offset=12)
    got = lpsim.quantize(x, fmt, rounding, axis=0, stats=got_stats, **kw)
    want = lpsim.quantize(np.ascontiguousarray(x.T), fmt, rounding, axis=-1, stats=want_stats,
                          **kw)
    np.testing.assert_array_equal(got.view(np.int32), want.T.view(np.int32))
    assert _stats(got_stats) == _stats(want_stats)
    assert got_stats.elements == x.size


@pytest.mark.parametrize("fmt, rounding", [("mxfp4", "nearest"), ("nvfp4", "stochastic")])
def test_counted_columns_of_a_large_array_split_over_threads_equal_one_call(fmt, rounding):
    """Above SERIAL_BELOW each thread's range returns its sums: their total is the
    transposed copy's, one call's."""
    rows = 512 + 16
    x = _data((rows, -(-SERIAL_BELOW // rows) + 3), seed=6)
    got_stats, want_stats = BlockStats(), BlockStats()
    got = lpsim.quantize(x, fmt, rounding, axis=0, stats=got_stats, seed=1)
    want = lpsim.quantize(np.ascontiguousarray(x.T), fmt, rounding, axis=-1,
                          stats=want_stats, seed=1)
    np.testing.assert_array_equal(got.view(np.int32), want.T.view(np.int32))
    assert _stats(got_stats) == _stats(want_stats)
