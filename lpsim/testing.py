"""Hypothesis strategies and an assertion for property tests of low-precision kernels.

The strategies compose like ``hypothesis.extra.numpy``: keyword-only options, and every
value strategy draws scalars of the container dtype, so it can serve as ``elements=`` of
``hypothesis.extra.numpy.arrays(dtype, shape, elements=...)``.  :func:`assert_rounded`
checks results against the exact rational reference (:mod:`lpsim.reference`).
Needs hypothesis (the ``test`` extra).

Inside ``@given`` with hypothesis' default 200 ms deadline: a kernel's first call in a
process compiles it (seconds, once per machine) or loads it from numba's cache (about a
second), which the deadline counts.  Prepare the kernels first, at import of the test
module or in ``conftest.py``: ``lpsim.warmup(["nearest", "stochastic"], ops=False,
blocks=False, optim=False)`` (the modes and containers the tests use; leave the flags on
for tests of lpsim.ops, block formats or optimizer steps), or give the test
``@settings(deadline=None)``.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from ._extras import require

require("hypothesis", extra="test", feature="lpsim.testing")

from hypothesis import strategies as st  # noqa: E402

from . import reference
from .request import as_container_array, is_torch
from .formats import CONTAINERS, POLICIES, SPECIALS, Format, fp, parse_format

#: mismatches that assert_rounded lists
MAX_REPORTED = 5


def _container(dtype) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype not in CONTAINERS:
        raise ValueError(f"dtype={dtype} is not a container; accepted: float32, float64")
    return dtype


def _count(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name}={value!r} must be an integer >= {low}")
    return int(value)


def _bias_interval(e: int, m: int, policy: str, dtype: np.dtype) -> tuple[int, int]:
    """(lo, hi): the extra biases b with fp(e, m, b, policy) fitting ``dtype`` (lo > hi:
    none), from :meth:`lpsim.Format.fits`' three conditions solved for b."""
    cm, _, cemin, _ = CONTAINERS[dtype]
    cemax = np.finfo(dtype).maxexp - 1
    top = 2 ** e - 1
    if policy == "ieee" or (policy == "fn" and m == 0):
        top -= 1
    if m > cm:
        return 1, 0
    return top - 2 ** (e - 1) + 1 - cemax, 2 - 2 ** (e - 1) - m - (cemin - cm)


def formats(*, max_e: int = 8, max_m: int = 23, max_bias: int | None = 4, specials=SPECIALS,
            subnormals: bool | None = None, saturate: bool | None = False,
            dtype=np.float32) -> st.SearchStrategy[Format]:
    """Formats fp(e, m, b) with e <= max_e, m <= max_m, |b| <= max_bias that fit ``dtype``.

    specials: a policy name or a sequence of them (any of :data:`lpsim.formats.POLICIES`);
    subnormals, saturate: True, False or None (both); max_bias=None: every bias that fits
    ``dtype`` (the whole space a user can name: ``formats(max_e=11, max_m=52,
    max_bias=None, specials=POLICIES, saturate=None, dtype=np.float64)``).  The largest m
    and the extreme biases are drawn more often than their share.  Shrinks toward small
    e, m and b = 0, the first policy, subnormals on, no saturation.
    """
    dtype = _container(dtype)
    max_e, max_m = _count("max_e", max_e, 1), _count("max_m", max_m, 0)
    if max_bias is not None:
        max_bias = _count("max_bias", max_bias, 0)
    try:
        policies = (specials,) if isinstance(specials, str) else tuple(specials)
        unknown = [p for p in policies if not isinstance(p, str) or p not in POLICIES]
    except TypeError:                       # None, a number: not a sequence
        policies, unknown = (), [specials]
    if not policies or unknown:
        raise ValueError(f"specials={specials!r} is not a policy or a sequence of them; "
                         f"accepted: {', '.join(POLICIES)}")
    for name, value in (("subnormals", subnormals), ("saturate", saturate)):
        if not (value is None or isinstance(value, (bool, np.bool_))):    # 0 == False
            raise ValueError(f"{name}={value!r}; accepted: True, False or None (both)")
    table = {}   # policy -> e -> m -> (lo, hi), a non-empty interval of biases that fit
    for policy in policies:
        for e in range(1, min(max_e, 11) + 1):
            for m in range(min(max_m, 52) + 1):
                lo, hi = _bias_interval(e, m, policy, dtype)
                if max_bias is not None:
                    lo, hi = max(lo, -max_bias), min(hi, max_bias)
                if lo > hi:
                    continue
                try:
                    fp(e, m, min(max(0, lo), hi), specials=policy)
                except ValueError:   # e = 1 leaves ieee (and fn with m = 0) no normal numbers
                    continue
                table.setdefault(policy, {}).setdefault(e, {})[m] = (lo, hi)
    if not table:
        raise ValueError(f"no format with e <= {max_e}, m <= {max_m}, |b| <= {max_bias} and "
                         f"specials in {policies} fits a {dtype} container")
    subnormal_choices = (True, False) if subnormals is None else (subnormals,)
    saturate_choices = (False, True) if saturate is None else (saturate,)

    def edges(values):
        # every value, or (drawn as often) one of the two ends
        return st.sampled_from(values) | st.sampled_from([values[0], values[-1]])

    @st.composite
    def draw_format(draw):
        policy = draw(st.sampled_from([p for p in policies if p in table]))
        e = draw(st.sampled_from(sorted(table[policy])))
        m = draw(edges(sorted(table[policy][e])))
        lo, hi = table[policy][e][m]
        b = draw(st.integers(lo, hi) | st.sampled_from([lo, hi]))
        return fp(e, m, b, specials=policy, subnormals=draw(st.sampled_from(subnormal_choices)),
                  saturate=draw(st.sampled_from(saturate_choices)))

    return draw_format()


