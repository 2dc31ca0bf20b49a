"""Blocks down the columns of a 2-D float32 array, quantized without a transposing copy.

Why: a GEMM whose K is a tensor's first axis (a linear layer's weight gradient, K the
tokens) quantizes its operands in blocks along axis 0.  The general route moves that axis
last with a transposing copy of the whole tensor, quantizes the copy and returns its
transpose; the copy and its second pass over memory cost a simulated training step on the
CPU about a tenth of its time (benchmarks/README.md).  Here each thread takes strips of
STRIP columns: it gathers a strip into a small scratch (the strip's columns as rows, a few
hundred kilobytes at most, which stays in cache), runs the word kernel's own block loop on
it (:func:`lpsim.blocks.kernels._words_range`) and scatters the result back in the array's
own layout.  The blocks, their scales and the random counters are those of the transposed
copy (column ``j``'s element ``i`` draws counter ``offset + j * rows + i``), so the values
are the general route's bit for bit; only where they lie differs (C order, not a
transposed view).

Used by :func:`lpsim.blocks.quantize_blocks` for float32 arrays of two dimensions blocked
along axis 0, without counters, of a format the word kernel takes without a tensor scale
(MX formats).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit

from ..cpu import CHUNK, entry_point
from ..pool import deal, pieces, threads
from ..rounding import MODES, kernel_params
from .amax import NO_AMAXES
from .decisions import _element_params, block_params, element_params32
from .formats import PRESETS
from .kernels import NO_COUNTS, PARALLEL_GRAIN, SERIAL_BELOW, _words_range

#: columns a strip holds: a 64-byte line of float32 values per row gathered and scattered
STRIP = 16


def _columns_kernel(mode: int):
    """The column-strip kernel of rounding mode ``mode`` (a constant of its body), named
    ``blocks_columns_<mode>`` for numba's on-disk cache: columns c0 .. c1-1 of ``x`` (rows x
    cols, blocks down the columns) into ``out``, their scales into rows c0 .. c1-1 of
    ``sout`` (cols x blocks per column)."""
    def kernel(x, out, sout, c0, c1, k, p, p32, sp, bp, seed_lo, seed_hi, stream, offset,
               chunk):
        rows = x.shape[0]
        strip = np.empty((STRIP, rows), np.float32)
        done = np.empty((STRIP, rows), np.float32)
        nblk = sout.shape[1]
        c = c0
        while c < c1:
            width = min(STRIP, c1 - c)
            for i in range(rows):
                for j in range(width):
                    strip[j, i] = x[i, c + j]
            _words_range(strip[:width], done[:width], sout[c:c + width], NO_COUNTS, NO_AMAXES,
                         0, width * nblk, mode, 0, k, p, p32, sp, bp, seed_lo, seed_hi, stream,
                         offset + c * rows, chunk)
            for i in range(rows):
                for j in range(width):
                    out[i, c + j] = done[j, i]
            c += width

    name = next(name for name, code in MODES.items() if code == mode)
    kernel.__name__ = kernel.__qualname__ = f"blocks_columns_{name}"
    return kernel


#: the dispatcher of each mode, compiled on first use and cached on disk
COLUMN_KERNELS = {mode: njit(cache=True, nogil=True)(_columns_kernel(mode))
                  for mode in MODES.values()}


@functools.cache
def columns_entry(mode: int):
    """The compiled entry point of ``mode``'s column-strip kernel."""
    dispatcher = COLUMN_KERNELS[mode]
    bfmt = PRESETS["mxfp4"]
    x = np.zeros((1, 1), np.float32)
    args = (x, x.copy(), np.zeros((1, 1)), 0, 1, 1,
            _element_params(bfmt.saturating_element, 32), element_params32(bfmt),
            kernel_params(bfmt.scale, np.float64), block_params(bfmt), 0, 0, 0, 0, CHUNK)
    return entry_point(dispatcher, args, f"the CPU block kernel {dispatcher.py_func.__name__} "
                       "for float32 arrays")


def takes_columns(x, axis: int, bp, tensor_scale: bool, want_elements, want_counts) -> bool:
    """Whether :func:`run_columns` quantizes ``x`` along ``axis``: a 2-D float32 C-contiguous
    array blocked down its columns (axis 0), no element values or counters wanted, a format
    the word kernel takes (``bp.f32``) without a tensor scale."""
    return (isinstance(x, np.ndarray) and x.ndim == 2 and axis in (0, -2)
            and x.dtype == np.float32 and x.flags.c_contiguous and x.size > 0
            and bool(bp.f32) and not tensor_scale and not want_elements and not want_counts)


def run_columns(x, out, sout, request, p, p32, sp, bp) -> None:
    """Quantize the 2-D float32 ``x`` in blocks down its columns into ``out`` (x's shape, C
    order) and the scales into ``sout`` (columns x blocks per column), strips of columns
    dealt out to lpsim's threads."""
    kernel = columns_entry(request.mode)
    cols = x.shape[1]
    strips = -(-cols // STRIP)
    workers = min(threads(), strips, x.size // PARALLEL_GRAIN) if x.size >= SERIAL_BELOW else 1
    bounds = [min(cols, b * STRIP) for b in pieces(strips, workers)]
    args = (int(request.k), p, p32, sp, bp, int(request.seed_lo), int(request.seed_hi),
            int(request.stream), int(request.offset), int(CHUNK))
    deal(lambda c0, c1: kernel(x, out, sout, c0, c1, *args), bounds, workers)
