"""The inner s-step recurrence (Algorithm 1, lines 5-13) as jitted scalar steps shared by the
CPU simulator (numba.njit) and the GPU kernels (numba.cuda.jit, :mod:`lpsim_cuda.casgd`).

For inner step j and row i of its block (row = j b + i), with every operation rounded to
nearest at u_c and the residual rounded once to u_sigma:

    corr  = G[row, :jb] . delta_c[:jb]      (order below; inputs rounded to u_c)
    z     = fl_c(fl_c(r_row) + fl_c(alpha_c corr))     (z = fl_c(r_row) when j = 0)
    delta = fl_sigma(residual(z, y_row)),  delta_c = fl_c(delta)

The dot's order is part of the contract, so CPU and GPU agree bit for bit: 32 lane sums,
lane l adding k = l, l+32, ... in turn, then a pairwise tree (l += l+16, +8, +4, +2, +1).
Each step is one float64 operation rounded to the slot format with :func:`lpsim.rounding.
round_bits`; products of slot values are exact in float64 and, for formats with at most 25
significand bits, a float64 sum rounded to nearest equals the exactly rounded sum (Figueroa,
"When is double rounding innocuous?", 1995), so each step is rounded once.  The residual is
evaluated in float64 with :func:`exp_fma` (explicit FMAs, so no compiler contraction can
change a bit) and rounded once to u_sigma.
"""

from __future__ import annotations

from fractions import Fraction
import math

import numpy as np
from numba import njit
from numba.extending import overload, register_jitable

from ..formats import Format
from .. import exact
from ..rounding import NEAREST, kernel_params, round_bits

LOGISTIC, LINEAR, POISSON = 0, 1, 2
LOSS_CODES = {"logistic": LOGISTIC, "linear": LINEAR, "poisson": POISSON}
#: lane sums of the correction dot (one warp on the GPU)
DOT_LANES = 32
#: most significand bits (m + 1) of a slot format rounded once from a float64 step; fp64
#: itself (the float64 step is the result) is also accepted
MAX_P = 25


def supported_format(fmt: Format) -> bool:
    """Whether the shared steps round to ``fmt`` exactly (m + 1 <= 25, or fp64 itself)."""
    return fmt.m + 1 <= MAX_P or (fmt.m == 52 and fmt.e == 11 and fmt.bias == 1023
                                  and fmt.subnormals)


def slot_params(fmt: Format) -> tuple:
    """The rounding core's parameters of ``fmt`` in a float64 container, as a plain tuple;
    for IEEE fp32 the empty tuple :data:`FP32_PARAMS` (:func:`round_nearest`)."""
    p = tuple(kernel_params(fmt, np.float64))
    return FP32_PARAMS if (p[7], p[8], p[9], p[11], p[13]) == _FP32_KEY else p


# --- bitcasts and FMA: numba intrinsics when compiled, plain Python under the simulator ----
def f2i(x):
    """The int64 bit pattern of float64(x)."""
    return np.int64(np.float64(x).view(np.int64))


def i2f(b):
    """The float64 whose bit pattern is the int64 ``b``."""
    return float(np.int64(b).view(np.float64))


def fma(a, b, c):
    """a*b + c rounded once to float64 (llvm.fma when compiled, exact fractions otherwise)."""
    a, b, c = float(a), float(b), float(c)
    if not (math.isfinite(a) and math.isfinite(b) and math.isfinite(c)):
        return a * b + c
    exact_value = Fraction(a) * Fraction(b) + Fraction(c)
    try:
        out = float(exact_value)       # correctly rounded, ties to even
    except OverflowError:
        return math.inf if exact_value > 0 else -math.inf
    if exact_value == 0:               # IEEE 754 6.3: -0 only when both addends are -0
        negative = math.copysign(1.0, a * b) < 0 and math.copysign(1.0, c) < 0
        return -0.0 if negative else 0.0
    return out


@overload(f2i)
def _f2i(x):
    return lambda x: exact.f2i(np.float64(x))


@overload(i2f)
def _i2f(b):
    return lambda b: exact.i2f(np.int64(b))


@overload(fma)
def _fma(a, b, c):
    return lambda a, b, c: exact.fma(np.float64(a), np.float64(b), np.float64(c))


