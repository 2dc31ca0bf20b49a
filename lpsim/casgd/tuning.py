"""Step-size selection the way the CA-SGD paper locks eta*: an SGD sweep at (b, s) = (32, 1)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from tqdm.auto import tqdm

from .solvers import DivergedError, check_eta, check_int, sgd

DEFAULT_ETAS = tuple(2.0 ** k for k in range(-4, 5))      # 1/16 ... 16
#: a sweep of at least this many SGD steps in all shows progress by default
PROGRESS_STEPS = 20_000


@dataclass
class EtaSweep:
    """Mean final F(x) over seeds per step size; ``best`` is the smallest (inf if it diverged)."""

    best: float
    final_loss: dict = field(default_factory=dict)

    def table(self) -> str:
        rows = [f"| {eta:g} | {loss:.6g} |" + (" <- eta*" if eta == self.best else "")
                for eta, loss in self.final_loss.items()]
        return "\n".join(["| eta | mean final F(x) |", "|---|---|"] + rows)


def sweep_eta(A, y, *, loss="logistic", etas=DEFAULT_ETAS, b: int = 32, steps: int = 3200,
              seeds=(42, 43, 44), recipe="A", P: int = 1, progress=None) -> EtaSweep:
    """Run mini-batch SGD (``recipe``, FP32 by default) for ``steps`` steps at each step size
    and pick the one with the lowest mean final objective (Section 7.1's eta*).

    A run that overflows or produces NaN counts as +inf, so an unstable step size is never
    chosen; ties go to the smaller step size.  progress: a tqdm bar counting SGD steps, advanced
    after each (eta, seed) run, with each run's own bar of steps below it (None: on when the
    sweep has at least PROGRESS_STEPS steps in all; False: silent).  It does not change the
    result.
    """
    etas = sorted(check_eta(eta) for eta in etas)
    if not etas:
        raise ValueError("etas is empty; accepted: one or more positive step sizes")
    check_int("steps", steps)
    seeds = list(seeds)
    if not seeds:
        raise ValueError("seeds is empty; accepted: one or more integer seeds")
    total = len(etas) * len(seeds) * steps
    if progress is None:
        progress = total >= PROGRESS_STEPS
    elif not isinstance(progress, (bool, np.bool_)):
        raise TypeError(f"progress={progress!r}; accepted: True, False or None (on for a "
                        f"sweep of at least {PROGRESS_STEPS} steps)")
    final = {}
    with tqdm(total=total, desc=f"eta sweep ({len(etas)} x {len(seeds)} seeds)",
              unit="step", disable=not progress) as bar:
        for eta in etas:
            losses = []
            with np.errstate(over="ignore", invalid="ignore"):
                for seed in seeds:
                    bar.set_postfix_str(f"eta={eta:g} seed={seed}", refresh=False)
                    try:
                        res = sgd(A, y, loss=loss, eta=eta, b=b, steps=steps, recipe=recipe,
                                  P=P, seed=seed, record=[steps], progress=bool(progress))
                        losses.append(res.loss_curve[-1])
                    except DivergedError:
                        losses.append(float("inf"))
                    bar.update(steps)
            mean = float(np.mean(losses))
            final[eta] = mean if np.isfinite(mean) else float("inf")
    best = min(etas, key=lambda eta: (final[eta], eta))
    return EtaSweep(best, final)
