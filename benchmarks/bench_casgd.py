"""Native CA-SGD speed: time per equivalent SGD iteration against FP32 SGD on the same GPU.

On ``synth`` (m x n, logistic; rows of unit norm, built on the device in u_A's storage) it
times, with CUDA events around CUDA-graph replays of whole outer iterations:

* the peer, FP32 SGD (recipe A, b = 32, s = 1) on the same native path (data on the device,
  one graph per step);
* recipes A, C, D, G over b x s (Table 6's grid), each as seconds per *equivalent SGD
  iteration* (outer iteration / s) and as the speedup over the peer;
* the Gram GEMM (bf16 in, fp32 accumulate/out) in TFLOP/s against the bf16 matmul peak of an
  8192^3 GEMM measured in the same run, and the copy bandwidth, for a roofline plot like the
  paper's Figure 5 (``--plot``);
* the CPU simulator (``backend="cpu"``) on the same n for a few outer iterations, so users see
  what the GPU buys.

Targets (issue 15): Recipe C >= 8x FP32 SGD at (b, s) = (8, 64) and >= 20x at (1, 256); the
Gram GEMM >= 90% of the measured bf16 peak at s = 128.

    python benchmarks/bench_casgd.py [--rows 1000000] [--features 9984] [--repeats 20]
        [--json benchmarks/results/casgd-gpu.json] [--plot benchmarks/results/casgd-roofline.png]

``--simulate`` runs the same code on CPU tensors with the kernels in numba's CUDA simulator
(NUMBA_ENABLE_CUDASIM=1) at a tiny size: it checks the script, its times mean nothing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import sys
import time

import numpy as np

RECIPES = ("A", "C", "D", "G")
BS = (1, 8, 32)
SS = (1, 4, 16, 64, 256)
TARGETS = {("C", 8, 64): 8.0, ("C", 1, 256): 20.0}
GRAM_TARGET = 0.90


if "--simulate" in sys.argv[1:]:
    # numba reads this once, when it is first imported (the next line imports it)
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
# lpsim's threads, read without starting numba's threading layer (which would set the
# OpenMP thread count that torch shares)
from lpsim.cpu import threads as lpsim_threads  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # benchmarks/timing.py
from timing import output_file, positive_int  # noqa: E402


def parse():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=positive_int, default=1_000_000, help="samples m")
    parser.add_argument("--features", type=positive_int, default=9984, help="features n")
    parser.add_argument("--recipes", type=_recipe_list, default=",".join(RECIPES),
                        help="comma-separated CA-SGD recipes (A .. I) to time")
    parser.add_argument("--b", type=_count_list, default=",".join(map(str, BS)),
                        help="comma-separated batch sizes")
    parser.add_argument("--s", type=_count_list, default=",".join(map(str, SS)),
                        help="comma-separated inner steps")
    parser.add_argument("--repeats", type=positive_int, default=20,
                        help="timed outer iterations")
    parser.add_argument("--cpu-outer", type=positive_int, default=2,
                        help="outer iterations of the CPU simulator per (b, s) it is timed at")
    parser.add_argument("--cpu-rows", type=positive_int, default=4096,
                        help="rows of the CPU simulator's data (its time does not depend on m)")
    parser.add_argument("--simulate", action="store_true",
                        help="CPU tensors + numba's CUDA simulator at a tiny size (a smoke run)")
    parser.add_argument("--cpu-only", action="store_true",
                        help="time only the CPU simulator at (b, s) = (8, 64) and (1, 256)")
    parser.add_argument("--json", type=output_file,
                        help="also write the results as JSON to this path")
    parser.add_argument("--plot", type=output_file,
                        help="write the roofline plot (PNG) to this path")
    args = parser.parse_args()
    if args.simulate and not any(v <= 8 for v in map(int, args.b.split(","))):
        parser.error(f"--simulate times batch sizes up to 8; --b {args.b} has none")
    return args


def _count_list(text: str) -> str:
    """argparse type: comma-separated integers >= 1 (kept as the text)."""
    for part in text.split(","):
        positive_int(part)
    return text


def _recipe_list(text: str) -> str:
    """argparse type: comma-separated recipe names of lpsim.casgd (kept as the text)."""
    from lpsim.casgd.recipes import RECIPES as KNOWN
    unknown = [key for key in text.split(",") if key not in KNOWN]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown recipes {unknown}; accepted: "
                                         + ", ".join(KNOWN))
    return text


def synth_on_device(m, n, store, device, seed=0):
    """Unit-norm rows and +-1 labels from a planted x (Table 4's synth), built in chunks on
    the device in the storage dtype, so 10^6 x 9984 never exists in float32 on the host."""
    import torch
    gen = torch.Generator(device=device).manual_seed(seed)
    x_true = torch.randn(n, generator=gen, device=device) / n ** 0.5
    A = torch.empty((m, n), dtype=store, device=device)
    y = torch.empty(m, dtype=torch.float64, device=device)
    chunk = 65536
    for lo in range(0, m, chunk):
        rows = torch.randn((min(chunk, m - lo), n), generator=gen, device=device)
        rows /= rows.norm(dim=1, keepdim=True)
        A[lo:lo + rows.shape[0]] = rows.to(store)
        p = torch.sigmoid(rows @ x_true * 4)
        u = torch.rand(rows.shape[0], generator=gen, device=device)
        y[lo:lo + rows.shape[0]] = torch.where(u < p, 1.0, -1.0).double()
    return A, y


class Timer:
    """Seconds per call: CUDA events around replays on a GPU, wall clock otherwise."""

    def __init__(self, cuda: bool):
        self.cuda = cuda

    def __call__(self, fn, repeats: int) -> float:
        import torch
        fn()
        if self.cuda:
            torch.cuda.synchronize()
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(repeats):
                fn()
            stop.record()
            stop.synchronize()
            return start.elapsed_time(stop) / 1e3 / repeats
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn()
        return (time.perf_counter() - t0) / repeats


def outer_time(data, recipe, b, s, timer, repeats, graphs):
    """Seconds per outer iteration of the native run (graph replays on a GPU)."""
    from lpsim.casgd.losses import get_loss
    from lpsim.casgd.native import NativeRun
    from lpsim.casgd.recipes import as_recipe
    run = NativeRun(data, get_loss("logistic"), as_recipe(recipe), 0.5, b, s, 1,
                    np.zeros(data.n))
    seconds = timer(lambda: run.step(graphs), repeats)
    del run                   # frees its buffers and graph pool before the next configuration
    return seconds


def recurrence_time(b, s, timer, repeats, device):
    """Seconds of the inner recurrence kernel alone (recipe C, logistic) at (b, s): the part
    of an outer iteration that grows with s, a chain of s dependent steps."""
    import torch
    from lpsim.casgd import RECIPES
    from lpsim.casgd.inner import inner_args
    from lpsim_cuda.casgd import inner_recurrence
    gen = torch.Generator(device=device).manual_seed(0)
    Y = (torch.randn((s * b, 256), generator=gen, device=device) / 16).to(torch.bfloat16)
    G = torch.mm(Y.float(), Y.float().T)
    r = (Y.float() @ torch.randn(256, generator=gen, device=device)).to(torch.bfloat16).float()
    y = torch.where(torch.rand(s * b, generator=gen, device=device) < 0.5, -1.0, 1.0).double()
    delta, delta_c = (torch.empty(s * b, dtype=torch.float64, device=device) for _ in "dc")
    alpha_c, code, pc, ps = inner_args(RECIPES["C"], "logistic", 0.5 / b)
    return timer(lambda: inner_recurrence(r, G, y, delta, delta_c, b, s, alpha_c, code, pc, ps),
                 repeats)


def gemm_tflops(timer, sb, n, device, repeats):
    """TFLOP/s of the Gram GEMM Y Y^T (bf16 in, fp32 out) for sb x n rows."""
    import torch
    Y = torch.randn((sb, n), device=device).to(torch.bfloat16)
    if device == "cpu":
        fn = lambda: torch.mm(Y.float(), Y.float().T)        # noqa: E731
    else:
        fn = lambda: torch.mm(Y, Y.T, out_dtype=torch.float32)   # noqa: E731
    return 2 * sb * sb * n / timer(fn, repeats) / 1e12


def gram_split_tflops(timer, sb, n, splits, device, repeats):
    """TFLOP/s (of the whole 2 sb^2 n) of the Gram GEMM as ``splits`` GEMMs over slices of
    the features, one batched call (bf16 in, fp32 out), then their sum: more output tiles
    for the device's SMs where sb^2 alone leaves many idle (another order of the fp32
    sums; the native path's contract holds G to the local error bound, not to bits)."""
    import torch
    Y = torch.randn((sb, n), device=device).to(torch.bfloat16)
    k = n // splits
    parts = Y[:, :k * splits].reshape(sb, splits, k).transpose(0, 1)      # splits x sb x k
    if device == "cpu":
        fn = lambda: torch.bmm(parts.float(), parts.float().transpose(1, 2)).sum(0)  # noqa
    else:
        fn = lambda: torch.bmm(parts, parts.transpose(1, 2),                        # noqa
                               out_dtype=torch.float32).sum(0)
    return 2 * sb * sb * k * splits / timer(fn, repeats) / 1e12


def peak_and_bandwidth(timer, device, repeats):
    """The bf16 matmul peak (8192^3, bf16 out) and the device copy bandwidth (GB/s)."""
    import torch
    k = 8192 if device != "cpu" else 512
    a = torch.randn((k, k), device=device).to(torch.bfloat16)
    peak = 2 * k ** 3 / timer(lambda: a @ a, repeats) / 1e12
    src = torch.empty(1 << (28 if device != "cpu" else 22), dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    bw = 2 * src.numel() * 4 / timer(lambda: dst.copy_(src), repeats) / 1e9
    return peak, bw


def cpu_sim_time(n, b, s, outer, rows):
    """Seconds per outer iteration of the CPU simulator (recipe C) on the same n."""
    from lpsim.casgd import casgd, make_synth
    A, y, _ = make_synth(rows, n, seed=0)
    casgd(A, y, eta=0.5, b=b, s=s, H=1, recipe="C", seed=1)      # compile
    t0 = time.perf_counter()
    casgd(A, y, eta=0.5, b=b, s=s, H=outer, recipe="C", seed=1)
    return (time.perf_counter() - t0) / outer


def roofline(rows, peak, bw, path):
    """Achieved Gram TFLOP/s against arithmetic intensity, under the measured roofs."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    ai = np.logspace(-1, 4, 200)
    ax.loglog(ai, np.minimum(peak, ai * bw / 1e3), "k-", label=f"roof: {peak:.3g} TFLOP/s, "
              f"{bw:.3g} GB/s")
    best = {}                   # a size measured for two batch sizes: its faster run, one label
    for sb, n, tflops in rows:
        best[sb, n] = max(tflops, best.get((sb, n), 0.0))
    for i, ((sb, n), tflops) in enumerate(sorted(best.items())):
        intensity = 2 * sb * sb * n / (2 * sb * n + 4 * sb * sb)   # bf16 in, fp32 out
        ax.loglog(intensity, tflops, "o", color=f"C{i % 10}", label=f"s*b = {sb}")
    ax.set_xlabel("arithmetic intensity of the Gram GEMM (flop/byte)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title("CA-SGD Gram GEMM (bf16 in, fp32 out) on the roofline")
    ax.legend(loc="upper left", fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def cpu_only(args):
    """The CPU simulator's seconds per outer iteration (recipe C) on n features: what the
    GPU numbers are to be compared with, measured on this machine's CPU."""
    import numba
    from tqdm.auto import tqdm
    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    lines = [f"# {today}  CPU simulator only: {platform.machine()}, {os.cpu_count()} cores, "
             f"numba {numba.__version__} ({lpsim_threads()} threads)",
             f"# command: {command}",
             f"# recipe C, logistic, n={args.features} ({args.cpu_rows} rows drawn from; the "
             "time does not depend on m); no GPU numbers here",
             "   b    s  s/outer  ms/SGD-iter"]
    out = {}
    for b, s in tqdm([(8, 64), (1, 256)], desc="CPU simulator"):
        t = cpu_sim_time(args.features, b, s, args.cpu_outer, args.cpu_rows)
        out[f"{b},{s}"] = t
        lines.append(f"{b:>4} {s:>4} {t:>8.3f} {t / s * 1e3:>12.3f}")
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"device": "cpu", "date": today, "command": command,
                       "n": args.features, "cpu_simulator_s": out}, handle, indent=1)


