"""Blocks down the columns of a 2-D float32 array, quantized without a transposing copy.

Why: a GEMM whose K is a tensor's first axis (a linear layer's weight gradient, K the
tokens) quantizes its operands in blocks along axis 0.  The general route moves that axis
last with a transposing copy of the whole tensor, quantizes the copy and returns its
transpose: a second pass over memory, and numpy's transposing copy is slow (11 ms for
2048 x 1024 float32 on a 2-core VM, torch's 5).  Here each thread takes block rows (the
``block`` rows that hold one block of every column): it gathers one into a scratch of
``cols x block`` values (a few hundred kilobytes, which stays in cache) through 16 x 16
tiles, runs the word kernel's own block loop on it (:func:`lpsim.blocks.kernels._words_range`,
each scratch row a block) and scatters the result back in the array's own layout.  The
blocks and their scales are those of the transposed copy, so the values are the general
route's bit for bit; only where they lie differs (C order, not a transposed view).
Deterministic roundings only: a block row's elements draw counters ``rows`` apart in the
transposed copy's order, not one run.

Used by :func:`lpsim.blocks.quantize_blocks` for float32 arrays of two dimensions blocked
along axis 0, without counters, of a format the word kernel takes without a tensor scale
(MX formats).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit
from numba.extending import register_jitable

from ..cpu import CHUNK, entry_point
from ..pool import deal, pieces, threads
from ..rounding import MODES, STOCHASTIC, kernel_params
from .amax import NO_AMAXES
from .decisions import _element_params, block_params, element_params32
from .formats import PRESETS
from .kernels import NO_COUNTS, PARALLEL_GRAIN, SERIAL_BELOW, _words_range

#: the side of the square tiles a block row is gathered and written back through
TILE = 16


@register_jitable
def _transpose(src, s0, dst, d0, h, w):
    """dst[d0 + j, i] = src[s0 + i, j] for i < h, j < w: 16 x 16 tiles (loops of literal
    length, which LLVM turns into vector moves; element by element, a strided store each,
    took three times as long), the ragged edges element by element.  A block row is
    gathered as ``_transpose(x, r0, band, 0, height, cols)`` and written back as
    ``_transpose(done, 0, out, r0, cols, height)``."""
    tile = np.empty((TILE, TILE), src.dtype)
    tall = h - h % TILE
    wide = w - w % TILE
    for j0 in range(0, wide, TILE):
        for i0 in range(0, tall, TILE):
            for i in range(TILE):
                for j in range(TILE):
                    tile[j, i] = src[s0 + i0 + i, j0 + j]
            for j in range(TILE):
                for i in range(TILE):
                    dst[d0 + j0 + j, i0 + i] = tile[j, i]
        for i in range(tall, h):
            for j in range(TILE):
                dst[d0 + j0 + j, i] = src[s0 + i, j0 + j]
    for i in range(h):
        for j in range(wide, w):
            dst[d0 + j, i] = src[s0 + i, j]


def _columns_kernel(mode: int):
    """The band kernel of rounding mode ``mode`` (a constant of its body), named
    ``blocks_columns_<mode>`` for numba's on-disk cache: block rows b0 .. b1-1 of ``x`` (rows
    x cols, blocks of ``size`` down the columns) into ``out``, their scales into columns b0
    .. b1-1 of ``sout`` (cols x blocks per column).  A band is one block row: its blocks,
    one a column, gathered as the rows of a (cols x size) scratch."""
    def kernel(x, out, sout, b0, b1, size, k, p, p32, sp, bp, seed_lo, seed_hi, stream,
               offset, chunk):
        rows, cols = x.shape
        band = np.empty((cols, size), np.float32)
        done = np.empty((cols, size), np.float32)
        scales = np.empty((1, cols), np.float64)
        for b in range(b0, b1):
            r0 = b * size
            height = min(size, rows - r0)
            if height == size:
                # one row of cols whole blocks: the word loop's straight path (rows of one
                # block each take its per-block bounds, twice the time)
                _transpose(x, r0, band, 0, height, cols)
                _words_range(band.reshape((1, cols * size)), done.reshape((1, cols * size)),
                             scales, NO_COUNTS, NO_AMAXES, 0, cols, mode, 0, k, p, p32, sp, bp,
                             seed_lo, seed_hi, stream, offset, chunk)
                _transpose(done, 0, out, r0, cols, height)
            else:                               # the last block row, of shorter blocks
                held = np.empty((cols, height), np.float32)
                made = np.empty((cols, height), np.float32)
                _transpose(x, r0, held, 0, height, cols)
                _words_range(held, made, scales.reshape((cols, 1)), NO_COUNTS, NO_AMAXES, 0,
                             cols, mode, 0, k, p, p32, sp, bp, seed_lo, seed_hi, stream, offset,
                             chunk)
                _transpose(made, 0, out, r0, cols, height)
            for j in range(cols):
                sout[j, b] = scales[0, j]

    name = next(name for name, code in MODES.items() if code == mode)
    kernel.__name__ = kernel.__qualname__ = f"blocks_columns_{name}"
    return kernel


#: the dispatcher of each mode, compiled on first use and cached on disk
COLUMN_KERNELS = {mode: njit(cache=True, nogil=True)(_columns_kernel(mode))
                  for mode in MODES.values()}


@functools.cache
def columns_entry(mode: int):
    """The compiled entry point of ``mode``'s band kernel."""
    dispatcher = COLUMN_KERNELS[mode]
    bfmt = PRESETS["mxfp4"]
    x = np.zeros((1, 1), np.float32)
    args = (x, x.copy(), np.zeros((1, 1)), 0, 1, 32, 1,
            _element_params(bfmt.saturating_element, 32), element_params32(bfmt),
            kernel_params(bfmt.scale, np.float64), block_params(bfmt), 0, 0, 0, 0, CHUNK)
    return entry_point(dispatcher, args, f"the CPU block kernel {dispatcher.py_func.__name__} "
                       "for float32 arrays")


def takes_columns(x, axis: int, bp, mode: int, tensor_scale: bool, want_elements,
                  want_counts) -> bool:
    """Whether :func:`run_columns` quantizes ``x`` along ``axis``: a 2-D float32 C-contiguous
    array blocked down its columns (axis 0), a deterministic rounding (a block row's random
    counters are not consecutive), no element values or counters wanted, a format the word
    kernel takes (``bp.f32``) without a tensor scale."""
    return (isinstance(x, np.ndarray) and x.ndim == 2 and axis in (0, -2)
            and x.dtype == np.float32 and x.flags.c_contiguous and x.size > 0
            and mode < STOCHASTIC and bool(bp.f32) and not tensor_scale and not want_elements
            and not want_counts)


def run_columns(x, out, sout, request, p, p32, sp, bp) -> None:
    """Quantize the 2-D float32 ``x`` in blocks down its columns into ``out`` (x's shape, C
    order) and the scales into ``sout`` (columns x blocks per column), block rows dealt out
    to lpsim's threads."""
    kernel = columns_entry(request.mode)
    size = bp.block
    bands = -(-x.shape[0] // size)
    workers = min(threads(), bands, x.size // PARALLEL_GRAIN) if x.size >= SERIAL_BELOW else 1
    args = (size, int(request.k), p, p32, sp, bp, int(request.seed_lo), int(request.seed_hi),
            int(request.stream), int(request.offset), int(CHUNK))
    deal(lambda b0, b1: kernel(x, out, sout, b0, b1, *args), pieces(bands, workers), workers)
