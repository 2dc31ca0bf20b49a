"""``lpsim.quantize``: round arrays and scalars to any fp(e, m, b) on the CPU (numba kernels).

CUDA arrays (torch CUDA tensors, CuPy, numba device arrays) are handed to ``lpsim_cuda``;
both paths run the same per-block decision (:func:`lpsim.rounding.round_block`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import literally, njit, prange

from .formats import Format, parse_format
from .philox import LANES, WORD_BITS, split_key
from .philox import block_words, lane_word
from .rounding import (STOCHASTIC, STOCHASTIC_MODES, Params, block_range, kernel_params,
                       mode_code, round_bits, round_fast)
from .stats import COUNTERS, RoundingStats

#: below this many elements the serial kernel runs (no thread-pool start-up)
PARALLEL_THRESHOLD = 1 << 15


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
    elif rounding not in STOCHASTIC_MODES:
        raise ValueError(f"sr_bits={sr_bits!r} applies to stochastic rounding only, not "
                         f"rounding={rounding!r}")
    elif isinstance(sr_bits, bool) or not isinstance(sr_bits, (int, np.integer)) \
            or not 1 <= sr_bits <= width:
        raise ValueError(f"sr_bits={sr_bits!r} is out of range; accepted: an integer 1..{width} "
                         f"for a {dtype} container")
    else:
        k = int(sr_bits)
    if mode >= STOCHASTIC and seed is None:
        seed = int(np.random.SeedSequence().generate_state(1, np.uint64)[0])
    seed_lo, seed_hi = split_key(0 if seed is None else seed, "seed")
    stream_lo, stream_hi = split_key(stream, "stream")
    if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)) or offset < 0:
        raise ValueError(f"offset={offset!r} must be a non-negative integer")
    return Plan(params, mode, k, seed_lo, seed_hi, stream_lo | (stream_hi << 32), int(offset),
                LANES[dtype.itemsize])


#: elements per CPU work item (a multiple of every LANES value)
CHUNK = 4096


def _round_chunks(xb, outb, mode, k, p, seed_lo, seed_hi, stream, offset, lanes):
    literally(mode)  # one compiled kernel per mode: the decision folds to straight-line code
    """CPU kernel: global elements in CHUNK-sized work items; returns the six counters.

    Each chunk draws its random words, runs the vectorisable :func:`round_fast` over all its
    elements, then :func:`round_bits` over the few it did not cover.
    """
    n = xb.size
    first = offset // CHUNK
    nchunks = (offset + n + CHUNK - 1) // CHUNK - first
    counts = np.zeros((nchunks, 6), np.int64)
    stochastic = mode >= STOCHASTIC
    for c in prange(nchunks):
        base = (first + c) * CHUNK
        lo = max(base, offset) - offset
        hi = min(base + CHUNK, offset + n) - offset
        r = np.zeros(CHUNK if stochastic else 1, np.int64)
        if stochastic:
            b0, nb = block_range(hi - lo, lo + offset, lanes)
            for b in range(b0, b0 + nb):
                words = block_words(b, stream, seed_lo, seed_hi)
                for lane in range(lanes):
                    g = b * lanes + lane
                    if g >= lo + offset and g < hi + offset:
                        r[g - base] = lane_word(words, lane, lanes)
        slow = 0
        inexact = 0
        if stochastic:
            for i in range(lo, hi):
                bits, ok, inx = round_fast(xb[i], mode, r[i + offset - base], k, p)
                outb[i] = bits
                slow += 1 - ok
                inexact += inx
        else:
            for i in range(lo, hi):
                bits, ok, inx = round_fast(xb[i], mode, 0, k, p)
                outb[i] = bits
                slow += 1 - ok
                inexact += inx
        counts[c, 0] = inexact
        if slow:
            for i in range(lo, hi):
                biased = (np.int64(outb[i]) & p.MAG) >> p.M
                if biased < p.fast_lo or biased > p.fast_hi:
                    bits, flags = round_bits(outb[i], mode, r[i + offset - base], k, p)
                    outb[i] = bits
                    for f in range(6):
                        counts[c, f] += (flags >> f) & 1
    return counts.sum(axis=0)


_round_parallel = njit(parallel=True, cache=True)(_round_chunks)
_round_serial = njit(cache=True)(_round_chunks)


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def quantize(x, fmt, rounding: str = "nearest", *, seed=None, stream: int = 0, sr_bits=None,
             stats: RoundingStats | None = None, out=None, offset: int = 0):
    """Round ``x`` to the format ``fmt`` in mode ``rounding``; returns the container values.

    x: a float32/float64 numpy array (any shape), a Python or numpy float, or a torch tensor
    (CUDA tensors and other CUDA arrays run in lpsim_cuda).  fmt: an :class:`lpsim.Format` or
    a string ("bf16", "fp(4,3,4)", ...).  rounding: one of ``lpsim.rounding.MODES``.
    seed, stream: key of the counter-based generator for stochastic modes (seed=None draws a
    fresh seed); element ``i`` uses counter ``offset + i`` (C order), so a slice rounded with
    its offset gets the same bits as the whole array.  sr_bits: random bits per decision
    (few-bit SR).  stats: a :class:`RoundingStats` to add this call's counters to.
    out: array to write into (may be ``x`` itself for in-place rounding).

    Semantics of every mode, overflow, NaN, inf and signed zero: :mod:`lpsim.rounding`.
    Raises ValueError/TypeError naming the bad value: unknown format or rounding, a format
    that does not fit the container, integer/object data, sr_bits out of range.
    """
    fmt = parse_format(fmt)
    if _is_torch(x) or hasattr(x, "__cuda_array_interface__") \
            or type(x).__module__.startswith("numba.cuda"):
        if getattr(x, "is_cuda", True):
            import lpsim_cuda
            return lpsim_cuda.quantize(x, fmt, rounding, seed=seed, stream=stream,
                                       sr_bits=sr_bits, stats=stats, out=out, offset=offset)
        import torch
        array = x.detach().numpy()
        target = None if out is None else out.detach().numpy()
        result = quantize(array, fmt, rounding, seed=seed, stream=stream, sr_bits=sr_bits,
                          stats=stats, out=target, offset=offset)
        return out if out is not None else torch.from_numpy(result)
    if isinstance(x, (float, np.floating)) and not isinstance(x, np.float16):
        array = np.array(x, dtype=np.float64 if isinstance(x, float) else x.dtype)
        rounded = quantize(array, fmt, rounding, seed=seed, stream=stream, sr_bits=sr_bits,
                           stats=stats, offset=offset)
        return float(rounded) if isinstance(x, float) else rounded[()]
    if not isinstance(x, np.ndarray):
        raise TypeError(f"cannot round a {type(x).__name__}; accepted: a float32/float64 numpy "
                        "array, a Python or numpy float, or a torch tensor")
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
    kernel = _round_parallel if flat.size >= PARALLEL_THRESHOLD else _round_serial
    # in place is safe: round_fast returns the input bits where it does not apply
    counts = kernel(flat.view(bits_dtype), target.view(bits_dtype), request.mode, request.k,
                    request.params, request.seed_lo, request.seed_hi, request.stream,
                    request.offset, request.lanes)
    if target is not out and not np.shares_memory(target, out):
        out[...] = target.reshape(out.shape)
    return counts


__all__ = ["quantize", "plan", "Plan", "round_into", "COUNTERS", "Format"]
