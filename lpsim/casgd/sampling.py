"""Counter-based row sampling: draw t of a run is a pure function of (seed, t).

Row of draw t: the 62-bit word R of lane t % 2 of Philox block t // 2 in stream
``SAMPLE_STREAM`` (the float64 mapping of :mod:`lpsim.philox`), taken modulo m (bias at most
m / 2**62).  The GPU draws on the device (:mod:`lpsim_cuda.casgd`) and the CPU simulator
draws the same rows with :class:`PhiloxIndices` (its default sampler), so one seed is one
sequence of samples on both backends.
:class:`WeightedIndices` turns either into draws with probability proportional to weights.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.extending import register_jitable

from ..philox import block_words, lane_word, split_key

#: the Philox stream of the samples: far above the slot roundings' streams 1, 2, ...
SAMPLE_STREAM = 1 << 62


@register_jitable
def sample_row(t, m, seed_lo, seed_hi, stream):
    """The row (0 <= row < m) of draw t."""
    t = np.int64(t)
    words = block_words(t // 2, np.int64(stream), np.int64(seed_lo), np.int64(seed_hi))
    return lane_word(words, t % 2, 2) % np.int64(m)


@njit(cache=True)
def sample_rows_cpu(idx, first, m, seed_lo, seed_hi, stream):
    """idx[i] = the row of draw first + i."""
    for i in range(idx.size):
        idx[i] = sample_row(first + i, m, seed_lo, seed_hi, stream)


class PhiloxIndices:
    """i.i.d. uniform rows of 0..m-1 with replacement, draw t from (seed, t): the same
    ``take`` interface as :class:`lpsim.casgd.solvers.IndexStream`."""

    def __init__(self, m: int, seed: int = 0):
        self.m, self.drawn = int(m), 0
        self.seed_lo, self.seed_hi = split_key(seed, "seed")

    def take(self, k: int) -> np.ndarray:
        idx = np.empty(k, np.int64)
        sample_rows_cpu(idx, self.drawn, self.m, self.seed_lo, self.seed_hi, SAMPLE_STREAM)
        self.drawn += k
        return idx


class WeightedIndices:
    """Rows drawn with probability w_i / W (W = sum w) by inverting the cumulative weights.

    Each draw takes one draw j of a uniform sampler (``uniform(k)``: rows 0..k-1, e.g.
    :class:`PhiloxIndices`) and returns the row i with cum_{i-1} <= t < cum_i.  Integer weights
    (W <= 2**53) take t = j, uniform over the W integers, so weight k is the same draw as k
    consecutive copies of the row, and all-ones weights give exactly the unweighted rows;
    other weights take j < 2**53 and t = j W / 2**53.  Zero-weight rows are never drawn.
    """

    def __init__(self, weights, uniform):
        w = np.asarray(weights, np.float64)
        self.cum = np.cumsum(w)
        integral = bool((w == np.floor(w)).all()) and float(self.cum[-1]) <= 2.0 ** 53
        top = float(w.max()) if w.size else 0.0
        if not integral and 0 < top < 1:
            # the largest weight brought to [1, 2) by a power of two, which is exact and
            # keeps every ratio: W / 2**53 underflowed for tiny weights (all of them 5e-324,
            # say), and every draw was then row 0
            self.cum = np.cumsum(np.ldexp(w, 1 - int(np.frexp(top)[1])))
        total = float(self.cum[-1])
        self.scale = None if integral else total / 2.0 ** 53
        self.last = int(np.flatnonzero(w > 0)[-1])
        #: the uniform draws' range: rows 0..span-1 of ``uniform``
        self.span = int(total) if integral else 2 ** 53
        self.base = uniform(self.span)

    def rows(self, j: np.ndarray) -> np.ndarray:
        """The rows of uniform draws j."""
        t = j.astype(np.float64) if self.scale is None else j * self.scale
        return np.minimum(np.searchsorted(self.cum, t, side="right"), self.last)

    def take(self, k: int) -> np.ndarray:
        return self.rows(self.base.take(k))
