"""The per-step GEMM kernel: every accumulation step rounded to the accumulator format.

Work is split over items of consecutive outputs (:func:`gemm_lanes` of them, in C order); a
call runs a range of them, and large products deal ranges out to a thread pool
(:func:`run`).  The lanes of an item advance in lockstep, so each step is one vectorisable
loop, however small N is.  Inner products with one
output column (``dot``, ``sum``) in sequential or blocked order run :func:`chain`, which
keeps the accumulator in a register (a few integer operations a step).  Deterministic
products in blocked order run :func:`gemm_plain`, the same body without the random-word and
pairwise code, which then never compiles for them (a smaller first compile).
Every step computes RO(x + y) in float64 (:mod:`lpsim.exact`; an exact zero sum is -0
under rounding down, IEEE 754 section 6.3) and rounds it with
:func:`lpsim.rounding.round_fast` (the common case), then :func:`lpsim.rounding.round_bits`
for the lanes round_fast does not cover.

Random words (the counter of each rounding) are fixed in :func:`lpsim.ops.matmul`'s docs:
output element o (C order) owns counters o*2K .. o*2K + 2K-1; its rounding "slot" s uses
counter o*2K + s, i.e. word (o*2K + s) % 4 of philox(((o*2K + s) // 4, stream), seed).
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload, register_jitable

from ..cpu import first_call, literal_jitable, params_of
from ..pool import deal, pieces
from ..philox import block_words, lane_word
from ..rounding import DOWN, MODES, NEAREST, STOCHASTIC, round_bits, round_fast
from ..exact import f2i, i2f, step_sum_to_odd

#: fewest and most outputs per work item of the GEMM (lanes that step together)
TILE = 32
LANES_MAX = 256
#: deepest pairwise stack (K < 2**62)
STACK = 64
ORDER_BLOCKED, ORDER_PAIRWISE = 0, 1
#: counts: the six rounding counters (lpsim.stats.COUNTERS), then the number of roundings
NCOUNTS = 7


@register_jitable
def veltkamp_factor(p):
    """2**(52 - m) + 1 where Veltkamp's split rounds a float64 to nearest in the format of
    ``p`` (signed, 1 <= m <= 50: Boldo's 2 <= sigma <= 51), else 0."""
    if p.unsigned or p.M != 52 or not 1 <= p.m <= 50:
        return 0.0
    return np.float64(np.int64(1) << (52 - p.m)) + 1.0


@register_jitable
def _split_nearest(s, factor):
    """Veltkamp's split: s rounded to m + 1 significant bits, to nearest (an integer-free
    chain of a product and two differences: shorter than bits out, round_fast, bits back).
    Exact where s is inside the format's normal range below its top binade and not a
    midpoint (Boldo, "Pitfalls of a full floating-point proof", IJCAR 2006: the result is a
    rounding to nearest; off a midpoint there is only one)."""
    c = s * factor
    return c - (c - s)


@register_jitable
def _nearby(acc, v, mode, k, p):
    """(bits of fl(acc + v), ok) for a deterministic mode, from s = RN64(acc + v) alone.

    ok when s is in the format's fast range and strictly between two neighbouring points of
    its grid and their midpoints.  Those points are float64 numbers and RN64 is monotone,
    so acc + v lies strictly between the same two points, where every deterministic mode
    decides alike (and the result is inexact): the same bits as rounding RO(acc + v), without
    the TwoSum on the accumulator's dependency chain.  Otherwise the caller rounds RO.
    """
    sb = f2i(acc + v)
    nb, ok, inx = round_fast(sb, mode, 0, k, p)
    s = p.M - p.m
    rem = sb & ((np.int64(1) << s) - 1)
    return nb, ok & np.int64(rem != 0) & np.int64(rem != (np.int64(1) << (s - 1)))


def _make_steps(accumulate, mode):
    """The step loop with ``accumulate`` and ``mode`` fixed, so the first loop vectorises.

    dst[j] = fl(dst[j] + scale*y[j]) (accumulate) or fl(scale*y[j]), for j < w; the second
    loop runs round_bits on the lanes round_fast does not cover.  mode None: any mode (r[j]).
    """
    generic = mode is None
    fixed = 0 if generic else mode
    nearby = accumulate and not generic and mode < STOCHASTIC

    def steps(dst, scale, y, w, any_mode, r, k, p, cnt, tmp):
        m = any_mode if generic else fixed
        bad = 0
        inexact = 0
        if nearby:
            # deterministic: RN64(dst + v) settles most lanes (_nearby); tmp[w + j] = 0
            # marks the others, whose old value waits in tmp[j] for the exact step below
            for j in range(w):
                x = f2i(dst[j])
                nb, ok = _nearby(dst[j], scale * y[j], m, k, p)
                okm = -ok
                tmp[j] = x
                tmp[w + j] = ok
                dst[j] = i2f((nb & okm) | (x & ~okm))
                bad += 1 - ok
                inexact += ok
            cnt[0] += inexact
            if bad:
                for j in range(w):
                    if not tmp[w + j]:
                        sb = step_sum_to_odd(i2f(tmp[j]), scale * y[j], m == DOWN)
                        nb, ok, inx = round_fast(sb, m, 0, k, p)
                        if ok:
                            cnt[0] += inx
                        else:
                            nb, flags = round_bits(sb, m, 0, k, p)
                            for f in range(6):
                                cnt[f] += (flags >> f) & 1
                        dst[j] = i2f(nb)
            return
        for j in range(w):
            # the product alone is exact: its own bits (so -0 stays -0)
            sb = step_sum_to_odd(dst[j], scale * y[j], m == DOWN) if accumulate else \
                f2i(scale * y[j])
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

    # a name of its own: numba's cache must never mix two of these (see lpsim.cpu)
    label = "any" if generic else next(n for n, c in MODES.items() if c == mode)
    steps.__name__ = steps.__qualname__ = f"steps_{'add' if accumulate else 'set'}_{label}"
    return register_jitable(steps)


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
            s = x + v if accumulate else v
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


@register_jitable
def gemm_lanes(K):
    """Outputs per work item of :func:`gemm` (its lanes): many, so that the step loops run
    long even for small N, but few enough that an item's random words (2K per lane) stay
    near the cache."""
    return max(TILE, min(LANES_MAX, (1 << 16) // max(K, 1)))


def gemm_items(nbatch: int, M: int, N: int, K: int) -> int:
    """The number of work items :func:`gemm` splits an (nbatch, M, N) output into."""
    return nbatch * -(-(M * N) // gemm_lanes(K))


@register_jitable
def _products(prod, Ab, Bb, t, o0, w, N):
    """prod[l] = Ab[i, t] * Bb[t, j] (exact) for the outputs o0 + l = i*N + j, l < w: one
    contiguous loop per row the lanes span."""
    l = 0
    o = o0
    while l < w:
        i = o // N
        j = o - i * N
        n = min(N - j, w - l)
        a = Ab[i, t]
        brow = Bb[t]
        for q in range(n):
            prod[l + q] = a * brow[j + q]
        l += n
        o += n


def fill_item(general, R, w, base0, K, blk, stoch, ostoch, products_rounded, stream,
              seed_lo, seed_hi):
    """R[s, jj] = the random word of slot s of the item's lane jj, for the slots its
    roundings use (compiled code only; nothing when ``general`` is the literal False)."""
    raise NotImplementedError


@overload(fill_item, prefer_literal=True)
def _fill_item(general, R, w, base0, K, blk, stoch, ostoch, products_rounded, stream,
               seed_lo, seed_hi):
    if isinstance(general, types.BooleanLiteral) and not general.literal_value:
        return lambda general, R, w, base0, K, blk, stoch, ostoch, products_rounded, \
            stream, seed_lo, seed_hi: None

    def fill(general, R, w, base0, K, blk, stoch, ostoch, products_rounded, stream,
             seed_lo, seed_hi):
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
    return fill


def pairwise_item(general, vals, starts, levels, pending, acc, pt, Ab, Bb, o0, w, N, K, mode,
                  R, r0, stoch, fused, k, pa, hw, cnt, tmp):
    """acc[:w] = the item's sums in pairwise order (compiled code only; nothing when
    ``general`` is the literal False)."""
    raise NotImplementedError


@overload(pairwise_item, prefer_literal=True)
def _pairwise_item(general, vals, starts, levels, pending, acc, pt, Ab, Bb, o0, w, N, K, mode,
                   R, r0, stoch, fused, k, pa, hw, cnt, tmp):
    if isinstance(general, types.BooleanLiteral) and not general.literal_value:
        return lambda general, vals, starts, levels, pending, acc, pt, Ab, Bb, o0, w, N, K, \
            mode, R, r0, stoch, fused, k, pa, hw, cnt, tmp: None

    def pairwise(general, vals, starts, levels, pending, acc, pt, Ab, Bb, o0, w, N, K, mode,
                 R, r0, stoch, fused, k, pa, hw, cnt, tmp):
        SET, ADD = np.bool_(False), np.bool_(True)
        sp = 0
        for t in range(K + 1):
            if t < K:       # push leaf t; fused leaves wait to see if an FMA takes them
                starts[sp] = t
                levels[sp] = 0
                pending[sp] = fused
                if not fused:
                    _products(pt, Ab, Bb, t, o0, w, N)
                    _round_add(vals[sp], 1.0, pt, w, SET, mode,
                               R[t] if stoch else r0, k, pa, hw, cnt, tmp)
                sp += 1
            # combine equal levels while pushing; everything, right to left, at the end
            while sp >= 2 and (t == K or levels[sp - 1] == levels[sp - 2]):
                left, right = sp - 2, sp - 1
                if pending[left]:
                    s = starts[left]
                    _products(pt, Ab, Bb, s, o0, w, N)
                    _round_add(vals[left], 1.0, pt, w, SET, mode,
                               R[s] if stoch else r0, k, pa, hw, cnt, tmp)
                    pending[left] = False
                h = starts[right]
                rr = R[K + h] if stoch else r0
                if pending[right]:
                    _products(pt, Ab, Bb, h, o0, w, N)
                    _round_add(vals[left], 1.0, pt, w, ADD, mode, rr, k, pa, hw, cnt,
                               tmp)
                else:
                    _round_add(vals[left], 1.0, vals[right], w, ADD, mode, rr, k, pa,
                               hw, cnt, tmp)
                levels[left] += 1
                sp -= 1
        if pending[0]:
            _products(pt, Ab, Bb, 0, o0, w, N)
            _round_add(vals[0], 1.0, pt, w, SET, mode, R[0] if stoch else r0, k, pa,
                       hw, cnt, tmp)
        for jj in range(w):
            acc[jj] = vals[0, jj]
    return pairwise


@literal_jitable
def _gemm(A, B, ia, ib, out, mode, omode, k, ko, pva, pvo, seed_lo, seed_hi, stream, order,
          blk, fused, hw, item_lo, item_hi, cnt, general):
    """The body of :func:`gemm` (``general`` True) and :func:`gemm_plain` (False: no
    random words, no pairwise order, so none of their code compiles)."""
    nbatch, M, N = out.shape
    K = A.shape[2]
    L = gemm_lanes(K)
    per_batch = (M * N + L - 1) // L
    pa, po = params_of(pva), params_of(pvo)
    # run-time flags, not literals: one _round_add compiles for both kinds of step
    SET, ADD = np.bool_(False), np.bool_(True)
    stoch = mode >= STOCHASTIC
    ostoch = omode >= STOCHASTIC
    products_rounded = (not fused) or order == ORDER_PAIRWISE
    R = np.zeros((2 * K if (stoch or ostoch) else 1, L), np.int64)
    acc = np.zeros(L)
    part = np.zeros(L)
    prod = np.zeros(L)
    pt = np.zeros(L)
    tmp = np.zeros(2 * L, np.int64)
    vals = np.zeros((STACK if order == ORDER_PAIRWISE else 1, L))
    starts = np.zeros(STACK, np.int64)
    levels = np.zeros(STACK, np.int64)
    pending = np.zeros(STACK, np.bool_)
    for item in range(item_lo, item_hi):
        bt = item // per_batch
        o0 = (item - bt * per_batch) * L
        w = min(L, M * N - o0)
        Ab = A[ia[bt]]
        Bb = B[ib[bt]]
        outb = out[bt]
        base0 = (bt * M * N + o0) * 2 * K
        fill_item(general, R, w, base0, K, blk, stoch, ostoch, products_rounded, stream,
                  seed_lo, seed_hi)
        r0 = R[0]
        if order == ORDER_BLOCKED:
            for h in range(0, K, blk):
                dst = acc if h == 0 else part
                # first term of the chunk: its product, rounded (slot h)
                _products(pt, Ab, Bb, h, o0, w, N)
                _round_add(dst, 1.0, pt, w, SET, mode, R[h] if stoch else r0, k, pa, hw,
                           cnt, tmp)
                for t in range(h + 1, min(h + blk, K)):
                    _products(pt, Ab, Bb, t, o0, w, N)
                    if fused:   # FMA into the accumulator (slot K+t)
                        _round_add(dst, 1.0, pt, w, ADD, mode,
                                   R[K + t] if stoch else r0, k, pa, hw, cnt, tmp)
                    else:       # product (slot t), then the add (slot K+t)
                        _round_add(prod, 1.0, pt, w, SET, mode,
                                   R[t] if stoch else r0, k, pa, hw, cnt, tmp)
                        _round_add(dst, 1.0, prod, w, ADD, mode,
                                   R[K + t] if stoch else r0, k, pa, hw, cnt, tmp)
                if h > 0:       # chunk combine (slot K+h)
                    _round_add(acc, 1.0, part, w, ADD, mode,
                               R[K + h] if stoch else r0, k, pa, hw, cnt, tmp)
        else:
            pairwise_item(general, vals, starts, levels, pending, acc, pt, Ab, Bb, o0, w, N, K,
                          mode, R, r0, stoch, fused, k, pa, hw, cnt, tmp)
        # output rounding (slot K)
        for jj in range(w):
            ab, ro = f2i(acc[jj]), R[K, jj] if ostoch else 0
            nb, ok, inx = round_fast(ab, omode, ro, ko, po)
            if ok:
                cnt[0] += inx
            else:
                nb, flags = round_bits(ab, omode, ro, ko, po)
                for f in range(6):
                    cnt[f] += (flags >> f) & 1
            o = o0 + jj
            i = o // N
            outb[i, o - i * N] = i2f(nb)
        cnt[6] += w


@njit(nogil=True, cache=True)
def gemm(A, B, ia, ib, out, mode, omode, k, ko, pva, pvo, seed_lo, seed_hi, stream, order,
         blk, fused, hw, item_lo, item_hi, cnt):
    """out[b] = fl(A[ia[b]] @ B[ib[b]]) step by step for work items item_lo .. item_hi-1
    (an item: gemm_lanes(K) consecutive outputs of one batch element in C order, the lanes
    that step together); adds the NCOUNTS counters to ``cnt``."""
    _gemm(A, B, ia, ib, out, mode, omode, k, ko, pva, pvo, seed_lo, seed_hi, stream, order,
          blk, fused, hw, item_lo, item_hi, cnt, True)


@njit(nogil=True, cache=True)
def gemm_plain(A, B, ia, ib, out, mode, omode, k, ko, pva, pvo, seed_lo, seed_hi, stream,
               order, blk, fused, hw, item_lo, item_hi, cnt):
    """:func:`gemm` for deterministic modes in blocked (or sequential) order, the common
    case: the same steps, without the code of random words and pairwise order, so its first
    compile takes a fraction of gemm's."""
    _gemm(A, B, ia, ib, out, mode, omode, k, ko, pva, pvo, seed_lo, seed_hi, stream, order,
          blk, fused, hw, item_lo, item_hi, cnt, False)


@register_jitable
def _cached_word(c, cache, stream, seed_lo, seed_hi):
    """The 32-bit word of counter ``c``; ``cache`` (int64[5]: block, its four words) keeps
    the last Philox block, so consecutive counters cost one block per four."""
    b = c >> 2
    if cache[0] != b:
        w0, w1, w2, w3 = block_words(b, stream, seed_lo, seed_hi)
        cache[0], cache[1], cache[2], cache[3], cache[4] = b, w0, w1, w2, w3
    return cache[1 + (c & 3)]


@register_jitable
def _step(acc, v, accumulate, mode, r, k, p, hw, cnt):
    """One rounding of the chain: (fl(acc + v) or fl(v), inexact), v exact, as gemm's steps
    do; the rare flags of round_bits go to ``cnt`` (the caller counts roundings)."""
    if hw:      # fp64 accumulator, nearest: the float64 sum is the rounded result
        if not accumulate:
            return v, 0
        s = acc + v
        bb = s - acc
        return s, np.int64(((acc - (s - bb)) + (v - bb)) != 0.0)
    sb = step_sum_to_odd(acc, v, mode == DOWN) if accumulate else f2i(v)
    nb, ok, inx = round_fast(sb, mode, r, k, p)
    if ok:
        return i2f(nb), inx
    nb, flags = round_bits(sb, mode, r, k, p)
    for f in range(1, 6):
        cnt[f] += (flags >> f) & 1
    return i2f(nb), flags & 1


@register_jitable(forceinline=True)
def _exact_product(a, b):
    """The exact float64 product of two operands that fit float32 (float32 or float64)."""
    return np.float64(a) * np.float64(b)


@njit(nogil=True, cache=True)
def chain(X, Y, out, mode, omode, k, ko, pva, pvo, seed_lo, seed_hi, stream, blk, fused, hw,
          o_lo, o_hi, cnt):
    """out[o] = fl(sum_t X[o, t] Y[o, t]) for o in o_lo .. o_hi-1, in blocked order with
    chunks of ``blk`` terms (blk = K: sequential): the same roundings, random words and
    counters as :func:`gemm` gives a single output column.  The accumulator and the common
    counters stay in registers.  X and Y: float64, or both float32 (read as they are: a
    float64 copy of a long vector cost a fifth of the chain, and page faults after)."""
    K = X.shape[1]
    pa, po = params_of(pva), params_of(pvo)
    split = veltkamp_factor(pa)
    stoch = mode >= STOCHASTIC
    ostoch = omode >= STOCHASTIC
    cache = np.full((2, 5), -1, np.int64)     # product slots, addition slots
    r = np.int64(0)
    inexact = 0
    for o in range(o_lo, o_hi):
        x, y = X[o], Y[o]
        base = o * 2 * K
        acc = 0.0
        for h in range(0, K, blk):
            if stoch:
                r = _cached_word(base + h, cache[0], stream, seed_lo, seed_hi)
            d, inx = _step(0.0, _exact_product(x[h], y[h]), False, mode, r, k, pa, hw, cnt)
            inexact += inx
            end = min(h + blk, K)
            if fused and not stoch and not hw and mode == NEAREST and split != 0.0:
                for t in range(h + 1, end):         # the hot loop, to nearest
                    v = _exact_product(x[t], y[t])
                    _, ok = _nearby(d, v, mode, k, pa)      # off the dependency chain
                    if ok:
                        d = _split_nearest(d + v, split)
                        inexact += 1
                    else:
                        d, inx = _step(d, v, True, mode, r, k, pa, False, cnt)
                        inexact += inx
            elif fused and not stoch and not hw:
                for t in range(h + 1, end):         # the hot loop
                    v = _exact_product(x[t], y[t])
                    nb, ok = _nearby(d, v, mode, k, pa)
                    if ok:
                        d = i2f(nb)
                        inexact += 1
                    else:
                        d, inx = _step(d, v, True, mode, r, k, pa, False, cnt)
                        inexact += inx
            else:
                for t in range(h + 1, end):
                    v = _exact_product(x[t], y[t])
                    if not fused:
                        if stoch:
                            r = _cached_word(base + t, cache[0], stream, seed_lo, seed_hi)
                        v, inx = _step(0.0, v, False, mode, r, k, pa, hw, cnt)
                        inexact += inx
                    if stoch:
                        r = _cached_word(base + K + t, cache[1], stream, seed_lo, seed_hi)
                    d, inx = _step(d, v, True, mode, r, k, pa, hw, cnt)
                    inexact += inx
            cnt[6] += (end - h) + (end - h - 1) * (not fused)
            if h == 0:
                acc = d
            else:
                if stoch:
                    r = _cached_word(base + K + h, cache[1], stream, seed_lo, seed_hi)
                acc, inx = _step(acc, d, True, mode, r, k, pa, hw, cnt)
                inexact += inx
                cnt[6] += 1
        ro = _cached_word(base + K, cache[1], stream, seed_lo, seed_hi) if ostoch else 0
        nb, flags = round_bits(f2i(acc), omode, ro, ko, po)
        out[o] = i2f(nb)
        for f in range(6):
            cnt[f] += (flags >> f) & 1
        cnt[6] += 1
    cnt[0] += inexact


#: steps (products) per call below which a thread-pool hand-off costs more than it saves
PARALLEL_STEPS = 1 << 18


def gemm_kernel(order: int, mode: int, omode: int):
    """gemm_plain for deterministic modes in blocked order, else gemm."""
    return gemm_plain if order == ORDER_BLOCKED and max(mode, omode) < STOCHASTIC else gemm


def run(kernel, nitems: int, steps_per_item: int, threads: int, *args):
    """kernel(*args, lo, hi, counts) over items 0 .. nitems-1; returns the NCOUNTS counters.

    Small problems run in the calling thread; larger ones are dealt out to lpsim's thread
    pool in ranges (:func:`lpsim.pool.deal`; the results do not depend on the split).
    """
    counts = np.zeros(NCOUNTS, np.int64)
    if kernel is gemm:
        kernel = gemm_kernel(args[14], args[5], args[6])
    if threads <= 1 or nitems < 2 or nitems * steps_per_item < PARALLEL_STEPS:
        with first_call(kernel, f"lpsim.ops' {kernel.__name__} kernel"):
            kernel(*args, 0, nitems, counts)
        return counts

    def run_range(lo, hi):
        c = np.zeros(NCOUNTS, np.int64)
        kernel(*args, lo, hi, c)
        return c
    with first_call(kernel, f"lpsim.ops' {kernel.__name__} kernel"):
        return counts + sum(deal(run_range, pieces(nitems, threads), threads))
