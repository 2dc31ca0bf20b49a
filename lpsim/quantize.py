"""``lpsim.quantize``: round arrays and scalars to any fp(e, m, b) on the CPU (numba kernels).

CUDA arrays (torch CUDA tensors, CuPy, numba device arrays) are handed to ``lpsim_cuda``;
both paths run the same scalar decision (:func:`lpsim.rounding.round_bits`; the CPU kernel
runs its vectorised common case :func:`lpsim.rounding.round_fast` first).
"""

from __future__ import annotations

import functools
import os
import secrets
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np
from numba import get_num_threads, njit, types
from numba.extending import intrinsic, register_jitable

from .formats import Format, parse_format
from .fixed import Fixed, quantize_fixed
from .generator import resolve as resolve_generator
from .philox import LANES, WORD_BITS, split_key
from .philox import MASK32, philox4x32
from .rounding import (STOCHASTIC, STOCHASTIC_MODES, Params, kernel_params, mode_code,
                       round_bits, round_fast)
from .stats import COUNTERS, RoundingStats


class Plan(NamedTuple):
    """A validated rounding request for one container dtype: what the kernels take."""

    params: Params
    mode: int
    k: int
    seed_lo: int
    seed_hi: int
    stream: int
    offset: int
    lanes: int


def plan(fmt, rounding, dtype, *, seed=None, stream=0, sr_bits=None, offset=0) -> Plan:
    """Validate a request and turn it into kernel arguments (shared with lpsim_cuda)."""
    fmt = parse_format(fmt)
    mode = mode_code(rounding)
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise TypeError(f"cannot round an array of dtype {dtype}; accepted: float32, float64 "
                        "(cast integer or object data to a float dtype first)")
    params = kernel_params(fmt, dtype)
    width = WORD_BITS[dtype.itemsize]
    if sr_bits is None:
        k = width
    elif rounding != "stochastic":
        raise ValueError(f"sr_bits={sr_bits!r} applies to rounding='stochastic' only, not "
                         f"rounding={rounding!r}")
    elif isinstance(sr_bits, bool) or not isinstance(sr_bits, (int, np.integer)):
        raise TypeError(f"sr_bits={sr_bits!r} is not an integer; accepted: an integer "
                        f"1..{width} for a {dtype} container")
    elif not 1 <= sr_bits <= width:
        raise ValueError(f"sr_bits={sr_bits!r} is out of range; accepted: an integer 1..{width} "
                         f"for a {dtype} container")
    else:
        k = int(sr_bits)
    if mode >= STOCHASTIC and seed is None:
        seed = secrets.randbits(64)
    seed_lo, seed_hi = split_key(0 if seed is None else seed, "seed")
    stream_lo, stream_hi = split_key(stream, "stream")
    if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)) or offset < 0:
        raise ValueError(f"offset={offset!r} must be a non-negative integer")
    return Plan(params, mode, k, seed_lo, seed_hi, stream_lo | (stream_hi << 32), int(offset),
                LANES[dtype.itemsize])


#: elements per CPU work item (a multiple of every LANES value); its random words stay in L2
CHUNK = 8192
#: chunks per parallel task (they share one scratch buffer)
TASK = 4
#: elements per extra thread: below this, handing work to the thread pool costs more than it
#: saves (measured: ~80 us a call on 2 cores), so small arrays run in the calling thread
PARALLEL_GRAIN = 1 << 17
#: elements per group whose slow elements are counted together, so that the slow pass
#: looks only into groups that have some
GROUP = 64


@intrinsic
def _constant(typingctx, value):
    """The value of an integer literal as a compile-time constant, so that LLVM folds the
    branches on it (a literal argument alone is still passed at run time)."""
    if isinstance(value, types.IntegerLiteral):
        def codegen(context, builder, signature, args):
            return context.get_constant(types.int64, value.literal_value)
        return types.int64(value), codegen
    return None


#: the generator inlined into the block loops, so that they vectorise
_philox_inline = njit(inline="always")(philox4x32)


@register_jitable
def _words_w32(r, b0, nb, stream, seed_lo, seed_hi):
    s0, s1 = stream & MASK32, (stream >> 32) & MASK32
    for j in range(nb):
        b = b0 + j
        w0, w1, w2, w3 = _philox_inline(b & MASK32, (b >> 32) & MASK32, s0, s1, seed_lo,
                                        seed_hi)
        r[4 * j] = w0
        r[4 * j + 1] = w1
        r[4 * j + 2] = w2
        r[4 * j + 3] = w3


