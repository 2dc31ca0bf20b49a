"""The scalar decisions both block kernels share: a block's scale (:func:`block_scale`, the
rules of :mod:`lpsim.blocks`' table), the reciprocal that scales its elements
(:func:`block_recip`) and the element step (:func:`element_fast`, :func:`element_fast32`,
:func:`element_exact`), with what they read (:class:`BlockParams`, made by
:func:`block_params`; the element's Params, :func:`_element_params`).

These are ``register_jitable`` functions: the CPU kernels (:mod:`lpsim.blocks.kernels`,
:mod:`lpsim.blocks.words`) and the CUDA kernel (``lpsim_cuda.blocks``) compile this code
itself, so the paths agree bit for bit by construction rather than by copying.
:func:`words_exact` and :func:`nearest_words_exact` say where the float32 steps give the
float64 step's results.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
from numba.extending import overload, register_jitable

from ..formats import Format
from ..philox import block_words, lane_word
from ..rounding import (DOWN, INEXACT, NEAREST, OVERFLOW, STOCHASTIC, UP, Params, fast_sub_ok,
                        kernel_params, nearest32, nearest32_exact, pack_conditions, round_bits,
                        round_fast_sub, round_fast_sub_conditions, round_sr_word_conditions)
from ..word32 import bits_float32, float32_bits, like, word
from .formats import CEIL, EVEN, FLOOR, PRESETS, RCEIL, RULES, BlockFormat

_MAG64 = np.int64(0x7FFFFFFFFFFFFFFF)
_SIGN64 = np.int64(-0x8000000000000000)
_NORMAL64 = np.int64(1) << 52                  # 2**-1022, float64's smallest normal


class BlockParams(NamedTuple):
    """What the block kernels need besides the element and scale Params; floats are float64."""

    block: int
    rule: int
    pow2: int
    emax_e: int      # element format's largest exponent
    m_e: int         # element mantissa bits
    max_e: float     # element format's largest value
    smin_exp: int    # power-of-two scales: exponent range
    smax_exp: int
    smin: float      # smallest and largest scale values
    smax: float
    nonfinite_nan: int
    pts: float       # per-tensor scale (1.0 without)
    pts_inv: float   # fp32(1 / pts)
    f32: int         # 1: float32 arrays take the element step on 32-bit words (element_fast32)
    near32: int      # 1: ... and nearest rounding its float32 add (element_nearest32)
    snear32: int     # 1: scales rounded to nearest by nearest32 (scale_words)


def f2i(v):
    """The int64 bit pattern of float64 ``v`` (compiled: a register bitcast; Python, as the
    CUDA simulator runs it: a numpy view)."""
    return np.float64(v).view(np.int64)


def i2f(b):
    """The float64 whose bit pattern is the int64 ``b``."""
    return np.int64(b).view(np.float64)


@overload(f2i)
def _f2i_compiled(v):
    from ..exact import f2i as bitcast
    return lambda v: bitcast(np.float64(v))


@overload(i2f)
def _i2f_compiled(b):
    from ..exact import i2f as bitcast
    return lambda b: bitcast(np.int64(b))


@register_jitable
def ilog2(v):
    """floor(log2 v) of a positive finite float64, and whether v is a power of two."""
    b = f2i(v)
    field_ = b >> 52
    frac = b & ((np.int64(1) << 52) - 1)
    if field_ == 0:                               # float64 subnormal
        top = 0
        while (frac >> (top + 1)) != 0:
            top += 1
        return top - 1074, frac == (np.int64(1) << top)
    return field_ - 1023, frac == 0


@register_jitable
def block_scale(amax, bp, sp):
    """(scale s, clipped) for a block of largest magnitude ``amax`` (finite, >= 0).

    The one scale decision of both kernels (the table in the module docstring).
    """
    if bp.pow2:
        if amax == 0:
            return bp.smin, 0
        if bp.rule == RCEIL:
            d = np.float64(np.float32(amax / bp.max_e))
            if d == 0:
                return bp.smin, 1
            ex, exact = ilog2(d)
            ex += 1 - np.int64(exact)
        else:
            a = amax
            if bp.rule == EVEN:                    # round to the element's mantissa bits
                a = i2f((f2i(amax) + (np.int64(1) << (51 - bp.m_e)))
                        & ~((np.int64(1) << 52) - 1))
            ex, exact = ilog2(a)
            if bp.rule == CEIL:
                ex += 1 - np.int64(exact)
            ex -= bp.emax_e
        if ex < bp.smin_exp:
            return bp.smin, 1
        if ex > bp.smax_exp:
            return bp.smax, 1
        return i2f((ex + 1023) << 52), 0
    t = np.float64(np.float32(amax / bp.max_e))
    if bp.pts != 1.0:
        t = np.float64(np.float32(t / bp.pts))
    if t < bp.smin:
        return bp.smin, np.int64(amax != 0)
    if t > bp.smax:
        return bp.smax, 1
    bits, _ = round_scale(f2i(t), _scale_mode(bp.rule), sp)
    return i2f(bits), 0


@register_jitable
def _scale_mode(rule):
    if rule == FLOOR:
        return DOWN
    if rule == EVEN:
        return NEAREST
    return UP


@register_jitable
def round_scale(bits, mode, sp):
    return round_bits(bits, mode, 0, 64, sp)


@register_jitable
def scale_recip(s, bp):
    """fp32 reciprocal that multiplies the elements under a non-power-of-two scale."""
    if bp.pts != 1.0:
        return np.float64(np.float32(bp.pts_inv / s))
    return np.float64(np.float32(1.0 / s))


@register_jitable
def scaled_bits(xv, s, recip, bp):
    """float64 bits of x / s: x * (1/s), exact for power-of-two scales; else fp32(x * recip)
    with recip the float32 reciprocal (torchao, TransformerEngine)."""
    if bp.pow2:
        b = f2i(np.float64(xv) * recip)        # recip = 1/s exactly: x / s, exact ...
        if (b & _MAG64) < _NORMAL64 and xv != 0:
            # ... but where it falls below float64's normals (float64 data under a large
            # scale), where it was rounded: 2**-1022 of its sign stands in, which every
            # element format a block format takes (smallest value >= 2**ELEMENT_EXP_MIN)
            # rounds and counts as it does the exact quotient
            b = (b & _SIGN64) | _NORMAL64
        return b
    return f2i(np.float64(np.float32(np.float64(xv) * recip)))


@register_jitable
def dequantize_element(q, s, bp):
    """q * s (* pts) in float64: exact for the small formats (one rounding to the container)."""
    if bp.pts != 1.0:
        return q * s * bp.pts
    return q * s


@register_jitable
def block_recip(s, bp):
    """The factor that scales a block's elements: 1/s (exact) for power-of-two scales, else
    the float32 reciprocal of :func:`scale_recip`."""
    if bp.pow2:
        # 2**-e from 2**e by its exponent field (exact, no division), for float64 normals
        # 2**e and 2**-e, as every power-of-two scale format lpsim accepts has; NaN stays NaN
        b = f2i(s)
        if s == s and (np.int64(1) << 52) < b < (np.int64(2046) << 52):
            return i2f((np.int64(2046) << 52) - b)
        return 1.0 / s
    return scale_recip(s, bp)


@register_jitable(forceinline=True)
def element_fast(xv, recip, s, mode, r, k, p, bp):
    """The straight-line element step: (q, q * s, ok, flags) of x in a block of scale ``s``.

    x / s (:func:`scaled_bits`) rounded by :func:`lpsim.rounding.round_fast_sub`; where ``ok``
    is 0 (NaN, inf, float64 subnormals) q is x / s unchanged and :func:`element_exact`
    decides.  No branch on the data, so a loop over it vectorises.
    """
    b, ok, flags = round_fast_sub(scaled_bits(xv, s, recip, bp), mode, r, k, p)
    q = i2f(b)
    return q, dequantize_element(q, s, bp), ok, flags


@register_jitable(forceinline=True)
def _exact_product(xv, yb):
    """0 where the float32 product x * recip (bits ``yb``) underflowed to 0 from x != 0 (a
    float32 subnormal product fails :func:`lpsim.rounding.fast_sub_ok` already), else 1."""
    return like(yb, ((yb & 0x7FFFFFFF) != 0) | ((float32_bits(xv) & 0x7FFFFFFF) == 0))


@register_jitable(forceinline=True)
def element_ok32(xv, recip, p):
    """:func:`element_fast32`'s ``ok`` alone (where the exact step must run instead)."""
    yb = float32_bits(xv * recip)
    return fast_sub_ok(yb, p) & _exact_product(xv, yb)


