"""lpsim.testing: the strategies generate what they promise; assert_rounded catches wrong kernels."""

import bisect
import functools
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import find, given, strategies as st
from hypothesis.errors import NoSuchExample
from hypothesis.extra.numpy import arrays

import lpsim
from lpsim import reference, testing
from lpsim.philox import WORD_BITS, random_words

SMALL = [lpsim.fp(4, 3), lpsim.fp(4, 3, specials="fn"), lpsim.fp(5, 2, subnormals=False),
         lpsim.fp(3, 1, 2, specials="saturate"), lpsim.fp(2, 0, specials="fn")]


def exact(v) -> Fraction:
    return Fraction(float(v))


@st.composite
def small_case(draw, strategy, dtype=np.float32):
    fmt = draw(st.sampled_from(SMALL))
    return fmt, draw(arrays(dtype, st.integers(1, 8), elements=strategy(fmt, dtype=dtype)))


@given(st.data())
def test_formats_respect_every_option(data):
    dtype = data.draw(st.sampled_from([np.float32, np.float64]))
    max_e, max_m = data.draw(st.integers(2, 11)), data.draw(st.integers(0, 52))
    policy = data.draw(st.sampled_from(["ieee", "saturate", "fn"]))
    subnormals = data.draw(st.sampled_from([None, True, False]))
    try:
        strategy = testing.formats(max_e=max_e, max_m=max_m, max_bias=3, specials=policy,
                                   subnormals=subnormals, dtype=dtype)
    except ValueError as error:                   # nothing fits: say so, only then
        assert "fits" in str(error)
        return
    fmt = data.draw(strategy)
    assert fmt.e <= max_e and fmt.m <= max_m and abs(fmt.b) <= 3 and fmt.specials == policy
    assert subnormals is None or fmt.subnormals == subnormals
    assert fmt.fits(dtype)[0]


@given(st.data())
def test_formats_cover_the_whole_space_a_user_can_name(data):
    """max_bias=None: every bias the container holds; every policy and saturate flag."""
    dtype = data.draw(st.sampled_from([np.float32, np.float64]))
    fmt = data.draw(testing.formats(max_e=11, max_m=52, max_bias=None,
                                    specials=lpsim.formats.POLICIES, saturate=None, dtype=dtype))
    assert fmt.fits(dtype)[0]


def test_formats_reach_the_edges_of_the_whole_space():
    whole = functools.partial(testing.formats, max_e=11, max_m=52, max_bias=None,
                              specials=lpsim.formats.POLICIES, saturate=None)
    for dtype, cm in ((np.float32, 23), (np.float64, 52)):
        strategy = whole(dtype=dtype)
        assert find(strategy, lambda f: f.m == cm and f.saturate).m == cm
        for policy in lpsim.formats.POLICIES:
            assert find(strategy, lambda f, p=policy: f.specials == p)
        assert find(strategy, lambda f: f.b > 100) and find(strategy, lambda f: f.b < -100)
    # float64: biases out to the ends of bias_range (e = 2, m = 0: -1021 <= b <= 1074)
    assert find(whole(dtype=np.float64), lambda f: f.b > 1000)
    with pytest.raises(ValueError, match="saturate='yes'"):
        testing.formats(saturate="yes")


def test_formats_reach_both_ends_and_reject_bad_options():
    strategy = testing.formats(max_e=5, max_m=10, specials=("ieee", "fn"), dtype=np.float32)
    assert find(strategy, lambda f: f.e == 5 and f.m == 10 and f.specials == "fn")
    assert find(strategy, lambda f: not f.subnormals and f.b < 0)
    assert find(strategy, lambda f: True) == lpsim.fp(2, 0)      # shrinks to the smallest
    with pytest.raises(ValueError, match="max_e=0"):
        testing.formats(max_e=0)
    with pytest.raises(ValueError, match="'ieee754'.*accepted: ieee, saturate, fn"):
        testing.formats(specials="ieee754")
    with pytest.raises(ValueError, match="int32 is not a container"):
        testing.formats(dtype=np.int32)
    with pytest.raises(ValueError, match="no format .* fits a float32"):
        testing.formats(max_e=1, specials="ieee")   # e = 1 leaves ieee no normal numbers
    # 0 == False let these through, and every draw then failed inside fp()
    for kwargs, words in ((dict(saturate=0), "saturate=0"), (dict(subnormals=1), "subnormals=1"),
                          (dict(specials=None), "specials=None is not a policy"),
                          (dict(specials=["ieee", 5]), r"specials=\['ieee', 5\]")):
        with pytest.raises(ValueError, match=words):
            testing.formats(**kwargs)


