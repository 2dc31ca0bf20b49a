"""A byte-level transformer on the Python standard library's sources, trained six ways.

FP32; mixed precision (bf16 autocast, FP32 weights and states); and pure bf16 weights and
states with lpsim.optim.AdamW updates rounded to nearest, stochastically, with Kahan
compensation, or with a 16-bit remainder (the FP32 master held exactly).  Equal steps, each
run at its own learning rate (``--tune`` doubles or halves each default while the final
validation loss improves, and keeps the best).  Writes validation-loss curves (PNG) and a markdown table (final
loss, tokens/s, weight + optimizer-state memory) to ``--out``, or to a new temporary directory
(printed at the end) when --out is not given.

    python examples/train_lm.py --out examples/results [--steps 300] [--tune]
    python examples/train_lm.py --device cuda --d-model 512 --layers 8 --context 256 ...
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import sys
import sysconfig
import tempfile
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from lpsim.optim import AdamW  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _arguments.py, beside
from _arguments import (device_name, existing_file, out_folder, positive_int,  # noqa: E402
                        seed_int)

#: run name -> (parameter dtype, autocast, update_rounding, default learning rate); SR runs
#: get a larger rate, as the SR paper (Section 5) finds SR wants 2-4x the usual one
RUNS = {
    "FP32": (torch.float32, False, "nearest", 3e-3),
    "mixed (bf16 autocast)": (torch.float32, True, "nearest", 3e-3),
    "BF16 nearest": (torch.bfloat16, False, "nearest", 3e-3),
    "BF16 + SR": (torch.bfloat16, False, "stochastic", 6e-3),
    "BF16 + Kahan": (torch.bfloat16, False, "kahan", 3e-3),
    "BF16 + remainder": (torch.bfloat16, False, "remainder", 3e-3),
}


def stdlib_bytes(limit: int) -> torch.Tensor:
    """Up to ``limit`` bytes of the standard library's .py files, in a fixed order."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(root.glob("*.py")):
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= limit:
            break
    if not chunks:
        raise SystemExit(f"no Python sources found under {root}")
    return torch.frombuffer(bytearray(b"".join(chunks)[:limit]), dtype=torch.uint8).long()


class Block(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(),
                                       torch.nn.Linear(4 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads) \
            .permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class ByteLM(torch.nn.Module):
    def __init__(self, d, layers, heads, context):
        super().__init__()
        self.embed = torch.nn.Embedding(256, d)
        self.pos = torch.nn.Parameter(torch.randn(context, d) * 0.02)
        self.blocks = torch.nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, 256)

    def forward(self, idx):
        x = self.embed(idx) + self.pos[: idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def split_data(args, parser):
    """(training bytes, validation bytes): ``args.data_bytes`` of the stdlib sources, the last
    tenth held out; each must hold a sequence of ``args.context + 1`` bytes and one more
    start, or a usage error names --data-bytes."""
    data = stdlib_bytes(args.data_bytes)
    split = int(0.9 * data.numel())
    if data.numel() - split < args.context + 2:
        parser.error(f"--data-bytes {args.data_bytes} leaves {data.numel() - split} bytes for "
                     f"validation, fewer than --context {args.context} + 2; accepted: at least "
                     f"{10 * (args.context + 2)}")
    return data[:split], data[split:]


def batches(data, batch, context, gen):
    starts = torch.randint(0, data.numel() - context - 1, (batch,), generator=gen)
    idx = torch.stack([data[s:s + context + 1] for s in starts.tolist()])
    return idx[:, :-1], idx[:, 1:]


def run_steps(opt, loss_of, args, train_data, val_data, progress):
    """``args.steps`` optimizer steps of ``loss_of(x, y)`` on batches of ``train_data`` (seed
    ``args.seed``), warm-up over 20 steps then cosine decay, the validation loss every
    ``args.eval_every`` steps and at the end; stops at a non-finite loss.  Returns (curve of
    (step, validation loss), seconds in the steps alone, tokens trained, steps run)."""
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (
        1 + math.cos(math.pi * min(s, args.steps) / args.steps)))
    gen = torch.Generator().manual_seed(args.seed)
    val_gen = torch.Generator().manual_seed(12345)
    val = [batches(val_data, args.batch, args.context, val_gen) for _ in range(args.val_batches)]
    curve, tokens, seconds = [], 0, 0.0
    for step in range(args.steps + 1):
        if step % args.eval_every == 0 or step == args.steps:
            with torch.no_grad():
                curve.append((step, sum(loss_of(x, y).item() for x, y in val) / len(val)))
        if step == args.steps:
            break
        x, y = batches(train_data, args.batch, args.context, gen)
        start = time.perf_counter()
        opt.zero_grad()
        loss = loss_of(x, y)
        loss.backward()
        opt.step()
        sched.step()
        if args.device == "cuda":
            torch.cuda.synchronize()
        seconds += time.perf_counter() - start
        tokens += x.numel()
        progress.update(1)
        if not math.isfinite(loss.item()):
            curve.append((step + 1, float("nan")))
            break
    return curve, seconds, tokens, step


