"""A drop-in for qtorch 0.3 (``qtorch.quant``, ``qtorch.optim``, ``qtorch.number``) on lpsim.

Same signatures, and qtorch's own results bit for bit where qtorch is deterministic
("nearest"); its "stochastic" draws lpsim's Philox bits (``generator=`` keyword) with the
same probabilities.  The rounding step is lpsim's; qtorch's arithmetic around it (shifts,
clips) is repeated in float32 as qtorch does it.  How each differs from ``lpsim.quantize``:

``float_quantize(x, exp, man)``
  bias 2**(exp-1) - 1, and the top exponent code holds finite numbers: for exp < 8 this is
  ``fp(exp, man, specials="saturate")`` (no inf, overflow and inf saturate to +-max), for
  exp >= 8 it is ``fp(8, man)`` (the float32 carry gives inf; exp up to 31, and above 8
  without qtorch's subnormal step, as qtorch computes it).  man = 23 (``FloatingPoint(8,
  23)``, float32 itself) keeps every bit.  "nearest" rounds ties *away*
  from zero (lpsim's "nearest_away", not IEEE's ties-to-even).  Below 2**emin qtorch rounds
  ``x + sign(x) 2**emin`` in float32 first (a double rounding: a value just off a midpoint
  of the subnormal grid can round the wrong way) and returns +0 for -0 and for negative
  values that round to zero (lpsim keeps the sign); exp >= 9 keeps the sign.  NaN becomes
  +-max for exp < 8 (kept for exp >= 8); with man = 0 a NaN becomes -0 or +0 (the add
  carries into the sign bit).
``fixed_point_quantize(x, wl, fl, clamp, symmetric)``
  "nearest" is qtorch's ``nearbyint(float32(a + 0.5) - 0.5)`` with ``a = x 2**fl``: ties to
  even as ``lpsim.fixed`` rounds, except where the float32 add rounds: ``a`` just above a
  midpoint below a power of two (``a = 0.5 + 2**-24`` gives 0, lpsim 1) and odd integers
  ``2**23 <= |a| < 2**24`` (``a + 1``, toward +inf); -0 becomes +0.  The clamp bounds are
  rounded to float32 (for wl > 25 the top bound is ``2**(wl-fl-1)``, outside the format);
  clamp=False rounds to the grid without bounds.  "stochastic" is ``lpsim.fixed``'s.
``block_quantize(x, wl, dim)``
  one exponent per slice along ``dim`` (dim=-1: the whole tensor), that of the largest
  magnitude; values round to ``wl`` bits below ``2**(e+2)`` by adding ``6 * 2**e`` in
  float32 and rounding ties away, then clip to the largest ``wl-2``-bit mantissa at ``e``.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch
from torch.optim import SGD, Adam, Optimizer

from ..fixed import Fixed
from ..formats import fp
from .tensors import round_detached

ROUNDINGS = ("stochastic", "nearest")


# --- qtorch.number --------------------------------------------------------------------------
class Number:
    """Base class of the number formats (qtorch.Number)."""


def _flag(name: str, value, numbers_too: bool = True) -> bool:
    """A bool option as qtorch takes it: True or False (numpy's too) and, where qtorch's
    binding converts them (``numbers_too``), None and numbers by their truth; a string
    ("False" from a config file would be true) or another object is a TypeError naming it,
    as qtorch refuses it."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if numbers_too and (value is None or isinstance(value, numbers.Real)):
        return bool(value)
    raise TypeError(f"{name}={value!r} is not a bool; accepted: True or False"
                    + (" (or a number, as qtorch's binding converts it)" if numbers_too else ""))


class FixedPoint(Number):
    """wl-bit fixed point with fl fraction bits (qtorch.FixedPoint)."""

    def __init__(self, wl, fl, clamp=True, symmetric=False):
        wl, fl = _width(wl), _width(fl)
        if not (isinstance(wl, int) and wl > 0 and isinstance(fl, int) and fl > 0):
            raise ValueError(f"FixedPoint(wl={wl!r}, fl={fl!r}): both must be positive integers")
        # qtorch asserts a bool symmetric and keeps clamp as given (its binding converts it)
        self.wl, self.fl = wl, fl
        self.clamp, self.symmetric = _flag("clamp", clamp), _flag("symmetric", symmetric, False)

    def __repr__(self):
        return f"FixedPoint (wl={self.wl:d}, fl={self.fl:d})"


class BlockFloatingPoint(Number):
    """Block floating point: wl bits, one exponent per slice along dim (qtorch's)."""

    def __init__(self, wl, dim=-1):
        wl, dim = _width(wl), _width(dim)
        if not (isinstance(wl, int) and wl > 0 and isinstance(dim, int) and dim >= -1):
            raise ValueError(f"BlockFloatingPoint(wl={wl!r}, dim={dim!r}): wl > 0, dim >= -1")
        self.wl, self.dim = wl, dim

    def __repr__(self):
        return f"BlockFloatingPoint (wl={self.wl:d}, dim={self.dim:d})"


class FloatingPoint(Number):
    """exp exponent bits (1..8), man mantissa bits (1..23), as qtorch.FloatingPoint takes
    them; (8, 23) is float32 itself, which its quantizers keep bit for bit (-0 aside)."""

    def __init__(self, exp, man):
        exp, man = _width(exp), _width(man)
        if not (isinstance(exp, int) and 0 < exp <= 8 and isinstance(man, int)
                and 0 < man <= 23):
            raise ValueError(f"FloatingPoint(exp={exp!r}, man={man!r}): 1 <= exp <= 8, "
                             "1 <= man <= 23")
        self.exp, self.man = exp, man

    def __repr__(self):
        return f"FloatingPoint (exponent={self.exp:d}, mantissa={self.man:d})"


# --- checks ---------------------------------------------------------------------------------
def _width(value):
    """A width or axis as qtorch's pybind11 arguments take it: a numpy integer or a bool as
    its int (qtorch accepts them), anything else as it is, for the range checks to refuse."""
    return int(value) if isinstance(value, (np.integer, bool)) else value


def _check(x, rounding):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x is a {type(x).__name__}; qtorch quantizers take a torch.float32 "
                        "tensor")
    if x.dtype != torch.float32:
        raise TypeError(f"x has dtype {x.dtype}; qtorch quantizers take torch.float32 "
                        "(lpsim.torch.quantize takes any float dtype)")
    if rounding not in ROUNDINGS:
        raise ValueError(f"invalid rounding mode {rounding!r}; accepted: stochastic, nearest")


