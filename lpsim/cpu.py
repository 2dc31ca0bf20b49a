"""The CPU rounding kernel: one compiled entry point per (rounding mode, container).

The per-element decision is :func:`lpsim.rounding.round_fast` (vectorised common case) and
:func:`lpsim.rounding.round_bits` (everything else), the functions lpsim_cuda compiles too.
For float32 containers the fast pass, its counts and its random words are 32-bit words
(:mod:`lpsim.word32`: eight AVX2 lanes where numba's int64 arithmetic has four).
This module only walks an array: chunks of :data:`CHUNK` elements whose random words stay in
cache, tasks of :data:`TASK` chunks, and lpsim's thread pool (:mod:`lpsim.pool`) for arrays
large enough to pay for it.
Float32 rounding to nearest without counters has a kernel of its own
(:func:`round_nearest32`: :func:`lpsim.rounding.nearest32`, one float32 add per element).

Cost model: a call is one numba entry point taking two float arrays, an int64 parameter
vector and integer keys (numba types all of them without looking inside), so the fixed cost
is about a microsecond; the counters go straight into the caller's int64 array.

Compile time (benchmarks/bench_compile.py): a kernel's first compile is what a new user
waits for, so the per-mode code is only the vectorised fast pass; the slow pass takes the
mode at run time (typed once for all modes), deterministic kernels never type the
generator (:func:`draw_words`), and nothing calls numba library code that compiles error
messages (:func:`as_bits`).

On-disk cache: every cached kernel has a qualified name of its own (``round_<mode>``), so a
kernel compiled in one process never takes the name, and the runtime environment, of another
one loaded from the cache (numba numbers functions per process).
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading

import numpy as np
from numba import njit, typeof, types
from numba.core.imputils import impl_ret_borrowed
from numba.extending import intrinsic, overload, register_jitable

from .philox import MASK32, philox4x32
from .pool import deal, pieces, threads
from .rounding import (MODES, NEAREST, STOCHASTIC, Params, nearest32, nearest32_consts,
                       nearest32_step, nearest32_top, nearest32_words, nearest_bf16, round_bits,
                       round_fast, round_fast_sub)
from .word32 import as_int64, bits_float32, float32_bits, like, word

#: elements per CPU work item (a multiple of every LANES value); its random words stay in L2
CHUNK = 8192
#: chunks per parallel task (they share one scratch buffer)
TASK = 4
#: elements per extra thread: below this, handing work to the thread pool costs more than it
#: saves, so smaller arrays run in the calling thread (benchmarks/bench_quantize.py --sweep:
#: the hand-over costs 30-40 us here; bf16 nearest on 2^18 elements took 115 us in one thread
#: and 139 on two, on 2^19 287 us against 224)
PARALLEL_GRAIN = 1 << 18
#: arrays shorter than this run in the calling thread
SERIAL_BELOW = 2 * PARALLEL_GRAIN
#: PARALLEL_GRAIN of the float32 nearest kernel (:func:`round_nearest32`), three to six
#: times faster an element, so arrays below 2**22 elements run in the calling thread: right
#: after a product (a simulated GEMM's output rounded to bfloat16 in place, 63 calls a
#: training step) a second thread cost more than it saved up to 2**21 elements on a 2-core
#: VM (2026-11-29: 2**21 elements 424-469 us on two threads, 338-402 on one; 2**22 alike),
#: a pass bound by memory
NEAREST32_GRAIN = 1 << 21
#: elements per group whose slow elements are counted together, so that the slow pass
#: looks only into groups that have some
GROUP = 64
#: groups with at most this many elements left by the fast pass finish them one at a time
SUB_SCALAR = 4
#: counters a kernel adds into: elements, then lpsim.stats.COUNTERS
NCOUNTS = 7
#: a kernel's return value when its input and output overlap without being the same array
OVERLAP = -1


@intrinsic
def _constant(typingctx, value):
    """The value of an integer literal as a compile-time constant, so that LLVM folds the
    branches on it (a literal argument alone is still passed at run time)."""
    if isinstance(value, types.IntegerLiteral):
        def codegen(context, builder, signature, args):
            return context.get_constant(types.int64, value.literal_value)
        return types.int64(value), codegen
    return None


@intrinsic
def as_bits(typingctx, x):
    """The container bits of a float32/float64 array: the same memory as int32/int64
    (compiled code only).  A register bitcast of the data pointer, where numba's
    ``ndarray.view`` compiles its size checks and their error messages (seconds of a
    kernel's first compile)."""
    if not isinstance(x, types.Array) or x.dtype not in (types.float32, types.float64):
        return None
    bits = x.copy(dtype=types.int32 if x.dtype == types.float32 else types.int64)

    def codegen(context, builder, signature, args):
        src = context.make_array(signature.args[0])(context, builder, args[0])
        dst = context.make_array(signature.return_type)(context, builder)
        for field in dst._datamodel._fields:
            value = getattr(src, field)
            setattr(dst, field, builder.bitcast(value, dst.data.type) if field == "data"
                    else value)
        return impl_ret_borrowed(context, builder, signature.return_type, dst._getvalue())
    return bits(x), codegen


@register_jitable
def params_of(v):
    """The :class:`lpsim.rounding.Params` held in the int64 vector ``v`` (tuple(params))."""
    return Params(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11],
                  v[12], v[13], v[14], v[15], v[16], v[17], v[18], v[19])


