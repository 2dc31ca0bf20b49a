"""The float32 word kernel's loops: blocks of float32 data on 32-bit words (eight AVX2 lanes;
:mod:`lpsim.word32`).

:func:`_chunk_words` takes a chunk of blocks: per group of SCALE_AHEAD blocks first each
block's largest magnitude, scale and reciprocal (:mod:`lpsim.blocks.word_scales`), then
each block's elements, to nearest by :func:`element_nearest32` (one float32 add and subtract
an element) where it is exact, else by :func:`lpsim.blocks.decisions.element_fast32` and
:func:`lpsim.blocks.decisions.element_exact` for what that leaves.  Blocks of 32 and 16
elements run loops of that literal length.  With counters (a variant compiled apart) the
element phase is :mod:`lpsim.blocks.word_counts`'.  Rows of whole blocks rounded to nearest
with scales that :func:`lpsim.blocks.word_scales.fused_scale` gives (MX's, NVFP4's table)
take one loop over the blocks instead (:func:`_blocks_steps`, which also takes such rows
rounded otherwise without counters: NVFP4's stochastic gradients; counted, the call's sums:
:func:`_chunk_totals`).  :mod:`lpsim.blocks.kernels` compiles these loops
into kernels per rounding mode and splits a call over threads.
"""

from __future__ import annotations

import numpy as np
from numba.core import types
from numba.extending import overload, register_jitable

from ..cpu import _constant, as_bits, literal_jitable
from ..rounding import NEAREST, STOCHASTIC, nearest32_words
from ..word32 import as_int64, word
from .amax import _block_amax32, _finite_amax
from .decisions import (block_recip, block_scale, element_exact, element_fast32,
                        element_nearest32, element_ok32)
from .word_counts import _no_counts, _store, blocks_counted, group_counted
from .word_scales import fused_scale, fused_scales, scale_recip32


@register_jitable(forceinline=True)
def _elements_nearest32(xf, outf, lo, size, rc, s, pts, maxe, cw, lw):
    """:func:`element_nearest32` over the ``size`` elements from ``lo`` (unsigned offsets:
    no negative-index checks; a literal size is a loop LLVM unrolls into vector steps)."""
    for i in range(size):
        j = lo + np.uint64(i)
        outf[j] = element_nearest32(xf[j], rc, s, pts, maxe, cw, lw)


@register_jitable(forceinline=True)
def _block_nearest32(xf, outf, lo, n, rc, s, pts, maxe, cw, lw):
    """:func:`_elements_nearest32` over a block of n elements from ``lo``: a loop of literal
    length for blocks of 32 and 16."""
    if n == 32:
        _elements_nearest32(xf, outf, lo, 32, rc, s, pts, maxe, cw, lw)
    elif n == 16:
        _elements_nearest32(xf, outf, lo, 16, rc, s, pts, maxe, cw, lw)
    else:
        _elements_nearest32(xf, outf, lo, n, rc, s, pts, maxe, cw, lw)


@register_jitable(forceinline=True)
def _element_word(xf, outf, j, r, rc, s, mode, k, p32, bp):
    """Element j by :func:`element_fast32` with the random word ``r``: 1 where it is left to
    the exact step, else 0."""
    _, v, ok, _ = element_fast32(xf[j], r, rc, s, mode, k, p32, bp)
    outf[j] = v
    return 1 - ok


@register_jitable(forceinline=True)
def _elements_words(xf, outf, rs, lo, r0, size, rc, s, mode, k, p32, bp):
    """:func:`element_fast32` over the ``size`` elements from ``lo`` (random words from
    ``r0``); returns how many it left to the exact step.  A loop per kind of mode: the
    stochastic one reads its words in order (one vector load), where an index masked to 0
    for the deterministic modes, ``rs[(r0 + i) & mask]``, made the compiler gather them
    word by word (the loop took 3.7 times as long)."""
    slow = word(np.int32(0))
    if mode >= STOCHASTIC:
        for i in range(size):
            slow += _element_word(xf, outf, lo + np.uint64(i), word(rs[r0 + np.uint64(i)]),
                                  rc, s, mode, k, p32, bp)
    else:
        r = word(rs[0])
        for i in range(size):
            slow += _element_word(xf, outf, lo + np.uint64(i), r, rc, s, mode, k, p32, bp)
    return slow


