"""Transposing copies of 2-D float arrays on lpsim's thread pool.

A simulated wgrad blocks its operands along the tokens, which a layer's activations and
gradients hold down their columns: each is copied transposed before it is quantized.
torch's transposing copy of a 2048 x 1024 float32 tensor took about 2.4 ms on two cores
(its strided copy); this kernel walks stripes of :data:`STRIPE` rows, reading STRIPE
elements down a column from lines that stay in L1 and writing them as one run, about three
times faster (benchmarks/bench_recipes.py times the training step it is part of).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .pool import deal, pieces, threads

#: rows a stripe takes at once: a run of STRIPE elements written per column
STRIPE = 8
#: elements per extra thread (a copy pays for a thread later than a rounding)
PARALLEL_GRAIN = 1 << 19


@njit(nogil=True, cache=True)
def _transpose_rows(x, out, r0, r1):
    """out[:, r0:r1] = x[r0:r1].T, in stripes of STRIPE rows."""
    n = x.shape[1]
    full = r0 + (r1 - r0) // STRIPE * STRIPE
    for t0 in range(r0, full, STRIPE):
        for j in range(n):
            for i in range(STRIPE):
                out[j, t0 + i] = x[t0 + i, j]
    for t in range(full, r1):
        for j in range(n):
            out[j, t] = x[t, j]


def transposed(x: np.ndarray) -> np.ndarray:
    """``np.ascontiguousarray(x.T)`` of a C-contiguous 2-D float32 or float64 array, its
    stripes of rows dealt out to lpsim's pool; other arrays through numpy."""
    if not (isinstance(x, np.ndarray) and x.ndim == 2 and x.flags.c_contiguous
            and x.dtype in (np.float32, np.float64)):
        return np.ascontiguousarray(np.asarray(x).T)
    rows, cols = x.shape
    out = np.empty((cols, rows), x.dtype)
    if x.size == 0:
        return out
    stripes = (rows + STRIPE - 1) // STRIPE
    workers = max(1, min(threads(), x.size // PARALLEL_GRAIN, stripes))
    deal(lambda a, b: _transpose_rows(x, out, a * STRIPE, min(b * STRIPE, rows)),
         pieces(stripes, workers), workers)
    return out
