"""Simulated elementwise arithmetic: add, sub, mul, div, fma, sqrt rounded once to a format.

Each result is computed exactly to odd in float64 (:mod:`lpsim.exact`) and rounded
once to ``fmt`` with :func:`lpsim.quantize`'s kernel, so it is the correctly rounded exact
result, never a double rounding of a float64 one.  Exact, for every float32/float64 operand:
add, sub (TwoSum), mul, div, sqrt (FMA residuals; a dividend or radicand below 2**-900 is
scaled by a power of two first, so that its residual does not underflow).  fma(a, b, c)
needs a*b exact in float64 when it is a normal float64 of at least 2**-969 (e.g. operands in
a format that fits float32, or in_fmt with m <= 25); otherwise it raises.  fmt must have
m <= 50, or be fp64 with rounding="nearest" (the float64 operation itself).

Results outside float64's safe range (products and quotients below 2**-969, fma's products
below 2**-969 or beyond float64, any result at or beyond 2**1022) are computed exactly in
rational arithmetic and rounded by :func:`lpsim.reference.round_exact` with the same random
word.  An exact zero
sum (add, sub, fma) is +0, or -0 under rounding ``down`` (IEEE 754 section 6.3; the sum of
two zeros of one sign keeps it).

Arguments follow numpy: operands broadcast, ``out=`` takes an array of the result's shape
and dtype, and Python floats give a float.  ``in_fmt`` rounds the operands first; ``stats``
counts those roundings too.

Stochastic modes draw element i's word as ``lpsim.quantize`` does in the result's container
(counter offset + i, C order), so ``op(..., "stochastic", seed=s)`` equals
``quantize(exact result, fmt, "stochastic", seed=s)`` whenever the exact result is a
container value.  The decision is made on RO(exact result) in float64, which keeps 52 - m
bits of frac: in float32 containers (W = 32 random bits) with m <= 19 it is exactly SR of
the exact result; in float64 containers (W = 62) it is SR of RO(exact result), whose
round-up probability is within 2**(m-52) of the exact one.  Few-bit SR (sr_bits=k <= 52 - m)
and stochastic_equal are exact in both.
"""

from __future__ import annotations

import functools
import math
import threading
from fractions import Fraction
from typing import NamedTuple

import numpy as np
from numba import njit
from numba.extending import register_jitable

from .. import cpu
from ..cpu import params_of
from ..formats import parse_format
from ..philox import WORD_BITS, block_words, lane_word, random_words
from ..quantize import MAX_COUNTER, check_offset, keys, plan
from ..rounding import DOWN, STOCHASTIC, kernel_params, round_bits
from ..stats import COUNTERS, RoundingStats, check_stats, commit, staged
from ..exact import check_exact, f2i, fma as fma_, i2f, product_to_odd, quotient_to_odd
from ..exact import sqrt_to_odd, sum_to_odd, zero_sum_bits
from .operands import as_array, check_out, round_inputs

ADD, SUB, MUL, DIV, FMA, SQRT = range(6)
_NAMES = {ADD: "add", SUB: "sub", MUL: "mul", DIV: "div", FMA: "fma", SQRT: "sqrt"}
#: float64 results below this (nonzero) or at least HUGE take the exact path
TINY, HUGE = 2.0 ** -969, 2.0 ** 1022
#: div and sqrt scale operands below SCALE_BELOW by SCALE (sqrt: SCALE**2), exactly
SCALE_BELOW, SCALE = 2.0 ** -900, 2.0 ** 200


