"""Reproduce Table 5 (Recipe C vs A final-loss gap) and a Figure 3-style long-horizon plot.

Table 5: synthetic logistic/linear/Poisson data (Table 4 generator), P ranks simulated in
process, relative final-loss gap |L_C - L_A| / |L_A| after H outer iterations, max over seeds.
Figure 3: relative loss gap of recipes B-I to A along a logistic run, mean and min-max over
seeds, with each recipe's Table 3 precision slots beside it.  Each part writes its own files:
casgd_table5.md, and casgd_figure3.md with casgd_figure3.png, into --out DIR, or into a new
temporary directory (printed at the end) when --out is not given.

    python examples/casgd_recipes.py                       # the paper's size (slow on a CPU)
    python examples/casgd_recipes.py --m 8192 --n 512      # smaller
    python examples/casgd_recipes.py --no-table --out examples/results   # the committed figure
    python examples/casgd_recipes.py --eta sweep           # eta* from an FP32 SGD sweep (7.1)
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import platform
import shlex
import sys
import tempfile
import time

import numpy as np
from tqdm.auto import tqdm

from lpsim.casgd import RECIPES, SLOTS, casgd, make_synth, sweep_eta
from lpsim.casgd.recipes import SYMBOLS, as_slot

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _arguments.py, beside
from _arguments import out_folder, positive_float, positive_int, seed_int  # noqa: E402

PAPER = {("logistic", 16): "0", ("logistic", 64): "0", ("linear", 16): "7e-5",
         ("linear", 64): "1.1e-4", ("poisson", 16): "1.3e-4", ("poisson", 64): "3.3e-4"}
ETA = {"logistic": 1.0, "linear": 0.5, "poisson": 0.25}
#: what the Table 3 symbols mean (lpsim.casgd.recipes.SYMBOLS); GEMM rows: input / accumulator
KEY = ("f FP32, b BF16, h FP16, t TF32 (GEMM rows u_G, u_r, u_g: that input with FP32 "
       "accumulation), ha FP16 input and FP16 accumulation")
LINTHRESH = 1e-9       # the symlog y axis is linear below this gap, so a zero gap is drawn at 0


def step_size(args, loss, A, y, notes):
    """The fixed per-loss eta, --eta VALUE, or (--eta sweep) the paper's FP32 SGD sweep."""
    if args.eta is None:
        return ETA[loss]
    if args.eta != "sweep":
        return float(args.eta)
    sweep = sweep_eta(A, y, loss=loss, b=32, steps=args.sweep_steps, seeds=args.seeds,
                      progress=not args.no_progress)
    notes += ["", f"eta sweep, {loss}: FP32 SGD at (b, s) = (32, 1), {args.sweep_steps} steps, "
              f"mean over seeds {args.seeds}", "", sweep.table()]
    return sweep.best


def table5(args, bar, notes):
    rows = []
    for loss in args.losses:
        A, y, _ = make_synth(args.m, args.n, loss=loss, seed=0, margin_std=args.margin_std)
        eta = step_size(args, loss, A, y, notes)
        for s in args.s:
            gaps = []
            for seed in args.seeds:
                final = {}
                for recipe in ("A", "C"):
                    bar.set_postfix_str(f"{loss} s={s} seed={seed} {recipe}", refresh=False)
                    res = casgd(A, y, loss=loss, eta=eta, b=args.b, s=s, H=args.H,
                                recipe=recipe, P=args.P, seed=seed, record=[args.H],
                                progress=not args.no_progress)
                    final[recipe] = res.loss_curve[-1]
                    bar.update(args.H)
                gaps.append(abs(final["C"] - final["A"]) / abs(final["A"]))
            rows.append((loss, s, eta, final["A"], max(gaps), float(np.mean(gaps))))
    return rows


def symbols(recipe) -> list[str]:
    """The Table 3 symbol of each slot of ``recipe`` (the slot's repr when none matches)."""
    found = []
    for row in SLOTS:
        slot = getattr(recipe, row)
        found.append(next((sym for sym in SYMBOLS if as_slot(sym, row) == slot), repr(slot)))
    return found


