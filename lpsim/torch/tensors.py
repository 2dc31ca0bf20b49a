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

The code is the torch tensor backend, :mod:`lpsim.tensors`, below :mod:`lpsim.quantize`
(docs/architecture.rst); this module adds :func:`quantize` and the element rounder its
functions default to.
"""

from __future__ import annotations

from .. import tensors as _backend
from ..quantize import quantize as _lp_quantize, round_container
from ..tensors import check_out, container

_is_tensor = _backend._is_tensor


def round_detached(x, fmt, rounding, *, seed, stream, sr_bits, stats, offset, out=None,
                   round_with=None):
    """Round the values of ``x`` (no autograd) into ``out`` or a new container tensor.

    ``out``, when given, has the container dtype and x's shape and device.  ``round_with``:
    what rounds the container array (a numpy array, or a CUDA tensor) with these keywords and
    ``out``; None: lpsim.quantize (lpsim_cuda.quantize).  lpsim.blocks passes its own.
    """
    return _backend.round_detached(x, fmt, rounding, seed=seed, stream=stream, sr_bits=sr_bits,
                                   stats=stats, offset=offset, out=out,
                                   round_with=round_with or round_container)


def quantize_tensor(x, fmt, rounding="nearest", *, seed=None, stream=0, sr_bits=None,
                    stats=None, out=None, offset=0, round_with=None):
    """:func:`lpsim.quantize` of a torch tensor (rules in the module docstring); element
    and block formats alike (``round_with``: :func:`round_detached`)."""
    return _backend.quantize_tensor(x, fmt, rounding, seed=seed, stream=stream,
                                    sr_bits=sr_bits, stats=stats, out=out, offset=offset,
                                    round_with=round_with or round_container)


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


__all__ = ["quantize", "quantize_tensor", "round_detached", "container", "check_out"]