def _mode(rounding, ties_away=True):
    if rounding == "stochastic":
        return "stochastic"
    return "nearest_away" if ties_away else "nearest"


def _round(t, fmt, mode, generator):
    from ..generator import resolve
    seed, stream, offset = resolve(generator, t, mode, None, 0, 0)
    return round_detached(t, fmt, mode, seed=seed, stream=stream, sr_bits=None, stats=None,
                          offset=offset)


def _bits(t):
    return t.view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def _float(bits):
    b = bits & 0xFFFFFFFF
    return torch.where(b >= 2 ** 31, b - 2 ** 32, b).to(torch.int32).view(torch.float32)


# --- qtorch.quant ---------------------------------------------------------------------------
def _round_man(t, man, mode, generator):
    """float32 ``t`` rounded to ``man`` mantissa bits with float32's exponent range (qtorch's
    round_bitwise); man = 23 drops no bit."""
    return t.clone() if man == 23 else _round(t, fp(8, man), mode, generator)


#: float_quantize's exponent widths: qtorch's C++ shifts 1 << (exp - 1) are defined up to 31
MAX_EXP = 31


def float_quantize(x, exp, man, rounding="stochastic", *, generator=None):
    """qtorch's float_quantize: x (float32) to ``exp`` exponent and ``man`` mantissa bits,
    1 <= exp <= 31 and 0 <= man <= 23 (qtorch's results; exp >= 9 has no subnormal or clip
    step, so it rounds as exp = 8 does, keeping -0; man = 23 keeps every bit and only clips
    the exponent, which is qtorch's "stochastic" result, where its "nearest" shifts by -1,
    undefined in C, and flips the sign)."""
    _check(x, rounding)
    exp, man = _width(exp), _width(man)
    if not (isinstance(exp, int) and 1 <= exp <= MAX_EXP and isinstance(man, int)
            and 0 <= man <= 23):
        raise ValueError(f"float_quantize(exp={exp!r}, man={man!r}): accepted 1 <= exp <= "
                         f"{MAX_EXP}, 0 <= man <= 23 (the widths qtorch's kernels define)")
    mode = _mode(rounding)
    x = x.detach().resolve_neg().contiguous()     # a lazily negated view has no bits
    bits = _bits(x)
    top = (1 << (exp - 1)) + 127        # the largest stored exponent: none kept for inf/NaN
    max_man = (0x7FFFFF >> (23 - man)) << (23 - man)
    y = _round_man(x, man, mode, generator)
    if top < 255:                        # qtorch's clip_exponent: beyond the top to +-max
        q = _bits(y)
        clip = (q != 0) & (((q >> 23) & 0xFF) > top)
        if bool(clip.any()):
            y = torch.where(clip, _float((bits & 0x80000000) | (top << 23) | max_man), y)
    min_exp = 2 - 2 ** (exp - 1)
    sub = ((bits >> 23) & 0xFF) - 127 < min_exp          # zeros too, as qtorch
    if bool(sub.any()):
        shift = torch.full_like(x[sub], math.ldexp(1.0, min_exp)).copysign(x[sub])
        y[sub] = _round_man(x[sub] + shift, man, mode, generator) - shift
    nan = torch.isnan(x)
    if bool(nan.any()):      # qtorch's bit arithmetic on NaN patterns, step by step
        b = bits[nan]
        half = 0 if man == 23 else 1 << (22 - man)
        q = (b + half) & 0xFFFFFFFF & ~((1 << (23 - man)) - 1)
        clip = (q != 0) & (((q >> 23) & 0xFF) > top)
        q = torch.where(clip, (b & 0x80000000) | (top << 23) | max_man, q)
        y[nan] = _float(q)
    return y


