"""The random Hadamard transform along the tokens, transposed, in one pass on the device.

Why: a recipe's weight gradient on a GPU quantizes the transposes of dY and X (K the tokens
along their rows) after the RHT along the tokens (:mod:`lpsim.torch.hadamard`).  In torch
operations that is a transposing copy, a product and log2(n) butterfly stages, each a pass
over memory and a launch or three.  Here each thread takes one feature's run of n tokens:
n loads (consecutive threads, consecutive features: coalesced), the factors and the butterfly
in registers, n stores to the transpose's row.  The arithmetic is
:func:`lpsim.blocks.hadamard_rows.hadamard_rows`' (each element times its factor, then for
h = n/2 .. 1 the pairs (i, i+h) become (a + b, a - b), each rounded once in float32: its
:func:`lpsim.blocks.hadamard_rows.butterfly`, on the run in registers), with
the products made by ``fmul_rn``, which NVVM never fuses with the sums that follow (a fused
multiply-add would round once where the CPU rounds twice): the same bits as the CPU.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda

from lpsim.blocks.hadamard_rows import butterfly

from . import launch
from .arrays import _numba_array
from .launch import SIMULATOR

#: the run lengths the kernel is compiled for (the recipes' RHT sizes and their divisors)
SIZES = (2, 4, 8, 16, 32)

if SIMULATOR:
    @cuda.jit(device=True)
    def _times(a, b):
        return a * b
else:                                                      # pragma: no cover (GPU only)
    from numba.cuda import libdevice

    @cuda.jit(device=True)
    def _times(a, b):
        return libdevice.fmul_rn(a, b)


@functools.cache
def transposed_kernel(n: int):
    """The kernel for runs of ``n`` tokens (a constant of its body, so that its loops unroll
    and the run stays in registers): out[f, r*n + i] = the transform of x[r*n + i, f]."""
    @cuda.jit
    def kernel(x, c, out):
        tokens, features = x.shape
        runs = tokens // n
        # work item i is (run i // features, feature i % features); the grid-stride loop
        # steps both by the stride's quotient and remainder (no division in the loop: a
        # 64-bit one is a subroutine of about a hundred instructions)
        i, stride = cuda.grid(1), cuda.gridsize(1)
        r, f = i // features, i % features
        dr, df = stride // features, stride % features
        while r < runs:
            t0 = r * n
            v = cuda.local.array(n, np.float32)
            for j in range(n):
                v[j] = _times(x[t0 + j, f], c[j])
            butterfly(v, 0, 1, n, n, 1, n // 2)
            for j in range(n):
                out[f, t0 + j] = v[j]
            r += dr
            f += df
            if f >= features:
                f -= features
                r += 1
    return kernel


def transposed_rht(x, c, out) -> None:
    """Write into ``out`` (features x tokens, float32) the RHT along the tokens of ``x``
    (tokens x features, float32), runs of n = len(c) tokens with factors ``c`` (float32):
    ``rht(x.t().contiguous(), signs)`` of :mod:`lpsim.torch.hadamard`, the same bits.  Each
    a C-contiguous CUDA array (a numba device array or a CUDA-array-interface object such as
    a torch tensor); the launch goes on x's stream (torch's current one for a tensor)."""
    with launch.device_of(x):
        _transposed_rht(x, c, out)


def _transposed_rht(x, c, out) -> None:
    xa, stream = _numba_array(x, "x")
    if launch.is_torch(x):
        stream = launch.torch_stream(x.device)
    ca, _ = _numba_array(c, "c")
    oa, _ = _numba_array(out, "out")
    n = ca.size
    tokens, features = xa.shape if xa.ndim == 2 else (0, 0)
    if (xa.ndim != 2 or n not in SIZES or tokens % n or xa.dtype != np.float32
            or ca.dtype != np.float32 or oa.dtype != np.float32
            or tuple(oa.shape) != (features, tokens)):
        raise ValueError(
            f"transposed_rht: x {xa.dtype} {tuple(xa.shape)}, {n} factors of {ca.dtype}, out "
            f"{oa.dtype} {tuple(oa.shape)} are not accepted; accepted: x float32 (tokens, "
            f"features), n in {SIZES} float32 factors with n dividing tokens, out float32 "
            "(features, tokens)")
    if xa.size == 0:
        return
    device = launch.current_device()
    launch.configured(transposed_kernel(n), launch.grid_size(xa.size // n, device),
                      stream)(xa, ca, oa)


__all__ = ["SIZES", "transposed_kernel", "transposed_rht"]
