"""Never crash, never silently wrong: integer ranges, odd inputs, IEEE zero signs, float64's
range in lpsim.ops, and errors that name the argument.  Each case failed before its fix."""

import io
import os
import subprocess
import sys
from contextlib import redirect_stderr
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import lpsim
from lpsim import RoundingStats, ops, quantize, reference
from lpsim.philox import random_words

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
X4 = np.array([1.1, -2.3, 3e-3, 500], np.float32)


# --- offsets and streams --------------------------------------------------------------------
def test_offset_beyond_the_counter_range_is_refused_and_nothing_is_written():
    out = np.full(4, 777.0, np.float32)
    stats = RoundingStats()
    for offset in (2 ** 63 - 100, 2 ** 63, 2 ** 62 - 3, 2 ** 70):
        with pytest.raises(ValueError, match=f"offset={offset} is out of range for 4 elements"):
            quantize(X4, "bf16", "nearest", offset=offset, out=out, stats=stats)
    assert np.all(out == 777.0) and stats.elements == 0


def test_the_last_accepted_offset_rounds_like_the_reference():
    offset = 2 ** 62 - 4
    got = quantize(X4, "bf16", "stochastic", seed=5, offset=offset)
    want, _ = reference.quantize(X4, "bf16", "stochastic", seed=5, offset=offset)
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("stream", [2 ** 63, 2 ** 63 + 12345, 2 ** 64 - 1])
def test_streams_above_2_63_work_in_any_order(stream):
    x = np.linspace(-3, 3, 37)
    small = quantize(x, "bf16", "stochastic", seed=9, stream=3)      # an int64 stream first
    big = quantize(x, "bf16", "stochastic", seed=9, stream=stream)
    want, _ = reference.quantize(x, "bf16", "stochastic", seed=9, stream=stream)
    assert big.tobytes() == want.tobytes() and small.tobytes() != big.tobytes()
    dot = ops.dot(x, x[::-1], acc_fmt="bf16", acc_rounding="stochastic", seed=9,
                  stream=stream, in_fmt="fp32")
    again = ops.dot(x, x[::-1], acc_fmt="bf16", acc_rounding="stochastic", seed=9,
                    stream=stream, in_fmt="fp32")
    assert dot == again


def test_a_big_stream_first_in_a_fresh_process():
    """The kernels' argument types must not depend on which stream came first."""
    code = ("import numpy as np, lpsim; x = np.linspace(-3, 3, 37); "
            "a = lpsim.quantize(x, 'bf16', 'stochastic', seed=9, stream=2**63 + 7); "
            "b = lpsim.quantize(x, 'bf16', 'stochastic', seed=9, stream=1); "
            "print(a.tobytes().hex())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    want, _ = reference.quantize(np.linspace(-3, 3, 37), "bf16", "stochastic", seed=9,
                                 stream=2 ** 63 + 7)
    assert done.stdout.strip() == want.tobytes().hex()


# --- Python ints beyond float64 ---------------------------------------------------------------
@pytest.mark.parametrize("value, fmt, mode", [
    (2 ** 60 - 1, "fp32", "toward_zero"), (2 ** 53 + 1, "fp64", "up"),
    (2 ** 53 + 1, "fp64", "down"), (-(2 ** 70) - 3, "bf16", "nearest"),
    (3 ** 40, "fp64", "nearest"), (10 ** 400, "fp64", "nearest"), (10 ** 400, "bf16", "down"),
    (-(10 ** 400), "e4m3fn", "nearest"), (2 ** 53 + 1, "fp64", "stochastic"),
])
def test_big_python_ints_are_rounded_from_their_exact_value(value, fmt, mode):
    stats = RoundingStats()
    got = quantize(value, fmt, mode, seed=3, stats=stats)
    uniform = None
    if mode == "stochastic":
        uniform = Fraction(random_words(1, 8, 3)[0], 2 ** 62)
    want = reference.round_exact(value, fmt, mode, uniform=uniform)
    assert (got == float(want.value) or (np.isnan(got) and np.isnan(float(want.value))))
    assert np.signbit(got) == np.signbit(float(want.value))
    assert stats.elements == 1 and stats.inexact == ("inexact" in want.flags)
    if mode == "toward_zero" or mode == "down":
        assert got <= abs(value) if value > 0 else True


