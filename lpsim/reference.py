"""A slow, exact reference rounding in rational arithmetic, to check any kernel against.

Written from the semantic contract in :mod:`lpsim.rounding` (quantum, keep, frac, per-mode
increment, overflow, specials, flags) with :class:`fractions.Fraction` and no float in any
decision, so it is an oracle independent of the bit-level kernels.  It works for every
format, whether or not it fits a container; only :func:`quantize` needs a container.
"""

from __future__ import annotations

import math
from fractions import Fraction
from numbers import Rational
from typing import NamedTuple

import numpy as np

from .formats import Format, parse_format
from .philox import WORD_BITS, random_words
from .request import as_container_array, exact_in_float64, is_torch, plan
from .rounding import MODES, STOCHASTIC_MODES
from .stats import COUNTERS, RoundingStats

#: enumerate_values refuses formats with more nonnegative values than this
MAX_ENUMERATED = 1 << 22


class Rounded(NamedTuple):
    """The rounded value and the flags (a frozenset of :data:`lpsim.stats.COUNTERS` names).

    value is a nonzero :class:`Fraction` for finite nonzero results and a float for +-0.0,
    +-inf and nan, so that the sign of zero survives.
    """

    value: Fraction | float
    flags: frozenset


def _pow2(k: int) -> Fraction:
    return Fraction(2 ** k) if k >= 0 else Fraction(1, 2 ** -k)


def _floor_log2(a: Fraction) -> int:
    """floor(log2 a) for a > 0, exactly."""
    k = a.numerator.bit_length() - a.denominator.bit_length()
    return k if a >= _pow2(k) else k - 1


def max_finite(fmt: Format) -> Fraction:
    """The largest finite value of ``fmt``, exactly."""
    return (2 ** fmt.m + fmt.max_mantissa) * _pow2(fmt.emax - fmt.m)


def enumerate_values(fmt) -> list[Fraction]:
    """Every nonnegative finite value of ``fmt``, ascending (the negatives mirror them).

    Built from the encoding (exponent code, stored mantissa), not from the rounding rule,
    so tests can check the rounding against the neighbours it should pick.
    """
    fmt = parse_format(fmt)
    count = (fmt.top_finite_code + 1) << fmt.m
    if count > MAX_ENUMERATED:
        raise ValueError(f"{fmt!r} has about {count} nonnegative values; enumerate_values "
                         f"accepts formats with at most {MAX_ENUMERATED} (e.g. 8- to 16-bit)")
    values = [Fraction(0)] if fmt.specials != "fnu" else []     # fnu has no zero
    if fmt.subnormals:
        values += [mant * _pow2(fmt.emin - fmt.m) for mant in range(1, 2 ** fmt.m)]
    for code in range(1, fmt.top_finite_code + 1):
        top = fmt.max_mantissa if code == fmt.top_finite_code else 2 ** fmt.m - 1
        scale = _pow2(code - fmt.bias - fmt.m)
        values += [(2 ** fmt.m + mant) * scale for mant in range(top + 1)]
    return values


def _as_fraction(x) -> Fraction | float:
    """x as an exact Fraction, or as a float when it is a zero, inf or nan."""
    if isinstance(x, (bool, np.bool_)):
        raise TypeError(f"cannot round {x!r}; accepted: a Fraction, int or float")
    if isinstance(x, (float, np.floating)):
        if isinstance(x, np.floating) and x.dtype.itemsize > 8 and np.isfinite(x) and x != 0:
            return Fraction(*x.as_integer_ratio())  # a long double: its own exact value
        x = float(x)
        return x if x == 0 or not math.isfinite(x) else Fraction(x)
    if isinstance(x, (Rational, np.integer)):
        value = Fraction(int(x)) if isinstance(x, np.integer) else Fraction(x)
        return value if value != 0 else 0.0
    raise TypeError(f"cannot round a {type(x).__name__} ({x!r}); accepted: a Fraction, int "
                    "or float")


