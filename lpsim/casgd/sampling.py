"""Counter-based row sampling: draw t of a run is a pure function of (seed, t).

Row of draw t: the 62-bit word R of lane t % 2 of Philox block t // 2 in stream
``SAMPLE_STREAM`` (the float64 mapping of :mod:`lpsim.philox`), taken modulo m (bias at most
m / 2**62).  The GPU draws on the device (:mod:`lpsim_cuda.casgd`) and the CPU simulator
replays the same rows with :class:`PhiloxIndices`, so both run on the same samples.
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
