"""The local error bound of one CA-SGD outer iteration, term by term (Theorem 5.7)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.linalg import solve_triangular

from .losses import get_loss
from .recipes import RECIPES, SLOTS, Recipe, Rounder, Slot, as_recipe
from .solvers import block_columns, check_data, check_eta, check_int, outer_iteration


def higham_gamma(q: int, u: float) -> float:
    """gamma_q(u) = qu / (1 - qu) (Eq. (1)); inf outside its domain qu < 1."""
    return q * u / (1 - q * u) if q * u < 1 else math.inf


#: modes whose error is at most u = 2^-p (half an ulp); the others err by less than 2u
_NEAREST_MODES = ("nearest", "nearest_away")


def slot_u(slot: Slot, fmt=None) -> float:
    """The unit roundoff a slot's rounding is charged: u of ``fmt`` (default the slot's) to
    nearest, 2u for directed, odd and stochastic rounding (an error below one ulp)."""
    u = (fmt or slot.fmt).unit_roundoff
    return u if slot.rounding in _NEAREST_MODES else 2 * u


def kernel_gamma(slot: Slot, q: int) -> float:
    """Higham factor of a length-q GEMM/GEMV at a slot: gamma_q(u) for one format, else
    2 u_in + gamma_q(u_acc) (Eq. (8)), plus u_out when the result is rounded narrower (the
    BF16 margin output of Table 1; the paper folds that cast into C(P) u_AR_r).  Input casts
    round to nearest; the accumulator (when it is the input format) and the output are
    charged the slot's mode (:func:`slot_u`)."""
    u_in = slot.fmt.unit_roundoff
    u_acc = (slot_u(slot, slot.acc_fmt) if slot.acc_fmt == slot.fmt
             else slot.acc_fmt.unit_roundoff)
    u_out = slot_u(slot, slot.out_fmt)
    gamma = higham_gamma(q, u_acc)
    if slot.fmt != slot.acc_fmt:
        gamma += 2 * u_in
    return gamma + (u_out if u_out > u_acc else 0.0)


@dataclass
class LocalErrorBound:
    """The nine E_* of Eq. (6), their sum, and the quantities they are built from."""

    terms: dict
    first_order: float
    remainder: float
    total: float
    omega: float
    tau_G: float
    valid: bool
    K_s: float
    T_g: float
    T_r: float
    T_G: float
    T_c: float
    Y_norm: float

    @property
    def dominant(self) -> str:
        """The slot whose term is largest."""
        return max(self.terms, key=self.terms.get)


def exact_recurrence(Y, yI, x, eta, b, s, loss):
    """The fp64 outer iteration from x: (x^(s), residual history d, max inner ||x_j||)."""
    rnd = Rounder()
    x_s = np.asarray(x, np.float64).copy()
    d = outer_iteration(np.asarray(Y, np.float64), yI, x_s, [slice(None)], RECIPES["fp64"],
                        eta / b, b, s, loss, rnd)
    steps = np.cumsum(np.stack([Y[j * b:(j + 1) * b].T @ d[j * b:(j + 1) * b]
                                for j in range(s)]), axis=0) * (eta / b)
    R = max(np.linalg.norm(x), *np.linalg.norm(x + steps, axis=1))
    return x_s, d, R


def local_error_bound(Y, x, y, eta: float, b: int, s: int, P: int, recipe="C", *,
                      loss="logistic", C=None, C_delta: float = 4.0,
                      C_loc: float = 1.0) -> LocalErrorBound:
    """E_u_A ... E_u_x of Theorem 5.7 for one outer iteration on rows Y (s*b x n) from x.

    C: the AllReduce constant C(P) (default the worst-case 2.4 P, Assumption 5.4).  C_delta:
    the residual kernel constant of Assumption 5.2.  The total adds the remainder bound
    C_loc * Omega * sum(E); ``valid`` is False outside the theorem's hypotheses (a Higham
    factor with qu >= 1, or Omega > 1/2).  u_c is the unit roundoff of every operation of
    the correction (gamma_{(s-1)b}(u_c) in omega), as :func:`casgd` simulates it.  Each slot
    is charged the unit roundoff of its mode: u to nearest, 2u otherwise (:func:`slot_u`).
    For Poisson (outside the theorem) L_sigma and D_delta are the local values max exp(z) on
    the exact margins; when that estimate overflows the terms are inf and ``valid`` False.
    """
    return local_error_bounds(Y, x, y, eta, b, s, P, [recipe], loss=loss, C=C,
                              C_delta=C_delta, C_loc=C_loc)[0]


