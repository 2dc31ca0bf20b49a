"""Round-to-nearest agrees with ml_dtypes' and numpy's casts, bit for bit.

Inputs: 2**20 random finite float32 bit patterns, plus each format's edge cases (every code
point, midpoints, one float32 ulp either side of each midpoint, values around max_finite).
"""

import ml_dtypes
import numpy as np
import pytest

import lpsim

PEERS = {
    "bf16": ml_dtypes.bfloat16,
    "fp16": np.float16,
    "e5m2": ml_dtypes.float8_e5m2,
    "e4m3fn": ml_dtypes.float8_e4m3fn,
    "e4m3": ml_dtypes.float8_e4m3,
}


def edge_values(dtype):
    """Every code point of a <=16-bit dtype, the midpoints and their float32 neighbours."""
    width = np.dtype(dtype).itemsize * 8
    codes = np.arange(2 ** width, dtype=np.uint16 if width == 16 else np.uint8).view(dtype)
    values = np.unique(codes.astype(np.float32)[np.isfinite(codes.astype(np.float32))])
    mids = ((values[:-1].astype(np.float64) + values[1:]) / 2).astype(np.float32)
    top = np.float32(values[-1])
    with np.errstate(over="ignore"):
        around_top = np.array([top * 1.0625, top * 1.125, top * 1.5, top * 2, 3e38, np.inf, -np.inf,
                           np.nan], np.float32)
    edges = np.concatenate([values, mids, np.nextafter(mids, np.float32(np.inf)),
                            np.nextafter(mids, np.float32(-np.inf)), around_top, -around_top])
    return edges


def random_finite(n=1 << 20):
    bits = np.random.default_rng(0).integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    return x[np.isfinite(x)]


@pytest.mark.parametrize("name", list(PEERS))
def test_nearest_equals_the_peer_cast(name):
    dtype = PEERS[name]
    x = np.concatenate([random_finite(), edge_values(dtype)])
    with np.errstate(over="ignore", invalid="ignore"):
        expected = x.astype(dtype).astype(np.float32)
    got = lpsim.quantize(x, name)
    same = (got.view(np.uint32) == expected.view(np.uint32)) | (np.isnan(got) & np.isnan(expected))
    bad = np.flatnonzero(~same)
    assert bad.size == 0, list(zip(x[bad[:5]], got[bad[:5]], expected[bad[:5]]))


def test_float64_container_agrees_with_ml_dtypes_from_float64():
    x = np.random.default_rng(1).standard_normal(1 << 16) * 10.0 ** np.random.default_rng(2).integers(-8, 8, 1 << 16)
    got = lpsim.quantize(x, "bf16")
    assert np.array_equal(got, x.astype(ml_dtypes.bfloat16).astype(np.float64))