@register_jitable(forceinline=True)
def element_fast32(xv, r, recip, s, mode, k, p, bp):
    """:func:`element_fast` of a float32 element in float32 arithmetic on 32-bit words
    (:mod:`lpsim.word32`: eight AVX2 lanes), ``recip``, ``s`` and ``r`` float32 and a word,
    ``p`` the element's float32-container Params; where :func:`words_exact` holds, the same
    (q, q * s, ok, flags).

    x * recip is x / s exactly when the scale is a power of two and the product a float32
    normal (or x is 0: ``ok`` is 0 for a product that underflowed), and is the definition
    (fp32(x * r)) otherwise; q * s (* pts) is rounded once, as in float64.
    """
    q, v, ok, inexact, over, under, sub = element_fast32_conditions(xv, r, recip, s, mode, k,
                                                                    p, bp)
    return q, v, ok, pack_conditions(inexact, over, under, sub, 1) & -ok


@register_jitable(forceinline=True)
def element_stochastic32(xv, r, recip, s, p, bp):
    """:func:`element_fast32`'s (q, q * s, ok) for stochastic rounding with a full 32-bit
    word ``r``, without flags: the quotient rounded by :func:`lpsim.rounding.round_sr_word`
    (round_fast_sub's decisions in fewer operations; ``p`` as it needs,
    :func:`lpsim.rounding.sr_word_applies` says where): what the GPU block kernels' step
    (:func:`element_stochastic32_conditions`) gives where nothing counts."""
    q, v, ok, _, _, _, _ = element_stochastic32_conditions(xv, r, recip, s, p, bp)
    return q, v, ok


