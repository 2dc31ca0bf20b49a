"""Rounding error against precision: round-to-nearest vs stochastic vs few-bit stochastic.

Left and middle: for fp(8, m), m = 1..16, rounds 2**20 values uniform in [1, 2) once and
plots each mode's mean relative error (accuracy) and its mean signed error (bias), next to
the unit roundoff 2**-(m+1).  Nearest has the smallest error per rounding.

Right: where stochastic rounding wins.  It accumulates --steps increments of --increment in
--format, rounding the running sum after every step (s = round(s + increment)).  Once half
a gap between neighbours exceeds the increment, round-to-nearest returns s unchanged at every
step and the sum stagnates; stochastic rounding rounds up with probability increment/gap,
so its expected sum follows the exact one.  Few-bit SR (sr_bits=4) resolves only 2**-4 of a
gap, and stalls where the increment falls below gap/16.

    python examples/rounding_error_vs_precision.py [--out DIR]
"""

import argparse
import os
import pathlib
import sys
import tempfile

import matplotlib
import numpy as np
from tqdm import tqdm

import lpsim

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _arguments.py, beside
from _arguments import out_folder, positive_float, positive_int  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
MODES = [("nearest", {}), ("stochastic", {}), ("stochastic", {"sr_bits": 4}),
         ("toward_zero", {})]


def label(rounding, extra):
    return rounding + (f", {extra['sr_bits']} bits" if extra else "")


def measure(x, mantissas):
    """Mean |relative error| and |mean relative error| of one rounding, per mode and m."""
    rows = {}
    with tqdm(total=len(MODES) * len(mantissas),
              desc=f"one rounding of 2^{int(np.log2(x.size))} values") as bar:
        for rounding, extra in MODES:
            abs_err, bias = [], []
            for m in mantissas:
                err = (lpsim.quantize(x, lpsim.fp(8, m), rounding, seed=m, **extra) - x) / x
                abs_err.append(np.abs(err).mean())
                bias.append(abs(err.mean()))
                bar.update()
            rows[label(rounding, extra)] = (abs_err, bias)
    return rows


def accumulate(fmt, increment, steps, runs):
    """Running sums s_k = round(s_{k-1} + increment) of ``runs`` independent runs per mode.

    The addition is exact in float64 for these sizes, so each step rounds once.  Run r of a
    stochastic mode draws element r at offset k*runs: every step and run gets its own bits.
    """
    curves = {}
    modes = [m for m in MODES if m[0] != "toward_zero"]
    with tqdm(total=len(modes) * steps, desc=f"accumulating in {fmt}") as bar:
        for rounding, extra in modes:
            s = np.zeros(runs)
            path = np.empty((steps + 1, runs))
            path[0] = s
            for k in range(steps):
                s = lpsim.quantize(s + increment, fmt, rounding, seed=1, offset=k * runs,
                                   **extra)
                path[k + 1] = s
                if k % 256 == 255:
                    bar.update(256)
            bar.update(steps % 256)
            curves[label(rounding, extra)] = path
    return curves


def plot(mantissas, rows, curves, args, png):
    u = [2.0 ** -(m + 1) for m in mantissas]
    fig, (acc, bias, accum) = plt.subplots(1, 3, figsize=(16, 4.6))
    colors = {name: f"C{i}" for i, name in enumerate(rows)}
    for name, (abs_err, b) in rows.items():
        acc.semilogy(mantissas, abs_err, marker="o", ms=3, color=colors[name], label=name)
        bias.semilogy(mantissas, np.maximum(b, 1e-12), marker="o", ms=3, color=colors[name],
                      label=name)
    for axis in (acc, bias):
        axis.semilogy(mantissas, u, "k--", lw=1, label="unit roundoff $2^{-(m+1)}$")
        axis.set_xlabel("mantissa bits m of fp(8, m)")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    acc.set_ylabel("mean |relative error|")
    acc.set_title(f"accuracy of one rounding (2$^{{{args.values}}}$ values in [1, 2))",
                  fontsize=10)
    bias.set_ylabel("|mean relative error|  (bias)")
    bias.set_title("bias of one rounding (floored at 1e-12)", fontsize=10)
    steps = np.arange(args.steps + 1)
    accum.plot(steps, steps * args.increment, "k--", lw=1.2, label="exact sum")
    for name, runs in curves.items():
        mean = runs.mean(axis=1)
        accum.plot(steps, mean, color=colors[name], label=f"{name}" + (
            f" (mean of {args.runs} runs, band: min-max)" if "stochastic" in name else ""))
        if "stochastic" in name:
            accum.fill_between(steps, runs.min(axis=1), runs.max(axis=1), color=colors[name],
                               alpha=0.2, lw=0)
    accum.set_xlabel("step k")
    accum.set_ylabel("running sum $s_k$")
    accum.set_title(f"s = round(s + {args.increment:g}) in {args.format}, {args.steps} steps",
                    fontsize=10)
    accum.grid(alpha=0.3)
    accum.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def format_name(text: str) -> str:
    """argparse type: a format lpsim parses (a preset such as bf16, or fp(e,m,b))."""
    try:
        lpsim.parse_format(text)
    except (ValueError, TypeError) as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=out_folder, default=None,
                        help="directory for rounding_error.png (created if missing); default: a "
                             "new temporary directory, printed at the end.  The committed "
                             f"figure is {HERE / 'results'}")
    parser.add_argument("--values", type=int, default=20,
                        help="log2 of the number of values rounded per mode and m (default: 20)")
    parser.add_argument("--format", type=format_name, default="bf16",
                        help="format of the accumulation panel (default: bf16)")
    parser.add_argument("--increment", type=positive_float, default=1e-3,
                        help="increment added at every step of the accumulation (default: 1e-3)")
    parser.add_argument("--steps", type=positive_int, default=4096,
                        help="steps of the accumulation (default: 4096)")
    parser.add_argument("--runs", type=positive_int, default=16,
                        help="independent runs of each stochastic mode (default: 16)")
    args = parser.parse_args(argv)
    if not 1 <= args.values <= 28:
        parser.error(f"argument --values: {args.values} is not accepted; accepted: 1 to 28 "
                     "(2**28 values: 2 GiB)")
    fmt = lpsim.parse_format(args.format)
    out = args.out if args.out is not None else pathlib.Path(
        tempfile.mkdtemp(prefix="lpsim-rounding-error-"))
    out.mkdir(parents=True, exist_ok=True)

    x = np.random.default_rng(0).uniform(1, 2, 1 << args.values)
    mantissas = list(range(1, 17))
    rows = measure(x, mantissas)
    curves = accumulate(fmt, args.increment, args.steps, args.runs)
    path = out / "rounding_error.png"
    plot(mantissas, rows, curves, args, path)
    for name, (abs_err, bias) in rows.items():
        print(f"{name:22s} m=7: mean |err| {abs_err[6]:.3e}  |bias| {bias[6]:.3e}")
    exact = args.steps * args.increment
    for name, curve in curves.items():
        print(f"{name:22s} final sum {curve[-1].mean():.6g} (exact {exact:.6g})")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