@register_jitable
def odd_bits(op, x, y, z, odd, mode):
    """(bits of RO(op(x, y, z)) or of RN when not odd, unsafe, product_inexact).

    unsafe: the float64 result is outside the safe range (the caller rounds it exactly);
    product_inexact: fma's x*y is not a float64.  An exact zero sum gets IEEE 754's sign for
    ``mode``: +0, or -0 under down, unless both terms are zeros of one sign.
    """
    inexact_product = False
    wild = False
    if op == ADD or op == SUB:
        y = y if op == ADD else -y
        rn = x + y
        bits = zero_sum_bits(sum_to_odd(x, y), rn, x, y, mode == DOWN) if odd else f2i(rn)
    elif op == MUL:
        rn = x * y
        bits = product_to_odd(x, y) if odd else f2i(rn)
    elif op == DIV:
        rn = x / y
        # a dividend below SCALE_BELOW may leave a residual a - q*b below float64's
        # subnormals: both operands scaled by SCALE give the same quotient, whose residual
        # is exact (a quotient below TINY takes the exact path)
        s = SCALE if abs(x) < SCALE_BELOW else 1.0
        bits = quotient_to_odd(x * s, y * s) if odd else f2i(rn)
    elif op == SQRT:
        rn = np.sqrt(x)
        # likewise x - r*r: x scaled by SCALE**2 has its root scaled by SCALE, scaled back
        # exactly (the root of a float64 is at least 2**-537, a normal number)
        s = SCALE if abs(x) < SCALE_BELOW else 1.0
        root = sqrt_to_odd(x * (s * s))
        bits = f2i(i2f(root) / s) if odd else f2i(rn)
    else:
        p = x * y
        # a product below TINY or beyond float64 (x, y finite and nonzero) is not a float64:
        # the exact path rounds x*y + z; an inf or NaN operand makes an IEEE product (inf -
        # inf is no residual)
        wild = (x != 0.0) & (y != 0.0) & ((abs(p) < TINY) | ~np.isfinite(p))
        inexact_product = odd and np.isfinite(x) and np.isfinite(y) and not wild and \
            fma_(x, y, -p) != 0.0
        rn = fma_(x, y, z)
        bits = zero_sum_bits(sum_to_odd(p, z), rn, p, z, mode == DOWN) if odd else f2i(rn)
        # a finite exact product that p misses (beyond float64) plus an infinite z is z,
        # where p + z would be inf - inf: NaN
        bits = f2i(z) if wild & np.isfinite(x) & np.isfinite(y) & np.isinf(z) else bits
    # & of the conditions, not `and`: no branches, so that a loop over elements vectorises
    finite = np.isfinite(x) & np.isfinite(y) & np.isfinite(z)
    nonzero = (x != 0.0) & ((y != 0.0) | (op == ADD) | (op == SUB) | (op == SQRT))
    tiny = (((op == MUL) | (op == DIV)) & (abs(rn) < TINY)) | wild
    unsafe = finite & nonzero & odd & ((abs(rn) >= HUGE) | tiny)
    return (np.int64(0) if unsafe else bits), unsafe, inexact_product


def _odd_kernel(op: int):
    """The array kernel of operation ``op``, a constant of its body, so that its loop is
    straight-line code that vectorises (one kernel taking op at run time ran scalar, at
    about 12 ns per element).

    kernel(a, b, c, out, odd, mode, exact): out[i] = odd_bits(a[i], b[i], c[i]), exact[i] =
    unsafe (out[i] = 0 there); returns (first index whose fma product is inexact or -1,
    number of unsafe results).
    """
    def kernel(a, b, c, out, odd, mode, exact):
        unsafe_count = 0
        bad_count = 0
        for i in range(out.size):
            # float32 operands widen exactly (the cached path passes them as they are)
            bits, unsafe, bad = odd_bits(op, np.float64(a[i]), np.float64(b[i]),
                                         np.float64(c[i]), odd, mode)
            out[i] = bits
            exact[i] = unsafe
            unsafe_count += unsafe
            bad_count += bad
        if bad_count:
            for i in range(out.size):
                if odd_bits(op, np.float64(a[i]), np.float64(b[i]), np.float64(c[i]), odd,
                            mode)[2]:
                    return i, unsafe_count
        return -1, unsafe_count

    kernel.__name__ = kernel.__qualname__ = f"to_odd_{_NAMES[op]}"   # a cache entry of its own
    # error_model numpy: x/0 is IEEE inf or NaN, no exception
    return njit(nogil=True, cache=True, error_model="numpy")(kernel)


#: op -> its array kernel (compiled on first use, cached on disk)
ODD_KERNELS = {op: _odd_kernel(op) for op in _NAMES}


