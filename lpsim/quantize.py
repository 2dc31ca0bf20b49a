"""``lpsim.quantize``: round arrays and scalars to any fp(e, m, b) on the CPU (numba kernels).

CUDA arrays (torch CUDA tensors, CuPy, numba device arrays) are handed to ``lpsim_cuda``;
both paths run the same scalar decision (:func:`lpsim.rounding.round_bits`; the CPU kernel,
:mod:`lpsim.cpu`, runs its vectorised common case :func:`lpsim.rounding.round_fast` first).

A call on a float32/float64 numpy array costs one or two microseconds before the kernel
runs: the parsed format, the decision's parameters and the kernel's entry point are looked
up once per (format, rounding, dtype, sr_bits), and everything else is a few checks.  A
small C-contiguous float32 call to nearest with nothing else asked takes the shortest path,
about a microsecond in all on a 2-core VM (as fast as ml_dtypes' round trip).

This module is the front: the only one that knows the backends (lpsim.cpu's kernels, the
block formats of lpsim.blocks and lpsim_cuda.blocks, lpsim.fixed, the torch tensor backend
lpsim.tensors, lpsim_cuda) and dispatches to them.  What a request is and how it is checked
(:func:`plan`, :func:`keys`, the checks) lives below every backend in :mod:`lpsim.request`
and is re-exported here (docs/architecture.rst).
"""

from __future__ import annotations

import secrets
import sys
from typing import NamedTuple

import numpy as np

from . import blocks, cpu
from .fixed import Fixed, quantize_fixed
from .formats import Format, parse_format
from .generator import Generator, resolve as resolve_generator
from .philox import MASK32, WORD_BITS, split_key
# what a request is and how it is checked (lpsim.request), re-exported where users import it
from .request import F32 as _F32, F64 as _F64, MAX_COUNTER, Plan, as_container_array, keys, plan
from .request import check_dtype, check_offset, check_scalar_out, check_sr_bits
from .request import check_out as _check_out, container as _container, is_torch as _is_torch
from .request import is_cuda_array as _is_cuda_array
from .request import exact_in_float64 as _exact_in_float64, signed as _signed, wide_ints
from .rounding import NEAREST, STOCHASTIC, mode_code, nearest32_exact
from .stats import COUNTERS, RoundingStats, check_stats

_ndarray = np.ndarray
#: (module, name) of the torch tensor types whose CUDA calls may take a cached route
_TORCH_TYPES = frozenset({("torch", "Tensor"), ("torch.nn.parameter", "Parameter")})
_TENSOR = ("torch", "Tensor")
#: lpsim_cuda.quantize.torch_front, once lpsim_cuda is loaded (_cuda_front)
_TORCH_FRONT = None


class _Route(NamedTuple):
    """What a (format, rounding, dtype, sr_bits) request needs per call, computed once."""

    mode: int
    k: int
    pv: np.ndarray          # tuple(Params) as int64 (lpsim.cpu.params_of)
    kernel: object          # lpsim.cpu.entry(mode, dtype); None where ``quick`` is
    #                         nearest32's, until a call with stats compiles it
    quick: object           # without stats: lpsim.cpu.nearest32_entry() where it applies,
    #                         else ``kernel``


#: per container, (fmt, rounding, sr_bits, type(sr_bits)) -> _Route; a few hundred entries
#: at most (keyed apart by dtype: a dtype's hash is computed afresh on every call)
_ROUTES: dict = {_F32: {}, _F64: {}}
_ROUTES32, _ROUTES64 = _ROUTES[_F32], _ROUTES[_F64]
#: (fmt, rounding) -> (lpsim.cpu.nearest32_all_entry(), pv) of the float32 routes whose
#: ``quick`` is nearest32's and sr_bits None: small calls' whole-array kernel, 3 arguments
_SMALL: dict = {}
#: calls of fewer elements take _SMALL's kernel, which holds the GIL (at most ~5 us)
SMALL_BELOW = 1 << 14


