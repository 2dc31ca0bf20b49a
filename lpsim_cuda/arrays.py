"""The CUDA arrays lpsim_cuda takes (torch tensors, CuPy and other CUDA-array-interface
arrays, numba device arrays), checked and seen as flat integer views of their bits.

Why: one place checks kind, dtype, contiguity, shape and device, so every error names the
bad value and what is accepted; torch tensors are viewed straight from their data pointer
(no interface dict, which torch cannot even write for bfloat16 or float8) and other arrays
without numba's stream synchronisation, so a launch costs no host round trip.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
from numba import cuda

from lpsim.storage import BFLOAT16_CODES, FLOAT16_CODES, STORAGE, code_bits

from . import launch
from .launch import is_torch

#: the integer type of each element width in bytes: kernels read and write bit patterns
BITS = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}
FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
KINDS = "torch CUDA tensors, CuPy arrays, numba device arrays"




class Source(NamedTuple):
    """The array being rounded, as the kernel sees it."""

    bits: object        # 1-D numba device array of BITS[itemsize] over its memory
    dtype: np.dtype     # float32 or float64: the container the values are rounded in
    shape: tuple
    stream: object      # where its data is ready: the launch goes there
    device: int
    half: int = 0       # lpsim.storage's code kinds: bits are 16-bit codes, rounded as float32


@functools.cache
def _half_kinds() -> dict:
    import torch
    return {torch.bfloat16: BFLOAT16_CODES, torch.float16: FLOAT16_CODES}


def half_kind(dtype) -> int:
    """lpsim.storage's code kind of a torch bfloat16 or float16 dtype (what the kernels
    widen with :func:`lpsim.storage.code_bits`), else 0."""
    return _half_kinds().get(dtype, 0)


def source(x, name: str = "x", halves: bool = False) -> Source:
    """Check that ``x`` is a C-contiguous float32/float64 CUDA array and view it; with
    ``halves``, a torch bfloat16 or float16 tensor too (its codes, float32 container)."""
    if is_torch(x):
        import torch
        half = half_kind(x.dtype) if halves else 0
        if x.dtype not in (torch.float32, torch.float64) and not half:
            also = " (and reads torch.bfloat16 and torch.float16 ones as float32)" \
                if halves else ""
            raise TypeError(f"{name} has dtype {x.dtype}; lpsim_cuda rounds torch.float32 and "
                            f"torch.float64 tensors{also}; to store bfloat16, float16 or "
                            "float8, round a float32 tensor with storage=...")
        _check_torch(x, name)
        dtype = np.dtype(np.float32) if half else np.dtype(str(x.dtype).replace("torch.", ""))
        return Source(_torch_bits(x), dtype, tuple(x.shape), launch.torch_stream(x.device),
                      x.device.index, half)
    array, stream = floats(x, name)
    return Source(_flat_bits(array), array.dtype, tuple(array.shape), stream,
                  launch.current_device())


def floats(x, name: str = "x", sync: bool = False):
    """Check that ``x`` (not a torch tensor) is a C-contiguous float32/float64 CUDA array:
    (numba device array of it, its data's stream).

    sync=True has numba wait for a CUDA-array-interface array's stream (stream 0 is returned),
    for callers that launch on the default stream rather than on the array's.
    """
    array, stream = _numba_array(x, name, sync)
    if array.dtype not in FLOATS:
        raise TypeError(f"{name} has dtype {array.dtype}; accepted: float32, float64 (cast "
                        "integer or half-precision data to float32 first)")
    return array, stream


def target(out, like: Source, storage: str | None, name: str = "out", packs: bool = True):
    """Check ``out`` against the source and the storage, and view its bits.

    Without storage, out has x's dtype; with it, out is a tensor of that torch dtype (torch)
    or an integer array of its width (other kinds: they have no bfloat16/float8 types).
    ``packs``: the caller takes storage= (block formats do not: no hint at it).
    """
    if is_torch(out):
        import torch
        want = getattr(torch, storage if storage else like.dtype.name)
        if out.dtype != want:
            hint = (f" (drop storage= to get {out.dtype} results)"
                    if storage and out.dtype in (torch.float32, torch.float64) else "")
            writes = f"storage={storage!r} writes" if storage else "x holds"
            raise ValueError(f"{name} has dtype {out.dtype}; {writes} {want} values, so {name} "
                            f"must be a {want} tensor{hint}")
        _check_torch(out, name)
        if out.device.index != like.device:
            raise ValueError(f"{name} is on {out.device} but x is on cuda:{like.device}")
        bits, shape = _torch_bits(out), tuple(out.shape)
    else:
        array, _ = _numba_array(out, name)
        if storage is None and array.dtype != like.dtype:
            hint = " (or pass storage= to write packed values)" if packs else ""
            raise ValueError(f"{name} has dtype {array.dtype}; it must be x's {like.dtype}"
                             f"{hint}")
        width = STORAGE[storage][1] if storage else None
        if storage and (array.dtype.kind not in "iu" or array.dtype.itemsize * 8 != width
                        or not array.dtype.isnative):
            raise ValueError(f"{name} has dtype {array.dtype}; storage={storage!r} writes packed "
                            f"{width}-bit codes, so {name} must be an int{width} or uint{width} "
                            f"array in native byte order (a torch.{storage} tensor for torch)")
        bits, shape = _flat_bits(array), tuple(array.shape)
    if shape != like.shape:
        raise ValueError(f"{name} must have shape {like.shape}, got {shape}")
    return bits


def copy_of(a, stream):
    """A new device array holding the flat device array ``a``, copied on ``stream``."""
    fresh = cuda.device_array(a.shape, a.dtype, stream=stream)
    fresh.copy_to_device(a, stream=stream)
    return fresh


@functools.cache
def _widen_kernel():
    def widen(codes, out, half):
        """out[i]: the float32 bits of the 16-bit code codes[i] (lpsim.storage.code_bits)."""
        i = cuda.grid(1)
        while i < codes.size:
            out[i] = code_bits(codes[i], half)
            i += cuda.gridsize(1)
    return cuda.jit(widen)


def widen_bits(codes, half: int, out, stream, device: int) -> None:
    """Write into ``out`` (a flat int32 device array) the float32 bits of the flat 16-bit
    device array ``codes`` (``half``: lpsim.storage's code kind), on ``stream``."""
    if codes.size:
        blocks = launch.grid_size(-(-codes.size // launch.THREADS), device)
        launch.configured(_widen_kernel(), blocks, stream)(codes, out, half)


def widened(x):
    """A bfloat16 or float16 CUDA tensor's values as a new float32 tensor, widened as the
    specialised and block kernels widen codes (:func:`lpsim.storage.code_bits`: exact, NaN
    signs and payloads kept, as numpy and lpsim.quantize on the CPU keep them), which a
    conversion by the GPU's own instruction need not do; for the general kernels, which
    read float32."""
    import torch
    src = source(x.contiguous(), halves=True)
    out = torch.empty(src.shape, dtype=torch.float32, device=x.device)
    widen_bits(src.bits, src.half, _torch_bits(out), src.stream, src.device)
    return out


def new_output(x, like: Source, storage: str | None):
    """A fresh output of x's kind: x's dtype, or the storage's (torch) or integer codes."""
    if is_torch(x):
        import torch
        return torch.empty(x.shape, dtype=getattr(torch, storage or like.dtype.name),
                           device=x.device)
    if storage is None:
        return cuda.device_array(like.shape, like.dtype)
    return cuda.device_array(like.shape, BITS[STORAGE[storage][1] // 8])


def _check_torch(t, name: str) -> None:
    if not t.is_cuda:
        raise TypeError(f"{name} is a CPU torch tensor; lpsim_cuda takes {KINDS} "
                        "(lpsim.quantize rounds CPU tensors and numpy arrays)")
    if not t.is_contiguous():
        raise ValueError(f"{name} is a non-contiguous CUDA tensor (shape {tuple(t.shape)}, "
                         f"strides {t.stride()}); pass {name}.contiguous()")
    refuse_negated(t, name)


def refuse_negated(t, name: str) -> None:
    """Refuse a torch tensor whose memory holds its values' negatives (a lazily negated
    view, ``x.conj().imag`` or ``torch._neg_view``): the kernels read and write memory."""
    if is_torch(t) and t.is_neg():
        raise ValueError(f"{name} is a lazily negated view (its memory holds -{name}); pass "
                         f"{name}.resolve_neg() (lpsim.quantize resolves it itself)")


def _torch_bits(t):
    """A numba view of a contiguous CUDA tensor's memory as flat integers of its width."""
    desc = {"shape": (t.numel(),), "strides": None, "data": (t.data_ptr(), False),
            "typestr": np.dtype(BITS[t.element_size()]).str, "version": 2}
    return cuda.from_cuda_array_interface(desc, owner=t, sync=False)


def _numba_array(x, name: str, sync: bool = False):
    """A numba device array of ``x`` (numba or CUDA-array-interface) and its data's stream
    (sync: :func:`floats`)."""
    if cuda.devicearray.is_cuda_ndarray(x):
        array, stream = x, getattr(x, "stream", 0) or 0
    elif sync and hasattr(x, "__cuda_array_interface__"):
        array, stream = cuda.as_cuda_array(x, sync=True), 0
    elif hasattr(x, "__cuda_array_interface__"):
        desc = x.__cuda_array_interface__
        # the interface's stream (v3) is where the data is ready: launch there rather than
        # have numba synchronise it
        array = cuda.from_cuda_array_interface({**desc, "stream": None}, owner=x, sync=False)
        stream = launch.external_stream(desc.get("stream"))
    elif isinstance(x, np.ndarray):
        raise TypeError(f"{name} is a numpy array in host memory; lpsim_cuda takes {KINDS}; "
                        "use lpsim.quantize for host arrays")
    else:
        raise TypeError(f"{name} of type {type(x).__name__} is not a CUDA array; accepted: "
                        f"{KINDS}")
    if not array.is_c_contiguous():
        raise ValueError(f"{name} is not C-contiguous (shape {tuple(array.shape)}, strides "
                         f"{tuple(array.strides)}); pass a contiguous copy")
    return array, stream


def _flat_bits(array):
    return array.reshape(array.size).view(BITS[array.dtype.itemsize])
