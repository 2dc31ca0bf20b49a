"""``lpsim_cuda.quantize``: the rounding core on CUDA arrays, bit-identical to the CPU simulator.

Each thread rounds, per pass of a grid-stride loop, one element (deterministic modes: a warp's
loads coalesce) or one Philox block (stochastic: 4 float32 or 2 float64 elements sharing its
random words) with :func:`lpsim.rounding.round_element` / :func:`~lpsim.rounding.round_block`:
the CPU kernel's decisions (round_fast, then round_bits where it declines), so the two paths
share them instead of copying them.  The decision is integer-only: no FMA
contraction, no fastmath, no flushed subnormals.  Counters are reduced per block in shared
memory and added with atomics into the stats object's device accumulator
(:mod:`lpsim_cuda.counters`); without stats a kernel compiled without counters runs.
"""

from __future__ import annotations

import sys

import numpy as np
from numba import cuda

from lpsim.blocks.formats import BlockFormat, as_block_format
from lpsim.formats import parse_format
from lpsim.generator import Generator, resolve as resolve_generator
from lpsim.request import plan
from lpsim.rounding import STOCHASTIC, block_range, round_block, round_element, tally
from lpsim.stats import RoundingStats, check_stats
from lpsim.storage import NO_PACKING, storage_name, storage_params

from . import arrays, counters, launch, specialised
from .launch import THREADS

_ELEMENTS = counters.ELEMENTS       # the accumulator slot of the element count


def _make_kernel(count: bool):
    """The rounding kernel, with the counters (count=True) or without: a constant here, so
    the uncounted kernel carries none of their registers (it runs at about twice the rate)."""

    def kernel(xb, outb, mode, k, p, seed_lo, seed_hi, stream, offset, lanes, sp, counts):
        c = (0, 0, 0, 0, 0, 0)
        j = cuda.grid(1)
        if mode < STOCHASTIC:
            # no random words: one element per thread and pass, so a warp's loads coalesce
            while j < xb.size:
                flags = round_element(xb, outb, j, 0, mode, k, p, sp)
                if count:
                    c = tally(c, flags)
                j += cuda.gridsize(1)
        else:
            first, nblocks = block_range(xb.size, offset, lanes)
            while j < nblocks:
                d = round_block(xb, outb, first + j, offset, mode, k, p, seed_lo, seed_hi,
                                stream, lanes, sp)
                if count:
                    c = (c[0] + d[0], c[1] + d[1], c[2] + d[2], c[3] + d[3], c[4] + d[4],
                         c[5] + d[5])
                j += cuda.gridsize(1)
        if count:
            partial = cuda.shared.array((6, THREADS), np.int64)
            t = cuda.threadIdx.x
            c0, c1, c2, c3, c4, c5 = c
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
            if cuda.grid(1) == 0:
                cuda.atomic.add(counts, _ELEMENTS, xb.size)

    kernel.__qualname__ = kernel.__name__ = "_round_counted" if count else "_round_plain"
    return cuda.jit(kernel)


#: count -> its kernel
KERNELS = {count: _make_kernel(count) for count in (False, True)}


def _launcher(grid: int, stream, count: bool):
    """The kernel (counting or not) configured for ``grid`` blocks on ``stream``."""
    return launch.configured(KERNELS[count], grid, stream)