@given(small_case(testing.representable, np.float64))
def test_representable_values_are_values_of_the_format(case):
    fmt, x = case
    values = set(reference.enumerate_values(fmt))
    for v in x:
        assert abs(exact(v)) in values
        rounded = reference.round_exact(v, fmt)
        assert rounded.value == exact(v) and "inexact" not in rounded.flags


def test_representable_covers_signed_zero_extremes_and_allowed_specials():
    fmt = lpsim.fp(4, 3, specials="fn")
    strategy = testing.representable(fmt, allow_nan=True, allow_infinity=True)
    assert np.signbit(find(strategy, lambda v: v == 0 and np.signbit(v)))
    assert find(strategy, lambda v: v == -448) == -448
    assert find(strategy, lambda v: v == fmt.min_subnormal) == fmt.min_subnormal
    assert np.isnan(find(strategy, np.isnan))
    with pytest.raises(NoSuchExample):
        find(strategy, np.isinf)                   # fn has no inf
    assert np.isinf(find(testing.representable("e5m2", allow_infinity=True), np.isinf))


@given(small_case(testing.midpoints))
def test_midpoints_are_exactly_halfway(case):
    fmt, x = case
    for v in x:
        lo = reference.round_exact(v, fmt, "toward_zero").value
        hi = reference.round_exact(v, fmt, "nearest_away").value
        assert lo != hi and exact(v) - lo == hi - exact(v)


def test_midpoints_refuse_a_container_that_cannot_hold_them():
    with pytest.raises(ValueError, match=r"midpoints of fp32 do not fit a float32"):
        testing.midpoints("fp32", dtype=np.float32)
    with pytest.raises(ValueError, match="does not fit a float32"):
        testing.representable("fp64", dtype=np.float32)
    assert find(testing.midpoints("fp32", dtype=np.float64), lambda v: 0 < v < 2.0 ** -126)


@given(small_case(testing.near_overflow))
def test_near_overflow_stays_within_a_few_quanta_of_max_finite(case):
    fmt, x = case
    quantum = math.ldexp(1, fmt.emax - fmt.m)
    assert np.isfinite(x).all()
    assert (np.abs(np.abs(x.astype(np.float64)) - fmt.max_finite) <= 2.001 * quantum).all()


NEAR_OVERFLOW = ["e8m0fnu", "e4m3", "e4m3fn", "e2m1fn", "e5m2fnuz", "bf16", lpsim.fp(3, 0, 0),
                 lpsim.fp(2, 0, specials="fn"), lpsim.fp(3, 1, 0, specials="fnu")]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: d.__name__)
@pytest.mark.parametrize("fmt", NEAR_OVERFLOW, ids=str)
@given(data=st.data())
def test_near_overflow_draws_only_near_max_finite_with_the_signs_of_the_format(fmt, dtype, data):
    """Between the predecessor of max_finite and two quanta above it (each widened by two
    container ulps), never zero, and positive only in an unsigned format (e8m0fnu)."""
    fmt = lpsim.parse_format(fmt)
    x = data.draw(testing.near_overflow(fmt, dtype=dtype))
    values = reference.enumerate_values(fmt)
    low = np.nextafter(np.nextafter(dtype(values[-2]), dtype(0)), dtype(0))
    with np.errstate(over="ignore"):
        high = min(np.nextafter(np.nextafter(dtype(fmt.max_finite + 2.0 ** (fmt.emax - fmt.m + 1)),
                                             dtype(np.inf)), dtype(np.inf)), np.finfo(dtype).max)
    assert type(x) is dtype and np.isfinite(x) and x != 0
    assert fmt.signed or x > 0, x
    assert low <= abs(x) <= high, (x, low, high)


def test_near_overflow_reaches_the_tie_above_max_finite_and_beyond():
    fmt = lpsim.parse_format("e4m3")                # max 240, would-be next 256
    strategy = testing.near_overflow(fmt, dtype=np.float32)
    assert find(strategy, lambda v: v == 248)
    assert find(strategy, lambda v: v == -np.nextafter(np.float32(248), np.float32(300)))
    assert find(strategy, lambda v: v > 256)
    top = testing.near_overflow("fp32", dtype=np.float32)
    assert find(top, lambda v: v == np.finfo(np.float32).max)


@given(small_case(testing.subnormals))
def test_subnormals_are_nonzero_and_below_min_normal(case):
    fmt, x = case
    assert ((x != 0) & (np.abs(x) < fmt.min_normal)).all()


def test_subnormals_include_the_grid_and_values_off_it():
    fmt = lpsim.parse_format("e4m3")
    strategy = testing.subnormals(fmt, dtype=np.float32)
    assert find(strategy, lambda v: v == -3 * fmt.min_subnormal)
    assert find(strategy, lambda v: v == 2.5 * fmt.min_subnormal)
    assert find(strategy, lambda v: v * 1024 % 1 != 0)         # off the quarter-quantum grid