# --- the shared steps -------------------------------------------------------------------
#: the params of IEEE binary32 in a float64 container (emin, m, qsub, maxb, ovf_inf): there a
#: float32 conversion (IEEE round to nearest even, subnormals kept) is the rounding
_FP32_KEY = (-126, 23, -149, int(np.float64(np.finfo(np.float32).max).view(np.int64)),
             0x7FF0000000000000)
#: :func:`slot_params` of IEEE fp32: a type of its own, so compiled steps of an fp32 slot
#: hold the hardware conversion alone, not the general rounding beside it
FP32_PARAMS = ()
#: (2 - 2**-24) 2**127: from here on round to nearest even gives inf
_FP32_INF_FROM = 3.4028235677973366e+38


@register_jitable
def _nearest_fp32(v):
    """float64 ``v`` rounded to IEEE fp32 by the hardware conversion; NaN as it is."""
    if v != v:
        return v
    if abs(v) >= _FP32_INF_FROM:     # (no overflow warning from numpy in the simulator)
        return math.copysign(math.inf, v)
    return np.float64(np.float32(v))


@register_jitable
def _nearest_params(v, p):
    """float64 ``v`` rounded to nearest by the rounding core with params ``p``."""
    bits, _ = round_bits(f2i(v), NEAREST, np.int64(0), np.int64(62), p)
    return i2f(bits)


def round_nearest(v, p):
    """float64 ``v`` rounded to nearest in the format of params ``p`` (:func:`slot_params`;
    float64 container): IEEE fp32 by the hardware conversion (the same decision, far fewer
    instructions), any other format by the rounding core; NaN is returned as it is."""
    return _nearest_fp32(v) if len(p) == 0 else _nearest_params(v, p)


@overload(round_nearest)
def _round_nearest(v, p):
    if len(p) == 0:                  # chosen by p's type: one path compiled, not both
        return lambda v, p: _nearest_fp32(v)
    return lambda v, p: _nearest_params(v, p)


_INV_LN2 = 1.4426950408889634
_LN2_HI = 0.6931471803691238      # 2**-1 * 1.0111... with its low 32 bits zero
_LN2_LO = 1.9082149292705877e-10
_EXP_COEFFS = tuple(1.0 / math.factorial(k) for k in range(13, -1, -1))


@register_jitable
def exp_fma(x):
    """exp(x) in float64 from FMAs only: the same bits on every target (error ~1 ulp).

    x = k ln2 + r with |r| <= ln2/2 (Cody-Waite), exp(r) by its degree-13 Taylor polynomial
    in Horner form, times 2**k built from its bit pattern.
    """
    if x != x:
        return x
    if x > 709.8:
        return math.inf
    if x < -745.2:
        return 0.0
    k = math.floor(fma(x, _INV_LN2, 0.5))
    r = fma(-k, _LN2_HI, x)
    r = fma(-k, _LN2_LO, r)
    p = _EXP_COEFFS[0]
    for i in range(1, 14):
        p = fma(p, r, _EXP_COEFFS[i])
    ki = np.int64(k)
    if ki > 1023:
        return p * 2.0 * i2f(np.int64(ki - 1 + 1023) << 52)
    if ki < -1022:
        return p * i2f(np.int64(ki + 600 + 1023) << 52) * i2f(np.int64(-600 + 1023) << 52)
    return p * i2f(np.int64(ki + 1023) << 52)


@register_jitable
def residual(loss, z, y):
    """delta(z, y) = -dL/dz in float64: y / (1 + exp(y z)) (logistic, y = +-1), y - z
    (linear), y - exp(z) (Poisson); Section 3.1."""
    z = np.float64(z)
    y = np.float64(y)
    if loss == LOGISTIC:
        return y / (1.0 + exp_fma(y * z))
    if loss == LINEAR:
        return y - z
    return y - exp_fma(z)


@njit(cache=True)
def residuals(loss, z, y):
    """:func:`residual` of each (z, y) pair: the jitted steps' float64 values for numpy."""
    out = np.empty(z.size)
    for i in range(z.size):
        out[i] = residual(loss, z[i], y[i])
    return out


@register_jitable
def _product(g, d, pc):
    """fl_c(fl_c(g) d): one product of the correction dot (g from G, d a delta_c)."""
    return round_nearest(round_nearest(np.float64(g), pc) * np.float64(d), pc)