def _route(fmt, rounding, dtype, sr_bits) -> _Route:
    """The cached route of a request, validating it the first time (clear errors)."""
    routes = _ROUTES.get(np.dtype(dtype), {})    # float32 and float64: others fail in plan
    key = (fmt, rounding, sr_bits, type(sr_bits))
    try:
        return routes[key]
    except KeyError:
        pass
    except TypeError:       # an unhashable argument: validation names it below
        key = None
    request = plan(fmt, rounding, dtype, sr_bits=sr_bits)
    near32 = request.mode == NEAREST and np.dtype(dtype) == np.float32 and \
        nearest32_exact(parse_format(fmt))
    # a first call compiles what it runs: the general kernel (seconds) waits for stats
    kernel = None if near32 else cpu.entry(request.mode, np.dtype(dtype))
    quick = cpu.nearest32_entry() if near32 else kernel
    route = _Route(request.mode, request.k, np.array(request.params, np.int64), kernel, quick)
    if key is not None and len(routes) < 4096:
        routes[key] = route
        if near32 and sr_bits is None:
            _SMALL[fmt, rounding] = cpu.nearest32_all_entry(), route.pv
    return route


#: the counters of calls without stats (written, never read)
_DISCARD = np.zeros(cpu.NCOUNTS, np.int64)


def _round_array(x, route: _Route, seed, stream, stats, out, offset):
    """The numpy path: ``x`` a native float32/float64 array; returns ``out``."""
    n = x.size
    if type(offset) is not int or offset < 0 or offset + n > MAX_COUNTER:
        offset = check_offset(offset, n)
    if seed is None:
        seed_lo = seed_hi = 0
        if route.mode >= STOCHASTIC:
            seed = secrets.randbits(64)
            seed_lo, seed_hi = seed & MASK32, seed >> 32
    elif type(seed) is int and 0 <= seed < 1 << 64:
        seed_lo, seed_hi = seed & MASK32, seed >> 32
    else:
        seed_lo, seed_hi = split_key(seed, "seed")
    if type(stream) is not int or not 0 <= stream < 1 << 63:
        stream = _signed(sum(w << (32 * i) for i, w in enumerate(split_key(stream, "stream"))))
    if stats is None:
        counts = _DISCARD
    elif type(stats) is RoundingStats or isinstance(stats, RoundingStats):
        counts = stats.counts
    else:
        check_stats(stats)                              # raises: not a RoundingStats
    xflags = x.flags
    if out is None:
        out = target = np.empty(x.shape, x.dtype)     # C order whatever x's layout
    elif type(out) is _ndarray and out.dtype is x.dtype and out.shape == x.shape:
        oflags = out.flags
        if not oflags.writeable:
            _check_out(out, x)
        target = out if oflags.c_contiguous else np.empty(x.shape, x.dtype)
    else:
        out = _check_out(out, x)
        target = out if out.flags.c_contiguous else np.empty(x.shape, x.dtype)
    src = x if xflags.c_contiguous and xflags.writeable else np.array(x, order="C")
    flat = src if src.ndim == 1 else src.reshape(-1)
    dst = target if target.ndim == 1 else target.reshape(-1)
    kernel = route.quick if stats is None else route.kernel or cpu.entry(route.mode, x.dtype)
    # the nearest kernel is fast enough that a second thread pays only on larger arrays
    grain = cpu.NEAREST32_GRAIN if route.kernel is None and stats is None else \
        cpu.PARALLEL_GRAIN
    if n < 2 * grain:
        status = kernel(flat, dst, route.pv, route.k, seed_lo, seed_hi, stream, offset, 0,
                        cpu.ntasks(n, offset), counts)
    else:
        status = cpu.run(flat, dst, route.mode, route.pv, route.k, seed_lo, seed_hi, stream,
                         offset, counts, kernel, grain)
    if status == cpu.OVERLAP:
        # out overlaps x without being x: round a copy of x
        cpu.run(flat.copy(), dst, route.mode, route.pv, route.k, seed_lo, seed_hi, stream,
                offset, counts, kernel, grain)
    if target is not out:
        out[...] = target
    return out