def as_uniform(u, name: str = "uniform") -> Fraction:
    """A stochastic rounding's uniform u in [0, 1) as an exact Fraction: a Fraction, int, or
    Python or numpy float of any width (its own exact value); anything else is refused."""
    if isinstance(u, (bool, np.bool_)) or not isinstance(
            u, (Rational, float, np.floating, np.integer)):
        raise TypeError(f"{name}={u!r} is a {type(u).__name__}; accepted: a Fraction, int or "
                        "float (Python or numpy) with 0 <= u < 1")
    if isinstance(u, (float, np.floating)):
        if not np.isfinite(u):
            raise ValueError(f"{name}={u!r} is not finite; accepted: 0 <= u < 1")
        value = Fraction(*u.as_integer_ratio())
    else:
        value = Fraction(int(u)) if isinstance(u, np.integer) else Fraction(u)
    if not 0 <= value < 1:
        raise ValueError(f"{name}={u!r} is out of range; accepted: 0 <= u < 1")
    return value


def torch_values(t) -> np.ndarray:
    """A torch tensor's values as a numpy array on the host: bfloat16 and float16 widened
    to float32 (exact; numpy has no bfloat16), other dtypes as they are."""
    t = t.detach().cpu()
    return (t.float() if t.dtype.is_floating_point and t.element_size() < 4 else t).numpy()


def exact_input(x) -> tuple[np.ndarray, dict]:
    """``x`` as lpsim.quantize reads it: (its container array, {flat index: exact value} for
    the elements that array does not hold exactly).

    float16, bfloat16 (ml_dtypes or torch), integer and big-endian arrays convert exactly
    (:func:`lpsim.request.as_container_array`); a Python or numpy int beyond float64 and a
    long double scalar keep their exact value, as do such ints in a list or tuple (float64
    container).  Other input is refused with lpsim.quantize's errors.
    """
    if isinstance(x, (bool, np.bool_)):
        raise TypeError(f"cannot round a bool ({x!r}); accepted: numbers and float arrays")
    if isinstance(x, (int, np.integer)):
        exact = {} if exact_in_float64(int(x)) else {0: Fraction(int(x))}
        return np.array(float(x) if not exact else 0.0), exact
    if isinstance(x, np.floating) and x.dtype.itemsize > 8:
        wide = np.float64(x)
        if not np.isfinite(x) or np.longdouble(wide) == x:
            return np.array(wide), {}
        return np.array(0.0), {0: Fraction(*x.as_integer_ratio())}
    if is_torch(x):
        x = torch_values(x)
    if isinstance(x, (list, tuple)):
        try:
            objects = np.array(x, dtype=object)
        except (ValueError, TypeError):
            objects = None
        flat = [] if objects is None else list(objects.reshape(-1))
        ints = [i for i, v in enumerate(flat) if isinstance(v, (int, np.integer))
                and not isinstance(v, (bool, np.bool_)) and not -2 ** 53 <= v <= 2 ** 53]
        if ints:        # the ints numpy may round or refuse
            big = {i: Fraction(int(flat[i])) for i in ints if not exact_in_float64(int(flat[i]))}
            for i in ints:
                flat[i] = 0.0 if i in big else float(flat[i])
            array = as_container_array(flat).astype(np.float64)
            return array.reshape(objects.shape), big
    return as_container_array(x), {}


def _code_is_odd(fmt: Format, keep: int, ex: int) -> bool:
    """Whether keep quanta is encoded with last bit 1: its mantissa's, with m = 0 its exponent's.

    The contract's "even" and "odd": with m = 0 every normal significand is the implicit 1,
    so the exponent code (ex + bias) is the last bit that tells neighbours apart.
    """
    if fmt.m == 0 and keep:
        return (ex + fmt.bias) % 2 == 1
    return keep % 2 == 1


