"""Autograd quantizers: round activations forward and their incoming gradients backward.

``quantizer(forward_fmt, backward_fmt, forward_rounding, backward_rounding)`` returns a
function ``y = q(x)`` with ``y = round_f(x)`` and ``dL/dx = round_b(dL/dy)``, qtorch's
``quantizer()`` contract with lpsim formats, modes and random bits; ``Quantizer`` is the same
as a module.  A side whose format is None is the identity.  The formats live in mutable
:class:`Rounding` objects, so a precision assignment can promote a tensor between steps.

Both keep torch's module conventions: the output (and the gradient) has the input's dtype,
so a bfloat16 or float16 model runs with quantizers between its layers (a value the format
rounds to that the dtype cannot hold is a ValueError, never a second rounding); both are
plain objects without closures, so ``torch.save`` / ``pickle`` / ``copy.deepcopy`` of a model
holding them work.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..formats import Format, parse_format
from ..generator import Generator, resolve
from ..rounding import mode_code
from ..stats import RoundingStats
from ..tensors import check_dtype
from .tensors import round_detached


@dataclass(eq=False)
class Rounding:
    """One rounding site: format (None = identity), mode, random bits and counters."""

    fmt: Format | str | None = None
    rounding: str = "nearest"
    generator: Generator | None = None
    stats: RoundingStats | None = None
    sr_bits: int | None = None

    def __post_init__(self):
        if self.fmt is not None:
            self.fmt = parse_format(self.fmt)
        mode_code(self.rounding)                       # unknown names fail here, not in use
        if self.generator is not None and not isinstance(self.generator, Generator):
            raise TypeError(f"generator={self.generator!r} is not an lpsim.Generator")

    def __call__(self, t: torch.Tensor, dtype=None, side: str = "") -> torch.Tensor:
        """The rounded values of ``t`` (no autograd); ``t`` itself when fmt is None.  With
        ``dtype``, in that dtype (:func:`_in_dtype`): where it cannot hold them, a ValueError
        that leaves the counters and the generator as they were."""
        if self.fmt is None:
            return t
        check_dtype(t, {"forward": "the quantizer's input",
                        "backward": "the quantizer's gradient"}.get(side, "x"))
        if self.generator is None:
            return self._round(t, dtype, side)
        return self.generator.run(self._round, t, dtype, side)

    def _round(self, t, dtype, side):
        seed, stream, offset = resolve(self.generator, t, self.rounding, None, 0, 0)
        checked = dtype is not None and dtype not in (torch.float32, torch.float64)
        # a dtype narrower than the container is checked after rounding: counted into a
        # stats of the call's own, added once the values fit
        counted = type(self.stats)() if checked and self.stats is not None else self.stats
        y = round_detached(t, self.fmt, self.rounding, seed=seed, stream=stream,
                           sr_bits=self.sr_bits, stats=counted, offset=offset)
        if dtype is not None:
            y = _in_dtype(y, dtype, side, self)
        if counted is not self.stats:
            self.stats += counted
        return y


def _in_dtype(y: torch.Tensor, dtype, side: str, site: Rounding) -> torch.Tensor:
    """The rounded values ``y`` (in their float32/float64 container) in ``dtype``: exact, or a
    ValueError naming the side, format and dtype where the dtype cannot hold them."""
    if y.dtype == dtype:
        return y
    cast = y.to(dtype)
    back = cast.to(y.dtype)
    bad = ~((back == y) | (back.isnan() & y.isnan()))
    if bool(bad.any()):
        value = float(y[bad].reshape(-1)[0])
        raise ValueError(f"quantizer {side}: {dtype} input rounded to {site.fmt} gives "
                         f"{value!r}, which {dtype} cannot hold; accepted: a format whose "
                         f"values {dtype} holds, or a float32 input")
    return cast


class _Round(torch.autograd.Function):
    """Forward ``fwd(x)``, backward ``bwd(grad)``; both come back in x's dtype."""

    @staticmethod
    def forward(ctx, x, fwd: Rounding, bwd: Rounding):
        ctx.bwd, ctx.dtype = bwd, x.dtype
        y = fwd(x, x.dtype, "forward")
        return x.view_as(x) if y is x else y

    @staticmethod
    def backward(ctx, grad):
        return ctx.bwd(grad, grad.dtype, "backward").to(ctx.dtype), None, None


def _side(fmt, rounding, generator, stats, sr_bits) -> Rounding:
    if isinstance(fmt, Rounding):
        return fmt
    return Rounding(fmt, rounding, generator, stats, sr_bits)


class Quantize:
    """What :func:`quantizer` returns: ``q(x)`` rounds x forward and its gradient backward;
    ``forward`` and ``backward`` are the two :class:`Rounding` sites.  A plain object (no
    closure), so modules holding one pickle."""

    def __init__(self, forward: Rounding, backward: Rounding):
        self.forward, self.backward = forward, backward

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"quantizer input is a {type(x).__name__}; accepted: a torch tensor")
        return _Round.apply(x, self.forward, self.backward)

    def __repr__(self) -> str:
        f, b = self.forward, self.backward
        return f"quantizer(forward={f.fmt} {f.rounding}, backward={b.fmt} {b.rounding})"


def quantizer(forward_fmt=None, backward_fmt=None, forward_rounding: str = "nearest",
              backward_rounding: str = "nearest", *, generator: Generator | None = None,
              forward_stats: RoundingStats | None = None,
              backward_stats: RoundingStats | None = None, sr_bits: int | None = None):
    """A function q(x): forward rounds x to ``forward_fmt``, backward rounds the incoming
    gradient to ``backward_fmt`` (None: identity on that side); the result and the gradient
    keep x's dtype.

    Either format may also be a :class:`Rounding` (its own mode, generator and stats).
    ``generator`` keys the stochastic modes of both sides (fresh bits every call).
    """
    return Quantize(_side(forward_fmt, forward_rounding, generator, forward_stats, sr_bits),
                    _side(backward_fmt, backward_rounding, generator, backward_stats, sr_bits))


class Quantizer(torch.nn.Module):
    """:func:`quantizer` as a module: ``Quantizer(forward_fmt, backward_fmt, forward_rounding,
    backward_rounding)``; its ``forward_rounding`` and ``backward_rounding`` attributes are the
    two sides (:class:`Rounding`)."""

    def __init__(self, forward_fmt=None, backward_fmt=None, forward_rounding: str = "nearest",
                 backward_rounding: str = "nearest", **kwargs):
        super().__init__()
        self.quantize = quantizer(forward_fmt, backward_fmt, forward_rounding,
                                  backward_rounding, **kwargs)
        self.forward_rounding, self.backward_rounding = (self.quantize.forward,
                                                         self.quantize.backward)

    def forward(self, x):
        return self.quantize(x)

    def extra_repr(self) -> str:
        f, b = self.forward_rounding, self.backward_rounding
        return f"forward={f.fmt} {f.rounding}, backward={b.fmt} {b.rounding}"


__all__ = ["quantizer", "Quantizer", "Quantize", "Rounding"]