def quantize(x, fmt, rounding: str = "nearest", *, seed=None, stream: int = 0, sr_bits=None,
             stats: RoundingStats | None = None, out=None, offset: int = 0, generator=None,
             axis: int = -1):
    """Round ``x`` to the format ``fmt`` in mode ``rounding``; returns the container values.

    x: a numpy array or any array-like (lists, tuples, scalars).  float32 and float64 arrays
    are rounded in their own container; float16 and ml_dtypes' bfloat16 arrays are upcast
    exactly to float32, and integer arrays to float64 when every element is exact there.
    A Python int or float is rounded as float64 and returned as a float (an int beyond
    float64's 53 bits is rounded exactly, from its integer value, to an element format; a
    block format refuses it by name); a numpy float scalar
    comes back as a numpy scalar of its container.  torch tensors: CPU tensors round through
    their numpy view (autograd, in-place and dtype rules of :func:`lpsim.torch.quantize`);
    CUDA tensors and other CUDA arrays run in lpsim_cuda.
    fmt: an :class:`lpsim.Format`, a string ("bf16", "fp(4,3,4)", ...) or
    ``lpsim.fixed(wl, fl)``.  rounding: one of ``lpsim.rounding.MODES``.
    seed, stream: the key of the counter-based generator for stochastic modes (integers in
    [0, 2**64); seed=None draws a fresh seed).  A fixed integer seed replays the same bits on
    every call (exact replay, for tests); in loops pass ``generator=lpsim.Generator(seed)``
    instead, which gives each call fresh counters (:mod:`lpsim.generator`).  Element ``i``
    uses counter ``offset + i`` (C order), so a slice rounded with its offset gets the same
    bits as the whole array; 0 <= offset, offset + size <= 2**62.
    sr_bits: random bits per decision (few-bit SR).  stats: a :class:`RoundingStats` to add
    this call's counters to (one object per thread: calls of several threads adding into one
    at once may lose counts).  out: array to write into (may be ``x`` itself for in-place
    rounding; any other overlap with ``x`` is handled as if ``x`` were copied first).

    Semantics of every mode, overflow, NaN, inf and signed zero: :mod:`lpsim.rounding`.
    Raises ValueError/TypeError naming the bad value: unknown format or rounding, a format
    that does not fit the container, object/complex/bool data, sr_bits, seed, stream or
    offset out of range, a wrong ``out`` or ``stats``; nothing is written then.
    A block-scaled format ("mxfp4", "nvfp4", lpsim.blocks.BlockFormat) fake-quantizes in
    blocks along ``axis``: :func:`lpsim.blocks.quantize`.
    """
    if type(x) is _ndarray and generator is None:
        if (x.dtype is _F32 and sr_bits is None and stats is None and seed is None
                and type(stream) is int is type(offset) and not (stream or offset)):
            # a small C-contiguous float32 call to nearest with nothing else asked: a few
            # checks and the 3-argument kernel (they cost as much as rounding 2**11 elements)
            try:
                kernel, pv = _SMALL[fmt, rounding]
            except (KeyError, TypeError):       # unhashable: validated below, by name
                kernel = None
            if kernel is not None and x.size < SMALL_BELOW and x.flags.carray:
                # the kernel's entry point unboxes 1-D C arrays unchecked: shape and layout
                # are checked here (1-D first: a size and ndim cost less than a shape)
                if out is None:
                    out = np.empty_like(x)
                elif out is not x and not (type(out) is _ndarray and out.dtype is _F32
                                           and out.flags.carray):
                    kernel = None
                if kernel is not None:
                    if x.ndim == 1:
                        if out.ndim == 1 and out.size == x.size and kernel(x, out, pv) == 0:
                            return out
                    elif out.shape == x.shape and \
                            kernel(x.reshape(-1), out.reshape(-1), pv) == 0:
                        return out
    if type(x) is _ndarray:
        dtype = x.dtype
        routes = _ROUTES32 if dtype is _F32 else _ROUTES64 if dtype is _F64 else None
        try:    # sr_bits' type too: True and 4.0 equal 1 and 4 but are refused
            route = routes[fmt, rounding, sr_bits, type(sr_bits)]
        except (KeyError, TypeError):
            pass
        else:
            if generator is None:
                return _round_array(x, route, seed, stream, stats, out, offset)
            if type(generator) is Generator and seed is None:
                return generator.run(_round_generated, x, route, generator, rounding, stream,
                                     stats, out, offset)
            return _quantize_other(x, fmt, rounding, seed, stream, sr_bits, stats, out,
                                   offset, generator, axis)
        if generator is None or type(generator) is Generator and seed is None:
            # a block format called before (lpsim.blocks): its plan, a few microseconds
            done = blocks.quantize_cached(x, fmt, rounding, axis, seed, stream, sr_bits, out,
                                          offset, stats, generator)
            if done is not None:
                return done
    elif (out is None or out is x) and (type(x).__module__, type(x).__name__) == _TENSOR:
        array = _cpu_float32(x, out is x)
        if array is not None:   # a plain CPU float32 tensor: its numpy view's routes
            done = quantize(array, fmt, rounding, seed=seed, stream=stream, sr_bits=sr_bits,
                            stats=stats, offset=offset, generator=generator, axis=axis,
                            out=None if out is None else array)
            if out is None:
                return _from_numpy(done)
            sys.modules["torch"].autograd.graph.increment_version(x)   # as torch's in place
            return x
    if (type(x).__module__, type(x).__name__) in _TORCH_TYPES and x.is_cuda:
        # a request a torch CUDA tensor took before: its cached route, a few microseconds
        front = _cuda_front()
        done = front and front(x, fmt, rounding, seed, stream, sr_bits, out, offset,
                               generator, axis, stats)
        if done is not None:
            return done
    return _quantize_other(x, fmt, rounding, seed, stream, sr_bits, stats, out, offset,
                           generator, axis)


