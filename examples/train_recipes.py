"""The byte-level transformer of train_lm.py trained with simulated FP8, MXFP8 and NVFP4 GEMMs.

Every run trains the same FP32 model from the same seed for the same steps with
``torch.optim.AdamW``; only the recipe of its linear layers' GEMMs differs
(``lpsim.torch.simulate``): ``bf16``, ``fp8_current``, ``mxfp8``, ``nvfp4``, and the NVFP4
ablations of NVIDIA's NVFP4 pretraining paper (arXiv 2509.25149): without stochastic
rounding of gradients, without the random Hadamard transform, with 1 x 16 weight blocks
instead of 16 x 16, and with every layer in NVFP4 (the first and last too).  Writes
validation-loss curves (PNG), a markdown table (final loss, gap to the bf16 run, step time,
the layer operand whose telemetry is worst) and the runs as JSON to ``--out``, or to a new
temporary directory (printed at the end).

    python examples/train_recipes.py --out examples/results [--steps 200]
    python examples/train_recipes.py --device cuda --d-model 512 --layers 8 --context 256
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import sys
import tempfile

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)                  # train_lm.py and _arguments.py, beside

import lpsim  # noqa: E402
from lpsim.torch import PRESETS, report, simulate  # noqa: E402
from _arguments import (device_name, out_folder, positive_float,  # noqa: E402
                        positive_int, seed_int)
from train_lm import ByteLM, run_steps, split_data  # noqa: E402


def _nvfp4_without(**changes):
    r = PRESETS["nvfp4"]
    grad_nearest = r.dgrad.a.with_(rounding="nearest")
    weight_1d = r.fprop.b.with_(blocks_2d=False)
    parts = {
        "sr": dict(dgrad=r.dgrad.__class__(grad_nearest, r.dgrad.b),
                   wgrad=r.wgrad.__class__(grad_nearest, r.wgrad.b)),
        "rht": dict(rht=None),
        "2d": dict(fprop=r.fprop.__class__(r.fprop.a, weight_1d),
                   dgrad=r.dgrad.__class__(r.dgrad.a, weight_1d)),
        "first_last": dict(keep_first_last=False),
    }
    (what, label), = changes.items()
    return r.with_(name=label, **parts[what])


#: run name -> recipe
RUNS = {
    "bf16": PRESETS["bf16"],
    "fp8_current": PRESETS["fp8_current"],
    "mxfp8": PRESETS["mxfp8"],
    "nvfp4": PRESETS["nvfp4"],
    "nvfp4, no SR": _nvfp4_without(sr="nvfp4, no SR"),
    "nvfp4, no RHT": _nvfp4_without(rht="nvfp4, no RHT"),
    "nvfp4, 1x16 weights": _nvfp4_without(**{"2d": "nvfp4, 1x16 weights"}),
    "nvfp4, every layer": _nvfp4_without(first_last="nvfp4, every layer"),
}


def train(name, args, train_data, val_data, progress):
    torch.manual_seed(args.seed)
    model = ByteLM(args.d_model, args.layers, args.heads, args.context).to(args.device)
    simulate(model, RUNS[name], generator=lpsim.Generator(args.seed),
             telemetry=args.telemetry_every)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95),
                            weight_decay=0.1)

    def loss_of(x, y):
        logits = model(x.to(args.device))
        return F.cross_entropy(logits.reshape(-1, 256), y.to(args.device).reshape(-1))

    curve, seconds, _, step = run_steps(opt, loss_of, args, train_data, val_data, progress)
    worst = report(model).worst()
    return dict(curve=curve, final=curve[-1][1], ms_per_step=1e3 * seconds / max(step, 1),
                worst=_describe(worst), params=sum(p.numel() for p in model.parameters()))


def _describe(row):
    """The worst operand of the telemetry in words."""
    if row is None or not row["elements"]:
        return "-"
    n, blocks = row["elements"], max(row["blocks"], 1)
    parts = [f"{100 * row['saturated'] / n:.2f}% saturated",
             f"{100 * row['underflow'] / n:.1f}% underflowed"]
    if row["blocks"]:
        parts.append(f"{100 * row['flushed_blocks'] / blocks:.2f}% blocks flushed")
    return f"{row['layer']} {row['gemm']} {row['operand']}: " + ", ".join(parts)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=out_folder, default=None,
                        help="directory for train_recipes.png / .md / .json (created if "
                        "missing); default: a new temporary directory, printed at the end")
    parser.add_argument("--steps", type=positive_int, default=200,
                        help="optimizer steps per run (default: 200)")
    parser.add_argument("--batch", type=positive_int, default=16,
                        help="sequences per batch (default: 16)")
    parser.add_argument("--context", type=positive_int, default=64,
                        help="bytes per sequence (default: 64; batch x context must be a "
                        "multiple of 32, the largest block along the tokens)")
    parser.add_argument("--d-model", type=positive_int, default=128,
                        help="transformer width (default: 128, a multiple of 32)")
    parser.add_argument("--layers", type=positive_int, default=4,
                        help="transformer blocks (default: 4)")
    parser.add_argument("--heads", type=positive_int, default=4,
                        help="attention heads per block (default: 4)")
    parser.add_argument("--lr", type=positive_float, default=3e-3,
                        help="peak learning rate of every run (default: 3e-3)")
    parser.add_argument("--data-bytes", type=positive_int, default=2_000_000,
                        help="bytes of stdlib sources to read, 90%% train / 10%% validation "
                        "(default: 2000000)")
    parser.add_argument("--eval-every", type=positive_int, default=25,
                        help="steps between validation-loss points (default: 25)")
    parser.add_argument("--val-batches", type=positive_int, default=8,
                        help="batches per validation loss (default: 8)")
    parser.add_argument("--telemetry-every", type=positive_int, default=10,
                        help="count saturation, underflow and flushed blocks every N-th step "
                        "(default: 10)")
    parser.add_argument("--device", type=device_name, default="cpu",
                        help="torch device, cpu or cuda (default: cpu)")
    parser.add_argument("--seed", type=seed_int, default=0,
                        help="seed of the weights, batches and SR bits (default: 0)")
    parser.add_argument("--runs", nargs="*", default=list(RUNS), choices=list(RUNS),
                        metavar="RUN", help="which runs, quoted names from: "
                        + ", ".join(RUNS) + " (default: all)")
    args = parser.parse_args(argv)
    if args.d_model % args.heads:
        parser.error(f"--d-model {args.d_model} is not a multiple of --heads {args.heads}")
    if args.d_model % 32 or (args.batch * args.context) % 32:
        parser.error(f"--d-model {args.d_model} and --batch x --context "
                     f"{args.batch * args.context} must be multiples of 32 (MX blocks)")
    if not args.runs:
        parser.error("--runs names no run; accepted: one or more of "
                     + ", ".join(map(repr, RUNS)))
    train_data, val_data = split_data(args, parser)
    out = args.out if args.out is not None else pathlib.Path(
        tempfile.mkdtemp(prefix="lpsim-train-recipes-"))
    out.mkdir(parents=True, exist_ok=True)
    from tqdm import tqdm
    results = {}
    with tqdm(total=len(args.runs) * args.steps, desc="steps") as progress:
        for name in args.runs:
            progress.set_postfix_str(name)
            results[name] = train(name, args, train_data, val_data, progress)
    write_outputs(results, args, out)


def write_outputs(results, args, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, r in results.items():
        steps, losses = zip(*r["curve"])
        ax.plot(steps, losses, label=name, ls="--" if ", " in name else "-")
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss (nats/byte)")
    params = next(iter(results.values()))["params"]
    ax.set_title(f"byte-level LM, {params} parameters, GEMMs simulated by lpsim "
                 f"({args.device})", fontsize=10)
    finals = [r["final"] for r in results.values() if math.isfinite(r["final"])]
    if finals:
        late = [loss for r in results.values() for step, loss in r["curve"]
                if step >= args.steps // 4 and math.isfinite(loss)]
        ax.set_ylim(min(finals) - 0.05, max(late) + 0.05)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "train_recipes.png", dpi=120)
    plt.close(fig)
    (out / "train_recipes.json").write_text(json.dumps(
        dict(args={k: str(v) for k, v in vars(args).items()}, results=results), indent=1))
    base = results.get("bf16", {}).get("final")
    lines = [f"Byte-level LM, {args.steps} steps of {args.batch}x{args.context} bytes, d_model "
             f"{args.d_model}, {args.layers} layers, {args.device}; AdamW (0.9, 0.95) at "
             f"{args.lr:g}, wd 0.1, warm-up + cosine; every linear layer's GEMMs simulated "
             f"(lpsim.torch.simulate), telemetry every {args.telemetry_every} steps. ms/step "
             "times the steps alone, on whatever else the machine ran "
             "(benchmarks/bench_recipes.py measures speed).", "",
             "| run | final val loss | gap to bf16 | ms/step | worst operand (telemetry) |",
             "|---|---|---|---|---|"]
    for name, r in results.items():
        gap = f"{r['final'] - base:+.4f}" if base is not None else "-"
        lines.append(f"| {name} | {r['final']:.4f} | {gap} | {r['ms_per_step']:.0f} | "
                     f"{r['worst']} |")
    (out / "train_recipes.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {out / 'train_recipes.png'}, {out / 'train_recipes.md'} and "
          f"{out / 'train_recipes.json'}")


if __name__ == "__main__":
    main()