def figure3_runs(args, bar) -> tuple[np.ndarray, dict]:
    """Record points and, per recipe, the relative gap to A: an array (seeds, points)."""
    A, y, _ = make_synth(args.fig_m, args.fig_n, loss="logistic", seed=0)
    points = np.unique(np.geomspace(1, args.fig_H, 25).astype(int))
    losses = {key: [] for key in args.fig_recipes}
    for seed in args.seeds:
        for key in args.fig_recipes:
            bar.set_postfix_str(f"figure: seed {seed} recipe {key}", refresh=False)
            res = casgd(A, y, loss="logistic", eta=args.fig_eta, b=args.b, s=args.fig_s,
                        H=args.fig_H, recipe=key, P=args.fig_P, seed=seed, record=points,
                        progress=not args.no_progress)
            losses[key].append(res.loss_curve)
            bar.update(args.fig_H)
    ref = np.array(losses["A"])
    gaps = {key: np.abs(np.array(curve) - ref) / np.abs(ref)
            for key, curve in losses.items() if key != "A"}
    return points, gaps


def coincides(gaps: dict) -> dict:
    """For each recipe, the earlier recipe whose mean gap it matches within 1% everywhere."""
    same, means = {}, {key: g.mean(axis=0) for key, g in gaps.items()}
    keys = list(means)
    for i, key in enumerate(keys):
        for other in keys[:i]:
            if np.allclose(means[key], means[other], rtol=0.01, atol=0):
                same[key] = other
                break
    return same