def main():
    args = parse()
    if args.cpu_only:
        return cpu_only(args)
    if args.simulate:              # (the simulator was switched on before numba's import)
        args.rows, args.features = min(args.rows, 512), min(args.features, 64)
        args.repeats, args.cpu_rows = min(args.repeats, 2), min(args.cpu_rows, 512)
    import torch
    from tqdm.auto import tqdm
    from lpsim.casgd.native import DeviceData, _dtype
    from lpsim.casgd.recipes import as_recipe
    device = "cpu" if args.simulate else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device: run on a GPU, or --simulate for a smoke run")
    recipes = args.recipes.split(",")
    bs, ss = [int(v) for v in args.b.split(",")], [int(v) for v in args.s.split(",")]
    if args.simulate:
        bs, ss = [v for v in bs if v <= 8][:2], [v for v in ss if v <= 16][:2]
    timer = Timer(device == "cuda")
    graphs = device == "cuda"
    m, n = args.rows, args.features
    store_of = {key: _dtype(as_recipe(key).u_A.fmt) for key in set(recipes) | {"A"}}
    # one storage resident at a time (10^6 x 9984 is 40 GB in fp32, 20 GB in bf16)
    order = sorted(set(store_of.values()), key=lambda dt: dt != store_of["A"])
    grid = [(key, b, s) for key in recipes for b in bs for s in ss]
    found, peer = {}, None
    bar = tqdm(total=len(grid) + 1, desc="native CA-SGD")
    for store in order:
        A, y = synth_on_device(m, n, store, device)
        data = DeviceData.resident(A, y)
        if store == store_of["A"]:
            peer = outer_time(data, "A", 32, 1, timer, args.repeats, graphs)
            bar.update()
        for key, b, s in grid:
            if store_of[key] == store:
                found[(key, b, s)] = outer_time(data, key, b, s, timer, args.repeats, graphs)
                bar.update()
        del A, y, data
        if device == "cuda":
            torch.cuda.empty_cache()
    bar.close()
    rows = []
    for key, b, s in grid:
        t = found[(key, b, s)]
        rows.append({"recipe": key, "b": b, "s": s, "outer_s": t, "per_sgd_iter_s": t / s,
                     "speedup_vs_fp32_sgd": peer / (t / s)})
    peak, bw = peak_and_bandwidth(timer, device, args.repeats)
    gram = []
    for gb in ((8, 32) if not args.simulate else (4,)):
        for s in sorted(set(ss) | {128}):
            gram.append((gb * s, n, gemm_tflops(timer, gb * s, n, device, args.repeats)))
    split = {(sb, k): gram_split_tflops(timer, sb, n, k, device, args.repeats)
             for sb in ((512, 1024) if not args.simulate else (16,)) for k in (2, 4)}
    alone = {(b, s): recurrence_time(b, s, timer, args.repeats, device)
             for b, s in ([(8, 64), (1, 256)] if not args.simulate else [(bs[0], ss[-1])])}
    cpu = {}
    for b, s in [(8, 64), (1, 256)] if not args.simulate else [(bs[0], ss[-1])]:
        cpu[(b, s)] = cpu_sim_time(n, b, s, args.cpu_outer, args.cpu_rows)
    # report
    name = "CPU tensors under numba's CUDA simulator (smoke run: times mean nothing)" \
        if args.simulate else torch.cuda.get_device_name()
    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    lines = [f"# {today}  device: {name}; torch {torch.__version__}, {platform.machine()}",
             f"# command: {command}",
             f"# synth m={m} n={n} logistic; peer: FP32 SGD (recipe A, b=32, s=1) on the same "
             f"native path = {peer * 1e6:.1f} us per iteration",
             "recipe  b    s   us/outer  us/SGD-iter  x FP32 SGD"]
    for row in rows:
        lines.append(f"{row['recipe']:>6} {row['b']:>2} {row['s']:>4} {row['outer_s'] * 1e6:>10.1f}"
                     f" {row['per_sgd_iter_s'] * 1e6:>12.2f} {row['speedup_vs_fp32_sgd']:>11.2f}")
    lines.append(f"# bf16 matmul peak (measured): {peak:.1f} TFLOP/s; copy bandwidth {bw:.0f} GB/s")
    for sb, _, tflops in gram:
        lines.append(f"Gram GEMM sb={sb:>5} n={n}: {tflops:8.2f} TFLOP/s = "
                     f"{tflops / peak:6.1%} of peak")
    for (sb, k), tflops in split.items():
        lines.append(f"Gram GEMM sb={sb:>5} n={n} as {k} slices of the features (one bmm, "
                     f"then their sum): {tflops:8.2f} TFLOP/s = {tflops / peak:6.1%} of peak")
    for (b, s), t in alone.items():
        native = found.get(("C", b, s))
        share = f" ({t / native:.0%} of recipe C's outer iteration)" if native else ""
        lines.append(f"inner recurrence alone, recipe C b={b} s={s}: {t * 1e6:.1f} us, "
                     f"{t / s * 1e6:.2f} us a step{share}")
    for (b, s), t in cpu.items():
        native = next((r["outer_s"] for r in rows if (r["recipe"], r["b"], r["s"]) == ("C", b, s)),
                      None)
        ratio = f"; native recipe C is {t / native:.3g}x faster" if native else ""
        lines.append(f"CPU simulator recipe C b={b} s={s}: {t:.3f} s per outer iteration{ratio}")
    verdicts = []
    for (key, b, s), target in TARGETS.items():
        got = next((r["speedup_vs_fp32_sgd"] for r in rows
                    if (r["recipe"], r["b"], r["s"]) == (key, b, s)), None)
        if got is not None:
            verdicts.append(f"# target recipe {key} (b,s)=({b},{s}) >= {target:g}x: "
                            f"{got:.2f}x {'met' if got >= target else 'NOT met'}")
    for gb in (8, 32):
        at128 = next((t for sb, _, t in gram if sb == gb * 128), None)
        if at128 is not None:
            verdicts.append(f"# target Gram GEMM at s=128 (b={gb}) >= {GRAM_TARGET:.0%} of peak: "
                            f"{at128 / peak:.1%} "
                            f"{'met' if at128 >= GRAM_TARGET * peak else 'NOT met'}")
    if args.simulate:
        verdicts = ["# smoke run under the simulator: no target is judged"]
    print("\n".join(lines + verdicts))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"device": name, "date": today, "command": command, "m": m, "n": n,
                       "peer_fp32_sgd_s": peer, "rows": rows, "bf16_peak_tflops": peak,
                       "copy_gbs": bw, "gram": [dict(sb=sb, n=nn, tflops=t) for sb, nn, t in gram],
                       "cpu_simulator_s": {f"{b},{s}": t for (b, s), t in cpu.items()},
                       "recurrence_alone_s": {f"{b},{s}": t for (b, s), t in alone.items()},
                       "gram_split": [dict(sb=sb, n=n, splits=k, tflops=t)
                                      for (sb, k), t in split.items()],
                       "verdicts": verdicts}, handle, indent=1)
    if args.plot:
        roofline(gram, peak, bw, args.plot)


if __name__ == "__main__":
    main()
