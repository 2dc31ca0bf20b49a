"""The float32 word kernel's counters: each block's :data:`BLOCK_COUNTERS`, or a call's sums,
written by the counted variants of :func:`lpsim.blocks.words._chunk_words` (lpsim.quantize
with stats, simulated training's telemetry) equal to what the general counted kernel
(:mod:`lpsim.blocks.kernels`) writes, at about the word kernel's speed.

The counters come from the same decisions: the element flags are those of
:func:`lpsim.blocks.decisions.element_fast32` (round_fast_sub's) or, to nearest, of
:func:`lpsim.blocks.decisions.element_nearest32_flags` (the same flags read off the
uncounted kernel's float32 add), and for the elements those leave, of
:func:`lpsim.blocks.decisions.element_exact`.  A block with a NaN or inf is counted as the
general kernel counts it (:func:`_nonfinite_block`, or block_scale and element_exact under
``nonfinite="finite"``).

What keeps it fast: the four element flags travel packed one a byte in a 32-bit lane, summed
per position of a block across a group of blocks (:func:`_lanes_nearest`) or per block (at
most :data:`PIECE` elements a sum, so that no byte overflows); the counters are summed in
locals, not in the counts array; to nearest, a block is flushed exactly when its largest
magnitude rounds to 0 (the rounding is monotone in the magnitude), so the element loop
counts no nonzero results; and a block's clipped scale is read off its largest magnitude
bits against two bounds found once per call by bisecting block_scale's own answer
(:func:`clip_bounds`), so that the scale tables of :mod:`lpsim.blocks.word_scales`, which
say nothing of clipping, still serve.
"""
from __future__ import annotations

import numpy as np
from numba.core import types
from numba.extending import overload, register_jitable

from ..cpu import _constant
from ..rounding import NEAREST, STOCHASTIC, nearest32_words
from ..word32 import as_int64, bits_float32, float32_bits, like, word
from .amax import _block_amax32, _finite_amax
from .decisions import (bits_value, block_recip, block_scale, element_exact,
                        element_fast32_packed, element_nearest32_flags, element_ok32)
from .word_scales import fused_scale

#: the most elements whose packed flags (one a byte) one 32-bit sum holds
PIECE = 128
#: per-lane sums of packed flags (:func:`_lanes_nearest`): one a position of a block of
#: up to 32 elements, emptied once a group (at most SCALE_AHEAD = 16 blocks: no byte
#: reaches 255)
LANES = 32


@register_jitable
def _nonfinite_block(xs, outs, qs, want_q, c):
    """A block holding NaN or inf under ``nonfinite="nan"``: NaN out, NaN and inf counted
    (added to the row ``c``)."""
    for i in range(xs.size):
        v = np.float64(xs[i])
        c[4] += np.int64(v != v)
        c[5] += np.int64(v == np.inf or v == -np.inf)
        outs[i] = np.nan
        if want_q:
            qs[i] = np.nan
    c[8] += 1


@register_jitable
def _clip_side(a, bp, sp):
    """-1 where :func:`block_scale` clips the scale of a block whose largest magnitude has
    the finite float32 bits ``a`` up to the smallest scale, 1 down to the largest, else 0."""
    s, clipped = block_scale(bits_value(a, 23, 127), bp, sp)
    if clipped == 0:
        return 0
    return 1 if s == bp.smax else -1


@register_jitable
def _least_side(lo, side, bp, sp):
    """The least bits a in lo .. 255 << 23 (inf's bits: none) with _clip_side(a) >= side."""
    hi = np.int64(255) << 23
    while lo < hi:
        mid = (lo + hi) // 2
        if _clip_side(mid, bp, sp) >= side:
            hi = mid
        else:
            lo = mid + 1
    return lo


def tally_scratch(lo, hi, counted):
    """What the counted word kernel keeps for a range (compiled code only): (:func:`clip_bounds`'
    ``lo`` and ``hi``, found once a call, the per-lane sums of :func:`_lanes_nearest`);
    nothing (no allocation) where ``counted`` is the literal 0."""
    raise NotImplementedError


@overload(tally_scratch, prefer_literal=True)
def _tally_scratch(lo, hi, counted):
    if isinstance(counted, types.IntegerLiteral) and counted.literal_value == 0:
        return lambda lo, hi, counted: (np.int64(0), np.int64(0), None)
    return lambda lo, hi, counted: (lo, hi, np.zeros(LANES, np.uint32))