def _unclamped_grid(x, fl, mode, generator):
    """x rounded to multiples of 2**-fl (qtorch's clamp=False), float32."""
    big = x.abs() >= math.ldexp(1.0, 23 - fl)           # already on the grid
    y = _round(x.double(), Fixed(25, fl).carrier, mode, generator).float()
    return torch.where(big | ~torch.isfinite(x), x, y)


def _bounds(wl, fl, symmetric):
    """qtorch's clamp bounds, computed in double and stored in float32 as it does."""
    t_min = -math.ldexp(1.0, wl - fl - 1)
    t_max = -t_min - math.ldexp(1.0, -fl)
    if symmetric:
        t_min += math.ldexp(1.0, -fl)
    f32 = lambda v: torch.tensor(v, dtype=torch.float32).item()  # noqa: E731
    return f32(t_min), f32(t_max)


def _fixed_point(x, wl, fl, clamp, symmetric, rounding, generator):
    """(quantized x, mask of the clamped elements), as qtorch's *_mask kernels."""
    _check(x, rounding)
    clamp, symmetric = _flag("clamp", clamp), _flag("symmetric", symmetric)
    wl, fl = _width(wl), _width(fl)
    if not (isinstance(wl, int) and isinstance(fl, int) and wl >= 1 and -100 <= fl <= 100):
        raise ValueError(f"fixed_point_quantize(wl={wl!r}, fl={fl!r}): wl >= 1, |fl| <= 100")
    x = x.detach().resolve_neg().contiguous()     # a lazily negated view has no bits
    if rounding == "nearest":   # qtorch's steps: nearbyint(float32(x 2^fl + 0.5) - 0.5)
        s = x * math.ldexp(1.0, fl) + 0.5
        y = torch.round(s.double() - 0.5).float() * math.ldexp(1.0, -fl)
    else:
        y = _unclamped_grid(x, fl, "stochastic", generator)
    t_min, t_max = _bounds(wl, fl, symmetric)
    mask = (y > t_max) | (y < t_min)
    if clamp:
        y = torch.where(y > t_max, torch.full_like(y, t_max),
                        torch.where(y < t_min, torch.full_like(y, t_min), y))
    return y, mask


def fixed_point_quantize(x, wl, fl, clamp=True, symmetric=False, rounding="stochastic", *,
                         generator=None):
    """qtorch's fixed_point_quantize: x (float32) to wl-bit fixed point, fl fraction bits."""
    return _fixed_point(x, wl, fl, clamp, symmetric, rounding, generator)[0]


def _block_max(x, dim):
    a = x.abs()
    if dim == -1:
        return a.max().expand_as(x)
    other = [d for d in range(x.dim()) if d != dim]
    return a.amax(dim=other, keepdim=True).expand_as(x) if other else a


