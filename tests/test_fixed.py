"""lpsim.fixed(wl, fl): exact against the Fraction grid, saturation, SR unbiased, counters."""

from fractions import Fraction

import numpy as np
import pytest

import lpsim


def _nearest_even_grid(x, fmt):
    """Exact RNE to multiples of 2**-fl, then saturation (Fractions)."""
    q = Fraction(1, 2 ** fmt.fl) if fmt.fl >= 0 else Fraction(2 ** -fmt.fl)
    v = Fraction(float(x)) / q
    k = int(v // 1)
    frac = v - k
    if frac > Fraction(1, 2) or (frac == Fraction(1, 2) and k % 2):
        k += 1
    lo = -(2 ** (fmt.wl - 1)) + (1 if fmt.symmetric else 0)
    k = min(max(k, lo), 2 ** (fmt.wl - 1) - 1)
    return float(k * q)


@pytest.mark.parametrize("wl, fl, sym", [(8, 4, False), (4, 0, False), (12, 10, True),
                                         (24, 20, False), (6, -2, False), (1, 3, False)])
def test_nearest_is_exact_on_the_grid(wl, fl, sym):
    fmt = lpsim.fixed(wl, fl, symmetric=sym)
    rng = np.random.default_rng(wl * 100 + fl)
    span = 2.0 ** (wl - 1 - fl)
    grid = (np.arange(-(2 ** min(wl, 10)), 2 ** min(wl, 10)) * 0.5 * fmt.quantum)  # midpoints
    x = np.concatenate([rng.uniform(-1.5 * span, 1.5 * span, 3000), grid, [0.0, -0.0]])
    x = x.astype(np.float32)
    got = lpsim.quantize(x, fmt)
    want = np.array([_nearest_even_grid(v, fmt) for v in x], np.float32)
    assert np.array_equal(got, want)


def test_specials_counters_and_scalars():
    fmt = lpsim.fixed(8, 4)
    assert (fmt.max_finite, fmt.min_finite, fmt.bits) == (127 / 16, -8.0, 8)
    stats = lpsim.RoundingStats()
    x = np.array([np.inf, -np.inf, np.nan, 100.0, 1e-3, 0.0, 0.5, 0.53], np.float64)
    y = lpsim.quantize(x, fmt, stats=stats)
    assert np.array_equal(y[:2], [127 / 16, -8.0]) and np.isnan(y[2])
    assert np.array_equal(y[3:], [127 / 16, 0.0, 0.0, 0.5, 0.5])
    assert stats.as_dict() == dict(elements=8, inexact=5, overflow=1, underflow=1,
                                   subnormal=0, nan=1, inf=2)
    assert lpsim.quantize(0.53, fmt) == 0.5 and lpsim.quantize(-50, fmt) == -8.0
    out = np.empty(3, np.float32)
    assert lpsim.quantize(np.array([1.03, 9, -9], np.float32), fmt, out=out) is out
    assert np.array_equal(out, [1.0, 127 / 16, -8.0])


def test_stochastic_is_unbiased_and_stays_on_the_two_neighbours():
    # x = 0.3 (grid 1/16: neighbours 0.25, 0.3125, P(up) = 0.8).  Mean of n = 20000 draws has
    # standard error sqrt(0.8*0.2/n)/16; |mean - 0.3| <= 5 se: false alarm < 6e-7.
    fmt = lpsim.fixed(8, 4)
    x = np.full(20000, 0.3)
    y = lpsim.quantize(x, fmt, "stochastic", generator=lpsim.Generator(8))
    assert set(np.unique(y)) <= {0.25, 0.3125}
    se = np.sqrt(0.8 * 0.2 / x.size) / 16
    assert abs(y.mean() - 0.3) <= 5 * se


def test_errors():
    with pytest.raises(ValueError, match="wl=0"):
        lpsim.fixed(0, 3)
    with pytest.raises(TypeError, match="fl=1.5"):
        lpsim.fixed(8, 1.5)
    with pytest.raises(ValueError, match=r"fixed\(30,4\) does not fit"):
        lpsim.quantize(np.ones(3, np.float32), lpsim.fixed(30, 4))
    assert lpsim.quantize(np.array([1.1]), lpsim.fixed(30, 4))[0] == 1.125


def test_torch_tensors():
    torch = pytest.importorskip("torch")
    fmt = lpsim.fixed(6, 2)
    x = torch.tensor([0.3, 9.0, -20.0, 1.125], requires_grad=True)
    y = lpsim.quantize(x, fmt)
    assert torch.equal(y.detach(), torch.tensor([0.25, 7.75, -8.0, 1.0]))
    y.sum().backward()
    assert torch.equal(x.grad, torch.tensor([1.0, 0.0, 0.0, 1.0]))   # clamp's gradient
    w = torch.tensor([0.3, 9.0])
    v = w._version
    lpsim.quantize(w, fmt, out=w)
    assert torch.equal(w, torch.tensor([0.25, 7.75])) and w._version > v


def test_in_place_counts_as_out_of_place():
    # counters come from the input: rounding into x itself must not count the overwritten x
    fmt = lpsim.fixed(8, 4)
    x = np.array([0.1, 0.03, 100.0, -100.0, 1.0, np.nan, np.inf])
    apart, inplace = lpsim.RoundingStats(), lpsim.RoundingStats()
    want = lpsim.quantize(x.copy(), fmt, stats=apart)
    xi = x.copy()
    assert lpsim.quantize(xi, fmt, stats=inplace, out=xi) is xi
    assert np.array_equal(xi, want, equal_nan=True)
    assert inplace.as_dict() == apart.as_dict() == dict(
        elements=7, inexact=5, overflow=2, underflow=1, subnormal=0, nan=1, inf=1)


@pytest.mark.parametrize("out, error, match", [
    (np.zeros(2, np.float32), ValueError, r"out must be .* dtype float64.* got \(2,\) float32"),
    (np.zeros((3, 2)), ValueError, r"out must be .* shape \(2,\)"),
    (np.zeros(5), ValueError, r"out must be .* shape \(2,\)"),
    (np.zeros(2, np.int64), ValueError, r"out must be .* got \(2,\) int64"),
    ("readonly", ValueError, "out is read-only"),
    ([0.0, 0.0], TypeError, "out is a list"),
])
def test_out_is_checked_before_anything_is_written_or_counted(out, error, match):
    # a float32 out for float64 data would round twice; a broadcastable one would be filled
    if isinstance(out, str):
        out = np.zeros(2)
        out.flags.writeable = False
    before = out.copy() if isinstance(out, np.ndarray) else None
    stats = lpsim.RoundingStats()
    with pytest.raises(error, match=match):
        lpsim.quantize(np.array([1000 + 2.0 ** -20, 3.0]), lpsim.fixed(40, 20), out=out,
                       stats=stats)
    assert stats.elements == 0
    if before is not None:
        assert np.array_equal(out, before)
    with pytest.raises(TypeError, match="out= applies to arrays"):
        lpsim.quantize(0.3, lpsim.fixed(8, 4), out=np.zeros(()))


def test_array_likes_and_numpy_scalars_as_float_formats_take_them():
    fmt = lpsim.fixed(8, 4)
    for x in ([0.3, 1.7], (0.3, 1.7), [[1, 200]], np.array([1, 2], np.int32),
              np.array([0.3], np.float16)):
        got, ref = lpsim.quantize(x, fmt), lpsim.quantize(x, "bf16")
        assert type(got) is np.ndarray and got.dtype == ref.dtype and got.shape == ref.shape
        assert np.array_equal(got, lpsim.quantize(np.asarray(x, ref.dtype), fmt))
    for x in (np.int64(3), np.int8(100), np.uint16(1), np.float16(0.3), np.array(0.3)):
        got, ref = lpsim.quantize(x, fmt), lpsim.quantize(x, "bf16")
        assert type(got) is type(ref) and getattr(got, "dtype", None) == getattr(ref, "dtype", None)
    assert lpsim.quantize(np.int64(100), fmt) == 127 / 16
    with pytest.raises(TypeError, match="dtype bool"):
        lpsim.quantize(np.bool_(True), fmt)


@pytest.mark.parametrize("wl, fl", [(8, -1100), (8, -1015), (53, -970), (1, 1075), (8, 10**6)])
def test_fl_out_of_the_float64_range_is_refused(wl, fl):
    with pytest.raises(ValueError, match=rf"fl={fl} is out of range for wl={wl}; accepted: "
                                         rf"{wl - 1022} <= fl <= 1074 .*float64"):
        lpsim.fixed(wl, fl)


@pytest.mark.parametrize("wl, fl", [(8, -1014), (53, -969), (1, -1021), (1, 1074), (53, 1074)])
def test_fl_at_the_ends_of_the_range_works(wl, fl):
    fmt = lpsim.fixed(wl, fl)
    x = np.array([1e308, -1e308, 2.0 ** -1074, 3.0, np.inf, -np.inf])
    y = lpsim.quantize(x, fmt)
    assert np.all(np.isfinite(y)) and y[0] == fmt.max_finite and y[1] == fmt.min_finite
    assert np.all(y % fmt.quantum == 0)


def test_symmetric_must_be_a_bool():
    with pytest.raises(TypeError, match="symmetric='yes' must be True or False"):
        lpsim.fixed(8, 4, symmetric="yes")
    with pytest.raises(TypeError, match="symmetric=1"):
        lpsim.fixed(8, 4, symmetric=1)
    assert lpsim.fixed(8, 4, symmetric=np.bool_(True)).symmetric is True


@pytest.mark.parametrize("x, want, counts", [
    (10 ** 400, 7.9375, [1, 1, 1, 0, 0, 0, 0]),      # a finite int beyond float64: saturated
    (-10 ** 400, -8.0, [1, 1, 1, 0, 0, 0, 0]),
    (2 ** 60 + 1, 7.9375, [1, 1, 1, 0, 0, 0, 0]),
    (np.int64(5), 5.0, [1, 0, 0, 0, 0, 0, 0]),
    (0.03, 0.0, [1, 1, 0, 1, 0, 0, 0]),
    (float("inf"), 7.9375, [1, 1, 0, 0, 0, 0, 1]),
])
def test_scalars_beyond_float64_give_the_same_answer_with_and_without_stats(x, want, counts):
    stats = lpsim.RoundingStats()
    assert lpsim.quantize(x, lpsim.fixed(8, 4)) == want
    assert lpsim.quantize(x, lpsim.fixed(8, 4), stats=stats) == want
    assert stats.counts.tolist() == counts


@pytest.mark.parametrize("x, want, counts", [
    (np.longdouble(1) + np.longdouble(2) ** -60, 1.0, [1, 1, 0, 0, 0, 0, 0]),   # inexact
    (np.longdouble(2) ** -1100, 0.0, [1, 1, 0, 1, 0, 0, 0]),                    # underflow
    (np.longdouble("1e400"), 7.9375, [1, 1, 1, 0, 0, 0, 0]),         # finite: saturated
])
def test_long_double_scalars_are_counted_from_their_exact_value(x, want, counts):
    """A long double was compared as float64: 1 + 2**-60 counted exact, 2**-1100 not
    underflowed, 1e400 counted as an inf input (as a float format counts each)."""
    if np.finfo(np.longdouble).nmant <= 52:
        pytest.skip("this platform's long double is float64")
    stats, carrier = lpsim.RoundingStats(), lpsim.RoundingStats()
    assert lpsim.quantize(x, lpsim.fixed(8, 4), stats=stats) == want
    lpsim.quantize(x, lpsim.fp(4, 3, 4, saturate=True), stats=carrier)
    assert stats.counts.tolist() == counts == carrier.counts.tolist()


def test_a_list_holding_ints_beyond_float64_is_rounded_from_their_exact_values():
    """numpy made such a list float64 first (a double rounding: 2**60 + 2**19 + 1, just
    above a midpoint, became 2**60, and 2**60 + 1 counted exact); a list of such ints
    alone was refused as if the format were a block format."""
    fmt = lpsim.fixed(53, -20)                          # multiples of 2**20, up to ~2**72
    x = 2 ** 60 + 2 ** 19 + 1
    for values in ([x, 1.0], (x,), [[x], [3 * 2 ** 19]]):
        got = lpsim.quantize(values, fmt, "nearest")
        want = [lpsim.quantize(v, fmt, "nearest") for v in np.array(values, object).ravel()]
        assert got.ravel().tolist() == want and want[0] == 2.0 ** 60 + 2 ** 20
    stats = lpsim.RoundingStats()
    got = lpsim.quantize([2 ** 60 + 1, 512.0], lpsim.fixed(53, -9), stats=stats)
    assert got.tolist() == [2.0 ** 60, 512.0] and stats.inexact == 1 and stats.elements == 2
    out = np.zeros(2)
    assert lpsim.quantize([x, 1.0], fmt, out=out) is out and out[0] == 2.0 ** 60 + 2 ** 20
    wrong = np.ones(3)
    with pytest.raises(ValueError):                     # a wrong out: refused, unwritten
        lpsim.quantize([x, 1.0], fmt, out=wrong)
    assert wrong.tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("fmt", [lpsim.fixed(8, -120), lpsim.fixed(24, -103),
                                 lpsim.fixed(30, 10)])
def test_a_format_float32_data_cannot_carry_names_what_does(fmt):
    """The advice was "wl <= 24", which fixed(8, -120) already is: its carrier's exponents
    are past float32's.  float64 data takes it, with the exact grid's values."""
    x = np.array([3.0e36, -1.0, 0.0], np.float32)
    with pytest.raises(ValueError, match=r"does not fit the container of x .*accepted: "
                                         r"float64 data"):
        lpsim.quantize(x, fmt)
    got = lpsim.quantize(x.astype(np.float64), fmt)
    assert got.tolist() == [_nearest_even_grid(v, fmt) for v in x.astype(np.float64)]
