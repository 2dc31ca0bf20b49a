"""Blocks down the columns of a 2-D float32 array, quantized without a transposing copy.

Why: a GEMM whose K is a tensor's first axis (a linear layer's weight gradient, K the
tokens) quantizes its operands in blocks along axis 0.  The general route moves that axis
last with a transposing copy of the whole tensor, quantizes the copy and returns its
transpose: a second pass over memory, and a transposing copy is slow (1.7 ms for 2048 x
1024 float32 with torch on a 2-core VM, against 0.5 ms to quantize the rows).

Here each thread takes bands (the ``block`` rows that hold one block of every column) and
walks a band in strips of :data:`STRIP` columns, reading rows as they lie: (a) each
column's largest magnitude bits, an integer max down the rows that vectorises across the
columns; (b) each column's scale and reciprocal (:func:`scale_recip32`, the word kernel's
own decision); (c) the elements row by row, the word kernel's element step
(:func:`element_nearest32`, or :func:`element_fast32`) with each lane its column's scale.
A column whose block holds a NaN or inf, or an element the fast step leaves, is redone
alone: gathered and run through the word kernel (:func:`_words_range`), so every case the
row kernel decides is decided by it.  The blocks, scales and counters are those of the
transposed copy's, bit for bit; only where the values lie differs (C order, not a
transposed view).

Stochastic rounding draws the transposed copy's random words: element (i, j) takes counter
``offset + j * rows + i``, so a column's band is a run of consecutive counters, runs ``rows``
apart; each unit draws its words first, Philox blocks across the columns a row of four
words at a time (:func:`lpsim.cpu.fill_words_down`).  Counters come as a call's sums
(lpsim.quantize's stats, simulated training's telemetry), from the flags of the element
step, packed one a byte per column.  Used by :func:`lpsim.blocks.quantize_blocks` for
float32 arrays of two dimensions blocked along axis 0, of formats the word kernel takes (MX
and NVFP4, whose tensor scale the caller finds first: a largest magnitude does not depend
on the order it is read in).

With Hadamard factors (:func:`run_columns`'s ``factors``), the blocks are those of the
array's random Hadamard transform down its columns: each unit is transformed into a scratch
strip (:func:`lpsim.blocks.hadamard_rows.hadamard_rows`, the arithmetic of
``lpsim.torch.hadamard.rht_tokens``) just before its magnitudes and elements are read from
there, so a recipe's wgrad operand is transformed and quantized with no transformed tensor
in memory; :func:`hadamard_amax` is NVFP4's tensor pass over the transform.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit
from numba.extending import register_jitable

from ..cpu import CHUNK, _constant, as_bits, entry_point, fill_words_down, literal_jitable
from ..pool import deal, pieces, threads
from ..rounding import MODES, NEAREST, STOCHASTIC, kernel_params, nearest32_words
from ..word32 import as_int64, bits_float32, like, word
from .amax import AMAX_GRAIN, NO_AMAXES
from .decisions import (_element_params, block_params, element_fast32_packed, element_nearest32,
                        i2f, element_nearest32_flags, element_params32)
from .formats import PRESETS
from .hadamard_rows import hadamard_amax_bits, hadamard_rows
from .kernels import NO_COUNTS, PARALLEL_GRAIN, SERIAL_BELOW, _words_range, tables_of
from .word_counts import PIECE, _no_counts, _store, _tally_block, _tally_packed
from .word_scales import fused_scale, pow2_exponent, pow2_float32, pow2_words, scale_recip32

#: columns of a band taken at a time: a strip of block x STRIP float32 values (128 KB for
#: blocks of 32) stays in the second-level cache from its largest magnitudes to its
#: elements, and its rows are runs long enough for the prefetcher (strips of 64 to 256
#: columns, 32 short runs at once, took half as long again)
STRIP = 1024


@register_jitable(forceinline=True)
def _amax_row(xb, base, ams, o, w):
    """ams[o + j] = max(ams[o + j], the magnitude bits of element base + j), j < w."""
    for j in range(w):
        jj = np.uint64(j)
        ams[o + jj] = as_int64(max(word(ams[o + jj]), word(xb[base + jj]) & 0x7FFFFFFF))


@literal_jitable
def _bands(x, out, sout, b0, b1, mode, counted, k, p, p32, sp, bp, seed_lo, seed_hi, stream,
           offset, chunk, factors, tables):
    """Bands b0 .. b1-1 of ``x`` (rows x cols, blocks of bp.block down the columns) into
    ``out`` and their scales into rows b0 .. b1-1 of ``sout`` (blocks per column x cols);
    ``counted`` (a literal): 0 no counters, 2 their sums returned as a (1, 9) array (to
    nearest only, where bp.near32 holds).  ``factors``: empty, or those of a Hadamard
    transform down the columns (:func:`hadamard_rows`, runs of factors.size rows dividing the
    block) that the blocks quantize in place of x's values.  ``tables``: the call's
    :func:`lpsim.blocks.kernels.word_tables`.

    A unit is a band's strip of at most STRIP columns.  The largest magnitudes of the next
    unit are read row by row between the rows of this unit's elements, so that its reads
    from memory may overlap the element step (as fast as a pass of the one, then of the
    other, within the noise of the runs made on a 2-core VM).  With a transform, each unit
    is first transformed into a scratch strip that the cache holds, and read from there."""
    counting = _constant(counted) != 0      # mode and counted pass on as literals
    near = _constant(mode) == NEAREST and bp.near32
    stochastic = _constant(mode) >= STOCHASTIC
    rows, cols = x.shape
    size = bp.block
    xf, outf = x.reshape(-1), out.reshape(-1)
    xb = as_bits(xf)
    transformed = factors.size != 0
    tx = np.empty(size * STRIP if transformed else 1, np.float32)   # a unit, transformed
    src = tx if transformed else xf             # where the elements are read
    cinf = word(np.int32(255 << 23))
    maxe, pts = np.float32(bp.max_e), np.float32(bp.pts)
    minn = bits_float32(word(p32.minnorm))
    cw, lw = nearest32_words(p32.m, p32.emin)
    # the scales as a table of steps where it pays (NVFP4's UE4M3: a lookup, no divisions)
    rct, ri0, rsh, steps, clip_lo, clip_hi = tables
    tabled = steps[0].size != 0
    ams = np.zeros(2 * STRIP, np.uint32)        # this unit's and the next one's
    s32s = np.empty(STRIP, np.float32)
    rcs = np.empty(STRIP, np.float32)
    lanes = np.empty(STRIP, np.uint32)
    redo = np.empty(STRIP, np.uint32)
    tops = np.empty(STRIP, np.uint32)
    nonzero = np.empty(STRIP, np.uint32)        # per column, results other than 0
    # a unit's random words, a row per row of the band (a word per element)
    rw = np.empty((size if stochastic else 1, STRIP), np.uint32)
    quarter = rows // 4                         # counters a column apart, in Philox blocks
    # power-of-two scales from the exponent field for every largest magnitude (MX formats)
    every_pow2 = pow2_words(np.int64(0), bp)
    held = np.empty(size, np.float32)
    made = np.empty(size, np.float32)
    one = np.empty((1, 1), np.float64)
    sums = np.zeros((1, NO_COUNTS.shape[2]), np.int64)
    counts = np.zeros(NO_COUNTS.shape, np.int64)    # writable: the counted kernel's type
    fast = word(np.int32(0))                    # the random word of a deterministic mode
    c = _no_counts()                            # counters 0-7, summed in locals (word_counts)
    strips = -(-cols // STRIP)
    u0, u1 = b0 * strips, b1 * strips
    if u0 >= u1:
        return sums
    h = min(size, rows - b0 * size)             # the first unit's largest magnitudes
    w = min(STRIP, cols)
    for i in range(h if not transformed else 0):
        _amax_row(xb, np.uint64((b0 * size + i) * cols), ams, np.uint64(0), w)
    for u in range(u0, u1):
        b, c0 = u // strips, (u % strips) * STRIP
        r0 = b * size
        h = min(size, rows - r0)
        w = min(STRIP, cols - c0)
        o = np.uint64(((u - u0) & 1) * STRIP)   # this unit's largest magnitudes, and the
        on = np.uint64(STRIP) - o               # next one's
        if transformed:                         # the unit transformed, then its magnitudes
            hadamard_rows(xf, r0 * cols + c0, cols, tx, 0, STRIP, factors, h, w)
            for i in range(h):
                _amax_row(as_bits(tx), np.uint64(i * STRIP), ams, o, w)
        for j in range(w):                      # the scales, a loop that vectorises for
            jj = np.uint64(j)                   # power-of-two scales
            am = word(ams[o + jj])
            ams[o + jj] = 0                     # ready for the unit after the next
            tops[j] = as_int64(am)
            redo[j] = np.uint32(am >= cinf)     # a NaN or inf: the column is redone
            lanes[j] = 0
            nonzero[j] = 0
            if every_pow2:
                e = pow2_exponent(as_int64(am), bp)     # scale_recip32's 2**e
                sout[b, c0 + j] = i2f((e + 1023) << 52)
                s32s[j] = pow2_float32(e)
                rcs[j] = pow2_float32(-e)
            elif tabled and am < cinf:
                s32, rc = fused_scale(am, bp, steps)
                sout[b, c0 + j] = s32
                s32s[j] = s32
                rcs[j] = rc
            elif am < cinf:
                sout[b, c0 + j], s32s[j], rcs[j] = scale_recip32(am, bp, sp, rct, ri0, rsh)
        if counting and near:                   # the blocks' clipped and flushed counters
            for j in range(w):
                a = np.int64(tops[j])
                if redo[j] != 0:
                    continue
                top = bits_float32(word(np.int32(a)))
                if not top * rcs[j] < np.inf:   # a quotient of inf: the word kernel's
                    redo[j] = 1                 # element_exact, as the row kernel
                    continue
                _, _, qtop = element_nearest32_flags(top, rcs[j], s32s[j], pts, maxe, minn,
                                                     cw, lw, bp.pow2)
                c = _tally_block(c, np.int64(a != 0 and (a < clip_lo or a >= clip_hi)),
                                 np.int64(a != 0 and qtop == 0))
        if stochastic:      # column j's words: counters offset + (c0 + j) * rows + r0 + i
            fill_words_down(rw, (offset + c0 * rows + r0) // 4, quarter, -(-h // 4), w, stream,
                            seed_lo, seed_hi)
        hn = wn = rn = 0                        # the next unit (transformed: found then)
        if u + 1 < u1 and not transformed:
            bn, cn = (u + 1) // strips, ((u + 1) % strips) * STRIP
            rn = bn * size
            hn, wn = min(size, rows - rn), min(STRIP, cols - cn)
            rn = rn * cols + cn
        for i in range(max(h, hn)):
            if i < h:                           # a row of this unit's elements
                base = np.uint64((r0 + i) * cols + c0)
                sbase = np.uint64(i * STRIP) if transformed else base
                if near and not counting:
                    for j in range(w):
                        jj = np.uint64(j)
                        outf[base + jj] = element_nearest32(src[sbase + jj], rcs[j], s32s[j],
                                                            pts, maxe, cw, lw)
                elif near:
                    for j in range(w):
                        jj = np.uint64(j)
                        v, flags, _ = element_nearest32_flags(src[sbase + jj], rcs[j], s32s[j],
                                                              pts, maxe, minn, cw, lw, bp.pow2)
                        outf[base + jj] = v
                        lanes[j] = as_int64(word(lanes[j]) + flags)
                else:
                    for j in range(w):
                        jj = np.uint64(j)
                        e = base + jj
                        r = word(rw[i, j]) if stochastic else fast
                        q, v, ok, flags = element_fast32_packed(src[sbase + jj], r, rcs[j],
                                                                s32s[j], mode, k, p32, bp)
                        outf[e] = v
                        redo[j] = as_int64(word(redo[j]) | (1 - ok))
                        if counting:
                            lanes[j] = as_int64(word(lanes[j]) + flags)
                            nonzero[j] = as_int64(word(nonzero[j]) + (ok & like(ok, q != 0)))
            if i < hn:                          # a row of the next unit's magnitudes
                _amax_row(xb, np.uint64(rn + i * cols), ams, on, wn)
        for j in range(w):
            if redo[j] != 0:                    # the column's block through the word kernel
                col = c0 + j
                for i in range(h):
                    held[i] = src[i * STRIP + j] if transformed else xf[(r0 + i) * cols + col]
                # the transposed copy's counters: its row col, from row r0
                got = _words_range(held[:h].reshape((1, h)), made[:h].reshape((1, h)), one,
                                   counts, NO_AMAXES, 0, 1, mode, counted, k, p, p32, sp, bp,
                                   seed_lo, seed_hi, stream, offset + col * rows + r0, chunk,
                                   tables)
                for i in range(h):
                    outf[(r0 + i) * cols + col] = made[i]
                sout[b, col] = one[0, 0]
                if counting:
                    for f in range(sums.shape[1]):
                        sums[0, f] += got[0, f]
            elif counting:                      # the packed flags, one a byte
                c = _tally_packed(c, word(lanes[j]))
                if not near:                    # clipped; flushed: every result 0
                    a = np.int64(tops[j])
                    c = _tally_block(c, np.int64(a != 0 and (a < clip_lo or a >= clip_hi)),
                                     np.int64(a != 0 and nonzero[j] == 0))
    if counting:
        _store(sums, 0, c)
    return sums


#: the factors of no transform (the band kernels' ``factors``)
NO_TRANSFORM = np.zeros(0, np.float32)
#: the kinds of counting of the band kernels: none, or a call's sums
COUNTING = {"": 0, "totals_": 2}


def _columns_kernel(mode: int, counted: int):
    """The band kernel of rounding mode ``mode`` and counting ``counted`` (constants of its
    body), named ``blocks_columns_<kind><mode>`` for numba's on-disk cache: :func:`_bands`."""
    def kernel(x, out, sout, b0, b1, k, p, p32, sp, bp, seed_lo, seed_hi, stream, offset,
               chunk, factors, tables):
        return _bands(x, out, sout, b0, b1, mode, counted, k, p, p32, sp, bp, seed_lo,
                      seed_hi, stream, offset, chunk, factors, tables)

    name = next(name for name, code in MODES.items() if code == mode)
    kind = next(kind for kind, code in COUNTING.items() if code == counted)
    kernel.__name__ = kernel.__qualname__ = f"blocks_columns_{kind}{name}"
    return kernel