def block_quantize(x, wl, dim=-1, rounding="stochastic", *, generator=None):
    """qtorch's block_quantize: x (float32) to wl-bit block floating point along ``dim``."""
    _check(x, rounding)
    wl, dim = _width(wl), _width(dim)
    if not (isinstance(wl, int) and 1 <= wl <= 22 and isinstance(dim, int)
            and -1 <= dim < max(x.dim(), 1)):
        raise ValueError(f"block_quantize(wl={wl!r}, dim={dim!r}): 1 <= wl <= 22 and dim -1 "
                         f"(whole tensor) or an axis of x ({x.dim()} axes)")
    x = x.detach().resolve_neg().contiguous()     # a lazily negated view has no bits
    if x.numel() == 0:
        return x.clone()
    max_exp = (_bits(_block_max(x, dim).contiguous()) >> 23 & 0xFF) << 23
    base = _float(max_exp) * 6
    target = x + base
    quantized = _round(target, fp(8, wl), _mode(rounding), generator) - base
    q = _bits(quantized)
    man = wl - 2
    max_man = (0x7FFFFF >> (23 - man)) << (23 - man) if man >= 0 else 0
    over = ((q >> 23) & 0xFF) << 23 > max_exp
    return _float(torch.where(over, (q & 0x80000000) | max_exp | max_man, q))


class _QuantFn:
    """The function t -> t quantized to ``number`` (lpsim's or qtorch's Number classes);
    a plain object, so quantizers holding one pickle."""

    KINDS = ("FloatingPoint", "FixedPoint", "BlockFloatingPoint")

    def __init__(self, number, rounding, generator):
        self.kind = type(number).__name__
        if self.kind not in self.KINDS:
            raise TypeError(f"{number!r} is not a FloatingPoint, FixedPoint or "
                            "BlockFloatingPoint")
        self.number, self.rounding, self.generator = number, rounding, generator

    def __call__(self, t):
        n, r, g = self.number, self.rounding, self.generator
        if self.kind == "FloatingPoint":
            return float_quantize(t, n.exp, n.man, r, generator=g)
        if self.kind == "FixedPoint":
            return fixed_point_quantize(t, n.wl, n.fl, n.clamp, n.symmetric, r, generator=g)
        return block_quantize(t, n.wl, n.dim, r, generator=g)


def _quant_fn(number, rounding, generator):
    return None if number is None else _QuantFn(number, rounding, generator)


class _Rounding(torch.autograd.Function):
    """qtorch's quantizer Function: forward and backward of a :class:`_Quantize`."""

    @staticmethod
    def forward(ctx, x, q):
        ctx.mask, ctx.q = None, q
        if q.forward_number is None:
            return x.view_as(x)
        if q.clamping_grad_zero:
            n = q.forward_number
            out, ctx.mask = _fixed_point(x, n.wl, n.fl, True, n.symmetric, q.forward_rounding,
                                         q.generator)
            return out
        return q.fwd(x)

    @staticmethod
    def backward(ctx, grad):
        q = ctx.q
        if not ctx.needs_input_grad[0]:
            return None, None
        if q.bwd is None:
            return grad, None
        if q.clamping_grad_zero:
            for hook in q.backward_hooks:
                grad = hook(grad)
            grad = q.bwd(grad.contiguous())
            return (grad if ctx.mask is None else grad.masked_fill(ctx.mask, 0)), None
        return q.bwd(grad.contiguous()), None


class _Quantize:
    """What :func:`quantizer` returns (qtorch returns a Function's ``apply``): ``q(x)``.
    A plain object, so modules holding one pickle (``backward_hooks`` must, too)."""

    def __init__(self, forward_number, backward_number, forward_rounding, backward_rounding,
                 clamping_grad_zero, backward_hooks, generator):
        self.forward_number, self.backward_number = forward_number, backward_number
        self.forward_rounding, self.backward_rounding = forward_rounding, backward_rounding
        self.clamping_grad_zero, self.backward_hooks = clamping_grad_zero, backward_hooks
        self.generator = generator
        self.fwd = _quant_fn(forward_number, forward_rounding, generator)
        self.bwd = _quant_fn(backward_number, backward_rounding, generator)

    def __call__(self, x):
        return _Rounding.apply(x, self)


