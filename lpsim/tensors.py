"""The torch tensor backend of :func:`lpsim.quantize`: tensors rounded through their
container arrays, with torch's rules for dtypes, devices, ``out=`` and autograd.

The rules are written in :mod:`lpsim.torch.tensors`, the module users read.  This one holds
the code, below the front: it rounds a tensor's container array (a CPU tensor's numpy view,
or a contiguous CUDA tensor) with the ``round_with`` it is given, so that it never imports
the front (:mod:`lpsim.quantize`, which passes its element rounder), a block backend
(:mod:`lpsim.blocks` passes its own) or lpsim_cuda.
"""

from __future__ import annotations

import contextlib

import numpy as np

from ._extras import require

torch = require("torch", extra="torch", feature="rounding torch tensors")

_CONTAINERS = (torch.float32, torch.float64)
#: 16-bit dtypes a CUDA rounder may read directly (``round_with.reads_halves``)
_HALVES = (torch.bfloat16, torch.float16)


def autocast_off(device_type: str):
    """A context in which ``torch.autocast`` leaves the operations on ``device_type``
    ("cpu", "cuda") in their operands' dtypes: lpsim's products define their own arithmetic,
    which autocast would otherwise move to bfloat16 or float16 (a no-op where it is off)."""
    if torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


def _is_tensor(x) -> bool:
    return isinstance(x, torch.Tensor)


#: floating dtypes that hold several values in one element (float4_e2m1fn_x2): no conversion
#: to float32 exists for them
_PACKED = tuple(getattr(torch, name) for name in dir(torch)
                if name.startswith("float") and name.endswith(("_x2", "_x4")))


def check_dtype(t, name: str) -> None:
    """A TypeError naming ``t``'s dtype unless lpsim rounds it: a real floating dtype of one
    value an element (not integer, bool, complex, or a packed float4 dtype)."""
    if not t.is_floating_point() or t.is_complex() or t.dtype in _PACKED:
        raise TypeError(f"{name} has dtype {t.dtype}; accepted: torch.float32, float64, "
                        "float16, bfloat16 and the float8 dtypes (cast integer tensors to a "
                        "float dtype first)")


def _check(x, out):
    if not _is_tensor(x):
        raise TypeError(f"out is a torch tensor but x is a {type(x).__name__}; pass a torch "
                        "tensor x with a torch out (or numpy arrays for both)")
    if out is not None and not _is_tensor(out):
        raise TypeError(f"x is a torch tensor but out is a {type(out).__name__}; pass a torch "
                        "tensor out (or numpy arrays for both)")
    for name, t in (("x", x), ("out", out)):
        if t is not None:
            check_dtype(t, name)
    if out is not None:
        if out.shape != x.shape:
            raise ValueError(f"out has shape {tuple(out.shape)}, x has {tuple(x.shape)}; "
                             "they must match")
        if out.device != x.device:
            raise ValueError(f"out is on {out.device}, x on {x.device}; they must match")
        if out.is_inference() and not torch.is_inference_mode_enabled():
            raise RuntimeError("out is an inference tensor (made under torch.inference_mode) "
                               "and this call is outside inference mode, where torch refuses "
                               "to write one too; accepted: out.clone(), or the call inside "
                               "torch.inference_mode()")
        if _overlaps(out):
            raise ValueError(f"out has elements that share one memory location (strides "
                             f"{tuple(out.stride())}, e.g. an expanded tensor), which torch "
                             "refuses to write too; accepted: an out whose elements are "
                             "distinct (out.clone(), or a new tensor)")


def _overlaps(t) -> bool:
    """Whether two elements of ``t`` share memory (torch's own check where it can tell;
    else a stride 0 on a dimension of more than one element)."""
    check = getattr(torch, "_debug_has_internal_overlap", None)
    if check is not None:
        verdict = int(check(t))
        if verdict != 2:            # 0: no, 1: yes, 2: too hard to tell
            return verdict == 1
    return any(stride == 0 and size > 1 for stride, size in zip(t.stride(), t.shape))


def container(dtype) -> torch.dtype:
    """The dtype a tensor of ``dtype`` is rounded in: itself for float32/64, else float32."""
    return dtype if dtype in _CONTAINERS else torch.float32


def widened(t):
    """``t`` in its container dtype.  A CPU float16 tensor is widened by numpy, which keeps
    every NaN's sign and payload (lpsim.storage.code_bits, as the CUDA kernels read codes):
    torch's own conversion turns signalling NaNs into its default NaN."""
    if t.dtype is torch.float16 and t.device.type == "cpu":
        return torch.from_numpy(t.numpy().astype(np.float32))
    return t.to(container(t.dtype))


