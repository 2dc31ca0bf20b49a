"""GLM losses L(r, y) with their residuals delta = -dL/dr (paper, Sections 2.1 and 3.1)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy.special import expit


def _logistic_labels(y):
    bad = y[(y != 1) & (y != -1)]
    if bad.size:
        raise ValueError(f"logistic labels must be -1 or +1; got {float(bad[0])!r} "
                         f"({bad.size} labels outside {{-1, +1}})")


def _poisson_labels(y):
    """Counts, or any real y >= 0 (the loss e^r - y r is defined there, as scikit-learn's
    PoissonRegressor takes it)."""
    bad = y[~(y >= 0)]
    if bad.size:
        raise ValueError(f"Poisson labels must be non-negative; got {float(bad[0])!r} "
                         f"({bad.size} labels below 0 or NaN)")


def _no_check(y):
    pass


@dataclass(frozen=True)
class Loss:
    """One GLM: loss value, residual delta(r, y), Lipschitz constant L_sigma, label domain."""

    name: str
    value: Callable          # L(r, y) elementwise
    residual: Callable       # delta(r, y) = -dL/dr elementwise
    mean: Callable           # inverse link: the prediction E[y | r]
    lipschitz: float         # L_sigma (inf: unbounded, outside Theorem 5.7)
    check_labels: Callable   # raises ValueError for labels outside the domain

    def objective(self, A, y, x, chunk: int = 8192, weights=None) -> float:
        """F(x) = m^-1 sum_i L(a_i^T x, y_i) in float64 (Section 2.1); with ``weights``,
        W^-1 sum_i w_i L(a_i^T x, y_i) (W = sum w).

        A may be scipy.sparse (its margins are sparse products: they agree with the dense
        ones to float64 rounding, not bit for bit).
        """
        x64 = np.asarray(x, np.float64)
        total = 0.0
        for lo in range(0, A.shape[0], chunk):
            block = A[lo:lo + chunk]
            r = np.asarray(block @ x64 if hasattr(block, "tocsr") else
                           np.asarray(block, np.float64) @ x64, np.float64).reshape(-1)
            value = self.value(r, np.asarray(y[lo:lo + chunk], np.float64))
            if weights is not None:
                w = weights[lo:lo + chunk]
                value = np.where(w > 0, value * w, 0.0)     # a zero weight drops the row
            total += float(value.sum())
        return total / (A.shape[0] if weights is None else float(np.sum(weights)))


LOSSES = {
    "logistic": Loss("logistic",
                     value=lambda r, y: np.logaddexp(0.0, -y * r),
                     residual=lambda r, y: y * expit(-y * r),        # y (1 - sigma(y r))
                     mean=expit, lipschitz=0.25, check_labels=_logistic_labels),
    "linear": Loss("linear",
                   value=lambda r, y: 0.5 * (r - y) ** 2,
                   residual=lambda r, y: y - r,
                   mean=lambda r: r, lipschitz=1.0, check_labels=_no_check),
    "poisson": Loss("poisson",
                    value=lambda r, y: np.exp(r) - y * r,
                    residual=lambda r, y: y - np.exp(r),
                    mean=np.exp, lipschitz=np.inf, check_labels=_poisson_labels),
}


def get_loss(loss) -> Loss:
    """A :class:`Loss` from its name ("logistic", "linear", "poisson") or itself."""
    if isinstance(loss, Loss):
        return loss
    try:
        return LOSSES[loss]
    except (KeyError, TypeError):
        raise ValueError(f"unknown loss {loss!r}; accepted: {', '.join(LOSSES)}") from None
