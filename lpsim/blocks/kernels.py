"""The CPU block kernels and how a call runs them.

The general kernel (:func:`_blocks_range`: float32 or float64 arrays, element values and
per-block counters) and the float32 word kernel (:func:`_words_range` over
:mod:`lpsim.blocks.words`' loops: without counters, with each block's, or with a thread
range's sums, :mod:`lpsim.blocks.word_counts`), each compiled once per rounding mode with
the mode a constant of its body (:data:`KERNELS`, :data:`WORD_KERNELS`,
:data:`COUNTED_WORD_KERNELS`: ``njit(cache=True)``, named ``blocks_<mode>``,
``blocks_words_<mode>``, ``blocks_words_counted_<mode>`` and ``blocks_words_totals_<mode>``
for numba's on-disk cache).  :func:`run_blocks` picks one for a call and :func:`run_kernel`
splits its blocks over lpsim's threads (PARALLEL_GRAIN, SERIAL_BELOW).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit
from numba.extending import register_jitable

from ..cpu import CHUNK, _constant, as_bits, draw_words, entry_point, literal_jitable, word_buffer
from ..pool import deal, pieces, threads
from ..rounding import MODES, STOCHASTIC, fast_sub_ok, kernel_params
from ..word32 import as_int64, word
from .amax import NO_AMAXES, _finite_amax
from .counters import BLOCK_COUNTERS
from .decisions import (_element_params, bits_value, block_params, block_recip, block_scale,
                        element_exact, element_fast, element_params32, i2f, scaled_bits)
from .formats import PRESETS
from .word_counts import _nonfinite_block, clip_bounds, tally_scratch
from .word_scales import STEPS_FROM, _reciprocals, _scale_steps
from .words import _chunk_words, scale_ahead_scratch

#: elements per extra thread, and the size below which a call runs in the calling thread: an
#: element costs ten or more times a plain rounding (lpsim.cpu's grain), so threads pay sooner
PARALLEL_GRAIN = 1 << 17
SERIAL_BELOW = 2 * PARALLEL_GRAIN


# --- the CPU kernel ---------------------------------------------------------------------------
#
# Work is a range of blocks (row-major over rows and blocks per row, so a range of blocks is
# a contiguous range of elements), walked in chunks of about CHUNK elements: (a) per block,
# the largest magnitude as an integer max over the container bits (a vectorised reduction;
# the inf/NaN bit patterns are the largest) and the scale decision; (b) per block, the
# element step over its elements, a loop with no branch on the data that vectorises, its
# flags summed per block; the rare elements it leaves (NaN, inf, float64 subnormals) go to
# element_exact.  Stochastic modes draw the chunk's random words first, four a Philox call
# (lpsim.cpu.fill_words).  Threads take contiguous ranges of blocks.
#
# Without element values, a float32 array of a format where element_fast32 is exact
# (words_exact: MX and NVFP4 are) takes the word kernel (_words_kernel, its own entry point
# per kind of counting, so that such a call compiles nothing else; with counters the flags
# of its own steps, lpsim.blocks.word_counts): per block (_chunk_words) the largest
# magnitude, the scale in integer steps (scale_words), then the element loop on 32-bit
# words (eight AVX2 lanes), a loop of literal length for blocks of 32 and 16 elements, with
# unsigned offsets (no per-block array views, whose reference counting costs more than the
# block's elements).
# Nearest rounding there is one float32 add and subtract per element (nearest32).  One
# thread, 2**22 elements: MXFP8/MXFP4 nearest about 0.8 ns/element (2 ns before the add, 5-6
# for the per-block float64 loop), about as fast as a copy on two threads.

@register_jitable(inline="always")
def _block_elements(xs, outs, qs, rs, want_q, want_counts, s, recip, mode, k, p, bp):
    """The element step over one block (slices from 0, so no wraparound checks); returns
    (inexact, overflow, underflow, subnormal, nonzero, slow), the counters 0 unless want_q
    or want_counts.  ``mode`` must be a literal."""
    mode = _constant(mode)
    rmask = -1 if mode >= STOCHASTIC else 0     # deterministic modes read rs[0] only
    f0 = f1 = f2 = f3 = nonzero = slow = np.int64(0)
    if want_q:
        for i in range(xs.size):
            q, v, ok, flags = element_fast(xs[i], recip, s, mode, np.int64(rs[i & rmask]), k, p,
                                          bp)
            qs[i] = q
            outs[i] = v
            nonzero += np.int64(q != 0)
            slow += 1 - ok
            f0 += flags & 1
            f1 += (flags >> 1) & 1
            f2 += (flags >> 2) & 1
            f3 += (flags >> 3) & 1
    elif want_counts:
        for i in range(xs.size):
            q, v, ok, flags = element_fast(xs[i], recip, s, mode, np.int64(rs[i & rmask]), k, p,
                                          bp)
            outs[i] = v
            nonzero += np.int64(q != 0)
            slow += 1 - ok
            f0 += flags & 1
            f1 += (flags >> 1) & 1
            f2 += (flags >> 2) & 1
            f3 += (flags >> 3) & 1
    else:                                       # no counters: a third fewer operations
        for i in range(xs.size):
            q, v, ok, flags = element_fast(xs[i], recip, s, mode, np.int64(rs[i & rmask]), k, p,
                                          bp)
            outs[i] = v
            slow += 1 - ok
    return f0, f1, f2, f3, nonzero, slow


@register_jitable
def _block_slow(xs, outs, qs, rs, want_q, s, recip, mode, k, p, bp, c):
    """element_exact over the elements element_fast left; returns the change of nonzero."""
    dz = np.int64(0)
    rmask = -1 if mode >= STOCHASTIC else 0
    for i in range(xs.size):
        r = np.int64(rs[i & rmask])
        yb = scaled_bits(xs[i], s, recip, bp)      # element_fast leaves it as it is where
        q0 = i2f(yb)                               # fast_sub_ok is 0
        if not fast_sub_ok(yb, p):
            q, v, flags = element_exact(xs[i], recip, s, mode, r, k, p, bp)
            if want_q:
                qs[i] = q
            outs[i] = v
            dz += np.int64(q != 0) - np.int64(q0 != 0)
            for f in range(6):
                c[f] += (flags >> f) & 1
    return dz


@register_jitable
def _block_bounds(tb, nblk, length, size):
    """(lo, hi): the elements of block ``tb`` (row-major, ``nblk`` blocks per row of
    ``length``; a row's last block may be short) in the flat array."""
    row_lo = (tb // nblk) * length
    lo = row_lo + (tb % nblk) * size
    return lo, min(lo + size, row_lo + length)


@register_jitable
def _chunk(t, t1, per_chunk, nblk, length, size):
    """(t_end, e_lo, e_hi): the chunk of blocks t .. t_end-1 (at most per_chunk, row-major)
    and its contiguous range of elements e_lo .. e_hi-1 of the flat array."""
    t_end = min(t + per_chunk, t1)
    e_lo = (t // nblk) * length + (t % nblk) * size
    last = t_end - 1
    e_hi = (last // nblk) * length + min((last % nblk + 1) * size, length)
    return t_end, e_lo, e_hi


@register_jitable
def _blocks_range(x, out, qout, sout, counts, t0, t1, mode, k, p, sp, bp, seed_lo, seed_hi,
                  stream, offset, want_q, want_counts, cm, ceb, chunk):
    """Blocks t0 .. t1-1 (row-major) of the 2-D ``x`` into out, qout, sout and counts."""
    stochastic = _constant(mode) >= STOCHASTIC
    rows, length = x.shape
    nblk = sout.shape[1]
    size = bp.block
    xf, outf = x.reshape(-1), out.reshape(-1)
    qf = qout.reshape(-1)
    sf = sout.reshape(-1)
    cf = counts.reshape(-1, counts.shape[2])
    xb = as_bits(xf)
    cmag = (np.int64(1) << 31) - 1 if cm == 23 else ~(np.int64(1) << 63)   # magnitude bits
    cinf = (2 * ceb + 1) << cm                           # and those of inf
    lanes = 4 if p.W == 32 else 2
    per_chunk = max(1, chunk // size)
    r = word_buffer(xb, per_chunk * size + 2 * lanes if stochastic else 1)
    t = t0
    while t < t1:
        t_end, e_lo, e_hi = _chunk(t, t1, per_chunk, nblk, length, size)
        rs = draw_words(mode, r, e_lo + offset, e_hi + offset, lanes, p.W, stream, seed_lo,
                        seed_hi)
        for tb in range(t, t_end):
            lo, hi = _block_bounds(tb, nblk, length, size)
            xs, outs, c = xf[lo:hi], outf[lo:hi], cf[tb]
            qs = qf[lo:hi] if want_q else qf
            rsb = rs[lo - e_lo:hi - e_lo] if stochastic else rs
            am = np.int64(0)                  # a word for float32 (lpsim.word32): 8 lanes
            xbs = xb[lo:hi]
            for i in range(xbs.size):
                am = max(am, word(xbs[i]) & cmag)
            if am >= cinf:
                if bp.nonfinite_nan:
                    _nonfinite_block(xs, outs, qs, want_q, c)
                    sf[tb] = np.nan
                    continue
                amax = _finite_amax(xs)
            else:
                amax = bits_value(as_int64(am), cm, ceb)
            s, clipped = block_scale(amax, bp, sp)
            recip = block_recip(s, bp)
            sf[tb] = s
            f0, f1, f2, f3, nonzero, slow = _block_elements(xs, outs, qs, rsb, want_q,
                                                            want_counts, s, recip, mode, k, p,
                                                            bp)
            c[0] = f0
            c[1] = f1
            c[2] = f2
            c[3] = f3
            c[6] = clipped
            if slow:
                nonzero += _block_slow(xs, outs, qs, rsb, want_q, s, recip, mode, k, p, bp, c)
            if want_q or want_counts:
                c[7] = np.int64(amax != 0 and nonzero == 0)
        t = t_end

@literal_jitable
def _words_range(x, out, sout, counts, bam, t0, t1, mode, counted, k, p, p32, sp, bp, seed_lo,
                 seed_hi, stream, offset, chunk, tables):
    """Blocks t0 .. t1-1 (row-major) of the 2-D float32 ``x`` into out and sout by
    :func:`_chunk_words`, a chunk of about ``chunk`` elements at a time for stochastic
    rounding (one draw of random words per chunk), the whole range at once otherwise.
    ``counted`` (a literal): 0 no counters, 1 each block's into its row of counts, 2 the
    range's sums; returns the counters' rows (a new (1, 9) array of sums for 2).
    ``tables``: the call's :func:`word_tables`."""
    stochastic = _constant(mode) >= STOCHASTIC
    length = x.shape[1]
    nblk = sout.shape[1]
    xf, outf, sf = x.reshape(-1), out.reshape(-1), sout.reshape(-1)
    counting = _constant(counted)
    cf = np.zeros((1, counts.shape[2]), np.int64) if counting == 2 \
        else counts.reshape(-1, counts.shape[2])
    rct, ri0, rsh, steps, clip_lo, clip_hi = tables
    tally = tally_scratch(clip_lo, clip_hi, counted)
    per_chunk = max(1, chunk // bp.block) if stochastic else max(1, t1 - t0)
    r = np.empty(per_chunk * bp.block + 8 if stochastic else 1, np.uint32)
    ahead = scale_ahead_scratch()
    t = t0
    while t < t1:
        t_end, e_lo, e_hi = _chunk(t, t1, per_chunk, nblk, length, bp.block)
        rs = draw_words(mode, r, e_lo + offset, e_hi + offset, 4, 32, stream, seed_lo, seed_hi)
        _chunk_words(xf, outf, sf, cf, bam, rs, t, t_end, e_lo, mode, counted, k, p, p32, sp,
                     bp, length, nblk, rct, ri0, rsh, steps, ahead, tally)
        t = t_end
    return cf


#: the word kernels' kinds of counting (:func:`_words_range`'s ``counted``) by name
WORD_COUNTING = {"": 0, "counted_": 1, "totals_": 2}


@njit(cache=True, nogil=True)
def word_tables(bp, sp, blocks, counting):
    """What the word kernels (:func:`_words_range`, :func:`lpsim.blocks.columns._bands`) look
    scales up in, made once a call of ``blocks`` blocks and shared by its threads' ranges:
    (the reciprocals of the scale's values, :func:`_reciprocals`' table, first index and
    shift; :func:`_scale_steps`' table; :func:`clip_bounds`' lo and hi where ``counting``,
    else 0 and 0).  Made once a range, the step table (about 20 us) cost a 2-core VM a
    third of an NVFP4 call of 2048 x 256 elements."""
    rct, ri0, rsh = _reciprocals(bp, sp)
    steps = _scale_steps(bp, sp, rct, ri0, rsh, blocks)
    lo = hi = np.int64(0)
    if counting:
        lo, hi = clip_bounds(bp, sp)
    return rct, ri0, rsh, steps, lo, hi


@functools.cache
def _tables_entry():
    bfmt = PRESETS["mxfp4"]
    return entry_point(word_tables, (block_params(bfmt), kernel_params(bfmt.scale, np.float64),
                                     0, False), "lpsim.blocks' scale tables")


def tables_of(bp, sp, blocks: int, counting) -> tuple:
    """:func:`word_tables` of a call of ``blocks`` blocks from Python, without numba's
    dispatch, and kept for the next call of the same parameters (MX formats' always are;
    NVFP4's change with the tensor scale)."""
    return _tables(bp, sp, int(blocks) >= STEPS_FROM, bool(counting))


@functools.lru_cache(maxsize=64)
def _tables(bp, sp, large: bool, counting: bool) -> tuple:
    return _tables_entry()(bp, sp, STEPS_FROM if large else 0, counting)


def _words_kernel(mode: int, counted: int = 0):
    """The float32 word kernel of rounding mode ``mode``: without counters (lpsim.quantize
    without stats, ``blocks_words_<mode>``), each block's counters in its row
    (``blocks_words_counted_<mode>``), or the range's sums returned
    (``blocks_words_totals_<mode>``: lpsim.quantize's stats), named for numba's on-disk
    cache: kernels of their own, so that the uncounted one runs no counting and a call
    compiles nothing else."""
    if counted == 2:
        def kernel(x, out, sout, counts, bam, t0, t1, k, p, p32, sp, bp, seed_lo, seed_hi,
                   stream, offset, chunk, tables):
            return _words_range(x, out, sout, counts, bam, t0, t1, mode, 2, k, p, p32, sp, bp,
                                seed_lo, seed_hi, stream, offset, chunk, tables)
    else:
        def kernel(x, out, sout, counts, bam, t0, t1, k, p, p32, sp, bp, seed_lo, seed_hi,
                   stream, offset, chunk, tables):
            _words_range(x, out, sout, counts, bam, t0, t1, mode, counted, k, p, p32, sp, bp,
                         seed_lo, seed_hi, stream, offset, chunk, tables)

    name = next(name for name, code in MODES.items() if code == mode)
    kind = next(kind for kind, code in WORD_COUNTING.items() if code == counted)
    kernel.__name__ = kernel.__qualname__ = f"blocks_words_{kind}{name}"
    return kernel


def _blocks_kernel(mode: int):
    """The block kernel of rounding mode ``mode``, a constant of its body (the element loop's
    decision compiles to straight-line code), named ``blocks_<mode>``: numba's on-disk cache
    keys kernels by qualified name, so each mode has an entry of its own (as lpsim.cpu's)."""
    def kernel(x, out, qout, sout, counts, t0, t1, k, p, sp, bp, seed_lo, seed_hi, stream,
               offset, want_q, want_counts, cm, ceb, chunk):
        _blocks_range(x, out, qout, sout, counts, t0, t1, mode, k, p, sp, bp, seed_lo,
                      seed_hi, stream, offset, want_q, want_counts, cm, ceb, chunk)

    name = next(name for name, code in MODES.items() if code == mode)
    kernel.__name__ = kernel.__qualname__ = f"blocks_{name}"
    return kernel


#: the dispatcher of each mode, compiled on first use and cached on disk
KERNELS = {mode: njit(cache=True, nogil=True)(_blocks_kernel(mode)) for mode in MODES.values()}
WORD_KERNELS = {mode: njit(cache=True, nogil=True)(_words_kernel(mode))
                for mode in MODES.values()}
COUNTED_WORD_KERNELS = {(mode, counted): njit(cache=True, nogil=True)(_words_kernel(mode, counted))
                        for mode in MODES.values() for counted in (1, 2)}

#: the counts argument of the uncounted word kernel (which writes none)
NO_COUNTS = np.zeros((0, 0, len(BLOCK_COUNTERS)), np.int64)


@functools.cache
def kernel_entry(mode: int, dtype: np.dtype):
    """The compiled entry point of ``mode``'s kernel for ``dtype`` arrays, without numba's
    dispatch (typing three NamedTuples costs more than quantizing a small array)."""
    from ..request import plan
    dispatcher = KERNELS[mode]
    bfmt = PRESETS["mxfp4"]
    request = plan(bfmt.saturating_element, "nearest", dtype)
    x = np.zeros((1, 1), dtype)
    args = (x, x.copy(), np.zeros((1, 1)), np.zeros((1, 1)),
            np.zeros((1, 1, len(BLOCK_COUNTERS)), np.int64), 0, 1, 1,
            _element_params(bfmt.saturating_element, request.params.W),
            kernel_params(bfmt.scale, np.float64), block_params(bfmt), 0, 0, 0, 0, True, True,
            23, 127, CHUNK)
    return entry_point(dispatcher, args, f"the CPU block kernel {dispatcher.py_func.__name__} "
                       f"for {np.dtype(dtype)} arrays")


@functools.cache
def word_kernel_entry(mode: int, counted: int = 0):
    """The compiled entry point of ``mode``'s float32 word kernel (:func:`_words_kernel`),
    without counters (``counted`` 0), with each block's (1) or with the sums (2)."""
    dispatcher = COUNTED_WORD_KERNELS[mode, counted] if counted else WORD_KERNELS[mode]
    bfmt = PRESETS["mxfp4"]
    x = np.zeros((1, 1), np.float32)
    sp, bp = kernel_params(bfmt.scale, np.float64), block_params(bfmt)
    args = (x, x.copy(), np.zeros((1, 1)), NO_COUNTS, NO_AMAXES, 0, 1, 1,
            _element_params(bfmt.saturating_element, 32), element_params32(bfmt), sp, bp, 0, 0,
            0, 0, CHUNK, tables_of(bp, sp, 1, counted))
    return entry_point(dispatcher, args, f"the CPU block kernel {dispatcher.py_func.__name__} "
                       "for float32 arrays")


def takes_words(x2, bp, want_q, want_counts) -> bool:
    """Whether :func:`run_blocks` takes the float32 word kernel: float32 data of a format
    that :func:`words_exact` admits, no element values wanted, and for counters a scale
    format of more than one value (:func:`lpsim.blocks.word_counts.clip_bounds`)."""
    return (x2.dtype == np.float32 and bool(bp.f32) and not want_q
            and (not want_counts or bp.smin < bp.smax))


def run_blocks(x2, out2, q2, s2, counts, request, p, p32, sp, bp, want_q,
               want_counts=True, bam=NO_AMAXES):
    """Quantize every block of the 2-D ``x2`` with the kernel of ``request.mode``; returns
    the counters' rows: ``counts`` (each block's row, zeros on entry), or with
    ``want_counts="totals"`` where the word kernel runs, a (ranges, 1, 9) array of each
    range's sums (``counts`` unused: a row per block costs a pass over memory as
    large as the data's, in writing and again in summing).

    Fewer than SERIAL_BELOW elements run in the calling thread; larger arrays on up to one
    thread per PARALLEL_GRAIN elements, which pull contiguous ranges of blocks
    (:func:`lpsim.pool.deal`).  Each block (or
    range) writes its own counters, so no thread adds into another's.  Without element
    values, float32 arrays of a format that :func:`words_exact` admits take the word
    kernel, counted or not (:func:`takes_words`; q2 unused; ``bam``: the blocks' largest
    magnitudes where :func:`word_tensor_scale` found them).
    """
    seeds = (int(request.seed_lo), int(request.seed_hi), int(request.stream),
             int(request.offset))
    if takes_words(x2, bp, want_q, want_counts):
        counted = 2 if want_counts == "totals" else int(bool(want_counts))
        kernel = word_kernel_entry(request.mode, counted)
        head = (x2, out2, s2, counts if counted == 1 else NO_COUNTS, bam)
        args = (int(request.k), p, p32, sp, bp, *seeds, int(CHUNK),
                tables_of(bp, sp, s2.size, counted))
        sums = run_kernel(kernel, head, args, s2.size, x2.size)
        return np.stack(sums) if counted == 2 else counts
    kernel = kernel_entry(request.mode, x2.dtype)
    cm, ceb = (23, 127) if x2.dtype == np.float32 else (52, 1023)
    head = (x2, out2, q2, s2, counts)
    args = (int(request.k), p, sp, bp, *seeds, bool(want_q), bool(want_counts), cm, ceb,
            int(CHUNK))
    run_kernel(kernel, head, args, s2.size, x2.size)
    return counts


def run_kernel(kernel, head, args, nblocks: int, n: int) -> list:
    """kernel(*head, t0, t1, *args) over blocks 0 .. nblocks-1 of n elements: in the calling
    thread below SERIAL_BELOW, else ranges of blocks dealt out to lpsim's pool
    (:func:`lpsim.pool.deal`); returns what each range's call returned, in order."""
    workers = min(threads(), nblocks, n // PARALLEL_GRAIN) if n >= SERIAL_BELOW else 1
    return deal(lambda t0, t1: kernel(*head, t0, t1, *args), pieces(nblocks, workers), workers)
