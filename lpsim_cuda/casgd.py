"""CA-SGD kernels: the inner s-step recurrence and the counter-based row sampler.

Both call the jitted steps of :mod:`lpsim.casgd.inner` and :mod:`lpsim.casgd.sampling`, the
same functions the CPU simulator's kernels call, so their results are bit-identical to it.
The recurrence runs on one thread block, a warp per row (up to ``ROWS`` rows of a step at
once): inner step j needs every delta_c of the steps before it, so steps follow each other
behind one barrier, and the 32 lanes of a row compute the correction dot in the contract's
order (lane sums, then the tree, by warp shuffles on a GPU).

The recurrence is a chain of s steps, each short, so its time is latency, not throughput:
delta_c lives in shared memory where it fits (``SHARED_ROWS``), each warp prefetches into
L1 the Gram row it works on next, and a lane's sum issues four products' loads at once
(:func:`lpsim.casgd.inner.lane_sum`), so a step waits on memory about once, not once per
product as a plain loop over global memory did.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np
from numba import cuda, float64

from lpsim.casgd.inner import DOT_LANES, finish_row, lane_sum, tree_add
from lpsim.casgd.sampling import sample_row

from . import launch

#: most rows of one inner step worked on at once (the thread block is DOT_LANES x rows)
ROWS = 2 if launch.SIMULATOR else 32
#: most s*b rows whose delta_c the recurrence keeps in shared memory (48 KiB, the most a
#: launch takes without opting in); more read it from global memory
SHARED_ROWS = 6144
#: threads per block of the sampler
SAMPLE_THREADS = 32 if launch.SIMULATOR else 256
#: bytes of one L1 line, the prefetch's unit
_LINE = 128

if launch.SIMULATOR:     # the simulator has no warp shuffles and no prefetch
    @cuda.jit(device=True)
    def _lane_tree(v, slot, lane, pc):
        """The tree of a warp's 32 lane sums (lane l += l + 16, + 8, ..., + 1), its root on
        lane 0: through shared memory between barriers, so every thread must call it."""
        part = cuda.shared.array((ROWS, DOT_LANES), np.float64)
        part[slot, lane] = v
        cuda.syncthreads()
        width = DOT_LANES // 2
        while width > 0:
            if lane < width:
                part[slot, lane] = tree_add(part[slot, lane], part[slot, lane + width], pc)
            cuda.syncthreads()
            width //= 2
        v = part[slot, 0]
        cuda.syncthreads()
        return v

    @cuda.jit(device=True)
    def _prefetch_row(G, row, upto, lane):
        pass
else:
    from .ptx import prefetch_l1

    @cuda.jit(device=True)
    def _lane_tree(v, slot, lane, pc):
        """The tree of a warp's 32 lane sums (lane l += l + 16, + 8, ..., + 1), its root on
        lane 0, by shuffles down: the same pairs in the same order as the CPU's tree."""
        width = DOT_LANES // 2
        while width > 0:
            v = tree_add(v, cuda.shfl_down_sync(launch.FULL_MASK, v, width), pc)
            width //= 2
        return v

    @cuda.jit(device=True)
    def _prefetch_row(G, row, upto, lane):
        """Prefetch into L1 the lines of G[row, :upto], a line a lane (elements 0, L, 2L, ...
        and the last one, L a line's elements: every line the row's dot will read)."""
        step = _LINE // 4 if G.itemsize == 4 else _LINE // 8     # (no 64-bit division)
        k = lane * step
        while k < upto + step - 1 and upto > 0:
            prefetch_l1(G, row, min(k, upto - 1))
            k += DOT_LANES * step


@cuda.jit(device=True)
def _recurrence(r, G, y, delta, delta_c, dc, b, s, alpha_c, loss, pc, ps):
    """The s inner steps, delta_c read from ``dc`` (shared memory, or delta_c itself).

    Warp ``slot`` works on rows upto + slot, upto + slot + rows, ... of each step; the loop is
    the same for every thread, so all reach the barriers."""
    lane = cuda.threadIdx.x
    slot = cuda.threadIdx.y
    rows = cuda.blockDim.y
    for j in range(s):
        upto = j * b
        base = 0
        while base < b:
            i = base + slot
            active = i < b
            row = upto + i
            acc = r_i = y_i = 0.0
            if active:
                r_i, y_i = r[row], y[row]          # loads in flight during the dot
                if i + rows < b:                   # this warp's next row: this step's ...
                    _prefetch_row(G, row + rows, upto, lane)
                elif j + 1 < s:                    # ... or the next step's
                    _prefetch_row(G, upto + b + slot, upto + b, lane)
                acc = lane_sum(G, row, dc, upto, lane, pc)
            corr = _lane_tree(acc, slot, lane, pc)
            if active and lane == 0:
                d, d_c = finish_row(r_i, corr, y_i, upto == 0, alpha_c, loss, pc, ps)
                delta[row] = d
                delta_c[row] = d_c
                dc[row] = d_c
            base += rows
        cuda.syncthreads()                         # this step's delta_c, seen by the next


#: a block of up to DOT_LANES x ROWS threads: ptxas then keeps the kernels within the
#: registers such a block may have (64 a thread for 1024), so no b fails to launch
_BOUNDS = {} if launch.SIMULATOR else {"launch_bounds": (DOT_LANES * ROWS,)}


@cuda.jit(**_BOUNDS)
def _inner_kernel(r, G, y, delta, delta_c, b, s, alpha_c, loss, pc, ps):
    _recurrence(r, G, y, delta, delta_c, delta_c, b, s, alpha_c, loss, pc, ps)


@cuda.jit(**_BOUNDS)
def _inner_kernel_shared(r, G, y, delta, delta_c, b, s, alpha_c, loss, pc, ps):
    _recurrence(r, G, y, delta, delta_c, cuda.shared.array(0, float64), b, s, alpha_c,
                loss, pc, ps)


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
    rows = s * b
    shared = rows * 8 if rows <= SHARED_ROWS else 0
    kernel = _inner_kernel_shared if shared else _inner_kernel
    with _SIM_LOCK:
        kernel[1, (DOT_LANES, max(1, min(ROWS, b))), _stream(r), shared](
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
