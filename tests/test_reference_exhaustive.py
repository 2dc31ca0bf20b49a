"""lpsim.quantize against the exact reference on every code point and midpoint of small formats.

For each format (fp(3,2), e4m3, e5m2, fp(4,3,4), and fp(2,1), fp(3,0) for the m <= 1 edge
cases, under every special-value policy, subnormals on and off) the inputs are: every value of both signs and +-0, every midpoint between
adjacent values, one container ulp each side of each midpoint, values just above max_finite,
inf and NaN.  Results must be bit-identical (sign of zero and NaN included) and the counters
equal the reference's flag counts.  Reference results are cached: each one is computed once.
"""

import bisect
import dataclasses
import functools
from fractions import Fraction

import numpy as np
import pytest

import lpsim
from lpsim import reference
from lpsim.rounding import DETERMINISTIC_MODES

FAMILIES = [(3, 2, 0), (4, 3, 0), (5, 2, 0), (4, 3, 4), (2, 1, 0), (3, 0, 0)]
FORMATS = [lpsim.fp(e, m, b, specials=specials, subnormals=subnormals)
           for e, m, b in FAMILIES for specials in ("ieee", "saturate", "fn")
           for subnormals in (True, False)] + [lpsim.fp(4, 3, specials="fn", saturate=True)]
DTYPES = [np.float32, np.float64]
BITS = {4: np.int32, 8: np.int64}


def _nudges(values, dtype):
    """Each value and its container neighbours one ulp below and above."""
    values = np.asarray(values, dtype)
    with np.errstate(over="ignore"):
        return np.concatenate([values, np.nextafter(values, dtype(-np.inf)),
                               np.nextafter(values, dtype(np.inf))])


@functools.cache
def inputs(fmt, dtype, finite=True):
    """Both signs of: values, midpoints and their ulp neighbours, beyond max_finite; +-0, NaN."""
    values = reference.enumerate_values(fmt)
    mids = [(lo + hi) / 2 for lo, hi in zip(values, values[1:])]
    top = values[-1]
    quantum = top - values[-2]
    beyond = [top + quantum * k / 4 for k in (1, 2, 3, 4, 6, 8)] + [2 * top, 64 * top]
    magnitudes = np.concatenate([
        np.array([float(v) for v in values[1:]], dtype),
        _nudges([float(v) for v in mids + beyond], dtype),
        _nudges([float(values[1]) / 4], dtype),                  # far below the smallest
        [np.finfo(dtype).smallest_subnormal, np.finfo(dtype).max]])
    magnitudes = magnitudes[magnitudes > 0]
    specials = [0.0, np.nan] if finite else [np.inf]
    x = np.concatenate([magnitudes, -magnitudes, np.array(specials, dtype),
                        -np.array(specials, dtype)]).astype(dtype)
    x.setflags(write=False)
    return x


@functools.cache
def expected(fmt, rounding, dtype, finite=True):
    """The reference's results and counters for inputs(fmt, dtype, finite), computed once."""
    return reference.quantize(inputs(fmt, dtype, finite), fmt, rounding)


def assert_same_bits(got, want, x, what):
    """Bit-for-bit equality, listing the first mismatches in hex."""
    g, w = got.view(BITS[got.itemsize]), want.view(BITS[want.itemsize])
    bad = np.flatnonzero(g != w)
    lines = [f"x={float(x[i]).hex()} expected={float(want[i]).hex()} "
             f"actual={float(got[i]).hex()}" for i in bad[:5]]
    assert bad.size == 0, f"{what}: {bad.size} of {x.size} differ:\n" + "\n".join(lines)


def run_case(fmt, rounding, dtype, finite):
    x = inputs(fmt, dtype, finite)
    want, want_stats = expected(fmt, rounding, dtype, finite)
    stats = lpsim.RoundingStats()
    got = lpsim.quantize(x.copy(), fmt, rounding, stats=stats)   # x is the cache's, read-only
    assert_same_bits(got, want, x, f"{fmt} {rounding} {dtype.__name__}")
    assert stats.as_dict() == want_stats.as_dict()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.__name__)
@pytest.mark.parametrize("rounding", DETERMINISTIC_MODES)
@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_every_code_point_and_midpoint_matches_the_reference(fmt, rounding, dtype):
    run_case(fmt, rounding, dtype, finite=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.__name__)
@pytest.mark.parametrize("fmt", [
    lpsim.fp(4, 3), lpsim.fp(4, 3, specials="saturate"), lpsim.fp(4, 3, specials="fn"),
    lpsim.fp(4, 3, specials="fn", saturate=True)], ids=str)
def test_infinite_inputs_follow_the_policy(fmt, dtype):
    for rounding in DETERMINISTIC_MODES:
        run_case(fmt, rounding, dtype, finite=False)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.__name__)