def _increment(rounding, odd, frac, negative, uniform, sr_bits) -> int:
    """1 when |x| = (keep + frac) quanta, 0 < frac < 1, rounds up in magnitude; else 0.

    odd: whether keep's encoding ends in 1 (see :func:`_code_is_odd`).
    """
    half = Fraction(1, 2)
    match rounding:
        case "nearest":
            return int(frac > half or (frac == half and odd))
        case "nearest_away":
            return int(frac >= half)
        case "toward_zero":
            return 0
        case "up":
            return int(not negative)
        case "down":
            return int(negative)
        case "odd":
            return int(not odd)
        case "stochastic" if sr_bits is None:
            return int(uniform < frac)
        case "stochastic":
            scale = 2 ** sr_bits
            return int(math.floor(uniform * scale) < math.floor(frac * scale))
        case "stochastic_equal":
            return int(uniform >= half)
    raise AssertionError(rounding)


def _overflow_result(fmt: Format, rounding: str, negative: bool) -> Fraction | float:
    """What a finite overflow becomes: +-inf (nan in fn) or +-max_finite, per the contract."""
    to_infinity = {"toward_zero": False, "odd": False, "up": not negative,
                   "down": negative}.get(rounding, True)
    if fmt.saturate or not to_infinity:
        return -max_finite(fmt) if negative else max_finite(fmt)
    if fmt.specials != "ieee":
        return math.nan
    return -math.inf if negative else math.inf


def _check_request(rounding, uniform, sr_bits):
    if rounding not in MODES:
        raise ValueError(f"unknown rounding {rounding!r}; accepted: {', '.join(MODES)}")
    if rounding in STOCHASTIC_MODES:
        if uniform is None:
            raise ValueError(f"rounding={rounding!r} needs uniform=u, a Fraction, int or "
                             "float (Python or numpy) with 0 <= u < 1")
    if sr_bits is not None and (rounding != "stochastic" or isinstance(sr_bits, bool)
                                or not isinstance(sr_bits, (int, np.integer)) or sr_bits < 1):
        raise ValueError(f"sr_bits={sr_bits!r} with rounding={rounding!r}; accepted: a "
                         "positive integer with 'stochastic', or None")


def round_exact(x, fmt, rounding: str = "nearest", *, uniform=None,
                sr_bits=None) -> Rounded:
    """Round ``x`` (Fraction, int or float, incl. +-0.0, +-inf, nan) to ``fmt`` exactly.

    The contract of :mod:`lpsim.rounding`.  Stochastic modes need ``uniform`` u in [0, 1):
    ``stochastic`` rounds up in magnitude iff u < frac, or with ``sr_bits=k`` iff
    floor(u 2**k) < floor(frac 2**k); ``stochastic_equal`` iff u >= 1/2.
    """
    fmt = parse_format(fmt)
    _check_request(rounding, uniform, sr_bits)
    if rounding in STOCHASTIC_MODES:
        uniform = as_uniform(uniform)
    value = _as_fraction(x)
    if isinstance(value, float):
        if math.isnan(value):
            return Rounded(value, frozenset({"nan"}))
        if value == 0 and fmt.specials == "fnu":
            return Rounded(math.nan, frozenset({"inexact"}))    # no zero in fnu
        if value == 0:
            return Rounded(value if fmt.has_negative_zero else 0.0, frozenset())
        negative = value < 0
        if fmt.specials == "ieee":
            return Rounded(value, frozenset({"inf"}))
        if negative and not fmt.signed:                 # fnu has no negatives, -inf too
            return Rounded(math.nan, frozenset({"inf", "inexact"}))
        out = (-max_finite(fmt) if negative else max_finite(fmt)) if fmt.saturate else math.nan
        return Rounded(out, frozenset({"inf", "inexact"}))   # the result differs from x

    negative = value < 0
    if negative and not fmt.signed:
        return Rounded(math.nan, frozenset({"inexact"}))        # no negatives in fnu
    a = abs(value)
    ex = _floor_log2(a)
    if ex >= fmt.emin:
        q = ex - fmt.m
    else:
        q = fmt.emin - fmt.m if fmt.subnormals else fmt.emin
    scaled = a / _pow2(q)
    keep = math.floor(scaled)
    frac = scaled - keep
    odd = _code_is_odd(fmt, keep, ex)
    inc = _increment(rounding, odd, frac, negative, uniform, sr_bits) if frac else 0
    magnitude = (keep + inc) * _pow2(q)

    flags = set()
    if magnitude > max_finite(fmt):
        flags.add("overflow")
        out = _overflow_result(fmt, rounding, negative)
    elif magnitude == 0 and fmt.specials == "fnu":
        flags.add("underflow")              # no zero: the smallest value
        out = _pow2(q)
        if out < _pow2(fmt.emin):
            flags.add("subnormal")
    elif magnitude == 0:
        flags.add("underflow")
        out = -0.0 if negative and fmt.has_negative_zero else 0.0
    else:
        if magnitude < _pow2(fmt.emin):
            flags.add("subnormal")
        out = -magnitude if negative else magnitude
    if isinstance(out, float) or out != value:
        flags.add("inexact")
    return Rounded(out, frozenset(flags))