def round_detached(x, fmt, rounding, *, seed, stream, sr_bits, stats, offset, round_with,
                   out=None):
    """Round the values of ``x`` (no autograd) into ``out`` or a new container tensor.

    ``out``, when given, has the container dtype and x's shape and device.  ``round_with``:
    what rounds the container array (a numpy array, or a contiguous CUDA tensor) with these
    keywords and ``out`` (:func:`lpsim.quantize.round_container` for element formats;
    lpsim.blocks and lpsim.quantize pass their own for block formats).
    """
    src = x.detach().resolve_neg()      # a lazily negated view (x.conj().imag) has no numpy
    if not (src.is_cuda and src.dtype in _HALVES and getattr(round_with, "reads_halves", 0)):
        src = widened(src)                       # (lpsim_cuda reads 16-bit codes itself)
    kwargs = dict(seed=seed, stream=stream, sr_bits=sr_bits, stats=stats, offset=offset)
    if src.is_cuda:
        src = src.contiguous()
        if out is not None and out.is_contiguous():
            round_with(src, fmt, rounding, out=out.detach(), **kwargs)
            return out
        result = round_with(src, fmt, rounding, **kwargs)
        if out is None:
            return result
        out.detach().copy_(result)
        return out
    if src.device.type != "cpu":
        raise TypeError(f"x is on {src.device}; lpsim rounds CPU and CUDA tensors")
    target = None if out is None or out.is_neg() else out.detach().numpy()
    result = round_with(src.numpy(), fmt, rounding, out=target, **kwargs)
    if out is not None and target is None:
        out.detach().copy_(torch.from_numpy(result))    # a negated view: written through torch
    return out if out is not None else torch.from_numpy(result)


class _StraightThrough(torch.autograd.Function):
    """round(x) forward, the incoming gradient unchanged backward (in x's dtype)."""

    @staticmethod
    def forward(ctx, x, fmt, rounding, kwargs):
        ctx.dtype = x.dtype
        return round_detached(x, fmt, rounding, **kwargs)

    @staticmethod
    def backward(ctx, grad):
        return grad.to(ctx.dtype), None, None, None


def _exact_in(values: torch.Tensor, dtype) -> bool:
    cast = values.to(dtype).to(values.dtype)
    return bool(((cast == values) | (cast.isnan() & values.isnan())).all())


def quantize_tensor(x, fmt, rounding="nearest", *, seed=None, stream=0, sr_bits=None,
                    stats=None, out=None, offset=0, round_with):
    """:func:`lpsim.quantize` of a torch tensor (rules in :mod:`lpsim.torch.tensors`);
    element and block formats alike (``round_with``: :func:`round_detached`)."""
    _check(x, out)
    kwargs = dict(seed=seed, stream=stream, sr_bits=sr_bits, stats=stats, offset=offset,
                  round_with=round_with)
    grad_on = torch.is_grad_enabled()
    if out is None:
        if grad_on and x.requires_grad:
            return _StraightThrough.apply(x, fmt, rounding, kwargs)
        return round_detached(x, fmt, rounding, **kwargs)
    if grad_on and out.requires_grad and out.is_leaf:
        raise RuntimeError("a leaf Variable that requires grad is being used in an in-place "
                           "operation (lpsim.quantize(..., out=w)); round it under "
                           "torch.no_grad(), as optimizers update weights, or use the result "
                           "of lpsim.quantize(w, ...)")
    tracked = grad_on and (out.requires_grad or x.requires_grad)
    if not tracked and out.dtype == container(x.dtype):
        round_detached(x, fmt, rounding, out=out, **kwargs)
        torch.autograd.graph.increment_version(out)
        return out
    # a narrower out is checked after rounding: count into a stats of the call's own, added
    # to the caller's once the values fit (a refused call counts nothing)
    narrower = out.dtype != container(x.dtype)
    counted = stats if not narrower or stats is None else type(stats)()
    kwargs["stats"] = counted
    value = (_StraightThrough.apply(x, fmt, rounding, kwargs) if tracked and x.requires_grad
             else round_detached(x, fmt, rounding, **kwargs))
    if out.dtype != value.dtype and not _exact_in(value.detach(), out.dtype):
        raise ValueError(f"the values of x rounded to {fmt} do not all fit out's dtype "
                         f"{out.dtype}; pass a float32/float64 out")
    if counted is not stats:
        stats += counted
    if tracked:
        out.copy_(value)
    else:
        with torch.no_grad():
            out.copy_(value)
    return out


#: the checks of x and out, before anything is rounded (lpsim.fixed runs them first too)
check_out = _check

__all__ = ["quantize_tensor", "round_detached", "container", "check_out"]