@register_jitable
def _exact_left(xf, outf, rs, lo, n, e_lo, rc, s, mode, k, p, p32, bp):
    """:func:`element_exact` for each element of the block of ``n`` from ``lo`` that
    :func:`element_fast32` left (its ``ok`` 0: NaN, inf, a product that underflowed), with
    the block's scale ``s`` and reciprocal ``rc`` (random words from ``rs``, element
    ``e_lo``'s first).  Not inlined: blocks rarely need it."""
    rmask = -np.int64(mode >= STOCHASTIC)       # deterministic modes read rs[0] only
    recip = block_recip(s, bp)
    for e in range(lo, lo + n):
        if element_ok32(xf[e], rc, p32) == 0:
            _, outf[e], _ = element_exact(xf[e], recip, s, mode,
                                          np.int64(rs[(e - e_lo) & rmask]), k, p, bp)


#: blocks of :func:`_chunk_words` whose scales are found before their elements are rounded:
#: one block's scale is a chain of dependent steps (largest magnitude, divisions, rounding,
#: reciprocal), and with the scales of a group found first the chains of different blocks
#: overlap one another and the element loops
SCALE_AHEAD = 16


@register_jitable
def scale_ahead_scratch():
    """The per-group arrays of :func:`_chunk_words`: first element and length of each block
    (a length below 0: a block with a NaN or inf), its float32 scale and reciprocal, and
    (for the counted variant) its largest magnitude bits."""
    return (np.empty(SCALE_AHEAD, np.int64), np.empty(SCALE_AHEAD, np.int64),
            np.empty(SCALE_AHEAD, np.float32), np.empty(SCALE_AHEAD, np.float32),
            np.empty(SCALE_AHEAD, np.int64))


@literal_jitable
def _group_elements(xf, outf, sf, rs, g0, g1, e_lo, mode, k, p, p32, sp, bp, ahead):
    """The element phase of :func:`_chunk_words` for blocks g0 .. g1-1 in every case (blocks
    with a NaN or inf, the general element step): a function of its own, so that the
    nearest-rounding loop of :func:`_chunk_words` compiles without this code around it."""
    mode = _constant(mode)
    near = mode == NEAREST and bp.near32
    rmask = -np.int64(mode >= STOCHASTIC)       # deterministic modes read rs[0] only
    maxe, pts = np.float32(bp.max_e), np.float32(bp.pts)
    cw, lw = nearest32_words(p32.m, p32.emin)
    los, ns, s32s, rcs, _ = ahead
    for tb in range(g0, g1):                # the group's elements
        j = tb - g0
        lo_, n = los[j], ns[j]
        if n < 0:
            hi_ = lo_ - n
            if bp.nonfinite_nan:
                sf[tb] = np.nan
                for e in range(lo_, hi_):
                    outf[e] = np.nan
                continue
            s, _ = block_scale(_finite_amax(xf[lo_:hi_]), bp, sp)
            sf[tb] = s
            recip = block_recip(s, bp)
            for e in range(lo_, hi_):
                _, outf[e], _ = element_exact(xf[e], recip, s, mode,
                                              np.int64(rs[(e - e_lo) & rmask]), k, p, bp)
            continue
        lo, rc, s32 = np.uint64(lo_), rcs[j], s32s[j]
        if near:
            _block_nearest32(xf, outf, lo, n, rc, s32, pts, maxe, cw, lw)
            continue
        r0 = np.uint64(lo_ - e_lo)
        if n == 32:
            slow = _elements_words(xf, outf, rs, lo, r0, 32, rc, s32, mode, k, p32, bp)
        elif n == 16:
            slow = _elements_words(xf, outf, rs, lo, r0, 16, rc, s32, mode, k, p32, bp)
        else:
            slow = _elements_words(xf, outf, rs, lo, r0, n, rc, s32, mode, k, p32, bp)
        if slow != 0:
            _exact_left(xf, outf, rs, lo_, n, e_lo, rc, sf[tb], mode, k, p, p32, bp)


