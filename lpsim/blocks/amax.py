"""Largest magnitudes, and NVFP4's per-tensor scale made from them.

Per block, :func:`_finite_amax` and :func:`_block_amax32`, which the kernels inline.  Per
tensor, :func:`tensor_amax` (an integer max over the container bits, vectorised, split over
lpsim's threads) and :func:`tensor_amaxes`, the same pass keeping each block's largest
magnitude bits for the word kernel (which then reads one word per block, not its elements).
:func:`tensor_scale_from` turns a tensor's largest magnitude into the FP32 per-tensor scale,
at least :func:`min_tensor_scale`; :func:`checked_tensor_scale` takes a given one.
"""

from __future__ import annotations

import contextlib
import functools
import math

import numpy as np
from numba import njit
from numba.extending import register_jitable

from ..cpu import as_bits, entry_point
from ..pool import deal, pieces, threads
from ..word32 import as_int64, word
from .decisions import _reciprocal_finite, bits_value
from .formats import BlockFormat, parse_block_format


@register_jitable
def _finite_amax(xs):
    """The largest finite magnitude of a block's elements (0.0 if none), as a float64: the
    scale of a block holding a NaN or inf under ``nonfinite="finite"``."""
    amax = 0.0
    for i in range(xs.size):
        v = abs(np.float64(xs[i]))
        if v != np.inf and v > amax:
            amax = v
    return amax


@register_jitable(forceinline=True)
def _block_amax32(xb, lo, size):
    """The largest magnitude bits of the ``size`` float32 words from ``lo``."""
    am = word(np.int32(0))
    for i in range(size):
        am = max(am, word(xb[lo + np.uint64(i)]) & 0x7FFFFFFF)
    return am


@register_jitable
def finite_bits(a, cmag, cinf):
    """The magnitude bits of container bits ``a`` if finite (below inf's bits ``cinf``), else
    0: what the per-tensor largest magnitude takes of each element, on the CPU and in
    lpsim_cuda."""
    a = a & cmag
    return a if a < cinf else a & 0


def container_bits(dtype) -> tuple:
    """(magnitude mask, inf's bits, M, EB) of a float32 or float64 container."""
    if np.dtype(dtype).itemsize == 8:
        return (1 << 63) - 1, 2047 << 52, 52, 1023
    return (1 << 31) - 1, 255 << 23, 23, 127


@njit(cache=True, nogil=True)
def finite_amax(x):
    """The largest finite magnitude of a flat float32/float64 array (0.0 if none): an integer
    max over the container bits below inf's, 32-bit words for float32 (one vectorised pass)."""
    xb = as_bits(x)
    wide = xb.itemsize == 8
    cmag = ~(np.int64(1) << 63) if wide else (np.int64(1) << 31) - 1
    cinf = (np.int64(2047) << 52) if wide else np.int64(255) << 23
    am = np.int64(0)
    for i in range(xb.size):            # a plain max first: one vector op per element
        am = max(am, word(xb[i]) & cmag)
    if am >= cinf:                      # an inf or NaN: the max below inf's bits
        am = am & 0
        for i in range(xb.size):
            am = max(am, finite_bits(word(xb[i]), cmag, cinf))
    return bits_value(as_int64(am), 52 if wide else 23, 1023 if wide else 127)


#: elements per thread of :func:`tensor_amax`'s pass: one integer max per element, about a
#: copy's cost, so a thread pays only on a range many times its start-up
AMAX_GRAIN = 1 << 20


@functools.cache
def _amax_entry(dtype: np.dtype):
    """:func:`finite_amax`'s compiled entry point for flat C-contiguous ``dtype`` arrays
    (numba's dispatch types the argument on every call: microseconds a small call)."""
    return entry_point(finite_amax, (np.zeros(1, dtype),), "lpsim.blocks' per-tensor amax")


def tensor_amax(flat: np.ndarray) -> float:
    """:func:`finite_amax` of a flat array, over lpsim's threads from 2 * AMAX_GRAIN elements
    (contiguous ranges the threads pull, :func:`lpsim.pool.deal`): NVFP4's per-tensor
    pass reads the whole tensor once more before the blocks are rounded."""
    if not isinstance(flat, np.ndarray) or flat.dtype not in (np.float32, np.float64) \
            or flat.ndim != 1:
        raise TypeError(f"tensor_amax takes a flat float32/float64 numpy array, not "
                        f"{getattr(flat, 'dtype', type(flat).__name__)} of shape "
                        f"{getattr(flat, 'shape', None)}")
    amax = _amax_entry(flat.dtype) if flat.flags.c_contiguous else finite_amax
    return _threaded_max(flat.size, flat.size, lambda lo, hi: amax(flat[lo:hi]))


