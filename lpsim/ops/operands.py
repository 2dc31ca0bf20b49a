"""Checking and converting the operands of the simulated operations."""

from __future__ import annotations

import functools
import numbers

import numpy as np

from .._extras import is_torch
from ..formats import PRESETS, parse_format
from ..quantize import as_container_array, quantize


def as_array(x, name: str, op: str):
    """x as a float32/float64 numpy array: any array-like (lists, float16/bfloat16 and
    integer arrays upcast exactly as :func:`lpsim.quantize` does), CPU torch tensors and
    Python numbers (an int must be exact in float64)."""
    if type(x) is np.ndarray and x.dtype in _CONTAINERS:
        return x
    if type(x) is float:
        return np.array(x, np.float64)
    if is_torch(x):
        if x.is_cuda:
            raise TypeError(f"{op}: {name} is a CUDA tensor; lpsim.ops runs on the CPU "
                            "(move it with .cpu())")
        x = x.detach()
        if x.dtype.is_floating_point and x.dtype.itemsize <= 2:
            x = x.float()      # exact: 16- and 8-bit floats fit float32
        x = x.numpy()
    if isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{op}: {name}={x!r} is a bool; accepted: float32/float64 arrays or "
                        "floats")
    if isinstance(x, numbers.Integral) and not isinstance(x, np.integer):
        try:
            exact = float(x) == x
        except OverflowError:
            exact = False
        if not exact:
            raise ValueError(f"{op}: {name}={x} is not exact in float64; accepted: integers "
                             "of at most 53 significant bits (lpsim.quantize rounds any int)")
        return np.array(float(x), np.float64)
    try:
        return as_container_array(x, name)
    except (TypeError, ValueError) as error:
        raise type(error)(f"{op}: {error}") from None


_CONTAINERS = (np.dtype(np.float32), np.dtype(np.float64))


def matrix_operands(a, b, out_fmt, what: str):
    """a and b (2-D, or 1-D as numpy.matmul) as (M, K) and (K, N) arrays, the result's
    container (numpy's result type of a and b, float64 when ``out_fmt`` does not fit
    float32) and a function that gives a 2-D result back the shape numpy.matmul's has."""
    a, b = as_array(a, "a", "matmul"), as_array(b, "b", "matmul")
    dtype = np.result_type(a, b)
    if not out_fmt.fits(dtype)[0]:
        dtype = np.dtype(np.float64)
    squeeze_a, squeeze_b = a.ndim == 1, b.ndim == 1
    a = a[None, :] if squeeze_a else a
    b = b[:, None] if squeeze_b else b
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul with {what}: shapes {a.shape} and {b.shape}; "
                         "accepted: (M, K) and (K, N) (or 1-D)")

    def shaped(out):
        out = out[0] if squeeze_a else out
        return out[..., 0] if squeeze_b else out
    return a, b, dtype, shaped


def container_format(dtype):
    """The format a container holds: fp32 for float32, fp64 for float64."""
    return PRESETS["fp32"] if np.dtype(dtype) == np.float32 else PRESETS["fp64"]


def round_inputs(arrays, in_fmt, names, op: str, stats=None):
    """Round each operand to ``in_fmt`` (nearest) in its own container, counting these
    roundings in ``stats`` too; None keeps them."""
    if in_fmt is None:
        return list(arrays)
    in_fmt = parse_format(in_fmt)
    out = []
    for x, name in zip(arrays, names):
        ok, reason = _fits(in_fmt, x.dtype)
        if not ok:
            raise ValueError(f"{op}: in_fmt={in_fmt!r} does not fit {name}'s {x.dtype} "
                             f"container: {reason}; pass float64 operands or a narrower in_fmt")
        out.append(quantize(x, in_fmt, "nearest", stats=stats))
    return out


@functools.lru_cache(maxsize=256)
def _fits(fmt, dtype):
    return fmt.fits(dtype)


def deliver(result, out, op: str):
    """``result`` written into ``out`` (numpy's ``out=``: an array of the result's shape and
    dtype) and ``out`` returned; without out, 0-d results as numpy scalars, as numpy does."""
    if out is None:
        return result[()] if isinstance(result, np.ndarray) and result.ndim == 0 else result
    check_out(out, result.shape, result.dtype, op)
    out[...] = result
    return out


def check_out(out, shape, dtype, op: str):
    """A clear error unless ``out`` is a writable numpy array of ``shape`` and ``dtype``."""
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{op}: out is a {type(out).__name__}; accepted: a numpy array of "
                        f"shape {shape} and dtype {dtype}")
    if out.shape != tuple(shape) or out.dtype != dtype:
        raise ValueError(f"{op}: out has shape {out.shape} and dtype {out.dtype}; accepted: "
                         f"shape {tuple(shape)}, dtype {dtype}")
    if not out.flags.writeable:
        raise ValueError(f"{op}: out is read-only; accepted: a writable array")


def fits_float32(x) -> bool:
    """Whether every value of the array ``x`` is a float32 value (NaN and inf included):
    then each product of two of them is exact in float64 (48 significant bits, exponents
    within float64's range), as the simulated products need."""
    if x.dtype == np.float32:
        return True
    with np.errstate(over="ignore"):
        narrow = x.astype(np.float32)
    return bool(np.all((narrow == x) | np.isnan(x)))


def stream_after(stream, k: int):
    """The stream ``k`` after ``stream`` (a call's inputs and output draw from stream,
    stream + 1 and stream + 2), modulo 2**64 as the streams are 64-bit; anything but an
    integer in range is returned as it is, for the rounding's own check to name."""
    if isinstance(stream, (int, np.integer)) and not isinstance(stream, (bool, np.bool_)) \
            and 0 <= stream < 1 << 64:
        return (int(stream) + k) % (1 << 64)
    return stream