def literal_jitable(fn):
    """register_jitable typing constant arguments as literals first: fn's body reads the
    mode as a constant (:func:`_constant`), which numba's default order (non-literal first)
    reaches only after typing, and compiling what it calls, in vain once per call site."""
    overload(fn, strict=False, prefer_literal=True)(lambda *args, **kwargs: fn)
    return fn


#: the generator inlined into the block loops, so that they vectorise
_philox_inline = njit(inline="always")(philox4x32)


@register_jitable
def _words_w32(r, b0, nb, stream, seed_lo, seed_hi):
    s0, s1 = stream & MASK32, (stream >> 32) & MASK32
    h = nb // 2
    # blocks j and j + h in one iteration: two independent chains per vector lane, which
    # the core overlaps (6% faster than one block an iteration on AVX2)
    for j in range(h):
        b = b0 + j
        w0, w1, w2, w3 = _philox_inline(b & MASK32, (b >> 32) & MASK32, s0, s1, seed_lo,
                                        seed_hi)
        b += h
        x0, x1, x2, x3 = _philox_inline(b & MASK32, (b >> 32) & MASK32, s0, s1, seed_lo,
                                        seed_hi)
        r[4 * j] = w0
        r[4 * j + 1] = w1
        r[4 * j + 2] = w2
        r[4 * j + 3] = w3
        r[4 * (j + h)] = x0
        r[4 * (j + h) + 1] = x1
        r[4 * (j + h) + 2] = x2
        r[4 * (j + h) + 3] = x3
    if nb % 2:
        b = b0 + nb - 1
        w0, w1, w2, w3 = _philox_inline(b & MASK32, (b >> 32) & MASK32, s0, s1, seed_lo,
                                        seed_hi)
        r[4 * nb - 4] = w0
        r[4 * nb - 3] = w1
        r[4 * nb - 2] = w2
        r[4 * nb - 1] = w3


@register_jitable
def fill_words_down(r, b0, stride, quads, cols, stream, seed_lo, seed_hi):
    """r[4*q + lane, j] = the 32-bit word of that lane of Philox block b0 + j*stride + q, for
    q < quads and j < cols: the words of ``cols`` runs of 4*quads consecutive counters, runs
    ``4 * stride`` counters apart, as rows (a transposed layout's columns: each row a loop
    over j that vectorises and stores contiguously)."""
    s0, s1 = stream & MASK32, (stream >> 32) & MASK32
    for q in range(quads):
        for j in range(cols):
            b = b0 + j * stride + q
            w0, w1, w2, w3 = _philox_inline(b & MASK32, (b >> 32) & MASK32, s0, s1, seed_lo,
                                            seed_hi)
            r[4 * q, j] = w0
            r[4 * q + 1, j] = w1
            r[4 * q + 2, j] = w2
            r[4 * q + 3, j] = w3


