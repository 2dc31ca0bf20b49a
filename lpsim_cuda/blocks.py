"""``lpsim_cuda.blocks``: block-scaled fake-quantization on CUDA arrays, bit-identical to the CPU.

One thread per element (per few elements for blocks longer than 32): a group of P lanes (a
power of two, at most a warp) holds one block; the group reduces its largest magnitude and
its NaN/inf counts in shared memory, every lane takes the scale from the CPU kernel's own
:func:`lpsim.blocks.decisions.block_scale` and rounds its elements with
:func:`lpsim.blocks.decisions.element_fast` (else :func:`lpsim.blocks.decisions.element_exact`),
then the group sums its counters the same way.  So the two paths share their decisions and
random bits instead of copying them.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import cuda

from lpsim.blocks.amax import checked_tensor_scale, refuse_tensor_scale, tensor_scale_from
from lpsim.blocks.counters import BLOCK_COUNTERS, STATS_ACCEPTED, add_counts
from lpsim.blocks.decisions import (_element_params, block_params, block_recip, block_scale,
                                    element_exact, element_fast, element_word)
from lpsim.blocks.fake_quantize import Blocked, blocked_shape, check_axis
from lpsim.blocks.formats import parse_block_format
from lpsim.philox import LANES
from lpsim.request import plan
from lpsim.rounding import kernel_params
from lpsim.stats import check_stats

from . import arrays, block_groups, launch
from .tensor_amax import tensor_amax
from .launch import THREADS


#: counters each lane contributes to its group's sums: the six flags, then nonzero elements
_SUMS = 7


@cuda.jit
def _blocks_kernel(x, out, qout, sout, counts, mode, k, p, sp, bp, seed_lo, seed_hi, stream,
                   offset, lanes, want_q, want_counts):
    length = x.shape[1]
    nblk = sout.shape[1]
    groups = x.shape[0] * nblk
    size = bp.block
    span = 1                                  # lanes per block: a power of two <= 32
    while span < size and span < 32:
        span *= 2
    per = (size + span - 1) // span           # elements per lane
    t = cuda.threadIdx.x
    lane = t % span
    head = t - lane                           # the group's first thread in this CUDA block
    amax_sh = cuda.shared.array(THREADS, numba.float64)
    sums_sh = cuda.shared.array((THREADS, _SUMS), numba.int64)
    step = cuda.gridDim.x * (THREADS // span)
    base = 0
    while base < groups:                      # the same trip count on every thread
        g = base + (cuda.blockIdx.x * THREADS + t) // span
        row = g // nblk
        lo = (g % nblk) * size
        hi = min(lo + size, length) if g < groups else 0
        amax = 0.0
        nan = inf = np.int64(0)
        for e in range(per):
            i = lo + lane + e * span
            if i < hi:
                v = abs(np.float64(x[row, i]))
                nan += np.int64(v != v)
                inf += np.int64(v == np.inf)
                if v != np.inf and v > amax:
                    amax = v
        amax_sh[t] = amax
        sums_sh[t, 0] = nan
        sums_sh[t, 1] = inf
        _group_reduce(amax_sh, sums_sh, t, lane, span, 2)
        amax = amax_sh[head]
        nan = sums_sh[head, 0]
        inf = sums_sh[head, 1]
        cuda.syncthreads()                    # all read before the next reduction writes
        for f in range(_SUMS):
            sums_sh[t, f] = 0
        bad = (bp.nonfinite_nan != 0) and (nan + inf > 0)
        s, clipped = block_scale(amax, bp, sp)
        recip = block_recip(s, bp)
        for e in range(per):
            i = lo + lane + e * span
            if i < hi:
                if bad:
                    out[row, i] = np.nan
                    if want_q:
                        qout[row, i] = np.nan
                else:
                    r = element_word(mode, np.int64(row) * length + i + offset, lanes, stream,
                                      seed_lo, seed_hi)
                    q, v, ok, flags = element_fast(x[row, i], recip, s, mode, r, k, p, bp)
                    if not ok:
                        q, v, flags = element_exact(x[row, i], recip, s, mode, r, k, p, bp)
                    out[row, i] = v
                    if want_q:
                        qout[row, i] = q
                    if want_counts:
                        for f in range(6):
                            sums_sh[t, f] += (flags >> f) & 1
                        sums_sh[t, 6] += np.int64(q != 0)
        _group_reduce(amax_sh, sums_sh, t, lane, span, _SUMS if want_counts else 0)
        if lane == 0 and g < groups:
            sout[row, g % nblk] = np.nan if bad else s
            if want_counts:
                c = counts[row, g % nblk]
                if bad:
                    c[4] = nan
                    c[5] = inf
                    c[8] = 1
                else:
                    for f in range(6):
                        c[f] = sums_sh[t, f]
                    c[6] = clipped
                    c[7] = np.int64(amax != 0 and sums_sh[t, 6] == 0)
        cuda.syncthreads()
        base += step


@cuda.jit(device=True)
def _group_reduce(amax_sh, sums_sh, t, lane, span, nsums):
    """Tree reduction over each group of ``span`` threads: max of amax_sh, sums of the first
    ``nsums`` columns of sums_sh, left in the group's first thread (all threads call it)."""
    cuda.syncthreads()
    half = span // 2
    while half > 0:
        if lane < half:
            amax_sh[t] = max(amax_sh[t], amax_sh[t + half])
            for f in range(nsums):
                sums_sh[t, f] += sums_sh[t + half, f]
        cuda.syncthreads()
        half //= 2