# --- assert_rounded ----------------------------------------------------------------------

X = np.array([1.0625, -1.0625, 1.1875, 3.3, -1e-9, 1e-9, 0.0, -0.0, 250.0, np.nan, np.inf],
             np.float32)


def test_assert_rounded_accepts_lpsim_in_every_mode():
    for rounding in lpsim.rounding.DETERMINISTIC_MODES:
        testing.assert_rounded(lpsim.quantize(X, "e4m3", rounding), X, "e4m3", rounding)
    testing.assert_rounded(lpsim.quantize(X, "e4m3fn"), X, "e4m3fn")


def test_assert_rounded_checks_stochastic_kernels_against_lpsim_bits():
    # a kernel that draws lpsim's Philox words (same seed, stream, offset) passes; another
    # seed's bits round some of the 301 inexact values the other way
    x = np.linspace(-3, 3, 301)
    mine = lpsim.quantize(x, "e4m3", "stochastic", seed=5, stream=2, offset=7)
    testing.assert_rounded(mine, x, "e4m3", "stochastic", seed=5, stream=2, offset=7)
    other = lpsim.quantize(x, "e4m3", "stochastic", seed=6, stream=2, offset=7)
    with pytest.raises(AssertionError, match="differ from the exact 'stochastic' rounding"):
        testing.assert_rounded(other, x, "e4m3", "stochastic", seed=5, stream=2, offset=7)


def test_assert_rounded_catches_truncation_passed_off_as_nearest():
    truncated = lpsim.quantize(X, "e4m3", "toward_zero")
    with pytest.raises(AssertionError) as info:
        testing.assert_rounded(truncated, X, "e4m3", "nearest")
    message = str(info.value)
    assert "2 of 11 elements differ" in message and "'nearest' rounding to e4m3" in message
    assert "at (2,): x=1.1875 (0x1.3000000000000p+0) expected=1.25 (0x1.4000000000000p+0) " \
           "actual=1.125 (0x1.2000000000000p+0)" in message


def test_assert_rounded_checks_the_sign_of_zero_and_matches_nan():
    wrong = np.abs(lpsim.quantize(X, "e4m3"))       # -1e-9 rounds to -0.0, not +0.0
    wrong[[1, 7, 8, 9]] = lpsim.quantize(X, "e4m3")[[1, 7, 8, 9]]
    with pytest.raises(AssertionError, match=r"1 of 11 .*\n  at \(4,\): x=-1e-09 .* "
                                             r"expected=-0.0 \(-0x0.0p\+0\) actual=0.0"):
        testing.assert_rounded(wrong, X, "e4m3")
    testing.assert_rounded(np.float64(np.nan), np.float64(np.nan), "e4m3")   # 0-d works
    with pytest.raises(AssertionError, match="shape"):
        testing.assert_rounded(X[:3], X, "e4m3")


def test_assert_rounded_takes_the_uniforms_of_stochastic_rounding():
    x = np.linspace(-3, 3, 41, dtype=np.float32)
    got = lpsim.quantize(x, "e4m3", "stochastic", seed=9, sr_bits=4)
    words = random_words(x.size, 4, 9)
    uniforms = [Fraction(r, 2 ** WORD_BITS[4]) for r in words]
    testing.assert_rounded(got, x, "e4m3", "stochastic", uniforms=uniforms, sr_bits=4)
    flipped = [1 - u - Fraction(1, 2 ** 32) for u in uniforms]
    with pytest.raises(AssertionError, match="differ"):
        testing.assert_rounded(got, x, "e4m3", "stochastic", uniforms=flipped, sr_bits=4)
    with pytest.raises(ValueError, match="needs exactly one of seed"):
        testing.assert_rounded(got, x, "e4m3", "stochastic")


def test_assert_rounded_reads_big_ints_exactly_and_shows_them():
    """2**60 + 1 is not a float64: the check rounds the int itself, as lpsim.quantize does."""
    x = [0.1, 2 ** 60 + 1]
    y = lpsim.quantize(x, "fp32", "up")
    testing.assert_rounded(y, x, "fp32", "up")
    testing.assert_rounded(lpsim.quantize([[2 ** 70 + 1]], "fp32", "up"), [[2 ** 70 + 1]],
                           "fp32", "up")
    testing.assert_rounded(lpsim.quantize(2 ** 70 + 1, "fp32", "up"), 2 ** 70 + 1, "fp32", "up")
    wrong = y.copy()
    wrong[1] = 2.0 ** 60                            # the rounding of float64(x[1])
    with pytest.raises(AssertionError, match=r"at \(1,\): x=1152921504606846977 expected="):
        testing.assert_rounded(wrong, x, "fp32", "up")


