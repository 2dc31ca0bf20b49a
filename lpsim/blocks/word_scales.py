"""The float32 word kernel's block scales: :func:`scale_words` (the scale of
:func:`lpsim.blocks.decisions.block_scale` from a block's largest magnitude bits, in integer
steps where they apply), and for scales with mantissa bits rounded to nearest (NVFP4's UE4M3)
two tables made once per call: the reciprocal of every scale value (:func:`_reciprocals`) and
the scale as a step function of the largest magnitude bits (:func:`_scale_steps`), so that a
block's scale is a lookup and a compare instead of two divisions and a rounding.  The tables
are found by evaluating scale_words itself, so they give its scales exactly.
"""

from __future__ import annotations

import numpy as np
from numba.extending import register_jitable

from ..rounding import nearest32, nearest32_words
from ..word32 import as_int64, bits_float32, float32_bits, like, word
from .decisions import bits_value, block_recip, block_scale, i2f
from .formats import CEIL, EVEN, RCEIL


@register_jitable(forceinline=True)
def pow2_words(a, bp):
    """Whether :func:`pow2_exponent` gives the power-of-two scale of largest magnitude bits
    ``a`` (int64): under a floor, ceil or even rule for a float32 normal amax, and for a zero
    or subnormal one where the scale format's least exponent lies above 2**-126's (its
    field, at most 1 after any rule, is then raised to the least scale, as
    :func:`lpsim.blocks.decisions.block_scale` clamps such an amax: MX's formats); under
    rceil for every amax where the scale format's least exponent is -127 or above (E8M0's:
    see :func:`pow2_exponent`)."""
    if not (bp.pow2 and bp.m_e <= 22):
        return False
    if bp.rule == RCEIL:
        return bp.smin_exp >= -127
    return a >= (np.int64(1) << 23) or bp.smin_exp + bp.emax_e >= -125


@register_jitable(forceinline=True)
def pow2_exponent(a, bp):
    """The exponent e (int64) of the power-of-two scale 2**e of a block whose largest
    magnitude has the float32 bits ``a`` (an int64 or a 32-bit word) where
    :func:`pow2_words` holds: the exponent field (of amax / max for rceil), its mantissa
    rounded first for even, clamped to the scale format's range."""
    bias = 127 + bp.emax_e                      # e = field - bias
    if bp.rule == RCEIL:
        # ceil(log2 d) of d = fp32(amax / max) by the float32 division (block_scale's
        # float64 quotient rounded to float32 is the same): the field, plus 1 for a nonzero
        # mantissa.  A zero or subnormal d has the exponent -127 (d <= 2**-127: field 0) or
        # -126 (2**-127 < d < 2**-126: field 1), or one below -127, which the clamp to a
        # least exponent of -127 or above (pow2_words asks it) makes -127 too
        d = as_int64(float32_bits(bits_float32(a) / np.float32(bp.max_e)))
        f = like(a, (d >> 23) + np.int64(((d & 0x7FFFFF) != 0) & (d > 0x400000)))
        bias = 127
    else:
        if bp.rule == EVEN:                     # round to the element's mantissa, ties away
            a = (a + (like(a, 1) << (22 - bp.m_e))) & (255 << 23)
        f = a >> 23                             # 1 .. 255 from here on
        if bp.rule == CEIL:
            f += like(a, (a & 0x7FFFFF) != 0)
    # the clamp on the field (a 32-bit word stays one)
    lo, hi = bp.smin_exp + bias, bp.smax_exp + bias
    if hi < 1:
        return np.int64(bp.smax_exp)
    if lo > 0:
        f = max(f, lo)
    if hi < 255:
        f = min(f, hi)
    return as_int64(f) - bias


@register_jitable(forceinline=True)
def pow2_float32(e):
    """2**e as a float32, for -149 <= e <= 127 (subnormal below -126): exact, from bits."""
    if e > -127:
        return bits_float32(word(np.int32((e + 127) << 23)))
    return bits_float32(word(np.int32(1) << np.int32(e + 149)))


@register_jitable(forceinline=True)
def fused_scales(bp, steps) -> bool:
    """Whether :func:`fused_scale` gives every finite block's scale: a table of
    :func:`_scale_steps` (not empty), or power-of-two scales that :func:`pow2_words` gives
    for every largest magnitude (MX's)."""
    return steps[0].size != 0 or pow2_words(np.int64(0), bp)