def _rows(x, axis):
    """(2-D device array with the block axis last, moved shape, what keeps it alive) for x.

    Not torch: x is checked as lpsim_cuda.quantize checks it (named errors, not numba's).
    """
    if hasattr(x, "ndim"):
        axis = check_axis(axis, x.ndim)                 # the CPU's errors
    if launch.is_torch(x):
        moved = x.movedim(axis, -1).contiguous()
        shape = tuple(moved.shape)
        return cuda.as_cuda_array(moved.reshape(blocked_shape(shape))), shape, moved
    x, _ = arrays.floats(x, "x", sync=True)         # the kernels run on the default stream
    if x.ndim and axis not in (-1, x.ndim - 1):
        raise ValueError(f"axis={axis}: numba/CuPy arrays are blocked along their last axis; "
                         "pass a torch tensor or a transposed contiguous copy")
    shape = tuple(x.shape)
    return x.reshape(blocked_shape(shape)), shape, None


def quantize_blocks(x, bfmt, rounding: str = "nearest", *, axis: int = -1, seed=None,
                    stream: int = 0, sr_bits=None, offset: int = 0, tensor_scale=None,
                    want_elements: bool = True, want_counts: bool = True) -> Blocked:
    """:func:`lpsim.blocks.fake_quantize.quantize_blocks` on a CUDA array; fields are device arrays
    (values in the blocked layout, counts copied to the host).  want_counts=False skips the
    per-block counters (counts is then None): nine int64 per block, allocated, zeroed and
    copied back, cost more host time than the kernel when nothing reads them."""
    bfmt = parse_block_format(bfmt)
    with launch.device_of(x):
        x2, moved_shape, _keep = _rows(x, axis)
        if x2.dtype not in (np.float32, np.float64):
            raise TypeError(f"x has dtype {x2.dtype}; accepted: float32, float64")
        request = plan(bfmt.saturating_element, rounding, x2.dtype, seed=seed, stream=stream,
                       sr_bits=sr_bits, offset=offset, size=x2.size)
        pts = 1.0
        if bfmt.tensor_scale:
            pts = tensor_scale_from(tensor_amax(x2), bfmt) if tensor_scale is None \
                else checked_tensor_scale(tensor_scale, bfmt)
        bp = block_params(bfmt, pts)
        p = _element_params(bfmt.saturating_element, request.params.W)
        sp = kernel_params(bfmt.scale, np.float64)
        rows, length = x2.shape
        nblk = -(-length // bfmt.block) if length else 0
        out2 = cuda.device_array(x2.shape, x2.dtype)
        q2 = cuda.device_array(x2.shape if want_elements else (1, 1), np.float64)
        s2 = cuda.device_array((rows, nblk), np.float64)
        counts = cuda.to_device(np.zeros((rows, nblk, len(BLOCK_COUNTERS)), np.int64)) \
            if want_counts else launch.placeholder((1, 1, len(BLOCK_COUNTERS)), np.int64)
        span = 1                                            # lanes per block, as the kernel
        while span < min(bfmt.block, 32):
            span *= 2
        work = rows * nblk * span
        if work:
            grid = launch.grid_size(work, launch.current_device())
            _blocks_kernel[grid, THREADS](x2, out2, q2, s2, counts, request.mode, request.k, p,
                                          sp, bp, request.seed_lo, request.seed_hi,
                                          request.stream, request.offset,
                                          LANES[x2.dtype.itemsize], want_elements,
                                          want_counts)
        return Blocked(out2, q2 if want_elements else None, s2, pts,
                       counts.copy_to_host() if want_counts else None), moved_shape


def quantize(x, bfmt, rounding: str = "nearest", *, axis: int = -1, seed=None, stream: int = 0,
             sr_bits=None, stats=None, out=None, offset: int = 0, tensor_scale=None):
    """Fake-quantize a CUDA array to a block format: the results of
    :func:`lpsim.blocks.fake_quantize.quantize`.  A torch bfloat16 or float16 tensor is
    rounded as float32 (a float32 result), its codes read directly where the kernels of
    :mod:`lpsim_cuda.block_groups` take the call."""
    if hasattr(x, "ndim"):
        axis = check_axis(axis, x.ndim)                 # the CPU's errors, before any kernel
    arrays.refuse_negated(x, "x")
    arrays.refuse_negated(out, "out")
    if stats is not None:
        check_stats(stats, STATS_ACCEPTED)
    if tensor_scale is not None:
        refuse_tensor_scale(tensor_scale, parse_block_format(bfmt))
    if launch.is_torch(x):
        done = block_groups.torch_call(x, bfmt, rounding, axis, seed, stream, sr_bits, out,
                                       offset, stats, None, tensor_scale)   # seen before
        if done is not None:
            return done
    # float32 (or 16-bit codes) along a contiguous last axis, counted or not
    done = block_groups.quantize(x, bfmt, rounding, axis, seed, stream, sr_bits, out, offset,
                                 tensor_scale, stats)
    if done is not None:
        return done
    if (out is None and launch.is_torch(x) and x.ndim > 1 and x.is_cuda
            and axis not in (-1, x.ndim - 1)):
        # blocked along another axis: the same kernels on a copy with that axis last (the
        # CPU's blocks and random counters follow that layout's C order), moved back as a
        # view, as the general kernel's result is
        moved = x.movedim(axis, -1).contiguous()
        done = block_groups.quantize(moved, bfmt, rounding, -1, seed, stream, sr_bits, None,
                                     offset, tensor_scale, stats)
        if done is not None:
            return done.movedim(-1, axis)
    if launch.is_torch(x) and arrays.half_kind(x.dtype):
        x = arrays.widened(x)                # the general kernel reads float32 (exact)
    outb = None
    if out is not None:
        # x's and out's kind, dtype and shape, named as lpsim_cuda.quantize names them, before
        # anything is rounded, counted or written
        if launch.is_torch(x) and not launch.is_torch(out):
            raise TypeError(f"out is a {type(out).__name__}; the result of a torch tensor is "
                            "written into a torch CUDA tensor")
        outb = arrays.target(out, arrays.source(x), None, packs=False)
    result, moved_shape = quantize_blocks(x, bfmt, rounding, axis=axis, seed=seed,
                                          stream=stream, sr_bits=sr_bits, offset=offset,
                                          tensor_scale=tensor_scale, want_elements=False,
                                          want_counts=stats is not None)
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
    if outb is not None:                     # out's bits: any kind arrays.target takes
        if outb.size:                        # (the simulator's copy refuses empty strides)
            outb.copy_to_device(result.values.reshape(outb.size).view(outb.dtype))
        return out
    return result.values.reshape(moved_shape)


__all__ = ["quantize", "quantize_blocks"]