def train(name, lr, args, train_data, val_data, progress):
    dtype, autocast, update, _ = RUNS[name]
    torch.manual_seed(args.seed)
    model = ByteLM(args.d_model, args.layers, args.heads, args.context).to(args.device, dtype)
    opt = AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1,
                update_rounding=update, seed=args.seed)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()

    def loss_of(x, y):
        with torch.autocast(args.device, dtype=torch.bfloat16, enabled=autocast):
            logits = model(x.to(args.device))
        return F.cross_entropy(logits.float().reshape(-1, 256), y.to(args.device).reshape(-1))

    curve, seconds, tokens, _ = run_steps(opt, loss_of, args, train_data, val_data, progress)
    params = sum(p.numel() for p in model.parameters())
    memory = (torch.cuda.max_memory_allocated() if args.device == "cuda"
              else opt.memory_bytes() * params)
    return dict(curve=curve, final=curve[-1][1], tokens_per_s=tokens / max(seconds, 1e-9),
                memory=memory, params=params, lr=lr,
                cancelled=opt.cancelled_updates / max(1, params * args.steps))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=out_folder, default=None,
                        help="directory for train_lm.png / .md / .json (created if missing); "
                        "default: a new temporary directory, printed at the end.  The "
                        "committed results are in " + str(pathlib.Path(__file__).resolve()
                                                         .parent / "results"))
    parser.add_argument("--steps", type=positive_int, default=300,
                        help="optimizer steps per run (default: 300)")
    parser.add_argument("--batch", type=positive_int, default=16,
                        help="sequences per batch (default: 16)")
    parser.add_argument("--context", type=positive_int, default=64,
                        help="bytes per sequence (default: 64)")
    parser.add_argument("--d-model", type=positive_int, default=64,
                        help="transformer width (default: 64)")
    parser.add_argument("--layers", type=positive_int, default=2,
                        help="transformer blocks (default: 2)")
    parser.add_argument("--heads", type=positive_int, default=4,
                        help="attention heads per block (default: 4)")
    parser.add_argument("--data-bytes", type=positive_int, default=2_000_000,
                        help="bytes of stdlib sources to read, 90%% train / 10%% validation "
                        "(default: 2000000)")
    parser.add_argument("--eval-every", type=positive_int, default=25,
                        help="steps between validation-loss points (default: 25)")
    parser.add_argument("--val-batches", type=positive_int, default=8,
                        help="batches per validation loss (default: 8)")
    parser.add_argument("--device", type=device_name, default="cpu",
                        help="torch device, cpu or cuda (default: cpu)")
    parser.add_argument("--seed", type=seed_int, default=0,
                        help="seed of the weights, batches and SR bits (default: 0)")
    parser.add_argument("--tune", action="store_true",
                        help="search each run's peak learning rate by doubling or halving it "
                        "(at most 5 runs each)")
    parser.add_argument("--runs", nargs="*", default=list(RUNS), choices=list(RUNS),
                        metavar="RUN", help="which runs, quoted names from: "
                        + ", ".join(RUNS) + " (default: all)")
    parser.add_argument("--replot", metavar="JSON", type=existing_file, default=None,
                        help="redraw train_lm.png and .md from the train_lm.json of an earlier "
                        "run instead of training")
    args = parser.parse_args(argv)
    if args.d_model % args.heads:
        parser.error(f"--d-model {args.d_model} is not a multiple of --heads {args.heads}")
    if not args.runs and not args.replot:
        parser.error("--runs names no run; accepted: one or more of "
                     + ", ".join(map(repr, RUNS)))
    saved = None
    if args.replot:
        try:
            saved = json.loads(args.replot.read_text())
            saved["results"], saved["args"]
        except (ValueError, KeyError, TypeError) as error:
            parser.error(f"--replot {str(args.replot)!r} is not a train_lm.json of this script "
                         f"({type(error).__name__}: {error})")
    out = args.out if args.out is not None else pathlib.Path(
        tempfile.mkdtemp(prefix="lpsim-train-lm-"))
    out.mkdir(parents=True, exist_ok=True)
    if saved is not None:
        write_outputs(saved["results"], argparse.Namespace(**{**saved["args"], "out": str(out)}),
                      out)
        return
    train_data, val_data = split_data(args, parser)
    from tqdm import tqdm
    per_run = TUNE_RUNS if args.tune else 1
    results = {}
    with tqdm(total=len(args.runs) * per_run * args.steps, desc="steps") as progress:
        for name in args.runs:
            def run(lr, name=name):
                return train(name, lr, args, train_data, val_data, progress)
            tried = tune(run, RUNS[name][3]) if args.tune else [run(RUNS[name][3])]
            best = min(tried, key=_final)
            best["tried"] = sorted((r["lr"], r["final"]) for r in tried)
            results[name] = best
            progress.total -= (per_run - len(tried)) * args.steps    # runs the search skipped
            progress.set_postfix_str(f"{name}: {best['final']:.3f} at lr {best['lr']:.1e}")
            progress.refresh()
    write_outputs(results, args, out)