def quantize(x, fmt, rounding: str = "nearest", *, seed=None, stream: int = 0,
             offset: int = 0, sr_bits=None, uniforms=None):
    """Round ``x`` element by element with :func:`round_exact`, from the exact values
    lpsim.quantize reads (:func:`exact_input`).

    Returns (array of x's shape and container dtype, :class:`RoundingStats`).  Stochastic modes take
    element i's uniform from ``uniforms[i]`` (C order) or, given ``seed``, from lpsim's
    Philox mapping (u = R / 2**W, counter offset + i), reproducing ``lpsim.quantize`` bit
    for bit.  NaN inputs are returned unchanged, produced NaNs are the positive quiet NaN.
    Bad input gets lpsim.quantize's errors; stochastic modes need exactly one of seed and
    uniforms (ValueError).
    """
    x, exact = exact_input(x)
    stochastic = rounding in STOCHASTIC_MODES
    if stochastic and (seed is None) == (uniforms is None):
        raise ValueError(f"rounding={rounding!r} needs exactly one of seed=... (lpsim's random "
                         "bits) and uniforms=... (one u in [0, 1) per element)")
    # the kernels' own validation: format, rounding, container, sr_bits, seed, stream, offset
    request = plan(fmt, rounding, x.dtype, seed=seed, stream=stream, sr_bits=sr_bits,
                   offset=offset)
    fmt = parse_format(fmt)
    flat = x.reshape(-1)
    width = WORD_BITS[x.dtype.itemsize]
    if stochastic and uniforms is None:
        words = random_words(flat.size, x.dtype.itemsize, seed, stream, offset)
        uniforms = [Fraction(r, 2 ** width) for r in words]
    elif stochastic:
        uniforms = list(np.asarray(uniforms, dtype=object).reshape(-1))
        if len(uniforms) != flat.size:
            raise ValueError(f"uniforms has {len(uniforms)} elements; accepted: one per element "
                             f"of x ({flat.size})")
        uniforms = [as_uniform(u, f"uniforms[{i}]") for i, u in enumerate(uniforms)]
    # few-bit SR only below W bits (all W bits is exact SR); stochastic_equal ignores it
    sr_bits = request.k if rounding == "stochastic" and request.k < width else None
    out = np.empty_like(flat)
    stats = RoundingStats()
    counts = dict.fromkeys(COUNTERS, 0)
    for i, xi in enumerate(flat):
        if i not in exact and np.isnan(xi):
            out[i] = xi
            counts["nan"] += 1
            continue
        u = uniforms[i] if stochastic else None
        value, flags = round_exact(exact.get(i, float(xi)), fmt, rounding, uniform=u,
                                   sr_bits=sr_bits)
        out[i] = float(value)      # exact: the format fits the container
        for name in flags:
            counts[name] += 1
    stats.add(flat.size, [counts[name] for name in COUNTERS])
    return out.reshape(x.shape), stats