@register_jitable(forceinline=True)
def _blocks_steps(xf, outf, sf, rs, xb, bam, tb, t_end, lo, e_lo, size, steps, cinf, near, pts,
                  maxe, cw, lw, mode, k, p, p32, bp):
    """Blocks tb .. t_end-1 of ``size`` elements each, end to end from element ``lo``, with
    their scales from :func:`fused_scale` (largest magnitudes from ``bam`` where it is not
    empty), up to a block with a NaN or inf: returns its index (t_end if none) and leaves it
    to the caller.  ``near``: :func:`element_nearest32` over the elements; else
    :func:`element_fast32` (random words from ``rs``, element ``e_lo``'s first), then
    :func:`element_exact` for any element that step left.  One plain loop: with each
    block's steps (largest magnitude, scale, elements) in one iteration the processor
    overlaps those of neighbouring blocks itself (MX blocks of 32 to nearest took half the
    time of the grouped loop)."""
    stored = bam.size != 0
    lo = np.uint64(lo)
    for b in range(tb, t_end):
        am = word(bam[b]) if stored else _block_amax32(xb, lo, size)
        if am >= cinf:
            return b
        s32, rc = fused_scale(am, bp, steps)
        sf[b] = s32
        if near:
            _elements_nearest32(xf, outf, lo, size, rc, s32, pts, maxe, cw, lw)
        elif _elements_words(xf, outf, rs, lo, lo - np.uint64(e_lo), size, rc, s32, mode, k,
                             p32, bp) != 0:
            _exact_left(xf, outf, rs, np.int64(lo), size, e_lo, rc, sf[b], mode, k, p, p32, bp)
        lo += np.uint64(size)
    return t_end


@register_jitable(forceinline=True)
def _blocks_sized(xf, outf, sf, rs, xb, bam, tb, t_end, lo, e_lo, size, steps, cinf, near, pts,
                  maxe, cw, lw, mode, k, p, p32, bp):
    """:func:`_blocks_steps` with a literal block size for blocks of 32 and 16 (loops that
    LLVM unrolls into vector steps)."""
    if size == 32:
        return _blocks_steps(xf, outf, sf, rs, xb, bam, tb, t_end, lo, e_lo, 32, steps, cinf,
                             near, pts, maxe, cw, lw, mode, k, p, p32, bp)
    if size == 16:
        return _blocks_steps(xf, outf, sf, rs, xb, bam, tb, t_end, lo, e_lo, 16, steps, cinf,
                             near, pts, maxe, cw, lw, mode, k, p, p32, bp)
    return _blocks_steps(xf, outf, sf, rs, xb, bam, tb, t_end, lo, e_lo, size, steps, cinf,
                         near, pts, maxe, cw, lw, mode, k, p, p32, bp)


def chunk_totals(xf, outf, sf, cf, bam, rs, t, t_end, e_lo, mode, counted, k, p, p32, sp, bp,
                 rct, ri0, rsh, steps, ahead, tally):
    """:func:`_chunk_totals` where ``counted`` (a literal) is 2; nothing (not even typed) for
    another literal (compiled code only)."""
    raise NotImplementedError


@overload(chunk_totals, prefer_literal=True)
def _chunk_totals_overload(xf, outf, sf, cf, bam, rs, t, t_end, e_lo, mode, counted, k, p, p32,
                           sp, bp, rct, ri0, rsh, steps, ahead, tally):
    if not isinstance(counted, types.IntegerLiteral):
        # literals only: where the literal version fails to type, numba reports it, rather
        # than falling back to a version that counts nothing
        return None
    if counted.literal_value == 2:
        return _chunk_totals
    return lambda xf, outf, sf, cf, bam, rs, t, t_end, e_lo, mode, counted, k, p, p32, sp, bp, \
        rct, ri0, rsh, steps, ahead, tally: None