@register_jitable
def lane_sum(G, row, delta_c, upto, lane, pc):
    """Lane ``lane``'s part of the correction dot: sum of fl_c(G[row, k]) delta_c[k] over
    k = lane, lane + 32, ... < upto, each product and sum rounded to u_c.

    Four terms at a time, their eight loads first: none depends on the sum, so a GPU issues
    them together and waits for memory once, not four times (the sums keep their order)."""
    acc = 0.0
    k = lane
    while k + 3 * DOT_LANES < upto:
        g0, g1 = G[row, k], G[row, k + DOT_LANES]
        g2, g3 = G[row, k + 2 * DOT_LANES], G[row, k + 3 * DOT_LANES]
        d0, d1 = delta_c[k], delta_c[k + DOT_LANES]
        d2, d3 = delta_c[k + 2 * DOT_LANES], delta_c[k + 3 * DOT_LANES]
        acc = round_nearest(acc + _product(g0, d0, pc), pc)
        acc = round_nearest(acc + _product(g1, d1, pc), pc)
        acc = round_nearest(acc + _product(g2, d2, pc), pc)
        acc = round_nearest(acc + _product(g3, d3, pc), pc)
        k += 4 * DOT_LANES
    while k < upto:
        acc = round_nearest(acc + _product(G[row, k], delta_c[k], pc), pc)
        k += DOT_LANES
    return acc


@register_jitable
def tree_add(a, b, pc):
    """One node of the lane tree: fl_c(a + b)."""
    return round_nearest(a + b, pc)


@register_jitable
def finish_row(r_i, corr, y_i, first, alpha_c, loss, pc, ps):
    """(delta, delta_c) of one row from its margin r_i and correction dot ``corr``."""
    r_c = round_nearest(np.float64(r_i), pc)
    if first:
        z = r_c
    else:
        z = round_nearest(r_c + round_nearest(alpha_c * corr, pc), pc)
    d = round_nearest(residual(loss, z, y_i), ps)
    return d, round_nearest(d, pc)


@register_jitable
def row_step(r, G, y, delta, delta_c, row, upto, alpha_c, loss, pc, ps, lanes):
    """One row of the recurrence on one thread: the 32 lane sums, the tree, the residual."""
    for lane in range(DOT_LANES):
        lanes[lane] = lane_sum(G, row, delta_c, upto, lane, pc)
    width = DOT_LANES // 2
    while width > 0:
        for lane in range(width):
            lanes[lane] = tree_add(lanes[lane], lanes[lane + width], pc)
        width //= 2
    d, dc = finish_row(r[row], lanes[0], y[row], upto == 0, alpha_c, loss, pc, ps)
    delta[row] = d
    delta_c[row] = dc


@njit(cache=True)
def inner_recurrence_cpu(r, G, y, delta, delta_c, b, s, alpha_c, loss, pc, ps):
    """The s inner steps on the CPU: delta (u_sigma values) and delta_c (at u_c) of s*b rows."""
    lanes = np.zeros(DOT_LANES)
    for j in range(s):
        for i in range(b):
            row_step(r, G, y, delta, delta_c, j * b + i, j * b, alpha_c, loss, pc, ps, lanes)


def inner_args(recipe, loss: str, alpha: float):
    """(alpha_c, loss code, pc, ps): the recurrence's scalars for a recipe.

    alpha is stored at u_c (a step of the correction), rounded to nearest.
    """
    pc, ps = slot_params(recipe.u_c.fmt), slot_params(recipe.u_sigma.fmt)
    return round_nearest(float(alpha), pc), LOSS_CODES[loss], pc, ps


def jitted_recipe(recipe) -> str | None:
    """None when the shared steps model ``recipe``'s u_c and u_sigma exactly, else why not."""
    for name in ("u_c", "u_sigma"):
        slot = getattr(recipe, name)
        if slot.rounding != "nearest":
            return f"{name}={slot!r} rounds {slot.rounding!r} (the shared steps round to nearest)"
        if not supported_format(slot.fmt):
            return (f"{name}={slot!r} has {slot.fmt.m + 1} significand bits (the shared steps "
                    f"take at most {MAX_P}, or fp64)")
    return None
