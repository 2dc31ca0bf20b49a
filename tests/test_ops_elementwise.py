"""Elementwise ops round the exact result once: checked against Fractions (lpsim.reference)."""

import math
import zlib
from fractions import Fraction

import numpy as np
import pytest

import lpsim
import lpsim.ops as ops
from lpsim.philox import WORD_BITS, random_words
from lpsim.reference import round_exact

MODES = ["nearest", "nearest_away", "toward_zero", "up", "down", "odd"]


def exact_sqrt(x: Fraction) -> Fraction:
    """sqrt(x) to 200 bits, strictly between grid points when inexact (a sticky bit)."""
    k = 200
    scaled = x * 2 ** (2 * k)
    s = math.isqrt(scaled.numerator // scaled.denominator)
    inexact = Fraction(s * s) != scaled
    return Fraction(2 * s + inexact, 2 ** (k + 1))


EXACT = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b, "sqrt": exact_sqrt, "fma": lambda a, b, c: a * b + c,
}


def _operands(dtype, n, seed):
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal(n) * 2.0 ** rng.integers(-30, 30, n)).astype(dtype)
    b = (rng.standard_normal(n) * 2.0 ** rng.integers(-30, 30, n)).astype(dtype)
    b[::7] = a[::7] * dtype(1 + 2 ** -10)        # near-cancellation
    return a, b


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "sqrt"])
@pytest.mark.parametrize("dtype, fmt", [(np.float32, "bf16"), (np.float32, "e5m2"),
                                        (np.float64, "fp(8,40,0)"), (np.float64, "fp16")])
def test_correctly_rounded_against_fractions(op, dtype, fmt):
    a, b = _operands(dtype, 300, seed=zlib.crc32(repr((op, fmt)).encode()))
    if op == "sqrt":
        a = np.abs(a)
    for mode in MODES:
        args = (a,) if op == "sqrt" else (a, b)
        got = getattr(ops, op)(*args, fmt, mode)
        assert got.dtype == dtype
        for i in range(a.size):
            exact = EXACT[op](*[Fraction(float(x[i])) for x in args])
            want = round_exact(exact, fmt, mode).value
            assert float(got[i]) == float(want), (op, mode, i)


def test_fma_is_one_rounding():
    rng = np.random.default_rng(1)
    a, b, c = (lpsim.quantize(rng.standard_normal(200).astype(np.float32), "bf16")
               for _ in range(3))
    c *= np.float32(2.0 ** -20)
    for mode in MODES:
        got = ops.fma(a, b, c, "fp16", mode)
        for i in range(200):
            exact = Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i]))
            assert Fraction(float(got[i])) == Fraction(round_exact(exact, "fp16", mode).value)


def test_no_double_rounding():
    # 1 + 2**-8 is the bf16 midpoint between 1 and 1 + 2**-7; a tiny excess decides upwards
    a, b = 1 + 2.0 ** -8, 2.0 ** -60
    assert lpsim.quantize(a + b, "bf16") == 1.0                   # float64 first: wrong
    assert ops.add(a, b, "bf16") == 1 + 2.0 ** -7                 # exact: right
    assert ops.sub(a, -b, "bf16") == 1 + 2.0 ** -7
    assert ops.fma(1.0, a, b, "bf16") == 1 + 2.0 ** -7
    assert ops.div(1.0, 3.0, "fp64") == 1 / 3                     # fp64: the float64 op


@pytest.mark.parametrize("op", ["add", "fma", "div", "sqrt"])
@pytest.mark.parametrize("dtype, fmt", [(np.float32, "bf16"), (np.float32, "fp(5,19,0)"),
                                        (np.float64, "fp16"), (np.float64, "fp(8,46,0)")])
@pytest.mark.parametrize("mode, sr_bits", [("stochastic", None), ("stochastic", 5),
                                           ("stochastic_equal", None)])
def test_stochastic_against_fractions_with_the_documented_words(op, dtype, fmt, mode, sr_bits):
    """Element i uses word offset + i in the result's container (module docs).

    float32 containers (fmt m <= 19): SR of the exact result.  float64 containers: SR of
    RO(exact), the float64 intermediate (module docs); with fp(8,46,0) that differs from
    SR of the exact result in about 1 element in 150, so the reference must be this one.
    """
    n = 200
    a, b = _operands(dtype, n, seed=zlib.crc32(repr((op, fmt, mode, sr_bits)).encode()))
    c = (a * dtype(2.0 ** -9)).astype(dtype)
    args = {"add": (a, b), "fma": (lpsim.quantize(a, "bf16"), lpsim.quantize(b, "bf16"), c),
            "div": (a, b), "sqrt": (np.abs(a),)}[op]
    got = getattr(ops, op)(*args, fmt, mode, seed=77, stream=3, offset=5, sr_bits=sr_bits)
    assert got.dtype == dtype
    itemsize = np.dtype(dtype).itemsize
    words = random_words(n, itemsize, 77, 3, offset=5)
    for i in range(n):
        exact = EXACT[op](*[Fraction(float(x[i])) for x in args])
        if dtype == np.float64:
            exact = Fraction(round_exact(exact, "fp64", "odd").value)
        u = Fraction(words[i], 2 ** WORD_BITS[itemsize])
        want = round_exact(exact, fmt, mode, uniform=u, sr_bits=sr_bits).value
        assert float(got[i]) == float(want), (op, i)