def test_nan_inputs_come_back_unchanged_with_their_payload(dtype):
    bits = BITS[np.dtype(dtype).itemsize]
    x = np.array([np.nan, -np.nan, np.nan], dtype)
    raw = x.view(bits)
    raw[2] |= 5                                  # a payload
    for fmt in ("e4m3", "e4m3fn", lpsim.fp(4, 3, specials="saturate")):
        got = lpsim.quantize(x, fmt, "nearest")
        assert np.array_equal(got.view(bits), raw)
        assert np.array_equal(reference.quantize(x, fmt)[0].view(bits), raw)


# --- the reference itself, against neighbours taken from the encoding ---------------------

@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_reference_picks_the_neighbours_the_encoding_gives(fmt):
    nonneg = reference.enumerate_values(fmt)
    grid = [-v for v in reversed(nonneg[1:])] + nonneg
    # with subnormals on, index = exponent code * 2**m + stored mantissa: its last bit is the
    # encoding's (the exponent code's when m == 0)
    full = reference.enumerate_values(dataclasses.replace(fmt, subnormals=True))
    even = {v for i, v in enumerate(full) if i % 2 == 0}
    for xf in inputs(fmt, np.float64):
        if not np.isfinite(xf) or abs(Fraction(float(xf))) > nonneg[-1]:
            continue
        x = Fraction(float(xf))
        lo = grid[bisect.bisect_right(grid, x) - 1]
        hi = grid[bisect.bisect_left(grid, x)]
        got = {r: reference.round_exact(xf, fmt, r).value for r in DETERMINISTIC_MODES}
        assert got["down"] == lo and got["up"] == hi
        assert got["toward_zero"] == (lo if x >= 0 else hi)
        if lo == hi:
            assert all(v == x for v in got.values())
            continue
        closer = lo if x - lo < hi - x else hi if x - lo > hi - x else None
        away = hi if x > 0 else lo
        assert got["nearest_away"] == (closer if closer is not None else away)
        assert got["nearest"] == closer if closer is not None else abs(got["nearest"]) in even
        if fmt.subnormals or abs(x) > fmt.min_normal:   # flushing can leave no odd neighbour
            assert abs(got["odd"]) not in even, (fmt, x)


def test_enumerate_values_counts_and_extremes():
    assert len(reference.enumerate_values("e4m3")) == 1 + 7 + 14 * 8
    assert len(reference.enumerate_values("e4m3fn")) == 1 + 7 + 15 * 8 - 1
    assert len(reference.enumerate_values(lpsim.fp(3, 2, subnormals=False))) == 1 + 6 * 4
    for fmt in FORMATS:
        values = reference.enumerate_values(fmt)
        assert values == sorted(set(values))
        assert values[-1] == Fraction(fmt.max_finite) == reference.max_finite(fmt)
        assert values[1] == Fraction(fmt.min_subnormal)
    assert reference.enumerate_values("e4m3fn")[-1] == 448
    with pytest.raises(ValueError, match="at most"):
        reference.enumerate_values("fp32")


# --- stochastic modes: the same Philox bits give the same decisions ----------------------