def test_the_int_reported_in_the_issue():
    assert quantize(2 ** 60 - 1, "fp32", "toward_zero") == 2.0 ** 60 - 2.0 ** 36
    assert quantize(2 ** 53 + 1, "fp64", "up") == 2.0 ** 53 + 2


BIG = [0.5, 2 ** 60 - 1, -(2 ** 70) - 3, 2 ** 70, 3, 10 ** 400, 2 ** 53 + 1, -7.25]


@pytest.mark.parametrize("fmt, mode", [("fp32", "toward_zero"), ("fp32", "up"),
                                       ("bf16", "nearest"), ("fp64", "stochastic")])
def test_big_python_ints_in_lists_are_rounded_from_their_exact_value(fmt, mode):
    """Each element as the scalar call rounds it (with its own counter): np.asarray would
    round 2**60 - 1 to float64 first (2**60, a double rounding) and refuse 2**70."""
    stats, each = RoundingStats(), RoundingStats()
    got = quantize(BIG, fmt, mode, seed=3, offset=5, stats=stats)
    want = [quantize(v, fmt, mode, seed=3, offset=5 + i, stats=each) for i, v in enumerate(BIG)]
    assert got.dtype == np.float64 and got.tolist() == want
    assert stats == each and stats.elements == len(BIG) and stats.inexact >= 3
    assert quantize(tuple(BIG[1:3]), fmt, mode, seed=3, offset=6).tolist() == want[1:3]
    out = np.zeros((len(BIG), 3))[:, 1]                 # a strided out takes them too
    assert quantize(BIG, fmt, mode, seed=3, offset=5, out=out) is out
    assert out.tolist() == want


def test_big_ints_in_block_formats_are_refused_by_name_unless_exact_in_float64():
    assert quantize(2 ** 70, "mxfp8_e4m3") == 2.0 ** 70
    with pytest.raises(ValueError, match=f"the integer {2 ** 70 + 1}, which float64"):
        quantize(2 ** 70 + 1, "mxfp8_e4m3")


@pytest.mark.skipif(np.finfo(np.longdouble).nmant <= 52, reason="long double is float64 here")
@pytest.mark.parametrize("fmt, mode, want", [("fp32", "up", 1 + 2 ** -23),
                                             ("bf16", "odd", 1 + 2 ** -7),
                                             ("fp32", "nearest", 1.0)])
def test_long_double_scalars_are_rounded_from_their_exact_value(fmt, mode, want):
    """np.longdouble(1) + 2**-60 was cast to float64 first (1.0: a double rounding)."""
    x = np.longdouble(1) + np.longdouble(2) ** -60
    stats = RoundingStats()
    got = quantize(x, fmt, mode, stats=stats)
    assert type(got) is np.float64 and got == want and stats.inexact == 1
    assert quantize(np.longdouble(0.75), fmt, mode) == 0.75      # exact in float64
    assert np.isnan(quantize(np.longdouble("nan"), fmt, mode))