def test_stochastic_matches_quantize_on_container_values():
    rng = np.random.default_rng(2)
    a = rng.standard_normal(1000).astype(np.float32)
    b = rng.standard_normal(1000).astype(np.float32)
    # float64 container: products of float32 values are exact, so quantize agrees bit for bit
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    assert np.array_equal(ops.mul(a64, b64, "bf16", "stochastic", seed=9),
                          lpsim.quantize(a64 * b64, "bf16", "stochastic", seed=9))
    s = lpsim.RoundingStats()
    ops.mul(a, b, "bf16", stats=s)
    assert s.elements == 1000 and s.inexact > 900


def test_scalars_broadcasting_and_in_fmt():
    assert ops.mul(3.0, 7.0, "e4m3") == 20.0            # 21 is a tie: even mantissa
    assert isinstance(ops.add(1.0, 2.0, "bf16"), float)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert ops.add(x, 0.5, "bf16").dtype == np.float32
    assert ops.mul(x, np.ones(3), "bf16").shape == (2, 3)
    v = np.float32(1 + 2 ** -10)
    assert ops.mul(v, np.float32(1), "fp32", in_fmt="bf16") == 1.0
    assert ops.sqrt(np.float32(-1.0), "bf16") != ops.sqrt(np.float32(-1.0), "bf16")  # NaN


def _hard_values(dtype, n, seed):
    """Operands with every special case: zeros of both signs, inf, NaN, subnormals of the
    container, products and quotients below 2**-969 and sums near float64's top (the exact
    path), near-cancellation; float32-exact values, so fma's products are exact."""
    a, b = _operands(np.float32, n, seed)
    a, b = a.astype(dtype), b.astype(dtype)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-40, 3.0], np.float32)
    a[:8], b[8:16] = special, special
    if dtype == np.float64:
        a[16:20], b[16:20] = [2.0 ** -500, -(2.0 ** -480), 2.0 ** 1023, 1.5 * 2.0 ** 1023], \
            [2.0 ** -490, 2.0 ** 500, 2.0 ** 1023, -(2.0 ** 1022)]
    return a, b


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "sqrt", "fma"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rounding", ["nearest", "down", "stochastic"])
def test_repeated_array_calls_take_the_cached_path_and_equal_the_general_path(name, dtype,
                                                                              rounding):
    """An array call of a route seen before runs from elementwise._FAST; it gives the
    results and counters of the general path (a call with out= takes it), on sizes across
    the thread threshold and on values that need the exact path (it falls back)."""
    from lpsim.ops import elementwise
    op = getattr(ops, name)
    arity = {"sqrt": 1, "fma": 3}.get(name, 2)
    kw = dict(seed=11, stream=3) if rounding == "stochastic" else {}
    for n, offset in ((40, 0), (300, 5), ((1 << 19) + 3, 0)):
        a, b = _hard_values(dtype, n, n)
        if name == "fma" and dtype == np.float64:
            b[18:20] = [0.5, -0.25]              # products near float64's top, not beyond
        xs = (np.abs(a),) if arity == 1 else (a, b, b[::-1].copy())[:arity]
        for safe in (False, True):
            if safe:                             # no exact-path values: the cached path
                xs = tuple(np.where(np.isfinite(x) & (np.abs(x) > 1e-30) &
                                    (np.abs(x) < 1e30), x, dtype(1.5)) for x in xs)
            s_cached, s_general = lpsim.RoundingStats(), lpsim.RoundingStats()
            got = op(*xs, "bf16", rounding, stats=s_cached, offset=offset, **kw)
            want = op(*xs, "bf16", rounding, stats=s_general, offset=offset,
                      out=np.empty(n, dtype), **kw)
            assert got.dtype == dtype and got.shape == (n,)
            assert np.array_equal(got, want, equal_nan=True), (name, n, safe)
            assert s_cached == s_general
        assert (elementwise.ADD + ["add", "sub", "mul", "div", "fma", "sqrt"].index(name),
                "bf16", rounding, np.dtype(dtype)) in {k[:4] for k in elementwise._FAST}
    # read-only, strided and 2-D operands of a cached route: the same results
    a, b = _hard_values(dtype, 64, 7)
    if name == "fma" and dtype == np.float64:
        b[18:20] = [0.5, -0.25]
    base = (np.abs(a),) if arity == 1 else (a, b, b[::-1].copy())[:arity]
    readonly = tuple(x.copy() for x in base)
    for x in readonly:
        x.flags.writeable = False
    for xs in (readonly, tuple(x[::2] for x in base), tuple(x.reshape(8, 8) for x in base)):
        want = op(*xs, "bf16", rounding, out=np.empty(xs[0].shape, dtype), **kw)
        assert np.array_equal(op(*xs, "bf16", rounding, **kw), want, equal_nan=True)
    if name == "fma" and dtype == np.float64:    # an inexact product is still refused
        x = np.full(3, 1 + 2.0 ** -40)
        with pytest.raises(ValueError, match="element 0"):
            op(x, x, x, "bf16", rounding, **kw)