@register_jitable(forceinline=True)
def fused_scale(am, bp, steps):
    """(s32, rc): the float32 scale and reciprocal of :func:`scale_recip32` for a finite
    block's largest magnitude bits ``am`` (a word) where :func:`fused_scales` holds, in a few
    steps a loop over blocks overlaps: a lookup and a compare in ``steps``' table, or 2**e
    and 2**-e by :func:`pow2_exponent`."""
    step_base, step_thr, svals, rvals, kshift = steps
    if step_base.size != 0:
        a = as_int64(am)
        key = a >> kshift
        i = step_base[key] + np.int64(a >= step_thr[key])
        return svals[i], rvals[i]
    e = pow2_exponent(am, bp)
    return pow2_float32(e), pow2_float32(-e)


@register_jitable(forceinline=True)
def scale_words(am, bp, sp):
    """:func:`block_scale`'s scale (float64) of a block whose largest magnitude has the
    finite float32 bits ``am``, in integer steps where they apply: a power-of-two scale by
    floor, ceil or even of a float32 normal amax (the exponent field, its mantissa rounded
    first for even), and a scale with mantissa bits rounded to nearest (``even``: NVFP4's
    UE4M3) by :func:`nearest32`; else :func:`block_scale` itself."""
    a = as_int64(am)
    if pow2_words(a, bp):
        return i2f((pow2_exponent(a, bp) + 1023) << 52)
    if bp.snear32 and a != 0:
        # float32 divisions: the quotient of two float32 values rounded once to float32 is
        # block_scale's float64 quotient rounded to float32 (53 >= 2 * 24 + 2 bits)
        t = bits_float32(am) / np.float32(bp.max_e)
        if bp.pts != 1.0:
            t = t / np.float32(bp.pts)
        if t < bp.smin:
            return bp.smin
        if t > bp.smax:
            return bp.smax
        cw, lw = nearest32_words(sp.m, sp.emin)
        return np.float64(nearest32(float32_bits(t), cw, lw))
    s, _ = block_scale(bits_value(a, 23, 127), bp, sp)
    return s


@register_jitable
def _reciprocals(bp, sp):
    """(table, i0, shift): fp32(pts_inv / v) for every value v of a scale format with
    mantissa bits whose scales :func:`scale_words` rounds (``snear32``: float32 normals of
    at most m bits, so v's bits >> (23 - m) index them), entry i for the v whose index is
    i0 + i; one lookup per block where a division would stand in its dependency chain.
    An empty table (every lookup falls back to the division) for other scale formats or
    a table of more than 4096 entries."""
    shift = 23 - sp.m
    i0 = as_int64(float32_bits(np.float32(bp.smin))) >> shift
    size = (as_int64(float32_bits(np.float32(bp.smax))) >> shift) - i0 + 1
    if bp.pow2 or not bp.snear32 or size > 4096:
        return np.empty(0, np.float32), i0, shift
    table = np.empty(size, np.float32)
    for i in range(size):
        table[i] = np.float32(bp.pts_inv) / bits_float32(word((i0 + i) << shift))
    return table, i0, shift


#: blocks of a call from which the word kernel finds scales rounded to nearest
#: (``snear32``: NVFP4's UE4M3) in :func:`_scale_steps`' table instead of by two divisions
#: and a rounding per block: the table costs about 20 us, made once a call (not once a
#: thread's range: :func:`lpsim.blocks.kernels.word_tables`), what about 2000 blocks save
#: (10 ns a block on a 2-core VM)
STEPS_FROM = 1 << 11


@register_jitable(forceinline=True)
def scale_recip32(am, bp, sp, rct, ri0, rsh):
    """(s, s32, rc): a block's scale from its largest magnitude bits ``am`` (float64, by
    :func:`scale_words`), that scale as a float32 and its float32 reciprocal: 2**-e by its
    exponent bits for a power of two, else from the table of :func:`_reciprocals` (``rct``,
    ``ri0``, ``rsh``) or by the float32 division where the table has no entry (the float64
    quotient of float32 values rounded to float32 is the same).  One decision for the word
    kernel's blocks along rows and :mod:`lpsim.blocks.columns`' blocks down columns."""
    s = scale_words(am, bp, sp)
    s32 = np.float32(s)
    if bp.pow2:
        return s, s32, np.float32(block_recip(s, bp))
    i = (as_int64(float32_bits(s32)) >> rsh) - ri0
    return s, s32, rct[i] if 0 <= i < rct.size else np.float32(bp.pts_inv) / s32


