"""Checking and converting the operands of the simulated operations."""

from __future__ import annotations

import numbers

import numpy as np

from ..formats import PRESETS, parse_format
from ..quantize import quantize


def is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def as_array(x, name: str, op: str):
    """x as a float32/float64 numpy array (torch CPU tensors and Python floats accepted)."""
    if is_torch(x):
        import torch
        if x.is_cuda:
            raise TypeError(f"{op}: {name} is a CUDA tensor; lpsim.ops runs on the CPU "
                            "(move it with .cpu())")
        x = x.detach()
        if x.dtype in (torch.bfloat16, torch.float16):
            x = x.float()      # exact: both fit float32
        x = x.numpy()
    if isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{op}: {name}={x!r} is a bool; accepted: float32/float64 arrays or "
                        "floats")
    if isinstance(x, numbers.Integral) and not isinstance(x, np.integer):
        if float(x) != x:
            raise ValueError(f"{op}: {name}={x} is not exact in float64")
        x = float(x)
    if isinstance(x, float):
        return np.array(x, np.float64)
    if isinstance(x, np.floating):
        x = np.asarray(x)
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{op}: {name} is a {type(x).__name__}; accepted: a float32/float64 "
                        "numpy array, a CPU torch tensor or a float")
    if x.dtype not in (np.float32, np.float64):
        raise TypeError(f"{op}: {name} has dtype {x.dtype}; accepted: float32, float64 "
                        "(cast integer or float16 data to a float dtype first)")
    return x


def container_format(dtype):
    """The format a container holds: fp32 for float32, fp64 for float64."""
    return PRESETS["fp32"] if np.dtype(dtype) == np.float32 else PRESETS["fp64"]


def round_inputs(arrays, in_fmt, names, op: str):
    """Round each operand to ``in_fmt`` (nearest) in its own container; None keeps them."""
    if in_fmt is None:
        return list(arrays)
    in_fmt = parse_format(in_fmt)
    out = []
    for x, name in zip(arrays, names):
        ok, reason = in_fmt.fits(x.dtype)
        if not ok:
            raise ValueError(f"{op}: in_fmt={in_fmt!r} does not fit {name}'s {x.dtype} "
                             f"container: {reason}; pass float64 operands or a narrower in_fmt")
        out.append(quantize(x, in_fmt, "nearest"))
    return out
