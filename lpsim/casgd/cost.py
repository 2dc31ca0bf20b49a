"""alpha-beta-gamma cost of s SGD iterations vs one CA-SGD outer iteration (Table 2, Eq. (2))."""

from __future__ import annotations

import math

from .solvers import check_int


def allreduce_cost(words: float, P: int, alpha: float, beta: float) -> float:
    """L_AR(W) = 2 alpha log2 P + beta W 2(P-1)/P (Eq. (2))."""
    return 2 * alpha * math.log2(P) + beta * words * 2 * (P - 1) / P


def cost_model(b: int, s: int, P: int, n_loc: int, alpha: float, beta: float,
               gamma: float) -> dict:
    """Flops, words, messages and time of s SGD iterations and one CA-SGD iteration.

    alpha: latency per message, beta: time per word, gamma: time per flop (Section 4.2).
    ``crossover`` is the interval of s (from the quadratic of Section 4.2) in which CA-SGD
    is cheaper; None when it is cheaper for no s > 1.
    """
    b, s, P, n_loc = (check_int(k, v) for k, v in (("b", b), ("s", s), ("P", P),
                                                      ("n_loc", n_loc)))
    for name, value in (("alpha", alpha), ("beta", beta), ("gamma", gamma)):
        if not value >= 0:
            raise ValueError(f"{name}={value!r} is not accepted; accepted: a cost >= 0")
    sb = s * b
    sgd = {"flops": 4 * sb * n_loc, "words": sb, "messages": s}
    sgd["time"] = gamma * sgd["flops"] + s * allreduce_cost(b, P, alpha, beta)
    ca = {"flops": 2 * sb ** 2 * n_loc + b * b * s * (s - 1) + 4 * sb * n_loc,
          "words": sb + sb ** 2, "messages": 1}
    ca["time"] = gamma * ca["flops"] + allreduce_cost(ca["words"], P, alpha, beta)
    # SGD - CA = 2 alpha log P (s-1) - gamma[2(sb)^2 n_loc + b^2 s(s-1)] - beta (sb)^2 2(P-1)/P
    lat = 2 * alpha * math.log2(P)
    c2 = gamma * b * b * (2 * n_loc + 1) + beta * b * b * 2 * (P - 1) / P
    c1 = -(gamma * b * b + lat)
    disc = c1 * c1 - 4 * c2 * lat
    crossover = None
    if c2 == 0:           # gamma = beta(P-1) = 0: SGD - CA = lat (s - 1), for all s > 1
        crossover = (1.0, math.inf) if lat > 0 else None
    elif disc > 0:
        lo, hi = (-c1 - math.sqrt(disc)) / (2 * c2), (-c1 + math.sqrt(disc)) / (2 * c2)
        if hi > 1:
            crossover = (max(lo, 1.0), hi)
    return {"sgd": sgd, "casgd": ca, "speedup": sgd["time"] / ca["time"] if ca["time"] else
            math.inf, "crossover": crossover}