def _threaded_max(units: int, elements: int, run) -> float:
    """The largest float(run(lo, hi)) over contiguous ranges of ``units`` (blocks or
    elements; ``elements`` in all): ranges dealt out to lpsim's pool (:func:`lpsim.pool.deal`)
    from 2 * AMAX_GRAIN elements, else one call in the calling thread."""
    workers = max(1, min(threads(), elements // AMAX_GRAIN))
    return max(float(m) for m in deal(run, pieces(units, workers), workers))


@register_jitable(forceinline=True)
def _amaxes_of(xb, bam, b0, b1, size, cinf):
    """:func:`block_amaxes` for blocks of ``size`` elements (a literal 16 or 32: loops LLVM
    unrolls into vector steps)."""
    top = word(np.int32(0))
    for b in range(b0, b1):
        lo = np.uint64(b * size)
        am = _block_amax32(xb, lo, size)
        bam[b] = as_int64(am)
        if am >= cinf:                          # a NaN or inf: the block's finite largest
            am = am & 0
            for i in range(size):
                am = max(am, finite_bits(word(xb[lo + np.uint64(i)]), 0x7FFFFFFF, cinf))
        top = max(top, am)
    return top


@njit(cache=True, nogil=True)
def block_amaxes(x, size, bam, b0, b1):
    """Blocks b0 .. b1-1 of the flat float32 ``x``, ``size`` elements each end to end: each
    block's largest magnitude bits into ``bam`` (int32; NaN's or inf's where the block holds
    one), and the largest finite magnitude of their elements returned (0.0 if none).  NVFP4's
    per-tensor pass, which reads every element anyway, finds the blocks' largest magnitudes
    at about the same cost, and the word kernel then reads one word per block instead."""
    xb = as_bits(x)
    cinf = word(np.int32(255 << 23))
    if size == 16:
        top = _amaxes_of(xb, bam, b0, b1, 16, cinf)
    elif size == 32:
        top = _amaxes_of(xb, bam, b0, b1, 32, cinf)
    else:
        top = _amaxes_of(xb, bam, b0, b1, size, cinf)
    return bits_value(as_int64(top), 23, 127)


@functools.cache
def _amaxes_entry():
    x, bam = np.zeros(1, np.float32), np.zeros(1, np.int32)
    return entry_point(block_amaxes, (x, 1, bam, 0, 1), "lpsim.blocks' per-block amax")


def tensor_amaxes(x2: np.ndarray, size: int) -> tuple:
    """(largest finite magnitude, int32 largest magnitude bits of each block) of the 2-D
    C-contiguous float32 ``x2`` whose rows are whole blocks of ``size`` elements: one pass,
    over lpsim's threads from 2 * AMAX_GRAIN elements (as :func:`tensor_amax`)."""
    if not isinstance(x2, np.ndarray) or x2.dtype != np.float32 or x2.ndim != 2 \
            or not x2.flags.c_contiguous:
        raise TypeError(f"tensor_amaxes takes a 2-D C-contiguous float32 numpy array, not "
                        f"{getattr(x2, 'dtype', type(x2).__name__)} of shape "
                        f"{getattr(x2, 'shape', None)}")
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1 \
            or x2.shape[1] % size:
        raise ValueError(f"size={size!r}: tensor_amaxes needs a positive integer that divides "
                         f"the row length {x2.shape[1]} (rows of whole blocks)")
    flat = x2.reshape(-1)
    size = int(size)
    nb = flat.size // size
    bam = np.empty(nb, np.int32)
    amaxes = _amaxes_entry()
    return _threaded_max(nb, flat.size, lambda lo, hi: amaxes(flat, size, bam, lo, hi)), bam


#: the word kernel's ``bam`` when no pass found the blocks' largest magnitudes
NO_AMAXES = np.empty(0, np.int32)


# --- NVFP4's per-tensor scale -------------------------------------------------------------


def word_tensor_scale(x2: np.ndarray, bfmt: BlockFormat) -> tuple:
    """(per-tensor scale, ``bam``) for the word kernel of the blocked 2-D float32 ``x2``:
    with rows of whole blocks, the blocks' largest magnitudes from the same pass
    (:func:`tensor_amaxes`); else :func:`tensor_scale_of` and NO_AMAXES."""
    if x2.size and x2.shape[1] % bfmt.block == 0:
        amax, bam = tensor_amaxes(x2, bfmt.block)
        return tensor_scale_from(amax, bfmt), bam
    return tensor_scale_of(x2, bfmt), NO_AMAXES


def tensor_scale_of(x, bfmt: BlockFormat) -> float:
    """NVFP4's per-tensor FP32 scale of the array x (:func:`tensor_scale_from`)."""
    return tensor_scale_from(tensor_amax(np.ascontiguousarray(x).reshape(-1)) if x.size
                             else 0.0, bfmt)


def min_tensor_scale(bfmt) -> float:
    """The least per-tensor scale of the block format ``bfmt`` (a float32): the least with
    :func:`_reciprocal_finite`, about 2**-119 for an E4M3 scale (smallest 2**-9)."""
    return _min_tensor_scale(parse_block_format(bfmt))


@functools.lru_cache(maxsize=256)
def _min_tensor_scale(bfmt: BlockFormat) -> float:
    smin = np.float32(bfmt.scale.min_subnormal)
    # the least positive float32 pts whose reciprocal chain is finite: the test is monotone
    # in pts (each rounding is), and positive float32s order as their bits, so bisect the
    # bits (about 31 tests, where stepping one float32 at a time took millions)
    lo, hi = 0, int(np.float32(np.finfo(np.float32).max).view(np.int32))   # fails, holds
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _reciprocal_finite(np.int32(mid).view(np.float32), smin):
            hi = mid
        else:
            lo = mid
    return float(np.int32(hi).view(np.float32))


#: float32's largest value: the per-tensor amax saturates there (:func:`tensor_scale_from`)
FLOAT32_MAX = np.float32(np.finfo(np.float32).max)
_FLOAT32_MAX_PY = float(FLOAT32_MAX)    # compared as float64 (a Python float against a
#                                         float32 scalar would be cast to float32 first)


def tensor_scale_from(amax: float, bfmt: BlockFormat) -> float:
    """NVFP4's per-tensor FP32 scale of a tensor whose largest finite magnitude is ``amax``:
    fp32(amax32 / (scale max * element max)) with amax32 = fp32(amax) saturated at float32's
    largest value, the quotient saturated there too, at least :func:`min_tensor_scale`
    (NVFP4 scales a tensor below about 4e-33 as if it reached that, rather than make its
    zeros NaN); 1 if amax is 0.

    float64 data beyond float32's range saturates as the elements do: the scale is that of
    a tensor reaching float32's largest value (an infinite scale would make every value NaN),
    so the blocks reaching further take the largest block scale and their largest elements
    the element format's largest value."""
    if amax > _FLOAT32_MAX_PY:          # np.float32 would overflow to inf (and warn)
        amax32 = FLOAT32_MAX
    else:
        amax32 = min(np.float32(amax), FLOAT32_MAX)
    divisor = bfmt.tensor_scale_divisor
    # below 1 the quotient may pass float32's range, where scale_of_amax32 saturates it
    with np.errstate(over="ignore") if divisor < 1 else contextlib.nullcontext():
        return float(scale_of_amax32(amax32, divisor, _min_tensor_scale(bfmt)))


@register_jitable
def scale_of_amax32(amax32, divisor, least):
    """:func:`tensor_scale_from` of a finite float32 amax: 1 if it is 0, else
    fp32(amax32 / divisor) (divisor a float32) saturated at float32's largest value and at
    least ``least``; the host's decision and lpsim_cuda's device-side one.  (The quotient
    passes float32's range where scale max * element max < 1: an infinite scale would make
    every value NaN; saturated, the tensor's largest values clip, and are counted so.)"""
    if amax32 == 0:
        return np.float64(1.0)
    return max(min(np.float64(amax32 / divisor), _FLOAT32_MAX_PY), least)


def refuse_tensor_scale(value, bfmt: BlockFormat) -> None:
    """A ValueError where a per-tensor scale is given to a format that has none (MX): it
    would be ignored, and the caller would take the values for scaled ones."""
    if value is not None and not bfmt.tensor_scale:
        raise ValueError(f"tensor_scale={value!r} is not accepted for {bfmt.name or bfmt}, "
                         "which has no per-tensor scale; accepted: None, or a format with one "
                         "(such as nvfp4)")


def checked_tensor_scale(value, bfmt: BlockFormat) -> float:
    """A per-tensor scale given by the caller, as the kernels take it: rounded to float32
    (NVFP4's is an FP32, and both CPU kernels must see the same value), and refused unless
    it is then finite and at least :func:`min_tensor_scale`."""
    try:
        if isinstance(value, (str, bytes, bool, np.bool_)):
            raise TypeError
        pts = float(value)              # numbers, numpy scalars, 0-d tensors
    except (TypeError, ValueError):
        raise TypeError(f"tensor_scale={value!r} must be a number") from None
    except OverflowError:               # an integer past float64: past float32 too
        pts = math.inf
    with np.errstate(over="ignore"):
        pts32 = float(np.float32(pts))
    least = min_tensor_scale(bfmt)
    if not (np.isfinite(pts32) and pts32 >= least):
        raise ValueError(f"tensor_scale={value!r} must be a float32 from {least:.9g} to "
                         f"{float(np.finfo(np.float32).max):.9g}: the per-tensor scale is an "
                         "FP32, and the reciprocals of the block scales under it must be "
                         "finite")
    return pts32
