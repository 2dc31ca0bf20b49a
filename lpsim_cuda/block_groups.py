"""Calls of the block-group kernels (:mod:`lpsim_cuda.block_kernels`): which calls take
them, their launches (numba's, or the cached raw routes of torch tensors' requests), NVFP4's
tensor scale found on the device, and the counters a counted call adds to.

Why: a block call's host time was its largest cost once the kernels ran near a copy's speed
(an NVFP4 call without a route: 407 µs on an H200), so a torch tensor's request keeps its
launch as a route: numba's compiled function and the flat arguments numba would pass,
checked once against numba's own.  Float32 data (or 16-bit codes) blocked along its
contiguous last axis take these kernels; other layouts, float64 and tails the block does not
divide take the general kernel (:mod:`lpsim_cuda.blocks`).
"""

from __future__ import annotations

import ctypes

import numpy as np
from numba import cuda, njit

from lpsim.blocks.amax import checked_tensor_scale, min_tensor_scale
from lpsim.blocks.counters import BLOCK_COUNTERS, add_launched
from lpsim.blocks.word_counts import clip_bounds
from lpsim.blocks.decisions import block_params, words_exact
from lpsim.blocks.formats import parse_block_format
from lpsim.request import MAX_COUNTER, keys, plan
from lpsim.rounding import kernel_params

from . import arrays, counters, launch, specialised, tensor_amax
from .block_kernels import KERNELS, eligible, kernel, lanes_of, layout_of  # noqa: F401
from .tensor_amax import ENQUEUE, device_tensor_scale

