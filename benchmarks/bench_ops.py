"""Simulated GEMM throughput: per-step rounded accumulation and the BLAS path vs numpy float32.

    python benchmarks/bench_ops.py [--n 512] [--repeat 3] [--json out.json]

Prints simulated multiply-accumulates per second (n**3 / seconds, best of --repeat) for a
n x n x n matmul, next to numpy's float32 matmul in the same run, and the ratio.
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


def best(fn, repeat):
    fn()   # compile / warm up
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
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
          f"{os.cpu_count()} cores, numba {numba.__version__} ({numba.get_num_threads()} "
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
