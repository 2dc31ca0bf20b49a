"""Any input, any argument: a result equal to lpsim.reference, or a ValueError/TypeError that
names the argument; never another exception, never a silently wrong result."""

import re
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import lpsim
from lpsim import ops, reference
from lpsim.philox import WORD_BITS, random_words

NAMES = re.compile(r"\b(x|a|b|fmt|format|rounding|seed|stream|offset|sr_bits|stats|out|dtype|"
                   r"integer|bool)\b")
FORMATS = ["bf16", "fp16", "e4m3fn", "e5m2", "fp(4,3,4)", "fp(3,0,1)", "fp32", "fp64",
           "tf32", "fp(8,7,4)", "fp99", "e0m3", "fp(2)", 7]
ROUNDINGS = list(lpsim.MODES) + ["nearest_even", None]
DTYPES = [np.float16, np.float32, np.float64, ml_dtypes.bfloat16, np.int32, np.int64,
          np.uint8, np.bool_, np.complex64, ">f4", ">f8", object]


def _cast(values, dtype):
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(values).astype(dtype)


@st.composite
def inputs(draw):
    kind = draw(st.sampled_from(["float", "int", "list", "array", "scalar"]))
    if kind == "float":
        return draw(st.floats(allow_nan=True, allow_infinity=True))
    if kind == "int":
        return draw(st.integers(-2 ** 80, 2 ** 80) | st.integers(-2 ** 1100, 2 ** 1100))
    if kind == "list":
        return draw(st.lists(st.floats(allow_nan=False, width=32), max_size=6))
    dtype = draw(st.sampled_from(DTYPES))
    if dtype is object:
        return np.array([1.5, "x"], dtype=object)
    dtype = np.dtype(dtype)
    shape = () if kind == "scalar" else \
        draw(hnp.array_shapes(min_dims=0, max_dims=2, max_side=5))
    if dtype.kind in "fV":
        array = _cast(draw(hnp.arrays(np.float64, shape)), dtype)
    else:
        array = draw(hnp.arrays(dtype, shape))
    return array[()] if kind == "scalar" and dtype.isnative else array