# --- IEEE 754 section 6.3: the sign of an exact zero sum -----------------------------------
@pytest.mark.parametrize("call, sign", [
    (lambda m: ops.sub(1.0, 1.0, "fp16", m), "-+"),
    (lambda m: ops.add(-0.0, 0.0, "bf16", m), "-+"),
    (lambda m: ops.add(0.0, 0.0, "bf16", m), "++"),
    (lambda m: ops.add(-0.0, -0.0, "bf16", m), "--"),
    (lambda m: ops.fma(1, 1, -1, "bf16", m), "-+"),
    (lambda m: ops.fma(np.float32(-0.0), 1, 0.0, "bf16", m), "-+"),
    (lambda m: ops.add(np.array([2.5, -0.0]), np.array([-2.5, 0.0]), "bf16", m), "-+"),
    (lambda m: ops.dot([1.0, 1.0], [1.0, -1.0], acc_fmt="bf16", in_fmt="fp32",
                       order="sequential", acc_rounding=m), "-+"),
    (lambda m: ops.dot([1.0, 1.0, 1.0, -1.0], [2.0, -2.0, 0.0, 0.0], acc_fmt="bf16",
                       in_fmt="fp32", order="pairwise", acc_rounding=m), "-+"),
    (lambda m: ops.matmul(np.array([[1.0, 1.0]]), np.array([[3.0], [-3.0]]),
                          acc_fmt="bf16", in_fmt="fp32", acc_rounding=m), "-+"),
    (lambda m: ops.dot(np.float32([-0.0]), np.float32([1.0]), acc_fmt="bf16",
                       order="sequential", acc_rounding=m), "--"),
])
def test_exact_zero_sums_follow_ieee(call, sign):
    """-0 under rounding down, +0 otherwise, except zeros of one sign keep it."""
    for mode, want in zip(("down", "nearest"), sign):
        got = np.asarray(call(mode)).reshape(-1)
        assert np.all(got == 0) and np.all(np.signbit(got) == (want == "-")), (mode, got)
    for mode in ("up", "toward_zero", "odd", "nearest_away"):
        got = np.asarray(call(mode)).reshape(-1)
        assert np.all(np.signbit(got) == (sign[1] == "-")), (mode, got)


# --- float64's range in lpsim.ops ------------------------------------------------------------
@pytest.mark.parametrize("op, args, fmt, mode", [
    (ops.mul, (1e-200, 1e-200), lpsim.fp(11, 50), "up"),
    (ops.mul, (1e-200, -1e-200), lpsim.fp(11, 50), "down"),
    (ops.mul, (3e-170, 7e-160), lpsim.fp(11, 40), "nearest"),
    (ops.mul, (1e-200, 1e-200), lpsim.fp(11, 50), "stochastic"),
    (ops.div, (1e-300, 1e30), lpsim.fp(11, 45), "up"),
    (ops.div, (1e300, 1e-30), "bf16", "toward_zero"),
    (ops.add, (1.7e308, 1.7e308), "bf16", "toward_zero"),
    (ops.add, (1.7e308, 1.7e308), lpsim.fp(11, 50), "odd"),
    (ops.sub, (-1.7e308, 1.7e308), "bf16", "nearest"),
    (ops.mul, (1e200, 1e200), "fp16", "toward_zero"),
    (ops.mul, (1e200, -1e200), "e4m3fn", "nearest"),
    (ops.fma, (2.0 ** 500, 2.0 ** 523, 1.7e308), lpsim.fp(11, 20), "down"),
])
def test_results_outside_float64_are_exact(op, args, fmt, mode):
    stats = RoundingStats()
    got = op(*args, fmt, mode, seed=11, stats=stats)
    exact = {ops.mul: lambda a, b: a * b, ops.div: lambda a, b: a / b,
             ops.add: lambda a, b: a + b, ops.sub: lambda a, b: a - b,
             ops.fma: lambda a, b, c: a * b + c}[op](*(Fraction(a) for a in args))
    uniform = Fraction(random_words(1, 8, 11)[0], 2 ** 62) if mode == "stochastic" else None
    want = reference.round_exact(exact, fmt, mode, uniform=uniform)
    want_value = float(want.value)
    assert got == want_value or (np.isnan(got) and np.isnan(want_value)), (got, want_value)
    assert np.signbit(got) == np.signbit(want_value)
    assert stats.elements == 1
    assert [getattr(stats, c) for c in lpsim.stats.COUNTERS] == \
        [int(c in want.flags) for c in lpsim.stats.COUNTERS]


