"""``lpsim_cuda.blocks``: block-scaled fake-quantization on CUDA arrays, bit-identical to the CPU.

Each thread quantizes whole blocks in a grid-stride loop by calling the CPU kernel's own
:func:`lpsim.blocks.quantize_one_block` (scale decision :func:`lpsim.blocks.block_scale`,
element step :func:`lpsim.rounding.round_fast_sub` / :func:`lpsim.rounding.round_bits`), so
the two paths share their decisions and random bits instead of copying them.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from lpsim.blocks import (BLOCK_COUNTERS, Blocked, _element_params, add_counts, block_params,
                          parse_block_format, quantize_one_block, tensor_scale_of)
from lpsim.philox import LANES
from lpsim.quantize import plan
from lpsim.rounding import kernel_params

from . import launch
from .launch import THREADS


@cuda.jit
def _blocks_kernel(x, out, qout, sout, counts, mode, k, p, sp, bp, seed_lo, seed_hi, stream,
                   offset, lanes, want_q):
    length = x.shape[1]
    nblk = sout.shape[1]
    t = cuda.grid(1)
    while t < x.shape[0] * nblk:
        quantize_one_block(x, out, qout, sout, counts, t // nblk, t % nblk, length, mode, k,
                           p, sp, bp, seed_lo, seed_hi, stream, offset, lanes, want_q)
        t += cuda.gridsize(1)


def _rows(x, axis):
    """(2-D device array with the block axis last, moved shape, restore) for x."""
    if launch.is_torch(x):
        moved = x.movedim(axis, -1).contiguous()
        flat = cuda.as_cuda_array(moved.reshape(-1, moved.shape[-1] if moved.dim() else 1))
        return flat, tuple(moved.shape), moved
    if not cuda.devicearray.is_cuda_ndarray(x):
        x = cuda.as_cuda_array(x)
    if axis not in (-1, x.ndim - 1):
        raise ValueError(f"axis={axis}: numba/CuPy arrays are blocked along their last axis; "
                         "pass a torch tensor or a transposed contiguous copy")
    return x.reshape(x.size // x.shape[x.ndim - 1], x.shape[x.ndim - 1]), tuple(x.shape), None


def quantize_blocks(x, bfmt, rounding: str = "nearest", *, axis: int = -1, seed=None,
                    stream: int = 0, sr_bits=None, offset: int = 0, tensor_scale=None,
                    want_elements: bool = True) -> Blocked:
    """:func:`lpsim.blocks.quantize_blocks` on a CUDA array; fields are device arrays
    (values in the blocked layout, counts copied to the host)."""
    bfmt = parse_block_format(bfmt)
    with launch.device_of(x):
        x2, moved_shape, _keep = _rows(x, axis)
        if x2.dtype not in (np.float32, np.float64):
            raise TypeError(f"x has dtype {x2.dtype}; accepted: float32, float64")
        request = plan(bfmt.saturating_element, rounding, x2.dtype, seed=seed, stream=stream,
                       sr_bits=sr_bits, offset=offset)
        pts = 1.0
        if bfmt.tensor_scale:
            pts = tensor_scale_of(x2.copy_to_host(), bfmt) if tensor_scale is None \
                else float(tensor_scale)
        bp = block_params(bfmt, pts)
        p = _element_params(bfmt.saturating_element, request.params.W)
        sp = kernel_params(bfmt.scale, np.float64)
        rows, length = x2.shape
        nblk = -(-length // bfmt.block) if length else 0
        out2 = cuda.device_array(x2.shape, x2.dtype)
        q2 = cuda.device_array(x2.shape if want_elements else (1, 1), np.float64)
        s2 = cuda.device_array((rows, nblk), np.float64)
        counts = cuda.to_device(np.zeros((rows, nblk, len(BLOCK_COUNTERS)), np.int64))
        work = rows * nblk
        if work:
            grid = max(1, min(-(-work // THREADS), launch.grid_size(work, launch.current_device())))
            _blocks_kernel[grid, THREADS](x2, out2, q2, s2, counts, request.mode, request.k, p,
                                          sp, bp, request.seed_lo, request.seed_hi,
                                          request.stream, request.offset,
                                          LANES[x2.dtype.itemsize], want_elements)
        return Blocked(out2, q2 if want_elements else None, s2, pts, counts.copy_to_host()), \
            moved_shape


def quantize(x, bfmt, rounding: str = "nearest", *, axis: int = -1, seed=None, stream: int = 0,
             sr_bits=None, stats=None, out=None, offset: int = 0, tensor_scale=None):
    """Fake-quantize a CUDA array to a block format: :func:`lpsim.blocks.quantize`'s results."""
    result, moved_shape = quantize_blocks(x, bfmt, rounding, axis=axis, seed=seed,
                                          stream=stream, sr_bits=sr_bits, offset=offset,
                                          tensor_scale=tensor_scale, want_elements=False)
    size = int(np.prod(moved_shape))
    add_counts(stats, result.counts, size)
    if launch.is_torch(x):
        import torch
        values = torch.as_tensor(result.values, device=x.device).reshape(moved_shape)
        values = values.movedim(-1, axis)
        if out is not None:
            out.copy_(values)
            return out
        return values
    values = result.values.reshape(moved_shape)
    if out is not None:
        out.copy_to_device(values)
        return out
    return values


__all__ = ["quantize", "quantize_blocks"]