def quantizer(forward_number=None, backward_number=None, forward_rounding="stochastic",
              backward_rounding="stochastic", clamping_grad_zero=False, backward_hooks=(),
              *, generator=None):
    """qtorch's quantizer(): forward quantizes x, backward the incoming gradient."""
    for r in (forward_rounding, backward_rounding):
        if r not in ROUNDINGS:
            raise ValueError(f"invalid rounding type {r!r}; accepted: stochastic, nearest")
    q = _Quantize(forward_number, backward_number, forward_rounding, backward_rounding,
                  clamping_grad_zero, tuple(backward_hooks), generator)
    if clamping_grad_zero and forward_number is not None and \
            (type(forward_number).__name__ != "FixedPoint" or not forward_number.clamp):
        raise ValueError("zeroing clamping gradient only supports fixed point with clamp=True")
    return q


class Quantizer(torch.nn.Module):
    """qtorch's Quantizer module."""

    def __init__(self, forward_number=None, backward_number=None,
                 forward_rounding="stochastic", backward_rounding="stochastic", *,
                 generator=None):
        super().__init__()
        self.quantize = quantizer(forward_number, backward_number, forward_rounding,
                                  backward_rounding, generator=generator)

    def forward(self, x):
        return self.quantize(x)


# --- qtorch.optim ---------------------------------------------------------------------------
class OptimLP(Optimizer):
    """qtorch's OptimLP: quantize gradients (after ``grad_scaling``) before, and weights,
    accumulators and momenta after, the wrapped SGD or Adam step.  A ``closure`` is
    evaluated first (grad enabled), as torch.optim evaluates it, so the gradients it makes
    are the ones quantized, and its loss is returned; qtorch's OptimLP never calls it (it
    returns None and steps the gradients already there)."""

    def __init__(self, optim, weight_quant=None, grad_scaling=1.0, grad_quant=None,
                 momentum_quant=None, acc_quant=None):
        if not isinstance(optim, (SGD, Adam)):
            raise TypeError(f"OptimLP wraps torch.optim.SGD or Adam, not {type(optim).__name__}")
        if not grad_scaling > 0:
            raise ValueError(f"grad_scaling={grad_scaling!r} must be positive")
        super().__init__(optim.param_groups, optim.defaults)
        self.param_groups, self.optim = optim.param_groups, optim
        self.grad_scaling = grad_scaling
        self.weight_quant, self.grad_quant = weight_quant, grad_quant
        self.momentum_quant, self.acc_quant = momentum_quant, acc_quant
        self.momentum_keys = (["momentum_buffer"] if isinstance(optim, SGD)
                              else ["exp_avg", "exp_avg_sq"])
        if acc_quant is not None:
            self.weight_acc = {p: p.detach().clone() for g in self.param_groups
                               for p in g["params"]}

    def _params(self):
        return [p for g in self.param_groups for p in g["params"]]

    def step(self, closure=None):
        loss = None
        if closure is not None:
            # before the gradients are quantized: the wrapped step would call it after, and
            # its backward pass would replace them with unquantized ones (at the
            # accumulators' weights, with acc_quant)
            with torch.enable_grad():
                loss = closure()
        if self.grad_quant is not None:
            for p in self._params():
                if p.grad is not None:
                    p.grad.data = self.grad_quant(p.grad.data * self.grad_scaling)
        if self.acc_quant is not None:
            for p in self._params():
                p.data = self.weight_acc[p].data
        self.optim.step()
        if self.acc_quant is not None:
            for p in self._params():
                p.data = self.weight_acc[p].data = self.acc_quant(p.data).data
        if self.weight_quant is not None:
            for p in self._params():
                p.data = self.weight_quant(p.data).data
        if self.momentum_quant is not None:
            for g in self.param_groups:
                if isinstance(self.optim, SGD) and g["momentum"] == 0:
                    continue
                for p in g["params"]:
                    if p.grad is None:
                        continue
                    state = self.optim.state[p]
                    for key in self.momentum_keys:
                        state[key] = self.momentum_quant(state[key])
        return loss

    def __repr__(self):
        return f"LP Optimizer: {self.optim!r}"


__all__ = ["float_quantize", "fixed_point_quantize", "block_quantize", "quantizer",
           "Quantizer", "OptimLP", "FloatingPoint", "FixedPoint", "BlockFloatingPoint",
           "Number"]