@register_jitable
def _words_w62(r, b0, nb, stream, seed_lo, seed_hi):
    s0, s1 = stream & MASK32, (stream >> 32) & MASK32
    for j in range(nb):
        b = b0 + j
        w0, w1, w2, w3 = _philox_inline(b & MASK32, (b >> 32) & MASK32, s0, s1, seed_lo,
                                        seed_hi)
        r[2 * j] = (w0 << 30) | (w1 >> 2)
        r[2 * j + 1] = (w2 << 30) | (w3 >> 2)


@register_jitable
def fill_words(r, w, b0, nb, stream, seed_lo, seed_hi):
    """r[LANES*j + lane] = the random integer R of that lane of Philox block b0 + j, j < nb.

    The words of :func:`lpsim.philox.lane_word` for W = ``w`` random bits (32: four lanes a
    block, as float32 containers use; 62: two, as float64), in loops that vectorise.
    """
    if w == 32:
        _words_w32(r, b0, nb, stream, seed_lo, seed_hi)
    else:
        _words_w62(r, b0, nb, stream, seed_lo, seed_hi)


def draw_words(mode, r, lo, hi, lanes, w, stream, seed_lo, seed_hi):
    """The random words of global elements lo .. hi-1, drawn into ``r`` (from its start:
    the result is the slice of ``r`` where element lo's word is); ``r`` untouched for the
    deterministic modes (compiled code only)."""
    raise NotImplementedError