@pytest.mark.parametrize("actual", [np.array([0.10009765625 + 1j]), np.array(["0.10009765625"]),
                                    np.array([0.10009765625], dtype=object), [0.1 + 0j]],
                         ids=["complex", "str", "object", "complex list"])
def test_assert_rounded_refuses_results_that_are_not_real_numbers(actual):
    with pytest.raises(TypeError, match=r"actual has dtype \S+; accepted: real floating-point"):
        testing.assert_rounded(actual, np.array([0.1]), "bf16")


def _inputs_of_every_dtype():
    import ml_dtypes
    values = [0.1, -3.3, 250.0, 1e-3, 0.0]
    yield "float16", np.array(values, np.float16)
    yield "bfloat16", np.array(values, ml_dtypes.bfloat16)
    yield "big-endian", np.array(values, ">f4")
    yield "big-endian f8", np.array(values, ">f8")
    yield "int32", np.array([1, -17, 300, 0], np.int32)
    yield "long double", np.longdouble(1) + np.longdouble(2) ** -60


@pytest.mark.parametrize("x", [pytest.param(x, id=name) for name, x in _inputs_of_every_dtype()])
def test_assert_rounded_reads_the_input_dtypes_lpsim_quantize_takes(x):
    y = lpsim.quantize(x, "e4m3fn", "up")
    testing.assert_rounded(y, x, "e4m3fn", "up")
    with pytest.raises(AssertionError, match="differ"):
        testing.assert_rounded(lpsim.quantize(x, "e4m3fn", "down"), x, "e4m3fn", "up")


def test_assert_rounded_reads_torch_bfloat16_and_numpy_uniforms():
    torch = pytest.importorskip("torch")
    x = torch.tensor([0.1, -3.3, 250.0], dtype=torch.bfloat16)
    testing.assert_rounded(lpsim.quantize(x, "e4m3fn"), x, "e4m3fn")
    x = np.array([0.1, -0.3])
    away = np.array([lpsim.quantize(0.1, "bf16", "up"), lpsim.quantize(-0.3, "bf16", "down")])
    testing.assert_rounded(away, x, "bf16", "stochastic", uniforms=np.float32([0.0, 0.0]))
    testing.assert_rounded(away, x, "bf16", "stochastic", uniforms=[np.float16(0), np.float32(0)])
    with pytest.raises(AssertionError, match="differ"):     # u above both fracs: toward zero
        testing.assert_rounded(away, x, "bf16", "stochastic", uniforms=np.float32([.875, .875]))


# --- values of every kind of format: unsigned, no zero, unsigned zero, saturating ---------

KINDS = ["e8m0fnu", "e4m3fnuz", "e5m2fnuz", "e2m1fn", "e4m3fn", "bf16", lpsim.fp(3, 0, 0),
         lpsim.fp(4, 3, 0, saturate=True), lpsim.fp(3, 1, 0, specials="fnu"),
         lpsim.fp(4, 2, 0, subnormals=False, specials="fnu")]


@functools.lru_cache(maxsize=None)
def _finite_values(fmt) -> list[Fraction]:
    """Every finite value of ``fmt``, ascending, negatives included where it has them."""
    fmt = lpsim.parse_format(fmt)
    values = reference.enumerate_values(fmt)
    return sorted(set(values) | {-v for v in values}) if fmt.signed else values


@pytest.mark.parametrize("fmt", KINDS, ids=str)
@given(data=st.data())
def test_representable_values_round_to_themselves_in_every_mode(fmt, data):
    """Negatives of an unsigned format, zero where there is none, or -0 of an unsigned zero
    are not values: quantize maps them to NaN, or -0 to +0."""
    x = data.draw(arrays(np.float64, st.integers(1, 32), elements=testing.representable(fmt)))
    for mode in lpsim.rounding.MODES:
        y = lpsim.quantize(x, fmt, mode, seed=0)
        assert np.array_equal(y.view(np.int64), x.view(np.int64)), (mode, x, y)


@pytest.mark.parametrize("fmt", KINDS, ids=str)
@given(data=st.data())
def test_midpoints_lie_strictly_between_adjacent_values(fmt, data):
    values = _finite_values(fmt)
    x = data.draw(arrays(np.float64, st.integers(1, 32), elements=testing.midpoints(fmt)))
    for v in x:
        i = bisect.bisect_left(values, exact(v))
        assert 0 < i < len(values), (v, "outside the format's values")
        lo, hi = values[i - 1], values[i]
        assert lo < exact(v) < hi and exact(v) == (lo + hi) / 2, (v, lo, hi)


def test_midpoints_refuse_a_format_with_one_value():
    with pytest.raises(ValueError, match="fewer than two finite values"):
        testing.midpoints(lpsim.fp(1, 0, 0, specials="fnu"))