def launch_flat(bfmt, request, pts: float, xb, outf, n: int, ts=None, half: int = 0,
                counts=None):
    """Fake-quantize the n float32 values whose bits are the flat int32 device array ``xb``
    into ``outf`` on the default stream, as the general block kernel does
    (:mod:`lpsim_cuda.blocks` launches there); ``ts``: the per-tensor scale as a device array
    (:func:`device_tensor_scale`), which then takes the place of ``pts``.  ``half``: ``xb``
    holds bfloat16 or float16 codes (lpsim.storage's kinds).
    ``counts``: a device int64 array of the nine BLOCK_COUNTERS the counting kernel adds
    the call's into, then the two clip bounds it reads (None: the kernel without counters;
    :func:`lpsim_cuda.counters.launch_block_counts`)."""
    kern = kernel(bfmt, request.mode, request.k, request.params.W, ts is not None, half,
                  counts is not None)
    bp = block_params(bfmt, pts)
    arrays_ = ()
    if ts is not None or counts is not None:          # the kernel that takes them
        arrays_ = (launch.placeholder((2,), np.float64) if ts is None else ts,
                   launch.placeholder((len(BLOCK_COUNTERS),), np.int64) if counts is None
                   else counts)
    blocks = launch.grid_size(-(-n // 4), launch.current_device())
    launch.configured(kern, blocks)(xb, outf, n, bp.pts, bp.pts_inv, request.seed_lo,
                                    request.seed_hi, request.stream, request.offset // 4,
                                    *arrays_)


# --- the cached route of torch tensors (lpsim_cuda.specialised's, for these kernels) ---------

def _signature(tail: bool = False, in_bytes: int = 4):
    """numba's argument types of the block kernels: the bits (float32's, or ``in_bytes`` 2:
    16-bit codes), the result, n, the per-tensor scale and its reciprocal, the keys, and
    (``tail``: a kernel that reads a scale on the device or counts) the device scale and the
    counters.  21 flat launch arguments, 35 with the tail: each costs host time, about
    0.45 µs on an H200."""
    from numba.core import types
    bits = types.int32 if in_bytes == 4 else types.int16
    head = (bits[::1], types.float32[::1], types.int64, types.float64, types.float64,
            types.int64, types.int64, types.int64, types.int64)
    return head + (types.float64[::1], types.int64[::1]) if tail else head


class BlockRoute(specialised.Route):
    """One (block format, rounding, sr_bits, device)'s kernel as a raw launch, for formats
    without a per-tensor scale (its BlockParams are then fixed): numba's function handle and
    the flat arguments numba would build, checked once against numba's own.  A kernel with
    the tail (``ts``: a device scale, counters) takes each counted call's counters array
    (``counts``: the stats object's accumulator on the device) in the stand-in's place."""

    def __init__(self, kern, mode: int, bp, bfmt, ts=None, half: int = 0):
        in_bytes = 2 if half else 4             # float32, or bfloat16 or float16 codes
        super().__init__(kern, mode, 4, _signature(ts is not None, in_bytes), in_bytes)
        self.scale, self.bfmt = (bp.pts, bp.pts_inv), bfmt
        # the tensor scale a device_pts kernel reads (ScaledBlockRoute's) and the counters it
        # takes too (a stand-in, unwritten, where the call is uncounted); a plain kernel
        # takes neither
        self.tail = () if ts is None else (ts, launch.placeholder((len(BLOCK_COUNTERS),),
                                                                  np.int64))

    def fix(self) -> None:
        """The flat arguments that stay from call to call: the scales', the tail's."""
        array = specialised._array_arguments
        self.scale_flat = [ctypes.c_double(v) for v in self.scale]
        self.tail_flat = [v for a in self.tail for v in array(launch.address(a), a.size, 8)]

    def arguments(self, x_ptr, out_ptr, n, keys, counts=None, scale=None) -> list:
        """The flat arguments of one launch; ``scale``: this call's (pts, pts_inv) where the
        caller gave NVFP4's tensor scale (the route's own otherwise)."""
        array = specialised._array_arguments
        tail = self.tail_flat if counts is None else \
            self.tail_flat[:7] + array(launch.address(counts), counts.size, 8)
        scale_flat = self.scale_flat if scale is None else [ctypes.c_double(v) for v in scale]
        return (array(x_ptr, n, self.in_bytes) + array(out_ptr, n) + specialised._scalars(n)
                + scale_flat + specialised._scalars(*keys) + tail)

    def check(self, xb, outf, n, keys, stream, counts=None) -> bool:
        """Whether the route's flat arguments are numba's own for the same launch."""
        self.fix()
        mine = self.arguments(launch.address(xb), launch.address(outf), n, keys, counts)
        tail = self.tail if counts is None else (self.tail[0], counts)
        return specialised._same(mine, specialised._numba_arguments(
            self.compiled, (xb, outf, n, *self.scale, *keys, *tail), stream))

    def __call__(self, x_ptr, out_ptr, n, keys, stream, blocks, counts=None, scale=None):
        self.launch(stream, blocks, self.arguments(x_ptr, out_ptr, n, keys, counts, scale))


#: (block format as given, rounding, sr_bits, its type, device, 16-bit kind, tensor scale
#: given) -> BlockRoute, or None where numba's flat arguments differed (the request keeps
#: numba's launch).  A route of a given tensor scale takes each call's scale as arguments
_ROUTES: dict = {}
#: route key -> why it has no raw route
ROUTE_ERRORS: dict = {}


class ScaledBlockRoute:
    """NVFP4 whose tensor scale is found on the device, as three raw launches enqueued
    together (:data:`lpsim_cuda.tensor_amax.ENQUEUE`): the amax kernel (of float32 data,
    or of ``half``'s 16-bit codes), the one-thread scale kernel and the block kernel that
    reads the scale from the device's scratch, each checked once against numba's own flat
    arguments."""

    def __init__(self, kern, mode: int, bp, bfmt, half: int = 0):
        import numba
        from numba.core import types
        self.bfmt, self.mode = bfmt, mode
        self.amax_array, self.ts = tensor_amax.scratch()
        self.block = BlockRoute(kern, mode, bp, bfmt, self.ts, half)
        self.in_bytes = self.block.in_bytes
        self.amax = specialised.Route(
            tensor_amax.amax_codes_kernel(half) if half else tensor_amax.amax32_kernel, mode,
            4, (types.int16[::1] if half else types.int32[::1], types.int64[::1]))
        # the scale kernel's arguments as device_tensor_scale passes them (the divisor is a
        # float32): the route compiles the specialisation numba's dispatch picks for them
        self.scalars = (bfmt.tensor_scale_divisor, min_tensor_scale(bfmt))
        self.scale = specialised.Route(tensor_amax.tensor_scale_kernel, mode, 4, tuple(
            numba.typeof(v) for v in (self.amax_array, *self.scalars, self.ts)))
        self.bounds = _bounds(bfmt, 1.0, True)          # a counted call's: asked of the scale

    def check(self, xb, outf, n, keys, stream, counts=None) -> bool:
        """Whether the three launches' kernels are those numba's dispatch picks for the same
        call and their flat arguments numba's own."""
        import numba
        from numba.core import types
        array = specialised._array_arguments
        self.amax_flat = array(launch.address(self.amax_array), 1, 8)
        scalar = {types.float32: ctypes.c_float, types.float64: ctypes.c_double}
        self.scale_flat = (self.amax_flat
                           + [scalar[t](v) for t, v in zip(
                               self.scale.compiled.argument_types[1:3], self.scalars)]
                           + array(launch.address(self.ts), 2, 8))
        amax_args = (xb, self.amax_array)
        scale_args = (self.amax_array, *self.scalars, self.ts)
        tail = self.block.tail if counts is None else (self.ts, counts)
        block_args = (xb, outf, n, *self.block.scale, *keys, *tail)
        typed = all(tuple(map(numba.typeof, args)) == tuple(route.compiled.argument_types)
                    for route, args in ((self.amax, amax_args), (self.scale, scale_args),
                                        (self.block, block_args)))
        return (typed and self.block.check(xb, outf, n, keys, stream, counts)
                and specialised._same(array(launch.address(xb), n, self.in_bytes)
                                      + self.amax_flat,
                                      specialised._numba_arguments(self.amax.compiled,
                                                                   amax_args, stream))
                and specialised._same(self.scale_flat, specialised._numba_arguments(
                    self.scale.compiled, scale_args, stream)))

    def __call__(self, x_ptr, out_ptr, n, keys, stream, blocks, counts=None):
        amax, scale = self.amax, self.scale
        with tensor_amax.ENQUEUE:
            amax.launch(stream, blocks, specialised._array_arguments(x_ptr, n, self.in_bytes)
                        + self.amax_flat)
            scale.launch(stream, 1, self.scale_flat)
            self.block(x_ptr, out_ptr, n, keys, stream, blocks, counts)


class CountedBlockRoute(BlockRoute):
    """A counted call's route, for formats without a per-tensor scale (MX): the counting
    kernel as a raw launch, its counters array (the stats object's accumulator on the
    device, :func:`lpsim_cuda.counters.launch_block_counts`) an argument of each call and
    its clip bounds the format's.  A counted call took numba's launch and a plan every
    time (telemetry counts every quantization of a simulated training step)."""

    def __init__(self, kern, mode: int, bp, bfmt, half: int = 0):
        super().__init__(kern, mode, bp, bfmt, launch.placeholder((2,), np.float64), half)
        self.bounds = _bounds(bfmt, 1.0)


#: route key -> CountedBlockRoute or (NVFP4) ScaledBlockRoute, or None (numba's launch), as
#: _ROUTES for counted calls
_COUNTED: dict = {}


def _remember(given, rounding, sr_bits, device, kern, mode, bp, xb, outf, n, keys,
              route_class=BlockRoute, counts=None, half: int = 0,
              given_scale: bool = False) -> None:
    """After a torch tensor's call took these kernels (a format without a per-tensor
    scale, or NVFP4 with the caller's (``given_scale``): BlockRoute; NVFP4 whose scale was
    found on the device: ScaledBlockRoute), of float32 data or (``half``) of 16-bit codes,
    build and check its request's route, keyed on the format as the caller gave it and the
    tensor's kind."""
    def build():
        route = route_class(kern, mode, bp, parse_block_format(given), half=half)
        return route, route.check(xb, outf, n, keys, 0, counts)
    specialised.keep_route(_ROUTES if counts is None else _COUNTED, ROUTE_ERRORS,
                           (given, rounding, sr_bits, type(sr_bits), device, half,
                            given_scale), build)


def route_of(x, bfmt, rounding, sr_bits, counted: bool = False, given_scale: bool = False):
    """The cached route of a float32, bfloat16 or float16 torch tensor's request (its block
    format as given, rounding, sr_bits, device and kind; ``counted``: a counted call's;
    ``given_scale``: a call with NVFP4's tensor scale given), or None: a dictionary lookup,
    nothing checked or launched."""
    import torch
    routes = _COUNTED if counted else _ROUTES
    if not routes:
        return None
    half = 0 if x.dtype is torch.float32 else arrays.half_kind(x.dtype)
    if not half and x.dtype is not torch.float32:
        return None
    try:
        return routes.get((bfmt, rounding, sr_bits, type(sr_bits), x.device.index, half,
                           given_scale))
    except TypeError:                   # an unhashable format or sr_bits: the general path
        return None


def torch_call(x, bfmt, rounding, axis, seed, stream, sr_bits, out, offset, stats=None,
               route=None, tensor_scale=None):
    """A float32 (bfloat16, float16) torch CUDA call through its cached route: the result
    (float32), or None where the call needs the general path (no route yet, or anything a
    route does not cover).
    ``stats`` (checked by the caller): a counted call's route, which adds the call's
    counters to the stats object's accumulator on the device.  ``route``: the request's,
    where the caller looked it up (:func:`route_of`).  ``tensor_scale``: NVFP4's per-tensor
    scale as the caller gives it (refused by the caller where the format has none),
    uncounted calls only: the counters' clip bounds follow the scale."""
    import torch
    if not x.is_cuda or (tensor_scale is not None and stats is not None):
        return None
    if route is None:
        route = route_of(x, bfmt, rounding, sr_bits, stats is not None,
                         tensor_scale is not None)
    device = x.device.index
    n = x.numel()
    if (route is None or n == 0 or not x.is_contiguous()
            or (x.ndim > 1 and axis not in (-1, x.ndim - 1))
            or device != torch.cuda.current_device()
            or launch.torch_stream_handle(device) != 0       # the kernels' default stream
            or type(offset) is not int or offset < 0 or offset + n > MAX_COUNTER):
        return None
    if out is None:
        out = torch.empty_like(x, dtype=torch.float32)
    elif (type(out) is not torch.Tensor or out.dtype is not torch.float32
          or out.device != x.device or out.shape != x.shape or not out.is_contiguous()):
        return None
    length = x.shape[-1] if x.ndim else 1
    x_ptr, out_ptr = x.data_ptr(), out.data_ptr()
    if not eligible(route.bfmt, length, n, x_ptr, out_ptr, route.mode, offset,
                    route.in_bytes):
        return None
    seed_lo, seed_hi, key_stream = keys(seed, stream, route.mode)
    route_keys = (seed_lo, seed_hi, key_stream, offset // 4)
    blocks = launch.grid_size(-(-n // 4), device)
    if stats is None and tensor_scale is None:
        route(x_ptr, out_ptr, n, route_keys, specialised._core_stream(0), blocks)
        return out
    if stats is None:                        # a BlockRoute: the general path's scale, errors
        bp = block_params(route.bfmt, checked_tensor_scale(tensor_scale, route.bfmt))
        route(x_ptr, out_ptr, n, route_keys, specialised._core_stream(0), blocks, None,
              (bp.pts, bp.pts_inv))
        return out
    counts = counters.launch_block_counts(stats, device, 0, lambda: launch.capturing(x),
                                          BLOCK_COUNTERS, route.bounds)
    route(x_ptr, out_ptr, n, route_keys, specialised._core_stream(0), blocks, counts)
    return _counted(out, stats, n, route.bfmt)


def quantize(x, bfmt, rounding, axis, seed, stream, sr_bits, out, offset, tensor_scale,
             stats=None):
    """:func:`lpsim_cuda.blocks.quantize` through these kernels: the result, or None where
    the call needs the general kernel (its checks and errors run there).  A torch bfloat16
    or float16 tensor's codes are read directly (a float32 result), also where NVFP4's
    tensor scale is to be found (its amax from the codes, on the device).  ``stats`` (checked by the
    caller): the counting kernel adds the call's counters to its accumulator on the device,
    read when ``stats`` is."""
    given, bfmt = bfmt, parse_block_format(bfmt)
    half = 0
    if launch.is_torch(x):
        import torch
        half = arrays.half_kind(x.dtype)
        if ((x.dtype is not torch.float32 and not half) or not x.is_cuda
                or not x.is_contiguous() or (x.ndim > 1 and axis not in (-1, x.ndim - 1))):
            return None
        if out is not None and (not launch.is_torch(out) or out.dtype is not torch.float32
                                or out.shape != x.shape or out.device != x.device
                                or not out.is_contiguous()):
            return None
        # the general kernel launches on the default stream after numba waited for the
        # tensor's: here a tensor on another current stream takes that route
        if torch.cuda.current_stream(x.device).cuda_stream != 0:
            return None
    elif not (cuda.devicearray.is_cuda_ndarray(x) and x.dtype == np.float32
              and x.is_c_contiguous() and (x.ndim <= 1 or axis in (-1, x.ndim - 1))
              and out is None):
        return None
    n = x.numel() if launch.is_torch(x) else x.size
    length = x.shape[x.ndim - 1] if x.ndim else 1
    if n == 0:
        return None
    with launch.device_of(x):
        request = plan(bfmt.saturating_element, rounding, np.float32, seed=seed,
                       stream=stream, sr_bits=sr_bits, offset=offset, size=n)
        result = out
        if result is None:
            result = x.new_empty(x.shape, dtype=torch.float32) if launch.is_torch(x) else \
                cuda.device_array(x.shape, np.float32)
        outf = _flat(result)
        if half:
            xb = arrays._torch_bits(x)
            if not eligible(bfmt, length, n, launch.address(xb), launch.address(outf),
                            request.mode, request.offset, 2):
                return None
        else:
            xf = _flat(x)
            if not eligible(bfmt, length, n, launch.address(xf), launch.address(outf),
                            request.mode, request.offset):
                return None
        found = bfmt.tensor_scale and tensor_scale is None       # NVFP4's, on the device
        counts = None if stats is None else counters.launch_block_counts(
            stats, launch.current_device(), 0, lambda: launch.capturing(x), BLOCK_COUNTERS,
            _bounds(bfmt, 1.0 if found or not bfmt.tensor_scale else
                    checked_tensor_scale(tensor_scale, bfmt), found))
        route_keys = (request.seed_lo, request.seed_hi, request.stream, request.offset // 4)
        if half and found:                  # the scale of the codes' values, on the device
            with ENQUEUE:
                launch_flat(bfmt, request, 1.0, xb, outf, n,
                            device_tensor_scale(xb, bfmt, half), half=half, counts=counts)
            if launch.is_torch(x):
                _remember(given, rounding, sr_bits, x.device.index,
                          kernel(bfmt, request.mode, request.k, request.params.W, True, half,
                                 counts is not None), request.mode, block_params(bfmt, 1.0),
                          xb, outf, n, route_keys, ScaledBlockRoute, counts, half)
            return _counted(result, stats, n, bfmt)
        if half:
            pts = checked_tensor_scale(tensor_scale, bfmt) if bfmt.tensor_scale else 1.0
            launch_flat(bfmt, request, pts, xb, outf, n, half=half, counts=counts)
            if launch.is_torch(x) and (not bfmt.tensor_scale or counts is None):
                _remember(given, rounding, sr_bits, x.device.index,
                          kernel(bfmt, request.mode, request.k, request.params.W, False, half,
                                 counts is not None), request.mode, block_params(bfmt, pts),
                          xb, outf, n, route_keys,
                          BlockRoute if counts is None else CountedBlockRoute, counts, half,
                          bool(bfmt.tensor_scale))
            return _counted(result, stats, n, bfmt)
        pts = 1.0
        xb = xf.view(np.int32)
        if found:
            with ENQUEUE:                                  # nothing comes back to the host
                launch_flat(bfmt, request, pts, xb, outf, n, device_tensor_scale(xf, bfmt),
                            counts=counts)
            if launch.is_torch(x):
                _remember(given, rounding, sr_bits, x.device.index,
                          kernel(bfmt, request.mode, request.k, request.params.W, True, 0,
                                 counts is not None), request.mode, block_params(bfmt, pts),
                          xb, outf, n, route_keys, ScaledBlockRoute, counts)
            return result if stats is None else _counted(result, stats, n, bfmt)
        if bfmt.tensor_scale:
            pts = checked_tensor_scale(tensor_scale, bfmt)
        launch_flat(bfmt, request, pts, xb, outf, n, counts=counts)
        if stats is not None:
            if launch.is_torch(x) and not bfmt.tensor_scale:
                _remember(given, rounding, sr_bits, x.device.index,
                          kernel(bfmt, request.mode, request.k, request.params.W, False, 0,
                                 True), request.mode, block_params(bfmt, pts), xb, outf, n,
                          route_keys, CountedBlockRoute, counts)
            return _counted(result, stats, n, bfmt)
        if launch.is_torch(x):
            _remember(given, rounding, sr_bits, x.device.index,
                      kernel(bfmt, request.mode, request.k, request.params.W), request.mode,
                      block_params(bfmt, pts), xb, outf, n, route_keys,
                      given_scale=bool(bfmt.tensor_scale))
    return result


@njit(cache=True)
def _clip_bounds(bp, sp):
    return clip_bounds(bp, sp)


def _bounds(bfmt, pts: float, scale_found: bool = False) -> tuple:
    """The counting kernel's clip bounds (lo, hi): the largest magnitude's bits outside
    which a block's scale is clipped (:func:`lpsim.blocks.word_counts.clip_bounds`, compiled
    for the CPU; where the float32 steps apply and a format has smin < smax, else zeros: the
    kernel then asks block_scale, as it does for a tensor scale found on the device,
    ``scale_found``).  They follow the nine counters in the accumulator the kernel adds to
    (:func:`lpsim_cuda.counters.launch_block_counts`)."""
    bp = block_params(bfmt, pts)
    if not scale_found and words_exact(bfmt) and bp.smin < bp.smax:
        lo, hi = _clip_bounds(bp, kernel_params(bfmt.scale, np.float64))
        return int(lo), int(hi)
    return 0, 0


def _counted(result, stats, n: int, bfmt):
    """``result``, after the call's elements and blocks are added to ``stats`` (its
    counters stay on the device until ``stats`` is read)."""
    add_launched(stats, n, n // bfmt.block)
    return result


def _flat(a):
    """A 1-D numba float32 view of a contiguous torch tensor or numba array."""
    if launch.is_torch(a):
        return arrays._torch_bits(a).view(np.float32)
    return a.reshape(a.size)


__all__ = ["BlockRoute", "ScaledBlockRoute", "eligible", "kernel", "lanes_of", "launch_flat",
           "layout_of", "quantize", "torch_call"]
