"""Rounding error against precision: round-to-nearest vs stochastic vs few-bit stochastic.

For fp(8, m), m = 1..16, rounds 2**20 values uniform in [1, 2) and plots the mean relative
error (accuracy) and the mean signed error (bias) of each mode, next to the unit roundoff
2**-(m+1).  Nearest has the smaller error; stochastic rounding has no bias, and few-bit SR's
bias stays below 2**-k quanta.

    python examples/rounding_error_vs_precision.py [--out examples/results/rounding_error.png]
"""

import argparse

import matplotlib
import numpy as np
from tqdm import tqdm

import lpsim

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MODES = [("nearest", {}), ("stochastic", {}), ("stochastic", {"sr_bits": 4}),
         ("toward_zero", {})]


def measure(x, mantissas):
    rows = {}
    for rounding, extra in MODES:
        label = rounding + (f", {extra['sr_bits']} bits" if extra else "")
        abs_err, bias = [], []
        for m in tqdm(mantissas, desc=label, leave=False):
            err = (lpsim.quantize(x, lpsim.fp(8, m), rounding, seed=m, **extra) - x) / x
            abs_err.append(np.abs(err).mean())
            bias.append(abs(err.mean()))
        rows[label] = (abs_err, bias)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="examples/results/rounding_error.png")
    args = parser.parse_args(argv)
    x = np.random.default_rng(0).uniform(1, 2, 1 << 20)
    mantissas = list(range(1, 17))
    rows = measure(x, mantissas)
    u = [2.0 ** -(m + 1) for m in mantissas]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), sharex=True)
    for label, (abs_err, bias) in rows.items():
        left.semilogy(mantissas, abs_err, marker="o", ms=3, label=label)
        right.semilogy(mantissas, np.maximum(bias, 1e-12), marker="o", ms=3, label=label)
    for axis in (left, right):
        axis.semilogy(mantissas, u, "k--", lw=1, label="unit roundoff $2^{-(m+1)}$")
        axis.set_xlabel("mantissa bits m of fp(8, m)")
        axis.grid(alpha=0.3)
    left.set_title("mean |relative error|")
    right.set_title("|mean relative error| (bias), 2$^{20}$ values in [1, 2)")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")
    for label, (abs_err, bias) in rows.items():
        print(f"{label:22s} m=7: mean |err| {abs_err[6]:.3e}  |bias| {bias[6]:.3e}")


if __name__ == "__main__":
    main()
