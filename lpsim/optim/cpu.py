"""The fused CPU step: one pass over weight, gradient and states per parameter (numba).

Two routes to the same bits, both through :mod:`lpsim.optim.step`:

* the vectorised route (float32 / bfloat16 storage): per chunk of CHUNK elements held in
  cache, one simple loop per line of the step (the functions of :mod:`lpsim.optim.step`),
  and every rounding through lpsim.quantize's own vectorised pass
  (:func:`lpsim.rounding.round_fast`, then round_bits on the rare rest; bfloat16 AdamW
  states to nearest in one loop from their codes to their codes, :func:`_moments_bf16`),
  so each loop vectorises and the data still crosses memory once;
* the quad route (:func:`lpsim.optim.step.step_quad`: float16 storage), which lpsim_cuda
  runs too.

Work is dealt out to numba's thread count with the GIL released; the bits do not depend on
the split (counter-based random words).
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit
from numba.extending import register_jitable

from lpsim.cpu import (GROUP, as_bits, bf16_step, entry_point, fast_pass, fill_words,
                       nearest32_consts, nearest32_rest, slow_pass)
from lpsim.pool import deal, pieces, threads
from lpsim.rounding import NEAREST, STOCHASTIC
from lpsim.word32 import as_int64, bits_float32, float32_bits, like, word

from .step import (ADAMW, KAHAN, NCOUNTS, REMAINDER, STORE_BF16, STORE_F16, adamw_moments,
                   adamw_update, join_remainder, kahan_comp, kahan_y, sgd_buffer,
                   quiet_nan, sgd_gradient, sgd_update, split_remainder, step_quad)

#: elements per chunk of the vectorised route (a multiple of 4: whole Philox blocks)
CHUNK = 4096
#: elements per extra thread: a step costs ten or more times a plain rounding per element
#: (lpsim.cpu's grain), so threads pay from smaller tensors
PARALLEL_GRAIN = 1 << 17


@njit(nogil=True, cache=True, error_model="numpy")
def _optim_step_quads(wb, gb, mb, vb, cb, rb, kinds, hp, ints, keys, offset, pw, pc, ps, sp16,
                      q0, q1):
    """Step quads q0 .. q1-1 (global quad indices); returns the NCOUNTS counters."""
    counts = np.zeros(NCOUNTS, np.int64)
    run_quads(wb, gb, mb, vb, cb, rb, kinds, hp, ints, keys, offset, pw, pc, ps, sp16, q0, q1,
              counts)
    return counts


@register_jitable
def _decode(src, kind, dst):
    """float32 container bits of stored codes (float32 or bfloat16)."""
    if kind == STORE_BF16:
        for j in range(src.size):
            dst[j] = np.int64(src[j]) << 16
    else:
        for j in range(src.size):
            dst[j] = src[j]


@register_jitable
def _encode(src, kind, dst):
    """Stored codes of float32 container bits already rounded to the storage's format."""
    if kind == STORE_BF16:
        for j in range(src.size):
            dst[j] = src[j] >> 16
    else:
        for j in range(src.size):
            dst[j] = src[j]


@register_jitable
def _quiet_nans(bits):
    """Every NaN of a float32 bits array made QUIET_NAN, in place (lpsim.optim.step.quiet_nan,
    in 32-bit words): run on the arrays whose rounding left elements to the slow pass,
    since round_fast declines every NaN, so a chunk without NaNs pays nothing (the loop
    costs 0.06 ns an element, 5% of a bfloat16 step if it ran on every stored array)."""
    for j in range(bits.size):
        bits[j] = as_int64(quiet_nan(word(bits[j])))


@register_jitable
def _round(xb, yb, mode, k, p, rs, left, counts):
    """yb = xb rounded (container bits), quantize's vectorised pass then its slow pass;
    mode < 0: copied unrounded.  Returns (the inexact count of the fast pass, whether yb may
    hold a NaN: the fast pass left elements, or a copied element is one)."""
    if mode < 0:
        if xb.itemsize != 4:            # float64 bits: not a state (states are float32)
            yb[:] = xb
            return 0, True
        nan = 0
        for j in range(xb.size):
            yb[j] = xb[j]
            nan |= np.int64((xb[j] & 0x7FFFFFFF) > 0x7F800000)
        return 0, nan != 0
    if mode == STOCHASTIC:
        slow, inexact = fast_pass(xb, yb, rs, STOCHASTIC, k, p, left)
    else:
        slow, inexact = fast_pass(xb, yb, rs, NEAREST, k, p, left)
    if slow:
        slow_pass(yb, rs, mode, k, p, left, counts, 0)
    return inexact, slow != 0


