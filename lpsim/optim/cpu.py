"""The fused CPU step: one pass over weight, gradient and states per parameter (numba).

Each element runs :func:`lpsim.optim.step.step_quad`, the scalar core that lpsim_cuda's
kernel runs too; the quads (four consecutive global indices, one Philox block of state bits,
two of weight bits) are dealt out to numba's thread count with the GIL released, and the
bits do not depend on the split (counter-based random words).
"""

from __future__ import annotations

import os

import numpy as np
import torch
from numba import get_num_threads, njit

from lpsim.quantize import PARALLEL_GRAIN, _pool

from .step import NCOUNTS, step_quad


@njit(nogil=True, cache=True)
def _optim_step_quads(wb, gb, mb, vb, cb, rb, kinds, hp, ints, keys, offset, pw, pc, ps, sp16,
                      q0, q1):
    """Step quads q0 .. q1-1 (global quad indices); returns the NCOUNTS counters."""
    counts = np.zeros(NCOUNTS, np.int64)
    n = wb.size
    for q in range(q0, q1):
        step_quad(q, n, offset, wb, gb, mb, vb, cb, rb, kinds, hp, ints, keys, pw, pc, ps,
                  sp16, counts)
    return counts


def bits_view(t: torch.Tensor | None, like: np.ndarray | None = None) -> np.ndarray:
    """The flat integer view of a contiguous CPU tensor's bits (a 1-element dummy for None)."""
    if t is None:
        return np.zeros(1, like.dtype if like is not None else np.int16)
    t = t.detach()
    itype = {4: torch.int32, 2: torch.int16}[t.element_size()]
    return t.view(itype).reshape(-1).numpy()


def step(wb, gb, mb, vb, cb, rb, kinds, hp, ints, keys, offset, setup) -> np.ndarray:
    """Run the kernel over a parameter's bits (numpy views, written in place)."""
    n = wb.size
    q0 = offset // 4
    q1 = (offset + n + 3) // 4
    args = (wb, gb, mb, vb, cb, rb, kinds, hp, ints, keys, offset, setup.pw, setup.pc,
            setup.ps, tuple(setup.sp16))
    workers = min(get_num_threads(), max(1, n // PARALLEL_GRAIN))
    if workers <= 1:
        return _optim_step_quads(*args, q0, q1)
    bounds = np.linspace(q0, q1, 4 * workers + 1).astype(np.int64)
    pool = _pool(workers, os.getpid())
    pieces = [pool.submit(_optim_step_quads, *args, int(a), int(b))
              for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
    return sum(piece.result() for piece in pieces)