def _fitting(fmt, dtype) -> tuple[Format, np.dtype]:
    fmt, dtype = parse_format(fmt), _container(dtype)
    fmt.check_fits(dtype)
    return fmt, dtype


def _quantum(fmt: Format, code: int) -> int:
    """Exponent of the spacing of the values with exponent code ``code``."""
    if code == 0:
        return fmt.emin - fmt.m if fmt.subnormals else fmt.emin
    return code - fmt.bias - fmt.m


def _significands(fmt: Format, code: int) -> int:
    """How many significands the exponent code holds (subnormals off: code 0 holds only 0)."""
    if code == 0 and not fmt.subnormals:
        return 1
    return fmt.max_mantissa + 1 if code == fmt.top_finite_code else 2 ** fmt.m


def _signed(draw, value: float, dtype: np.dtype, fmt: Format | None = None):
    """+-value; with ``fmt``, only signs that its values have (none in fnu, no -0 in fnuz)."""
    if fmt is not None and not (fmt.signed and (value != 0 or fmt.has_negative_zero)):
        return dtype.type(value)
    return dtype.type(-value if draw(st.booleans()) else value)


def _lowest(fmt: Format) -> tuple[int, int]:
    """(exponent code, mantissa) of the smallest nonnegative value: fnu has no zero."""
    if fmt.specials != "fnu":
        return 0, 0
    return (0, 1) if fmt.subnormals and fmt.m else (1, 0)


def representable(fmt, *, dtype=np.float64, allow_nan: bool = False,
                  allow_infinity: bool = False) -> st.SearchStrategy:
    """Values of ``fmt`` (negatives, zero and -0 where it has them, subnormals if on) as
    ``dtype`` scalars: each rounds to itself in every mode.

    Uniform over exponent codes, then mantissas, so every binade is exercised; inf and NaN
    only where the format has them and they are allowed.
    """
    fmt, dtype = _fitting(fmt, dtype)
    first_code, first_mant = _lowest(fmt)

    @st.composite
    def draw_value(draw):
        code = draw(st.integers(first_code, fmt.top_finite_code))
        low = first_mant if code == first_code else 0
        mant = draw(st.integers(low, _significands(fmt, code) - 1))
        sig = mant if code == 0 else 2 ** fmt.m + mant
        return _signed(draw, math.ldexp(sig, _quantum(fmt, code)), dtype, fmt)

    specials = []
    if allow_infinity and fmt.has_inf:
        specials += [dtype.type(math.inf), dtype.type(-math.inf)]
    if allow_nan and fmt.has_nan:
        specials.append(dtype.type(math.nan))
    return st.one_of(draw_value(), st.sampled_from(specials)) if specials else draw_value()