#: runs a tuned configuration may take at most (1x and 2x, then doubling or halving)
TUNE_RUNS = 5


def _final(r):
    return r["final"] if math.isfinite(r["final"]) else float("inf")


def tune(run, lr0):
    """Runs at lr0 * 2**j: 1x and 2x, then onward in the better direction while the final
    validation loss improves (at most TUNE_RUNS runs), so that the kept rate has a worse one
    on each side unless the budget ends first."""
    tried = [run(lr0), run(2 * lr0)]
    step, lr = (2.0, 2 * lr0) if _final(tried[1]) < _final(tried[0]) else (0.5, lr0)
    best = min(tried, key=_final)
    while len(tried) < TUNE_RUNS:
        lr *= step
        r = run(lr)
        tried.append(r)
        if _final(r) >= _final(best):
            break
        best = r
    return tried


def write_outputs(results, args, out):
    import matplotlib
    import matplotlib.ticker
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, tax) = plt.subplots(1, 2, figsize=(11, 4.5),
                                  gridspec_kw=dict(width_ratios=[3, 2]))
    for name, r in results.items():
        steps, losses = zip(*r["curve"])
        line, = ax.plot(steps, losses, label=f"{name} (lr {r['lr']:.1e})")
        lrs, finals = zip(*r["tried"])
        tax.plot(lrs, finals, "o-", color=line.get_color(), label=name)
        tax.plot([r["lr"]], [r["final"]], "*", ms=12, color=line.get_color())
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss (nats/byte)")
    ax.set_title(f"byte-level LM on Python stdlib sources, {next(iter(results.values()))['params']}"
                 f" parameters, {args.device}", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    finals = [r["final"] for r in results.values() if math.isfinite(r["final"])]
    if finals:    # the part after warm-up, where the runs differ
        late = [loss for r in results.values() for step, loss in r["curve"]
                if step >= args.steps // 4 and math.isfinite(loss)]
        ax.set_ylim(min(finals) - 0.05, max(late) + 0.05)
    tax.set_xscale("log")
    tried_lrs = sorted({lr for r in results.values() for lr, _ in r["tried"]})
    tax.set_xticks(tried_lrs, [f"{lr:.1e}" for lr in tried_lrs], rotation=30, fontsize=8)
    tax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    tax.set_xlabel("peak learning rate")
    tax.set_ylabel("final validation loss")
    tax.set_title("learning-rate search (star: kept)" if args.tune else "learning rate",
                  fontsize=10)
    tax.grid(alpha=0.3)
    tfinals = [f for r in results.values() for _, f in r["tried"] if math.isfinite(f)]
    if tfinals:
        tax.set_ylim(min(tfinals) - 0.02, min(max(tfinals), min(tfinals) + 0.5) + 0.02)
    fig.tight_layout()
    fig.savefig(out / "train_lm.png", dpi=120)
    # the runs themselves, so that the figure can be redrawn (--replot) without training
    (out / "train_lm.json").write_text(json.dumps(
        dict(args={k: str(v) if isinstance(v, pathlib.PurePath) else v
                   for k, v in vars(args).items()}, results=results), indent=1))
    memory = "peak GPU memory (MB)" if args.device == "cuda" else "weights + states (KB)"
    scale = 1e6 if args.device == "cuda" else 1e3
    lines = [f"Byte-level LM, {args.steps} steps of {args.batch}x{args.context} bytes, d_model "
             f"{args.d_model}, {args.layers} layers, {args.device}; AdamW (0.9, 0.95), wd 0.1, "
             "warm-up + cosine"
             f"{'; each run at the best peak rate of a doubling/halving search' if args.tune else ''}"
             ". tokens/s times the steps alone, on whatever else the machine ran.", "",
             f"| run | lr | final val loss | tokens/s | {memory} | cancelled updates | "
             "rates tried (final loss) |",
             "|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        tried = ", ".join(f"{lr:.1e} ({f:.4f})" for lr, f in r["tried"])
        lines.append(f"| {name} | {r['lr']:.1e} | {r['final']:.4f} | {r['tokens_per_s']:.0f} | "
                     f"{r['memory'] / scale:.1f} | {100 * r['cancelled']:.1f}% | {tried} |")
    (out / "train_lm.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {out / 'train_lm.png'}, {out / 'train_lm.md'} and {out / 'train_lm.json'}")


if __name__ == "__main__":
    main()
