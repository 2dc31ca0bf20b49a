"""``lpsim.request``: what a rounding request is and how it is checked, for every backend.

A request is a format, a rounding mode, the keys of the random bits (seed, stream), the
element offset, the random bits per decision (sr_bits) and, for arrays, the container
array and ``out``.  :func:`plan` validates one and turns it into the kernels' arguments
(:class:`Plan`); the other functions are the checks the front (:mod:`lpsim.quantize`) and
the backends (:mod:`lpsim.cpu`'s callers, :mod:`lpsim.blocks`, :mod:`lpsim.fixed`, the
torch tensor backend, :mod:`lpsim.reference`, ``lpsim_cuda``) share, so that a bad value
gets the same error on every path.

This module dispatches nothing and imports no backend: it sits below all of them
(docs/architecture.rst).  ``lpsim.quantize`` re-exports its names, where users import them.
"""

from __future__ import annotations

import secrets
import sys
from typing import NamedTuple

import numpy as np

from ._extras import is_torch
from .formats import parse_format
from .philox import LANES, MASK32, WORD_BITS, split_key
from .rounding import STOCHASTIC, Params, kernel_params, mode_code

#: counters of elements: ``offset + x.size`` must not exceed this (random-word counters and
#: the kernels' index arithmetic stay in int64)
MAX_COUNTER = 2 ** 62

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)


class Plan(NamedTuple):
    """A validated rounding request for one container dtype: what the kernels take.

    ``stream`` is the 64-bit stream as a signed int64 (two's complement), so that every
    kernel is typed for int64 whatever its value.
    """

    params: Params
    mode: int
    k: int
    seed_lo: int
    seed_hi: int
    stream: int
    offset: int
    lanes: int


def signed(value: int) -> int:
    """A 64-bit unsigned integer as the int64 with the same bits."""
    return value - (1 << 64) if value >= 1 << 63 else value


def check_offset(offset, size: int = 0) -> int:
    """``offset`` as an int, with a clear error unless 0 <= offset and offset + size <=
    MAX_COUNTER."""
    if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)):
        raise TypeError(f"offset={offset!r} must be an integer; accepted: 0 <= offset and "
                        f"offset + size <= 2**62")
    offset = int(offset)
    if offset < 0 or offset + size > MAX_COUNTER:
        raise ValueError(f"offset={offset} is out of range for {size} elements; accepted: "
                         f"0 <= offset and offset + size <= 2**62 (the element counters)")
    return offset


def check_sr_bits(sr_bits, rounding, width: int, dtype) -> int:
    """The random bits per decision: ``width`` unless few-bit SR asks for fewer."""
    if sr_bits is None:
        return width
    if rounding != "stochastic":
        raise ValueError(f"sr_bits={sr_bits!r} applies to rounding='stochastic' only, not "
                         f"rounding={rounding!r}")
    if isinstance(sr_bits, bool) or not isinstance(sr_bits, (int, np.integer)):
        raise TypeError(f"sr_bits={sr_bits!r} is not an integer; accepted: an integer "
                        f"1..{width} for a {dtype} container")
    if not 1 <= sr_bits <= width:
        raise ValueError(f"sr_bits={sr_bits!r} is out of range; accepted: an integer 1..{width} "
                         f"for a {dtype} container")
    return int(sr_bits)


def check_dtype(dtype) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype not in (F32, F64):
        raise TypeError(f"cannot round an array of dtype {dtype}; accepted: float32, float64 "
                        "(cast integer or object data to a float dtype first)")
    return dtype


