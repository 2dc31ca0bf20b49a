"""The random Hadamard transform's arithmetic on runs of rows of float32, in one order.

A run of n rows (n = len(c), a power of two) becomes ``H diag(d) x / sqrt(n)`` down each
column: first each row times its factor ``c[i] = d_i * fl(1/sqrt(n))``, then the butterfly
for h = n/2, ..., 1, pairs of rows (i, i+h) within each group of 2h becoming (a + b, a - b),
every operation rounded once in float32 (:mod:`lpsim.torch.hadamard` defines the order).
Rows are the columns' unit of work: each step is a vector operation along a row.

Why here: :func:`lpsim.torch.hadamard.rht_tokens` transforms a tensor with it, and the
band kernel of :mod:`lpsim.blocks.columns` transforms each band of a weight gradient's
operand in its cache just before it quantizes it (no transformed tensor in memory); one
function, so the two give the same bits.
"""

from __future__ import annotations

import numpy as np
from numba.extending import register_jitable


@register_jitable(forceinline=True)
def hadamard_rows(src, s0, sstride, dst, d0, dstride, c, h, w):
    """dst[d0 + i*dstride + j] = the transform (runs of n = c.size rows, row i's factor
    c[i % n]) of src[s0 + i*sstride + j], for rows i < h (a multiple of n) and j < w; src
    and dst flat float32 arrays that do not overlap."""
    n = c.size
    half = n // 2
    if half == 0:                           # runs of one row: the factors alone
        for i in range(h):
            a0, b0 = np.uint64(s0 + i * sstride), np.uint64(d0 + i * dstride)
            for j in range(w):
                jj = np.uint64(j)
                dst[b0 + jj] = src[a0 + jj] * c[0]
        return
    # the factors and the first stage (pairs half apart) in one pass; unsigned offsets: no
    # negative-index checks, so each row's loop vectorises
    for t0 in range(0, h, n):
        for i in range(half):
            ca, cb = c[i], c[i + half]
            a0 = np.uint64(s0 + (t0 + i) * sstride)
            b0 = np.uint64(s0 + (t0 + i + half) * sstride)
            a1 = np.uint64(d0 + (t0 + i) * dstride)
            b1 = np.uint64(d0 + (t0 + i + half) * dstride)
            for j in range(w):
                jj = np.uint64(j)
                a, b = src[a0 + jj] * ca, src[b0 + jj] * cb
                dst[a1 + jj] = a + b
                dst[b1 + jj] = a - b
    butterfly(dst, d0, dstride, n, h, w, n // 4)


@register_jitable(forceinline=True)
def butterfly(dst, d0, dstride, n, h, w, first):
    """The butterfly stages half = ``first``, first/2, ..., 1 of each run of n rows of dst
    (rows i < h, a multiple of n; row i at d0 + i*dstride, w elements): within each group
    of 2*half rows, rows (i, i+half) become (a + b, a - b), in place, each rounded once.
    The order of the transform, shared by :func:`hadamard_rows` (from n/4, its first stage
    made with the factors) and lpsim_cuda's kernel (from n/2, on a thread's run in
    registers: w = 1)."""
    for t0 in range(0, h, n):
        half = first
        while half >= 1:
            for g in range(0, n, 2 * half):
                for i in range(t0 + g, t0 + g + half):
                    a0 = np.uint64(d0 + i * dstride)
                    b0 = np.uint64(d0 + (i + half) * dstride)
                    for j in range(w):
                        jj = np.uint64(j)
                        a, b = dst[a0 + jj], dst[b0 + jj]
                        dst[a0 + jj] = a + b
                        dst[b0 + jj] = a - b
            half //= 2


@register_jitable
def hadamard_amax_bits(x, c, scratch, r0, r1):
    """The largest finite magnitude bits (a 32-bit word's value, int64) of the transform of
    rows r0 .. r1-1 of the 2-D float32 ``x`` (runs of c.size rows; r0 and r1 multiples of
    it), a run at a time through ``scratch`` (at least c.size * x.shape[1] float32)."""
    n, cols = c.size, x.shape[1]
    xf = x.reshape(-1)
    sb = scratch.view(np.uint32)
    cinf = np.uint32(255 << 23)
    top = np.uint32(0)
    for r in range(r0, r1, n):
        hadamard_rows(xf, r * cols, cols, scratch, 0, cols, c, n, cols)
        am = np.uint32(0)
        for j in range(n * cols):           # a plain max first: one vector op per element
            am = max(am, sb[np.uint64(j)] & np.uint32(0x7FFFFFFF))
        if am >= cinf:                      # an inf or NaN: the max below inf's bits
            am = np.uint32(0)
            for j in range(n * cols):
                a = sb[np.uint64(j)] & np.uint32(0x7FFFFFFF)
                if a < cinf:
                    am = max(am, a)
        top = max(top, am)
    return np.int64(top)
