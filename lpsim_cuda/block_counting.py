"""What a counted block kernel's thread adds up, in 32-bit words.

:mod:`lpsim_cuda.block_groups` with ``count`` keeps the nine
:data:`lpsim.blocks.BLOCK_COUNTERS` per thread as words, takes each element's flags one a
word as the CPU's decisions give them (:func:`lpsim.blocks.decisions.
element_nearest32_conditions`, :func:`lpsim.blocks.decisions.element_fast32_conditions`),
and adds the warp's sums into the device counters at the end.

Why words and flags one a value: int64 counters cost two instructions an add and the
round_bits flags word a shift and a mask a counter; packed one a byte (the CPU's SIMD
lanes' form) they cost a pack and an unpack.  A thread rounds far fewer than 2**32
elements (a grid-stride loop over one wave), so its words do not wrap.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from lpsim.blocks.decisions import (block_recip, element_exact, element_fast32_conditions,
                                    element_stochastic32_conditions)
from lpsim.word32 import as_int64, like, word

from .counters import add_warp_count

#: float32 bits of inf
INF32 = 0x7F800000


@cuda.jit(device=True)
def tally_flags(c, flags):
    """The nine counters ``c`` (32-bit words) plus one element's round_bits flags (INEXACT
    .. INF_IN)."""
    f = word(flags)
    return (c[0] + (f & 1), c[1] + ((f >> 1) & 1), c[2] + ((f >> 2) & 1),
            c[3] + ((f >> 3) & 1), c[4] + ((f >> 4) & 1), c[5] + ((f >> 5) & 1),
            c[6], c[7], c[8])


@cuda.jit(device=True)
def tally_quad(c, f0, f1, f2, f3):
    """The counters ``c`` plus a quad's flags: each element's (inexact, overflow, underflow,
    subnormal), 0 or 1 words (:func:`lpsim.blocks.element_nearest32_conditions`,
    :func:`element32`), added as they are."""
    return (c[0] + f0[0] + f1[0] + f2[0] + f3[0], c[1] + f0[1] + f1[1] + f2[1] + f3[1],
            c[2] + f0[2] + f1[2] + f2[2] + f3[2], c[3] + f0[3] + f1[3] + f2[3] + f3[3],
            c[4], c[5], c[6], c[7], c[8])


@cuda.jit(device=True)
def tally_nonfinite(c, b):
    """The counters ``c`` plus one element of a NaN block (float32 bits ``b``): a NaN or
    inf input counted as :func:`lpsim.blocks.word_counts._nonfinite_block` counts it.  Only
    blocks holding a NaN or inf take it (benchmarks/kernel_budget.py's straight count
    stubs it)."""
    a = word(b) & 0x7FFFFFFF
    return (c[0], c[1], c[2], c[3], c[4] + like(a, a > INF32), c[5] + like(a, a == INF32),
            c[6], c[7], c[8])


@cuda.jit(device=True)
def element32(xv, rc, s32, s, r, bp, mode, k, p32, p, c):
    """(value, (inexact, overflow, underflow, subnormal), 1 where q is nonzero, c): the word
    kernel's float32 step (:func:`lpsim.blocks.element_fast32_conditions`: its flags one a
    32-bit word each, which the caller adds to its counters as they are), and
    :func:`lpsim.blocks.element_exact` where it declines, whose inf or NaN flag (a quotient
    that overflowed) goes into the counters ``c`` here."""
    q, v, ok, i, o, u, b = element_fast32_conditions(xv, r, rc, s32, mode, k, p32, bp)
    return _exact_where_declined(q, v, ok, i, o, u, b, xv, s, r, bp, mode, k, p, c)


@cuda.jit(device=True)
def element32_sr(xv, rc, s32, s, r, bp, mode, k, p32, p, c):
    """:func:`element32` for full-word stochastic rounding (where
    :func:`lpsim.rounding.sr_word_applies` holds): the same decisions and flags in fewer
    operations (:func:`lpsim.blocks.decisions.element_stochastic32_conditions`)."""
    q, v, ok, i, o, u, b = element_stochastic32_conditions(xv, r, rc, s32, p32, bp)
    return _exact_where_declined(q, v, ok, i, o, u, b, xv, s, r, bp, mode, k, p, c)


@cuda.jit(device=True)
def _exact_where_declined(q, v, ok, i, o, u, b, xv, s, r, bp, mode, k, p, c):
    """A float32 step's (value, flags, nonzero, c), or element_exact's where the step
    declined (ok 0), its inf or NaN flag added into ``c``."""
    nz = like(i, q != 0)
    if ok == 0:
        q64, v, f64 = element_exact(xv, block_recip(s, bp), s, mode, r, k, p, bp)
        f = word(f64)
        i, o, u, b, nz = f & 1, (f >> 1) & 1, (f >> 2) & 1, (f >> 3) & 1, like(i, q64 != 0)
        c = (c[0], c[1], c[2], c[3], c[4] + ((f >> 4) & 1), c[5] + ((f >> 5) & 1), c[6],
             c[7], c[8])
    return np.float32(v), (i, o, u, b), nz, c


#: the element step of a counted nearest kernel's block whose largest quotient overflows
#: float32 (a tiny given tensor scale; element_exact flags it, as the CPU's counted kernel
#: does): its own name, which benchmarks/kernel_budget.py's straight count stubs
overflowed_element = element32


@cuda.jit(device=True)
def add_counts9(counts, c):
    """Add one thread's nine counters (32-bit words) into ``counts`` (slots 0 .. 8) as the
    quantize kernels add theirs (:func:`lpsim_cuda.counters.add_warp_count`: per warp, in
    int64, one atomic a counter).  Every lane of the warp calls it."""
    for f in range(9):
        add_warp_count(counts, f, as_int64(c[f]))
