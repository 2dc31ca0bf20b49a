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
from lpsim.storage import NO_PACKING, STORAGE, storage_name, storage_params

# threads per block; the simulator runs each thread as a Python thread, so it gets fewer
THREADS = 32 if config.ENABLE_CUDASIM else 128
MAX_BLOCKS = 1 << 16   # grid cap; the grid-stride loop covers the rest


@cuda.jit
def _round_kernel(xb, outb, mode, k, p, seed_lo, seed_hi, stream, offset, lanes, sp, counts):
    first, nblocks = block_range(xb.size, offset, lanes)
    c0 = c1 = c2 = c3 = c4 = c5 = 0
    j = cuda.grid(1)
    while j < nblocks:
        d0, d1, d2, d3, d4, d5 = round_block(xb, outb, first + j, offset, mode, k, p,
                                             seed_lo, seed_hi, stream, lanes, sp)
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


def _packed_view(x, name, width):
    """An integer device view of a torch bf16/fp16/fp8 tensor or an int16/int8 CUDA array."""
    if type(x).__module__.startswith("torch"):
        import torch
        x = x.view(torch.int16 if width == 16 else torch.int8)
    array, _ = _as_device_array(x, name)
    if array.dtype.itemsize * 8 != width or array.dtype.kind not in "iu":
        raise ValueError(f"{name} has dtype {array.dtype}; packed {width}-bit storage needs a "
                         f"{width}-bit tensor (torch bfloat16/float16/float8 or int{width})")
    return array


def _new_output(x, array, storage):
    """A fresh output of x's kind: x's dtype, or the packed storage dtype."""
    if type(x).__module__.startswith("torch"):
        import torch
        if storage is None:
            return torch.empty_like(x)
        return torch.empty(x.shape, dtype=getattr(torch, storage), device=x.device)
    if storage is None:
        return cuda.device_array_like(array)
    return cuda.device_array(array.shape, np.int16 if STORAGE[storage][1] == 16 else np.int8)


def quantize(x, fmt, rounding: str = "nearest", *, seed=None, stream: int = 0, sr_bits=None,
             stats: RoundingStats | None = None, out=None, offset: int = 0, storage=None):
    """Round a CUDA array to ``fmt``: the signature and results of :func:`lpsim.quantize`.

    x: torch CUDA tensor, CuPy array or numba device array of float32/float64 (C-contiguous).
    out: same kind and shape, x's dtype (``out=x`` rounds in place); default a new array.
    storage: "bfloat16", "float16", "float8_e5m2" or "float8_e4m3fn" (or the torch dtype)
    writes the rounded values packed into that native type instead (e.g. an fp32 -> bf16
    stochastic-rounding store); it must hold every value of ``fmt`` (:mod:`lpsim.storage`).
    The launch goes on torch's current stream for torch tensors.
    """
    fmt = parse_format(fmt)
    array, launch_stream = _as_device_array(x, "x")
    request = plan(fmt, rounding, array.dtype, seed=seed, stream=stream, sr_bits=sr_bits,
                   offset=offset)
    sp = NO_PACKING
    if storage is not None:
        storage = storage_name(storage)
        sp = storage_params(fmt, storage, array.dtype)
    result = _new_output(x, array, storage) if out is None else out
    if storage is None:
        target, _ = _as_device_array(result, "out")
        if target.dtype != array.dtype:
            raise ValueError(f"out has dtype {target.dtype}; it must be x's {array.dtype} "
                             "(or pass storage= to pack)")
    else:
        target = _packed_view(result, "out", sp.width)
    if target.shape != array.shape:
        raise ValueError(f"out must have shape {array.shape}, got {target.shape}")
    bits = np.int32 if array.dtype.itemsize == 4 else np.int64
    xb = array.reshape(array.size).view(bits)
    outb = target.reshape(target.size)
    if storage is None:
        outb = outb.view(bits)
    counts = cuda.to_device(np.zeros(6, np.int64), stream=launch_stream)
    _, nblocks = block_range(array.size, request.offset, request.lanes)
    grid = max(1, min(MAX_BLOCKS, (nblocks + THREADS - 1) // THREADS))
    _round_kernel[grid, THREADS, launch_stream](
        xb, outb, request.mode, request.k, tuple(request.params), request.seed_lo,
        request.seed_hi, request.stream, request.offset, request.lanes, tuple(sp), counts)
    if stats is not None:
        stats.add_pending(array.size, counts)
    return result


def warmup() -> None:
    """Compile every kernel specialisation now (float32/float64 in, plain or packed out).

    Call it before capturing a CUDA graph: capture cannot include a first-call compile.
    """
    for dtype in (np.float32, np.float64):
        x = cuda.to_device(np.zeros(4, dtype))
        quantize(x, "bf16")
        for storage in ("bfloat16", "float8_e4m3fn"):
            quantize(x, "e4m3fn", storage=storage)
