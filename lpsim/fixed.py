"""Fixed-point formats ``lpsim.fixed(wl, fl)``: signed wl-bit integers scaled by 2**-fl.

The values are ``k * 2**-fl`` with ``-2**(wl-1) <= k <= 2**(wl-1) - 1`` (symmetric: ``k >=
-(2**(wl-1) - 1)``); finite values beyond the range saturate to its ends, inf saturates,
NaN is kept.  Rounding reuses lpsim's scalar core: below its smallest normal number a float
format has one quantum, so ``fp(2, wl-1, fl-wl+1, specials="saturate")`` (the *carrier*,
quantum ``2**-fl`` on all of ``[-2**(wl-fl), 2**(wl-fl)]``) rounds exactly as the fixed
grid does, in every mode and with the same random bits; the result is then clamped.

Counters (``stats=``): overflow = finite values that saturated, underflow = nonzero finite
values rounded to 0, inexact = results that differ from the input; subnormal is always 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from ._extras import is_torch
from .formats import Format, fp
from .request import as_container_array, check_out as _check_out, check_scalar_out
from .request import is_cuda_array, wide_ints
from .stats import check_stats


@dataclass(frozen=True)
class Fixed:
    """The fixed-point format of word length ``wl`` (sign included), ``fl`` fraction bits."""

    wl: int
    fl: int
    symmetric: bool = False

    def __post_init__(self):
        for name in ("wl", "fl"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"fixed(): {name}={value!r} must be an integer")
            object.__setattr__(self, name, int(value))
        if not 1 <= self.wl <= 53:
            raise ValueError(f"fixed(): wl={self.wl} is out of range; accepted: 1 <= wl <= 53 "
                             "(24 in float32 containers)")
        # rounding runs on the carrier, whose range reaches 2**(wl-fl+1): it and the quantum
        # 2**-fl must be finite and nonzero in float64, or no container can hold the grid
        lo_fl, hi_fl = self.wl - 1022, 1074
        if not lo_fl <= self.fl <= hi_fl:
            raise ValueError(
                f"fixed(): fl={self.fl} is out of range for wl={self.wl}; accepted: {lo_fl} <= "
                f"fl <= {hi_fl} (wl - 1022 <= fl <= 1074: the quantum 2**-fl must be nonzero "
                "in float64 and the rounding range, up to 2**(wl-fl+1), finite there)")
        if not isinstance(self.symmetric, (bool, np.bool_)):
            raise TypeError(f"fixed(): symmetric={self.symmetric!r} must be True or False")
        if self.symmetric and self.wl < 2:
            raise ValueError("fixed(): symmetric=True needs wl >= 2")
        object.__setattr__(self, "symmetric", bool(self.symmetric))

    @property
    def bits(self) -> int:
        return self.wl

    @property
    def quantum(self) -> float:
        return math.ldexp(1.0, -self.fl)

    @property
    def max_finite(self) -> float:
        return math.ldexp(2 ** (self.wl - 1) - 1, -self.fl)

    @property
    def min_finite(self) -> float:
        """The most negative value."""
        return -self.max_finite if self.symmetric else -math.ldexp(2 ** (self.wl - 1), -self.fl)

    @property
    def carrier(self) -> Format:
        """The float format whose rounding below min_normal is this grid's rounding."""
        return fp(2, self.wl - 1, self.fl - self.wl + 1, specials="saturate")

    def __repr__(self) -> str:
        return f"fixed({self.wl},{self.fl}{', symmetric=True' if self.symmetric else ''})"

    __str__ = __repr__


def fixed(wl: int, fl: int, *, symmetric: bool = False) -> Fixed:
    """The fixed-point format of ``wl`` bits with ``fl`` fraction bits (saturating)."""
    return Fixed(wl, fl, symmetric)


def _count(x, y, lo, hi, rounded):
    """The six counters (lpsim.stats.COUNTERS order) of rounding ``x`` to ``y``."""
    if isinstance(x, np.ndarray):
        x, y, rounded = np.asarray(x, np.float64), np.asarray(y, np.float64), np.asarray(rounded)
        fin, nan = np.isfinite(x), np.isnan(x)
        inf = np.isinf(x)
        s = lambda m: int(np.count_nonzero(m))  # noqa: E731
    else:
        import torch
        x, y, rounded = x.detach().double(), y.detach().double(), rounded.detach()
        fin, nan, inf = torch.isfinite(x), torch.isnan(x), torch.isinf(x)
        s = lambda m: int(m.sum())  # noqa: E731
    inexact = s(fin & (y != x)) + s(inf)
    overflow = s(fin & ((rounded > hi) | (rounded < lo)))
    underflow = s(fin & (x != 0) & (y == 0))
    return [inexact, overflow, underflow, 0, s(nan), s(inf)]


def _count_scalar(x, y, lo, hi, rounded):
    """_count of one Python or numpy number, compared exactly (a Python int beyond float64,
    such as 10**400, is a finite value that saturated; so is a long double beyond it, and
    one with more bits than float64's is inexact however close to the grid)."""
    if isinstance(x, (int, np.integer)):
        x, fin, nan, inf = int(x), True, False, False
    elif isinstance(x, np.floating) and x.dtype.itemsize > 8:
        fin, nan, inf = bool(np.isfinite(x)), bool(np.isnan(x)), bool(np.isinf(x))
        x = Fraction(*x.as_integer_ratio()) if fin else float(x)
    else:
        x = float(x)
        fin, nan, inf = math.isfinite(x), math.isnan(x), math.isinf(x)
    y, rounded = float(y), float(rounded)
    return [int(fin and y != x) + inf, int(fin and (rounded > hi or rounded < lo)),
            int(fin and x != 0 and y == 0), 0, int(nan), int(inf)]


