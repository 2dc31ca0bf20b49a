"""CA-SGD kernels: the inner s-step recurrence and the counter-based row sampler.

Both call the jitted steps of :mod:`lpsim.casgd.inner` and :mod:`lpsim.casgd.sampling`, the
same functions the CPU simulator's kernels call, so their results are bit-identical to it.
The recurrence runs on one thread block (a warp per row, ``ROWS`` rows at a time): inner
step j needs every residual of the steps before it, so blocks of rows follow each other
behind a barrier, and the 32 lanes of a row compute the correction dot in the contract's
order (lane sums, then the tree in shared memory).
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np
from numba import cuda

from lpsim.casgd.inner import DOT_LANES, finish_row, lane_sum, tree_add
from lpsim.casgd.sampling import sample_row

from . import launch

#: rows of one inner step worked on at once (the thread block is DOT_LANES x ROWS)
ROWS = 2 if launch.SIMULATOR else 8
#: threads per block of the sampler
SAMPLE_THREADS = 32 if launch.SIMULATOR else 256


@cuda.jit
def _inner_kernel(r, G, y, delta, delta_c, b, s, alpha_c, loss, pc, ps):
    lane = cuda.threadIdx.x
    slot = cuda.threadIdx.y
    part = cuda.shared.array((ROWS, DOT_LANES), np.float64)
    for j in range(s):
        upto = j * b
        base = 0
        while base < b:                 # the same for every thread: all reach the barriers
            i = base + slot
            active = i < b
            row = upto + i
            if active:
                part[slot, lane] = lane_sum(G, row, delta_c, upto, lane, pc)
            cuda.syncthreads()
            width = DOT_LANES // 2
            while width > 0:
                if active and lane < width:
                    part[slot, lane] = tree_add(part[slot, lane], part[slot, lane + width], pc)
                cuda.syncthreads()
                width //= 2
            if active and lane == 0:
                d, dc = finish_row(r[row], part[slot, 0], y[row], upto == 0, alpha_c, loss, pc,
                                   ps)
                delta[row] = d
                delta_c[row] = dc
            cuda.syncthreads()
            base += ROWS


@cuda.jit
def _sample_kernel(idx, first, m, seed_lo, seed_hi, stream):
    i = cuda.grid(1)
    while i < idx.size:
        idx[i] = sample_row(first[0] + i, m, seed_lo, seed_hi, stream)
        i += cuda.gridsize(1)


@cuda.jit
def _gather_csr_kernel(crow, col, val, idx, out):
    row = cuda.blockIdx.x
    while row < idx.size:
        src = idx[row]
        k = crow[src] + cuda.threadIdx.x
        while k < crow[src + 1]:
            out[row, col[k]] = val[k]
            k += cuda.blockDim.x
        row += cuda.gridDim.x


#: the simulator swaps module globals while a kernel runs: one simulated launch at a time
#: (ranks run as threads in the collective tests); real launches are asynchronous, no lock
_SIM_LOCK = threading.Lock() if launch.SIMULATOR else contextlib.nullcontext()


def view(t):
    """A numba array over a torch tensor's memory: the tensor's numpy view under the
    simulator (CPU tensors), else a device array from its data pointer (no synchronisation)."""
    if launch.SIMULATOR:
        return t.detach().numpy()
    desc = {"shape": tuple(t.shape), "strides": None, "data": (t.data_ptr(), False),
            "typestr": np.dtype(str(t.dtype).replace("torch.", "")).str, "version": 2}
    return cuda.from_cuda_array_interface(desc, owner=t, sync=False)


def _stream(t):
    return 0 if launch.SIMULATOR or not t.is_cuda else launch.torch_stream(t.device)


def inner_recurrence(r, G, y, delta, delta_c, b: int, s: int, alpha_c: float, loss: int, pc,
                     ps) -> None:
    """delta, delta_c (float64 tensors of s*b) from margins r, Gram G and labels y (tensors
    on one device), on torch's current stream: :func:`lpsim.casgd.inner.inner_recurrence_cpu`
    on the GPU."""
    with _SIM_LOCK:
        _inner_kernel[1, (DOT_LANES, ROWS), _stream(r)](
            view(r), view(G), view(y), view(delta), view(delta_c), b, s, alpha_c, loss, pc, ps)


def sample_rows(idx, first, m: int, seed_lo: int, seed_hi: int, stream: int) -> None:
    """idx[i] = the row of draw ``first[0] + i`` (int64 tensors; ``first`` stays on the device,
    so a CUDA graph replays the draws that follow): :func:`lpsim.casgd.sampling.sample_row`."""
    n = idx.numel()
    blocks = max(1, min(-(-n // SAMPLE_THREADS), 2 if launch.SIMULATOR else 1024))
    with _SIM_LOCK:
        _sample_kernel[blocks, SAMPLE_THREADS, _stream(idx)](view(idx), view(first), m, seed_lo,
                                                             seed_hi, stream)


def gather_csr(crow, col, val, idx, out) -> None:
    """out[i, col[k]] = val[k] for the entries k of CSR row idx[i] (out zeroed by the caller):
    the sampled rows of a sparse A, dense for the tensor-core GEMMs.  Values move as bits, so
    bf16/fp16 storage needs no conversion."""
    import torch
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[val.element_size()]
    blocks = max(1, min(idx.numel(), 2 if launch.SIMULATOR else 4096))
    threads = 4 if launch.SIMULATOR else 128
    with _SIM_LOCK:
        _gather_csr_kernel[blocks, threads, _stream(idx)](
            view(crow), view(col), view(val.view(bits)), view(idx), view(out.view(bits)))