# --- errors that name the problem --------------------------------------------------------------
@pytest.mark.parametrize("call, error, words", [
    (lambda: quantize(X4, "bf16", out=_readonly(4)), ValueError, "out is read-only"),
    (lambda: quantize(_matrix(), "bf16"), TypeError, "numpy.matrix"),
    (lambda: quantize(np.ma.masked_array([1.0, 2.0], [0, 1]), "bf16"), TypeError,
     "masked array"),
    (lambda: quantize(np.array([1.0, 2.0], dtype=object), "bf16"), TypeError, "dtype object"),
    (lambda: quantize(X4, "bf16", stats={}), TypeError, "stats=\\{\\} is a dict"),
    (lambda: quantize(X4, "bf16", stats=3), TypeError, "stats=3 is a int"),
    (lambda: quantize(1.5, "bf16", stats=[]), TypeError, "stats=\\[\\] is a list"),
    (lambda: ops.add(X4, X4, "bf16", stats=object()), TypeError, "stats=.* is a object"),
    (lambda: ops.dot(X4, X4, stats="x"), TypeError, "stats='x' is a str"),
    (lambda: quantize(X4, "bf16", out=np.zeros(4, ">f4")), ValueError, "native byte order"),
    (lambda: quantize(X4, "bf16", out=[0.0] * 4), TypeError, "out is a list"),
    (lambda: quantize(X4, "bf16", "stochastic", seed=2 ** 64), ValueError, "seed=.*2\\*\\*64"),
    (lambda: quantize(X4, "bf16", "stochastic", stream=-1), ValueError, "stream=-1"),
    (lambda: quantize(X4, "bf16", offset=1.0), TypeError, "offset=1.0 must be an integer"),
    (lambda: ops.add(2 ** 60 + 1, 1.0, "bf16"), ValueError, "not exact in float64"),
])
def test_errors_name_the_argument(call, error, words):
    with pytest.raises(error, match=words):
        call()


def _readonly(n):
    x = np.arange(n, dtype=np.float32) + 0.1
    x.setflags(write=False)
    return x


def test_in_place_on_a_read_only_array_is_refused_and_nothing_changes():
    x = _readonly(5)
    before = x.copy()
    with pytest.raises(ValueError, match="out is read-only"):
        quantize(x, "bf16", out=x)
    assert np.array_equal(x, before)


def test_wrong_stats_are_refused_before_anything_is_written():
    out = np.full(4, 7.0, np.float32)
    with pytest.raises(TypeError, match="stats"):
        quantize(X4, "bf16", out=out, stats="counters")
    assert np.all(out == 7.0)


# --- array-likes, upcast exactly, as numpy would take them ----------------------------------
@pytest.mark.parametrize("x, container", [
    ([0.1, -2.5, 1e-30], np.float64), ((0.1, 3.0), np.float64), ([[1, 2], [3, 4]], np.float64),
    (np.array([1.5, -0.1], np.float16), np.float32),
    (np.array([1.5, -0.1, 3e38], ml_dtypes.bfloat16), np.float32),
    (np.array([1.1, -2.3], ">f4"), np.float32), (np.array([1.1, -2.3], ">f8"), np.float64),
    (np.arange(6, dtype=np.int32).reshape(2, 3), np.float64),
    (np.array([2 ** 53, -7], np.int64), np.float64), (np.uint8(200), None),
    (np.float16(0.3), None),
])
def test_array_likes_round_like_their_exact_container_values(x, container):
    got = quantize(x, "e4m3fn", "nearest")
    exact = np.asarray(x).astype(np.float64)
    if container is None:
        assert np.asarray(got).shape == () and float(got) == float(
            quantize(np.float64(exact), "e4m3fn"))
        return
    assert got.dtype == container and got.shape == np.shape(x)
    want, _ = reference.quantize(exact.astype(container), "e4m3fn", "nearest")
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("x", [np.float16(0.3), np.float32(0.3), ml_dtypes.bfloat16(0.3),
                               ml_dtypes.float8_e4m3fn(0.3)], ids=lambda x: type(x).__name__)
def test_numpy_and_ml_dtypes_scalars_come_back_as_scalars_of_their_container(x):
    got = quantize(x, "e4m3fn", "stochastic", seed=3)
    assert isinstance(got, np.float32) and not isinstance(got, np.ndarray)
    assert got == quantize(np.array([x], np.float32), "e4m3fn", "stochastic", seed=3)[0]


def test_overlapping_out_rounds_the_original_values():
    x = np.linspace(-5, 5, 41)
    want = quantize(x.copy(), "fp(4,3,4)")[1:]
    y = x.copy()
    quantize(y[1:], "fp(4,3,4)", out=y[:-1])
    assert np.array_equal(y[:-1], want)