@register_jitable
def _words_w62(r, b0, nb, stream, seed_lo, seed_hi):
    s0, s1 = stream & MASK32, (stream >> 32) & MASK32
    for j in range(nb):
        b = b0 + j
        w0, w1, w2, w3 = _philox_inline(b & MASK32, (b >> 32) & MASK32, s0, s1, seed_lo,
                                        seed_hi)
        r[2 * j] = (w0 << 30) | (w1 >> 2)
        r[2 * j + 1] = (w2 << 30) | (w3 >> 2)


@register_jitable
def _fill_words(r, w, b0, nb, stream, seed_lo, seed_hi):
    """r[LANES*j + lane] = the random integer R of that lane of Philox block b0 + j, j < nb.

    The words of :func:`lpsim.philox.lane_word` for W = ``w`` random bits (32: four lanes a
    block, as float32 containers use; 62: two, as float64), in loops that vectorise.
    """
    if w == 32:
        _words_w32(r, b0, nb, stream, seed_lo, seed_hi)
    else:
        _words_w62(r, b0, nb, stream, seed_lo, seed_hi)


@register_jitable
def _fast_pass(xs, ys, rs, mode, k, p, left):
    """ys[j] = round_fast(xs[j]) for all j; returns (slow, inexact).

    slow counts the elements left to :func:`_slow_pass`, ``left[g]`` those of group g (GROUP
    elements).  ``ys`` must not overlap ``xs``: the loop is vectorised behind an overlap
    check, and a loop that stores into the array it loads becomes masked stores.
    """
    mode = _constant(mode)
    slow = 0
    inexact = 0
    for g in range((xs.size + GROUP - 1) // GROUP):
        xg = xs[g * GROUP:(g + 1) * GROUP]     # slices: indices from 0, so no wraparound
        yg = ys[g * GROUP:(g + 1) * GROUP]
        group_slow = 0
        if mode >= STOCHASTIC:
            rg = rs[g * GROUP:(g + 1) * GROUP]
            for j in range(xg.size):
                bits, ok, inx = round_fast(xg[j], mode, rg[j], k, p)
                yg[j] = bits
                group_slow += 1 - ok
                inexact += inx
        else:
            for j in range(xg.size):
                bits, ok, inx = round_fast(xg[j], mode, 0, k, p)
                yg[j] = bits
                group_slow += 1 - ok
                inexact += inx
        left[g] = group_slow
        slow += group_slow
    return slow, inexact


@register_jitable
def _slow_pass(ys, rs, mode, k, p, left, counts):
    """round_bits over the elements of ``ys`` that :func:`_fast_pass` left as they were."""
    a_lo = p.fast_lo << p.M
    a_hi = (p.fast_hi + 1) << p.M
    for g in range(0, ys.size, GROUP):
        if left[g // GROUP]:
            for j in range(g, min(g + GROUP, ys.size)):
                a = np.int64(ys[j]) & p.MAG
                if a < a_lo or a >= a_hi:
                    bits, flags = round_bits(ys[j], mode, rs[j] if mode >= STOCHASTIC else 0,
                                             k, p)
                    ys[j] = bits
                    for f in range(6):
                        counts[f] += (flags >> f) & 1


@register_jitable
def _round_task(xb, outb, t, mode, k, p, seed_lo, seed_hi, stream, offset, inplace, counts):
    """Round the chunks of task ``t``; adds its six counters to ``counts``.

    Each chunk draws its random words into a scratch buffer, runs the vectorisable
    :func:`round_fast` over all its elements, then :func:`round_bits` over the few it did
    not cover.  In place, the fast pass writes a scratch chunk that is copied back.
    """
    n = xb.size
    first = offset // CHUNK
    nchunks = (offset + n + CHUNK - 1) // CHUNK - first
    lanes = 4 if p.W == 32 else 2                       # LANES of the random words
    r = np.empty(CHUNK if mode >= STOCHASTIC else 1, np.int64)
    left = np.empty(CHUNK // GROUP, np.int64)
    scratch = np.empty(CHUNK if inplace else 1, xb.dtype)
    for c in range(t * TASK, min(t * TASK + TASK, nchunks)):
        base = (first + c) * CHUNK
        lo = max(base, offset) - offset
        hi = min(base + CHUNK, offset + n) - offset
        rs = r
        if mode >= STOCHASTIC:
            b0 = (lo + offset) // lanes
            _fill_words(r, p.W, b0, (hi + offset + lanes - 1) // lanes - b0, stream, seed_lo,
                        seed_hi)
            rs = r[lo + offset - b0 * lanes:]
        xs = xb[lo:hi]
        if inplace:
            ys = scratch[:hi - lo]
            slow, inexact = _fast_pass(xs, ys, rs, mode, k, p, left)
            xs[:] = ys
        else:
            slow, inexact = _fast_pass(xs, outb[lo:hi], rs, mode, k, p, left)
        counts[0] += inexact
        if slow:
            _slow_pass(outb[lo:hi], rs, _constant(mode), k, p, left, counts)


def _round_chunks(mode):
    """The CPU kernel of rounding mode ``mode``, a constant of its body, so that the decision
    compiles to straight-line code.

    kernel(xb, outb, k, p, seed_lo, seed_hi, stream, offset, inplace, t0, t1) rounds the
    container bits of tasks t0 .. t1-1 of ``xb`` into ``outb`` (``xb`` itself when
    ``inplace``) and returns their six counters.  It releases the GIL, so threads can run
    disjoint task ranges at once.
    """
    def kernel(xb, outb, k, p, seed_lo, seed_hi, stream, offset, inplace, t0, t1):
        counts = np.zeros(6, np.int64)
        for t in range(t0, t1):
            _round_task(xb, outb, t, mode, k, p, seed_lo, seed_hi, stream, offset, inplace,
                        counts)
        return counts

    return kernel


@functools.cache
def _compiled(mode):
    # one kernel per mode; numba's cache tells closures apart by their captured values
    return njit(nogil=True, cache=True)(_round_chunks(mode))


def _ntasks(n, offset):
    nchunks = (offset + n + CHUNK - 1) // CHUNK - offset // CHUNK
    return (nchunks + TASK - 1) // TASK


@functools.cache
def _pool(workers, pid):
    # keyed by process id too: a forked child does not inherit the parent's threads
    return ThreadPoolExecutor(workers, thread_name_prefix="lpsim")


def _round_serial(xb, outb, mode, k, p, seed_lo, seed_hi, stream, offset, inplace=False):
    """Round container bits ``xb`` into ``outb`` in the calling thread; returns the counters."""
    return _compiled(mode)(xb, outb, k, p, seed_lo, seed_hi, stream, offset, inplace, 0,
                           _ntasks(xb.size, offset))


def _round_parallel(xb, outb, mode, k, p, seed_lo, seed_hi, stream, offset, inplace=False):
    """As :func:`_round_serial`, on ``numba.get_num_threads()`` threads.

    The tasks are dealt out in a few pieces per thread, so a busy core does not hold up the
    others; the bits do not depend on the split (counter-based random words).
    """
    ntasks = _ntasks(xb.size, offset)
    workers = min(get_num_threads(), ntasks, max(1, xb.size // PARALLEL_GRAIN))
    if workers <= 1:
        return _round_serial(xb, outb, mode, k, p, seed_lo, seed_hi, stream, offset, inplace)
    kernel = _compiled(mode)
    bounds = np.linspace(0, ntasks, min(ntasks, 4 * workers) + 1).astype(np.int64)
    pool = _pool(workers, os.getpid())
    pieces = [pool.submit(kernel, xb, outb, k, p, seed_lo, seed_hi, stream, offset, inplace,
                          int(t0), int(t1))
              for t0, t1 in zip(bounds[:-1], bounds[1:]) if t1 > t0]
    return sum(piece.result() for piece in pieces)


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def quantize(x, fmt, rounding: str = "nearest", *, seed=None, stream: int = 0, sr_bits=None,
             stats: RoundingStats | None = None, out=None, offset: int = 0, generator=None):
    """Round ``x`` to the format ``fmt`` in mode ``rounding``; returns the container values.

    x: a float32/float64 numpy array (any shape), a Python int or float (rounded as float64,
    returned as float), a numpy float32/float64 scalar, or a torch tensor
    (CUDA tensors and other CUDA arrays run in lpsim_cuda).  fmt: an :class:`lpsim.Format`,
    a string ("bf16", "fp(4,3,4)", ...) or ``lpsim.fixed(wl, fl)`` (:mod:`lpsim.fixed`).
    rounding: one of ``lpsim.rounding.MODES``.
    seed, stream: key of the counter-based generator for stochastic modes (seed=None draws a
    fresh seed); element ``i`` uses counter ``offset + i`` (C order), so a slice rounded with
    its offset gets the same bits as the whole array.  A fixed integer seed replays the same
    bits on every call; in loops pass ``generator=lpsim.Generator(seed)`` instead, which
    gives each call fresh counters (:mod:`lpsim.generator`).  Torch tensors: autograd,
    in-place and dtype rules of :func:`lpsim.torch.quantize`.  sr_bits: random bits per decision
    (few-bit SR).  stats: a :class:`RoundingStats` to add this call's counters to.
    out: array to write into (may be ``x`` itself for in-place rounding).

    Semantics of every mode, overflow, NaN, inf and signed zero: :mod:`lpsim.rounding`.
    Raises ValueError/TypeError naming the bad value: unknown format or rounding, a format
    that does not fit the container, integer/object data, sr_bits out of range.
    """
    if isinstance(fmt, Fixed):
        return quantize_fixed(x, fmt, rounding, seed=seed, stream=stream, sr_bits=sr_bits,
                              stats=stats, out=out, offset=offset, generator=generator)
    fmt = parse_format(fmt)
    seed, stream, offset = resolve_generator(generator, x, rounding, seed, stream, offset)
    if _is_torch(x) or _is_torch(out):
        from .torch.tensors import quantize_tensor
        return quantize_tensor(x, fmt, rounding, seed=seed, stream=stream, sr_bits=sr_bits,
                               stats=stats, out=out, offset=offset)
    if hasattr(x, "__cuda_array_interface__") or type(x).__module__.startswith("numba.cuda"):
        import lpsim_cuda
        return lpsim_cuda.quantize(x, fmt, rounding, seed=seed, stream=stream,
                                   sr_bits=sr_bits, stats=stats, out=out, offset=offset)
    if isinstance(x, (int, float, np.floating)) and not isinstance(x, (bool, np.float16)):
        if out is not None:
            raise TypeError(f"out= applies to arrays; a {type(x).__name__} scalar is returned "
                            "rounded (pass a numpy array to round into out)")
        array = np.array(x, dtype=x.dtype if isinstance(x, np.floating) else np.float64)
        rounded = quantize(array, fmt, rounding, seed=seed, stream=stream, sr_bits=sr_bits,
                           stats=stats, offset=offset)
        return rounded[()] if isinstance(x, np.floating) else float(rounded)
    if not isinstance(x, np.ndarray):
        raise TypeError(f"cannot round a {type(x).__name__}; accepted: a float32/float64 numpy "
                        "array, a Python int or float, a numpy float32/float64, or a torch "
                        "tensor")
    request = plan(fmt, rounding, x.dtype, seed=seed, stream=stream, sr_bits=sr_bits,
                   offset=offset)
    if out is None:
        out = np.empty_like(x)
    elif not isinstance(out, np.ndarray) or out.shape != x.shape or out.dtype != x.dtype:
        raise ValueError(f"out must be a numpy array of shape {x.shape} and dtype {x.dtype}, "
                         f"got {getattr(out, 'shape', None)} {getattr(out, 'dtype', type(out))}")
    counts = round_into(np.ascontiguousarray(x).reshape(-1), out, request)
    if stats is not None:
        stats.add(x.size, counts)
    return out


def round_into(flat, out, request: Plan):
    """Round the contiguous 1-D array ``flat`` into ``out`` (same size); returns the counters."""
    bits_dtype = np.int32 if flat.dtype.itemsize == 4 else np.int64
    target = out.reshape(-1) if out.flags.c_contiguous else np.empty_like(flat)
    # in place is safe (round_fast returns the input bits where it does not apply); any
    # other overlap would read elements already written
    inplace = flat.ctypes.data == target.ctypes.data
    if not flat.flags.writeable or (not inplace and np.shares_memory(flat, target)):
        flat = flat.copy()      # the kernels take writable arrays (one signature per dtype)
    counts = _round_parallel(flat.view(bits_dtype), target.view(bits_dtype), request.mode,
                             request.k, request.params, request.seed_lo, request.seed_hi,
                             request.stream, request.offset, inplace)
    if target is not out and not np.shares_memory(target, out):
        out[...] = target.reshape(out.shape)
    return counts


__all__ = ["quantize", "plan", "Plan", "round_into", "COUNTERS", "Format"]