def _cpu_float32(t, written: bool):
    """The numpy view of the torch tensor ``t`` where lpsim.tensors' rules would round
    exactly it: a C-contiguous float32 CPU tensor of one or more dimensions that autograd
    does not follow, not a lazily negated view, nor (``written``: rounded in place) an
    inference tensor, which torch's rules write only in inference mode; else None.  (Such a
    tensor's own path ends in the same numpy call, after about 10 us of torch's rules.)"""
    torch = sys.modules["torch"]
    if t.dtype is not torch.float32 or t.is_cuda or t.requires_grad or t.dim() == 0 \
            or t.device.type != "cpu" or t.layout is not torch.strided or t.is_neg() \
            or not t.is_contiguous() or (written and t.is_inference()):
        return None
    return t.numpy()


def _from_numpy(array):
    return sys.modules["torch"].from_numpy(array)


def _cuda_front():
    """lpsim_cuda.quantize.torch_front once lpsim_cuda is loaded (a torch CUDA tensor's
    first call loads it through the general path), else None."""
    global _TORCH_FRONT
    if _TORCH_FRONT is None:
        module = sys.modules.get("lpsim_cuda.quantize")
        _TORCH_FRONT = module and module.torch_front
    return _TORCH_FRONT


def _round_generated(x, route, generator, rounding, stream, stats, out, offset):
    """_round_array with the generator's next counters (a cached route's call)."""
    seed, stream, offset = resolve_generator(generator, x, rounding, None, stream, offset)
    return _round_array(x, route, seed, stream, stats, out, offset)


def _block_format(fmt):
    """The block format ``fmt`` names (lpsim.blocks), or None."""
    return blocks.as_block_format(fmt)


