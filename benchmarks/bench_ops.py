"""Simulated GEMM throughput: per-step rounded accumulation and the BLAS path vs numpy float32.

    python benchmarks/bench_ops.py [--n 512] [--repeat 3] [--json out.json]

Prints simulated multiply-accumulates per second (n**3 / seconds, best of --repeat) for a
n x n x n matmul, next to numpy's float32 matmul in the same run, and the ratio.

With ``--sweep``: per-call time across sizes of ``ops.add`` (bf16, nearest and stochastic)
against numpy's add, of sequential ``ops.dot`` with a bf16 accumulator (rounded steps per
second) against numpy's float32 dot, and of ``ops.matmul`` (fp16 in and accumulator)
against numpy's matmul, with the targets: scalar add <= 5 us, 16x16 matmul <= 30 us,
sequential dot >= 1e8 rounded steps/s.

    python benchmarks/bench_ops.py --sweep [--plot out.png] [--json out.json]

With ``--scalars``: per-call time of ``ops.add(x, y, "bf16")`` on scalars of each kind a
program passes (Python floats, numpy float64/float32/float16 and int64 scalars, ml_dtypes
bfloat16 scalars: what indexing an array gives), and its ratio to Python floats.

    python benchmarks/bench_ops.py --scalars
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time

import numba
import numpy as np

import lpsim.ops as ops


# lpsim's threads, read without starting numba's threading layer (which would set the
# OpenMP thread count that torch shares)
from lpsim.cpu import threads as lpsim_threads  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # benchmarks/timing.py
from timing import int_in, output_file, positive_float, positive_int  # noqa: E402


def best(fn, repeat):
    fn()   # compile / warm up
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


#: rounds of --sweep: each times a batch of every case of a size in turn
ROUNDS = 9


def sweep(args):
    """Per-call times of the simulated ops across sizes, against numpy in the same run."""
    from tqdm import tqdm

    from timing import per_call_rounds, throughput_plot

    rng = np.random.default_rng(0)
    rows = []

    def add(case, size, unit, seconds, peer=None, work=None):
        rows.append({"case": case, "size": size, "unit": unit, "seconds": seconds,
                     "peer_seconds": peer, "work_per_s": None if work is None else work / seconds})

    def timed(calls):
        return per_call_rounds(calls, budget=args.budget, rounds=ROUNDS)

    t = timed({"nearest": lambda: ops.add(1.0, 2.0 ** -9, "bf16"),
               "stochastic": lambda: ops.add(1.0, 2.0 ** -9, "bf16", "stochastic", seed=1),
               "python": lambda: 1.0 + 2.0 ** -9})
    scalar = t["nearest"]
    add("ops.add scalar bf16 nearest", 1, "call", scalar, t["python"])
    add("ops.add scalar bf16 stochastic", 1, "call", t["stochastic"])
    sizes = [1 << k for k in range(4, args.max_log2n + 1, 2)]
    for n in tqdm(sizes, desc="elementwise and dot", file=sys.stderr):
        a = rng.standard_normal(n).astype(np.float32)
        b = rng.standard_normal(n).astype(np.float32)
        t = timed({
            "add": lambda: ops.add(a, b, "bf16"),
            "numpy add": lambda: np.add(a, b),
            "add SR": lambda: ops.add(a, b, "bf16", "stochastic", seed=1),
            "dot": lambda: ops.dot(a, b, acc_fmt="bf16", order="sequential"),
            "numpy dot": lambda: np.dot(a, b),
            "dot SR": lambda: ops.dot(a, b, acc_fmt="bf16", order="sequential",
                                      acc_rounding="stochastic", seed=1)})
        add("ops.add bf16 nearest", n, "elements", t["add"], t["numpy add"], n)
        add("ops.add bf16 stochastic", n, "elements", t["add SR"], None, n)
        add("ops.dot sequential bf16 acc nearest", n, "steps", t["dot"], t["numpy dot"], n)
        add("ops.dot sequential bf16 acc stochastic", n, "steps", t["dot SR"], None, n)
    for n in tqdm([4, 8, 16, 32, 64, 128, 256], desc="matmul", file=sys.stderr):
        a = rng.standard_normal((n, n)).astype(np.float32)
        b = rng.standard_normal((n, n)).astype(np.float32)
        t = timed({"lpsim": lambda: ops.matmul(a, b, in_fmt="fp16", acc_fmt="fp16"),
                   "numpy": lambda: np.matmul(a, b)})
        add("ops.matmul fp16 in, fp16 acc", n, "MAC", t["lpsim"], t["numpy"], n ** 3)

    print(f"# lpsim.ops across sizes, {datetime.datetime.now().isoformat(timespec='seconds')}, "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, numba "
          f"{numba.__version__} ({lpsim_threads()} threads), numpy {np.__version__}")
    print("# command: python benchmarks/bench_ops.py " + " ".join(sys.argv[1:])
          + "; load average at the end: " + ", ".join(f"{v:.2f}" for v in os.getloadavg()))
    print(f"# per-call times: median of {ROUNDS} rounds; each round times a batch of every case "
          "of a size in turn (timing.per_call_rounds)")
    print(f"{'case':42s} {'size':>9s} {'us/call':>10s} {'numpy us':>10s} {'per second':>12s}")
    for r in rows:
        peer = "" if r["peer_seconds"] is None else f"{r['peer_seconds'] * 1e6:.2f}"
        rate = "" if r["work_per_s"] is None else f"{r['work_per_s']:.3e} {r['unit']}"
        print(f"{r['case']:42s} {r['size']:9d} {r['seconds'] * 1e6:10.2f} {peer:>10s} "
              f"{rate:>12s}")
    matmul16 = next(r["seconds"] for r in rows if r["case"].startswith("ops.matmul")
                    and r["size"] == 16)
    dots = [r["work_per_s"] for r in rows
            if r["case"] == "ops.dot sequential bf16 acc nearest" and r["size"] >= 1 << 12]
    print(f"target: ops.add on scalars <= 5 us: got {scalar * 1e6:.2f} us -> "
          f"{'met' if scalar <= 5e-6 else 'NOT met'}")
    print(f"target: ops.matmul 16x16 <= 30 us: got {matmul16 * 1e6:.2f} us -> "
          f"{'met' if matmul16 <= 30e-6 else 'NOT met'}")
    if dots:
        print(f"target: sequential ops.dot >= 1e8 rounded steps/s (n >= 4096): got "
              f"{min(dots):.3e} .. {max(dots):.3e} -> "
              f"{'met' if min(dots) >= 1e8 else 'NOT met'}")
    if args.plot:
        series = {}
        for case in ("ops.add bf16 nearest", "ops.add bf16 stochastic",
                     "ops.dot sequential bf16 acc nearest",
                     "ops.dot sequential bf16 acc stochastic"):
            series["lpsim " + case] = [r["work_per_s"] for r in rows if r["case"] == case]
        series["numpy add (peer)"] = [r["size"] / r["peer_seconds"] for r in rows
                                      if r["case"] == "ops.add bf16 nearest"]
        series["numpy float32 dot (peer)"] = [r["size"] / r["peer_seconds"] for r in rows
                                              if r["case"] == "ops.dot sequential bf16 acc "
                                                              "nearest"]
        throughput_plot(args.plot, sizes, series, ylabel="elements or rounded steps per second",
                        title="lpsim.ops throughput by size (bf16)",
                        note=f"{platform.processor() or platform.machine()}, "
                             f"{os.cpu_count()} cores, {datetime.date.today()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows}, f, indent=1)


def scalars(args):
    """Per-call times of ops.add on each kind of scalar, against Python floats."""
    kinds = {"Python float": float, "numpy float64": np.float64, "numpy float32": np.float32,
             "numpy float16": np.float16, "numpy int64": np.int64}
    try:
        import ml_dtypes
        kinds["ml_dtypes bfloat16"] = ml_dtypes.bfloat16
    except ImportError:
        pass
    values = {name: (kind(1.1), kind(2.3)) if name != "numpy int64" else (kind(3), kind(5))
              for name, kind in kinds.items()}
    calls = {name: (lambda x=x, y=y: ops.add(x, y, "bf16")) for name, (x, y) in
             values.items()}
    for fn in calls.values():
        fn()                                     # compile, validate, cache
    times = {name: float("inf") for name in calls}
    for _ in range(args.repeat):
        for name, fn in calls.items():           # interleaved: load drifts alike
            n = 20000
            t = time.perf_counter()
            for _ in range(n):
                fn()
            times[name] = min(times[name], (time.perf_counter() - t) / n)
    print(f"# ops.add(x, y, 'bf16') per call by scalar kind, best of {args.repeat} batches, "
          f"{datetime.date.today()}, {platform.processor() or platform.machine()}, numpy "
          f"{np.__version__}")
    print(f"{'operands':22s} {'us/call':>9s} {'x Python float':>15s}")
    base = times["Python float"]
    for name, t in times.items():
        print(f"{name:22s} {t * 1e6:9.2f} {t / base:15.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"scalars_seconds": times}, f, indent=1)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=positive_int, default=512,
                        help="matmul size n (n x n x n)")
    parser.add_argument("--repeat", type=positive_int, default=3,
                        help="timed runs (best is kept)")
    parser.add_argument("--json", type=output_file, default=None,
                        help="also write the results as JSON here")
    parser.add_argument("--sweep", action="store_true",
                        help="time ops.add, ops.dot and ops.matmul across sizes instead")
    parser.add_argument("--max-log2n", type=int_in(0, 30), default=22,
                        help="largest elementwise / dot size of --sweep (2**N)")
    parser.add_argument("--budget", type=positive_float, default=0.25,
                        help="seconds of calls per case and size in --sweep")
    parser.add_argument("--plot", type=output_file,
                        help="with --sweep: write a throughput-vs-size PNG here")
    parser.add_argument("--scalars", action="store_true",
                        help="time ops.add on each kind of scalar against Python floats")
    args = parser.parse_args(argv)
    if args.scalars:
        return scalars(args)
    if args.sweep:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        return sweep(args)
    n = args.n
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    macs = n ** 3
    peer = best(lambda: np.matmul(a, b), args.repeat)
    rows = [
        ("per-step: fp16 in, fp16 acc nearest (FMA, sequential)",
         lambda: ops.matmul(a, b, in_fmt="fp16", acc_fmt="fp16", order="sequential")),
        ("per-step: bf16 in, bf16 acc stochastic (FMA, sequential)",
         lambda: ops.matmul(a, b, in_fmt="bf16", acc_fmt="bf16", acc_rounding="stochastic",
                            order="sequential", seed=1)),
        ("per-step: bf16 in, fp32 acc nearest (FMA, pairwise)",
         lambda: ops.matmul(a, b, model="bf16-fp32", order="pairwise")),
        ("BLAS path: bf16 in, fp32 acc (model 'bf16-fp32')",
         lambda: ops.matmul(a, b, model="bf16-fp32")),
    ]
    results = [{"case": "numpy float32 matmul (peer)", "seconds": peer, "mac_per_s": macs / peer,
                "slowdown_vs_numpy": 1.0}]
    for name, fn in rows:
        t = best(fn, args.repeat)
        results.append({"case": name, "seconds": t, "mac_per_s": macs / t,
                        "slowdown_vs_numpy": t / peer})
    print(f"# {datetime.date.today()}  {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, numba {numba.__version__} ({lpsim_threads()} "
          f"threads), numpy {np.__version__}")
    print(f"# command: python {' '.join(sys.argv)}   (n={n}, best of {args.repeat})")
    print(f"{'case':60s} {'seconds':>9s} {'MAC/s':>10s} {'x numpy':>9s}")
    for r in results:
        print(f"{r['case']:60s} {r['seconds']:9.4f} {r['mac_per_s']:10.3e} "
              f"{r['slowdown_vs_numpy']:9.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"n": n, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