@register_jitable
def clip_bounds(bp, sp):
    """(lo, hi): a block whose largest magnitude has the nonzero finite float32 bits ``a``
    gets a clipped scale from :func:`block_scale` exactly where a < lo or a >= hi.

    block_scale's scale before clipping is non-decreasing in the largest magnitude (each of
    its roundings is), so the clipped magnitudes are those below one bound (clipped up to
    the smallest scale) and those from another (down to the largest): both found by
    bisecting block_scale's own answer, about 60 evaluations a call.  Needs smin < smax
    (:func:`lpsim.blocks.kernels.takes_words` checks it), so that the side a clipped scale
    went to is the value it took.
    """
    lo = _least_side(np.int64(1), 0, bp, sp)
    return lo, _least_side(lo, 1, bp, sp)


@register_jitable(forceinline=True)
def _piece_nearest(xf, outf, lo, size, rc, s, pts, maxe, minn, cw, lw, pow2):
    """:func:`element_nearest32_flags` over the ``size`` (at most PIECE) elements from ``lo``:
    the sum of their packed flags."""
    acc = word(np.int32(0))
    for i in range(size):
        j = lo + np.uint64(i)
        v, flags, _ = element_nearest32_flags(xf[j], rc, s, pts, maxe, minn, cw, lw, pow2)
        outf[j] = v
        acc += flags
    return acc


@register_jitable(forceinline=True)
def _lanes_nearest(xf, outf, lanes, lo, size, rc, s, pts, maxe, minn, cw, lw, pow2):
    """:func:`element_nearest32_flags` over the ``size`` (16 or 32) elements from ``lo``, element
    i's packed flags added to ``lanes[i]``: a loop with no sum across elements, which
    vectorises as the uncounted loop does (a sum per block took twice its time)."""
    for i in range(size):
        j = lo + np.uint64(i)
        v, flags, _ = element_nearest32_flags(xf[j], rc, s, pts, maxe, minn, cw, lw, pow2)
        outf[j] = v
        lanes[i] = as_int64(word(lanes[i]) + flags)


@register_jitable(forceinline=True)
def _tally_lanes(c, lanes):
    """The counters ``c`` plus the per-lane sums ``lanes``, which are emptied."""
    a0 = a1 = a2 = a3 = np.int64(0)
    for i in range(LANES):
        w = np.int64(lanes[i])
        a0 += w & 0xFF
        a1 += (w >> 8) & 0xFF
        a2 += (w >> 16) & 0xFF
        a3 += w >> 24
        lanes[i] = 0
    return (c[0] + a0, c[1] + a1, c[2] + a2, c[3] + a3, c[4], c[5], c[6], c[7])


#: blocks whose packed flags :func:`blocks_counted` sums per lane at least before it
#: adds them to the counters (at most a group more: fewer than 255, a byte per flag)
LANE_BLOCKS = 128


@register_jitable(forceinline=True)
def _lanes_words(xf, outf, rs, lanes, lo, r0, size, rc, s, mode, k, p32, bp, nonzero):
    """:func:`element_fast32` over the ``size`` (16 or 32) elements from ``lo`` (random words
    from ``r0``), element i's packed flags added to ``lanes[i]``: returns 1 (bit 0) where a
    result is nonzero, plus 2 (bit 1) where an element is left to the exact step (an OR
    across the block in place of two sums: the loop vectorises as the uncounted one,
    :func:`lpsim.blocks.words._elements_words`, which a constant flag choosing between the
    two kept from vectorising).  ``nonzero`` (a constant at each call): the caller knows a
    result is nonzero, and the loop does not look (bit 0 set; the look cost the SR loop
    a third of its time)."""
    state = word(np.int32(0))
    if mode >= STOCHASTIC:          # words in order (see _elements_words: not gathered)
        for i in range(size):
            state |= _lane_word(xf, outf, lanes, lo, i, word(rs[r0 + np.uint64(i)]), rc, s,
                                mode, k, p32, bp, nonzero)
    else:
        r = word(rs[0])
        for i in range(size):
            state |= _lane_word(xf, outf, lanes, lo, i, r, rc, s, mode, k, p32, bp, nonzero)
    return state | 1 if nonzero else state