@register_jitable
def _chunk_totals(xf, outf, sf, cf, bam, rs, t, t_end, e_lo, mode, counted, k, p, p32, sp, bp,
                  rct, ri0, rsh, steps, ahead, tally):
    """:func:`_chunk_words` counted, the call's sums (``counted`` 2), of rows of whole blocks
    of 32 or 16 elements with :func:`fused_scale`'s scales: one loop over the blocks
    (:func:`lpsim.blocks.word_counts.blocks_counted`), and the grouped step of
    :func:`lpsim.blocks.word_counts.group_counted` for a block it leaves (a NaN or inf, or
    to nearest an infinite largest quotient)."""
    xb = as_bits(xf)
    size = bp.block
    cinf = word(np.int32(255 << 23))
    rounding = _constant(mode)              # mode's value, folded into every step below
    near = rounding == NEAREST and bp.near32
    los, ns, s32s, rcs, ams = ahead
    c = _no_counts()
    tb = t
    while tb < t_end:
        lo = e_lo + (tb - t) * size
        # near and the size as constants at each call: each loop compiles with its own step
        if near and size == 32:
            bad, c = blocks_counted(xf, outf, sf, rs, xb, bam, tb, t_end, lo, e_lo, 32, steps,
                                    cinf, True, rounding, k, p, p32, bp, tally, ahead, c)
        elif near:
            bad, c = blocks_counted(xf, outf, sf, rs, xb, bam, tb, t_end, lo, e_lo, 16, steps,
                                    cinf, True, rounding, k, p, p32, bp, tally, ahead, c)
        elif size == 32:
            bad, c = blocks_counted(xf, outf, sf, rs, xb, bam, tb, t_end, lo, e_lo, 32, steps,
                                    cinf, False, rounding, k, p, p32, bp, tally, ahead, c)
        else:
            bad, c = blocks_counted(xf, outf, sf, rs, xb, bam, tb, t_end, lo, e_lo, 16, steps,
                                    cinf, False, rounding, k, p, p32, bp, tally, ahead, c)
        if bad == t_end:
            break
        lo_ = e_lo + (bad - t) * size
        am = word(bam[bad]) if bam.size != 0 else _block_amax32(xb, np.uint64(lo_), size)
        los[0], ns[0], ams[0] = lo_, size, as_int64(am)
        if am >= cinf:
            ns[0] = -size
        else:
            sf[bad], s32s[0], rcs[0] = scale_recip32(am, bp, sp, rct, ri0, rsh)
        group_counted(xf, outf, sf, cf, rs, bad, bad + 1, e_lo, mode, counted, k, p, p32, sp,
                      bp, ahead, tally)
        tb = bad + 1
    _store(cf, 0, c)


