"""GPU rounding throughput: lpsim_cuda against the device's own copy, torch casts and qtorch.

Rounds 2**26 float32 values (torch CUDA tensors) to bf16, e5m2, e4m3fn and fp(6,9,0), nearest and
stochastic, and prints GB/s (bytes read + written) with the ratio to a device-to-device copy
measured in the same run, next to qtorch's CUDA ``float_quantize`` (when it builds), torch's
``.to(torch.bfloat16)`` next to the fp32 -> bf16 stochastic-rounding store, a bfloat16
tensor's e4m3fn cast read as bf16 codes next to the upcast it replaces and torch's own cast,
and the wall-clock cost of one call on a 1-element tensor next to ``t.add_(0)``.  Then it checks the targets:
nearest >= 85% and stochastic >= 75% of copy bandwidth (issue 31), both faster than qtorch
(qtorch has no e4m3fn: its row there is torch's own ``.to(float8_e4m3fn).float()``).

    python benchmarks/bench_quantize_gpu.py [--log2n 26] [--repeats 20] [--no-qtorch]
                                            [--json benchmarks/results/quantize-gpu.json]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import platform
import shlex
import sys
import time

import numpy as np

from timing import cuda_time  # the script's folder is on sys.path

#: format -> qtorch's (exp, man), None where qtorch has no such format (e4m3fn saturates
#: and has no infinities; qtorch's e4m3 is IEEE-like)
FORMATS = {"bf16": (8, 7), "e5m2": (5, 2), "e4m3fn": None, "fp(6,9,0)": (6, 9)}
MODES = ("nearest", "stochastic")
#: lpsim_cuda's targets as a fraction of device copy bandwidth, per mode
TARGETS = {"nearest": 0.85, "stochastic": 0.75}


def wall_time(fn, calls: int, rounds: int = 5) -> float:
    """Best wall-clock seconds per call over ``rounds`` loops of ``calls`` calls, each loop
    ended by a synchronize: on a tiny tensor this is the host's launch overhead."""
    import torch
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def versions() -> dict:
    found = {"python": platform.python_version()}
    for package in ("torch", "numba", "numba-cuda", "qtorch"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found


def load_qtorch(wanted: bool):
    """qtorch's float_quantize, or None (skipped, or its C++/CUDA extension did not build)."""
    if not wanted:
        return None
    try:
        from qtorch.quant import float_quantize
    except Exception as error:      # qtorch JIT-builds its extension on import (nvcc, ninja)
        print(f"qtorch unavailable: {type(error).__name__}: {error}", file=sys.stderr)
        return None
    return float_quantize


def verdicts(rows, qtorch_ran: bool) -> list[str]:
    """One line per lpsim_cuda float32 row: its targets met or missed."""
    peers = {(r["format"], r["mode"]): r["GBps"] for r in rows
             if r["kernel"] == "qtorch float_quantize"}
    lines = []
    for r in rows:
        if r["kernel"] != "lpsim_cuda" or r["mode"] not in TARGETS:
            continue
        goal = TARGETS[r["mode"]]
        parts = [f"{r['ratio']:.2f} of copy (target >= {goal:.2f}): "
                 f"{'met' if r['ratio'] >= goal else 'MISSED'}"]
        peer = peers.get((r["format"], r["mode"]))
        if peer is not None:
            parts.append(f"{r['GBps'] / peer:.2f}x qtorch: "
                         f"{'faster' if r['GBps'] > peer else 'NOT FASTER'}")
        elif not qtorch_ran:
            parts.append("qtorch not run: no comparison")
        lines.append(f"{r['format']:10s} {r['mode']:11s} " + "; ".join(parts))
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log2n", type=int, default=26, help="elements: 2**LOG2N float32")
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per row (median)")
    parser.add_argument("--no-qtorch", action="store_true",
                        help="skip qtorch (its first import compiles a CUDA extension)")
    parser.add_argument("--json", help="also write the results as JSON to this path")
    args = parser.parse_args(argv)

    import torch
    if not torch.cuda.is_available():
        print("bench_quantize_gpu: no CUDA device is visible; nothing measured.")
        return 1
    import lpsim
    import lpsim_cuda

    command = shlex.join(["python", *sys.argv])
    n = 1 << args.log2n
    x = torch.randn(n, device="cuda", dtype=torch.float32)
    y = torch.empty_like(x)
    lpsim_cuda.warmup()
    float_quantize = load_qtorch(not args.no_qtorch)

    copy_gbs = 8 * n / cuda_time(lambda: y.copy_(x), args.repeats) / 1e9
    rows = []

    def row(kernel, fmt, mode, bytes_per_element, fn):
        gbs = bytes_per_element * n / cuda_time(fn, args.repeats) / 1e9
        rows.append({"kernel": kernel, "format": fmt, "mode": mode, "GBps": gbs,
                     "ratio": gbs / copy_gbs})

    row("device copy", "-", "-", 8, lambda: y.copy_(x))
    row("torch .to(bfloat16).float()", "bf16", "nearest", 4 + 2 + 2 + 4,
        lambda: x.to(torch.bfloat16).float())
    for name, em in FORMATS.items():
        for mode in MODES:
            row("lpsim_cuda", name, mode, 8,
                lambda: lpsim_cuda.quantize(x, name, mode, seed=1, out=y))
            if float_quantize is not None and em is not None:
                row("qtorch float_quantize", name, mode, 8,
                    lambda: float_quantize(x, *em, rounding=mode))
    row("torch .to(float8_e4m3fn).float()", "e4m3fn", "nearest", 4 + 1 + 1 + 4,
        lambda: x.to(torch.float8_e4m3fn).float())
    packed = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    row("lpsim_cuda SR store fp32->bf16", "bf16", "stochastic", 4 + 2,
        lambda: lpsim_cuda.quantize(x, "bf16", "stochastic", seed=1, out=packed,
                                    storage="bfloat16"))
    row("torch x.to(bfloat16)", "bf16", "nearest", 4 + 2, lambda: x.to(torch.bfloat16))
    # a bfloat16 tensor (an activation) cast to e4m3fn: its codes read directly, against
    # the upcast lpsim.quantize made before (same useful bytes: 2 in, 4 or 2 out)
    xb = x.to(torch.bfloat16)
    yb = torch.empty_like(xb)
    row("lpsim_cuda bf16 in", "e4m3fn", "nearest", 2 + 4,
        lambda: lpsim_cuda.quantize(xb, "e4m3fn", out=y))
    row("lpsim_cuda on x.float() (upcast)", "e4m3fn", "nearest", 2 + 4,
        lambda: lpsim_cuda.quantize(xb.float(), "e4m3fn", out=y))
    row("lpsim_cuda bf16 in, bf16 out", "e4m3fn", "nearest", 2 + 2,
        lambda: lpsim_cuda.quantize(xb, "e4m3fn", out=yb, storage="bfloat16"))
    row("torch .to(float8_e4m3fn).to(bfloat16)", "e4m3fn", "nearest", 2 + 2,
        lambda: xb.to(torch.float8_e4m3fn).to(torch.bfloat16))

    tiny = torch.randn(1, device="cuda")
    stats, generator = lpsim.RoundingStats(), lpsim.Generator(0)
    overhead = {
        "lpsim_cuda nearest, in place": wall_time(
            lambda: lpsim_cuda.quantize(tiny, "bf16", out=tiny), 1000),
        "lpsim_cuda stochastic, in place": wall_time(
            lambda: lpsim_cuda.quantize(tiny, "bf16", "stochastic", seed=1, out=tiny), 1000),
        # through lpsim.quantize (its short way to a request's route), as simulated training
        # calls it: in place, and stochastic with a generator and counters (telemetry)
        "lpsim.quantize nearest, in place": wall_time(
            lambda: lpsim.quantize(tiny, "bf16", out=tiny), 1000),
        "lpsim.quantize stochastic, generator, counted": wall_time(
            lambda: lpsim.quantize(tiny, "bf16", "stochastic", generator=generator,
                                   stats=stats), 1000),
        "torch t.add_(0)": wall_time(lambda: tiny.add_(0), 1000),
    }
    lines = verdicts(rows, float_quantize is not None)

    device = torch.cuda.get_device_name()
    today = str(datetime.date.today())
    print(f"# lpsim GPU rounding, {today}, {device}, "
          + ", ".join(f"{k} {v}" for k, v in versions().items()))
    print(f"# command: {command}")
    print(f"# n = 2**{args.log2n} float32; GB/s counts bytes read + written; median of "
          f"{args.repeats} CUDA-event timings")
    print(f"{'kernel':32s} {'format':10s} {'mode':11s} {'GB/s':>8s} {'vs copy':>8s}")
    for r in rows:
        print(f"{r['kernel']:32s} {r['format']:10s} {r['mode']:11s} {r['GBps']:8.1f} "
              f"{r['ratio']:8.2f}")
    print("# wall-clock per call on a 1-element tensor (1000 calls, then synchronize; best of 5)")
    for name, seconds in overhead.items():
        print(f"{name:44s} {seconds * 1e6:8.1f} us")
    from lpsim_cuda import raw_launch          # did routes launch through the driver?
    raw = "on" if raw_launch.STATE["on"] else f"off ({raw_launch.STATE['why']})"
    print(f"# routes' raw launches (lpsim_cuda.raw_launch): {raw}")
    print("# targets: nearest >= 0.85 and stochastic >= 0.75 of copy, faster than qtorch")
    for line in lines:
        print(line)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"device": device, "date": today, "command": command, "n": n,
                       "versions": versions(), "copy_GBps": copy_gbs, "rows": rows,
                       "launch_overhead_us": {k: v * 1e6 for k, v in overhead.items()},
                       "raw_launches": raw, "verdicts": lines}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