@njit(nogil=True, cache=True, error_model="numpy")
def _scalar(op, x, y, z, odd, mode, k, pv, seed_lo, seed_hi, stream, offset, counts):
    """One element: (value, unsafe, product_inexact), rounded as the array path rounds it
    (the element's word at counter ``offset``; round_bits, which round_fast equals)."""
    bits, unsafe, bad = odd_bits(op, x, y, z, odd, mode)
    if unsafe or bad:
        return 0.0, unsafe, bad
    p = params_of(pv)
    r = np.int64(0)
    if mode >= STOCHASTIC:
        lanes = 4 if p.W == 32 else 2
        r = lane_word(block_words(offset // lanes, stream, seed_lo, seed_hi), offset % lanes,
                      lanes)
    out, flags = round_bits(bits, mode, r, k, p)
    counts[0] += 1
    for f in range(6):
        counts[1 + f] += (flags >> f) & 1
    return i2f(out), False, False


@functools.lru_cache(maxsize=1024, typed=True)     # typed: sr_bits=True is not sr_bits=1
def _route(name, fmt, rounding, dtype, sr_bits):
    """(fmt, mode, k, odd, pv, kernel) of one (op, fmt, rounding, dtype, sr_bits)."""
    fmt = parse_format(fmt)
    request = plan(fmt, rounding, dtype, sr_bits=sr_bits)   # validates fmt for the container
    odd = check_exact(fmt, "fmt")
    if not odd and rounding != "nearest":
        raise ValueError(f"{name}: fmt=fp64 supports rounding='nearest' only, not "
                         f"{rounding!r}")
    # rounded in a float64 container, drawing random words as the result container would
    params = kernel_params(fmt, np.float64)._replace(W=WORD_BITS[dtype.itemsize])
    return (fmt, request.mode, request.k, odd, np.array(params, np.int64),
            cpu.entry(request.mode, np.dtype(np.float64)))


def _result_dtype(arrays, weak):
    """numpy's result type, Python numbers as weak scalars (float64 if all are)."""
    strong = [x.dtype for x, w in zip(arrays, weak) if not w]
    if not strong:
        return _F64
    return max(strong, key=lambda d: d.itemsize)


_F64, _F32 = np.dtype(np.float64), np.dtype(np.float32)
_ndarray = np.ndarray


def _cached_route(name, fmt, rounding, dtype, sr_bits):
    try:
        return _route(name, fmt, rounding, dtype, sr_bits)
    except TypeError:          # an unhashable fmt or sr_bits: validate without the cache
        return _route.__wrapped__(name, fmt, rounding, dtype, sr_bits)


def _check_stats(name, stats):
    check_stats(stats, where=f"{name}: ")
    return stats.counts if stats is not None else _DISCARD


#: the counters of calls without stats (written, never read)
_DISCARD = np.zeros(cpu.NCOUNTS, np.int64)
#: elements up to which an array call works in buffers its thread keeps between calls:
#: fresh multi-page arrays fault in every page on first touch, which cost a 65536-element
#: add ten times its arithmetic
SCRATCH_MAX = 1 << 20
_scratch = threading.local()


def _buffers(n: int):
    """(float64 operand rows (3, n), int64 result bits (n), bool unsafe marks (n)): this
    thread's kept buffers up to SCRATCH_MAX elements, fresh arrays above.  Nothing returned
    to the caller aliases them (the result is a cast copy)."""
    if n > SCRATCH_MAX:
        return np.empty((3, n)), np.empty(n, np.int64), np.empty(n, np.bool_)
    held = getattr(_scratch, "buffers", None)
    if held is None or held[1].size < n:
        size = max(1 << max(n - 1, 1).bit_length(), 256)
        held = _scratch.buffers = (np.empty((3, size)), np.empty(size, np.int64),
                                   np.empty(size, np.bool_))
    rows, bits, exact = held
    return rows[:, :n], bits[:n], exact[:n]


#: _scalar's entry point, made on first use (see lpsim.cpu.entry_point)
_SCALAR = []
#: (op, fmt, rounding, result itemsize) -> (odd, mode, k, pv) of scalar calls to a
#: deterministic mode without sr_bits, validated once (the scalar fast paths of _apply)
_SCALARS: dict = {}
#: numpy scalar type -> (its container's itemsize, the container's scalar type, integral),
#: or None for a type the scalar fast path does not take; filled on first sight of a type
_SCALAR_KINDS: dict = {}


def _scalar_kind(kind):
    """_SCALAR_KINDS' entry of ``kind``: floats of at most 64 bits (float16 and ml_dtypes'
    bfloat16 widen to float32, as as_container_array widens them), integers (float64, when
    exact), not bools."""
    if not isinstance(kind, type) or not issubclass(kind, np.generic) or \
            issubclass(kind, np.bool_):
        return None
    try:
        dtype = as_array(kind(0), "x", "add").dtype
    except (TypeError, ValueError):
        return None
    return dtype.itemsize, dtype.type, issubclass(kind, np.integer)


def _remember_scalar(op, fmt, rounding, dtype, route):
    """Store the validated route of a scalar call (and make the scalar kernel's entry
    point, which the fast paths call, if no call has)."""
    if len(_SCALARS) >= 1024:           # a program whose formats moved on
        _SCALARS.clear()
    _, mode, k, odd, pv, _ = route
    if not _SCALAR:
        args = (op, 0.0, 0.0, 0.0, odd, mode, k, pv, 0, 0, 0, 0, _DISCARD)
        _SCALAR.append(cpu.entry_point(_scalar, args, "lpsim.ops' scalar kernel"))
    try:
        _SCALARS[op, fmt, rounding, dtype.itemsize] = odd, mode, k, pv
    except TypeError:                   # an unhashable fmt: validated each call
        pass


def _numpy_scalars(op, operands, fmt, rounding):
    """The result of a call on numpy scalars (float16/32/64, bfloat16, integers; Python
    floats and ints among them are weak, as numpy has them) to a deterministic mode with
    nothing else asked, once a call before validated its route; else None.  The same
    numpy scalar as the general path's: numpy's result type's container."""
    size = 0
    make = None
    for x in operands:
        kind = type(x)
        if kind is float:
            continue
        if kind is int:                 # weak; must be exact in float64
            try:
                if float(x) != x:
                    return None
            except OverflowError:
                return None
            continue
        try:
            found = _SCALAR_KINDS[kind]
        except KeyError:
            found = _SCALAR_KINDS[kind] = _scalar_kind(kind)
        if found is None:
            return None
        itemsize, container, integral = found
        if integral and int(x) != float(x):     # not exact in float64: the general path
            return None
        if itemsize > size:
            size, make = itemsize, container
    if not size:
        return None
    try:
        odd, mode, k, pv = _SCALARS[op, fmt, rounding, size]
    except (KeyError, TypeError):
        return None
    n = len(operands)
    x = float(operands[0])
    y = float(operands[1]) if n > 1 else x
    z = float(operands[2]) if n > 2 else x
    value, unsafe, bad = _SCALAR[0](op, x, y, z, odd, mode, k, pv, 0, 0, 0, 0, _DISCARD)
    if unsafe or bad:
        return None
    return make(value)


#: (op, fmt, rounding, dtype, sr_bits) -> _Fast
_FAST: dict = {}


class _Fast(NamedTuple):
    """What an array call of one (op, fmt, rounding, dtype, sr_bits) needs, worked out once."""

    mode: int
    k: int
    odd: bool
    pv: np.ndarray
    to_odd: object          # the compiled entry point of ODD_KERNELS[op]


def _fast_arrays(op, operands, fmt, rounding, seed, stream, sr_bits, stats, offset):
    """The result of the common array call (numpy float32/float64 operands of one shape and
    dtype, no in_fmt, no out) on a path without per-call Python work beyond the keys; None
    when the call is not one, or is one seen for the first time, or needs the exact path
    (the general path then does all of it)."""
    x = operands[0]
    dtype = x.dtype
    if dtype is not _F64 and dtype is not _F32:
        return None
    flat = []
    for y in operands:        # the kernel reads them in place: one layout, one signature
        if type(y) is not _ndarray or y.dtype is not dtype or y.shape != x.shape:
            return None
        flags = y.flags
        if not (flags.c_contiguous and flags.writeable):
            return None
        flat.append(y.reshape(-1))
    try:
        fast = _FAST[op, fmt, rounding, dtype, sr_bits, type(sr_bits)]
    except (KeyError, TypeError):
        return None
    if stats is None:
        counts = _DISCARD
    elif type(stats) is RoundingStats:
        counts = stats.counts
    else:
        return None
    n = x.size
    if type(offset) is not int or offset < 0 or offset + n > MAX_COUNTER:
        return None
    seed_lo, seed_hi, stream64 = keys(seed, stream, fast.mode)
    _, bits, exact = _buffers(n)
    bad, unsafe = fast.to_odd(flat[0], flat[1] if op != SQRT else flat[0],
                              flat[2] if op == FMA else flat[0], bits, fast.odd, fast.mode,
                              exact)
    if bad >= 0 or unsafe:
        return None
    values = bits.view(np.float64)
    cpu.run(values, values, fast.mode, fast.pv, fast.k, seed_lo, seed_hi, stream64, offset,
            counts)
    return values.astype(dtype).reshape(x.shape)


def _remember_fast(op, fmt, rounding, dtype, sr_bits, route, bits, exact):
    """Store the _Fast of a general-path call on ``dtype`` operands (its kernel for
    operands of that dtype, read in place, compiles now if it has not)."""
    _, mode, k, odd, pv, _ = route
    x = np.zeros(1, dtype)
    args = (x, x, x, bits, odd, mode, exact)
    to_odd = cpu.entry_point(ODD_KERNELS[op], args, "lpsim.ops' elementwise kernel")
    if len(_FAST) >= 1024:              # a program whose requests moved on: start afresh
        _FAST.clear()
    try:
        _FAST[op, fmt, rounding, dtype, sr_bits, type(sr_bits)] = _Fast(mode, k, odd, pv,
                                                                         to_odd)
    except TypeError:       # unhashable
        pass


def _apply(op, operands, fmt, rounding, in_fmt, seed, stream, sr_bits, stats, offset, out):
    """The public functions' call: with stats, counted into a staged object and added into
    ``stats`` only once the call has succeeded (lpsim.stats.staged)."""
    if stats is None:
        return _applied(op, operands, fmt, rounding, in_fmt, seed, stream, sr_bits, None,
                        offset, out)
    scratch = staged(stats)
    result = _applied(op, operands, fmt, rounding, in_fmt, seed, stream, sr_bits, scratch,
                      offset, out)
    commit(stats, scratch)
    return result


def _applied(op, operands, fmt, rounding, in_fmt, seed, stream, sr_bits, stats, offset, out):
    first = operands[0]
    if type(first) is float:
        # Python floats to a deterministic mode with nothing else asked: the scalar kernel
        # with the route a call before cached (_SCALARS), no validation left to do
        try:
            scalar = _SCALARS[op, fmt, rounding, 8]
        except (KeyError, TypeError):           # unhashable: validated below, by name
            scalar = None
        if (scalar is not None and type(operands[-1]) is float and stats is None
                and seed is None and sr_bits is None and in_fmt is None and out is None
                and type(stream) is int is type(offset) and not (stream or offset)
                and (len(operands) < 3 or type(operands[1]) is float)):
            odd, mode, k, pv = scalar
            y = operands[1] if len(operands) > 1 else first
            z = operands[2] if len(operands) > 2 else first
            value, unsafe, bad = _SCALAR[0](op, first, y, z, odd, mode, k, pv, 0, 0, 0, 0,
                                            _DISCARD)
            if not (unsafe or bad):
                return value
    elif in_fmt is None and out is None and type(first) is _ndarray:
        result = _fast_arrays(op, operands, fmt, rounding, seed, stream, sr_bits, stats,
                              offset)
        if result is not None:
            return result
    if (type(operands[-1]) is not _ndarray and stats is None and seed is None
            and sr_bits is None and in_fmt is None and out is None
            and type(stream) is int is type(offset) and not (stream or offset)):
        # numpy scalars (what indexing an array gives): the same scalar kernel
        result = _numpy_scalars(op, operands, fmt, rounding)
        if result is not None:
            return result
    name = _NAMES[op]
    if in_fmt is None and out is None and all(type(x) is float for x in operands):
        # Python floats: one compiled call, no arrays
        given_fmt = fmt
        fmt, mode, k, odd, pv, _ = _cached_route(name, fmt, rounding, _F64, sr_bits)
        counts = _check_stats(name, stats)
        offset = check_offset(offset, 1)
        seed_lo, seed_hi, stream64 = keys(seed, stream, mode)
        x, y, z = (tuple(operands) + (operands[0],) * 2)[:3]
        args = (op, x, y, z, odd, mode, k, pv, seed_lo, seed_hi, stream64, offset, counts)
        if not _SCALAR:
            _SCALAR.append(cpu.entry_point(_scalar, args, "lpsim.ops' scalar kernel"))
        value, unsafe, bad = _SCALAR[0](*args)
        if sr_bits is None and mode < STOCHASTIC:
            _remember_scalar(op, given_fmt, rounding, _F64, (fmt, mode, k, odd, pv, None))
        if not (unsafe or bad):
            return value
    names = ("a", "b", "c")[:len(operands)] if op != SQRT else ("x",)
    weak = [type(x) is float or (isinstance(x, int) and not isinstance(x, (bool, np.generic)))
            for x in operands]
    scalar = all(type(x) is float or np.ndim(x) == 0 and not isinstance(x, np.ndarray)
                 for x in operands)
    arrays = [as_array(x, n, name) for x, n in zip(operands, names)]
    if in_fmt is not None:
        _check_stats(name, stats)
        arrays = round_inputs(arrays, in_fmt, names, name, stats)
    dtype = _result_dtype(arrays, weak)
    given = fmt
    route = fmt, mode, k, odd, pv, _ = _cached_route(name, fmt, rounding, dtype, sr_bits)
    counts = _check_stats(name, stats)
    if scalar and sr_bits is None and mode < STOCHASTIC and in_fmt is None:
        _remember_scalar(op, given, rounding, dtype, route)
    shapes = [x.shape for x in arrays]
    if all(s == shapes[0] for s in shapes):
        shape = shapes[0]
    else:
        try:
            shape = np.broadcast_shapes(*shapes)
        except ValueError:
            raise ValueError(f"{name}: operand shapes {shapes} do not broadcast") from None
    if out is not None:
        check_out(out, shape, dtype, name)
    n = math.prod(shape)
    offset = check_offset(offset, n)
    seed_lo, seed_hi, stream64 = keys(seed, stream, mode)
    rows, bits, exact = _buffers(n)
    flat = []
    for x, row in zip(arrays, rows):
        np.copyto(row.reshape(shape), x)            # broadcast, as float64
        flat.append(row)
    flat += [flat[0]] * (3 - len(flat))
    kernel = ODD_KERNELS[op]
    with cpu.first_call(kernel, f"lpsim.ops' elementwise kernel of {name}"):
        bad, unsafe = kernel(flat[0], flat[1], flat[2], bits, odd, mode, exact)
    if bad >= 0:
        a, b = flat[0][bad], flat[1][bad]
        raise ValueError(f"fma: the product a*b = {a!r} * {b!r} (element {bad}) is not exact "
                         "in float64; accepted: operands whose product has at most 53 "
                         "significant bits (e.g. round them with in_fmt= to m <= 25)")
    values = bits.view(np.float64)
    cpu.run(values, values, mode, pv, k, seed_lo, seed_hi, stream64, offset, counts)
    if in_fmt is None and out is None and not unsafe and all(type(x) is _ndarray
                                                             for x in operands):
        _remember_fast(op, given, rounding, dtype, sr_bits, route, bits, exact)
    if unsafe:
        _round_exactly(op, flat, np.flatnonzero(exact), values, fmt, rounding, k, dtype,
                       (seed_lo | seed_hi << 32, stream64 % (1 << 64), offset), counts)
    result = values.astype(dtype).reshape(shape)
    if out is not None:
        out[...] = result
        return out
    if scalar:
        return float(result) if all(weak) else result[()]
    return result


def _round_exactly(op, flat, where, values, fmt, rounding, k, dtype, key, counts):
    """Round the results at ``where`` from their exact rational values (rare: results
    outside float64's safe range); values[i] was 0 there and counted as exact."""
    from ..reference import round_exact
    seed, stream, offset = key
    width = WORD_BITS[dtype.itemsize]
    for i in where:
        x, y, z = (Fraction(float(v[i])) for v in flat)
        exact = {ADD: lambda: x + y, SUB: lambda: x - y, MUL: lambda: x * y,
                 DIV: lambda: x / y, FMA: lambda: x * y + z}[op]()
        uniform = None
        if rounding in ("stochastic", "stochastic_equal"):
            word = random_words(1, dtype.itemsize, seed, stream, offset + int(i))[0]
            uniform = Fraction(word, 2 ** width)
        few = k if rounding == "stochastic" and k < width else None
        result = round_exact(exact, fmt, rounding, uniform=uniform, sr_bits=few)
        values[i] = float(result.value)
        if exact == 0 and op in (ADD, SUB, FMA):    # a Fraction has no signed zero
            values[i] = _zero_sum(op, *(float(v[i]) for v in flat), rounding)
        counts[1:] += [int(c in result.flags) for c in COUNTERS]


def _zero_sum(op, x, y, z, rounding) -> float:
    """The exact zero sum of add, sub or fma with IEEE 754's sign (section 6.3), as
    :func:`lpsim.exact.zero_sum_bits` gives it on the float64 path: two zero terms of one
    sign keep it; otherwise +0, or -0 under rounding down."""
    if op == FMA:
        first = math.copysign(0.0, x) * math.copysign(1.0, y) if x == 0 or y == 0 else 1.0
        second = z
    else:
        first, second = x, (-y if op == SUB else y)
    if first == 0 and second == 0 and math.copysign(1, first) == math.copysign(1, second):
        return first
    return -0.0 if rounding == "down" else 0.0


def add(a, b, fmt, rounding="nearest", *, in_fmt=None, seed=None, stream=0, sr_bits=None,
        stats=None, offset=0, out=None):
    """fl(a + b) in ``fmt``: the exact sum rounded once (``rounding`` as in lpsim.quantize)."""
    return _apply(ADD, (a, b), fmt, rounding, in_fmt, seed, stream, sr_bits, stats, offset, out)


def sub(a, b, fmt, rounding="nearest", *, in_fmt=None, seed=None, stream=0, sr_bits=None,
        stats=None, offset=0, out=None):
    """fl(a - b) in ``fmt``: the exact difference rounded once."""
    return _apply(SUB, (a, b), fmt, rounding, in_fmt, seed, stream, sr_bits, stats, offset, out)


def mul(a, b, fmt, rounding="nearest", *, in_fmt=None, seed=None, stream=0, sr_bits=None,
        stats=None, offset=0, out=None):
    """fl(a * b) in ``fmt``: the exact product rounded once."""
    return _apply(MUL, (a, b), fmt, rounding, in_fmt, seed, stream, sr_bits, stats, offset, out)


def div(a, b, fmt, rounding="nearest", *, in_fmt=None, seed=None, stream=0, sr_bits=None,
        stats=None, offset=0, out=None):
    """fl(a / b) in ``fmt``: the exact quotient rounded once (b = 0 gives IEEE inf/NaN)."""
    return _apply(DIV, (a, b), fmt, rounding, in_fmt, seed, stream, sr_bits, stats, offset, out)


def fma(a, b, c, fmt, rounding="nearest", *, in_fmt=None, seed=None, stream=0, sr_bits=None,
        stats=None, offset=0, out=None):
    """fl(a * b + c) in ``fmt``: one rounding (a*b must be exact in float64, see above)."""
    return _apply(FMA, (a, b, c), fmt, rounding, in_fmt, seed, stream, sr_bits, stats, offset,
                  out)


def sqrt(x, fmt, rounding="nearest", *, in_fmt=None, seed=None, stream=0, sr_bits=None,
         stats=None, offset=0, out=None):
    """fl(sqrt(x)) in ``fmt``: the exact root rounded once (x < 0 gives NaN)."""
    return _apply(SQRT, (x,), fmt, rounding, in_fmt, seed, stream, sr_bits, stats, offset, out)