__all__ = ["round_exact", "quantize", "enumerate_values", "max_finite", "Rounded"]


def _ceil_log2(a: Fraction) -> int:
    k = _floor_log2(a)
    return k if a == _pow2(k) else k + 1


def _round_value(x, fmt, rounding="nearest"):
    """round_exact's value as a Fraction (0 for zeros)."""
    value = round_exact(x, fmt, rounding).value
    return Fraction(0) if value == 0 else value


def block_scale_exact(amax: Fraction, bfmt, pts: Fraction = Fraction(1)):
    """(scale, clipped) of a block with largest magnitude ``amax`` under ``bfmt``'s rule.

    Written from the table in :mod:`lpsim.blocks` with Fractions: exponents by exact
    floor/ceil of log2, float32 steps by :func:`round_exact` to fp32.
    """
    from .blocks.formats import parse_block_format
    bfmt = parse_block_format(bfmt)
    el, sc = bfmt.saturating_element, bfmt.scale
    fp32 = parse_format("fp32")
    smin, smax = Fraction(sc.min_subnormal), max_finite(sc)
    if bfmt.pow2:
        if amax == 0:
            return smin, False
        if bfmt.rule == "rceil":
            d = _round_value(amax / max_finite(el), fp32)
            if d == 0:
                return smin, True
            if d == math.inf:               # beyond float32 (float64 data): the largest
                return smax, True
            ex = _ceil_log2(d)
        elif bfmt.rule == "even":
            q = _pow2(_floor_log2(amax) - el.m)
            ex = _floor_log2(math.floor(amax / q + Fraction(1, 2)) * q) - el.emax
        elif bfmt.rule == "ceil":
            ex = _ceil_log2(amax) - el.emax
        else:
            ex = _floor_log2(amax) - el.emax
        scale = _pow2(ex)
        if scale < smin:
            return smin, True
        if scale > smax:
            return smax, True
        return scale, False
    t = _round_value(amax / max_finite(el), fp32)
    if bfmt.tensor_scale:
        t = _round_value(t / pts, fp32)
    if t < smin:
        return smin, amax != 0
    if t > smax:
        return smax, True
    mode = {"floor": "down", "even": "nearest"}.get(bfmt.rule, "up")
    return _round_value(t, sc, mode), False


def tensor_scale_exact(x, bfmt) -> Fraction:
    """The per-tensor scale of the array ``x`` under ``bfmt`` (which has one), from the
    table in :mod:`lpsim.blocks`: amax32 = fp32(largest finite |x|), saturated at float32's
    largest value; fp32(amax32 / fp32(scale max * element max)), at least
    :func:`lpsim.blocks.amax.min_tensor_scale`; 1 for a tensor without a nonzero finite value."""
    from .blocks.amax import min_tensor_scale
    from .blocks.formats import parse_block_format
    bfmt = parse_block_format(bfmt)
    finite = [abs(Fraction(float(v))) for v in np.asarray(x).reshape(-1)
              if math.isfinite(float(v))]
    amax = max(finite, default=Fraction(0))
    if amax == 0:
        return Fraction(1)
    amax32 = _round_value(amax, parse_format("fp(8,23,0,saturate=True)"))
    divisor = _round_value(max_finite(bfmt.scale) * max_finite(bfmt.element),
                           parse_format("fp32"))
    # the quotient saturated at float32's largest value, as the amax (it passes float32's
    # range where scale max * element max < 1)
    pts = _round_value(amax32 / divisor, parse_format("fp(8,23,0,saturate=True)"))
    return max(pts, Fraction(min_tensor_scale(bfmt)))