def _quantize_other(x, fmt, rounding, seed, stream, sr_bits, stats, out, offset, generator,
                    axis=-1):
    """Everything but a cached request on a float32/float64 numpy array: other formats,
    generators, tensors, scalars, array-likes, and first calls (validated here).  A
    generator's counters are given back if the call is refused (Generator.run)."""
    if isinstance(generator, Generator):
        return generator.run(_quantize_any, x, fmt, rounding, seed, stream, sr_bits, stats,
                             out, offset, generator, axis)
    return _quantize_any(x, fmt, rounding, seed, stream, sr_bits, stats, out, offset,
                         generator, axis)


def _quantize_any(x, fmt, rounding, seed, stream, sr_bits, stats, out, offset, generator,
                  axis):
    """:func:`_quantize_other`'s work."""
    bfmt = _block_format(fmt)
    if bfmt is not None:            # block-scaled formats (MX, NVFP4): lpsim.blocks
        mode_code(rounding)
        if isinstance(x, (int, float, np.number)) and not isinstance(x, (bool, np.bool_)):
            check_scalar_out(x, out)
        seed, stream, offset = resolve_generator(generator, x, rounding, seed, stream, offset)
        return _quantize_blocks(x, fmt, bfmt, rounding, axis, seed, stream, sr_bits, stats,
                                out, offset)
    if isinstance(fmt, Fixed):      # fixed point: the carrier format, rounded here, clamped
        return quantize_fixed(x, fmt, rounding, seed=seed, stream=stream, sr_bits=sr_bits,
                              stats=stats, out=out, offset=offset, generator=generator,
                              round_with=quantize)
    given, fmt = fmt, parse_format(fmt)     # the cache keys on the format as the caller gave it
    mode_code(rounding)
    seed, stream, offset = resolve_generator(generator, x, rounding, seed, stream, offset)
    check_stats(stats)
    if _is_torch(x) or _is_torch(out):
        from .tensors import quantize_tensor
        return quantize_tensor(x, fmt, rounding, seed=seed, stream=stream, sr_bits=sr_bits,
                               stats=stats, out=out, offset=offset, round_with=round_container)
    if _is_cuda_array(x):
        import lpsim_cuda
        return lpsim_cuda.quantize(x, fmt, rounding, seed=seed, stream=stream,
                                   sr_bits=sr_bits, stats=stats, out=out, offset=offset)
    if type(x) is _ndarray and (x.dtype is _F32 or x.dtype is _F64):
        return _round_array(x, _route(given, rounding, x.dtype, sr_bits), seed, stream, stats,
                            out, offset)
    if isinstance(x, (bool, np.bool_)):
        raise TypeError(f"cannot round a bool ({x!r}); accepted: numbers and float arrays")
    if isinstance(x, int) or (isinstance(x, np.integer) and not isinstance(x, np.ndarray)):
        check_scalar_out(x, out)
        return _round_int(int(x), fmt, rounding, seed, stream, sr_bits, stats, offset)
    if isinstance(x, (float, np.floating)):
        check_scalar_out(x, out)
        if isinstance(x, np.floating) and x.dtype.itemsize > 8:
            return _round_long_double(x, fmt, rounding, seed, stream, sr_bits, stats, offset)
        array = np.array(x, dtype=np.float64 if isinstance(x, float) else _container(x.dtype))
        rounded = quantize(array, fmt, rounding, seed=seed, stream=stream, sr_bits=sr_bits,
                           stats=stats, offset=offset)
        return float(rounded) if isinstance(x, float) else rounded[()]
    if isinstance(x, np.generic) and x.dtype.kind == "V":     # ml_dtypes' bfloat16, float8
        check_scalar_out(x, out)
        return quantize(as_container_array(x), fmt, rounding, seed=seed, stream=stream,
                        sr_bits=sr_bits, stats=stats, offset=offset)[()]
    if isinstance(x, (list, tuple)):
        done = _round_big_ints(x, fmt, rounding, seed, stream, sr_bits, stats, out, offset)
        if done is not None:
            return done
    array = as_container_array(x)
    return quantize(array, fmt, rounding, seed=seed, stream=stream, sr_bits=sr_bits,
                    stats=stats, out=out, offset=offset)


