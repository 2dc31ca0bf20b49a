"""GPU rounding throughput: lpsim_cuda against the device's own copy, torch casts and qtorch.

Rounds 2**26 float32 values (torch CUDA tensors) to bf16, e5m2 and fp(6,9,0), nearest and
stochastic, and prints GB/s (bytes read + written) with the ratio to a device-to-device copy
measured in the same run, next to torch's ``.to(torch.bfloat16)`` cast and qtorch's CUDA
``float_quantize`` when qtorch builds.  Also reports launch overhead on a 1-element tensor.

    python benchmarks/bench_quantize_gpu.py [--log2n 26] [--json out.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys

import numpy as np

FORMATS = {"bf16": (8, 7), "e5m2": (5, 2), "fp(6,9,0)": (6, 9)}
MODES = ("nearest", "stochastic")


def cuda_time(fn, repeats: int) -> float:
    """Median seconds per call, timed with CUDA events after a warm-up call."""
    import torch
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / 1e3)
    return float(np.median(times))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log2n", type=int, default=26)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", help="also write the rows as JSON to this path")
    args = parser.parse_args(argv)

    import torch
    if not torch.cuda.is_available():
        print("bench_quantize_gpu: no CUDA device is visible; nothing measured.")
        return 1
    import lpsim_cuda

    n = 1 << args.log2n
    x = torch.randn(n, device="cuda", dtype=torch.float32)
    y = torch.empty_like(x)
    moved = 2 * 4 * n                           # bytes read + written by a float32 pass
    lpsim_cuda.warmup()
    copy_s = cuda_time(lambda: y.copy_(x), args.repeats)
    copy_gbs = moved / copy_s / 1e9
    rows = [("device copy", "-", "-", copy_gbs)]
    rows.append(("torch .to(bfloat16).float()", "bf16", "nearest",
                 (4 + 2 + 2 + 4) * n / cuda_time(lambda: x.to(torch.bfloat16).float(),
                                                  args.repeats) / 1e9))
    try:
        from qtorch.quant import float_quantize
    except Exception as error:  # qtorch's CUDA extension may not build on this machine
        float_quantize = None
        print(f"qtorch unavailable: {error}", file=sys.stderr)
    for name, (e, m) in FORMATS.items():
        for mode in MODES:
            seconds = cuda_time(lambda: lpsim_cuda.quantize(x, name, mode, seed=1, out=y),
                                args.repeats)
            rows.append(("lpsim_cuda", name, mode, moved / seconds / 1e9))
            if float_quantize is not None:
                seconds = cuda_time(lambda: float_quantize(x, e, m, rounding=mode),
                                    args.repeats)
                rows.append(("qtorch float_quantize", name, mode, moved / seconds / 1e9))
    packed = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    seconds = cuda_time(lambda: lpsim_cuda.quantize(x, "bf16", "stochastic", seed=1,
                                                    out=packed, storage="bfloat16"),
                        args.repeats)
    rows.append(("lpsim_cuda SR store fp32->bf16", "bf16", "stochastic", 6 * n / seconds / 1e9))
    tiny = torch.randn(1, device="cuda")
    launch_us = cuda_time(lambda: lpsim_cuda.quantize(tiny, "bf16", out=tiny), 200) * 1e6

    print(f"# lpsim GPU rounding, {datetime.date.today()}, {torch.cuda.get_device_name()}, "
          f"torch {torch.__version__}, python {platform.python_version()}")
    print(f"# command: python benchmarks/bench_quantize_gpu.py --log2n {args.log2n}")
    print(f"# n = 2**{args.log2n} float32; GB/s counts bytes read + written")
    print(f"{'kernel':32s} {'format':10s} {'mode':11s} {'GB/s':>8s} {'vs copy':>8s}")
    for kernel, fmt, mode, gbs in rows:
        print(f"{kernel:32s} {fmt:10s} {mode:11s} {gbs:8.1f} {gbs / copy_gbs:8.2f}")
    print(f"launch overhead (1 element, in place): {launch_us:.1f} us")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"device": torch.cuda.get_device_name(), "date": str(datetime.date.today()),
                       "launch_us": launch_us,
                       "rows": [dict(zip(("kernel", "format", "mode", "GBps"), r)) for r in rows]},
                      handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