@register_jitable(forceinline=True)
def _lane_word(xf, outf, lanes, lo, i, r, rc, s, mode, k, p32, bp, nonzero):
    """Element lo + i of :func:`_lanes_words` with the random word ``r``: its bits of the
    state (without bit 0 where ``nonzero``)."""
    j = lo + np.uint64(i)
    q, v, ok, flags = element_fast32_packed(xf[j], r, rc, s, mode, k, p32, bp)
    outf[j] = v
    lanes[i] = as_int64(word(lanes[i]) + flags)
    if nonzero:
        return (1 - ok) << 1
    return (ok & like(ok, q != 0)) | ((1 - ok) << 1)


@register_jitable(forceinline=True)
def _top_nonzero(a, rc, p32) -> bool:
    """Whether the element of largest magnitude bits ``a`` (a finite block's) rounds to a
    nonzero result in every mode: its quotient (the element step's own float32 product)
    is at least the element format's smallest subnormal, which every rounding of a value
    that large keeps (SR chooses between the neighbours on its grid, both that large)."""
    return (float32_bits(bits_float32(word(np.int32(a))) * rc) & 0x7FFFFFFF) >= p32.tiny


@register_jitable(forceinline=True)
def blocks_counted(xf, outf, sf, rs, xb, bam, tb, t_end, lo, e_lo, size, steps, cinf, near, mode,
                   k, p, p32, bp, tally, ahead, c):
    """Blocks tb .. t_end-1 of ``size`` (16 or 32) elements each, end to end from element
    ``lo``, with the scales of :func:`lpsim.blocks.word_scales.fused_scale` (largest
    magnitudes from ``bam`` where it is not empty), their flags summed per lane and the
    clipped and flushed blocks counted as :func:`_group_counted` counts them, up to a block
    it leaves to that function: (that block's index or t_end, the counters ``c`` plus those
    of the blocks done).  ``near`` (a constant at each call): to nearest by
    :func:`lpsim.blocks.decisions.element_nearest32_flags` (:func:`_lanes_nearest`; a block
    is flushed when its largest magnitude rounds to 0; an infinite largest quotient is
    left); else by :func:`element_fast32` (random words from ``rs``, element ``e_lo``'s
    first; :func:`_lanes_words`), then :func:`element_exact` for any element that step
    left, and a block is flushed when every result is 0.  A block with a NaN or inf is left.

    Per group of as many blocks as ``ahead`` (:func:`lpsim.blocks.words.scale_ahead_scratch`)
    holds, first their scales, then their elements: the per-lane sums carry a dependency
    from block to block through memory, and with each block's scale found just before its
    elements every block waited for its own chain of steps (twice the time)."""
    clip_lo, clip_hi, lanes = tally
    _, _, s32s, rcs, ams = ahead
    maxe, pts = np.float32(bp.max_e), np.float32(bp.pts)
    minn = bits_float32(word(p32.minnorm))
    cw, lw = nearest32_words(p32.m, p32.emin)
    group = s32s.size
    stored = bam.size != 0
    rmask = -np.int64(mode >= STOCHASTIC)       # deterministic modes read rs[0] only
    lo = np.uint64(lo)
    since = 0
    for g0 in range(tb, t_end, group):
        g_end = min(g0 + group, t_end)
        g1 = g_end                              # less where a block is left over
        at = lo
        for b in range(g0, g1):                 # the scales, up to a block left over
            am = word(bam[b]) if stored else _block_amax32(xb, at, size)
            if am >= cinf:
                g1 = b
                break
            s32, rc = fused_scale(am, bp, steps)
            if near and not bits_float32(am) * rc < np.inf:
                g1 = b
                break
            j = b - g0
            sf[b], s32s[j], rcs[j], ams[j] = s32, s32, rc, as_int64(am)
            at += np.uint64(size)
        for b in range(g0, g1):                 # the elements
            j = b - g0
            rc, s32, a = rcs[j], s32s[j], ams[j]
            if near:
                _lanes_nearest(xf, outf, lanes, lo, size, rc, s32, pts, maxe, minn, cw, lw,
                               bp.pow2)
                # flushed: the largest magnitude (the largest quotient) rounds to 0
                _, _, qtop = element_nearest32_flags(bits_float32(word(np.int32(a))), rc, s32,
                                                     pts, maxe, minn, cw, lw, bp.pow2)
                nonzero = np.int64(qtop != 0)
            else:
                # a block whose largest quotient reaches the element's smallest subnormal
                # has a nonzero result (MX and NVFP4 blocks but those of a clamped scale)
                if _top_nonzero(a, rc, p32):
                    state = _lanes_words(xf, outf, rs, lanes, lo, lo - np.uint64(e_lo), size,
                                         rc, s32, mode, k, p32, bp, True)
                else:
                    state = _lanes_words(xf, outf, rs, lanes, lo, lo - np.uint64(e_lo), size,
                                         rc, s32, mode, k, p32, bp, False)
                nonzero = as_int64(state & 1)
                if state >= 2:
                    s = sf[b]
                    recip = block_recip(s, bp)
                    for e in range(np.int64(lo), np.int64(lo) + size):
                        if element_ok32(xf[e], rc, p32) == 0:
                            flags, nz = _exact_step(xf, outf, e, e_lo, rs, rmask, recip, s,
                                                    mode, k, p, bp)
                            c = _tally(c, flags)
                            nonzero |= nz
            c = _tally_block(c, np.int64(a != 0 and (a < clip_lo or a >= clip_hi)),
                             np.int64(a != 0 and nonzero == 0))
            lo += np.uint64(size)
        since += g1 - g0
        if since >= LANE_BLOCKS:
            c = _tally_lanes(c, lanes)
            since = 0
        if g1 < g_end:
            return g1, _tally_lanes(c, lanes)
    return t_end, _tally_lanes(c, lanes)