def round_container(src, fmt, rounding, *, out=None, **kwargs):
    """Round a tensor's container array (the torch tensor backend's ``round_with`` for
    element formats): a CPU tensor's float32/float64 numpy view here, a CUDA tensor in
    lpsim_cuda.  ``kwargs``: seed, stream, sr_bits, stats, offset."""
    if isinstance(src, np.ndarray):
        return quantize(src, fmt, rounding, out=out, **kwargs)
    import lpsim_cuda
    return lpsim_cuda.quantize(src, fmt, rounding, out=out, **kwargs)


#: lpsim_cuda takes bfloat16/float16 tensors as they are (lpsim.tensors.round_detached)
round_container.reads_halves = True


def _plain_cuda(x, out) -> bool:
    """Whether lpsim_cuda.blocks takes the call as it is: a CUDA array (CuPy, numba), or a
    CUDA torch tensor that autograd does not follow, not a lazily negated view, without
    ``out``; other torch tensors go through lpsim.tensors' rules (straight-through autograd,
    ``out=``), which hand lpsim_cuda a plain tensor."""
    if not _is_cuda_array(x):
        return False
    return not _is_torch(x) or (not x.requires_grad and not x.is_neg() and out is None)


def _quantize_blocks(x, given, bfmt, rounding, axis, seed, stream, sr_bits, stats, out,
                     offset):
    """A block format (MX, NVFP4): CUDA arrays in lpsim_cuda.blocks, torch tensors through
    the torch tensor backend (either kernel), everything else in lpsim.blocks."""
    plain = _plain_cuda(x, out)
    if plain or _is_torch(x) or _is_torch(out):
        check_stats(stats, blocks.STATS_ACCEPTED)
    else:
        return blocks.quantize(x, given, rounding, axis=axis, seed=seed, stream=stream,
                               sr_bits=sr_bits, stats=stats, out=out, offset=offset)
    if plain:
        import lpsim_cuda.blocks
        return lpsim_cuda.blocks.quantize(x, bfmt, rounding, axis=axis, seed=seed,
                                          stream=stream, sr_bits=sr_bits, stats=stats,
                                          out=out, offset=offset)
    # lpsim.quantize's torch rules (lpsim.tensors): dtypes, autograd, out=
    from .tensors import quantize_tensor

    def round_with(src, fmt, rounding, *, out=None, **kw):
        if isinstance(src, np.ndarray):
            return blocks.quantize(src, fmt, rounding, axis=axis, out=out, **kw)
        import lpsim_cuda.blocks
        return lpsim_cuda.blocks.quantize(src, fmt, rounding, axis=axis, out=out, **kw)
    round_with.reads_halves = True           # lpsim_cuda.blocks takes bfloat16/float16 tensors
    return quantize_tensor(x, bfmt, rounding, seed=seed, stream=stream, sr_bits=sr_bits,
                           stats=stats, out=out, offset=offset, round_with=round_with)


def _round_int(value: int, fmt: Format, rounding, seed, stream, sr_bits, stats, offset):
    """A Python int, rounded as float64 when exact there, otherwise from its exact value."""
    if _exact_in_float64(value):
        return float(quantize(np.array(float(value)), fmt, rounding, seed=seed, stream=stream,
                              sr_bits=sr_bits, stats=stats, offset=offset))
    return _round_exact(value, fmt, rounding, seed, stream, sr_bits, stats, offset)


