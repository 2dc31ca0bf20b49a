"""Rounding torch tensors: dtypes, devices, ``out=`` and what autograd sees.

Rules (torch's own conventions for in-place ops):

* Input dtypes: float32 and float64 round in their own container; float16, bfloat16 and the
  float8 dtypes are upcast exactly to float32 first, and the result is float32 (the rounded
  values of a format need not fit the input's dtype: bf16 -> fp16 rounding of 65504).
* A result of an input that requires grad (with grad mode on) stays in the graph with the
  straight-through gradient, d round(x) / dx := 1, as ``Quantizer(fmt, None)`` does; pass
  ``x.detach()`` for a constant.  Nothing is detached silently.
* ``out=`` (in-place when ``out is x``) bumps ``out``'s version counter, so a graph that
  saved ``out`` refuses to backpropagate through the stale value.  With grad mode on, a leaf
  ``out`` that requires grad is refused with torch's RuntimeError (round it under
  ``torch.no_grad()``, as optimizers update weights); a non-leaf ``out`` is written through
  autograd (``out.copy_``), so its gradient is the straight-through one.
* A bfloat16/float16 ``out`` takes the rounded values only if each is exact in its dtype
  (ValueError otherwise).  An ``out`` whose elements share memory (``expand``, stride 0) is
  refused (ValueError), as torch refuses to write one.  A torch ``x`` needs a torch ``out`` and the reverse (TypeError).
* CUDA tensors run in :mod:`lpsim_cuda`, CPU tensors in lpsim's numba kernels; the random
  bits of element ``i`` are the same on both.
* Block formats (MX, NVFP4: :mod:`lpsim.blocks`) follow the same rules.
"""

from __future__ import annotations

import torch

from ..quantize import quantize as _lp_quantize

_CONTAINERS = (torch.float32, torch.float64)


def _is_tensor(x) -> bool:
    return isinstance(x, torch.Tensor)


def _check(x, out):
    if not _is_tensor(x):
        raise TypeError(f"out is a torch tensor but x is a {type(x).__name__}; pass a torch "
                        "tensor x with a torch out (or numpy arrays for both)")
    if out is not None and not _is_tensor(out):
        raise TypeError(f"x is a torch tensor but out is a {type(out).__name__}; pass a torch "
                        "tensor out (or numpy arrays for both)")
    for name, t in (("x", x), ("out", out)):
        if t is not None and (not t.is_floating_point() or t.is_complex()):
            raise TypeError(f"{name} has dtype {t.dtype}; accepted: torch.float32, float64, "
                            "float16, bfloat16 (cast integer tensors to a float dtype first)")
    if out is not None:
        if out.shape != x.shape:
            raise ValueError(f"out has shape {tuple(out.shape)}, x has {tuple(x.shape)}; "
                             "they must match")
        if out.device != x.device:
            raise ValueError(f"out is on {out.device}, x on {x.device}; they must match")
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


def round_detached(x, fmt, rounding, *, seed, stream, sr_bits, stats, offset, out=None,
                   round_with=None):
    """Round the values of ``x`` (no autograd) into ``out`` or a new container tensor.

    ``out``, when given, has the container dtype and x's shape and device.  ``round_with``:
    what rounds the container array (a numpy array, or a CUDA tensor) with these keywords and
    ``out``; None: lpsim.quantize (lpsim_cuda.quantize).  lpsim.blocks passes its own.
    """
    src = x.detach().resolve_neg()      # a lazily negated view (x.conj().imag) has no numpy
    src = src.to(container(src.dtype))
    kwargs = dict(seed=seed, stream=stream, sr_bits=sr_bits, stats=stats, offset=offset)
    if src.is_cuda:
        import lpsim_cuda
        cuda_round = round_with or lpsim_cuda.quantize
        src = src.contiguous()
        if out is not None and out.is_contiguous():
            cuda_round(src, fmt, rounding, out=out.detach(), **kwargs)
            return out
        result = cuda_round(src, fmt, rounding, **kwargs)
        if out is None:
            return result
        out.detach().copy_(result)
        return out
    if src.device.type != "cpu":
        raise TypeError(f"x is on {src.device}; lpsim rounds CPU and CUDA tensors")
    target = None if out is None or out.is_neg() else out.detach().numpy()
    result = (round_with or _lp_quantize)(src.numpy(), fmt, rounding, out=target, **kwargs)
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
                    stats=None, out=None, offset=0, round_with=None):
    """:func:`lpsim.quantize` of a torch tensor (rules in the module docstring); element
    and block formats alike (``round_with``: :func:`round_detached`)."""
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
    value = (_StraightThrough.apply(x, fmt, rounding, kwargs) if tracked and x.requires_grad
             else round_detached(x, fmt, rounding, **kwargs))
    if out.dtype != value.dtype and not _exact_in(value.detach(), out.dtype):
        raise ValueError(f"the values of x rounded to {fmt} do not all fit out's dtype "
                         f"{out.dtype}; pass a float32/float64 out")
    if tracked:
        out.copy_(value)
    else:
        with torch.no_grad():
            out.copy_(value)
    return out


def quantize(x, fmt, rounding: str = "nearest", *, seed=None, stream: int = 0, sr_bits=None,
             stats=None, out=None, offset: int = 0, generator=None):
    """Round the torch tensor ``x`` to ``fmt``: :func:`lpsim.quantize` on tensors.

    CPU tensors of any float dtype (float16/bfloat16 upcast exactly, float32 result) and CUDA
    tensors.  Autograd, ``out=`` and version-counter rules: :mod:`lpsim.torch.tensors`.
    """
    if not _is_tensor(x):
        raise TypeError(f"lpsim.torch.quantize rounds torch tensors, not {type(x).__name__}; "
                        "use lpsim.quantize for numpy arrays and scalars")
    return _lp_quantize(x, fmt, rounding, seed=seed, stream=stream, sr_bits=sr_bits,
                       stats=stats, out=out, offset=offset, generator=generator)


#: the checks of x and out, before anything is rounded (lpsim.fixed runs them first too)
check_out = _check

__all__ = ["quantize", "quantize_tensor", "round_detached", "container", "check_out"]
