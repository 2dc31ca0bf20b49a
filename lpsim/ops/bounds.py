"""Error-bound constants for inner products: Higham's gamma and the input-cast factor."""

from __future__ import annotations

import numbers


def _check(name, value, integer=False):
    kinds = numbers.Integral if integer else numbers.Real
    if isinstance(value, bool) or not isinstance(value, kinds) or value < 0:
        what = "a non-negative integer" if integer else "a non-negative real number"
        raise ValueError(f"{name}={value!r} is not accepted; accepted: {what}")


def gamma(n, u) -> float:
    """gamma_n(u) = n u / (1 - n u): |fl(x^T y) - x^T y| <= gamma_n |x|^T |y| (Eq. 1).

    Raises ValueError when n u >= 1, where the bound says nothing.
    """
    _check("n", n, integer=True)
    _check("u", u)
    nu = n * u
    if nu >= 1:
        raise ValueError(f"gamma(n={n}, u={u}) is undefined: n*u = {nu} >= 1; accepted: "
                         "n*u < 1")
    return nu / (1 - nu)


def input_cast_factor(n, u_low, u_acc) -> float:
    """2 u_low + gamma_n(u_acc): two input casts to u_low then accumulation in u_acc (Eq. 8)."""
    _check("u_low", u_low)
    return 2 * u_low + gamma(n, u_acc)