@register_jitable(forceinline=True)
def _piece_words(xf, outf, rs, lo, r0, size, rc, s, mode, k, p32, bp):
    """:func:`element_fast32` over the ``size`` (at most PIECE) elements from ``lo`` (random
    words from ``r0``): (the sum of their packed flags, nonzero results + 65536 * elements
    left to the exact step)."""
    acc = rest = word(np.int32(0))
    if mode >= STOCHASTIC:          # words in order (see _elements_words: not gathered)
        for i in range(size):
            flags, left = _piece_word(xf, outf, lo + np.uint64(i), word(rs[r0 + np.uint64(i)]),
                                      rc, s, mode, k, p32, bp)
            acc += flags
            rest += left
    else:
        r = word(rs[0])
        for i in range(size):
            flags, left = _piece_word(xf, outf, lo + np.uint64(i), r, rc, s, mode, k, p32, bp)
            acc += flags
            rest += left
    return acc, rest


@register_jitable(forceinline=True)
def _piece_word(xf, outf, j, r, rc, s, mode, k, p32, bp):
    """Element j of :func:`_piece_words` with the random word ``r``: (its packed flags, 1 for
    a nonzero result + 65536 where it is left to the exact step)."""
    q, v, ok, flags = element_fast32_packed(xf[j], r, rc, s, mode, k, p32, bp)
    outf[j] = v
    return flags, (ok & like(ok, q != 0)) | ((1 - ok) << 16)


@register_jitable(forceinline=True)
def _no_counts():
    """A block's or a group's counters 0-7 (BLOCK_COUNTERS but nan_block) at the start: they
    are summed in locals and stored once the block (or the group) is done; adding into the
    counts array itself, stores the compiler must assume may alias the data, took a third
    of the kernel's time."""
    z = np.int64(0)
    return (z, z, z, z, z, z, z, z)


@register_jitable(forceinline=True)
def _tally(c, flags):
    """The counters ``c`` plus one element's round_bits flags (bits INEXACT .. INF_IN)."""
    flags = np.int64(flags)
    return (c[0] + (flags & 1), c[1] + ((flags >> 1) & 1), c[2] + ((flags >> 2) & 1),
            c[3] + ((flags >> 3) & 1), c[4] + ((flags >> 4) & 1), c[5] + ((flags >> 5) & 1),
            c[6], c[7])


@register_jitable(forceinline=True)
def _tally_packed(c, acc):
    """The counters ``c`` plus the packed flag sums ``acc`` (one a byte:
    :func:`lpsim.blocks.decisions.element_fast32_packed`)."""
    return (c[0] + as_int64(acc & 0xFF), c[1] + as_int64((acc >> 8) & 0xFF),
            c[2] + as_int64((acc >> 16) & 0xFF), c[3] + as_int64(acc >> 24), c[4], c[5], c[6],
            c[7])


