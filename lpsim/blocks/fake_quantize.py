"""Block quantization of numpy arrays: :func:`quantize` (what ``lpsim.quantize`` runs for a
block format: values in x's layout, with stats and ``out``; CUDA arrays and torch tensors
go to their own paths), :func:`quantize_blocks` (values, element values, scales, tensor
scale and per-block counts: :class:`Blocked`), and the plan cache: a float32 call leaves
the word kernel's arguments under (format as given, rounding, sr_bits), and the next such
call runs from them, with stats and a generator's counters too (:func:`quantize_cached`,
which lpsim.quantize tries before parsing the format: a few microseconds; a simulated
training step's counted calls, about 50 us each before, on a 2-core VM).  The blocks of a
Hadamard transform down the columns (:func:`quantize_hadamard_columns`, a recipe's wgrad
operands) leave the band kernel's arguments likewise (:func:`quantize_hadamard_cached`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..cpu import CHUNK
from ..generator import Generator, resolve as resolve_generator
from ..request import MAX_COUNTER, Plan, is_cuda_array, is_torch, keys
from ..rounding import STOCHASTIC, Params, kernel_params, mode_code
from ..stats import RoundingStats, check_stats
from .amax import (NO_AMAXES, checked_tensor_scale, refuse_tensor_scale, tensor_scale_from,
                   tensor_scale_of, word_tensor_scale)
from .columns import hadamard_amax, run_columns, takes_columns, takes_hadamard
from .counters import BLOCK_COUNTERS, STATS_ACCEPTED, BlockStats, add_counts
from .decisions import BlockParams, _element_params, block_params, element_params32
from .formats import BlockFormat, parse_block_format
from .kernels import (NO_COUNTS, run_blocks, run_kernel, tables_of, takes_words,
                      word_kernel_entry)
from .layout import moved_contiguous


class Blocked(NamedTuple):
    """The result of :func:`quantize_blocks`: fake-quantized values, element values, scales."""

    values: np.ndarray      # x's shape and dtype: q * s
    elements: np.ndarray    # float64 element values q, blocked layout (rows, length)
    scales: np.ndarray      # float64 scales (rows, blocks per row)
    tensor_scale: float     # per-tensor scale (1.0 without)
    counts: np.ndarray      # int64 (rows, blocks per row, len(BLOCK_COUNTERS)); None when
    #                         lpsim_cuda skipped them (want_counts=False)


def blocked_shape(shape: tuple) -> tuple[int, int]:
    """(rows, length) of the blocked layout of an array of ``shape`` with the block axis
    last (shared with lpsim_cuda): a 0-d array is one block of one, and rows are counted
    (reshape(-1, length) and size // length fail on length 0)."""
    if not shape:
        return 1, 1
    return int(np.prod(shape[:-1])), shape[-1]


def check_axis(axis, ndim: int) -> int:
    """``axis`` as an int for an array of ``ndim`` dimensions (-1 for a 0-d array, one block
    of one), or the error every path gives for it (lpsim_cuda's too)."""
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"axis={axis!r} must be an integer")
    if not ndim:
        return -1
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis={axis} is out of range for an array of {ndim} dimensions")
    return int(axis)


def _blocked_view(x, axis):
    """x with the block axis last, C-contiguous (a copy for another axis: tiled, by
    :func:`lpsim.blocks.layout.moved_contiguous`), as (rows, length), and its shape."""
    if axis in (-1, x.ndim - 1):
        moved = np.ascontiguousarray(x)
    else:
        moved = moved_contiguous(x, axis % x.ndim)
    return moved.reshape(blocked_shape(moved.shape)), moved.shape


def _columns_blocked(x, bfmt, request, pts, want_counts, factors) -> Blocked:
    """The blocks down the columns of the 2-D float32 ``x`` (of its transform with
    ``factors``): :func:`lpsim.blocks.columns.run_columns`."""
    values, s2, counts = _columns_run(x, bfmt, request.mode, request.k, request.seed_lo,
                                      request.seed_hi, request.stream, request.offset,
                                      _element_params(bfmt.saturating_element, 32),
                                      element_params32(bfmt),
                                      kernel_params(bfmt.scale, np.float64),
                                      block_params(bfmt, pts), want_counts, factors)
    return Blocked(values, None, s2.T, pts, counts)