# --- the command line --------------------------------------------------------------------------
def test_cli_error_text_with_markup_characters_is_printed_not_parsed():
    from lpsim.cli import main
    err = io.StringIO()
    with redirect_stderr(err):
        status = main(["round", "1", "-f", "[/x]"])
    assert status == 2
    done = subprocess.run([sys.executable, "-m", "lpsim.cli", "round", "1", "-f", "[/x]"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 2 and "unknown format '[/x]'" in done.stderr
    assert "Traceback" not in done.stderr


def _matrix():
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PendingDeprecationWarning)
        return np.matrix([[1.0, 2.0]])


def test_unpickled_arrays_and_memmaps(tmp_path):
    """Equal but not identical dtype objects, and ndarray subclasses that are not matrices
    or masked arrays, round like the plain array."""
    import pickle
    x = np.linspace(-3, 3, 11)
    want = quantize(x, "bf16", "stochastic", seed=2)
    y = pickle.loads(pickle.dumps(x))
    assert y.dtype == x.dtype
    assert quantize(y, "bf16", "stochastic", seed=2).tobytes() == want.tobytes()
    m = np.lib.format.open_memmap(tmp_path / "x.npy", mode="w+", dtype=np.float64, shape=(11,))
    m[:] = x
    assert quantize(m, "bf16", "stochastic", seed=2).tobytes() == want.tobytes()
    readonly = np.load(tmp_path / "x.npy", mmap_mode="r")
    assert quantize(readonly, "bf16", "stochastic", seed=2).tobytes() == want.tobytes()
    target = np.lib.format.open_memmap(tmp_path / "y.npy", mode="w+", dtype=np.float64,
                                       shape=(11,))
    assert quantize(x, "bf16", "stochastic", seed=2, out=target) is target
    assert np.asarray(target).tobytes() == want.tobytes()
    strided = np.lib.format.open_memmap(tmp_path / "z.npy", mode="w+", dtype=np.float64,
                                        shape=(11, 2))[:, 1]
    quantize(x, "bf16", "stochastic", seed=2, out=strided)
    assert np.ascontiguousarray(strided).tobytes() == want.tobytes()


@pytest.mark.parametrize("layout", ["transposed", "fortran", "reversed", "sliced"])
def test_every_layout_rounds_like_its_contiguous_copy(layout):
    base = np.arange(60, dtype=np.float32).reshape(6, 10) * 0.37
    x = {"transposed": base.T, "fortran": np.asfortranarray(base), "reversed": base[::-1, ::-2],
         "sliced": base[1:5, 2:9]}[layout]
    want = quantize(np.ascontiguousarray(x), "e4m3", "stochastic", seed=4)
    got = quantize(x, "e4m3", "stochastic", seed=4)
    assert got.shape == x.shape and got.tobytes() == want.tobytes()
    for out in (np.empty(x.shape, np.float32), np.empty(x.shape, np.float32, order="F")):
        assert quantize(x, "e4m3", "stochastic", seed=4, out=out) is out
        assert np.array_equal(out, want)
    y = x.copy(order="K")
    quantize(y, "e4m3", "stochastic", seed=4, out=y)
    assert np.array_equal(y, want)


def test_cached_requests_do_not_accept_equal_values_of_another_type():
    x = np.float32([1.1, 2.2])
    quantize(x, "bf16", "stochastic", seed=1, sr_bits=1)
    quantize(x, "bf16", "stochastic", seed=1, sr_bits=4)
    ops.add(x, x, "bf16", "stochastic", seed=1, sr_bits=1)
    with pytest.raises(TypeError, match="sr_bits=True"):
        quantize(x, "bf16", "stochastic", seed=1, sr_bits=True)
    with pytest.raises(TypeError, match="sr_bits=4.0"):
        quantize(x, "bf16", "stochastic", seed=1, sr_bits=4.0)
    with pytest.raises(TypeError, match="sr_bits=True"):
        ops.add(x, x, "bf16", "stochastic", seed=1, sr_bits=True)


# --- found by hostile probing (2026-11-27) ---------------------------------------------------
def test_specials_given_as_a_numpy_string_is_a_plain_str_and_round_trips():
    fmt = lpsim.fp(4, 3, 2, specials=np.array(["ieee", "fnuz"])[1])
    assert type(fmt.specials) is str and lpsim.parse_format(repr(fmt)) == fmt
    with pytest.raises(TypeError, match=r"specials=array\('fnuz'.* must be a string"):
        lpsim.fp(4, 3, 2, specials=np.array("fnuz"))


def test_an_offset_beyond_the_counters_is_named_with_a_generator_too():
    x = np.ones(4, np.float32)
    gen = lpsim.Generator(1)
    for kw in (dict(seed=1), dict(generator=gen)):
        with pytest.raises(ValueError, match=r"offset=4611686018427387904 is out of range"):
            quantize(x, "bf16", "stochastic", offset=2 ** 62, **kw)
    assert gen.get_state() == (1, 0)


@pytest.mark.parametrize("bad, error", [(dict(elements=1.7), TypeError),
                                        (dict(inexact=-3), ValueError),
                                        (dict(overflow="2"), TypeError),
                                        (dict(nan=True), TypeError),
                                        (dict(elements=2 ** 63), ValueError)])
def test_counts_that_are_not_counts_are_refused_by_name(bad, error):
    name = next(iter(bad))
    with pytest.raises(error, match=rf"{name}="):
        RoundingStats(**bad)
    with pytest.raises(error, match=rf"{name}="):
        lpsim.blocks.BlockStats(**bad)
    stats = RoundingStats(elements=np.int64(5))
    with pytest.raises(error, match=rf"{name}="):
        setattr(stats, name, bad[name])
    assert stats == RoundingStats(elements=5)


def test_an_unsigned_format_makes_minus_inf_nan_even_when_it_saturates():
    """fnu has no negatives: -inf is NaN as -1e300 is, saturating or not (+inf: max)."""
    for saturate in (True, False):
        fmt = lpsim.fp(8, 0, 1, specials="fnu", saturate=saturate)
        stats = RoundingStats()
        got = quantize(np.array([-np.inf, -1e300, np.inf]), fmt, stats=stats)
        assert np.isnan(got[:2]).all() and (got[2] == fmt.max_finite if saturate
                                            else np.isnan(got[2]))
        assert stats.inf == 2 and stats.inexact == 3
        ref = reference.round_exact(-np.inf, fmt)
        assert np.isnan(ref.value) and ref.flags == {"inf", "inexact"}


def test_the_reference_rounds_a_long_double_from_its_own_value():
    x = np.longdouble(1) + np.longdouble(2) ** -60
    if x == 1:
        pytest.skip("this platform's long double is float64")
    assert reference.round_exact(x, "bf16", "up").value == 1.0078125 == \
        quantize(x, "bf16", "up")


def test_adding_stats_past_int64_is_refused_and_adds_nothing():
    """int64 counters once wrapped to negative counts (which repr could not read back)."""
    big = lpsim.RoundingStats(elements=2 ** 63 - 1, inexact=5)
    with pytest.raises(OverflowError, match=r"elements would pass 2\*\*63 - 1"):
        big += lpsim.RoundingStats(elements=1, inexact=1)
    assert big == lpsim.RoundingStats(elements=2 ** 63 - 1, inexact=5)
    with pytest.raises(OverflowError, match="inexact would pass"):
        lpsim.RoundingStats(inexact=1) + lpsim.RoundingStats(inexact=2 ** 63 - 1)
    assert (big + lpsim.RoundingStats(inexact=1)).inexact == 6


def test_in_place_on_an_input_rounded_into_float32_says_why_it_is_refused():
    # a float16, bfloat16 or big-endian x rounds into float32, its container: out=x cannot
    # hold the result, and the error says so instead of naming a dtype the caller never used
    for dtype in (np.float16, ml_dtypes.bfloat16, np.dtype(">f4")):
        x = np.array([0.1, 3.3], dtype)
        before = x.copy()
        with pytest.raises(ValueError, match="result's dtype is the input's container"):
            lpsim.quantize(x, "e4m3fn", out=x)
        assert np.array_equal(x.view(np.uint8), before.view(np.uint8))