@register_jitable(forceinline=True)
def _tally_block(c, clipped, flushed):
    """The counters ``c`` plus a block's clipped and flushed counters."""
    return (c[0], c[1], c[2], c[3], c[4], c[5], c[6] + clipped, c[7] + flushed)


@register_jitable(forceinline=True)
def _block_nearest(xf, outf, c, lo_, n, rc, s, pts, maxe, minn, cw, lw, pow2):
    """A finite block to nearest by :func:`element_nearest32_flags`: the counters ``c`` plus its
    flags (pieces of at most PIECE elements: loops of literal length for 32 and 16)."""
    lo = np.uint64(lo_)
    if n == 32:
        return _tally_packed(c, _piece_nearest(xf, outf, lo, 32, rc, s, pts, maxe, minn, cw,
                                               lw, pow2))
    if n == 16:
        return _tally_packed(c, _piece_nearest(xf, outf, lo, 16, rc, s, pts, maxe, minn, cw,
                                               lw, pow2))
    for c0 in range(0, n, PIECE):
        c = _tally_packed(c, _piece_nearest(xf, outf, lo + np.uint64(c0), min(PIECE, n - c0),
                                            rc, s, pts, maxe, minn, cw, lw, pow2))
    return c


@register_jitable(forceinline=True)
def _block_words(xf, outf, c, rs, lo_, r0_, n, rc, s, mode, k, p32, bp):
    """A finite block by :func:`element_fast32`: (the counters ``c`` plus its flags,
    nonzero results, elements left to the exact step)."""
    lo, r0 = np.uint64(lo_), np.uint64(r0_)
    if n == 32:
        acc, rest = _piece_words(xf, outf, rs, lo, r0, 32, rc, s, mode, k, p32, bp)
        return _tally_packed(c, acc), as_int64(rest & 0xFFFF), as_int64(rest >> 16)
    if n == 16:
        acc, rest = _piece_words(xf, outf, rs, lo, r0, 16, rc, s, mode, k, p32, bp)
        return _tally_packed(c, acc), as_int64(rest & 0xFFFF), as_int64(rest >> 16)
    nonzero = slow = np.int64(0)
    for c0 in range(0, n, PIECE):
        step = np.uint64(c0)
        acc, rest = _piece_words(xf, outf, rs, lo + step, r0 + step, min(PIECE, n - c0), rc, s,
                                 mode, k, p32, bp)
        c = _tally_packed(c, acc)
        nonzero += as_int64(rest & 0xFFFF)
        slow += as_int64(rest >> 16)
    return c, nonzero, slow


@register_jitable
def _exact_step(xf, outf, e, e_lo, rs, rmask, recip, s, mode, k, p, bp):
    """Element ``e`` by :func:`element_exact`: (its flags, 1 for a nonzero result, NaN
    included, else 0)."""
    q, outf[e], flags = element_exact(xf[e], recip, s, mode, np.int64(rs[(e - e_lo) & rmask]),
                                      k, p, bp)
    return flags, np.int64(q != 0)


@register_jitable(forceinline=True)
def _store(cf, row, c):
    """Add the counters ``c`` to row ``row`` of the counts."""
    for f in range(8):
        cf[row, f] += c[f]


def group_counted(xf, outf, sf, cf, rs, g0, g1, e_lo, mode, counted, k, p, p32, sp, bp, ahead,
                  tally):
    """:func:`_group_counted` where ``counted`` (a literal) is 1 or 2; nothing (not even
    typed) where it is 0, the uncounted kernel (compiled code only)."""
    raise NotImplementedError


@overload(group_counted, prefer_literal=True, jit_options={"forceinline": True})
def _group_counted_overload(xf, outf, sf, cf, rs, g0, g1, e_lo, mode, counted, k, p, p32, sp,
                            bp, ahead, tally):
    if isinstance(counted, types.IntegerLiteral) and counted.literal_value == 0:
        return lambda xf, outf, sf, cf, rs, g0, g1, e_lo, mode, counted, k, p, p32, sp, bp, \
            ahead, tally: None
    return _group_counted