#: the dispatcher of each (mode, counting), compiled on first use and cached on disk
COLUMN_KERNELS = {(mode, counted): njit(cache=True, nogil=True)(_columns_kernel(mode, counted))
                  for mode in MODES.values() for counted in COUNTING.values()}


@functools.cache
def columns_entry(mode: int, counted: int = 0):
    """The compiled entry point of ``mode``'s band kernel, without counters (``counted`` 0)
    or with their sums (2)."""
    dispatcher = COLUMN_KERNELS[mode, counted]
    bfmt = PRESETS["mxfp4"]
    x = np.zeros((1, 1), np.float32)
    sp, bp = kernel_params(bfmt.scale, np.float64), block_params(bfmt)
    args = (x, x.copy(), np.zeros((1, 1)), 0, 1, 1,
            _element_params(bfmt.saturating_element, 32), element_params32(bfmt), sp, bp, 0, 0,
            0, 0, CHUNK, NO_TRANSFORM, tables_of(bp, sp, 1, counted))
    return entry_point(dispatcher, args, f"the CPU block kernel {dispatcher.py_func.__name__} "
                       "for float32 arrays")


def takes_columns(x, axis: int, bp, mode: int, want_elements, want_counts,
                  offset: int = 0) -> bool:
    """Whether :func:`run_columns` quantizes ``x`` along ``axis``: a 2-D float32 C-contiguous
    array blocked down its columns (axis 0), no element values wanted, a format the word
    kernel takes (``bp.f32``; a tensor scale is the caller's, in ``bp``); a random rounding
    where every column's run of a band's counters starts a Philox block (rows, the block
    and the counter ``offset`` multiples of 4: the words are drawn for the band as a whole);
    counters only as sums ("totals"), in blocks of at most PIECE elements (a byte of packed
    flags holds a column's sum) of a scale format of more than one value (as the word
    kernel's counters need)."""
    if not (isinstance(x, np.ndarray) and x.ndim == 2 and axis in (0, -2)
            and x.dtype == np.float32 and x.flags.c_contiguous and x.size > 0
            and bool(bp.f32) and not want_elements):
        return False
    if mode >= STOCHASTIC and (x.shape[0] % 4 or bp.block % 4 or offset % 4):
        return False
    if want_counts is False:
        return True
    return want_counts == "totals" and bp.block <= PIECE and bp.smin < bp.smax