@register_jitable
def _moments_bf16(gs, gshift, ms, vs, xf, yf, hp, p):
    """AdamW's moments with bfloat16 states rounded to nearest, from the codes to the codes
    in one loop: g, m and v decoded from their stored codes (``gs`` bfloat16 codes with
    ``gshift`` 16, or float32 bits with 0; ``ms``, ``vs`` bfloat16 codes), the moments,
    lpsim.rounding.nearest_bf16 (five integer operations), and the new codes stored, the
    rounded moments also left in xf, yf (float32) for the update.  What nearest_bf16 does
    not take (NaN, inf, values from bfloat16's largest up) round_bits rounds after
    (nearest32_rest), and the codes of such a chunk are stored again with NaNs made quiet.
    The bits of decoding, the moments, two rounding passes and encoding, in one pass over
    the chunk instead of six.  ``p``: bfloat16's float32-container params (a bfloat16
    state's format is bfloat16 itself).  Returns whether the moments may hold a NaN."""
    _, _, lim, _ = nearest32_consts(p)
    slow = word(np.int32(0))
    for j in range(xf.size):
        g = bits_float32(word(np.int32(gs[j])) << gshift)
        m0 = bits_float32(word(np.int32(ms[j])) << 16)
        v0 = bits_float32(word(np.int32(vs[j])) << 16)
        m, v = adamw_moments(g, m0, v0, hp)
        mr, okm = bf16_step(m, lim)
        vr, okv = bf16_step(v, lim)
        xf[j] = mr
        yf[j] = vr
        ms[j] = as_int64(float32_bits(mr) >> 16)
        vs[j] = as_int64(float32_bits(vr) >> 16)
        slow |= (okm & okv) ^ 1
    if slow != 0:                       # declined elements hold their moment
        nearest32_rest(xf, 0, xf.size, lim, p)
        nearest32_rest(yf, 0, yf.size, lim, p)
        x, y = as_bits(xf), as_bits(yf)
        _quiet_nans(x)
        _quiet_nans(y)
        _encode(x, STORE_BF16, ms)
        _encode(y, STORE_BF16, vs)
    return slow != 0