@literal_jitable
def _chunk_words(xf, outf, sf, cf, bam, rs, t, t_end, e_lo, mode, counted, k, p, p32, sp, bp,
                 length, nblk, rct, ri0, rsh, steps, ahead, tally):
    """Blocks t .. t_end-1 of the flat float32 arrays (element e_lo has random word rs[0])
    on 32-bit words; with ``counted`` (a literal: 0 compiles no counting) the counters
    added into ``cf``: each block's into its row (1) or all into row 0 (2), by
    :func:`lpsim.blocks.word_counts.group_counted` (``tally``: its
    :func:`lpsim.blocks.word_counts.tally_scratch`).

    Per group of SCALE_AHEAD blocks, first each block's largest magnitude, scale
    (:func:`scale_recip32`) and reciprocal, then each block's element loop
    (:func:`element_nearest32` for nearest rounding where :func:`nearest_words_exact` holds,
    else :func:`element_fast32`, then :func:`element_exact` for what it left).  Blocks of
    32 and 16 elements run loops of that literal length: a loop of a run-time length this
    short spends more on its set-up than on its elements.  A block with a NaN or inf is
    NaN (``nonfinite="nan"``) or takes the exact step throughout.  ``rct``, ``ri0``,
    ``rsh``: the reciprocals of the scale's values (:func:`_reciprocals`); ``steps``: the
    scales as a table (:func:`_scale_steps`, used where it is not empty); ``ahead``:
    :func:`scale_ahead_scratch`; ``bam``: each block's largest magnitude bits
    (:func:`block_amaxes`), or empty (each block finds its own).  Nearest rounding of rows
    of whole blocks with :func:`fused_scale`'s scales runs :func:`_blocks_steps`
    instead, or counted to the call's sums :func:`_chunk_totals`.
    """
    counting = _constant(counted) != 0
    near = _constant(mode) == NEAREST and bp.near32 and not counting
    xb = as_bits(xf)
    size = bp.block
    cinf = word(np.int32(255 << 23))
    maxe, pts = np.float32(bp.max_e), np.float32(bp.pts)
    cw, lw = nearest32_words(p32.m, p32.emin)
    los, ns, s32s, rcs, ams = ahead
    step_base, step_thr, svals, rvals, kshift = steps
    full = length == nblk * size                # every block of a row has size elements
    if not counting and full and fused_scales(bp, steps):
        tb = t
        while tb < t_end:
            lo = e_lo + (tb - t) * size
            # near as a constant at each call: each loop compiles with its element step alone
            if near:
                bad = _blocks_sized(xf, outf, sf, rs, xb, bam, tb, t_end, lo, e_lo, size,
                                    steps, cinf, True, pts, maxe, cw, lw, mode, k, p, p32, bp)
            else:
                bad = _blocks_sized(xf, outf, sf, rs, xb, bam, tb, t_end, lo, e_lo, size,
                                    steps, cinf, False, pts, maxe, cw, lw, mode, k, p, p32, bp)
            if bad == t_end:
                return
            los[0], ns[0] = e_lo + (bad - t) * size, -size          # a NaN or inf in it
            _group_elements(xf, outf, sf, rs, bad, bad + 1, e_lo, mode, k, p, p32, sp, bp,
                            ahead)
            tb = bad + 1
        return
    if (_constant(counted) == 2 and full and (size == 32 or size == 16)
            and fused_scales(bp, steps)):
        chunk_totals(xf, outf, sf, cf, bam, rs, t, t_end, e_lo, mode, counted, k, p, p32, sp,
                     bp, rct, ri0, rsh, steps, ahead, tally)
        return
    stored = bam.size != 0
    # the blocks' bounds by counting along the rows: _block_bounds' integer divisions per
    # block cost about as much as a 16-element block's rounding
    row_lo, col = (t // nblk) * length, t % nblk
    for g0 in range(t, t_end, SCALE_AHEAD):
        g1 = min(g0 + SCALE_AHEAD, t_end)
        nonfinite = 0
        # a group of whole blocks within one row: its bounds without the count's carried
        # dependency, which costs a sixth of a 16-element block
        simple = col + (g1 - g0) < nblk or (col + (g1 - g0) == nblk and full)
        if simple:
            base = row_lo + col * size
            for j in range(g1 - g0):
                los[j] = base + j * size
                ns[j] = size
            col += g1 - g0
            if col == nblk:
                col = 0
                row_lo += length
        else:
            for j in range(g1 - g0):
                lo_ = row_lo + col * size
                los[j] = lo_
                ns[j] = min(lo_ + size, row_lo + length) - lo_
                col += 1
                if col == nblk:
                    col = 0
                    row_lo += length
        for tb in range(g0, g1):                # the group's scales
            j = tb - g0
            lo_, n_ = los[j], ns[j]
            lo = np.uint64(lo_)
            if stored:
                am = word(bam[tb])
            elif n_ == 32:
                am = _block_amax32(xb, lo, 32)
            elif n_ == 16:
                am = _block_amax32(xb, lo, 16)
            else:
                am = _block_amax32(xb, lo, n_)
            if counting:
                ams[j] = as_int64(am)
            if am >= cinf:                      # a NaN or inf in the block
                ns[j] = -n_
                nonfinite += 1
                continue
            if step_base.size:                  # the table of the scale's steps
                a = as_int64(am)
                key = a >> kshift
                i = step_base[key] + np.int64(a >= step_thr[key])
                s32 = svals[i]
                sf[tb] = s32
                s32s[j] = s32
                rcs[j] = rvals[i]
                continue
            s, s32s[j], rcs[j] = scale_recip32(am, bp, sp, rct, ri0, rsh)
            sf[tb] = s
        if near and nonfinite == 0:             # the group's elements, to nearest
            for j in range(g1 - g0):
                _block_nearest32(xf, outf, np.uint64(los[j]), ns[j], rcs[j], s32s[j], pts,
                                 maxe, cw, lw)
            continue
        if counting:
            group_counted(xf, outf, sf, cf, rs, g0, g1, e_lo, mode, counted, k, p, p32, sp,
                          bp, ahead, tally)
            continue
        _group_elements(xf, outf, sf, rs, g0, g1, e_lo, mode, k, p, p32, sp, bp, ahead)
