"""The per-step GEMM kernel: every accumulation step rounded to the accumulator format.

Work is split over output tiles (one row of A against TILE columns of B) and run in a
numba prange; the TILE lanes advance in lockstep so each step is one vectorisable loop.
Every step computes RO(x + y) in float64 (:mod:`lpsim.ops.exact`) and rounds it with
:func:`lpsim.rounding.round_fast` (the common case), then :func:`lpsim.rounding.round_bits`
for the lanes round_fast does not cover.

Random words (the counter of each rounding) are fixed in :func:`lpsim.ops.matmul`'s docs:
output element o (C order) owns counters o*2K .. o*2K + 2K-1; its rounding "slot" s uses
counter o*2K + s, i.e. word (o*2K + s) % 4 of philox(((o*2K + s) // 4, stream), seed).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange
from numba.extending import register_jitable

from ..philox import block_words, lane_word
from ..rounding import NEAREST, STOCHASTIC, round_bits, round_fast
from .exact import f2i, i2f, sum_to_odd

#: output columns per work item (lanes that step together)
TILE = 32
#: deepest pairwise stack (K < 2**62)
STACK = 64
ORDER_BLOCKED, ORDER_PAIRWISE = 0, 1
#: counts: the six rounding counters (lpsim.stats.COUNTERS), then the number of roundings
NCOUNTS = 7


def _make_steps(accumulate, mode):
    """The step loop with ``accumulate`` and ``mode`` fixed, so the first loop vectorises.

    dst[j] = fl(dst[j] + scale*y[j]) (accumulate) or fl(scale*y[j]), for j < w; the second
    loop runs round_bits on the lanes round_fast does not cover.  mode None: any mode (r[j]).
    """
    generic = mode is None
    fixed = 0 if generic else mode

    @register_jitable
    def steps(dst, scale, y, w, any_mode, r, k, p, cnt, tmp):
        m = any_mode if generic else fixed
        bad = 0
        inexact = 0
        for j in range(w):
            sb = sum_to_odd(dst[j] if accumulate else 0.0, scale * y[j])
            nb, ok, inx = round_fast(sb, m, r[j], k, p)
            tmp[j] = sb
            dst[j] = i2f(nb)
            bad += 1 - np.int64(ok)
            inexact += np.int64(inx)
        cnt[0] += inexact
        if bad:
            for j in range(w):
                sb = tmp[j]
                biased = (sb & p.MAG) >> p.M
                if biased < p.fast_lo or biased > p.fast_hi:
                    nb, flags = round_bits(sb, m, r[j], k, p)
                    dst[j] = i2f(nb)
                    for f in range(6):
                        cnt[f] += (flags >> f) & 1
    return steps


_ADD_NEAREST, _ADD_SR, _ADD_ANY = (_make_steps(True, m) for m in (NEAREST, STOCHASTIC, None))
_SET_NEAREST, _SET_SR, _SET_ANY = (_make_steps(False, m) for m in (NEAREST, STOCHASTIC, None))


@njit
def _round_add(dst, scale, y, w, accumulate, mode, r, k, p, hw, cnt, tmp):
    """One step for w lanes: dst = fl(dst + scale*y) or fl(scale*y) (scale*y exact)."""
    cnt[6] += w
    if hw:   # fp64 accumulator, nearest: the float64 sum is the rounded result
        inexact = 0
        for j in range(w):
            x = dst[j] if accumulate else 0.0
            v = scale * y[j]
            s = x + v
            bb = s - x
            inexact += ((x - (s - bb)) + (v - bb)) != 0.0
            dst[j] = s
        cnt[0] += inexact
    elif accumulate:
        if mode == NEAREST:
            _ADD_NEAREST(dst, scale, y, w, mode, r, k, p, cnt, tmp)
        elif mode == STOCHASTIC:
            _ADD_SR(dst, scale, y, w, mode, r, k, p, cnt, tmp)
        else:
            _ADD_ANY(dst, scale, y, w, mode, r, k, p, cnt, tmp)
    elif mode == NEAREST:
        _SET_NEAREST(dst, scale, y, w, mode, r, k, p, cnt, tmp)
    elif mode == STOCHASTIC:
        _SET_SR(dst, scale, y, w, mode, r, k, p, cnt, tmp)
    else:
        _SET_ANY(dst, scale, y, w, mode, r, k, p, cnt, tmp)


@njit(inline="always")
def _fill(R, jj, base, lo, hi, stream, seed_lo, seed_hi):
    """R[s, jj] = the 32-bit word of counter base + s, for slots lo <= s < hi."""
    g = base + lo
    while g < base + hi:
        block = g >> 2
        words = block_words(block, stream, seed_lo, seed_hi)
        for lane in range(4):
            c = block * 4 + lane
            if c >= base + lo and c < base + hi:
                R[c - base, jj] = lane_word(words, lane, 4)
        g = block * 4 + 4


def _gemm(A, B, ia, ib, out, mode, omode, k, ko, pa, po, seed_lo, seed_hi, stream, order,
          blk, fused, hw, ngroups):
    """out[b] = fl(A[ia[b]] @ B[ib[b]]) step by step; returns the NCOUNTS counters."""
    nbatch, M, N = out.shape
    K = A.shape[2]
    ntiles = (N + TILE - 1) // TILE
    nitems = nbatch * M * ntiles
    counts = np.zeros((ngroups, NCOUNTS), np.int64)
    stoch = mode >= STOCHASTIC
    ostoch = omode >= STOCHASTIC
    products_rounded = (not fused) or order == ORDER_PAIRWISE
    for g in prange(ngroups):
        cnt = counts[g]
        R = np.zeros((2 * K if (stoch or ostoch) else 1, TILE), np.int64)
        acc = np.zeros(TILE)
        part = np.zeros(TILE)
        prod = np.zeros(TILE)
        tmp = np.zeros(TILE, np.int64)
        vals = np.zeros((STACK if order == ORDER_PAIRWISE else 1, TILE))
        starts = np.zeros(STACK, np.int64)
        levels = np.zeros(STACK, np.int64)
        pending = np.zeros(STACK, np.bool_)
        for item in range(g * nitems // ngroups, (g + 1) * nitems // ngroups):
            jt = item % ntiles
            i = (item // ntiles) % M
            bt = item // (ntiles * M)
            j0 = jt * TILE
            w = min(TILE, N - j0)
            arow = A[ia[bt], i]
            Bm = B[ib[bt]]
            base0 = ((bt * M + i) * N + j0) * 2 * K
            for jj in range(w):
                base = base0 + jj * 2 * K
                if stoch and products_rounded:
                    _fill(R, jj, base, 0, 2 * K, stream, seed_lo, seed_hi)
                elif stoch:
                    _fill(R, jj, base, K, 2 * K, stream, seed_lo, seed_hi)
                    for h in range(0, K, blk):
                        _fill(R, jj, base, h, h + 1, stream, seed_lo, seed_hi)
                elif ostoch:
                    _fill(R, jj, base, K, K + 1, stream, seed_lo, seed_hi)
            r0 = R[0]
            if order == ORDER_BLOCKED:
                for h in range(0, K, blk):
                    dst = acc if h == 0 else part
                    # first term of the chunk: its product, rounded (slot h)
                    _round_add(dst, arow[h], Bm[h, j0:j0 + w], w, False, mode,
                               R[h] if stoch else r0, k, pa, hw, cnt, tmp)
                    for t in range(h + 1, min(h + blk, K)):
                        brow = Bm[t, j0:j0 + w]
                        if fused:   # FMA into the accumulator (slot K+t)
                            _round_add(dst, arow[t], brow, w, True, mode,
                                       R[K + t] if stoch else r0, k, pa, hw, cnt, tmp)
                        else:       # product (slot t), then the add (slot K+t)
                            _round_add(prod, arow[t], brow, w, False, mode,
                                       R[t] if stoch else r0, k, pa, hw, cnt, tmp)
                            _round_add(dst, 1.0, prod, w, True, mode,
                                       R[K + t] if stoch else r0, k, pa, hw, cnt, tmp)
                    if h > 0:       # chunk combine (slot K+h)
                        _round_add(acc, 1.0, part, w, True, mode,
                                   R[K + h] if stoch else r0, k, pa, hw, cnt, tmp)
            else:
                sp = 0
                for t in range(K + 1):
                    if t < K:       # push leaf t; fused leaves wait to see if an FMA takes them
                        starts[sp] = t
                        levels[sp] = 0
                        pending[sp] = fused
                        if not fused:
                            _round_add(vals[sp], arow[t], Bm[t, j0:j0 + w], w, False, mode,
                                       R[t] if stoch else r0, k, pa, hw, cnt, tmp)
                        sp += 1
                    # combine equal levels while pushing; everything, right to left, at the end
                    while sp >= 2 and (t == K or levels[sp - 1] == levels[sp - 2]):
                        left, right = sp - 2, sp - 1
                        if pending[left]:
                            s = starts[left]
                            _round_add(vals[left], arow[s], Bm[s, j0:j0 + w], w, False, mode,
                                       R[s] if stoch else r0, k, pa, hw, cnt, tmp)
                            pending[left] = False
                        h = starts[right]
                        rr = R[K + h] if stoch else r0
                        if pending[right]:
                            _round_add(vals[left], arow[h], Bm[h, j0:j0 + w], w, True, mode,
                                       rr, k, pa, hw, cnt, tmp)
                        else:
                            _round_add(vals[left], 1.0, vals[right], w, True, mode, rr, k, pa,
                                       hw, cnt, tmp)
                        levels[left] += 1
                        sp -= 1
                if pending[0]:
                    _round_add(vals[0], arow[0], Bm[0, j0:j0 + w], w, False, mode,
                               R[0] if stoch else r0, k, pa, hw, cnt, tmp)
                for jj in range(w):
                    acc[jj] = vals[0, jj]
            # output rounding (slot K)
            for jj in range(w):
                nb, flags = round_bits(f2i(acc[jj]), omode, R[K, jj] if ostoch else 0, ko, po)
                out[bt, i, j0 + jj] = i2f(nb)
                for f in range(6):
                    cnt[f] += (flags >> f) & 1
            cnt[6] += w
    return counts.sum(axis=0)


gemm = njit(parallel=True, cache=True)(_gemm)