def quantize_blocks(x, bfmt, rounding: str = "nearest", *, uniforms=None, sr_bits=None,
                    tensor_scale=None):
    """Block-quantize the rows of a 2-D float32/float64 array exactly (blocks along axis 1).

    Returns (values, elements q, scales, counts) as
    :func:`lpsim.blocks.fake_quantize.quantize_blocks` does, counts per block in
    :data:`lpsim.blocks.counters.BLOCK_COUNTERS` order.  Stochastic modes take element
    (row, i)'s uniform from ``uniforms[row, i]``.  A format with a per-tensor
    scale takes ``tensor_scale`` (a float32), by default :func:`tensor_scale_exact` of x.
    """
    from .blocks.counters import BLOCK_COUNTERS
    from .blocks.formats import parse_block_format
    bfmt = parse_block_format(bfmt)
    x = np.asarray(x)
    if x.ndim != 2 or x.dtype not in (np.float32, np.float64):
        raise ValueError(f"x must be a 2-D float32/float64 array (rows of blocks), not "
                         f"{x.dtype} of shape {x.shape}")
    if bfmt.tensor_scale and tensor_scale is None:
        tensor_scale = tensor_scale_exact(x, bfmt)
    if sr_bits is not None and sr_bits >= WORD_BITS[x.dtype.itemsize]:
        sr_bits = None                      # every random bit: exact SR, as the kernels
    el = bfmt.saturating_element
    fp32 = parse_format("fp32")
    container = parse_format("fp32" if x.dtype == np.float32 else "fp64")
    rows, length = x.shape
    nblk = -(-length // bfmt.block)
    values = np.empty_like(x)
    elements = np.empty(x.shape, np.float64)
    scales = np.empty((rows, nblk), np.float64)
    counts = np.zeros((rows, nblk, len(BLOCK_COUNTERS)), np.int64)
    pts = Fraction(1) if tensor_scale is None else Fraction(tensor_scale)
    for row in range(rows):
        for j in range(nblk):
            idx = range(j * bfmt.block, min((j + 1) * bfmt.block, length))
            block = [float(x[row, i]) for i in idx]
            c = counts[row, j]
            finite = [abs(Fraction(v)) for v in block if math.isfinite(v)]
            if len(finite) < len(block) and bfmt.nonfinite == "nan":
                c[8] = 1
                c[4] = sum(math.isnan(v) for v in block)
                c[5] = sum(math.isinf(v) for v in block)
                values[row, idx.start:idx.stop] = np.nan
                elements[row, idx.start:idx.stop] = np.nan
                scales[row, j] = np.nan
                continue
            amax = max(finite, default=Fraction(0))
            s, clipped = block_scale_exact(amax, bfmt, pts)
            c[6] = clipped
            scales[row, j] = float(s)
            if not bfmt.pow2:
                one = Fraction(1) if not bfmt.tensor_scale else \
                    _round_value(1 / pts, fp32)
                recip = _round_value(one / s, fp32)
            nonzero = 0
            for i, v in zip(idx, block):
                if bfmt.pow2 or not math.isfinite(v):
                    y = v if not math.isfinite(v) or v == 0 else Fraction(v) / s
                else:
                    y = v if v == 0 else _round_value(Fraction(v) * recip, fp32)
                if isinstance(y, Fraction) and y == 0:
                    y = math.copysign(0.0, v)
                u = None if uniforms is None else uniforms[row][i]
                if isinstance(y, float) and math.isnan(y):
                    q, flags = y, frozenset({"nan"})
                else:
                    q, flags = round_exact(y, el, rounding, uniform=u, sr_bits=sr_bits)
                for f, name in enumerate(COUNTERS):
                    c[f] += name in flags
                elements[row, i] = float(q)
                nonzero += int(q != 0)          # inf and NaN elements are not flushed
                if isinstance(q, Fraction):
                    scaled = q * s * (pts if bfmt.tensor_scale else 1)
                    # round_exact's value: a product that underflows keeps q's sign
                    values[row, i] = float(round_exact(scaled, container).value)
                else:
                    values[row, i] = q * float(s) if math.isfinite(q) else q
            c[7] = int(amax != 0 and nonzero == 0)
    return values, elements, scales, counts