@register_jitable
def _chunk(lo, hi, wb, gb, mb, vb, cb, rb, kinds, hp, ints, keys, offset, pw, pc, ps, s32, s64,
           words, left, counts, scratch_counts):
    """Step local elements lo .. hi-1 (one chunk) by the vectorised route: simple loops over
    the chunk in cache, each running a line of :mod:`lpsim.optim.step`."""
    n = hi - lo
    wkind, gkind, skind = kinds
    algo, update, wmode, wk, smode, sk, nesterov, first = ints
    seed_lo, seed_hi, stream_w, stream_m, stream_v = keys
    hasm = algo == ADAMW or hp[10] != 0
    w, g, m, v, x, y, u, c = (s32[0, :n], s32[1, :n], s32[2, :n], s32[3, :n], s32[4, :n],
                              s32[5, :n], s32[6, :n], s32[7, :n])
    wf, gf, mf, vf, xf, yf, uf, cf = (w.view(np.float32), g.view(np.float32),
                                      m.view(np.float32), v.view(np.float32),
                                      x.view(np.float32), y.view(np.float32),
                                      u.view(np.float32), c.view(np.float32))
    s, t = s64[0, :n], s64[1, :n]
    sf, tf = s.view(np.float64), t.view(np.float64)
    rw, rm, rv = words[0], words[1], words[2]
    b0 = (lo + offset) // 4                  # the Philox block of local element lo
    nb = (hi + offset + 3) // 4 - b0
    if wmode == STOCHASTIC:
        fill_words(rw, 32, b0, nb, stream_w, seed_lo, seed_hi)
    if smode == STOCHASTIC:
        fill_words(rm, 32, b0, nb, stream_m, seed_lo, seed_hi)
        if algo == ADAMW:
            fill_words(rv, 32, b0, nb, stream_v, seed_lo, seed_hi)
    j0 = lo + offset - 4 * b0               # element lo's place in its block
    rws, rms, rvs = rw[j0:], rm[j0:], rv[j0:]
    _decode(wb[lo:hi], wkind, w)
    # bfloat16 AdamW states to nearest: decoded, stepped, rounded and stored in one loop
    codes = algo == ADAMW and smode == NEAREST and skind == STORE_BF16
    if not codes:
        _decode(gb[lo:hi], gkind, g)
        if hasm:
            _decode(mb[lo:hi], skind, x)
    if algo == ADAMW:
        if codes:
            _moments_bf16(gb[lo:hi], 16 if gkind == STORE_BF16 else 0, mb[lo:hi], vb[lo:hi],
                          xf, yf, hp, ps)
        else:
            _decode(vb[lo:hi], skind, y)
            for j in range(n):
                mf[j], vf[j] = adamw_moments(gf[j], xf[j], yf[j], hp)
            nans = _round(m, x, smode, sk, ps, rms, left, scratch_counts)[1]
            nans |= _round(v, y, smode, sk, ps, rvs, left, scratch_counts)[1]
        for j in range(n):
            uf[j] = adamw_update(xf[j], yf[j], wf[j], hp)
        if not codes:
            if nans:
                _quiet_nans(x)
                _quiet_nans(y)
            _encode(x, skind, mb[lo:hi])
            _encode(y, skind, vb[lo:hi])
    else:
        for j in range(n):
            gf[j] = sgd_gradient(gf[j], wf[j], hp)
        if hasm:
            for j in range(n):
                mf[j] = sgd_buffer(gf[j], xf[j], hp, first)
            if _round(m, x, smode, sk, ps, rms, left, scratch_counts)[1]:
                _quiet_nans(x)
            _encode(x, skind, mb[lo:hi])
        for j in range(n):
            uf[j] = sgd_update(gf[j], xf[j], hp, nesterov)
    if update == KAHAN:
        _decode(cb[lo:hi], skind, c)
        for j in range(n):
            cf[j] = kahan_y(uf[j], cf[j])                        # c now holds y
            sf[j] = np.float64(wf[j]) + np.float64(cf[j])
    elif update == REMAINDER:
        for j in range(n):                                       # y: the float32 master
            y[j] = join_remainder(wb[lo + j], rb[lo + j])
            sf[j] = np.float64(yf[j]) - np.float64(uf[j])
    else:
        for j in range(n):
            sf[j] = np.float64(wf[j]) - np.float64(uf[j])
    # not counts[0] += _round(..., counts): the slow pass adds its own inexact elements to
    # counts[0] inside the call, and the += would store over them with the value read before
    fast_inexact, nans = _round(s, t, wmode if update < KAHAN else NEAREST, wk, pw, rws, left,
                                counts)
    counts[0] += fast_inexact
    # the new weights go through the float32 array xf and are read back as bits (x): a
    # scalar .view(np.int32) in the loop keeps it from vectorising (5x slower)
    for j in range(n):
        xf[j] = np.float32(tf[j])
    if nans:                # compared and stored as QUIET_NAN, as the quad route does
        _quiet_nans(x)
    if update == REMAINDER:
        cancelled = 0
        for j in range(n):
            cancelled += np.int64((uf[j] != 0) & (x[j] == y[j]))
            code, rem = split_remainder(x[j])
            wb[lo + j] = code
            rb[lo + j] = rem
        counts[6] += cancelled
        return
    if update == KAHAN:
        for j in range(n):
            sf[j] = kahan_comp(tf[j], wf[j], cf[j])
        nans = _round(s, s64[2, :n], NEAREST, wk, pc, rws, left, scratch_counts)[1]
        cc = s64[2, :n].view(np.float64)
        for j in range(n):
            cf[j] = np.float32(cc[j])
        if nans:
            _quiet_nans(c)
        _encode(c, skind, cb[lo:hi])
    # the cancelled updates counted in the loop that stores the codes, in 32-bit words
    # (a chunk holds fewer than 2**31 elements): one pass over x instead of two
    cancelled = word(np.int32(0))
    wbs = wb[lo:hi]
    if wkind == STORE_BF16:
        for j in range(n):
            cancelled += like(cancelled, (uf[j] != 0) & (x[j] == w[j]))
            wbs[j] = x[j] >> 16
    else:
        for j in range(n):
            cancelled += like(cancelled, (uf[j] != 0) & (x[j] == w[j]))
            wbs[j] = x[j]
    counts[6] += as_int64(cancelled)