def keys(seed, stream, mode: int) -> tuple[int, int, int]:
    """(seed_lo, seed_hi, stream as int64) of a request; seed=None draws a fresh seed for the
    stochastic modes."""
    if seed is None:
        seed = secrets.randbits(64) if mode >= STOCHASTIC else 0
    if type(seed) is int and 0 <= seed < 1 << 64:
        seed_lo, seed_hi = seed & MASK32, seed >> 32
    else:
        seed_lo, seed_hi = split_key(seed, "seed")
    if type(stream) is int and 0 <= stream < 1 << 63:
        return seed_lo, seed_hi, stream
    stream_lo, stream_hi = split_key(stream, "stream")
    return seed_lo, seed_hi, signed(stream_lo | (stream_hi << 32))


def plan(fmt, rounding, dtype, *, seed=None, stream=0, sr_bits=None, offset=0,
         size: int = 0) -> Plan:
    """Validate a request and turn it into kernel arguments (shared with lpsim_cuda)."""
    fmt = parse_format(fmt)
    mode = mode_code(rounding)
    dtype = check_dtype(dtype)
    params = kernel_params(fmt, dtype)
    k = check_sr_bits(sr_bits, rounding, WORD_BITS[dtype.itemsize], dtype)
    seed_lo, seed_hi, stream = keys(seed, stream, mode)
    return Plan(params, mode, k, seed_lo, seed_hi, stream, check_offset(offset, size),
                LANES[dtype.itemsize])


def is_cuda_array(x) -> bool:
    """Whether ``x`` lives on a GPU, as lpsim_cuda takes it: a CUDA torch tensor (asked
    ``is_cuda``: its array interface raises for one that requires grad, which ``hasattr``
    does not catch), a CUDA-array-interface object (CuPy) or a numba device array."""
    module = type(x).__module__
    torch = sys.modules.get("torch")           # a tensor means torch is imported already
    if module.startswith("torch") or torch is not None and isinstance(x, torch.Tensor):
        return getattr(x, "is_cuda", False) is True
    return not isinstance(x, np.ndarray) and (hasattr(x, "__cuda_array_interface__")
                                              or "numba" in module and "cuda" in module)


def check_out(out, x):
    """out, if it can take the result for ``x``; otherwise a clear error."""
    if is_torch(out):
        raise TypeError(f"out is a torch tensor but x is a {type(x).__name__}; pass a torch "
                        "tensor x with a torch out (or numpy arrays for both)")
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out is a {type(out).__name__}; accepted: a numpy array of shape "
                        f"{x.shape} and dtype {x.dtype} (or x itself, to round in place)")
    if out.shape != x.shape or out.dtype != x.dtype or not out.dtype.isnative:
        raise ValueError(f"out must be a numpy array of shape {x.shape} and dtype {x.dtype} "
                         f"(native byte order), got {out.shape} {out.dtype}: the result's "
                         "dtype is the input's container (float32 and float64 inputs their "
                         "own; float16, bfloat16, integer and big-endian inputs float32), so "
                         "only those round in place")
    if not out.flags.writeable:
        raise ValueError("out is read-only; accepted: a writable array (for in-place rounding "
                         "of a read-only array, round into a copy)")
    return out


def check_scalar_out(x, out) -> None:
    """Refuse ``out=`` with a scalar ``x``: a scalar is returned rounded (shared with
    lpsim.fixed)."""
    if out is not None:
        raise TypeError(f"out= applies to arrays; a {type(x).__name__} scalar is returned "
                        "rounded (pass a numpy array to round into out)")


def container(dtype) -> np.dtype:
    """The container a float dtype rounds in: float16 and bfloat16 (exact) in float32."""
    return F64 if np.dtype(dtype).itemsize > 4 else F32