def mixed_values(fmt, dtype, n=300):
    """Random values over the whole range, subnormals, near overflow, exact values, +-0, NaN.

    (inf inputs are covered by test_infinite_inputs_follow_the_policy.)
    """
    rng = np.random.default_rng(17)
    f = lpsim.parse_format(fmt)
    parts = [
        rng.choice([-1, 1], n // 3) * np.exp2(rng.uniform(np.log2(f.min_subnormal) - 2,
                                                           np.log2(f.max_finite) + 1, n // 3)),
        rng.uniform(-f.min_normal, f.min_normal, n // 6),
        rng.uniform(-1.2, 1.2, n // 6) * f.max_finite,
        lpsim.quantize(rng.standard_normal(n // 6), f, "nearest"),
        [0.0, -0.0, np.nan, f.max_finite, -f.min_subnormal]]
    largest = np.finfo(dtype).max
    return np.clip(np.concatenate(parts), -largest, largest).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.__name__)
@pytest.mark.parametrize("fmt", ["e4m3", "e4m3fn", "bf16", "fp(5,2,0)", "fp16"])
@pytest.mark.parametrize("rounding, sr_bits", [
    ("stochastic", None), ("stochastic", 3), ("stochastic", 8), ("stochastic_equal", None)])
def test_stochastic_matches_the_reference_bit_for_bit(fmt, rounding, sr_bits, dtype):
    x = mixed_values(fmt, dtype)
    seed, stream, offset = 0x1234_5678_9ABC, 7, 5
    stats = lpsim.RoundingStats()
    got = lpsim.quantize(x, fmt, rounding, seed=seed, stream=stream, offset=offset,
                         sr_bits=sr_bits, stats=stats)
    want, want_stats = reference.quantize(x, fmt, rounding, seed=seed, stream=stream,
                                          offset=offset, sr_bits=sr_bits)
    assert_same_bits(got, want, x, f"{fmt} {rounding} sr_bits={sr_bits} {dtype.__name__}")
    assert stats.as_dict() == want_stats.as_dict()
    other = lpsim.quantize(x, fmt, rounding, seed=seed + 1, stream=stream, offset=offset,
                           sr_bits=sr_bits)
    assert not np.array_equal(got, other)        # the seed matters, so the check can fail


def test_stochastic_with_all_word_bits_is_exact_stochastic_rounding():
    x = mixed_values("bf16", np.float32)
    exact, _ = reference.quantize(x, "bf16", "stochastic", seed=3)
    assert np.array_equal(reference.quantize(x, "bf16", "stochastic", seed=3, sr_bits=32)[0],
                          exact, equal_nan=True)
    assert np.array_equal(lpsim.quantize(x, "bf16", "stochastic", seed=3, sr_bits=32), exact,
                          equal_nan=True)


def test_reference_rejects_bad_input_naming_it():
    with pytest.raises(ValueError, match="unknown rounding 'nearest_even'"):
        reference.round_exact(1.0, "e4m3", "nearest_even")
    with pytest.raises(ValueError, match="needs uniform"):
        reference.round_exact(1.0, "e4m3", "stochastic")
    with pytest.raises(ValueError, match="uniform=1.*0 <= u < 1"):
        reference.round_exact(1.0, "e4m3", "stochastic", uniform=1)
    with pytest.raises(ValueError, match="sr_bits=3 with rounding='nearest'"):
        reference.round_exact(1.0, "e4m3", "nearest", sr_bits=3)
    with pytest.raises(TypeError, match="cannot round a str"):
        reference.round_exact("1.0", "e4m3")
    with pytest.raises(TypeError, match="dtype complex128"):
        reference.quantize(np.arange(3) * 1j, "e4m3")
    with pytest.raises(ValueError, match="does not fit a float32"):
        reference.quantize(np.ones(3, np.float32), "fp64")
    with pytest.raises(ValueError, match="exactly one of seed"):
        reference.quantize(np.ones(3), "e4m3", "stochastic", seed=1, uniforms=[0, 0, 0])
    with pytest.raises(ValueError, match="uniforms has 2 elements"):
        reference.quantize(np.ones(3), "e4m3", "stochastic", uniforms=[0, 0])


def test_reference_quantize_reads_the_inputs_lpsim_quantize_takes():
    """Converted exactly as lpsim.quantize converts them: the same values, dtype and stats."""
    import ml_dtypes
    values = [0.1, -3.3, 250.0, 1e-3, 0.0, 1e9]
    for x in [np.array(values, np.float16), np.array(values, ml_dtypes.bfloat16),
              np.array(values, ">f4"), np.array([1, -17, 300, 2 ** 40], np.int64),
              [0.1, 2 ** 60 + 1, -(2 ** 80) - 1], 2 ** 70 + 1]:
        stats = lpsim.RoundingStats()
        want = lpsim.quantize(x, "e5m2", "up", stats=stats)
        got, got_stats = reference.quantize(x, "e5m2", "up")
        assert np.asarray(want).dtype == got.dtype and np.array_equal(want, got), (x, got)
        assert got_stats == stats, x


def test_round_exact_takes_numpy_uniforms_exactly_and_names_bad_ones():
    expected = reference.round_exact(0.1, "bf16", "stochastic", uniform=Fraction(1, 4))
    for u in [np.float16(0.25), np.float32(0.25), np.float64(0.25), np.longdouble(0.25),
              0.25, Fraction(1, 4)]:
        assert reference.round_exact(0.1, "bf16", "stochastic", uniform=u) == expected, u
    assert reference.round_exact(0.1, "bf16", "stochastic", uniform=np.int64(0)).value > 0.1
    for u, error, words in [(np.float32(np.nan), ValueError, "uniform=.*nan.* not finite"),
                            (np.inf, ValueError, "uniform=inf is not finite"),
                            (np.float32(1.0), ValueError, "uniform=.*1.0.* out of range"),
                            (-0.5, ValueError, "uniform=-0.5 is out of range"),
                            ("0.25", TypeError, "uniform='0.25' is a str; accepted"),
                            (True, TypeError, "uniform=True is a bool")]:
        with pytest.raises(error, match=words):
            reference.round_exact(0.1, "bf16", "stochastic", uniform=u)
    x = np.array([0.1, 0.1])
    got, _ = reference.quantize(x, "bf16", "stochastic", uniforms=np.float32([0.25, 0.25]))
    assert got[0] == got[1] == float(expected.value)
    with pytest.raises(ValueError, match=r"uniforms\[1\]=.*2.0.* out of range"):
        reference.quantize(x, "bf16", "stochastic", uniforms=[np.float32(0), np.float32(2)])


def test_round_exact_on_exact_rationals_and_signed_zero():
    assert reference.round_exact(Fraction(1, 3), "e4m3") == (Fraction(11, 32), {"inexact"})
    assert reference.round_exact(Fraction(-17, 16), "e4m3") == (-1, {"inexact"})   # tie: even
    assert reference.round_exact(10 ** 400, "e5m2", "toward_zero") == (57344,
                                                                      {"overflow", "inexact"})
    zero = reference.round_exact(-Fraction(1, 10 ** 30), "e4m3").value
    assert zero == 0 and np.signbit(zero)
    assert np.signbit(reference.round_exact(-0.0, "e4m3").value)