@register_jitable
def scratch(size):
    """The working arrays of :func:`run_chunks` for chunks of at most ``size`` elements."""
    return (np.empty((8, size), np.int32), np.empty((3, size), np.int64),
            np.empty((3, size + 8), np.int64), np.empty((size + GROUP - 1) // GROUP, np.int64),
            np.zeros(NCOUNTS, np.int64))


@register_jitable
def run_chunks(wb, gb, mb, vb, cb, rb, kinds, hp, ints, keys, offset, pw, pc, ps, c0, c1,
               work, counts):
    """Step chunks c0 .. c1-1 of one tensor (chunk ch: its elements of global indices
    ch * CHUNK .. (ch + 1) * CHUNK - 1, counted from the chunk of ``offset``), adding the
    NCOUNTS counters to ``counts``; ``work``: :func:`scratch` of at least the longest chunk."""
    n = wb.size
    s32, s64, words, left, scratch_counts = work
    for ch in range(c0, c1):
        lo = max(ch * CHUNK - offset % CHUNK, 0)       # chunks aligned to global indices
        hi = min((ch + 1) * CHUNK - offset % CHUNK, n)
        if hi > lo:
            _chunk(lo, hi, wb, gb, mb, vb, cb, rb, kinds, hp, ints, keys, offset, pw, pc, ps,
                   s32, s64, words, left, counts, scratch_counts)


@register_jitable
def run_quads(wb, gb, mb, vb, cb, rb, kinds, hp, ints, keys, offset, pw, pc, ps, sp16, q0, q1,
              counts):
    """Step quads q0 .. q1-1 (global quad indices) of one tensor by the quad route."""
    n = wb.size
    for q in range(q0, q1):
        step_quad(q, n, offset, wb, gb, mb, vb, cb, rb, kinds, hp, ints, keys, pw, pc, ps,
                  sp16, counts)


@register_jitable
def _chunks(wb, gb, mb, vb, cb, rb, kinds, hp, ints, keys, offset, pw, pc, ps, c0, c1):
    counts = np.zeros(NCOUNTS, np.int64)
    work = scratch(min(wb.size, CHUNK))  # the longest chunk: small parameters, small scratch
    run_chunks(wb, gb, mb, vb, cb, rb, kinds, hp, ints, keys, offset, pw, pc, ps, c0, c1, work,
               counts)
    return counts


@njit(nogil=True, cache=True, error_model="numpy")
def _optim_step_vectorised(wb, gb, mb, vb, cb, rb, kinds, hp, ints, keys, offset, pw, pc,
                           ps, c0, c1):
    """Step chunks c0 .. c1-1 by the vectorised route; returns the NCOUNTS counters."""
    return _chunks(wb, gb, mb, vb, cb, rb, kinds, hp, ints, keys, offset, pw, pc, ps, c0, c1)


def vectorised(kinds, ints) -> bool:
    """Whether the vectorised route takes this configuration (else the quad route)."""
    return STORE_F16 not in kinds


def bits_view(t: torch.Tensor | None, like: np.ndarray | None = None) -> np.ndarray:
    """The flat integer view of a contiguous CPU tensor's bits (a 1-element dummy for None)."""
    if t is None:
        return np.zeros(1, like.dtype if like is not None else np.int16)
    t = t.detach()
    itype = {4: torch.int32, 2: torch.int16}[t.element_size()]
    return t.view(itype).reshape(-1).numpy()


#: (kernel, the dtypes of its six arrays) -> its compiled entry point
_ENTRIES: dict = {}


def _entry(kernel, args):
    """``kernel``'s compiled entry point for ``args`` (lpsim.cpu.entry_point), called without
    numba's typing of three 20-field Params and the tuples, which costs more than stepping a
    small parameter.  Every other argument has one type (int64, float32 tuples, Params)."""
    key = (kernel,) + tuple(a.dtype.char for a in args[:6])
    try:
        return _ENTRIES[key]
    except KeyError:
        pass
    _ENTRIES[key] = ep = entry_point(kernel, args, "lpsim.optim's CPU step kernel")
    return ep


def step(wb, gb, mb, vb, cb, rb, kinds, hp, ints, keys, offset, setup) -> np.ndarray:
    """Run the kernel over a parameter's bits (numpy views, written in place)."""
    n = wb.size
    if vectorised(kinds, ints):
        kernel, first, last = _optim_step_vectorised, 0, (offset % CHUNK + n + CHUNK - 1) // CHUNK
        args = (wb, gb, mb, vb, cb, rb, kinds, hp, ints, keys, offset, setup.pw, setup.pc,
                setup.ps)
    else:
        kernel, first, last = _optim_step_quads, offset // 4, (offset + n + 3) // 4
        args = (wb, gb, mb, vb, cb, rb, kinds, hp, ints, keys, offset, setup.pw, setup.pc,
                setup.ps, tuple(setup.sp16))
    workers = 1 if n < 2 * PARALLEL_GRAIN else min(threads(), n // PARALLEL_GRAIN)
    entry = _entry(kernel, args + (first, last))
    if workers <= 1:
        return entry(*args, first, last)
    bounds = [first + b for b in pieces(last - first, workers)]
    return sum(deal(lambda a, b: entry(*args, a, b), bounds, workers))
