"""Properties of lpsim.quantize on random formats, drawn with lpsim.testing's own strategies."""

from fractions import Fraction

import numpy as np
from hypothesis import given, strategies as st
from hypothesis.extra.numpy import arrays

import lpsim
from lpsim import reference, testing
from lpsim.rounding import DETERMINISTIC_MODES, STOCHASTIC_MODES

DTYPES = (np.float32, np.float64)
FORMATS = {dtype: testing.formats(max_e=11, max_m=52, dtype=dtype) for dtype in DTYPES}
BITS = {4: np.int32, 8: np.int64}


def values(fmt, dtype):
    """Finite inputs where rounding is interesting, and arbitrary container values."""
    parts = [testing.representable(fmt, dtype=dtype), testing.near_overflow(fmt, dtype=dtype),
             testing.subnormals(fmt, dtype=dtype),
             st.floats(allow_nan=False, allow_infinity=False, width=8 * np.dtype(dtype).itemsize)]
    try:
        parts.append(testing.midpoints(fmt, dtype=dtype))
    except ValueError:   # the container cannot hold this format's midpoints
        pass
    return st.one_of(parts)


@st.composite
def cases(draw, elements=values):
    """(format, finite input array) in a float32 or float64 container."""
    dtype = draw(st.sampled_from(DTYPES))
    fmt = draw(FORMATS[dtype])
    x = draw(arrays(dtype, st.integers(1, 12), elements=elements(fmt, dtype)))
    return fmt, x


def same(a, b):
    """Elementwise: bit-identical, or both NaN."""
    a, b = np.asarray(a), np.asarray(b)
    return (a.view(BITS[a.itemsize]) == b.view(BITS[b.itemsize])) | (np.isnan(a) & np.isnan(b))


@given(cases(elements=lambda fmt, dtype: testing.representable(fmt, dtype=dtype)))
def test_representable_values_round_to_themselves_in_every_mode(case):
    fmt, x = case
    for rounding in DETERMINISTIC_MODES + STOCHASTIC_MODES:
        stats = lpsim.RoundingStats()
        got = lpsim.quantize(x, fmt, rounding, seed=1, stats=stats)
        assert same(got, x).all(), (rounding, x, got)
        assert stats.inexact == stats.overflow == stats.underflow == 0


@given(cases())
def test_every_deterministic_mode_is_monotonic(case):
    fmt, x = case
    x = np.sort(x)
    for rounding in DETERMINISTIC_MODES:
        got = lpsim.quantize(x, fmt, rounding)
        got = got[~np.isnan(got)]               # fn formats overflow to NaN
        assert (got[:-1] <= got[1:]).all(), (rounding, x, got)


@given(cases())
def test_down_and_up_bracket_x(case):
    fmt, x = case
    down, up = lpsim.quantize(x, fmt, "down"), lpsim.quantize(x, fmt, "up")
    # beyond max_finite only ieee without saturation keeps the bracket (with +-inf)
    inside = (np.abs(x) <= fmt.max_finite) | (fmt.specials == "ieee" and not fmt.saturate)
    assert (down[inside] <= x[inside]).all() and (x[inside] <= up[inside]).all()
    exact = (down == up) & inside
    assert (down[exact] == x[exact]).all()


@given(cases())
def test_nearest_error_is_at_most_unit_roundoff_in_the_normal_range(case):
    fmt, x = case
    got = lpsim.quantize(x, fmt, "nearest")
    u = Fraction(fmt.unit_roundoff)
    for xi, qi in zip(x, got):
        if fmt.min_normal <= abs(xi) <= fmt.max_finite:
            assert abs(Fraction(float(qi)) - Fraction(float(xi))) <= u * abs(Fraction(float(xi)))


@given(cases(), st.integers(0, 2 ** 64 - 1), st.sampled_from([None, 1, 3, 8]))
def test_stochastic_picks_one_of_the_two_neighbours(case, seed, sr_bits):
    fmt, x = case
    down, up = lpsim.quantize(x, fmt, "down"), lpsim.quantize(x, fmt, "up")
    for rounding in STOCHASTIC_MODES:      # few-bit SR is a variant of "stochastic" only
        bits = sr_bits if rounding == "stochastic" else None
        got = lpsim.quantize(x, fmt, rounding, seed=seed, sr_bits=bits)
        assert (same(got, down) | same(got, up)).all(), (rounding, x, got, down, up)


@given(cases(), st.integers(0, 2 ** 64 - 1))
def test_rounding_is_symmetric_in_the_sign(case, seed):
    fmt, x = case
    for rounding in ("nearest", "nearest_away", "toward_zero", "odd") + STOCHASTIC_MODES:
        # stochastic decisions are on the magnitude, so the same bits mirror too
        got = lpsim.quantize(x, fmt, rounding, seed=seed)
        mirrored = lpsim.quantize(-x, fmt, rounding, seed=seed)
        assert same(mirrored, -got).all(), rounding
    assert same(lpsim.quantize(-x, fmt, "up"), -lpsim.quantize(x, fmt, "down")).all()


@given(cases(), st.sampled_from(DETERMINISTIC_MODES + STOCHASTIC_MODES))
def test_counters_equal_the_reference_flag_counts(case, rounding):
    fmt, x = case
    stats = lpsim.RoundingStats()
    got = lpsim.quantize(x, fmt, rounding, seed=5, stats=stats)
    want, want_stats = reference.quantize(x, fmt, rounding, seed=5)
    assert same(got, want).all()
    assert stats.as_dict() == want_stats.as_dict()