def figure3_plot(args, points, gaps, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    fig, (ax, tab) = plt.subplots(1, 2, figsize=(12.5, 5.2),
                                  gridspec_kw={"width_ratios": [1.55, 1]})
    colors = plt.get_cmap("tab10").colors
    markers = "osv^DPX*<>"
    same = coincides(gaps)
    for i, (key, gap) in enumerate(gaps.items()):
        # D tracks C (they differ only in u_AR_G): dashed, hollow and larger, so both show
        color, hollow = colors[i % 10], key in same or key == "D"
        label = key + (f" (= {same[key]} within 1%)" if key in same else "")
        ax.plot(points, gap.mean(axis=0), color=color, marker=markers[i % len(markers)],
                ms=7 if hollow else 4, mfc="none" if hollow else color,
                ls="--" if hollow else "-", lw=1.4 if hollow else 1.1, label=label, zorder=3)
        if len(gap) > 1:
            ax.fill_between(points, gap.min(axis=0), gap.max(axis=0), color=color, alpha=0.12,
                            lw=0)
    for name, u in (("FP32", 2.0 ** -24), ("FP16", 2.0 ** -11), ("BF16", 2.0 ** -8)):
        ax.axhline(u, ls=":", lw=0.9, color="gray")
        ax.text(points[-1], u * 1.25, f"{name} unit roundoff", fontsize=7, color="gray",
                ha="right")
    ax.set_xscale("log")
    ax.set_yscale("symlog", linthresh=LINTHRESH, linscale=0.4)
    ax.set_ylim(0, max(2.0 ** -6, 10 * max(float(g.max()) for g in gaps.values())))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%d"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("outer iteration H")
    ax.set_ylabel(f"relative loss gap |L_X - L_A| / |L_A|\n(symlog: linear below {LINTHRESH:g}, "
                  "so a zero gap sits at 0)")
    seeds = (f"mean of {len(args.seeds)} seeds, band: min-max" if len(args.seeds) > 1
             else f"seed {args.seeds[0]}")
    ax.set_title(f"logistic synth m={args.fig_m} n={args.fig_n}, P={args.fig_P} b={args.b} "
                 f"s={args.fig_s} eta={args.fig_eta}; {seeds}", fontsize=9)
    ax.grid(alpha=0.3, which="major")
    ax.legend(ncol=2, fontsize=8, loc="upper left", title="recipe", title_fontsize=8)

    tab.axis("off")
    keys = [key for key in "ABCDEFGHI" if key in RECIPES]
    cells = [symbols(RECIPES[key]) for key in keys]
    table = tab.table(cellText=[[key] + row for key, row in zip(keys, cells)],
                      colLabels=["recipe"] + [s[2:] for s in SLOTS], loc="upper center",
                      cellLoc="center")
    table.auto_set_font_size(False)
    table.set_fontsize(8)
    table.scale(1, 1.35)
    for (row, col), cell in table.get_celld().items():
        if row > 0 and col > 0 and cells[row - 1][col - 1] != "f":
            cell.set_facecolor("#fde8c8")
    tab.set_title("Table 3 precision slots u_* of each recipe", fontsize=9)
    notes = (KEY + ".  Shaded: not FP32.  H and I are FP16 and BF16 end to end; C and D "
             "differ only in u_AR_G (D dashed, hollow markers).")
    tab.text(0.5, 0.36, "\n".join(_wrap(notes, 62)), ha="center", va="top", fontsize=8,
             transform=tab.transAxes)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return same


def _wrap(text: str, width: int) -> list[str]:
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return lines + [line]


def figure3_report(args, points, gaps, same) -> list[str]:
    lines = [f"Figure 3 (casgd_figure3.png): logistic synth (m, n) = ({args.fig_m}, "
             f"{args.fig_n}), P = {args.fig_P}, b = {args.b}, s = {args.fig_s}, "
             f"eta = {args.fig_eta}, seeds {args.seeds}; relative loss gap "
             f"|L_X - L_A|/|L_A| after H = {args.fig_H}: mean, min and max over the seeds.  "
             f"The plot's y axis is symlog (linear below {LINTHRESH:g}): a zero gap is drawn "
             "at 0, not clamped.", "",
             "| recipe | " + " | ".join(SLOTS) + " | mean gap | min | max |",
             "|---" * (len(SLOTS) + 4) + "|"]
    for key, gap in gaps.items():
        last = gap[:, -1]
        lines.append(f"| {key} | " + " | ".join(symbols(RECIPES[key])) +
                     f" | {last.mean():.1e} | {last.min():.1e} | {last.max():.1e} |")
    lines += ["", "Symbols (Table 3): " + KEY + "."]
    lines += [f"{key}'s mean gap equals {other}'s within 1% at every recorded H."
              for key, other in same.items()]
    return lines


def eta_value(text: str):
    """argparse type of --eta: a step size > 0 or 'sweep'."""
    return text if text == "sweep" else positive_float(text)


def nonnegative_float(text: str) -> float:
    """argparse type: a number from 0 to MAX_MARGIN_STD (the planted margins' spread)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value <= MAX_MARGIN_STD:
        raise argparse.ArgumentTypeError(f"{value} is not accepted; accepted: a number from 0 "
                                         f"to {MAX_MARGIN_STD:g}")
    return value


#: planted margins beyond this make Poisson labels exp(margin) and linear ones overflow
MAX_MARGIN_STD = 100.0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    table = p.add_argument_group("Table 5")
    table.add_argument("--m", type=positive_int, default=65536, help="rows of the synthetic data "
                       "(default: 65536, the paper's)")
    table.add_argument("--n", type=positive_int, default=4096, help="columns (default: 4096)")
    table.add_argument("--s", type=positive_int, nargs="+", default=[16, 64],
                       help="inner steps per outer iteration, one row each (default: 16 64)")
    table.add_argument("--H", type=positive_int, default=200, help="outer iterations (default: 200)")
    table.add_argument("--P", type=positive_int, default=16, help="simulated ranks (default: 16)")
    table.add_argument("--eta", type=eta_value, default=None,
                       help="a step size, or 'sweep' for Section 7.1's eta*; default per loss: "
                       + str(ETA))
    table.add_argument("--sweep-steps", type=positive_int, default=3200,
                       help="SGD steps per run of --eta sweep (default: 3200)")
    table.add_argument("--margin-std", type=nonnegative_float, default=1.0,
                       help="std of the planted margins a_i^T x_true (make_synth; default: 1)")
    table.add_argument("--losses", nargs="+", default=["logistic", "linear", "poisson"],
                       choices=["logistic", "linear", "poisson"],
                       help="losses, one table row per loss and s (default: all three)")
    fig = p.add_argument_group("Figure 3")
    fig.add_argument("--fig-m", type=positive_int, default=2048, help="rows (default: 2048)")
    fig.add_argument("--fig-n", type=positive_int, default=64, help="columns (default: 64)")
    fig.add_argument("--fig-H", type=positive_int, default=120,
                     help="outer iterations (default: 120: the figure takes a few minutes on a "
                     "CPU, mostly recipes F and H, which accumulate in FP16)")
    fig.add_argument("--fig-P", type=positive_int, default=4, help="simulated ranks (default: 4)")
    fig.add_argument("--fig-s", type=positive_int, default=16,
                     help="inner steps per outer iteration (default: 16)")
    fig.add_argument("--fig-eta", type=positive_float, default=0.1, help="step size (default: 0.1)")
    fig.add_argument("--fig-recipes", nargs="+", default=list("ABCDEFGHI"),
                     help="recipes to plot against A (default: A to I; A is always run)")
    both = p.add_argument_group("both")
    both.add_argument("--b", type=positive_int, default=32, help="mini-batch rows per step (default: 32)")
    both.add_argument("--seeds", type=seed_int, nargs="+", default=[42, 43, 44],
                      help="sampling seeds: the table takes the max gap over them, the figure "
                      "their mean and min-max band (default: 42 43 44)")
    both.add_argument("--no-table", action="store_true", help="skip Table 5")
    both.add_argument("--no-figure", action="store_true", help="skip Figure 3")
    both.add_argument("--no-progress", action="store_true", help="no progress bars")
    both.add_argument("--out", type=out_folder, default=None,
                      help="directory for the .md and .png files (created if missing); "
                      "default: a new temporary directory, printed at the end.  The committed "
                      "results are in " + str(pathlib.Path(__file__).resolve().parent / "results"))
    return p


def main(argv=None):
    p = parser()
    args = p.parse_args(argv)
    unknown = [key for key in args.fig_recipes if key not in "ABCDEFGHI" or len(key) != 1]
    if unknown:
        p.error(f"--fig-recipes {' '.join(unknown)}: accepted: recipes A to I")
    args.fig_recipes = ["A"] + [key for key in "BCDEFGHI" if key in args.fig_recipes]
    for ranks, columns in (("P", "n"), ("fig_P", "fig_n")):
        if getattr(args, ranks) > getattr(args, columns):
            p.error(f"--{ranks.replace('_', '-')} {getattr(args, ranks)} is more than "
                    f"--{columns.replace('_', '-')} {getattr(args, columns)} (each simulated "
                    "rank holds some of the features); accepted: at most the columns")
    out = args.out if args.out is not None else pathlib.Path(
        tempfile.mkdtemp(prefix="lpsim-casgd-recipes-"))
    out.mkdir(parents=True, exist_ok=True)
    runs = len(args.losses) * len(args.s) * len(args.seeds) * 2
    total = ((0 if args.no_table else runs * args.H) +
             (0 if args.no_figure else len(args.seeds) * len(args.fig_recipes) * args.fig_H))
    bar = tqdm(total=total, unit="outer it", desc="casgd_recipes", disable=args.no_progress)
    header = [f"date: {datetime.datetime.now().isoformat(timespec='seconds')}",
              f"machine: {platform.machine()} {platform.processor() or ''} "
              f"{os.cpu_count()} cores, python {platform.python_version()}",
              "command: python " + " ".join(shlex.quote(a) for a in sys.argv), ""]
    written = []
    if not args.no_table:
        start, notes = time.time(), []
        rows = table5(args, bar, notes)
        lines = [f"Table 5: |L_C - L_A|/|L_A| at (m, n) = ({args.m}, {args.n}), b = {args.b}, "
                 f"H = {args.H}, P = {args.P} (simulated), seeds {args.seeds}, "
                 f"margin std {args.margin_std}", "",
                 "| loss | s | eta | L_A | max gap | mean gap | paper |",
                 "|---|---|---|---|---|---|---|"]
        lines += [f"| {loss} | {s} | {eta} | {la:.6g} | {mx:.2e} | {mn:.2e} | "
                  f"{PAPER.get((loss, s), '-')} |" for loss, s, eta, la, mx, mn in rows]
        written.append(write(out, "casgd_table5.md", header + lines + notes, start))
    if not args.no_figure:
        start = time.time()
        points, gaps = figure3_runs(args, bar)
        png = out / "casgd_figure3.png"
        same = figure3_plot(args, points, gaps, png) if gaps else {}
        written += [png] if gaps else []
        lines = figure3_report(args, points, gaps, same)
        written.append(write(out, "casgd_figure3.md", header + lines, start))
    bar.close()
    print("wrote " + ", ".join(path.name for path in written) + f" in {out}")


def write(out: pathlib.Path, name: str, lines: list, start: float) -> pathlib.Path:
    """Print one part's report and write it to out/name with its wall time."""
    text = "\n".join(lines + ["", f"wall time: {time.time() - start:.0f} s"])
    print(text)
    path = out / name
    path.write_text(text + "\n")
    return path


if __name__ == "__main__":
    main()
