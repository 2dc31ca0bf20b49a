"""Error-bound constants for inner products: Higham's gamma and the input-cast factor."""

from __future__ import annotations

import math
import numbers


def _check(fn, name, value, integer=False):
    """Reject what the bounds say nothing about: bools, NaN, inf, negatives, fractional n."""
    kinds = numbers.Integral if integer else numbers.Real
    if isinstance(value, bool) or not isinstance(value, kinds) or value < 0 or \
            not (integer or math.isfinite(value)):
        what = "a non-negative integer" if integer else "a finite non-negative real number"
        raise ValueError(f"{fn}: {name}={value!r} is not accepted; accepted: {what}")


def _gamma(fn, n, u, u_name):
    _check(fn, "n", n, integer=True)
    _check(fn, u_name, u)
    nu = n * u
    if nu >= 1:
        raise ValueError(f"gamma(n={n}, {u_name}={u}) is undefined: n*u = {nu} >= 1; "
                         "accepted: n*u < 1")
    return nu / (1 - nu)


def gamma(n, u) -> float:
    """gamma_n(u) = n u / (1 - n u): |fl(x^T y) - x^T y| <= gamma_n |x|^T |y| (Eq. 1).

    n: a non-negative integer (numpy integers too); u: a finite non-negative real.  Raises
    ValueError otherwise, and when n u >= 1, where the bound says nothing.
    """
    return _gamma("gamma", n, u, "u")


def input_cast_factor(n, u_low, u_acc) -> float:
    """2 u_low + gamma_n(u_acc): two input casts to u_low then accumulation in u_acc (Eq. 8).

    The same checks as :func:`gamma`, on n, u_low and u_acc.
    """
    _check("input_cast_factor", "u_low", u_low)
    return 2 * u_low + _gamma("input_cast_factor", n, u_acc, "u_acc")