def _round_exact(value, fmt: Format, rounding, seed, stream, sr_bits, stats, offset,
                 count: int = 1) -> float:
    """An int or Fraction rounded from its exact value (lpsim.reference), with the random
    word a float64 array's element ``offset`` would draw; ``count``: the elements it adds to
    ``stats`` (0 where the caller counted the element already)."""
    from fractions import Fraction

    from .philox import random_words
    from .reference import round_exact
    request = plan(fmt, rounding, np.float64, seed=seed, stream=stream, sr_bits=sr_bits,
                   offset=offset, size=1)
    uniform = None
    if request.mode >= STOCHASTIC:
        seed = request.seed_lo | (request.seed_hi << 32)
        word = random_words(1, 8, seed, request.stream % (1 << 64), request.offset)[0]
        uniform = Fraction(word, 2 ** WORD_BITS[8])
    width = WORD_BITS[8]
    few = request.k if rounding == "stochastic" and request.k < width else None
    result = round_exact(value, fmt, rounding, uniform=uniform, sr_bits=few)
    if stats is not None:
        stats.add(count, [int(name in result.flags) for name in COUNTERS])
    return float(result.value)


def _round_long_double(x, fmt, rounding, seed, stream, sr_bits, stats, offset):
    """A numpy long double scalar: as float64 where it is exact there (inf and NaN too),
    else from its exact value; a float64 scalar back."""
    wide = np.float64(x)
    if not np.isfinite(x) or np.longdouble(wide) == x:
        return quantize(np.array(wide), fmt, rounding, seed=seed, stream=stream,
                        sr_bits=sr_bits, stats=stats, offset=offset)[()]
    from fractions import Fraction
    return np.float64(_round_exact(Fraction(*x.as_integer_ratio()), fmt, rounding, seed,
                                   stream, sr_bits, stats, offset))


def _round_big_ints(x, fmt, rounding, seed, stream, sr_bits, stats, out, offset):
    """A list or tuple holding Python ints beyond 2**53: the array rounded in float64, each
    int that float64 cannot hold exactly rounded from its exact value (np.asarray would
    round it to float64 first, a double rounding, or make an object array beyond int64);
    None when it holds none."""
    found = wide_ints(x)
    if found is None:
        return None
    objects, ints = found
    flat = objects.reshape(-1)
    rest = flat.copy()
    big = [i for i in ints if not _exact_in_float64(int(flat[i]))]
    # a placeholder each such int's result replaces: a value of the format (its smallest
    # normal), which rounds to itself with no flags in every format (0 became NaN, flagged
    # inexact, in fnu formats, which have no zero: counted once more than the int's own)
    placeholder = parse_format(fmt).min_normal
    for i in ints:
        rest[i] = float(flat[i]) if _exact_in_float64(int(flat[i])) else placeholder
    array = as_container_array(rest.tolist()).reshape(objects.shape)
    check_offset(offset, array.size)
    result = quantize(array.astype(np.float64), fmt, rounding, seed=seed, stream=stream,
                      sr_bits=sr_bits, stats=stats, out=out, offset=offset)
    for i in big:        # the placeholder was counted as an element with no flags
        result[np.unravel_index(i, result.shape)] = _round_exact(
            int(flat[i]), fmt, rounding, seed, stream, sr_bits, stats, offset + i, count=0)
    return result


def round_into(flat, out, request: Plan):
    """Round the 1-D array ``flat`` into ``out`` (same size) with a :class:`Plan`; returns
    the six counters (COUNTERS order).  For callers that build their own Params."""
    counts = np.zeros(cpu.NCOUNTS, np.int64)
    target = out.reshape(-1) if out.flags.c_contiguous else np.empty_like(flat)
    src = flat if flat.flags.c_contiguous and flat.flags.writeable else flat.copy()
    pv = np.array(request.params, np.int64)
    args = (request.mode, pv, request.k, request.seed_lo, request.seed_hi, request.stream,
            request.offset, counts)
    if cpu.run(src, target, *args) == cpu.OVERLAP:
        cpu.run(src.copy(), target, *args)
    if not out.flags.c_contiguous:
        out[...] = target.reshape(out.shape)
    return counts[1:]


__all__ = ["quantize", "plan", "Plan", "round_into", "round_container", "COUNTERS", "Format",
           "MAX_COUNTER", "as_container_array", "keys", "check_offset", "check_sr_bits",
           "check_dtype", "check_scalar_out"]
