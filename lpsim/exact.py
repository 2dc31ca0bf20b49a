"""Exact float64 building blocks for the simulated operations: bitcasts, FMA, round-to-odd.

Every simulated step computes its result *to odd* in float64: the float64 nearest ``s`` and
the exact error ``e`` (TwoSum, or an FMA residual for products, quotients and roots) give
RO(x), the float64 number next to x whose last bit is odd when x is not a float64.
Rounding RO(x) once more to any format with m <= 50 (and spacing >= 2**-1072) gives the
same result as rounding x itself, in every deterministic mode (Boldo & Melquiond,
"Emulation of FMA and correctly rounded sums: proved algorithms using rounding to odd",
IEEE TC 2008), so a step is rounded once, never twice.  Exact barring float64 overflow and,
for products, quotients and roots, results below 2**-969, and quotients whose dividend is
below it (their FMA residual underflows: lpsim.ops scales such operands up first).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, register_jitable

#: formats with more mantissa bits than this cannot be rounded exactly from RO(x)
MAX_M = 50
#: and their finest spacing must be at least 2**FINEST (two guard bits in float64)
FINEST = -1072


@intrinsic
def f2i(typingctx, x):
    """The int64 bit pattern of a float64 (a register bitcast)."""
    if x != types.float64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))
    return types.int64(types.float64), codegen


@intrinsic
def i2f(typingctx, b):
    """The float64 whose bit pattern is the int64 ``b``."""
    if b != types.int64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())
    return types.float64(types.int64), codegen


@intrinsic
def fma(typingctx, a, b, c):
    """a*b + c rounded once to float64 (llvm.fma: hardware FMA, or libm's exact fallback)."""
    if not all(t == types.float64 for t in (a, b, c)):
        return None

    def codegen(context, builder, signature, args):
        return builder.fma(*args)
    return types.float64(types.float64, types.float64, types.float64), codegen


@register_jitable(inline="always")
def to_odd(s, e):
    """Bits of RO(s + e), where s = RN(s + e) and e is the exact error (its sign is enough).

    When e != 0 and s has an even last bit, step one ulp toward e.  A NaN e (s is inf or
    NaN) leaves s alone.
    """
    sb = f2i(s)
    jam = ((e > 0.0) | (e < 0.0)) & ((sb & 1) == 0)
    step = np.int64(1) if (e > 0.0) == (s > 0.0) else np.int64(-1)
    return sb + step * np.int64(jam)


@register_jitable(inline="always")
def sum_to_odd(x, y):
    """Bits of RO(x + y) (TwoSum, Knuth: six float64 operations, no branch)."""
    s = x + y
    bb = s - x
    e = (x - (s - bb)) + (y - bb)
    return to_odd(s, e)


@register_jitable(inline="always")
def product_to_odd(a, b):
    """Bits of RO(a * b): the FMA residual a*b - RN(a*b) is exact."""
    p = a * b
    return to_odd(p, fma(a, b, -p))


@register_jitable(inline="always")
def quotient_to_odd(a, b):
    """Bits of RO(a / b): r = a - q*b is exact and a/b - q has the sign of r*b."""
    q = a / b
    r = fma(-q, b, a)
    return to_odd(q, r if b > 0.0 else -r)


@register_jitable(inline="always")
def sqrt_to_odd(x):
    """Bits of RO(sqrt(x)): r = x - s*s is exact and sqrt(x) - s has the sign of r."""
    s = np.sqrt(x)
    return to_odd(s, fma(-s, s, x))


def check_exact(fmt, what: str) -> bool:
    """Whether ``fmt`` is rounded from RO(x) (True) or is float64 itself (False, RN only).

    Raises ValueError for formats in between (51 or 52 mantissa bits other than fp64, or
    spacing below 2**-1072), which one float64 intermediate cannot round exactly.
    """
    if fmt.m <= MAX_M and fmt.emin - fmt.m >= FINEST:
        return True
    if (fmt.e, fmt.m, fmt.b, fmt.subnormals, fmt.specials, fmt.saturate) == \
            (11, 52, 0, True, "ieee", False):
        return False
    raise ValueError(f"{what}={fmt!r} cannot be simulated exactly: a float64 intermediate "
                     f"rounds exactly to formats with m <= {MAX_M} and spacing >= "
                     f"2**{FINEST}, or to fp64 itself (nearest only)")


#: the -0.0 bit pattern
NEG_ZERO = np.int64(-(1 << 63))


@register_jitable
def zero_sum_bits(bits, s, x, y, down):
    """``bits`` of the sum s = x + y, with IEEE 754's sign when the sum is exactly zero: +0,
    or -0 under rounding down, unless x and y are zeros of one sign (section 6.3)."""
    # branch-free (integer masks), so that the GEMM's lane loops still vectorise
    same = np.int64(x == 0.0) & np.int64(y == 0.0) & np.int64(f2i(x) == f2i(y))
    flip = -(np.int64(s == 0.0) & np.int64(down) & (1 - same))      # 0 or all ones
    return (bits & ~flip) | (NEG_ZERO & flip)


@register_jitable
def step_sum_to_odd(x, y, down):
    """Bits of RO(x + y) for an accumulation step, an exact zero sum signed as IEEE 754
    says (:func:`zero_sum_bits`).  The sum stays far inside float64: the terms are products
    of operands that fit float32 (below 2**256) and accumulator values."""
    return zero_sum_bits(sum_to_odd(x, y), x + y, x, y, down)
