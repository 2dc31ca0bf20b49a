"""Memory vs accuracy of precision assignments (Lee, Sharma and Aiken 2023, Figure 3).

Trains a small CNN on scikit-learn's bundled 8x8 digits (no download) with pi_fp32,
pi_unif, pi_op and pi_ours,r for r in {0, 0.25, 0.5, 0.75, 1}, several seeds each, every
tensor of the gradient computation rounded through lpsim.torch.precision (high fp(6,9,0),
low fp(4,3,4) forward / fp(5,2,0) backward, dynamic loss scaling).  Writes a plot of test
accuracy against the model aggregate (relative to pi_fp32) and a markdown table to --out DIR (default: a new temporary directory, printed at the end).

    python examples/precision_assignment.py --out examples/results          # minutes
    python examples/precision_assignment.py --full --device cuda --out DIR  # wider, longer
"""

from __future__ import annotations

import argparse
import os
import json
import math
import pathlib
import platform
import sys
import tempfile
import time

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from lpsim.torch.precision import DynamicLossScaler, PrecisionModel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _arguments.py, beside
from _arguments import (device_name, file_stem, out_folder, positive_float,  # noqa: E402
                        positive_int)

RS = (0.0, 0.25, 0.5, 0.75, 1.0)


def configs():
    yield "fp32", None
    yield "uniform", None
    yield "operator", None
    for r in RS:
        yield "ours", r


def label(kind, r):
    return {"fp32": "πfp32", "uniform": "πunif", "operator": "πop"}.get(kind, f"πours,{r}")


def cnn(width: int) -> nn.Sequential:
    """Three conv blocks (8x8 -> 2x2) and a linear classifier; 4 GEMM operators."""
    c = width
    return nn.Sequential(
        nn.Conv2d(1, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(),
        nn.Conv2d(c, 2 * c, 3, padding=1), nn.BatchNorm2d(2 * c), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(2 * c, 2 * c, 3, padding=1), nn.BatchNorm2d(2 * c), nn.ReLU(),
        nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * c, 10))


#: training rows of the digits split (1797 images, a quarter held out)
TRAIN_ROWS = 1347


def digits(device):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    data = load_digits()
    x = (data.images / 16.0).astype(np.float32)[:, None]
    xtr, xte, ytr, yte = train_test_split(x, data.target, test_size=0.25, random_state=0,
                                          stratify=data.target)
    t = lambda a, dt: torch.tensor(a, dtype=dt, device=device)  # noqa: E731
    return t(xtr, torch.float32), t(ytr, torch.long), t(xte, torch.float32), t(yte, torch.long)


def run(kind, r, seed, data, args, bar):
    xtr, ytr, xte, yte = data
    torch.manual_seed(seed)
    model = cnn(args.width).to(xtr.device)
    pm = PrecisionModel(model, xtr[:args.batch], assignment=kind, r=0.0 if r is None else r)
    steps = math.ceil(len(xtr) / args.batch)
    opt = torch.optim.SGD(pm.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, args.epochs * steps)
    scaler = DynamicLossScaler(growth_interval=steps)    # growth once an epoch (paper)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    losses = []
    for _ in range(args.epochs):
        pm.train()
        order = torch.randperm(len(xtr), generator=gen).to(xtr.device)
        for k in range(steps):
            idx = order[k * args.batch:(k + 1) * args.batch]
            if len(idx) < args.batch:        # keep every batch the traced size
                continue
            opt.zero_grad(set_to_none=True)
            loss = pm.loss(pm(xtr[idx]), ytr[idx])
            scaler.scale(loss).backward()
            if scaler.step(opt):             # a skipped step keeps its learning rate
                sched.step()
            pm.end_step()
            losses.append(loss.item())
        bar.update(1)
    pm.eval()
    with torch.no_grad():
        acc = sum((pm(xte[i:i + 256]).argmax(1) == yte[i:i + 256]).sum().item()
                  for i in range(0, len(xte), 256)) / len(xte)
    rep = pm.report()
    fp32_bits = 32 * sum(s.size for s in pm.tensors)
    return dict(assignment=kind, r=r, seed=seed, test_accuracy=acc,
                final_loss=losses[-1], diverged=acc < 0.5,
                nonfinite_steps=sum(not math.isfinite(v) for v in losses), steps=len(losses),
                ratio_lo_start=rep["ratio_lo_start"], ratio_lo=rep["ratio_lo"],
                aggregate_start=rep["aggregate_bits_start"] / fp32_bits,
                aggregate=rep["aggregate_bits"] / fp32_bits,
                promotions=[(s, n) for s, n, _ in rep["promotions"]],
                tensors=len(pm.tensors))


def summarise(rows):
    out = []
    for kind, r in configs():
        sel = [x for x in rows if x["assignment"] == kind and x["r"] == r]
        if not sel:
            continue
        acc = np.array([x["test_accuracy"] for x in sel])
        out.append(dict(label=label(kind, r), kind=kind, r=r, runs=len(sel),
                        acc_mean=acc.mean(), acc_std=acc.std(),
                        aggregate=np.mean([x["aggregate"] for x in sel]),
                        aggregate_start=np.mean([x["aggregate_start"] for x in sel]),
                        ratio_lo=np.mean([x["ratio_lo"] for x in sel]),
                        promoted=np.mean([len(x["promotions"]) for x in sel]),
                        nonfinite=np.mean([x["nonfinite_steps"] for x in sel]),
                        diverged=sum(x["diverged"] for x in sel)))
    return out