@overload(draw_words, prefer_literal=True)
def _draw_words(mode, r, lo, hi, lanes, w, stream, seed_lo, seed_hi):
    # a deterministic kernel (mode a literal) never types nor compiles the generator
    if isinstance(mode, types.IntegerLiteral) and mode.literal_value < STOCHASTIC:
        return lambda mode, r, lo, hi, lanes, w, stream, seed_lo, seed_hi: r

    def draw(mode, r, lo, hi, lanes, w, stream, seed_lo, seed_hi):
        if mode < STOCHASTIC:
            return r
        b0 = lo // lanes
        fill_words(r, w, b0, (hi + lanes - 1) // lanes - b0, stream, seed_lo, seed_hi)
        return r[lo - b0 * lanes:]
    return draw


def word_buffer(xb, n):
    """An empty buffer for n random words of ``xb``'s container: uint32 for float32 (W = 32,
    so the fast pass reads them as 32-bit words), int64 for float64 (compiled code only)."""
    raise NotImplementedError


@overload(word_buffer)
def _word_buffer(xb, n):
    dtype = np.uint32 if xb.dtype.bitwidth == 32 else np.int64
    return lambda xb, n: np.empty(n, dtype)


@literal_jitable
def fast_pass(xs, ys, rs, mode, k, p, left):
    """ys[j] = round_fast(xs[j]) for all j; returns (slow, inexact).

    slow counts the elements left to :func:`slow_pass`, ``left[g]`` those of group g (GROUP
    elements).  ``ys`` must not overlap ``xs``: the loop is vectorised behind an overlap
    check, and a loop that stores into the array it loads becomes masked stores.
    """
    mode = _constant(mode)
    slow = 0
    inexact = 0
    for g in range((xs.size + GROUP - 1) // GROUP):
        xg = xs[g * GROUP:(g + 1) * GROUP]     # slices: indices from 0, so no wraparound
        yg = ys[g * GROUP:(g + 1) * GROUP]
        # per-group counts in the operand's width (lpsim.word32.like): 32-bit words for
        # float32 bits, where 64-bit sums would halve the vector lanes; int64 for float64
        # bits, where 32-bit sums cost a narrowing per vector (0.76 -> 0.66 ns an element)
        group_slow = like(word(xg[0]), 0)
        group_inexact = like(word(xg[0]), 0)
        if mode >= STOCHASTIC:
            rg = rs[g * GROUP:(g + 1) * GROUP]
            for j in range(xg.size):
                bits, ok, inx = round_fast(word(xg[j]), mode, word(rg[j]), k, p)
                yg[j] = as_int64(bits)
                group_slow += 1 - ok
                group_inexact += inx
        else:
            for j in range(xg.size):
                bits, ok, inx = round_fast(word(xg[j]), mode, 0, k, p)
                yg[j] = as_int64(bits)
                group_slow += 1 - ok
                group_inexact += inx
        left[g] = as_int64(group_slow)
        slow += left[g]
        inexact += as_int64(group_inexact)
    return slow, inexact


@register_jitable(forceinline=True)
def _slow_element(ys, rs, j, mode, k, p, counts, first):
    """round_bits of ys[j] (random word rs[j]), its six counters added to counts[first:]
    (inlined: a call passing Params costs about as much as round_bits itself)."""
    r = np.int64(rs[j]) if mode >= STOCHASTIC else np.int64(0)
    bits, flags = round_bits(ys[j], mode, r, k, p)
    ys[j] = bits
    for f in range(6):
        counts[first + f] += (flags >> f) & 1


@register_jitable
def slow_pass(ys, rs, mode, k, p, left, counts, first):
    """round_bits over the elements of ``ys`` that :func:`fast_pass` left as they were; its
    six counters go to counts[first:first + 6]."""
    a_lo = p.fast_lo << p.M
    a_hi = (p.fast_hi + 1) << p.M
    for g in range(0, ys.size, GROUP):
        if left[g // GROUP]:
            for j in range(g, min(g + GROUP, ys.size)):
                a = np.int64(ys[j]) & p.MAG
                if a < a_lo or a >= a_hi:
                    _slow_element(ys, rs, j, mode, k, p, counts, first)


def sub_scratch(xb):
    """:func:`sub_pass`'s scratch, a group's results and marks in xb's integer type
    (compiled code only)."""
    raise NotImplementedError


@overload(sub_scratch)
def _sub_scratch(xb):
    return lambda xb: np.empty((2, GROUP), xb.dtype)


@literal_jitable
def sub_pass(ys, rs, mode, k, p, left, counts):
    """Finish what :func:`fast_pass` left in ``ys``, group by group: first
    :func:`lpsim.rounding.round_fast_sub` over the whole group in a loop that vectorises
    (the format's subnormal results and a saturating format's overflow, which round_fast
    declines: FP8 and FP4 formats leave many elements there), then round_bits
    (:func:`slow_pass`'s step, the mode at run time) over what that declines too (NaN, inf,
    container subnormals, overflow to inf).  Counters go to counts[1:7].  A format whose
    normals start below float32's takes the slow pass: round_fast_sub's 32-bit lanes hold
    only nonnegative quantities."""
    mode = _constant(mode)
    if p.emin + p.EB < 1:
        slow_pass(ys, rs, np.int64(mode), k, p, left, counts, 1)
        return
    a_lo = p.fast_lo << p.M
    a_hi = (p.fast_hi + 1) << p.M
    tmp = sub_scratch(ys)
    out, mark = tmp[0], tmp[1]
    for g in range((ys.size + GROUP - 1) // GROUP):
        if left[g] == 0:
            continue
        yg = ys[g * GROUP:(g + 1) * GROUP]
        rg = rs[g * GROUP:(g + 1) * GROUP] if mode >= STOCHASTIC else rs
        n = yg.size
        if left[g] <= SUB_SCALAR:
            # a few elements: one at a time (the group's vector pass costs more)
            span = np.uint64(a_hi - a_lo)
            for j in range(n):
                y = np.int64(yg[j])
                if np.uint64((y & p.MAG) - a_lo) >= span:     # outside [a_lo, a_hi)
                    r = np.int64(rg[j]) if mode >= STOCHASTIC else np.int64(0)
                    bits, ok, flags = round_fast_sub(y, mode, r, k, p)
                    if ok:
                        yg[j] = bits
                        for f in range(4):
                            counts[1 + f] += (flags >> f) & 1
                    else:
                        _slow_element(yg, rg, j, np.int64(mode), k, p, counts, 1)
            continue
        zero = like(word(yg[0]), 0)         # counts in the container's width
        f0 = f1 = f2 = f3 = still = zero
        for j in range(n):
            y = word(yg[j])
            a = y & p.MAG
            dec = like(y, a < a_lo) | like(y, a >= a_hi)       # left by fast_pass
            r = word(rg[j]) if mode >= STOCHASTIC else zero
            bits, ok, flags = round_fast_sub(y, mode, r, k, p)
            take = -(dec & ok)                                  # all ones where taken
            out[j] = as_int64((bits & take) | (y & ~take))
            rest = dec & (1 - ok)
            mark[j] = as_int64(rest)
            still += rest
            flags &= take
            f0 += flags & 1
            f1 += (flags >> 1) & 1
            f2 += (flags >> 2) & 1
            f3 += (flags >> 3) & 1
        for j in range(n):
            yg[j] = out[j]
        counts[1] += as_int64(f0)
        counts[2] += as_int64(f1)
        counts[3] += as_int64(f2)
        counts[4] += as_int64(f3)
        if still != 0:
            for j in range(n):
                if mark[j] != 0:
                    _slow_element(yg, rg, j, np.int64(mode), k, p, counts, 1)


def finish_pass(ys, rs, mode, k, p, left, counts):
    """What :func:`fast_pass` left in ``ys``, counters to counts[1:7]: :func:`sub_pass` for
    float32 containers rounded to nearest or stochastically (FP8 and FP4 simulations, where
    most of the left elements are), else :func:`slow_pass` with the mode at run time (typed
    once for every kernel: sub_pass's vector loop costs each kernel that has it about 60%
    more compile time).  Compiled code only."""
    raise NotImplementedError


@overload(finish_pass, prefer_literal=True)
def _finish_pass(ys, rs, mode, k, p, left, counts):
    if isinstance(mode, types.IntegerLiteral) and ys.dtype.bitwidth == 32 and \
            mode.literal_value in (NEAREST, STOCHASTIC):
        return lambda ys, rs, mode, k, p, left, counts: sub_pass(ys, rs, mode, k, p, left,
                                                                 counts)
    return lambda ys, rs, mode, k, p, left, counts: slow_pass(ys, rs, np.int64(mode), k, p,
                                                              left, counts, 1)


@literal_jitable
def _round_task(xb, outb, t, mode, k, p, seed_lo, seed_hi, stream, offset, inplace, counts):
    """Round the chunks of task ``t``, adding to ``counts`` (elements, then the six counters).

    Each chunk draws its random words into a scratch buffer, runs the vectorisable
    :func:`round_fast` over all its elements, then :func:`round_bits` over the few it did
    not cover.  In place, the fast pass writes a scratch chunk that is copied back.
    """
    n = xb.size
    first = offset // CHUNK
    nchunks = (offset + n + CHUNK - 1) // CHUNK - first
    lanes = 4 if p.W == 32 else 2                       # LANES of the random words
    small = min(n, CHUNK) + 2 * lanes                   # one chunk of a small array
    r = word_buffer(xb, small if mode >= STOCHASTIC else 1)
    left = np.empty((small + GROUP - 1) // GROUP, np.int64)
    scratch = np.empty(min(n, CHUNK) if inplace else 1, xb.dtype)
    for c in range(t * TASK, min(t * TASK + TASK, nchunks)):
        base = (first + c) * CHUNK
        lo = max(base, offset) - offset
        hi = min(base + CHUNK, offset + n) - offset
        rs = draw_words(mode, r, lo + offset, hi + offset, lanes, p.W, stream, seed_lo,
                        seed_hi)
        xs = xb[lo:hi]
        # one call site: LLVM inlines and vectorises the fast pass once, not twice
        ys = scratch[:hi - lo] if inplace else outb[lo:hi]
        slow, inexact = fast_pass(xs, ys, rs, mode, k, p, left)
        if inplace:
            for j in range(ys.size):     # not xs[:] = ys: its shape check compiles seconds
                xs[j] = ys[j]
        counts[0] += hi - lo
        counts[1] += inexact
        if slow:
            finish_pass(outb[lo:hi], rs, mode, k, p, left, counts)


def _kernel(mode: int):
    """The kernel of rounding mode ``mode``, a constant of its body, so that the decision
    compiles to straight-line code.

    kernel(x, out, pv, k, seed_lo, seed_hi, stream, offset, t0, t1, counts) rounds tasks
    t0 .. t1-1 of the float array ``x`` into ``out`` (``x`` itself for in place), adding to
    the int64 ``counts`` (NCOUNTS); pv is tuple(Params) as int64.  Returns 0, or OVERLAP
    (nothing written) when x and out overlap without being the same array.  It releases the
    GIL, so threads can run disjoint task ranges at once.
    """
    def kernel(x, out, pv, k, seed_lo, seed_hi, stream, offset, t0, t1, counts):
        xa, oa = x.ctypes.data, out.ctypes.data
        nbytes = x.size * x.itemsize
        inplace = xa == oa
        if not inplace and xa < oa + nbytes and oa < xa + nbytes:
            return OVERLAP
        p = params_of(pv)
        xb, outb = as_bits(x), as_bits(out)
        for t in range(t0, t1):
            _round_task(xb, outb, t, mode, k, p, seed_lo, seed_hi, stream, offset, inplace,
                        counts)
        return 0

    name = next(name for name, code in MODES.items() if code == mode)
    kernel.__name__ = kernel.__qualname__ = f"round_{name}"   # one cache entry of its own
    return kernel


def round_nearest32(x, out, pv, k, seed_lo, seed_hi, stream, offset, t0, t1, counts):
    """The float32 nearest kernel without counters (``lpsim.quantize`` without stats, for a
    format where :func:`lpsim.rounding.nearest32_exact` holds): the arguments and tasks of
    :func:`_kernel`'s kernels, ``k``, the keys and ``counts`` unused.  One pass of
    :func:`nearest32` (:func:`_nearest32_range`)."""
    n = x.size
    first = offset // CHUNK
    lo = max((first + t0 * TASK) * CHUNK, offset) - offset
    hi = min((first + t1 * TASK) * CHUNK, offset + n) - offset
    return _nearest32_range(x, out, pv, lo, hi)


def round_nearest32_all(x, out, pv):
    """:func:`round_nearest32` of the whole array in the calling thread, holding the GIL:
    three arguments to unbox where the tasked kernel has eleven (``lpsim.quantize``'s small
    calls)."""
    return _nearest32_range(x, out, pv, 0, x.size)


@register_jitable
def _nearest32_range(x, out, pv, lo, hi):
    """Round elements lo .. hi-1 of the float32 ``x`` into ``out`` to nearest: a float32 add
    and subtract per element (about half the general fast pass's time), a saturating format's
    overflow included; elements it cannot take (inf, NaN, magnitudes from 2**(105 + m) or,
    unless the format saturates, from its largest value) keep their value and go to
    round_bits after.  In place, a chunk at a time through a scratch
    buffer.  Returns OVERLAP (nothing written) when x and out overlap without being one
    array, else 0."""
    xa, oa = x.ctypes.data, out.ctypes.data
    nbytes = x.size * x.itemsize
    if xa != oa and xa < oa + nbytes and oa < xa + nbytes:
        return OVERLAP
    p = params_of(pv)
    cw, lw, lim, largest = nearest32_consts(p)
    slow = word(np.int32(0))
    if bf16_grid(p) and xa == oa:
        # bfloat16 in place: one array read and written (two names for it would fail the
        # vector loop's overlap check), 2.5 times faster than the scratch chunk below
        for j in range(hi - lo):
            i = np.uint64(lo + j)
            v, ok = bf16_step(out[i], lim)
            out[i] = v
            slow |= ok ^ 1
    elif bf16_grid(p):
        # bfloat16: lpsim.rounding.nearest_bf16, five integer operations on the bits
        for j in range(hi - lo):
            i = np.uint64(lo + j)
            v, ok = bf16_step(x[i], lim)
            out[i] = v
            slow |= ok ^ 1
    elif xa == oa:
        # in place through a scratch chunk: a loop that stores back what it loaded where
        # ok is 0 becomes masked stores, microcoded and slow on AMD (as in _round_task)
        scratch = np.empty(min(hi - lo, CHUNK), np.float32)
        for c in range(lo, hi, CHUNK):
            m = min(CHUNK, hi - c)
            for j in range(m):
                v, ok = nearest32_step(out[np.uint64(c + j)], cw, lw, lim, largest)
                scratch[np.uint64(j)] = v
                slow |= ok ^ 1
            for j in range(m):
                out[np.uint64(c + j)] = scratch[np.uint64(j)]
    else:
        for j in range(hi - lo):
            i = np.uint64(lo + j)
            v, ok = nearest32_step(x[i], cw, lw, lim, largest)
            out[i] = v
            slow |= ok ^ 1
    if slow != 0:
        nearest32_rest(out, lo, hi, lim, p)
    return 0


@register_jitable(forceinline=True)
def bf16_step(xv, lim):
    """:func:`nearest32_step` for bfloat16's grid (:func:`bf16_grid`): (xv rounded by
    :func:`lpsim.rounding.nearest_bf16`, 1) where |xv| < lim, else (xv, 0)."""
    b = float32_bits(xv)
    ok = abs(xv) < lim                          # false for NaN
    return (bits_float32(nearest_bf16(b)) if ok else xv), like(b, ok)


@register_jitable
def bf16_grid(p):
    """Whether ``p``'s format rounds to nearest on bfloat16's grid below ``lim`` (7 mantissa
    bits, float32's normal and subnormal range, signed, not saturating), where
    :func:`lpsim.rounding.nearest_bf16` is its nearest rounding."""
    return (p.m == 7 and p.emin == -126 and p.qsub == -133 and p.unsigned == 0
            and p.ovf_inf != p.maxb)


@register_jitable
def nearest32_rest(out, lo, hi, lim, p):
    """Nearest rounding of the elements lo .. hi-1 of the float32 ``out`` that a nearest32
    pass left (|value| not below lim, NaN included; they hold their own value, and a rounded
    value is its own rounding): below 2**(105 + m) (a format's overflow) by nearest32 and
    round_bits' overflow rule, the rest (inf, NaN, huge values) by round_bits."""
    outb = as_bits(out)
    cw, lw = nearest32_words(p.m, p.emin)
    top = bits_float32(word(nearest32_top(p.m)))
    largest = bits_float32(word(p.maxb))
    # round_bits: an overflow to nearest is ovf_inf, signed unless it is the NaN
    ovf_sign = 0 if p.ovf_inf == p.nanb else 0x80000000
    for i in range(lo, hi):
        v = out[i]
        if not abs(v) < lim:
            b = np.int64(outb[i])
            if abs(v) < top:
                q = nearest32(float32_bits(v), cw, lw)
                if q > largest:
                    outb[i] = np.int32(p.ovf_inf | (b & ovf_sign))
                else:
                    outb[i] = np.int32(as_int64(float32_bits(q)) | (b & 0x80000000))
            else:
                outb[i], _ = round_bits(b, NEAREST, np.int64(0), 0, p)


NEAREST32 = njit(nogil=True, cache=True)(round_nearest32)
#: holds the GIL: releasing and taking it back costs more than rounding 100 elements
NEAREST32_ALL = njit(cache=True)(round_nearest32_all)


@functools.cache
def nearest32_entry():
    """The compiled entry point of :func:`round_nearest32` (float32 arrays)."""
    x = np.zeros(1, np.float32)
    args = (x, np.zeros_like(x), np.zeros(len(Params._fields), np.int64), 1, 0, 0, 0, 0, 0,
            0, np.zeros(NCOUNTS, np.int64))
    return entry_point(NEAREST32, args, "the CPU float32 nearest kernel")


@functools.cache
def nearest32_all_entry():
    """The compiled entry point of :func:`round_nearest32_all` (float32 arrays)."""
    x = np.zeros(1, np.float32)
    args = (x, np.zeros_like(x), np.zeros(len(Params._fields), np.int64))
    return entry_point(NEAREST32_ALL, args, "the CPU float32 nearest kernel for small calls")


#: the dispatcher of each mode, compiled on first use (per container) and cached on disk
KERNELS = {mode: njit(nogil=True, cache=True)(_kernel(mode)) for mode in MODES.values()}


#: seconds a compile may take before lpsim says what is happening (None: never)
NOTICE_AFTER = 1.0


@contextlib.contextmanager
def compile_notice(what: str):
    """Say on stderr what is compiling when it takes more than NOTICE_AFTER seconds (a
    compile takes seconds once; loading numba's on-disk cache, a fraction of one)."""
    if NOTICE_AFTER is None:
        yield
        return
    timer = threading.Timer(NOTICE_AFTER, lambda: print(
        f"lpsim: compiling or loading {what} (seconds, once: later calls and processes load "
        "it from numba's on-disk cache; `lpsim warmup` prepares the kernels programs call "
        "first)",
        file=sys.stderr, flush=True))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def entry_point(dispatcher, args, what: str):
    """The compiled entry point of ``dispatcher`` for the types of ``args`` (compiled now,
    with a notice if that takes long): a call without numba's argument typing."""
    signature = tuple(typeof(a) for a in args)
    with compile_notice(what):
        dispatcher.compile(signature)
    overload_ = dispatcher.overloads.get(tuple(dispatcher.typeof_pyval(a) for a in args))
    return getattr(overload_, "entry_point", None) or dispatcher


def first_call(dispatcher, what: str):
    """compile_notice(what) while ``dispatcher`` has no compiled signature, else nothing."""
    return contextlib.nullcontext() if dispatcher.overloads else compile_notice(what)


@functools.cache
def entry(mode: int, dtype: np.dtype):
    """The compiled entry point of ``mode`` for ``dtype`` arrays, without numba's dispatch
    (typing the arguments on every call costs more than rounding a small array)."""
    dispatcher = KERNELS[mode]
    x = np.zeros(1, dtype)
    pv = np.zeros(len(Params._fields), np.int64)
    counts = np.zeros(NCOUNTS, np.int64)
    args = (x, np.zeros_like(x), pv, 1, 0, 0, 0, 0, 0, 0, counts)
    name = next(name for name, code in MODES.items() if code == mode)
    return entry_point(dispatcher, args,
                       f"the CPU kernel of rounding={name!r} for {np.dtype(dtype)} arrays")


def ntasks(n: int, offset: int) -> int:
    nchunks = (offset + n + CHUNK - 1) // CHUNK - offset // CHUNK
    return (nchunks + TASK - 1) // TASK


def run(x, out, mode, pv, k, seed_lo, seed_hi, stream, offset, counts, kernel=None,
        grain: int = PARALLEL_GRAIN) -> int:
    """Round the 1-D C-contiguous writable float array ``x`` into ``out`` (same dtype and
    size, or ``x``), adding to ``counts``; returns the kernel's status (0 or OVERLAP).

    Arrays of fewer than 2 * ``grain`` elements run in the calling thread; larger ones on
    up to one thread per ``grain`` elements, taking ranges of tasks as they finish
    (:func:`lpsim.pool.deal`; the bits do not depend on the split: the random words are
    counter-based).  ``kernel``: another entry
    point of the same arguments (default: ``mode``'s for x's dtype).
    """
    n = x.size
    tasks = ntasks(n, offset)
    kernel = kernel or entry(mode, x.dtype)
    if n < 2 * grain:
        return kernel(x, out, pv, k, seed_lo, seed_hi, stream, offset, 0, tasks, counts)
    workers = min(threads(), tasks, n // grain)
    if workers <= 1:
        return kernel(x, out, pv, k, seed_lo, seed_hi, stream, offset, 0, tasks, counts)
    xa, oa = x.__array_interface__["data"][0], out.__array_interface__["data"][0]
    if xa != oa and xa < oa + x.nbytes and oa < xa + x.nbytes:
        return OVERLAP

    def rounded(t0, t1):
        piece = np.zeros(NCOUNTS, np.int64)
        kernel(x, out, pv, k, seed_lo, seed_hi, stream, offset, t0, t1, piece)
        return piece
    counts += sum(deal(rounded, pieces(tasks, workers), workers))
    return 0