def _is_int(x) -> bool:
    """A Python or numpy integer scalar (numpy's int64 is an integer: exact, as an int is)."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _exact_in_float64(v: int) -> bool:
    try:
        return int(float(v)) == v
    except OverflowError:
        return False


def _container_values(x):
    """What lpsim.quantize rounds: x upcast exactly to float32/float64, or None where x holds
    an integer (a Python or numpy int scalar, or an integer array) that float64 cannot hold:
    that is rounded once, from its exact value (np.float64 would round it first, twice)."""
    if _is_int(x):
        return np.float64(x) if _exact_in_float64(int(x)) else None
    array = np.asarray(x)
    if array.dtype.kind in "iu":
        exact = all(_exact_in_float64(int(v)) for v in array.reshape(-1))
        return array.astype(np.float64) if exact else None
    return array.astype(np.float64 if array.dtype.itemsize == 8 else np.float32)


def _assert_rounded_exactly(got, x, fmt, rounding, seed, stream, offset, sr_bits):
    """Each integer of ``x`` rounded from its exact value by lpsim.reference, element ``i``
    with the random word of counter ``offset + i``; a float (an array for an array)."""
    ints = [int(v) for v in np.asarray(x, dtype=object).reshape(-1)]
    stochastic = rounding in ("stochastic", "stochastic_equal")
    words = random_words(len(ints), 8, seed, stream, offset) if stochastic else [0] * len(ints)
    few = sr_bits if rounding == "stochastic" and sr_bits is not None and sr_bits < 62 else None
    assert np.shape(got) == np.shape(x) and np.asarray(got).dtype == np.float64
    assert isinstance(got, float) if np.ndim(x) == 0 else isinstance(got, np.ndarray)
    for i, (v, g) in enumerate(zip(ints, np.asarray(got).reshape(-1))):
        uniform = Fraction(words[i], 2 ** WORD_BITS[8]) if stochastic else None
        want = float(reference.round_exact(v, fmt, rounding, uniform=uniform,
                                           sr_bits=few).value)
        assert g == want or (np.isnan(g) and np.isnan(want)), (v, g, want)
        assert np.signbit(g) == np.signbit(want), (v, g, want)


KEYS = st.integers(-3, 2 ** 64 + 3) | st.sampled_from([0, 1, 2 ** 63, 2 ** 64 - 1])
OFFSETS = st.integers(-3, 2 ** 63 + 3) | st.sampled_from([0, 5, 2 ** 62 - 40])


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@example(x=np.int64(2 ** 54 - 1), fmt="bf16", rounding="toward_zero", seed=0, stream=0,
         offset=0, sr_bits=None)             # drawn in a full run: once, not via float64
@example(x=np.uint64(2 ** 64 - 1), fmt="fp32", rounding="stochastic", seed=3, stream=0,
         offset=5, sr_bits=None)
@example(x=np.array([2 ** 54 - 1, 1], np.int64), fmt="bf16", rounding="up", seed=0,
         stream=0, offset=0, sr_bits=None)
@given(x=inputs(), fmt=st.sampled_from(FORMATS), rounding=st.sampled_from(ROUNDINGS),
       seed=KEYS, stream=KEYS, offset=OFFSETS,
       sr_bits=st.none() | st.integers(-1, 70) | st.just(2.5))
def test_quantize_equals_the_reference_or_names_the_argument(x, fmt, rounding, seed, stream,
                                                            offset, sr_bits):
    try:
        got = lpsim.quantize(x, fmt, rounding, seed=seed, stream=stream, offset=offset,
                             sr_bits=sr_bits)
    except (ValueError, TypeError) as error:
        assert NAMES.search(str(error)), str(error)
        return
    values = _container_values(x)
    if values is None:           # integers beyond float64: each rounded from its exact value
        _assert_rounded_exactly(got, x, fmt, rounding, seed, stream, offset, sr_bits)
        return
    want, _ = reference.quantize(np.asarray(values), fmt, rounding, seed=seed, stream=stream,
                                 offset=offset, sr_bits=sr_bits)
    assert np.asarray(got).dtype == want.dtype and np.shape(got) == np.shape(values)
    assert np.asarray(got).tobytes() == want.tobytes()


def test_an_int64_beyond_float64_is_rounded_once():
    # the full-run draw: 2**54 - 1 toward zero in bf16 is 2**54 - 2**46 from the integer;
    # through float64 (2**54) it would be 2**54
    x = np.int64(2 ** 54 - 1)
    assert lpsim.quantize(x, "bf16", "toward_zero") == 2.0 ** 54 - 2.0 ** 46
    assert lpsim.quantize(np.float64(x), "bf16", "toward_zero") == 2.0 ** 54


@pytest.mark.parametrize("x", [np.int64(2 ** 54 - 1), np.uint64(2 ** 64 - 1),
                               np.int64(-2 ** 63 + 1), np.int64(2 ** 63 - 1), 2 ** 54 - 1])
@pytest.mark.parametrize("rounding", ["toward_zero", "nearest", "up"])
def test_integer_scalars_beyond_float64_are_rounded_once(x, rounding):
    _assert_rounded_exactly(lpsim.quantize(x, "bf16", rounding), x, "bf16", rounding, 0, 0, 0,
                            None)


@pytest.mark.parametrize("array", [np.int64([2 ** 54 - 1]), np.array(2 ** 63 - 1, np.int64),
                                   np.uint64([1, 2 ** 64 - 1]), np.int64([[3, -2 ** 63 + 1]])])
def test_integer_arrays_beyond_float64_are_refused_by_name_or_rounded_once(array):
    try:
        got = lpsim.quantize(array, "bf16", "toward_zero")
    except ValueError as error:
        big = next(int(v) for v in array.reshape(-1) if not _exact_in_float64(int(v)))
        assert re.search(rf"\bx\b.* {big}\b", str(error)), str(error)
        return
    _assert_rounded_exactly(got, array, "bf16", "toward_zero", 0, 0, 0, None)


@st.composite
def operands(draw):
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=2, max_side=4))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    floats = st.floats(allow_nan=True, allow_infinity=True, width=32)
    a = draw(hnp.arrays(dtype, shape, elements=floats))
    b = draw(hnp.arrays(dtype, shape, elements=floats) | st.floats(width=32))
    return draw(st.sampled_from([a, a.tolist()])), b


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(ab=operands(), op=st.sampled_from(["add", "sub", "mul"]),
       fmt=st.sampled_from(["bf16", "fp16", "e4m3fn", "fp(4,3,4)", "fp(11,50)", "fp99"]),
       rounding=st.sampled_from(ROUNDINGS), seed=KEYS, stream=KEYS, offset=OFFSETS)
def test_ops_equal_the_exact_result_rounded_or_name_the_argument(ab, op, fmt, rounding, seed,
                                                                 stream, offset):
    a, b = ab
    try:
        got = getattr(ops, op)(a, b, fmt, rounding, seed=seed, stream=stream, offset=offset)
    except (ValueError, TypeError) as error:
        assert NAMES.search(str(error)), str(error)
        return
    a64, b64 = np.broadcast_arrays(np.asarray(a, np.float64), np.asarray(b, np.float64))
    got = np.asarray(got)
    width = WORD_BITS[got.dtype.itemsize]
    words = random_words(got.size, got.dtype.itemsize, seed, stream, offset) \
        if rounding in ("stochastic", "stochastic_equal") else [0] * got.size
    for i, (x, y, g) in enumerate(zip(a64.reshape(-1), b64.reshape(-1), got.reshape(-1))):
        if not (np.isfinite(x) and np.isfinite(y)):
            continue             # IEEE specials: covered by the elementwise tests
        exact = {"add": Fraction(x) + Fraction(y), "sub": Fraction(x) - Fraction(y),
                 "mul": Fraction(x) * Fraction(y)}[op]
        if exact == 0:
            continue             # signed zeros: test_robustness
        want = reference.round_exact(exact, fmt, rounding, uniform=Fraction(words[i], 2 ** width))
        assert g == float(want.value) or (np.isnan(g) and np.isnan(float(want.value))), \
            (x, y, g, want)