def midpoints(fmt, *, dtype=np.float64) -> st.SearchStrategy:
    """Exact midpoints between adjacent finite values of ``fmt`` (negative ones where it has
    negatives; none below the smallest value of fnu, which has no zero) as ``dtype``.

    Ties are where the nearest modes differ; raises ValueError when ``dtype`` cannot hold
    them (they need m + 1 bits and one exponent below the format's finest spacing) or when
    the format has fewer than two finite values.
    """
    fmt, dtype = _fitting(fmt, dtype)
    cm, _, cemin, _ = CONTAINERS[dtype]
    finest = fmt.emin - fmt.m - 1
    if fmt.m + 1 > cm or finest < cemin - cm:
        raise ValueError(f"the midpoints of {fmt!r} do not fit a {dtype} container: they need "
                         f"{fmt.m + 1} mantissa bits and exponent 2**{finest}; use float64 "
                         "or a narrower format")
    top = fmt.top_finite_code
    last = top if _significands(fmt, top) > 1 else top - 1   # max_finite has no successor
    first_code, first_mant = _lowest(fmt)       # the midpoint above value (code, mantissa)
    if first_code > last or (first_code == last and
                             first_mant >= _significands(fmt, last) - (last == top)):
        raise ValueError(f"{fmt!r} has fewer than two finite values: no midpoints")

    @st.composite
    def draw_midpoint(draw):
        code = draw(st.integers(first_code, last))
        count = _significands(fmt, code) - (code == top)
        mant = draw(st.integers(first_mant if code == first_code else 0, count - 1))
        sig = mant if code == 0 else 2 ** fmt.m + mant
        return _signed(draw, math.ldexp(2 * sig + 1, _quantum(fmt, code) - 1), dtype, fmt)

    return draw_midpoint()


def _nudge(value, ulps: int, dtype: np.dtype):
    """``value`` moved ``ulps`` container ulps (toward +inf when positive)."""
    value = dtype.type(value)
    target = dtype.type(math.inf if ulps > 0 else -math.inf)
    with np.errstate(over="ignore"):   # past the container's largest finite: inf
        for _ in range(abs(ulps)):
            value = np.nextafter(value, target)
    return value


def near_overflow(fmt, *, dtype=np.float64) -> st.SearchStrategy:
    """Finite ``dtype`` values within a few quanta of +-max_finite, on both sides of it
    (+max_finite only where the format has no negatives).

    Offsets are whole, half and quarter quanta (the tie to the next would-be value among
    them) above max_finite, and quarters of the gap down to its predecessor below it (with
    m = 0 a quantum is max_finite itself), each nudged by up to two container ulps.
    """
    fmt, dtype = _fitting(fmt, dtype)
    top = reference.max_finite(fmt)
    quarter = Fraction(2) ** (fmt.emax - fmt.m - 2)
    below = (top - _predecessor(fmt)) / 4
    lowest = -4 if _predecessor(fmt) else -3        # not down to zero
    largest = np.finfo(dtype).max

    @st.composite
    def draw_value(draw):
        j = draw(st.integers(lowest, 8))
        target = top + j * (quarter if j > 0 else below)
        value = largest if target > Fraction(float(largest)) else dtype.type(float(target))
        value = _nudge(value, draw(st.integers(-2, 2)), dtype)
        return _signed(draw, float(min(value, largest)), dtype, fmt)

    return draw_value()


def _predecessor(fmt: Format) -> Fraction:
    """The largest value of ``fmt`` below max_finite (0 where it is the only positive one)."""
    mant, code = fmt.max_mantissa, fmt.top_finite_code
    if mant:
        return (2 ** fmt.m + mant - 1) * Fraction(2) ** (code - fmt.bias - fmt.m)
    if code > 1:                    # the top of the binade below
        return (2 ** (fmt.m + 1) - 1) * Fraction(2) ** (code - 1 - fmt.bias - fmt.m)
    if fmt.subnormals and fmt.m:
        return (2 ** fmt.m - 1) * Fraction(2) ** (fmt.emin - fmt.m)
    return Fraction(0)