def quantize(x, fmt, rounding: str = "nearest", *, seed=None, stream: int = 0, sr_bits=None,
             stats: RoundingStats | None = None, out=None, offset: int = 0, storage=None):
    """Round a CUDA array to ``fmt``: the signature and results of :func:`lpsim.quantize`.

    x: torch CUDA tensor, CuPy array or numba device array of float32/float64 (C-contiguous),
    or a torch bfloat16/float16 tensor, read as float32 (its values exactly: the result is
    float32, as lpsim.quantize gives for any half-precision input).
    out: same shape, x's dtype (float32 for bfloat16/float16; ``out=x`` rounds in place);
    default a new array of x's kind.
    storage: "bfloat16", "float16", "float8_e5m2" or "float8_e4m3fn" (or a torch/ml_dtypes
    dtype) writes the rounded values packed into that type instead (an fp32 -> bf16 SR store):
    out is then a tensor of that torch dtype, or an int16/int8 array for other kinds, and the
    storage must hold every value of ``fmt`` (:mod:`lpsim.storage`).

    The launch goes on torch's current stream for torch tensors and on the array's interface
    stream for CuPy arrays, and nothing waits for it; ``stats`` counts on the device and is
    copied back when read (:class:`lpsim.RoundingStats`).

    CUDA graphs (torch.cuda.graph): call :func:`warmup` (with ``stats=`` for each stats object
    the graph counts into) before capture, keep those stats objects for the graph's life, and
    note that a replay rounds with the seed and offset baked in at capture, so a captured
    stochastic call draws the same random bits on every replay unless you capture with
    different seeds or offsets.
    """
    if launch.is_torch(x):
        if stats is not None:
            check_stats(stats)
        done = specialised.torch_call(x, fmt, rounding, seed, stream, sr_bits, out, offset,
                                      storage, stats)
        if done is not None:
            return done
    key = fmt
    if as_block_format(fmt) is not None:
        raise ValueError(f"lpsim_cuda.quantize rounds to element formats, and {fmt!r} is a block "
                         "format; accepted there: lpsim.quantize(x, fmt) or "
                         "lpsim_cuda.blocks.quantize(x, fmt)")
    fmt = parse_format(fmt)
    check_stats(stats)
    with launch.device_of(x):
        src = arrays.source(x, halves=True)
        request = plan(fmt, rounding, src.dtype, seed=seed, stream=stream, sr_bits=sr_bits,
                       offset=offset, size=src.bits.size)
        name = None if storage is None else storage_name(storage)
        sp = NO_PACKING if name is None else storage_params(fmt, name, src.dtype)
        result = arrays.new_output(x, src, name) if out is None else out
        outb = arrays.target(result, src, name)
        if launch.overlaps_apart(launch.address(src.bits), src.bits.dtype.itemsize,
                                 launch.address(outb), outb.dtype.itemsize, src.bits.size):
            # out shares x's memory without being x (a shifted view, codes packed into x's
            # own bytes): threads would overwrite values others have not read, so the
            # kernel reads a copy, as the CPU rounds "as if x were copied first"
            src = src._replace(bits=arrays.copy_of(src.bits, src.stream))
        n = src.bits.size
        if n == 0:
            return result
        buffer, count = counters.launch_counts(stats, src.device, src.stream,
                                               lambda: launch.capturing(x))
        if (src.dtype == np.float32 and outb.dtype in specialised.OUT_BITS
                and specialised.specialised(fmt, rounding)):
            x_ptr, out_ptr = launch.address(src.bits), launch.address(outb)
            if specialised.eligible(n, x_ptr, out_ptr, request.mode, request.offset,
                                    outb.dtype.itemsize, src.bits.dtype.itemsize):
                keys = (request.seed_lo, request.seed_hi, request.stream, request.offset // 4)
                kernel = specialised.kernel(fmt, rounding, request.k, sp, count, src.half)
                specialised.launch_arrays(kernel, specialised.grid(n, src.device), src.stream,
                                          src.bits, outb, n, *keys, buffer if count else None)
                if launch.is_torch(x):
                    specialised.remember(key, rounding, sr_bits, storage, src, outb, kernel,
                                         keys, buffer if count else None)
                return result
        if src.half:        # the general kernel reads float32: the codes widened (exact)
            src = arrays.source(arrays.widened(x))
        _, nblocks = block_range(n, request.offset, request.lanes)
        _launcher(launch.grid_size(nblocks, src.device), src.stream, count)(
            src.bits, outb, request.mode, request.k, request.params, request.seed_lo,
            request.seed_hi, request.stream, request.offset, request.lanes, tuple(sp), buffer)
    return result


#: format strings -> the formats they name: the general path makes routes under parsed ones
_PARSED: dict = {}


def _parsed(spec: str):
    """The element or block format a string names (cached), or None for a bad name (the
    general path names it)."""
    found = _PARSED.get(spec)
    if found is None:
        try:
            found = as_block_format(spec) or parse_format(spec)
        except (TypeError, ValueError):
            return None
        if len(_PARSED) < 256:
            _PARSED[spec] = found
    return found


def torch_front(x, fmt, rounding, seed, stream, sr_bits, out, offset, generator, axis,
                stats=None):
    """:func:`lpsim.quantize` of a torch CUDA tensor through its request's cached route (an
    element format's, :mod:`lpsim_cuda.specialised`; a block format's,
    :mod:`lpsim_cuda.block_groups`; a counted call's with ``stats``) and none of the general
    front: no parsing, no torch backend checks, no plan.  The result, or None where the
    general path must take the call, which then checks it and names what is wrong: no route
    yet, a tensor autograd follows (straight-through rules), a negated view, a call inside
    another generator call, stats that are not an lpsim.RoundingStats, or anything the route
    itself does not cover.  A route exists only for a format, rounding and sr_bits that a
    call has taken; the seed, stream and offset are checked as the general path checks
    them.  A generator's counters are taken as the general path takes them and given back
    where the route declines.  ``out`` written: its version is bumped, as torch's in-place
    operations do."""
    import torch
    if type(fmt) is str and (fmt := _parsed(fmt)) is None:
        return None
    if (x.is_neg() or (out is not None and (type(out) is not torch.Tensor or out.is_neg()))
            or (torch.is_grad_enabled()
                and (x.requires_grad or (out is not None and out.requires_grad)))
            or (stats is not None and not isinstance(stats, RoundingStats))):
        return None
    counted = stats is not None
    block = type(fmt) is BlockFormat        # (an element format's routes never hold one)
    if not block and (route := specialised.route_of(x, fmt, rounding, sr_bits, None,
                                                    counted)) is not None:
        def call(seed, stream, offset):
            return specialised.torch_call(x, fmt, rounding, seed, stream, sr_bits, out,
                                          offset, None, stats, route)
    elif (block and type(axis) is int and x.ndim and axis in (-1, x.ndim - 1)
          and (block_groups := sys.modules.get("lpsim_cuda.block_groups")) is not None
          and (route := block_groups.route_of(x, fmt, rounding, sr_bits, counted)) is not None):
        # (no block route exists before lpsim_cuda.block_groups is loaded: not loaded here)
        def call(seed, stream, offset):
            return block_groups.torch_call(x, fmt, rounding, axis, seed, stream, sr_bits,
                                           out, offset, stats, route)
    else:
        return None
    if generator is None:
        done = call(seed, stream, offset)
    elif type(generator) is Generator and seed is None and generator.begin():
        failed = True
        try:
            done = call(*resolve_generator(generator, x, rounding, None, stream, offset))
            failed = done is None                   # declined: its counters given back
        finally:
            generator.end(failed)
    else:               # not a Generator (named there), or inside another call of it
        return None
    if done is not None and out is not None:
        torch.autograd.graph.increment_version(out)
    return done


def warmup(stats: RoundingStats | None = None) -> None:
    """Compile every kernel specialisation now and allocate the buffers a launch needs.

    float32/float64 in, plain or packed out, counting or not, on the current device.  Call it
    before capturing a CUDA graph, which cannot compile or allocate; pass ``stats`` (one
    object or a list) to allocate the device counters of each stats object the graph will
    count into.
    """
    scratch = RoundingStats()                 # compiles the counting kernels
    for dtype in (np.float32, np.float64):
        x = cuda.to_device(np.zeros(4, dtype))
        for counted in (None, scratch):
            quantize(x, "bf16", stats=counted)
            for storage in ("bfloat16", "float8_e4m3fn"):
                quantize(x, "e4m3fn", storage=storage, stats=counted)
    for each in stats if isinstance(stats, (list, tuple)) else [stats]:
        counters.prepare(each, launch.current_device())