def as_container_array(x, name: str = "x") -> np.ndarray:
    """``x`` as a native float32/float64 array, converted exactly, or a clear error.

    float16 and ml_dtypes' bfloat16 (and any float of at most 32 bits) become float32;
    integers float64, when every value is exact there; big-endian floats are byte-swapped.
    """
    if isinstance(x, np.matrix):
        raise TypeError(f"{name} is a numpy.matrix; accepted: a numpy array "
                        "(np.asarray(x) keeps the values)")
    if isinstance(x, np.ma.MaskedArray):
        raise TypeError(f"{name} is a masked array; lpsim does not round masks; accepted: "
                        f"a plain array ({name}.filled(...) or np.asarray({name}.data))")
    try:
        array = np.asarray(x)
    except (ValueError, TypeError) as error:
        raise TypeError(f"{name} of type {type(x).__name__} is not an array of numbers: "
                        f"{error}") from None
    kind = array.dtype.kind
    if kind == "f" or (kind == "V" and array.dtype.itemsize <= 4 and _is_float_like(array)):
        if array.dtype.itemsize > 8:
            raise TypeError(f"{name} has dtype {array.dtype}; accepted: floats of at most 64 "
                            "bits (a long double does not fit the float64 container)")
        target = container(array.dtype)
        # the canonical dtype object too (an unpickled array's float64 is an equal copy)
        return array.astype(target, copy=False).view(target)
    if kind in "iu":
        wide = array.astype(np.float64)
        # 2**63 (2**64 unsigned) is past the dtype's top: casting it back is undefined (x86
        # gives the smallest int64, aarch64 saturates to the largest), so bound it first
        in_range = wide < (2.0 ** 63 if kind == "i" else 2.0 ** 64)
        exact = in_range & (np.where(in_range, wide, 0.0).astype(array.dtype) == array)
        if not np.all(exact):
            bad = array.reshape(-1)[np.flatnonzero(~exact.reshape(-1))[0]]
            raise ValueError(f"{name} holds the integer {bad}, which float64 cannot hold "
                             "exactly; accepted: integers of at most 53 bits (lpsim.quantize "
                             "rounds a Python int scalar beyond them exactly to an element "
                             "format, not to a block format)")
        return wide
    if kind == "O" and array.size and all(
            isinstance(v, int) and not isinstance(v, bool) for v in array.reshape(-1)):
        # Python ints beyond int64: float64 when every one is exact there
        inexact = [v for v in array.reshape(-1) if not exact_in_float64(v)]
        if inexact:
            raise ValueError(f"{name} holds the integer {inexact[0]}, which float64 cannot "
                             "hold exactly; accepted here: integers exact in float64 "
                             f"(float({name}) accepts its float64 rounding; lpsim.quantize "
                             "rounds Python ints and lists of them exactly to element formats)")
        return array.astype(np.float64)
    raise TypeError(f"cannot round {name} (a {type(x).__name__}) of dtype {array.dtype}; "
                    "accepted: float arrays "
                    "(float16, bfloat16, float32, float64), integer arrays exact in float64, "
                    "Python numbers, and lists or tuples of them")


def _is_float_like(array) -> bool:
    """ml_dtypes' floats (bfloat16, float8_*) have kind 'V' and a float conversion."""
    try:
        return np.can_cast(array.dtype, np.float32) and array.dtype.names is None
    except TypeError:
        return False


def wide_ints(x):
    """(the values of the list or tuple ``x`` as an object array, the flat indices of its
    Python or numpy ints beyond 2**53: those numpy would round to float64 or refuse), or
    None where it holds none (or is not a regular nest of values)."""
    try:
        objects = np.array(x, dtype=object)
    except (ValueError, TypeError):
        return None
    ints = [i for i, v in enumerate(objects.reshape(-1)) if isinstance(v, (int, np.integer))
            and not isinstance(v, (bool, np.bool_)) and not -2 ** 53 <= v <= 2 ** 53]
    return (objects, ints) if ints else None


def exact_in_float64(value: int) -> bool:
    try:
        return float(value) == value
    except OverflowError:
        return False


__all__ = ["Plan", "plan", "keys", "MAX_COUNTER", "check_offset", "check_sr_bits",
           "check_dtype", "check_out", "check_scalar_out", "as_container_array", "container",
           "is_torch", "signed", "exact_in_float64", "wide_ints"]
