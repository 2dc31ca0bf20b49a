"""Specialised float32 rounding kernels and their cached launch routes.

Why: the general kernel (:mod:`lpsim_cuda.quantize`) takes the format as runtime data (a
20-field tuple), rounds one element per thread and pass with 4-byte loads, and each call
plans, wraps the tensors in numba arrays and types every argument: 0.34 of the device's copy
bandwidth and ~190 us of host time per call on an H100 (benchmarks/results/
gpu-h100-2026-11-26.md).  Here, for the formats people train in:

* the format's parameters, the rounding mode and ``sr_bits`` are compile-time constants
  (the kernel is made per (format, mode, k) from the shared decision
  :func:`lpsim.rounding.round_one_word`: round_one's straight path, or round_one_sub's for
  formats whose subnormals unit-scale data reaches, in 32-bit words, not a copy of it), so
  the common path folds to a few 32-bit integer operations; full-word stochastic rounding
  to those formats takes :func:`lpsim.rounding.round_sr_word`, the same decisions in
  fewer operations (e4m3fn: 52.8 -> 40.5 straight instructions an element);
* each thread owns four consecutive elements: one 16-byte load and one 16-byte store
  (:mod:`lpsim_cuda.vector`) and, for stochastic modes, the one Philox block whose four
  words serve them, exactly the words the CPU and the general kernel give those elements;
* a torch tensor's call goes through a cached route: the compiled kernel's function, its
  launch configuration and the flat argument list numba would build, checked once against
  numba's own (:func:`_numba_arguments`), so a call costs a few microseconds of Python.

Packed storage (``storage=``: an fp32 -> bf16 or float8 store) writes 8 or 4 bytes per
four elements; counting calls (``stats=``) take a second kernel of the same source whose
counters are summed per warp by shuffles (no shared memory) and added by one atomic per warp
and counter.  Uncounted nearest calls round by the CPU's nearest32 decision (two float32
adds) instead of the integer path.  A torch bfloat16 or float16 tensor's codes are read
directly (four per 8-byte load, widened by :func:`lpsim.storage.code_bits`).  Float64,
misaligned or overlapping arrays and stochastic calls whose ``offset`` is not a multiple of
4 take the general kernel.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np
from numba import cuda
from numba.extending import register_jitable

from lpsim.formats import parse_format
from lpsim.philox import block_words
from lpsim.request import MAX_COUNTER, keys
from lpsim.rounding import (DETERMINISTIC_MODES, NEAREST, STOCHASTIC, kernel_params, mode_code,
                            nearest32_consts, nearest32_exact, nearest32_step, round_bits,
                            round_one_word, round_sr_word, sr_word_applies, tally)
from lpsim.storage import NO_PACKING, code_bits, pack_bits, storage_name
from lpsim.word32 import as_signed64, bits_float32, float32_bits, word

from . import arrays, counters, launch, raw_launch, vector
from .counters import ELEMENTS, add_warp_counts
from .launch import THREADS

#: the formats with specialised kernels (any mode; float32 containers)
FORMATS = ("bf16", "fp16", "e5m2", "e4m3fn", "e4m3", "e3m2fn", "e2m3fn", "e2m1fn",
           "fp(6,9,0)")
#: formats whose smallest normal is at least 2**SUB_FROM take round_one_sub's straight path
#: (:func:`lpsim.rounding.round_one_word`), which covers their subnormals; the
#: others' subnormals are rare in data of unit scale, where round_one's shorter path is enough
SUB_FROM = -10
#: elements per thread per pass: one 16-byte access, one Philox block of float32 lanes
GROUP = 4
#: the integer views of out the kernels store into: float32 bits, 16- and 8-bit codes
OUT_BITS = (np.dtype(np.int32), np.dtype(np.int16), np.dtype(np.int8))


@functools.cache
def _formats() -> frozenset:
    return frozenset(parse_format(name) for name in FORMATS)


def specialised(fmt, rounding: str) -> bool:
    """Whether (format, rounding) has a specialised kernel (``fmt`` a parsed Format)."""
    return fmt in _formats() and (rounding in DETERMINISTIC_MODES or rounding.startswith("stoch"))


@register_jitable
def source_bits(b, half):
    """float32 bits (int32) of a source element: itself, or a 16-bit code widened."""
    return b if half == 0 else code_bits(b, half)


@register_jitable
def _nearest(b, cw, lw, lim, largest, p):
    """float32 bits ``b`` rounded to nearest as the CPU's nearest32 pass rounds them (two
    float32 adds: :func:`lpsim.rounding.nearest32_step`), round_bits where it declines (|x|
    at or above ``lim``, NaN); container bits as int64."""
    v, ok = nearest32_step(bits_float32(b), cw, lw, lim, largest)
    if ok != 0:
        return as_signed64(float32_bits(v))
    return round_bits(np.int64(b), NEAREST, np.int64(0), 0, p)[0]


@register_jitable
def _stochastic(b, r, p):
    """float32 bits ``b`` rounded stochastically with the full word ``r`` by
    :func:`lpsim.rounding.round_sr_word` (round_one_sub's straight path in fewer operations,
    no flags: uncounted kernels), round_bits where it declines; container bits as int64."""
    out, ok = round_sr_word(word(b), word(r), p)
    if ok != 0:
        return as_signed64(out)
    return round_bits(np.int64(b), STOCHASTIC, r, p.W, p)[0]


def takes_sr_word(params, mode: int, k: int, count: bool) -> bool:
    """Whether an uncounted kernel rounds by :func:`_stochastic`: full-word SR to a format
    whose subnormals data reaches (:data:`SUB_FROM`), where
    :func:`lpsim.rounding.sr_word_applies` holds."""
    return not count and params.emin >= SUB_FROM and sr_word_applies(params, mode, k)


@register_jitable
def _word(bits):
    """float32 container bits held in an int64 as a 32-bit word (lpsim.word32)."""
    return word(np.int32(bits))


def _make(params, mode: int, k: int, sp, count: bool, half: int = 0, n32: bool = False):
    """The kernel of one (format parameters, mode, sr_bits, storage packing, counting,
    source: float32 or 16-bit codes) as compile-time constants; ``n32``: nearest rounding
    by the float32 adds of the CPU's nearest32 pass (an uncounted call to a format where
    :func:`lpsim.rounding.nearest32_exact` holds)."""
    P, MODE, K, SP, COUNT, HALF = params, mode, k, sp, count, half
    N32 = n32
    SR32 = takes_sr_word(params, mode, k, count)
    CW, LW, LIM, LARGEST = nearest32_consts(params)
    stochastic = mode >= STOCHASTIC
    SUB = params.emin >= SUB_FROM
    packed = sp.width != 0

    def rounds(xb, outb, n, seed_lo, seed_hi, stream, block0, counts):
        """Round float32 bits ``xb`` (with HALF, bfloat16 or float16 codes, widened exactly)
        into ``outb``: elements 4j..4j+3 per thread and pass (Philox block ``block0 + j``),
        then the last n % 4 elements one per thread; with COUNT, the flags' six counters
        summed per warp by shuffles and added to ``counts`` by its first lane (no shared
        memory)."""
        j = cuda.grid(1)
        step = cuda.gridsize(1)
        groups = n >> 2
        w0 = w1 = w2 = w3 = np.int64(0)
        c = (0, 0, 0, 0, 0, 0)
        while j < groups:
            b0, b1, b2, b3 = vector.load4(xb, j)
            if HALF:
                b0, b1 = source_bits(b0, HALF), source_bits(b1, HALF)
                b2, b3 = source_bits(b2, HALF), source_bits(b3, HALF)
            if stochastic:
                w0, w1, w2, w3 = block_words(block0 + j, stream, seed_lo, seed_hi)
            if N32:
                o0 = _nearest(b0, CW, LW, LIM, LARGEST, P)
                o1 = _nearest(b1, CW, LW, LIM, LARGEST, P)
                o2 = _nearest(b2, CW, LW, LIM, LARGEST, P)
                o3 = _nearest(b3, CW, LW, LIM, LARGEST, P)
                f0 = f1 = f2 = f3 = np.int64(0)
            elif SR32:
                o0, o1 = _stochastic(b0, w0, P), _stochastic(b1, w1, P)
                o2, o3 = _stochastic(b2, w2, P), _stochastic(b3, w3, P)
                f0 = f1 = f2 = f3 = np.int64(0)
            else:
                o0, f0 = round_one_word(b0, MODE, w0, K, P, SUB)
                o1, f1 = round_one_word(b1, MODE, w1, K, P, SUB)
                o2, f2 = round_one_word(b2, MODE, w2, K, P, SUB)
                o3, f3 = round_one_word(b3, MODE, w3, K, P, SUB)
            if COUNT:
                c = tally(tally(tally(tally(c, f0), f1), f2), f3)
            if packed:
                # in 32-bit words: the container is float32 (a narrowing store)
                vector.store4(outb, j, pack_bits(_word(o0), SP), pack_bits(_word(o1), SP),
                              pack_bits(_word(o2), SP), pack_bits(_word(o3), SP))
            else:
                vector.store4(outb, j, o0, o1, o2, o3)
            j += step
        i = (groups << 2) + cuda.grid(1)
        if i < n:
            if stochastic:
                w0, w1, w2, w3 = block_words(block0 + groups, stream, seed_lo, seed_hi)
            lane = i & 3
            r = w0 if lane == 0 else (w1 if lane == 1 else (w2 if lane == 2 else w3))
            if N32:
                o, f = _nearest(source_bits(xb[i], HALF), CW, LW, LIM, LARGEST, P), np.int64(0)
            elif SR32:
                o, f = _stochastic(source_bits(xb[i], HALF), r, P), np.int64(0)
            else:
                o, f = round_one_word(source_bits(xb[i], HALF), MODE, r, K, P, SUB)
            if packed:
                outb[i] = as_signed64(pack_bits(_word(o), SP))
            else:
                outb[i] = o
            if COUNT:
                c = tally(c, f)
        if COUNT:
            c0, c1, c2, c3, c4, c5 = c
            add_warp_counts(counts, 0, c0, c1, c2, c3, c4, c5)
            if cuda.grid(1) == 0:
                cuda.atomic.add(counts, ELEMENTS, n)

    body = cuda.jit(device=True)(rounds)
    if COUNT:
        def kernel(xb, outb, n, seed_lo, seed_hi, stream, block0, counts):
            body(xb, outb, n, seed_lo, seed_hi, stream, block0, counts)
    else:
        # no counters: an array (7 launch arguments) fewer; the stand-in is never read
        def kernel(xb, outb, n, seed_lo, seed_hi, stream, block0):
            body(xb, outb, n, seed_lo, seed_hi, stream, block0, cuda.local.array(1, np.int64))
    if launch.SIMULATOR:
        return cuda.jit(kernel)
    # ptxas keeps the Philox round keys in registers when it may: held to the grid's
    # resident blocks per SM (64 registers a thread), it makes them again instead
    return cuda.jit(kernel, launch_bounds=(THREADS, launch.BLOCKS_PER_SM))  # pragma: no cover


def kernel_signature(out_bytes: int, in_bytes: int = 4, count: bool = False) -> str:
    """numba's signature of a specialised kernel: float32 bits or 16-bit codes in, float32
    bits or packed codes of ``out_bytes`` out, n and the keys, and (``count``) the counters:
    19 flat launch arguments uncounted, each about 0.45 µs of host time on an H200."""
    return (f"void(int{8 * in_bytes}[::1], int{8 * out_bytes}[::1], int64, int64, int64, "
            f"int64, int64{', int64[::1]' if count else ''})")


#: (format, rounding, k, packing, counting, source) -> its kernel (profile_cuda.py and
#: kernel_budget.py read these)
KERNELS: dict = {}


def kernel(fmt, rounding: str, k: int, sp=NO_PACKING, count: bool = False, half: int = 0):
    """The specialised kernel of (parsed format, rounding, sr_bits as k, storage packing
    parameters, counting, source: 0 float32 or lpsim.storage's 16-bit code kinds), made
    once."""
    key = (fmt, rounding, k, sp, count, half)
    found = KERNELS.get(key)
    if found is None:
        mode = mode_code(rounding)
        found = KERNELS[key] = _make(kernel_params(fmt, np.float32), mode, k, sp, count, half,
                                     mode == NEAREST and not count and nearest32_exact(fmt))
    return found


def eligible(n: int, x_ptr: int, out_ptr: int, mode: int, offset: int,
             out_bytes: int = 4, in_bytes: int = 4) -> bool:
    """Whether a call can take the specialised kernel: x (of ``in_bytes`` per element:
    float32, or 16-bit codes) and out (``out_bytes``) aligned to their four elements' wide
    access, out either x itself (same width) or disjoint from it, and (stochastic) Philox
    blocks that start at a group's first element."""
    if x_ptr % (GROUP * in_bytes) or out_ptr % (GROUP * out_bytes):
        return False
    if launch.overlaps_apart(x_ptr, in_bytes, out_ptr, out_bytes, n):
        return False
    return mode < STOCHASTIC or offset % GROUP == 0


#: blocks an SM the rounding kernels' grid may take: several waves of blocks, not one.
#: These kernels stream (one 16-byte load and store a group) with 25-35 registers, and a
#: wider grid moved more bytes: 2**26 float32 to bf16 on an H200, 3185 GB/s at 8 blocks an
#: SM against 3529 at 64 (stochastic 3158 against 3468); on an H100 2517 against 2609
#: (benchmarks/results/profile-gpu.txt, its grid-cap rows; copy 4008 and 2881 GB/s)
STREAM_BLOCKS_PER_SM = 64


def grid(n: int, device: int) -> int:
    """Blocks for n elements: one group of four per thread, at most
    :data:`STREAM_BLOCKS_PER_SM` blocks an SM (the loop strides over the rest)."""
    return launch.grid_size(-(-n // GROUP), device, STREAM_BLOCKS_PER_SM)


def launch_arrays(kern, grid_blocks: int, stream, xb, outb, n, seed_lo, seed_hi, key_stream,
                  block0, counts=None) -> None:
    """Launch through numba's dispatcher (numba arrays; the simulator's only route);
    ``counts``: the counting kernel's counters (None: the kernel without them)."""
    tail = () if counts is None else (counts,)
    launch.configured(kern, grid_blocks, stream)(xb, outb, n, seed_lo, seed_hi, key_stream,
                                                 block0, *tail)


# --- the cached route of torch tensors: numba's launch without its per-call typing ---------

def _array_arguments(ptr: int, n: int, itemsize: int = 4) -> list:
    """The flat kernel arguments numba passes for a 1-D C-contiguous integer array of n
    elements at ``ptr``: meminfo, parent, nitems, itemsize, data, shape, strides."""
    return [0, 0, n, itemsize, ptr, n, itemsize]


def _scalars(*values) -> list:
    return [ctypes.c_int64(v) for v in values]


def _numba_arguments(compiled, args, stream) -> list:
    """The flat argument list numba's own launch builds for ``args`` (the reference the
    route's list is checked against once per route)."""
    flat, keep = [], []
    for t, v in zip(compiled.argument_types, args):
        compiled._prepare_args(t, v, stream, keep, flat)
    return flat


def _same(a: list, b: list) -> bool:
    def value(v):
        return (type(v).__name__, v.value) if isinstance(v, ctypes._SimpleCData) else \
            ("int", int(v))
    return len(a) == len(b) and all(value(u) == value(v) for u, v in zip(a, b))


class Route:
    """One (format, rounding, sr_bits, device)'s compiled kernel as a raw launch: numba's
    function handle and launch configurations, built once; :meth:`__call__` launches it
    with the flat arguments of two torch tensors' data pointers and the keys."""

    def __init__(self, kern, mode: int, out_bytes: int, signature=None, in_bytes: int = 4):
        from cuda.core import LaunchConfig, launch as core_launch
        from numba.cuda._compat import CUDA_CORE_GE_1_0
        self._core_launch = core_launch
        # numba's compiled kernel (``signature``: another kernel's than the quantize one's)
        self.compiled = kern.compile(kernel_signature(out_bytes, in_bytes)
                                     if signature is None else signature)
        self.out_bytes, self.in_bytes = out_bytes, in_bytes
        self.function = self.compiled._codelibrary.get_cufunc().kernel
        self.mode = mode
        self._configs = {}
        self._config_kind = (LaunchConfig, CUDA_CORE_GE_1_0)
        self._block = None              # its ParamBlock, made at the first launch

    def launch(self, stream, blocks: int, flat) -> None:
        """Launch with ``flat`` (this route's flat arguments) on ``blocks`` blocks: packed
        into the route's ParamBlock and given to the driver (:mod:`lpsim_cuda.raw_launch`),
        else through cuda.core."""
        block = self._block
        if block is None:
            try:
                block = self._block = raw_launch.ParamBlock(flat)
            except TypeError:           # a kind it does not pack: cuda.core converts it
                block = self._block = False
        if block is False or not raw_launch.launch(block, self.function, blocks, THREADS,
                                                   stream, flat):
            self._core_launch(stream, self.config(blocks), self.function, *flat)

    def config(self, blocks: int):
        found = self._configs.get(blocks)
        if found is None:
            LaunchConfig, new_names = self._config_kind
            extra = {"is_cooperative": False} if new_names else {"cooperative_launch": False}
            found = self._configs[blocks] = LaunchConfig(grid=(blocks, 1, 1),
                                                         block=(THREADS, 1, 1), shmem_size=0,
                                                         **extra)
        return found

    def arguments(self, x_ptr, out_ptr, n, keys) -> list:
        return (_array_arguments(x_ptr, n, self.in_bytes)
                + _array_arguments(out_ptr, n, self.out_bytes) + _scalars(n, *keys))

    def check(self, xb, outb, n, keys, stream) -> bool:
        """Whether this route's flat arguments are numba's own for the same (uncounted)
        call."""
        mine = self.arguments(launch.address(xb), launch.address(outb), n, keys)
        return _same(mine, _numba_arguments(self.compiled, (xb, outb, n, *keys), stream))

    def __call__(self, x_ptr, out_ptr, n, keys, stream, blocks):
        self.launch(stream, blocks, self.arguments(x_ptr, out_ptr, n, keys))


class CountedRoute(Route):
    """A counted call's route: the counting kernel as a raw launch, the stats object's
    accumulator on the device (:func:`lpsim_cuda.counters.launch_counts`) an argument of
    each call.  Telemetry counts every quantization of a simulated training step, and a
    counted call took numba's launch and a plan each time."""

    def __init__(self, kern, mode: int, out_bytes: int, in_bytes: int = 4):
        super().__init__(kern, mode, out_bytes, kernel_signature(out_bytes, in_bytes, True),
                         in_bytes)

    def counted_arguments(self, x_ptr, out_ptr, n, keys, counts) -> list:
        return (self.arguments(x_ptr, out_ptr, n, keys)
                + _array_arguments(launch.address(counts), counts.size, 8))

    def check(self, xb, outb, n, keys, stream, counts=None) -> bool:
        """Whether the route's flat arguments are numba's own for the same counted call."""
        mine = self.counted_arguments(launch.address(xb), launch.address(outb), n, keys,
                                      counts)
        return _same(mine, _numba_arguments(self.compiled, (xb, outb, n, *keys, counts),
                                            stream))

    def __call__(self, x_ptr, out_ptr, n, keys, stream, blocks, counts):
        self.launch(stream, blocks, self.counted_arguments(x_ptr, out_ptr, n, keys, counts))


#: (format as the caller gave it, rounding, sr_bits, device) -> Route, or None where numba's
#: flat arguments differed from the route's (that request then keeps the general launch)
_ROUTES: dict = {}
#: the same for counted calls (CountedRoute)
_COUNTED: dict = {}
#: route key -> why it has no raw route (the request keeps numba's launch, which is correct)
ROUTE_ERRORS: dict = {}


def keep_route(routes: dict, errors: dict, key, build) -> None:
    """Build a request's raw route once and keep it in ``routes`` under ``key``: ``build()``
    gives (route, whether its flat arguments are numba's); None is kept where they differ or
    the build fails (the reason in ``errors``), so the request keeps numba's launch.  At
    most 1024 routes; unhashable keys (and the simulator) make none."""
    if launch.SIMULATOR:
        return
    try:
        if key in routes or len(routes) >= 1024:
            return
    except TypeError:
        return
    try:
        route, ok = build()
    except Exception as error:          # noqa: BLE001 (a numba-cuda without these internals)
        errors[key] = repr(error)
        route, ok = None, False
    if not ok:
        errors.setdefault(key, "flat arguments differ from numba's")
    routes[key] = route if ok else None


def remember(key, rounding, sr_bits, storage, src, outb, kern, keys, counts=None) -> None:
    """After a general-path call took the specialised kernel for a torch tensor, build and
    check the raw route of its request so that later calls skip the general path
    (``counts``: a counted call's counters array, for its CountedRoute)."""
    def build():
        route = (Route(kern, mode_code(rounding), outb.dtype.itemsize,
                       in_bytes=src.bits.dtype.itemsize) if counts is None else
                 CountedRoute(kern, mode_code(rounding), outb.dtype.itemsize,
                              src.bits.dtype.itemsize))
        route.torch_dtype = None if storage is None else _torch_dtype(storage_name(storage))
        if counts is not None:
            return route, route.check(src.bits, outb, src.bits.size, keys, src.stream, counts)
        return route, route.check(src.bits, outb, src.bits.size, keys, src.stream)
    keep_route(_ROUTES if counts is None else _COUNTED, ROUTE_ERRORS,
               (key, rounding, sr_bits, type(sr_bits), storage, src.device, src.half), build)


def _torch_dtype(name: str):
    import torch
    return getattr(torch, name)


def route_of(x, fmt, rounding, sr_bits, storage=None, counted: bool = False):
    """The cached route of a torch tensor's request (its format as given, rounding, sr_bits,
    storage, device and dtype; ``counted``: a counted call's), or None: a dictionary lookup,
    nothing checked or launched."""
    import torch
    routes = _COUNTED if counted else _ROUTES
    if not routes:
        return None
    half = 0 if x.dtype is torch.float32 else arrays.half_kind(x.dtype)
    if half == 0 and x.dtype is not torch.float32:
        return None
    try:
        return routes.get((fmt, rounding, sr_bits, type(sr_bits), storage, x.device.index,
                           half))
    except TypeError:                   # an unhashable format or sr_bits: the general path
        return None


def torch_call(x, fmt, rounding, seed, stream, sr_bits, out, offset, storage=None,
               stats=None, route=None):
    """A torch float32 (or bfloat16, float16) CUDA call through its cached route: the
    result, or None where the call needs the general path (no route yet, or anything a
    route does not cover).  ``stats`` (checked by the caller): a counted call's route, which
    adds the call's counters to the stats object's accumulator on the device.  ``route``:
    the request's, where the caller looked it up (:func:`route_of`)."""
    import torch
    if not x.is_cuda:
        return None
    if route is None:
        route = route_of(x, fmt, rounding, sr_bits, storage, stats is not None)
    device = x.device.index
    n = x.numel()
    if (route is None or n == 0 or not x.is_contiguous() or x.is_neg()
            or device != torch.cuda.current_device()
            or type(offset) is not int or offset < 0 or offset + n > MAX_COUNTER):
        return None
    want = torch.float32 if route.torch_dtype is None else route.torch_dtype
    if out is None:                     # x is contiguous: so is its like (and cheaper made)
        out = torch.empty_like(x, dtype=want)
    elif (type(out) is not torch.Tensor or out.dtype is not want
          or out.device != x.device or out.shape != x.shape or not out.is_contiguous()
          or out.is_neg()):
        return None
    mode = route.mode
    x_ptr, out_ptr = x.data_ptr(), out.data_ptr()
    if not eligible(n, x_ptr, out_ptr, mode, offset, route.out_bytes, route.in_bytes):
        return None
    seed_lo, seed_hi, key_stream = keys(seed, stream, mode)
    route_keys = (seed_lo, seed_hi, key_stream, offset // GROUP)
    handle = launch.torch_stream_handle(device)
    if stats is None:
        route(x_ptr, out_ptr, n, route_keys, _core_stream(handle), grid(n, device))
        return out
    counts, _ = counters.launch_counts(stats, device, launch.external_stream(handle),
                                       lambda: launch.capturing(x))
    route(x_ptr, out_ptr, n, route_keys, _core_stream(handle), grid(n, device), counts)
    return out


@functools.lru_cache(maxsize=64)
def _core_stream(handle: int):
    """cuda.core's stream of a torch stream handle, as numba's launch makes it."""
    from numba.cuda.cudadrv.driver import _to_core_stream
    return _to_core_stream(launch.external_stream(handle))
