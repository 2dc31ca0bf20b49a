"""A float32 or float64 CUDA array's largest finite magnitude, and NVFP4's per-tensor scale
from it, found on the device.

Why: NVFP4 scales each tensor by its amax before its blocks.  Reduced on the device, with
16-byte loads and one atomic per warp, the amax never travels to the host: the scale kernel
reads it and writes the scale and its reciprocal where the block kernel reads them, so a call
waits for nothing.  The block kernels of :mod:`lpsim_cuda.block_groups` and the general
kernel of :mod:`lpsim_cuda.blocks` share it.
"""

from __future__ import annotations

import threading

import numpy as np
from numba import cuda

from lpsim.blocks.amax import container_bits, finite_bits, min_tensor_scale, scale_of_amax32
from lpsim.blocks.decisions import bits_value
from lpsim.storage import code_bits
from lpsim.word32 import as_int64, word

from . import launch, vector
from .launch import FULL_MASK, SIMULATOR

#: float32 magnitude bits of inf: finite magnitudes lie below
INF32 = 0x7F800000


@cuda.jit(device=True)
def finite32(b):
    """:func:`lpsim.blocks.amax.finite_bits` of float32 bits ``b``, in 32-bit words."""
    return finite_bits(word(b), 0x7FFFFFFF, INF32)


if SIMULATOR:
    @cuda.jit(device=True)
    def _add_max(out, am):
        """out[0] = max(out[0], am) (the simulator has no shuffles: one atomic a thread)."""
        cuda.atomic.max(out, 0, am)
else:
    @cuda.jit(device=True)
    def _add_max(out, am):
        """The warp's largest ``am`` by butterfly shuffles, one atomic max by its first lane
        (a grid of resident threads sending one atomic each to one address serialises)."""
        width = 16
        while width > 0:
            am = max(am, cuda.shfl_xor_sync(FULL_MASK, am, width))
            width >>= 1
        if cuda.laneid == 0:
            cuda.atomic.max(out, 0, am)


def _make_amax(half: int):
    """The amax kernel of float32 bits (``half`` 0) or of bfloat16 or float16 codes
    (``half``: lpsim.storage's kind, compiled in; each widened to its float32 bits exactly by
    :func:`lpsim.storage.code_bits`): out[0] = the largest finite magnitude bits, four
    elements per thread and pass by one 16-byte load (8 bytes of codes; aligned to it),
    compared as 32-bit words, the last n % 4 one per thread; one atomic max per warp.

    The passes run from the array's end to its start (a warp's loads still one contiguous
    run): the block kernel that reads the array next starts at its start, which this pass
    read last, so a device's L2 still holds it (NVFP4's found scale reads the data twice;
    a largest value does not depend on the order it is read in)."""
    HALF = half

    @cuda.jit(device=True)
    def magnitude(b):
        return finite32(code_bits(b, HALF) if HALF else b)

    @cuda.jit
    def amax_kernel(bits, out):
        am = word(0)
        groups = bits.size >> 2
        i = cuda.grid(1)
        while i < groups:
            b0, b1, b2, b3 = vector.load4(bits, groups - 1 - i)
            am = max(am, max(max(magnitude(b0), magnitude(b1)),
                             max(magnitude(b2), magnitude(b3))))
            i += cuda.gridsize(1)
        i = (groups << 2) + cuda.grid(1)
        if i < bits.size:
            am = max(am, magnitude(bits[i]))
        _add_max(out, as_int64(am))
    return amax_kernel


#: the amax kernel of float32 bits (16-byte aligned)
amax32_kernel = _make_amax(0)
#: lpsim.storage's 16-bit code kind -> its amax kernel, made on first use
_AMAX_CODES: dict = {}


def amax_codes_kernel(half: int):
    """The amax kernel of bfloat16 or float16 codes (``half``), made once."""
    found = _AMAX_CODES.get(half)
    if found is None:
        found = _AMAX_CODES[half] = _make_amax(half)
    return found


