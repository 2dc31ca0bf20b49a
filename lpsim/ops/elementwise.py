"""Simulated elementwise arithmetic: add, sub, mul, div, fma, sqrt rounded once to a format.

Each result is computed exactly to odd in float64 (:mod:`lpsim.ops.exact`) and rounded
once to ``fmt`` with :func:`lpsim.quantize`'s kernel, so it is the correctly rounded exact
result, never a double rounding of a float64 one.  Exact, for every float32/float64 operand:
add, sub (TwoSum), mul, div, sqrt (FMA residuals; barring results below 2**-969 or float64
overflow).  fma(a, b, c) needs a*b exact in float64 (e.g. operands in a format that fits
float32, or in_fmt with m <= 25); otherwise it raises.  fmt must have m <= 50, or be fp64
with rounding="nearest" (the float64 operation itself).

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

import numpy as np
from numba import njit, prange

from ..formats import parse_format
from ..philox import LANES, WORD_BITS
from ..quantize import plan, round_into
from ..rounding import kernel_params
from .exact import check_exact, f2i, fma as fma_, product_to_odd, quotient_to_odd
from .exact import sqrt_to_odd, sum_to_odd
from .operands import as_array, round_inputs

ADD, SUB, MUL, DIV, FMA, SQRT = range(6)


@njit(parallel=True, cache=True)
def _to_odd(op, a, b, c, out, odd):
    """out[i] = bits of RO(op(a[i], b[i], c[i])) (odd) or of RN (not odd); returns the
    first index whose fma product is inexact, or -1."""
    n = out.size
    bad = np.full(n, False)
    for i in prange(n):
        x, y, z = a[i], b[i], c[i]
        if op == ADD or op == SUB:
            y = y if op == ADD else -y
            out[i] = sum_to_odd(x, y) if odd else f2i(x + y)
        elif op == MUL:
            out[i] = product_to_odd(x, y) if odd else f2i(x * y)
        elif op == DIV:
            out[i] = quotient_to_odd(x, y) if odd else f2i(x / y)
        elif op == SQRT:
            out[i] = sqrt_to_odd(x) if odd else f2i(np.sqrt(x))
        else:
            p = x * y
            bad[i] = fma_(x, y, -p) != 0.0
            out[i] = sum_to_odd(p, z) if odd else f2i(fma_(x, y, z))
    for i in range(n):
        if bad[i] and odd:
            return i
    return -1


_NAMES = {ADD: "add", SUB: "sub", MUL: "mul", DIV: "div", FMA: "fma", SQRT: "sqrt"}


def _apply(op, operands, fmt, rounding, in_fmt, seed, stream, sr_bits, stats, offset):
    name = _NAMES[op]
    names = ("a", "b", "c")[:len(operands)] if op != SQRT else ("x",)
    weak = [isinstance(x, (int, float)) and not isinstance(x, (bool, np.generic))
            for x in operands]
    scalar = all(np.ndim(x) == 0 and not isinstance(x, np.ndarray) for x in operands)
    arrays = [as_array(x, n, name) for x, n in zip(operands, names)]
    arrays = round_inputs(arrays, in_fmt, names, name)
    # numpy's result type, Python numbers as weak scalars
    dtype = np.result_type(*[float(o) if w else x for x, o, w in zip(arrays, operands, weak)])
    fmt = parse_format(fmt)
    request = plan(fmt, rounding, dtype, seed=seed, stream=stream, sr_bits=sr_bits,
                   offset=offset)   # validates fmt against the result container
    odd = check_exact(fmt, "fmt")
    if not odd and rounding != "nearest":
        raise ValueError(f"{name}: fmt=fp64 supports rounding='nearest' only, not "
                         f"{rounding!r}")
    try:
        shape = np.broadcast_shapes(*[x.shape for x in arrays])
    except ValueError:
        raise ValueError(f"{name}: operand shapes {[x.shape for x in arrays]} do not "
                         "broadcast") from None
    flat = [np.ascontiguousarray(np.broadcast_to(x, shape), np.float64).reshape(-1)
            for x in arrays]
    flat += [flat[0]] * (3 - len(flat))
    bits = np.empty(flat[0].size, np.int64)
    bad = _to_odd(op, flat[0], flat[1], flat[2], bits, odd)
    if bad >= 0:
        a, b = flat[0][bad], flat[1][bad]
        raise ValueError(f"fma: the product a*b = {a!r} * {b!r} (element {bad}) is not exact "
                         "in float64; accepted: operands whose product has at most 53 "
                         "significant bits (e.g. round them with in_fmt= to m <= 25)")
    # round in a float64 container, drawing random words as the result container would
    wide = request._replace(
        params=kernel_params(fmt, np.float64)._replace(W=WORD_BITS[dtype.itemsize]),
        lanes=LANES[dtype.itemsize])
    values = bits.view(np.float64)
    counts = round_into(values, values, wide)
    if stats is not None:
        stats.add(values.size, counts)
    result = values.astype(dtype).reshape(shape)
    if scalar:
        return float(result) if all(weak) else result[()]
    return result


def add(a, b, fmt, rounding="nearest", *, in_fmt=None, seed=None, stream=0, sr_bits=None,
        stats=None, offset=0):
    """fl(a + b) in ``fmt``: the exact sum rounded once (``rounding`` as in lpsim.quantize)."""
    return _apply(ADD, (a, b), fmt, rounding, in_fmt, seed, stream, sr_bits, stats, offset)


def sub(a, b, fmt, rounding="nearest", *, in_fmt=None, seed=None, stream=0, sr_bits=None,
        stats=None, offset=0):
    """fl(a - b) in ``fmt``: the exact difference rounded once."""
    return _apply(SUB, (a, b), fmt, rounding, in_fmt, seed, stream, sr_bits, stats, offset)


def mul(a, b, fmt, rounding="nearest", *, in_fmt=None, seed=None, stream=0, sr_bits=None,
        stats=None, offset=0):
    """fl(a * b) in ``fmt``: the exact product rounded once."""
    return _apply(MUL, (a, b), fmt, rounding, in_fmt, seed, stream, sr_bits, stats, offset)


def div(a, b, fmt, rounding="nearest", *, in_fmt=None, seed=None, stream=0, sr_bits=None,
        stats=None, offset=0):
    """fl(a / b) in ``fmt``: the exact quotient rounded once (b = 0 gives IEEE inf/NaN)."""
    return _apply(DIV, (a, b), fmt, rounding, in_fmt, seed, stream, sr_bits, stats, offset)


def fma(a, b, c, fmt, rounding="nearest", *, in_fmt=None, seed=None, stream=0, sr_bits=None,
        stats=None, offset=0):
    """fl(a * b + c) in ``fmt``: one rounding (a*b must be exact in float64, see above)."""
    return _apply(FMA, (a, b, c), fmt, rounding, in_fmt, seed, stream, sr_bits, stats, offset)


def sqrt(x, fmt, rounding="nearest", *, in_fmt=None, seed=None, stream=0, sr_bits=None,
         stats=None, offset=0):
    """fl(sqrt(x)) in ``fmt``: the exact root rounded once (x < 0 gives NaN)."""
    return _apply(SQRT, (x,), fmt, rounding, in_fmt, seed, stream, sr_bits, stats, offset)