@register_jitable(forceinline=True)
def _group_counted(xf, outf, sf, cf, rs, g0, g1, e_lo, mode, counted, k, p, p32, sp, bp, ahead,
                   tally):
    """The element phase of the counted word kernel for blocks g0 .. g1-1 (their bounds,
    scales and largest magnitudes in ``ahead``, as :func:`lpsim.blocks.words._chunk_words`
    leaves them): values into ``outf``, and the counters as
    :func:`lpsim.blocks.kernels._blocks_range` counts them added into ``cf`` (zeros on
    entry): block tb's into row tb (``counted`` 1), or every block's into row 0 (2: the
    call's sums, what lpsim.quantize's stats take).  Inlined into its caller (a call per
    group with its arrays cost a tenth of the kernel's time).

    To nearest where :func:`element_nearest32` holds, a finite block takes it unless its
    largest magnitude times the reciprocal is inf (a tiny given tensor scale: then an
    element's quotient is inf, which element_exact flags as an inf input); other modes
    take :func:`element_fast32`, and :func:`element_exact` the elements it leaves.
    """
    mode = _constant(mode)
    per_block = _constant(counted) == 1
    rmask = -np.int64(mode >= STOCHASTIC)       # deterministic modes read rs[0] only
    near = mode == NEAREST and bp.near32
    maxe, pts = np.float32(bp.max_e), np.float32(bp.pts)
    minn = bits_float32(word(p32.minnorm))
    cw, lw = nearest32_words(p32.m, p32.emin)
    los, ns, s32s, rcs, ams = ahead
    clip_lo, clip_hi, lanes = tally
    c = _no_counts()
    for tb in range(g0, g1):
        j = tb - g0
        lo_, n = los[j], ns[j]
        if n < 0:                               # a NaN or inf in the block
            hi_ = lo_ - n
            if bp.nonfinite_nan:
                sf[tb] = np.nan
                _nonfinite_block(xf[lo_:hi_], outf[lo_:hi_], outf, False,
                                 cf[tb if per_block else 0])
                continue
            amax = _finite_amax(xf[lo_:hi_])
            s, clipped = block_scale(amax, bp, sp)
            sf[tb] = s
            recip = block_recip(s, bp)
            nonzero = np.int64(0)
            for e in range(lo_, hi_):
                flags, nz = _exact_step(xf, outf, e, e_lo, rs, rmask, recip, s, mode, k, p, bp)
                c = _tally(c, flags)
                nonzero += nz
            c = _tally_block(c, np.int64(clipped), np.int64(amax != 0 and nonzero == 0))
        else:
            am, rc, s32 = ams[j], rcs[j], s32s[j]
            clipped = np.int64(am != 0 and (am < clip_lo or am >= clip_hi))
            top = bits_float32(word(am))
            if near and top * rc < np.inf:
                if not per_block and n == 32:
                    _lanes_nearest(xf, outf, lanes, np.uint64(lo_), 32, rc, s32, pts, maxe,
                                   minn, cw, lw, bp.pow2)
                elif not per_block and n == 16:
                    _lanes_nearest(xf, outf, lanes, np.uint64(lo_), 16, rc, s32, pts, maxe,
                                   minn, cw, lw, bp.pow2)
                else:
                    c = _block_nearest(xf, outf, c, lo_, n, rc, s32, pts, maxe, minn, cw, lw,
                                       bp.pow2)
                # flushed: the largest magnitude (the largest quotient) rounds to 0
                _, _, qtop = element_nearest32_flags(top, rc, s32, pts, maxe, minn, cw, lw,
                                                     bp.pow2)
                c = _tally_block(c, clipped, np.int64(am != 0 and qtop == 0))
            else:
                c, nonzero, slow = _block_words(xf, outf, c, rs, lo_, lo_ - e_lo, n, rc, s32,
                                                mode, k, p32, bp)
                if slow != 0:
                    s = sf[tb]
                    recip = block_recip(s, bp)
                    for e in range(lo_, lo_ + n):
                        if element_ok32(xf[e], rc, p32) == 0:
                            flags, nz = _exact_step(xf, outf, e, e_lo, rs, rmask, recip, s,
                                                    mode, k, p, bp)
                            c = _tally(c, flags)
                            nonzero += nz
                c = _tally_block(c, clipped, np.int64(am != 0 and nonzero == 0))
        if per_block:
            _store(cf, tb, c)
            c = _no_counts()
    if not per_block:
        _store(cf, 0, _tally_lanes(c, lanes) if near else c)