def subnormals(fmt, *, dtype=np.float64) -> st.SearchStrategy:
    """Nonzero ``dtype`` values below min_normal in magnitude, both signs.

    The format's subnormals, midpoints and quarter points between them, and arbitrary
    container values in that range (the same range when the format flushes subnormals).
    ValueError where the container has no value below min_normal.
    """
    fmt, dtype = _fitting(fmt, dtype)
    below = np.nextafter(dtype.type(fmt.min_normal), dtype.type(0))
    tiny = np.nextafter(dtype.type(0), dtype.type(1))
    if below < tiny:
        raise ValueError(f"{fmt!r}'s smallest normal is the {dtype} container's smallest "
                         "positive value: no container value lies below it")
    quarter = fmt.emin - fmt.m - 2
    on_grid = st.integers(1, 2 ** (fmt.m + 2) - 1).map(
        lambda j: min(max(dtype.type(math.ldexp(j, quarter)), tiny), below))
    anywhere = st.floats(float(tiny), float(below), width=8 * dtype.itemsize)

    @st.composite
    def draw_value(draw):
        return _signed(draw, float(draw(st.one_of(on_grid, anywhere))), dtype)

    return draw_value()


def _show(value) -> str:
    """A container scalar in its own shortest decimal form and in exact hex; an exact
    value (an int beyond float64) as itself."""
    if isinstance(value, Fraction):
        return str(value)
    return f"{value!s} ({float(value).hex()})"


def _result_array(actual) -> np.ndarray:
    """``actual`` as a float32/float64 array, converted exactly; TypeError for results that
    are not real floating-point numbers or integers (complex, strings, objects)."""
    array = reference.torch_values(actual) if is_torch(actual) else np.asarray(actual)
    kind = array.dtype.kind
    if kind not in "fiu" and not (kind == "V" and array.dtype.itemsize <= 4
                                  and np.can_cast(array.dtype, np.float32)):
        raise TypeError(f"assert_rounded: actual has dtype {array.dtype}; accepted: real "
                        "floating-point numbers or integers (float16, bfloat16, float32, "
                        "float64 or integer arrays and scalars, any byte order)")
    return as_container_array(array, "actual")


def assert_rounded(actual, x, fmt, rounding: str = "nearest", *, uniforms=None, seed=None,
                   stream: int = 0, offset: int = 0, sr_bits=None) -> None:
    """Assert that ``actual`` is ``x`` rounded to ``fmt`` exactly, per :mod:`lpsim.rounding`.

    ``x`` is read as lpsim.quantize reads it, exactly (:func:`lpsim.reference.exact_input`:
    float16, bfloat16, integers, any byte order, Python ints beyond float64); ``actual``
    must be real floats or integers (TypeError otherwise).  NaN matches NaN and the sign of
    zero must match.  Stochastic modes need either ``uniforms`` (one u in [0, 1) per
    element, see :func:`lpsim.reference.round_exact`) or ``seed`` (with ``stream``,
    ``offset``: lpsim's own Philox bits, to check a kernel that draws them).  The
    AssertionError lists the first mismatches with x, expected and actual in float and hex.
    """
    array, exact = reference.exact_input(x)
    actual = _result_array(actual)
    if actual.shape != array.shape:
        raise AssertionError(f"assert_rounded: actual has shape {actual.shape}, x has "
                             f"{array.shape}")
    expected, _ = reference.quantize(x, fmt, rounding, uniforms=uniforms, seed=seed,
                                     stream=stream, offset=offset, sr_bits=sr_bits)
    got = actual.astype(np.float64)
    want = expected.astype(np.float64)
    same = (np.isnan(got) & np.isnan(want)) | ((got == want)
                                               & (np.signbit(got) == np.signbit(want)))
    wrong = np.argwhere(~same) if array.ndim else np.argwhere(~same[None])
    if wrong.size:
        lines = [f"assert_rounded: {len(wrong)} of {array.size} elements differ from the exact "
                 f"{rounding!r} rounding to {parse_format(fmt)!r}:"]
        for row in wrong[:MAX_REPORTED]:
            index = tuple(int(i) for i in row) if array.ndim else ()
            flat = int(np.ravel_multi_index(index, array.shape)) if array.ndim else 0
            shown = _show(exact[flat] if flat in exact else array[index])
            lines.append(f"  at {index}: x={shown} expected={_show(expected[index])} "
                         f"actual={_show(actual[index])}")
        raise AssertionError("\n".join(lines))


__all__ = ["formats", "representable", "midpoints", "near_overflow", "subnormals",
           "assert_rounded"]
