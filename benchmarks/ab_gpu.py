"""Two trees of lpsim on one GPU, in alternating processes: did a change make the GPU cases
faster or slower?  A lent machine's speed drifts between sessions (the H200 of 2026-11-27
copied at 4038 GB/s in one session and 3868 in the next), so a change is judged only against
its parent timed on the same machine in the same call.

    git archive BASE lpsim lpsim_cuda | tar x -C /tmp/old      # the older tree
    python benchmarks/ab_gpu.py --old /tmp/old --new . --rounds 2

Each round runs one process per tree (old first, then new) and each process times: the host
wall-clock of a call on a 1-element tensor (nearest and SR, with torch's ``add_`` as the
machine's own yardstick; through ``lpsim.quantize`` too, in place and SR with a generator
and counters, as simulated training calls it) and of a block call (MXFP8, NVFP4), bf16
nearest/SR and e4m3fn SR quantize of 2**26 float32 (CUDA events, with the device copy),
MXFP8/MXFP4/NVFP4 nearest of the same elements and MXFP8 of their bfloat16 copy (in float32
GB/s), and a bf16 SR AdamW step at 2**25 parameters beside torch's fused FP32 AdamW, and at
2**16 (its fixed cost).  It prints each figure's median over the rounds and new / old.
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def child(log2n: int, params: int) -> dict:
    """One tree's figures (run with that tree first on sys.path)."""
    import torch

    import lpsim
    import lpsim_cuda
    from lpsim.optim import AdamW
    from bench_quantize_gpu import wall_time
    from timing import cuda_time

    def event_ms(fn, repeats=10):
        return 1e3 * cuda_time(fn, repeats)

    out = {"device": torch.cuda.get_device_name()}
    tiny = torch.randn(1, device="cuda")
    out["host nearest us"] = 1e6 * wall_time(lambda: lpsim_cuda.quantize(tiny, "bf16", out=tiny),
                                             1000, 3)
    out["host SR us"] = 1e6 * wall_time(
        lambda: lpsim_cuda.quantize(tiny, "bf16", "stochastic", seed=1, out=tiny), 1000, 3)
    out["host torch add_ us"] = 1e6 * wall_time(lambda: tiny.add_(0), 1000, 3)
    # through lpsim.quantize, as simulated training calls it
    stats, generator = lpsim.RoundingStats(), lpsim.Generator(0)
    out["host lpsim.quantize nearest us"] = 1e6 * wall_time(
        lambda: lpsim.quantize(tiny, "bf16", out=tiny), 1000, 3)
    out["host lpsim.quantize SR counted us"] = 1e6 * wall_time(
        lambda: lpsim.quantize(tiny, "bf16", "stochastic", generator=generator, stats=stats),
        1000, 3)
    x = torch.randn(2 ** log2n, device="cuda")
    y = torch.empty_like(x)
    gbs = 8 * x.numel() / 1e6            # bytes read + written, per ms -> GB/s
    out["copy GB/s"] = gbs / event_ms(lambda: y.copy_(x))
    for fmt, rounding in (("bf16", "nearest"), ("bf16", "stochastic"), ("e4m3fn", "stochastic")):
        out[f"{fmt} {rounding} GB/s"] = gbs / event_ms(
            lambda: lpsim_cuda.quantize(x, fmt, rounding, seed=1, out=y))
    # block formats: a call's host time on one or two blocks, and 2**log2n elements (rows of
    # 4096), float32 and a bfloat16 tensor's codes
    block = torch.randn(1, 32, device="cuda")
    for fmt in ("mxfp8_e4m3", "nvfp4"):
        out[f"host {fmt} us"] = 1e6 * wall_time(
            lambda: lpsim.quantize(block, fmt, "nearest", out=block), 1000, 3)
    rows = x.view(-1, 4096)
    for fmt in ("mxfp8_e4m3", "mxfp4", "nvfp4"):
        out[f"{fmt} nearest GB/s"] = gbs / event_ms(lambda: lpsim.quantize(rows, fmt))
    half = rows.to(torch.bfloat16)
    out["mxfp8 of bf16 GB/s"] = gbs / event_ms(lambda: lpsim.quantize(half, "mxfp8_e4m3"))
    del x, y, rows, half
    gen = torch.Generator(device="cuda").manual_seed(0)

    def param(dtype):
        p = torch.nn.Parameter(torch.randn(params, generator=gen, device="cuda").to(dtype))
        p.grad = (torch.randn(params, generator=gen, device="cuda") * 1e-2).to(dtype)
        return [p]
    opt = AdamW(param(torch.bfloat16), lr=1e-3, seed=1, update_rounding="stochastic")
    out["AdamW bf16 SR ms"] = event_ms(opt.step, 5)
    small = AdamW([torch.nn.Parameter(torch.zeros(2 ** 16, device="cuda",
                                                  dtype=torch.bfloat16))],
                  lr=1e-3, seed=1, update_rounding="stochastic")
    small.param_groups[0]["params"][0].grad = torch.zeros(2 ** 16, device="cuda",
                                                         dtype=torch.bfloat16)
    out["AdamW bf16 SR ms, 2^16 params (the step's fixed cost)"] = event_ms(small.step, 20)
    ref = torch.optim.AdamW(param(torch.float32), lr=1e-3, fused=True)
    out["torch fused fp32 ms"] = event_ms(ref.step, 5)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="the older tree (holds lpsim, lpsim_cuda)")
    parser.add_argument("--new", default=".", help="the newer tree")
    parser.add_argument("--rounds", type=int, default=2,
                        help="rounds, each the old tree then the new one (medians)")
    parser.add_argument("--log2n", type=int, default=26,
                        help="2**log2n elements a quantize call rounds")
    parser.add_argument("--params", type=int, default=2 ** 25,
                        help="parameters an optimizer step updates")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from timing import require_cuda
    require_cuda("ab_gpu")
    if args.child:
        print(json.dumps(child(args.log2n, args.params)))
        return
    runs = {"old": [], "new": []}
    for r in range(args.rounds):
        for name in ("old", "new"):
            tree = os.path.abspath(getattr(args, name))
            inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree, HERE] + inherited))
            start = time.time()
            done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child",
                                   "--old", tree, "--log2n", str(args.log2n),
                                   "--params", str(args.params)],
                                  env=env, cwd=tree, capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"{name} tree failed:\n{done.stderr[-3000:]}")
            runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} {name}: {time.time() - start:.0f} s", file=sys.stderr)
    print(f"# lpsim two trees on one GPU, {datetime.date.today()}, {runs['new'][0]['device']}")
    print(f"# command: python benchmarks/ab_gpu.py --old {args.old} --new {args.new} "
          f"--rounds {args.rounds}; median of {args.rounds} round(s), old then new in each")
    print(f"{'figure':24s} {'old':>10s} {'new':>10s} {'new/old':>8s}")
    for key in [k for k in runs["old"][0] if k != "device"]:
        old = float(np.median([run[key] for run in runs["old"]]))
        new = float(np.median([run[key] for run in runs["new"]]))
        print(f"{key:24s} {old:10.3f} {new:10.3f} {new / old:8.3f}")


if __name__ == "__main__":
    main()