def _round_exact_values(quantize, objects, x, fmt, rounding, kwargs, stats, out):
    """quantize_fixed of a list holding such ints: the carrier rounding of lpsim.quantize,
    which rounds each from its exact value, then the clamp; each element counted from its
    exact value."""
    if out is not None:             # before anything is rounded, written or counted
        _check_out(out, np.empty(objects.shape, np.float64))
    rounded = np.asarray(_carrier_round(quantize, x, fmt, rounding, kwargs), np.float64)
    lo, hi = fmt.min_finite, fmt.max_finite
    y = np.clip(rounded, lo, hi)
    if stats is not None:
        stats.add(y.size, np.sum([_count_scalar(v, yi, lo, hi, ri) for v, yi, ri in zip(
            objects.reshape(-1), y.reshape(-1), rounded.reshape(-1))], axis=0).tolist())
    if out is not None:
        np.copyto(out, y)
        return out
    return y


def _carrier_round(quantize, x, fmt, rounding, kwargs):
    try:
        return quantize(x, fmt.carrier, rounding, **kwargs)
    except ValueError as error:
        if "does not fit" not in str(error):
            raise
        raise ValueError(f"{fmt} does not fit the container of x (its rounding runs in the "
                         f"carrier {fmt.carrier}: {error}); accepted: float64 data, which "
                         "takes the fixed formats of wl <= 53 (float32 data takes wl <= 24 "
                         "where the carrier's exponents fit float32's)") from None


def quantize_fixed(x, fmt: Fixed, rounding="nearest", *, seed=None, stream=0, sr_bits=None,
                   stats=None, out=None, offset=0, generator=None, round_with=None):
    """Round ``x`` to the fixed-point format ``fmt``: :func:`lpsim.quantize`'s contract.

    ``round_with``: what rounds ``x`` to the carrier format (``lpsim.quantize`` passes
    itself: this backend sits below the front and does not import it); then the values are
    clamped to the range.  Torch tensors: the gradient is the straight-through one inside
    the range and 0 where a value saturated (torch.clamp's).
    """
    if round_with is None:
        raise TypeError("quantize_fixed rounds through the carrier rounder it is given; call "
                        "lpsim.quantize(x, lpsim.fixed(wl, fl), ...), or pass "
                        "round_with=lpsim.quantize")
    quantize = round_with
    check_stats(stats)
    lo, hi = fmt.min_finite, fmt.max_finite
    kwargs = dict(seed=seed, stream=stream, sr_bits=sr_bits, offset=offset, generator=generator)
    if isinstance(x, (int, float, np.floating, np.integer)) and not isinstance(x, bool):
        check_scalar_out(x, out)
        rounded = _carrier_round(quantize, x, fmt, rounding, kwargs)
        y = type(rounded)(min(max(rounded, lo), hi)) if rounded == rounded else rounded
        if stats is not None:
            stats.add(1, _count_scalar(x, y, lo, hi, rounded))
        return y
    if is_torch(x):
        if out is not None:             # refused before a random word is drawn
            from .tensors import check_out
            check_out(x, out)
        rounded = _carrier_round(quantize, x, fmt, rounding, kwargs)
        y = rounded.clamp(lo, hi)
        # counted before out is written (out may be x) and added once it was written
        counts = None if stats is None else _count(x, y, lo, hi, rounded)
        if out is not None:
            # write through lpsim.quantize's tensor rules (version counter, leaf refusal): the
            # values are on the carrier's grid, so rounding them again is exact
            y = quantize(y, fmt.carrier, "nearest", out=out)
        if stats is not None:
            stats.add(x.numel(), counts)
        return y
    if isinstance(x, (list, tuple)) and (found := wide_ints(x)) is not None:
        # such ints: numpy would make them float64 first, a double rounding
        return _round_exact_values(quantize, found[0], x, fmt, rounding, kwargs, stats, out)
    if not is_cuda_array(x):
        # array-likes and other dtypes in their container, as lpsim.quantize converts them
        x = as_container_array(x)
        if out is not None:
            _check_out(out, x)      # before anything is rounded, written or counted
        rounded = _carrier_round(quantize, x, fmt, rounding, kwargs)
        if stats is None:       # rounded is a fresh array: clamped in place (a 0-d one too)
            return np.clip(rounded, lo, hi, out=rounded if out is None else out)
        y = np.clip(rounded, lo, hi, out=np.empty_like(rounded))
        counts = _count(x, y, lo, hi, rounded)     # x intact: out is written after this
        if out is not None:
            np.copyto(out, y)
            y = out
        stats.add(x.size, counts)
        return y
    raise TypeError(f"cannot round a {type(x).__name__} to {fmt}; accepted: a float32/float64 "
                    "numpy array or array-like, a Python or numpy number, a torch tensor (on a "
                    "GPU too; other device arrays are not: copy one to the host first)")


__all__ = ["Fixed", "fixed", "quantize_fixed"]