def table(summary, header):
    lines = [header, "",
             "| assignment | runs | test accuracy (mean ± std) | model aggregate / πfp32 "
             "(start → end) | low-precision ratio (end) | promoted tensors (mean) | "
             "steps with non-finite loss (mean) | diverged (accuracy < 50 %) |",
             "|---|---|---|---|---|---|---|---|"]
    for s in summary:
        lines.append(f"| {s['label']} | {s['runs']} | {100 * s['acc_mean']:.2f} ± "
                     f"{100 * s['acc_std']:.2f} % | {s['aggregate_start']:.3f} → "
                     f"{s['aggregate']:.3f} | {s['ratio_lo']:.3f} | {s['promoted']:.1f} | "
                     f"{s['nonfinite']:.1f} | {s['diverged']} |")
    return "\n".join(lines) + "\n"


def plot(summary, rows, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    marks = {"fp32": ("s", "tab:red"), "uniform": ("^", "tab:olive"),
             "operator": ("D", "tab:blue")}
    cmap = plt.get_cmap("viridis")
    for s in summary:
        sel = [x for x in rows if x["assignment"] == s["kind"] and x["r"] == s["r"]]
        xs = [x["aggregate"] for x in sel]
        ys = [100 * x["test_accuracy"] for x in sel]
        if s["kind"] == "ours":
            marker, color = "o", cmap(0.9 * s["r"])
        else:
            marker, color = marks[s["kind"]]
        ax.scatter(xs, ys, marker=marker, color=color, alpha=0.35, s=18)
        ax.scatter([s["aggregate"]], [100 * s["acc_mean"]], marker=marker, color=color, s=70,
                   edgecolor="black", label=s["label"], zorder=3)
    ours = [s for s in summary if s["kind"] == "ours"]
    ax.plot([s["aggregate"] for s in ours], [100 * s["acc_mean"] for s in ours], color="gray",
            lw=1, zorder=1)
    ax.set_xlabel("model aggregate at the end of training / πfp32")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=130)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=out_folder, default=None,
                   help="directory for the PNG, table and JSON (created if missing); default: a "
                   "new temporary directory, printed at the end.  The committed results are in "
                   + str(pathlib.Path(__file__).resolve().parent / "results"))
    p.add_argument("--full", action="store_true",
                   help="paper-sized sweep: width 32, 30 epochs, batch 128")
    p.add_argument("--epochs", type=positive_int, default=None,
                   help="training epochs per run (default: 8, or 30 with --full)")
    p.add_argument("--seeds", type=positive_int, default=3, help="runs per assignment (default: 3)")
    p.add_argument("--width", type=positive_int, default=None, help="channels of the first conv "
                   "(default: 8, or 32 with --full)")
    p.add_argument("--batch", type=positive_int, default=None,
                   help="training batch size (default: 64, or 128 with --full)")
    p.add_argument("--lr", type=positive_float, default=0.05,
                   help="SGD learning rate, cosine-annealed (default: 0.05)")
    p.add_argument("--device", type=device_name, default="cpu", help="cpu or cuda (CUDA tensors run in lpsim_cuda)")
    p.add_argument("--name", type=file_stem, default="precision_assignment",
                   help="output file stem, written inside --out")
    args = p.parse_args(argv)
    args.epochs = args.epochs or (30 if args.full else 8)
    args.width = args.width or (32 if args.full else 8)
    args.batch = args.batch or (128 if args.full else 64)
    if args.epochs < 1 or args.seeds < 1 or args.width < 1 or args.batch < 1:
        p.error("--epochs, --seeds, --width and --batch must be positive")
    if args.batch > TRAIN_ROWS:         # every batch a full one: none would be left
        p.error(f"--batch {args.batch} is more than the {TRAIN_ROWS} training rows; accepted: "
                f"1 .. {TRAIN_ROWS}")
    out = args.out if args.out is not None else pathlib.Path(
        tempfile.mkdtemp(prefix="lpsim-precision-assignment-"))
    out.mkdir(parents=True, exist_ok=True)
    data = digits(torch.device(args.device))
    runs = [(k, r, s) for k, r in configs() for s in range(args.seeds)]
    rows, t0 = [], time.time()
    with tqdm(total=len(runs) * args.epochs, desc="training", unit="epoch") as bar:
        for kind, r, seed in runs:
            bar.set_postfix_str(f"{label(kind, r)} seed {seed}")
            rows.append(run(kind, r, seed, data, args, bar))
    summary = summarise(rows)
    device = (torch.cuda.get_device_name() if args.device.startswith("cuda")
              else platform.processor() or platform.machine())
    header = (f"Digits (sklearn, {TRAIN_ROWS} train / 450 test), CNN width {args.width}, "
              f"{args.epochs} epochs, batch {args.batch}, {args.seeds} seeds; "
              f"{device}, {time.strftime('%Y-%m-%d', time.gmtime())}, "
              f"{time.time() - t0:.0f} s.\nHigh fp(6,9,0), low fp(4,3,4) forward / fp(5,2,0) "
              "backward, round to nearest; πours,r promotes at Θ = 0.01, πunif and πop do not.")
    (out / f"{args.name}.md").write_text(table(summary, header))
    settings = {**vars(args), "out": str(out)}
    (out / f"{args.name}.json").write_text(json.dumps(dict(args=settings, runs=rows), indent=1,
                                                      default=float))
    plot(summary, rows, out / f"{args.name}.png",
         f"digits CNN (width {args.width}, {args.epochs} epochs, {args.seeds} seeds)")
    print(table(summary, header))
    print(f"wrote {args.name}.md/.json/.png in {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