def local_error_bounds(Y, x, y, eta: float, b: int, s: int, P: int, recipes, *,
                       loss="logistic", C=None, C_delta: float = 4.0,
                       C_loc: float = 1.0) -> list[LocalErrorBound]:
    """:func:`local_error_bound` for each of ``recipes`` on one block: the exact recurrence,
    K_s and the T_* of Eqs. (3)-(4) do not depend on the recipe and are computed once."""
    recipes, loss = [as_recipe(r) for r in recipes], get_loss(loss)
    b, s, eta, P = check_int("b", b), check_int("s", s), check_eta(eta), check_int("P", P)
    Y, y = check_data(Y, y, loss)
    Y = np.asarray(Y, np.float64)
    sb, n = Y.shape
    if sb != s * b:
        raise ValueError(f"Y has {sb} rows; accepted: s*b = {s * b}")
    n_loc = max(c.stop - c.start for c in block_columns(n, P))
    alpha = eta / b
    C = 2.4 * P if C is None else float(C)
    x = np.asarray(x, np.float64)
    x_s, d, R = exact_recurrence(Y, y, x, eta, b, s, loss)

    margins = np.abs(Y) @ np.abs(x) + R   # |z| <= ||a|| R on every inner iterate
    if loss.name == "logistic":
        L_sigma, D_delta = loss.lipschitz, 1.0
    elif loss.name == "linear":
        L_sigma, D_delta = loss.lipschitz, float(np.max(np.abs(y)) + R)
    else:
        with np.errstate(over="ignore"):
            L_sigma = float(np.exp(margins.max()))
        D_delta = float(np.max(np.abs(y)) + L_sigma)

    block = np.arange(sb) // b
    lower = block[:, None] > block[None, :]
    G = Y @ Y.T
    G_L = np.where(lower, G, 0.0)
    H_L = np.where(lower, np.abs(Y) @ np.abs(Y).T, 0.0)
    H_L_norm = float(np.linalg.norm(H_L, 2))
    with np.errstate(over="ignore", invalid="ignore"):
        M = np.eye(sb) - L_sigma * alpha * np.abs(G_L)
    K_s = (float(np.linalg.norm(solve_triangular(M, np.eye(sb), lower=True), 2))
           if np.isfinite(M).all() else math.inf)    # an overflowed L_sigma: no bound
    Y_norm = float(np.linalg.norm(Y, 2))
    ad = np.abs(d)
    with np.errstate(over="ignore"):       # huge Poisson residuals: inf terms, not valid
        T_g = float(np.linalg.norm(np.abs(Y).T @ ad))
        T_r = float(np.linalg.norm(np.abs(Y) @ np.abs(x)))
        T_G = float(np.linalg.norm(H_L @ ad))
        T_c = math.sqrt(sum((j * b * np.linalg.norm(G[j * b:(j + 1) * b, :j * b])
                             * np.linalg.norm(d[:j * b])) ** 2 for j in range(1, s)))
        step = float(np.linalg.norm(x_s) + alpha * np.linalg.norm(Y.T @ d))

    def bound(recipe: Recipe) -> LocalErrorBound:
        u = {name: slot_u(getattr(recipe, name)) for name in SLOTS}
        g_r, g_G = kernel_gamma(recipe.u_r, n_loc), kernel_gamma(recipe.u_G, n_loc)
        g_g = kernel_gamma(recipe.u_g, sb)
        g_c = higham_gamma(max(s - 1, 0) * b, u["u_c"])
        k = alpha * Y_norm * K_s * L_sigma          # the common factor of the margin rows
        terms = {
            "u_A": k * u["u_A"] * T_r + 2 * alpha * k * u["u_A"] * T_G
            + alpha * u["u_A"] * T_g,
            "u_G": alpha * k * g_G * T_G,
            "u_r": k * g_r * T_r,
            "u_c": k * u["u_c"] * (T_r + 2 * alpha * T_G + alpha * T_c),
            "u_sigma": alpha * Y_norm * K_s * C_delta * u["u_sigma"] * D_delta * math.sqrt(sb),
            "u_g": alpha * g_g * T_g,
            "u_AR_r": k * C * u["u_AR_r"] * T_r,
            "u_AR_G": alpha * k * C * u["u_AR_G"] * T_G,
            "u_x": u["u_x"] * step,
        }
        terms = {key: float(v) if v == v else math.inf for key, v in terms.items()}  # inf*0
        omega = max(u["u_A"], g_r, g_G, g_c, g_g, C * u["u_AR_r"], C * u["u_AR_G"],
                    u["u_sigma"], u["u_x"])
        tau_G = K_s * L_sigma * alpha * (2 * u["u_A"] + g_G + C * u["u_AR_G"]) * H_L_norm
        Omega = max(omega, tau_G)
        first = sum(terms.values())
        remainder = C_loc * Omega * first
        return LocalErrorBound(terms, first, remainder, first + remainder, omega, tau_G,
                               bool(Omega <= 0.5 and math.isfinite(first)), K_s, T_g, T_r,
                               T_G, T_c, Y_norm)

    return [bound(recipe) for recipe in recipes]