def test_fma_of_inf_and_nan_operands_is_the_ieee_result():
    """inf * y has no residual (inf - inf is NaN, not an inexact product): fma gives IEEE's
    inf or NaN, as numpy's a * b + c does on these values, instead of refusing them."""
    a = np.array([np.inf, 1.0, np.nan, -np.inf, np.inf, 2.0])
    b = np.array([2.0, np.inf, 1.0, 0.0, -3.0, np.nan])
    c = np.array([1.0, -np.inf, 0.0, 1.0, 5.0, 1.0])
    with np.errstate(invalid="ignore"):
        want = a * b + c
    for _ in range(2):                                      # the general, then cached path
        assert np.array_equal(ops.fma(a, b, c, "bf16"), want, equal_nan=True)
    assert ops.fma(np.inf, 2.0, 1.0, "bf16") == np.inf


def _scalar_kinds():
    kinds = [np.float64, np.float32, np.float16, np.int64, np.int8, np.uint16]
    try:
        import ml_dtypes
        kinds.append(ml_dtypes.bfloat16)
    except ImportError:
        pass
    return kinds


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "sqrt", "fma"])
def test_numpy_scalars_take_the_scalar_path_with_the_general_paths_results(name):
    """numpy scalars (what indexing an array gives) of every kind, alone, mixed, and with
    Python floats and ints: the scalar fast path (a call seen before) gives the value and
    type of the general path (a call with stats= takes it), and a 0-d array call's value."""
    from lpsim.ops import elementwise
    op = getattr(ops, name)
    arity = {"sqrt": 1, "fma": 3}.get(name, 2)
    kinds = _scalar_kinds()
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    # float32 values (fma's products exact), specials, and the exact path's ranges
    values = [float(np.float32(v)) for v in (1.1, 2.3, -0.7, 3.0, 1e-8)] + \
        [0.0, -0.0, np.inf, np.nan, 2.0 ** -600, 2.0 ** 1020]
    calls = 0
    for fmt, rounding in (("bf16", "nearest"), ("e4m3", "up"), ("fp(8,10)", "down")):
        for trial in range(12):
            picks = [kinds[i] for i in rng.integers(0, len(kinds), arity)]
            if trial % 4 == 3 and arity > 1:
                picks[-1] = float if trial % 8 == 3 else int
            args = []
            for kind in picks:
                v = values[rng.integers(0, len(values))]
                if kind is int or np.dtype(kind).kind in "iu":
                    v = int(rng.integers(0, 100))
                with np.errstate(over="ignore"):
                    args.append(kind(v))
            with np.errstate(all="ignore"):
                general = op(*args, fmt, rounding, stats=lpsim.RoundingStats())
                op(*args, fmt, rounding)
                hits = elementwise._SCALAR_KINDS.copy()
                fast = op(*args, fmt, rounding)
                zero_d = op(*[np.asarray(a) if not isinstance(a, (int, float)) else a
                              for a in args], fmt, rounding)
            assert type(fast) is type(general), (args, fast, general)
            assert fast.dtype == zero_d.dtype
            assert np.array_equal(fast, general, equal_nan=True) and \
                np.signbit(fast) == np.signbit(general), (args, fast, general)
            assert np.array_equal(fast, zero_d, equal_nan=True)
            calls += all(type(a) in hits for a in args if not isinstance(a, (int, float)))
    assert calls > 0
    # the fast path answers: a result from the cached route, with no array work
    x, y = np.float32(1.1), np.float32(2.3)
    ops.add(x, y, "bf16")
    assert elementwise._numpy_scalars(elementwise.ADD, (x, y), "bf16", "nearest") == \
        ops.add(1.1, 2.3, "bf16", in_fmt="fp32") == np.float32(3.40625)


def test_numpy_scalars_that_the_general_path_refuses_are_still_refused():
    ops.add(np.int64(3), np.int64(4), "bf16")
    with pytest.raises(ValueError, match="float64 cannot hold exactly"):
        ops.add(np.int64(2 ** 53 + 1), np.int64(4), "bf16")
    with pytest.raises(TypeError, match="bool"):
        ops.add(np.bool_(True), np.float32(1), "bf16")
    ops.add(np.float32(1), np.float32(1), "fp(8,23)")
    with pytest.raises(ValueError):
        ops.add(np.float32(1), np.float32(1), "fp(11,40)")     # does not fit float32