def takes_hadamard(x, n: int, axis: int, bp, mode: int, want_elements, want_counts,
                   offset: int = 0) -> bool:
    """Whether :func:`run_columns` quantizes the blocks of ``x``'s Hadamard transform down
    its columns in runs of ``n`` rows: :func:`takes_columns` takes x, and n is a power of two
    that divides the rows and the block (each band holds whole runs)."""
    return (takes_columns(x, axis, bp, mode, want_elements, want_counts, offset)
            and n >= 1 and n & (n - 1) == 0 and x.shape[0] % n == 0 and bp.block % n == 0)


#: elements per thread of :func:`hadamard_amax`'s pass: half of a plain amax's (AMAX_GRAIN), as
#: the transform doubles an element's work (0.23-0.26 ns against about 0.12 on one thread of
#: a 2-core VM); a 2048 x 768 operand's pass took 600 us on one thread inside a training step
HADAMARD_AMAX_GRAIN = AMAX_GRAIN // 2


@njit(cache=True, nogil=True)
def _hadamard_amax_runs(x, c, r0, r1):
    """:func:`hadamard_amax_bits` of runs r0 .. r1-1 (a scratch of one run)."""
    scratch = np.empty(c.size * x.shape[1], np.float32)
    return hadamard_amax_bits(x, c, scratch, r0 * c.size, r1 * c.size)