@register_jitable(forceinline=True)
def element_stochastic32_conditions(xv, r, recip, s, p, bp):
    """:func:`element_fast32_conditions` for stochastic rounding with a full 32-bit word
    ``r`` by :func:`lpsim.rounding.round_sr_word_conditions`: (q, q * s, ok, inexact,
    overflow, underflow, subnormal), the flags valid where ok is 1; a counting GPU kernel's
    step where :func:`lpsim.rounding.sr_word_applies` holds."""
    yb = float32_bits(xv * recip)
    b, ok, inexact, over, under, sub = round_sr_word_conditions(yb, word(r), p)
    q = bits_float32(b)
    return (q, q * s * np.float32(bp.pts), ok & _exact_product(xv, yb), inexact, over, under,
            sub)


@register_jitable(forceinline=True)
def element_fast32_packed(xv, r, recip, s, mode, k, p, bp):
    """:func:`element_fast32` with its flags packed one a byte as
    :func:`element_nearest32_flags` gives them (INEXACT, OVERFLOW, UNDERFLOW, SUBNORMAL at
    bits 0, 8, 16, 24; 0 where ok is 0): the form the counted CPU loops sum per lane, made
    from the conditions directly rather than through round_bits' flag bits."""
    q, v, ok, inexact, over, under, sub = element_fast32_conditions(xv, r, recip, s, mode, k,
                                                                    p, bp)
    return q, v, ok, pack_conditions(inexact, over, under, sub, 8) & -ok


@register_jitable(forceinline=True)
def element_fast32_conditions(xv, r, recip, s, mode, k, p, bp):
    """:func:`element_fast32` with its flags one a value (:func:`lpsim.rounding.
    round_fast_sub_conditions`): (q, q * s, ok, inexact, overflow, underflow, subnormal),
    the flags valid where ok is 1."""
    yb = float32_bits(xv * recip)
    b, ok, inexact, over, under, sub = round_fast_sub_conditions(yb, mode, r, k, p)
    ok &= _exact_product(xv, yb)
    q = bits_float32(b)
    v = q * s * np.float32(bp.pts)              # times 1 (exact) without a tensor scale
    return q, v, ok, inexact, over, under, sub


@register_jitable(forceinline=True)
def element_nearest32(xv, rc, s, pts, maxe, cw, lw):
    """:func:`element_fast32`'s value q * s (* pts) for nearest rounding of a finite float32
    element, with ``rc`` the block's float32 reciprocal: q = min(:func:`nearest32` (x * rc),
    max) carrying x's sign.  x * rc underflowing to a float32 subnormal or to 0 is harmless
    here: such a quotient is below half the element's smallest subnormal and rounds to 0."""
    yb = float32_bits(xv * rc)
    q = min(nearest32(yb, cw, lw), maxe)
    return bits_float32(float32_bits(q * s * pts) | (float32_bits(xv) & 0x80000000))