@register_jitable
def _scale_of(a, bp, sp):
    """:func:`scale_words`' scale (float32) of the largest magnitude bits ``a`` (int64)."""
    return np.float32(scale_words(word(a), bp, sp))


@register_jitable
def _next_step(a, s, bp, sp):
    """The least magnitude bits above ``a`` whose scale exceeds ``s`` (the scale of a), or -1
    if there is none below inf's bits: from a guess at the midpoint to the next value up,
    galloping to a bracket and halving it (the scale is non-decreasing in the bits)."""
    top = np.int64(255) << 23
    # the next value up if s is a normal of the scale format (else a value below it: the
    # search gallops on from there), and the bits a whose quotient meets the midpoint
    up = bits_float32(word(as_int64(float32_bits(s)) + (np.int64(1) << (23 - sp.m))))
    guess = (np.float64(s) + np.float64(up)) * 0.5 * bp.max_e * bp.pts
    g = as_int64(float32_bits(np.float32(min(guess, 3.0e38))))
    g = min(max(g, a + 1), top - 1)
    if _scale_of(g, bp, sp) > s:                        # bracket (lo, hi]: lo's scale is s
        hi, d = g, np.int64(1)
        lo = max(g - d, a)
        while lo > a and _scale_of(lo, bp, sp) > s:
            hi = lo
            d *= 2
            lo = max(hi - d, a)
    else:
        lo, d = g, np.int64(1)
        hi = min(g + d, top - 1)
        while _scale_of(hi, bp, sp) <= s:
            if hi == top - 1:                   # the largest finite bits: no step above a
                return np.int64(-1)
            lo = hi
            d *= 2
            hi = min(lo + d, top - 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _scale_of(mid, bp, sp) > s:
            hi = mid
        else:
            lo = mid
    return hi


@register_jitable
def _scale_steps(bp, sp, rct, ri0, rsh, blocks):
    """(base, thr, svals, rvals, kshift): :func:`scale_words`' scales rounded to nearest
    (``snear32``) as the step function of the largest magnitude bits ``a`` that they are,
    for a call of ``blocks`` blocks: with key = a >> kshift (a's exponent and its top m + 1
    mantissa bits, m the scale's), scale index i = base[key] + (a >= thr[key]), scale
    svals[i] and its reciprocal rvals[i] (as :func:`_chunk_words` takes them from ``rct``).
    Each step (the least a of a larger scale) is found by evaluating scale_words itself, so
    the table gives its scales exactly; a bucket of keys holding two steps, a call of fewer
    than STEPS_FROM blocks, or a scale without the table of its values ``rct`` (other kinds,
    or more than 4096 values) give empty tables (the divisions then run per block)."""
    kshift = np.int64(22 - sp.m)
    none = (np.empty(0, np.int32), np.empty(0, np.int32), np.empty(0, np.float32),
            np.empty(0, np.float32), kshift)
    if bp.pow2 or not bp.snear32 or rct.size == 0 or blocks < STEPS_FROM or sp.m > 8:
        return none
    cap = rct.size + 1                                  # at most one step per value
    steps = np.empty(cap, np.int64)
    svals = np.empty(cap, np.float32)
    s = _scale_of(np.int64(0), bp, sp)
    steps[0], svals[0], count = 0, s, 1
    a = np.int64(0)
    while True:
        a = _next_step(a, s, bp, sp)
        if a < 0:
            break
        if count == cap:
            return none
        s = _scale_of(a, bp, sp)
        steps[count], svals[count] = a, s
        count += 1
    nkeys = (np.int64(255) << 23) >> kshift
    base = np.empty(nkeys, np.int32)
    thr = np.empty(nkeys, np.int32)
    j = 0
    for key in range(nkeys):
        lo, hi = key << kshift, (key + 1) << kshift
        while j + 1 < count and steps[j + 1] <= lo:
            j += 1
        base[key] = j
        thr[key] = np.int32(255 << 23)                  # no step inside: never reached
        if j + 1 < count and steps[j + 1] < hi:
            if j + 2 < count and steps[j + 2] < hi:
                return none
            thr[key] = steps[j + 1]
    rvals = np.empty(count, np.float32)
    for i in range(count):
        v = svals[i]
        r = (as_int64(float32_bits(v)) >> rsh) - ri0
        rvals[i] = rct[r] if 0 <= r < rct.size else np.float32(bp.pts_inv) / v
    return base, thr, svals[:count], rvals, kshift
