"""``lpsim_cuda.quantize``: the rounding core on CUDA arrays, bit-identical to the CPU simulator.

Each thread rounds one Philox block (4 float32 or 2 float64 elements) in a grid-stride loop,
calling the same :func:`lpsim.rounding.round_block` as the CPU kernel, so the two paths share
their decision instead of copying it.  The decision is integer-only: no FMA contraction, no
fastmath, no flushed subnormals.  Counters are reduced per block in shared memory and added
with one atomic per counter per block; they stay on the device until a RoundingStats is read.
"""

from __future__ import annotations

import numpy as np
from numba import config, cuda

from lpsim.formats import parse_format
from lpsim.quantize import plan
from lpsim.rounding import block_range, round_block
from lpsim.stats import RoundingStats

# threads per block; the simulator runs each thread as a Python thread, so it gets fewer
THREADS = 32 if config.ENABLE_CUDASIM else 128
MAX_BLOCKS = 1 << 16   # grid cap; the grid-stride loop covers the rest


@cuda.jit
def _round_kernel(xb, outb, mode, k, p, seed_lo, seed_hi, stream, offset, lanes, counts):
    first, nblocks = block_range(xb.size, offset, lanes)
    c0 = c1 = c2 = c3 = c4 = c5 = 0
    j = cuda.grid(1)
    while j < nblocks:
        d0, d1, d2, d3, d4, d5 = round_block(xb, outb, first + j, offset, mode, k, p,
                                             seed_lo, seed_hi, stream, lanes)
        c0 += d0
        c1 += d1
        c2 += d2
        c3 += d3
        c4 += d4
        c5 += d5
        j += cuda.gridsize(1)
    partial = cuda.shared.array((6, THREADS), np.int64)
    t = cuda.threadIdx.x
    partial[0, t] = c0
    partial[1, t] = c1
    partial[2, t] = c2
    partial[3, t] = c3
    partial[4, t] = c4
    partial[5, t] = c5
    cuda.syncthreads()
    width = THREADS // 2
    while width > 0:
        if t < width:
            for f in range(6):
                partial[f, t] += partial[f, t + width]
        cuda.syncthreads()
        width //= 2
    if t < 6:
        cuda.atomic.add(counts, t, partial[t, 0])


def _torch_stream(x):
    """torch's current CUDA stream as a numba stream, so launches order with torch work."""
    import torch
    return cuda.external_stream(torch.cuda.current_stream(x.device).cuda_stream)


def _as_device_array(x, name):
    """A numba device-array view of x (torch CUDA tensor, CuPy, numba) and its stream."""
    if type(x).__module__.startswith("torch"):
        if not x.is_cuda:
            raise TypeError(f"{name} is a CPU torch tensor; lpsim_cuda takes CUDA tensors "
                            "(lpsim.quantize rounds CPU tensors and numpy arrays)")
        if not x.is_contiguous():
            raise ValueError(f"{name} is a non-contiguous CUDA tensor (strides {x.stride()}); "
                             "pass x.contiguous()")
        return cuda.as_cuda_array(x.detach()), _torch_stream(x)
    if isinstance(x, np.ndarray):
        raise TypeError(f"{name} is a numpy array in host memory; lpsim_cuda takes CUDA arrays "
                        "(torch CUDA tensors, CuPy arrays, numba device arrays); use "
                        "lpsim.quantize for host arrays")
    if cuda.devicearray.is_cuda_ndarray(x) or hasattr(x, "__cuda_array_interface__"):
        array = x if cuda.devicearray.is_cuda_ndarray(x) else cuda.as_cuda_array(x)
        if not array.is_c_contiguous():
            raise ValueError(f"{name} is not C-contiguous; pass a contiguous copy")
        return array, getattr(array, "stream", 0) or 0
    raise TypeError(f"{name} of type {type(x).__name__} is not a CUDA array; accepted: torch "
                    "CUDA tensors, CuPy arrays, numba device arrays")


def quantize(x, fmt, rounding: str = "nearest", *, seed=None, stream: int = 0, sr_bits=None,
             stats: RoundingStats | None = None, out=None, offset: int = 0):
    """Round a CUDA array to ``fmt``: the signature and results of :func:`lpsim.quantize`.

    x: torch CUDA tensor, CuPy array or numba device array of float32/float64 (C-contiguous).
    out: same kind, shape and dtype (``out=x`` rounds in place); default a new array.
    The launch goes on torch's current stream for torch tensors.
    """
    fmt = parse_format(fmt)
    array, launch_stream = _as_device_array(x, "x")
    request = plan(fmt, rounding, array.dtype, seed=seed, stream=stream, sr_bits=sr_bits,
                   offset=offset)
    if out is None:
        result = x.clone() if hasattr(x, "clone") else cuda.device_array_like(array)
        target, _ = (_as_device_array(result, "out") if hasattr(result, "clone")
                     else (result, 0))
    else:
        result = out
        target, _ = _as_device_array(out, "out")
        if target.shape != array.shape or target.dtype != array.dtype:
            raise ValueError(f"out must have shape {array.shape} and dtype {array.dtype}, got "
                             f"{target.shape} {target.dtype}")
    bits = np.int32 if array.dtype.itemsize == 4 else np.int64
    xb = array.reshape(array.size).view(bits)
    outb = target.reshape(target.size).view(bits)
    counts = cuda.to_device(np.zeros(6, np.int64), stream=launch_stream)
    _, nblocks = block_range(array.size, request.offset, request.lanes)
    grid = max(1, min(MAX_BLOCKS, (nblocks + THREADS - 1) // THREADS))
    _round_kernel[grid, THREADS, launch_stream](
        xb, outb, request.mode, request.k, tuple(request.params), request.seed_lo,
        request.seed_hi, request.stream, request.offset, request.lanes, counts)
    if stats is not None:
        stats.add_pending(array.size, counts)
    return result