@register_jitable(forceinline=True)
def element_nearest32_flags(xv, rc, s, pts, maxe, minn, cw, lw, pow2):
    """:func:`element_nearest32` with round_fast_sub's flags for it: (value, flags, q), q
    the element's magnitude; ``minn``: the element's smallest normal; ``pow2``: the block
    format's.  Where :func:`nearest_words_exact` holds, these are element_fast32's flags for
    every finite x * rc (float32 normal or not, as element_exact flags the product that
    underflowed: it rounds to 0, an underflow where the exact quotient is nonzero, which is
    x's for power-of-two scales and the float32 product x * rc itself otherwise); not for an
    infinite x * rc, which element_exact flags as an inf input.

    flags: INEXACT, OVERFLOW, UNDERFLOW, SUBNORMAL packed one a byte (bits 0, 8, 16, 24),
    so that a loop sums them in one 32-bit lane, for up to 255 elements.  The value is
    element_nearest32's own; the product and the rounding it repeats are the same
    operations, which the compiler forms once."""
    v, inexact, over, under, sub, q = element_nearest32_conditions(xv, rc, s, pts, maxe, minn,
                                                                   cw, lw, pow2)
    return v, pack_conditions(inexact, over, under, sub, 8), q


@register_jitable(forceinline=True)
def element_nearest32_conditions(xv, rc, s, pts, maxe, minn, cw, lw, pow2):
    """:func:`element_nearest32_flags`' flags one a value: (value, inexact, overflow,
    underflow, subnormal, q), each flag 0 or 1 (a 32-bit word on 32-bit words).  A GPU
    lane adds these to its counters as they are: packing them into bytes pays where SIMD
    lanes sum them, not in a GPU thread's registers."""
    v = element_nearest32(xv, rc, s, pts, maxe, cw, lw)
    yb = float32_bits(xv * rc)
    ya = bits_float32(yb & 0x7FFFFFFF)
    qr = nearest32(yb, cw, lw)
    q = min(qr, maxe)
    zero = like(yb, q == 0)
    pw = like(yb, pow2 != 0)                    # a select, not a branch: loops vectorise
    under = zero & ((like(yb, xv != 0) & pw) | (like(yb, ya != 0) & (1 - pw)))
    return (v, like(yb, q != ya) | under, like(yb, qr > maxe), under,
            (1 - zero) & like(yb, q < minn), q)


@functools.lru_cache(maxsize=256)
def words_exact(bfmt: "BlockFormat") -> bool:
    """Whether :func:`element_fast32` gives the float64 step's results for every float32
    element of ``bfmt``: the element format fits a float32 container, every scale and (power
    of two) its reciprocal is a float32, and with a tensor scale q * s is an exact float32
    normal (so that q * s * pts is rounded once)."""
    el, sc = bfmt.saturating_element, bfmt.scale
    # element normals from float32's (round_fast_sub's 32-bit lanes hold only nonnegative
    # quantities: an element format reaching below them took wrong values)
    if not (el.fits(np.float32)[0] and sc.fits(np.float32)[0] and el.signed
            and el.emin >= -126):
        return False
    smin, smax = float(sc.min_subnormal), float(sc.max_finite)
    if bfmt.pow2 and not (2.0 ** -127 <= smin and smax <= 2.0 ** 127):
        return False
    # every reciprocal finite (the nearest step has no exact step for 0 * inf to fall back
    # on); a tensor scale keeps them finite by its least value (min_tensor_scale)
    if not bfmt.tensor_scale and not _reciprocal_finite(1.0, smin):
        return False
    if bfmt.tensor_scale:
        return (el.m + sc.m + 2 <= 24 and float(el.min_subnormal) * smin >= 2.0 ** -126
                and float(el.max_finite) * smax < 2.0 ** 128)
    return True


_INF64 = np.int64(0x7FF0000000000000)
_MAX64 = np.int64(0x7FEFFFFFFFFFFFFF)


@register_jitable
def element_exact(xv, recip, s, mode, r, k, p, bp):
    """(q, q * s, flags) of any element by :func:`lpsim.rounding.round_bits`.  A zero
    element is the zero of its sign whatever the reciprocal: a scale format reaching below
    float32's reciprocal range (bf16, fp(8,10); fp(11,0) in float64) gives its smallest
    scales an infinite one, and 0 * inf would be NaN."""
    yb = scaled_bits(xv, s, recip, bp)
    if xv == 0:
        yb = f2i(np.float64(xv))
    # a finite x whose exact quotient x / s (power-of-two scale) lies beyond float64 (float64
    # data, a narrow scale format): an overflow of every element format, as the largest
    # float64 of its sign rounds, flagged as one even where that is the format's largest
    big = bp.pow2 and (yb & _MAG64) == _INF64 and abs(np.float64(xv)) < np.inf
    if big:
        yb = (yb & _SIGN64) | _MAX64
    b, flags = round_bits(yb, mode, r, k, p)
    if big and b != p.nanb:
        flags |= OVERFLOW | INEXACT
    q = i2f(b)
    return q, dequantize_element(q, s, bp), flags