@cuda.jit
def _amax_kernel(bits, cmag, cinf, out):
    """out[0] = the largest finite magnitude bits of ``bits`` (lpsim.blocks.amax.finite_bits),
    float64 or unaligned float32: a grid-stride max per thread, then one atomic max each."""
    am = np.int64(0)
    i = cuda.grid(1)
    while i < bits.size:
        am = max(am, finite_bits(np.int64(bits[i]), cmag, cinf))
        i += cuda.gridsize(1)
    cuda.atomic.max(out, 0, am)


@cuda.jit
def tensor_scale_kernel(amax, divisor, least, ts):
    """ts = (the per-tensor scale of float32 data whose largest finite magnitude has the bits
    amax[0], fp32(1 / that scale)): :func:`lpsim.blocks.amax.tensor_scale_from` and
    :func:`lpsim.blocks.block_params`' reciprocal, by one thread on the device; amax[0] is
    then reset to 0 for the next call's atomics."""
    if cuda.grid(1) == 0:
        # finite float32 bits: at most float32's largest
        pts = scale_of_amax32(np.int32(amax[0]).view(np.float32), divisor, least)
        ts[0] = pts
        ts[1] = np.float64(np.float32(1.0) / np.float32(pts))
        amax[0] = 0


#: device -> (amax int64[1], reset to 0 by each scale kernel; scale and reciprocal float64[2])
_SCRATCH: dict = {}
#: one call's amax, scale and block launches are enqueued together (threads sharing a
#: device's default stream would otherwise interleave their amax atomics)
ENQUEUE = threading.Lock()


def scratch():
    device = launch.current_device()
    found = _SCRATCH.get(device)
    if found is None:
        found = _SCRATCH[device] = (cuda.to_device(np.zeros(1, np.int64)),
                                    cuda.device_array(2, np.float64))
    return found


def device_tensor_scale(xf, bfmt, half: int = 0):
    """NVFP4's per-tensor scale of the flat float32 device array ``xf`` (with ``half``, a
    flat int16 array of bfloat16 or float16 codes, 8-byte aligned: lpsim.storage's kind) and
    its reciprocal, as a float64 device array of two (the device's scratch, valid until its
    next call), computed on the device: the host launches two small kernels, allocates
    nothing and waits for neither.  The caller holds ``ENQUEUE`` until it has launched the
    kernel that reads the scale."""
    amax, ts = scratch()
    _amax_into(xf, amax, half)
    launch.configured(tensor_scale_kernel, 1)(amax, bfmt.tensor_scale_divisor,
                                               min_tensor_scale(bfmt), ts)
    return ts


def tensor_amax(x2) -> float:
    """The largest finite magnitude of the device array ``x2`` (float32/float64), found on
    the device: only its 8 bytes come back to the host (NVFP4's per-tensor scale where the
    caller wants it, as quantize_blocks does)."""
    M, EB = container_bits(x2.dtype)[2:]
    return float(bits_value(_amax_bits(x2).copy_to_host()[0], M, EB))


def _amax_bits(x2):
    """A new device int64 array of one: the largest finite magnitude bits of ``x2``."""
    return _amax_into(x2, cuda.to_device(np.zeros(1, np.int64)))


def _amax_into(x2, out, half: int = 0):
    """out[0] = max(out[0], the largest finite magnitude bits of ``x2``: float32/float64,
    or with ``half`` a flat int16 array of those codes, 8-byte aligned); returns out."""
    device = launch.current_device()
    if half:
        if x2.size:
            launch.configured(amax_codes_kernel(half), launch.grid_size(-(-x2.size // 4),
                                                                        device))(x2, out)
        return out
    cmag, cinf, M, EB = container_bits(x2.dtype)
    bits = x2.reshape(x2.size).view(np.int64 if M == 52 else np.int32)
    if bits.size and M == 23 and launch.address(bits) % 16 == 0:
        launch.configured(amax32_kernel, launch.grid_size(-(-bits.size // 4), device))(
            bits, out)
    elif bits.size:
        launch.configured(_amax_kernel, launch.grid_size(bits.size, device))(
            bits, cmag, cinf, out)
    return out


__all__ = ["ENQUEUE", "INF32", "amax32_kernel", "amax_codes_kernel", "device_tensor_scale",
           "finite32", "scratch", "tensor_amax", "tensor_scale_kernel"]