def hadamard_amax(x, c) -> float:
    """The largest finite magnitude of the Hadamard transform (factors ``c``) down the
    columns of the 2-D float32 ``x`` (as :func:`lpsim.blocks.amax.tensor_amax` of it): a
    pass that transforms a run of rows at a time in the cache and writes nothing (NVFP4's
    tensor scale), runs dealt out to lpsim's threads."""
    runs = x.shape[0] // c.size
    workers = max(1, min(threads(), x.size // HADAMARD_AMAX_GRAIN, runs))
    tops = deal(lambda r0, r1: _hadamard_amax_runs(x, c, r0, r1), pieces(runs, workers),
                workers)
    return float(np.uint32(max(tops)).view(np.float32))


def run_columns(x, out, sout, request, p, p32, sp, bp, want_counts=False, factors=None):
    """Quantize the 2-D float32 ``x`` in blocks down its columns into ``out`` (x's shape, C
    order) and the scales into ``sout`` (blocks per column x columns: a band's in a row),
    bands dealt out to lpsim's threads; returns None, or with ``want_counts="totals"`` a
    (ranges, 1, 9) array of each range's counters (as :func:`lpsim.blocks.kernels.run_blocks`).
    ``factors``: the blocks of x's Hadamard transform down the columns (float32 factors of
    :func:`hadamard_rows`; :func:`takes_hadamard` says where) in place of x's."""
    counted = 2 if want_counts == "totals" else 0
    kernel = columns_entry(request.mode, counted)
    bands = -(-x.shape[0] // bp.block)
    workers = min(threads(), bands, x.size // PARALLEL_GRAIN) if x.size >= SERIAL_BELOW else 1
    args = (int(request.k), p, p32, sp, bp, int(request.seed_lo), int(request.seed_hi),
            int(request.stream), int(request.offset), int(CHUNK),
            NO_TRANSFORM if factors is None else factors, tables_of(bp, sp, sout.size, counted))
    sums = deal(lambda b0, b1: kernel(x, out, sout, b0, b1, *args), pieces(bands, workers),
                workers)
    return np.stack(sums) if counted else None
