"""The SR and BF16 papers' small experiments with lpsim.optim, at the papers' sizes.

1. SR paper Section 2.2 / Appendix C, Figure 3: f(x) = -(x - 2) + 1 for x < 3 (else 0) from
   x0 = 2 under Adam with a decaying learning rate; steps until x reaches 3 for FP32 and for
   100 BF16 + SR runs, at minimum LR 1e-5 and 5e-5.  The paper gives no schedule: here a
   cosine from 3.92e-4 over 5,000 steps, then constant, which makes FP32 take the paper's
   ~4,600 steps at minimum LR 1e-5.
2. BF16 paper Section 3, Figure 2: 10-d least squares (weights uniform in [0, 100), inputs
   N(0, 1), label noise 0.5), SGD at LR 0.01, batch 1, with FP32 updates and bf16 weights
   updated by nearest, stochastic and Kahan rounding: training-loss curves.

Writes optim_papers.png and optim_papers.md to ``--out``, or to a new temporary directory
(printed at the end) when --out is not given.

    python examples/optim_papers.py --out examples/results [--runs 100] [--ls-steps 20000]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from lpsim.optim import SGD  # noqa: E402
from test_optim_reproductions import toy_steps  # noqa: E402  (one definition of the toy)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _arguments.py, beside
from _arguments import out_folder, positive_int  # noqa: E402


def least_squares_curve(dtype, update, steps, every, d=10, seed=0):
    gen = torch.Generator().manual_seed(seed)
    w_star = torch.rand(d, generator=gen) * 100
    X = torch.randn(steps, d, generator=gen)
    y = X @ w_star + 0.5 * torch.randn(steps, generator=gen)
    Xe = torch.randn(2000, d, generator=gen)
    ye = Xe @ w_star + 0.5 * torch.randn(2000, generator=gen)
    w = torch.nn.Parameter(torch.zeros(d, dtype=dtype))
    opt = SGD([w], lr=0.01, update_rounding=update, state_format="fp32", seed=seed)
    curve = []
    for t in range(steps):
        r = X[t] @ w.detach().float() - y[t]
        w.grad = (r * X[t]).to(dtype)
        opt.step()
        if (t + 1) % every == 0:
            curve.append((t + 1, 0.5 * ((Xe @ w.detach().float() - ye) ** 2).mean().item()))
    return curve


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=out_folder, default=None,
                        help="directory for optim_papers.png / .md (created if missing); "
                        "default: a new temporary directory, printed at the end.  The "
                        "committed results are in " + str(pathlib.Path(__file__).resolve()
                                                         .parent / "results"))
    parser.add_argument("--runs", type=positive_int, default=100,
                        help="toy: BF16 + SR runs per minimum LR (default: 100)")
    parser.add_argument("--cap", type=positive_int, default=60000, help="toy: most steps per run (default: 60000)")
    parser.add_argument("--ls-steps", type=positive_int, default=20000,
                        help="least squares: SGD steps (default: 20000)")
    args = parser.parse_args(argv)
    out = args.out if args.out is not None else pathlib.Path(
        tempfile.mkdtemp(prefix="lpsim-optim-papers-"))
    out.mkdir(parents=True, exist_ok=True)
    from tqdm import tqdm
    lines = ["SR paper toy (steps until x = 3; BF16 + SR over "
             f"{args.runs} runs, capped at {args.cap}):", "",
             "| minimum LR | FP32 | BF16 + SR mean | min | max | unfinished |",
             "|---|---|---|---|---|---|"]
    for lr_min in tqdm((1e-5, 5e-5), desc="toy"):
        fp32 = toy_steps(torch.float32, "nearest", lr_min, 1, args.cap)[0].item()
        sr = toy_steps(torch.bfloat16, "stochastic", lr_min, args.runs, args.cap, seed=1)
        lines.append(f"| {lr_min:.0e} | {fp32:.0f} | {sr.mean().item():.0f} | "
                     f"{sr.min().item():.0f} | {sr.max().item():.0f} | "
                     f"{int((sr >= args.cap).sum())} |")
    curves = {}
    every = max(1, args.ls_steps // 200)
    for name, dtype, update in tqdm([("FP32", torch.float32, "nearest"),
                                     ("BF16 nearest", torch.bfloat16, "nearest"),
                                     ("BF16 + SR", torch.bfloat16, "stochastic"),
                                     ("BF16 + Kahan", torch.bfloat16, "kahan")], desc="lsq"):
        curves[name] = least_squares_curve(dtype, update, args.ls_steps, every)
    lines += ["", f"BF16 paper least squares (SGD, LR 0.01, batch 1, {args.ls_steps} steps), "
              "final training loss (mean of the last 10% of evaluations; label noise floor "
              "0.125):", "", "| updates | loss |", "|---|---|"]
    for name, curve in curves.items():
        tail = [loss for _, loss in curve[-max(1, len(curve) // 10):]]
        lines.append(f"| {name} | {sum(tail) / len(tail):.4f} |")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, curve in curves.items():
        steps, losses = zip(*curve)
        ax.semilogy(steps, losses, label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title("10-d least squares, SGD lr 0.01, batch 1 (BF16 paper Fig. 2)")
    ax.legend()
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(out / "optim_papers.png", dpi=120)
    (out / "optim_papers.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {out / 'optim_papers.png'} and {out / 'optim_papers.md'}")


if __name__ == "__main__":
    main()
