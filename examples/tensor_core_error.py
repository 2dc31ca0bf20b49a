"""Error of a Hopper FP8 GEMM against the exact product as K grows.

The same E4M3 inputs through four accumulations: the H100's ``wgmma`` chained along K
(``lpsim.ops`` model ``hopper-wgmma-e4m3``: ``torch._scaled_mm`` with fast accumulation),
the chain promoted to float32 every 128 products (``hopper-wgmma-e4m3-promote128``:
``torch._scaled_mm``'s default on an H100, and DeepGEMM's interval), Blackwell's
``tcgen05.mma`` chained (``blackwell-tcgen05-e4m3``), and an ideal FP32 FMA chain (one
rounding per step).  The exact product is integer arithmetic (E4M3 values are
multiples of 2**-9), so every error shown is the accumulation's own.  Two input families:
standard normal values (signs cancel) and uniform [0, 1) values (no cancellation: the
chain's truncation toward zero shows as a bias).  Writes a plot, a markdown table and the
numbers as JSON to --out DIR (default: a new temporary directory, printed at the end).

    python examples/tensor_core_error.py --out examples/results     # about a minute
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import sys
import tempfile
import time

import numpy as np
from tqdm import tqdm

from lpsim import quantize
from lpsim.ops import AccumulationModel, matmul

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _arguments.py, beside
from _arguments import int_at_most, out_folder, seed_int  # noqa: E402

ACCUMULATIONS = {
    "fast accumulation (wgmma chain)": "hopper-wgmma-e4m3",
    "promoted every 128 (cuBLASLt default, DeepGEMM)": "hopper-wgmma-e4m3-promote128",
    "Blackwell tcgen05 chain (25 bits per node)": "blackwell-tcgen05-e4m3",
    "ideal FP32 FMA chain": AccumulationModel("e4m3fn", "fp32", "fp32", order="sequential"),
}
FAMILIES = {
    "standard normal": lambda rng, shape: rng.standard_normal(shape),
    "uniform [0, 1)": lambda rng, shape: rng.random(shape),
}


#: the largest K whose int64 sums of products are exact (:func:`exact_product`)
MAX_K = 1 << 27


def exact_product(a, b):
    """a @ b exactly: E4M3 values times 2**9 are integers below 2**18, so the int64 sums of
    products (below 2**36 each) are exact up to K = 2**27; float64 holds the result."""
    ia = (a.astype(np.float64) * 2.0 ** 9).astype(np.int64)
    ib = (b.astype(np.float64) * 2.0 ** 9).astype(np.int64)
    return (ia @ ib).astype(np.float64) * 2.0 ** -18


def errors(a, b):
    """Mean over the outputs of |D - exact| / sum_k |a_ik b_kj| and of the same signed
    toward the exact value's sign (negative: D closer to zero than the exact product), per
    accumulation."""
    exact = exact_product(a, b)
    scale = exact_product(np.abs(a), np.abs(b))
    out = {}
    for name, model in ACCUMULATIONS.items():
        d = matmul(a, b, model=model).astype(np.float64)
        rel = (d - exact) / scale
        out[name] = (float(np.mean(np.abs(rel))), float(np.mean(rel * np.sign(exact))))
    return out


def run(args):
    rng = np.random.default_rng(args.seed)
    ks = [32 * 2 ** i for i in range(64) if 32 * 2 ** i <= args.max_k]
    rows = {}
    with tqdm(total=len(FAMILIES) * len(ks), desc="tensor_core_error", unit="K") as bar:
        for family, draw in FAMILIES.items():
            a = quantize(draw(rng, (args.rows, ks[-1])).astype(np.float32), "e4m3fn")
            b = quantize(draw(rng, (ks[-1], args.rows)).astype(np.float32), "e4m3fn")
            rows[family] = {}
            for k in ks:
                rows[family][k] = errors(a[:, :k], b[:k])
                bar.update()
    return ks, rows


def table(ks, rows) -> str:
    lines = []
    for family, by_k in rows.items():
        lines += [f"### {family} inputs: mean |error| / sum |a b| (mean signed toward the "
                  "exact value)", "", "| K | " + " | ".join(ACCUMULATIONS) + " |",
                  "|---|" + "---|" * len(ACCUMULATIONS)]
        for k in ks:
            cells = [f"{m:.2e} ({s:+.1e})" for m, s in by_k[k].values()]
            lines.append(f"| {k} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def plot(ks, rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(rows), figsize=(11, 4.2), sharey=True)
    for ax, (family, by_k) in zip(axes, rows.items()):
        for name, marker in zip(ACCUMULATIONS, "os^d"):
            # an error of 0 (every output exact) has no place on a log axis: left out
            ax.loglog(ks, [by_k[k][name][0] or np.nan for k in ks], marker=marker, label=name)
        ax.axhline(2.0 ** -24, color="gray", lw=0.8, ls=":")
        ax.text(ks[0], 2.0 ** -24 * 1.3, "FP32 unit roundoff", color="gray", fontsize=8)
        ax.set_title(f"E4M3 inputs, {family}")
        ax.set_xlabel("K (products per output)")
        ax.set_xscale("log", base=2)
        ax.grid(True, which="major", alpha=0.3)
    axes[0].set_ylabel("mean |D - exact| / sum |a b|")
    axes[0].legend(fontsize=8, loc="upper left")
    fig.suptitle("FP8 GEMMs against the exact product (H100 wgmma and Blackwell tcgen05, "
                 "bit for bit)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int_at_most(1 << 12), default=64,
                        help="rows of A and columns of B: outputs per K are rows squared "
                        "(at most 4096)")
    parser.add_argument("--max-k", type=int_at_most(MAX_K), default=16384,
                        help=f"largest K (K doubles from 32 up to it; 32 .. {MAX_K}, where "
                        "the exact products still hold)")
    parser.add_argument("--seed", type=seed_int, default=0, help="seed of the inputs")
    parser.add_argument("--out", type=out_folder, default=None,
                        help="directory for the plot, table and JSON (default: a new "
                             "temporary directory)")
    args = parser.parse_args(argv)
    if args.max_k < 32:
        parser.error(f"argument --max-k: {args.max_k} is not accepted; accepted: an integer "
                     ">= 32")
    start = time.time()
    out = args.out or pathlib.Path(tempfile.mkdtemp(prefix="lpsim-tensor-core-error-"))
    out.mkdir(parents=True, exist_ok=True)
    ks, rows = run(args)
    command = "python examples/tensor_core_error.py " + " ".join(argv or sys.argv[1:])
    header = (f"# FP8 GEMM error against K (Hopper wgmma, Blackwell tcgen05)\n\n"
              f"{time.strftime('%Y-%m-%d')}, {platform.processor() or platform.machine()}, "
              f"{time.time() - start:.0f} s; "
              f"command: `{command.strip()}`\n\n")
    (out / "tensor_core_error.md").write_text(header + table(ks, rows))
    (out / "tensor_core_error.json").write_text(json.dumps({
        "args": {k: str(v) if isinstance(v, pathlib.Path) else v
                 for k, v in vars(args).items()},
        "errors": {family: {str(k): v for k, v in by_k.items()}
                   for family, by_k in rows.items()}}, indent=1))
    plot(ks, rows, out / "tensor_core_error.png")
    print(table(ks, rows))
    print(f"wrote {out / 'tensor_core_error.png'}, {out / 'tensor_core_error.md'} and "
          f"{out / 'tensor_core_error.json'}")


if __name__ == "__main__":
    main()