@register_jitable
def element_word(mode, g, lanes, stream, seed_lo, seed_hi):
    """The random word of element ``g`` (lpsim.philox's lanes; 0 for deterministic modes)."""
    if mode < STOCHASTIC:
        return np.int64(0)
    blk = g // lanes
    return lane_word(block_words(blk, stream, seed_lo, seed_hi), g - blk * lanes, lanes)


@register_jitable
def bits_value(a, M, EB):
    """The float64 value of the nonnegative container magnitude bits ``a`` (M mantissa bits,
    exponent bias EB; exact: float32 and float64 values are float64 values)."""
    a = np.int64(a)
    if M == 52:
        return i2f(a)
    field_ = a >> M
    frac = a & ((np.int64(1) << M) - 1)
    if field_ == 0:                             # float32 subnormal: frac * 2**(1 - EB - M)
        return np.float64(frac) * i2f((np.int64(1024 - EB - M)) << 52)
    return i2f(((field_ - EB + 1023) << 52) | (frac << (52 - M)))


# --- host side: the kernels' parameters -----------------------------------------------------

def block_params(bfmt: BlockFormat, pts: float = 1.0) -> BlockParams:
    """The kernels' BlockParams for ``bfmt`` and a per-tensor scale ``pts``: the format's
    own made once (a small call would otherwise spend much of its time here), the tensor
    scale's two fields set per call (NVFP4's changes with every tensor)."""
    base = _format_block_params(bfmt)
    if pts == 1.0:
        return base
    return base._replace(pts=float(pts), pts_inv=float(np.float32(1.0 / np.float32(pts))))


@functools.lru_cache(maxsize=256)
def _format_block_params(bfmt: BlockFormat) -> BlockParams:
    el, sc = bfmt.saturating_element, bfmt.scale
    smin, smax = sc.min_subnormal, sc.max_finite
    return BlockParams(bfmt.block, RULES[bfmt.rule], int(bfmt.pow2), el.emax, el.m,
                       float(el.max_finite), int(np.log2(smin)) if bfmt.pow2 else 0,
                       sc.emax if bfmt.pow2 else 0, float(smin), float(smax),
                       int(bfmt.nonfinite == "nan"), 1.0, 1.0, int(words_exact(bfmt)),
                       int(words_exact(bfmt) and nearest_words_exact(el)),
                       int(not bfmt.pow2 and bfmt.rule == "even" and nearest_words_exact(sc)))


@functools.lru_cache(maxsize=256)
def _element_params(element: Format, word_bits: int) -> Params:
    # the element rounds in a float64 register with the container's random words
    return kernel_params(element, np.float64)._replace(W=word_bits)


@functools.lru_cache(maxsize=256)
def element_params32(bfmt: BlockFormat) -> Params:
    """The element's float32-container Params (W = 32) for :func:`element_fast32`; those of
    e2m1fn (never read) where the format does not take that step."""
    return kernel_params(bfmt.saturating_element if words_exact(bfmt)
                         else PRESETS["mxfp4"].saturating_element, np.float32)


@functools.lru_cache(maxsize=256)
def nearest_words_exact(fmt: Format) -> bool:
    """Whether :func:`element_nearest32` rounds x / s to ``fmt`` as
    round_bits does to nearest: :func:`lpsim.rounding.nearest32_exact`, and a smallest
    subnormal above 2**-125, so that a quotient that underflows to a float32 subnormal rounds
    to 0 either way."""
    return nearest32_exact(fmt) and fmt.emin - fmt.m >= -124 and fmt.emax <= 100


def _reciprocal_finite(pts, smin) -> bool:
    """Whether the kernels' reciprocal of the smallest block scale under the per-tensor
    scale ``pts`` is finite: fp32(fp32(1 / pts) / smin), as block_params and scale_recip
    form it (a zero element times an infinite reciprocal would be NaN)."""
    with np.errstate(over="ignore", divide="ignore"):
        return bool(np.isfinite(np.float32(np.float32(1.0 / np.float32(pts)) / smin)))