def _columns_run(x, bfmt, mode, k, seed_lo, seed_hi, stream, offset, p, p32, sp, bp,
                 want_counts, factors):
    """(values, scales a band a row, counts or None): the band kernel over ``x`` with the
    call's keys and parameters, shared by the general path and :func:`quantize_hadamard_cached`."""
    values = np.empty_like(x)
    # the scales a band at a time, in rows (a column at a time strides through memory)
    s2 = np.empty((-(-x.shape[0] // bfmt.block), x.shape[1]), np.float64)
    request = Plan(p32, mode, k, seed_lo, seed_hi, stream, offset, 4)
    counts = run_columns(x, values, s2, request, p, p32, sp, bp, want_counts, factors)
    return values, s2, counts


def takes_hadamard_columns(x, n: int, bfmt, rounding: str, want_counts, offset: int = 0) -> bool:
    """Whether :func:`quantize_hadamard_columns` takes ``x`` with runs of ``n`` rows: a
    C-contiguous 2-D float32 array, n a power of two dividing its rows and the block, and
    a format, rounding, counter offset and counting the band kernel takes."""
    bfmt = parse_block_format(bfmt)
    return takes_hadamard(x, n, 0, block_params(bfmt), mode_code(rounding), False,
                          want_counts, offset)


def quantize_hadamard_columns(x, factors, bfmt, rounding: str = "nearest", *, seed=None,
                              stream: int = 0, sr_bits=None, offset: int = 0,
                              want_counts=False) -> Blocked:
    """``quantize_blocks(T, bfmt, rounding, axis=0, want_elements=False, ...)`` of T, the
    Hadamard transform down the columns of the 2-D float32 ``x`` (float32 ``factors``, runs
    of len(factors) rows: :func:`lpsim.blocks.hadamard_rows.hadamard_rows`, the bits of
    ``lpsim.torch.hadamard.rht_tokens``), with the same values, scales, random counters and
    counts, T never in memory: each band is transformed in the cache just before it is
    quantized (NVFP4's tensor scale: a pass that transforms and reads, writing nothing).
    Why: a recipe's weight gradient transforms its operands along the tokens and
    quantizes them along the tokens, a pass over memory and a tensor fewer.  Where
    :func:`takes_hadamard_columns` is False, a ValueError."""
    from ..request import plan
    if not isinstance(x, np.ndarray):
        raise TypeError(f"quantize_hadamard_columns: x of type {type(x).__name__} is not "
                        "accepted; accepted: a C-contiguous 2-D float32 numpy array")
    given_fmt, bfmt = bfmt, parse_block_format(bfmt)
    request = plan(bfmt.saturating_element, rounding, np.float32, seed=seed, stream=stream,
                   sr_bits=sr_bits, offset=offset, size=x.size)
    given = factors
    try:
        factors = np.ascontiguousarray(given, np.float32)
        exact = bool(np.array_equal(factors, np.asarray(given, np.float64)))
    except (TypeError, ValueError):
        factors, exact = None, False
    if not exact:
        raise ValueError(f"quantize_hadamard_columns: factors={given!r} are not accepted; "
                         "accepted: a 1-D array of float32 values (lpsim.torch.hadamard."
                         "factors gives them)")
    if factors.ndim != 1 or not takes_hadamard(x, factors.size, 0, block_params(bfmt),
                                               request.mode, False, want_counts,
                                               request.offset):
        raise ValueError(
            f"quantize_hadamard_columns: an array of {x.dtype} {x.shape} with factors of shape "
            f"{factors.shape} is not accepted; accepted: a C-contiguous 2-D float32 array, a "
            "1-D array of n factors (n a power of two dividing its rows and the block), and a "
            "format, rounding, "
            "offset and counting that takes_hadamard_columns accepts")
    pts = tensor_scale_from(hadamard_amax(x, factors), bfmt) if bfmt.tensor_scale else 1.0
    result = _columns_blocked(x, bfmt, request, pts, want_counts, factors)
    _remember_hadamard(given_fmt, bfmt, rounding, sr_bits, want_counts, request)
    return result


#: (format as given, rounding, sr_bits, type(sr_bits), want_counts) -> _Words (kernel None:
#: run_columns picks the band kernel)
_HADAMARD: dict = {}


def _remember_hadamard(given, bfmt, rounding, sr_bits, want_counts, request) -> None:
    _remember(_HADAMARD, (given, rounding, sr_bits, type(sr_bits), want_counts), bfmt, request,
              None)


def quantize_hadamard_cached(x, factors, fmt, rounding, sr_bits, want_counts, generator,
                             stats):
    """:func:`quantize_hadamard_columns`' values (the same bits, random counters and counts)
    with the keys from ``generator`` (an lpsim.Generator) and the counts added to ``stats``
    (None, or an lpsim.RoundingStats or BlockStats where ``want_counts`` is "totals"), from
    what a first call of the same (format as given, rounding, sr_bits, want_counts) left;
    None, before anything is drawn or counted, where that call must run (no plan yet, an
    ``x`` or ``factors`` it does not take as they are).  Why: a simulated training step
    makes 30 such calls, each of which parsed, planned and checked its format, rounding and
    factors again (about 250 us a call in a step on a 2-core VM, for kernels of 0.5 to 3 ms)."""
    try:
        plan_ = _HADAMARD.get((fmt, rounding, sr_bits, type(sr_bits), want_counts))
    except TypeError:                   # an unhashable argument
        return None
    if plan_ is None or type(x) is not np.ndarray or x.dtype != np.float32 or x.ndim != 2 \
            or x.size == 0 or not x.flags.c_contiguous or type(factors) is not np.ndarray \
            or factors.dtype != np.float32 or factors.ndim != 1 or not factors.flags.c_contiguous \
            or not isinstance(generator, Generator):
        return None
    n, rows, stochastic = factors.size, x.shape[0], plan_.mode >= STOCHASTIC
    if n == 0 or n & (n - 1) or rows % n or plan_.bp.block % n or stochastic and rows % 4:
        return None
    if not (stats is None if want_counts is False else type(stats) in _STATS_TYPES):
        return None
    return generator.run(_hadamard_generated, plan_, x, factors, generator, rounding,
                         want_counts, stats)


def _hadamard_generated(plan_, x, factors, generator, rounding, want_counts, stats):
    """:func:`quantize_hadamard_cached`'s call, keyed by the generator's next counters."""
    seed, stream, offset = resolve_generator(generator, x, rounding, None, 0, 0)
    if plan_.mode >= STOCHASTIC and offset % 4:     # a generator's counters start its blocks
        raise ValueError(f"quantize_hadamard_columns: offset={offset} is not accepted; "
                         "accepted: a multiple of 4 for stochastic rounding")
    seed_lo, seed_hi, stream = keys(seed, stream, plan_.mode)
    bfmt, bp = plan_.bfmt, plan_.bp
    if bfmt.tensor_scale:
        bp = block_params(bfmt, tensor_scale_from(hadamard_amax(x, factors), bfmt))
    values, s2, counts = _columns_run(x, bfmt, plan_.mode, plan_.k, seed_lo, seed_hi, stream,
                                      offset, plan_.p, plan_.p32, plan_.sp, bp, want_counts,
                                      factors)
    add_counts(stats, counts, x.size, s2.size)
    return values


def quantize_blocks(x, bfmt, rounding: str = "nearest", *, axis: int = -1, seed=None,
                    stream: int = 0, sr_bits=None, offset: int = 0, tensor_scale=None,
                    want_elements: bool = True, want_counts=True, out=None) -> Blocked:
    """Block-quantize a float32/float64 numpy array along ``axis`` (blocks of bfmt.block).

    A row whose length is not a multiple of the block size ends in a shorter block.
    tensor_scale: the per-tensor scale to use (default: computed from x when bfmt has one).
    want_counts=False (no stats wanted) skips the element counters; counts is then None, or
    incomplete where the kernel keeps them anyway; "totals": counts holds rows whose sum is
    the call's counters, one per block or fewer (the float32 word kernel's sums per thread:
    what lpsim.quantize's stats take).  out: where the values go, when it is a C-contiguous
    array of x's shape and dtype that does not overlap x and the blocks run along the last
    axis (else a new array, as without it).
    """
    from ..request import plan
    bfmt = parse_block_format(bfmt)
    refuse_tensor_scale(tensor_scale, bfmt)
    if not isinstance(x, np.ndarray):
        raise TypeError(f"cannot block-quantize a {type(x).__name__}; accepted: a float32/"
                        "float64 numpy array (lpsim.quantize also takes torch tensors)")
    request = plan(bfmt.saturating_element, rounding, x.dtype, seed=seed, stream=stream,
                   sr_bits=sr_bits, offset=offset, size=x.size)
    axis = check_axis(axis, x.ndim)
    if want_counts not in (True, False, "totals"):
        raise ValueError(f"want_counts={want_counts!r} is not accepted; accepted: True, False "
                         "or 'totals'")
    if takes_columns(x, axis, block_params(bfmt), request.mode, want_elements, want_counts,
                     request.offset):
        # down the columns of a 2-D array: block rows in cache, no transposing copy
        pts = 1.0
        if bfmt.tensor_scale:
            pts = checked_tensor_scale(tensor_scale, bfmt) if tensor_scale is not None \
                else tensor_scale_of(x, bfmt)
        return _columns_blocked(x, bfmt, request, pts, want_counts, None)
    x2, moved_shape = _blocked_view(np.asarray(x), axis) if x.ndim else (x.reshape(1, 1), (1,))
    want_counts = want_counts or want_elements
    words = takes_words(x2, block_params(bfmt), want_elements, want_counts)
    pts, bam = 1.0, NO_AMAXES
    if bfmt.tensor_scale and tensor_scale is not None:
        pts = checked_tensor_scale(tensor_scale, bfmt)
    elif bfmt.tensor_scale:
        pts, bam = word_tensor_scale(x2, bfmt) if words else (tensor_scale_of(x, bfmt),
                                                              NO_AMAXES)
    bp = block_params(bfmt, pts)
    p = _element_params(bfmt.saturating_element, request.params.W)
    p32 = element_params32(bfmt)
    sp = kernel_params(bfmt.scale, np.float64)
    rows, length = x2.shape
    nblk = -(-length // bfmt.block) if length else 0
    out2 = out.reshape(x2.shape) if writes_into(out, x, axis) else np.empty_like(x2)
    q2 = np.empty(x2.shape if want_elements else (1, 1), np.float64)
    s2 = np.empty((rows, nblk), np.float64)
    # a row of counters per block where a kernel writes one: the counted kernel always, the
    # word kernel where asked for them block by block (its sums come back from run_blocks)
    per_block = not words or want_counts is True or not x2.size
    counts = np.zeros((rows, nblk, len(BLOCK_COUNTERS)) if per_block else (1, 1, 1), np.int64)
    if x2.size:
        counts = run_blocks(x2, out2, q2, s2, counts, request, p, p32, sp, bp, want_elements,
                            want_counts, bam)
    if not want_counts:
        counts = None
    values = out2.reshape(moved_shape) if x.ndim else out2.reshape(())
    if x.ndim and axis not in (-1, x.ndim - 1):
        values = np.moveaxis(values, -1, axis)
    return Blocked(values, q2 if want_elements else None, s2, pts, counts)


def writes_into(out, x, axis) -> bool:
    """Whether :func:`quantize_blocks` writes x's values straight into ``out``: a writable
    C-contiguous array of x's shape and dtype, apart from x, with the blocks along the last
    axis (elsewhere it writes a new array, which the caller copies)."""
    return (isinstance(out, np.ndarray) and (x.ndim <= 1 or axis in (-1, x.ndim - 1))
            and out.dtype == x.dtype and out.shape == x.shape and out.flags.c_contiguous
            and out.flags.writeable and not np.may_share_memory(out, x))


class _Words(NamedTuple):
    """What a float32 call needs besides its arrays, keys and stats (the word kernel's
    arguments, or the band kernel's: :func:`quantize_hadamard_cached`), cached by
    :func:`_remember` after a first call validated the request."""

    bfmt: BlockFormat
    mode: int
    k: int
    p: Params
    p32: Params
    sp: Params
    bp: BlockParams         # with pts = 1 (formats with a tensor scale take theirs per call)
    kernel: object          # the word kernel's entry (None: the band kernel, run_columns')
    counts: bool            # whether the counted word kernel takes the format (its scales
    #                         are more than one value: lpsim.blocks.word_counts.clip_bounds)


#: the stats a cached call counts into (subclasses take the general path)
_STATS_TYPES = (RoundingStats, BlockStats)
#: (format as given, rounding, sr_bits, type(sr_bits)) -> _Words; cleared when full
_WORDS: dict = {}
MAX_CACHED = 256


def _remember_words(given, bfmt, rounding, sr_bits) -> None:
    from ..request import plan
    request = plan(bfmt.saturating_element, rounding, np.float32, sr_bits=sr_bits)
    _remember(_WORDS, (given, rounding, sr_bits, type(sr_bits)), bfmt, request,
              word_kernel_entry(request.mode))


def _remember(cache: dict, key, bfmt, request, kernel) -> None:
    """cache[key] = the _Words of a validated request (cleared when full); nothing for a
    format the float32 word step does not take or an unhashable key (no cached path)."""
    bp = block_params(bfmt)
    if not bp.f32:
        return
    if len(cache) >= MAX_CACHED:
        cache.clear()
    try:
        cache[key] = _Words(bfmt, request.mode, int(request.k),
                            _element_params(bfmt.saturating_element, 32), element_params32(bfmt),
                            kernel_params(bfmt.scale, np.float64), bp, kernel,
                            bool(bp.smin < bp.smax))
    except TypeError:
        pass


def quantize_cached(x, fmt, rounding, axis, seed, stream, sr_bits, out, offset, stats=None,
                    generator=None):
    """:func:`quantize` of a float32 numpy array by the word kernel, from the plan a first
    call of the same (format as given, rounding, sr_bits) left; None where the general path
    must run (no plan yet, other layouts, an ``out`` it cannot write straight into, keys,
    offsets or stats that need checking), before anything is drawn or counted.  stats: None,
    an lpsim.RoundingStats or a BlockStats (the counted kernel's sums); generator: None or
    an lpsim.Generator with seed None (its next counters).  A few microseconds: lpsim.quantize
    calls it before parsing the format."""
    try:
        words = _WORDS.get((fmt, rounding, sr_bits, type(sr_bits)))
    except TypeError:                   # an unhashable argument
        return None
    if words is None or x.dtype != np.float32 or x.ndim == 0 or x.size == 0 \
            or not x.flags.c_contiguous or type(axis) is not int or axis not in (-1, x.ndim - 1):
        return None
    if type(offset) is not int or offset < 0 or offset + x.size > MAX_COUNTER:
        return None
    if (seed is not None and type(seed) is not int) or type(stream) is not int:
        return None
    if stats is not None and (type(stats) not in _STATS_TYPES or not words.counts):
        return None
    if out is not None and not writes_into(out, x, axis):
        return None
    if generator is not None:
        return generator.run(_words_generated, words, x, generator, rounding, stream, out,
                             offset, stats)
    return _run_words(words, x, seed, stream, out, offset, stats)


def _words_generated(words, x, generator, rounding, stream, out, offset, stats):
    """:func:`_run_words` with the generator's next counters."""
    seed, stream, offset = resolve_generator(generator, x, rounding, None, stream, offset)
    return _run_words(words, x, seed, stream, out, offset, stats)


def _run_words(words, x, seed, stream, out, offset, stats):
    """The word kernel over ``x``'s rows from a cached plan (checked by the caller), counted
    into ``stats`` where given."""
    seed_lo, seed_hi, stream = keys(seed, stream, words.mode)
    bfmt = words.bfmt
    length = x.shape[-1]
    x2 = x.reshape(-1, length)
    bp, bam = words.bp, NO_AMAXES
    if bfmt.tensor_scale:
        pts, bam = word_tensor_scale(x2, bfmt)
        bp = block_params(bfmt, pts)
    result = np.empty_like(x) if out is None else out
    s2 = np.empty((x2.shape[0], -(-length // bfmt.block)), np.float64)
    counted = 0 if stats is None else 2
    kernel = words.kernel if not counted else word_kernel_entry(words.mode, counted)
    sums = run_kernel(kernel, (x2, result.reshape(x2.shape), s2, NO_COUNTS, bam),
                      (words.k, words.p, words.p32, words.sp, bp, seed_lo, seed_hi, stream,
                       offset, CHUNK, tables_of(bp, words.sp, s2.size, counted)),
                      s2.size, x.size)
    if counted:
        add_counts(stats, np.stack(sums), x.size, s2.size)
    return result


def quantize(x, bfmt, rounding: str = "nearest", *, axis: int = -1, seed=None,
             stream: int = 0, sr_bits=None, stats=None, out=None, offset: int = 0,
             tensor_scale=None):
    """Fake-quantize ``x`` to the block format: the container values q * s (``lpsim.quantize``
    with a block format lands here).  stats: a RoundingStats (element counters) or a
    :class:`BlockStats` (also block counters)."""
    if tensor_scale is None and type(x) is np.ndarray:
        done = quantize_cached(x, bfmt, rounding, axis, seed, stream, sr_bits, out, offset,
                               stats)
        if done is not None:
            return done
    check_stats(stats, STATS_ACCEPTED)
    given, bfmt = bfmt, parse_block_format(bfmt)
    refuse_tensor_scale(tensor_scale, bfmt)
    torch_tensor = is_torch(x)
    if is_cuda_array(x):
        # the CPU backend: lpsim.quantize dispatches CUDA arrays to lpsim_cuda.blocks
        raise TypeError(f"lpsim.blocks.quantize rounds on the CPU, not a {type(x).__name__} "
                        "on a GPU; accepted there: lpsim.quantize(x, fmt, axis=...), or "
                        "lpsim_cuda.blocks.quantize(x, fmt, tensor_scale=...)")
    if torch_tensor or is_torch(out):
        # lpsim.quantize's torch rules (lpsim.tensors): dtypes, autograd, out=
        from ..tensors import quantize_tensor

        def round_with(src, fmt, rounding, *, out=None, **kw):
            return quantize(src, fmt, rounding, axis=axis, tensor_scale=tensor_scale, out=out,
                            **kw)
        return quantize_tensor(x, bfmt, rounding, seed=seed, stream=stream, sr_bits=sr_bits,
                               stats=stats, out=out, offset=offset, round_with=round_with)
    from ..request import as_container_array, check_out as _check_out
    if isinstance(x, (int, float, np.floating, np.integer)) \
            and not isinstance(x, (bool, np.bool_)):      # numbers: a number, as elements give
        value = quantize(as_container_array(x).reshape(1), bfmt, rounding, seed=seed,
                         stream=stream, sr_bits=sr_bits, stats=stats, offset=offset,
                         tensor_scale=tensor_scale)[0]
        return value if isinstance(x, np.floating) else float(value)
    # any array-like, upcast exactly as lpsim.quantize does (float16, lists, integers)
    x = as_container_array(x)
    if out is not None:
        _check_out(out, x)                  # before anything is counted or written
    direct = writes_into(out, x, axis)
    result = quantize_blocks(x, bfmt, rounding, axis=axis, seed=seed, stream=stream,
                             sr_bits=sr_bits, offset=offset, tensor_scale=tensor_scale,
                             want_elements=False,
                             want_counts="totals" if stats is not None else False,
                             out=out if direct else None)
    add_counts(stats, result.counts, x.size, result.scales.size)
    if x.dtype == np.float32:
        _remember_words(given, bfmt, rounding, sr_bits)
    if out is not None:
        if not direct:
            out[...] = result.values
        return out
    return result.values
