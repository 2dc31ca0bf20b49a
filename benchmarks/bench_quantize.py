"""CPU rounding throughput: lpsim.quantize against qtorch, ml_dtypes, torch casts and a copy.

Rounds 2**24 float32 values (numpy, into a preallocated output) to bf16, e5m2, e4m3fn, e2m1fn
and fp(6,9,0), nearest and stochastic, and prints million elements per second next to,
measured in the same run: qtorch's CPU ``float_quantize``, the ml_dtypes round trip
``x.astype(ml_dtypes.<type>).astype(np.float32)``, torch's ``t.to(<dtype>).float()`` and the
memory ceiling: the faster of ``np.copyto(out, x)`` (one thread) and a numba ``prange`` copy on
every thread lpsim uses.  Each time is the median of several runs after a warm-up.

    python benchmarks/bench_quantize.py [--log2n 24] [--repeats 7] [--json out.json]

With ``--sweep``, it times float32 -> bf16 at sizes 2**4, 2**6, .., 2**26 instead: lpsim nearest
and stochastic, with and without a RoundingStats, against the ml_dtypes round trip, torch's
``.to(bfloat16).float()`` and qtorch, per call (microseconds) and per element, and checks
the targets at every size; ``--plot`` draws throughput against size.

    python benchmarks/bench_quantize.py --sweep [--plot out.png] [--json out.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # benchmarks/timing.py

#: format name -> (exponent bits, mantissa bits, ml_dtypes type, torch dtype) of the peers;
#: qtorch's float_quantize(e, m) has IEEE specials, so it stands in for the formats that have
#: them, not for the saturating FP8/FP4 ones (``fn``: no inf, overflow clamps)
FORMATS = {"bf16": (8, 7, "bfloat16", "bfloat16"), "e5m2": (5, 2, "float8_e5m2", "float8_e5m2"),
           "e4m3fn": (4, 3, "float8_e4m3fn", "float8_e4m3fn"),
           "e2m1fn": (2, 1, "float4_e2m1fn", None), "fp(6,9,0)": (6, 9, None, None)}
MODES = ("nearest", "stochastic")
#: the issue's targets: (format, mode, peer, least ratio lpsim / peer)
TARGETS = [("bf16", "nearest", "copy", 0.4), ("bf16", "nearest", "ml_dtypes", 1.5),
           ("bf16", "nearest", "qtorch", 15.0), ("bf16", "stochastic", "qtorch", 30.0)]


# lpsim's threads, read without starting numba's threading layer (which would set the
# OpenMP thread count that torch shares)
from lpsim.cpu import threads as lpsim_threads  # noqa: E402
from timing import int_in, output_file, positive_float, positive_int  # noqa: E402


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def median_seconds(fn, repeats: int, setup=None) -> float:
    """Median wall-clock seconds per call, after one warm-up call; ``setup`` runs untimed
    before each call."""
    setup and setup()
    fn()
    times = []
    for _ in range(repeats):
        setup and setup()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def parallel_copy():
    """A copy loop over all numba threads: the ceiling of a read-and-write pass on every core."""
    from numba import njit, prange

    @njit(parallel=True)
    def copy(source, target):
        for i in prange(source.size):
            target[i] = source[i]
    return copy


def machine() -> dict:
    """CPU model, cores, threads, load and library versions, for the header and the JSON."""
    import ml_dtypes
    import numba
    import torch
    from timing import cpu_model, revision
    model = cpu_model()
    try:
        qtorch_version = __import__("importlib.metadata").metadata.version("qtorch")
    except Exception:
        qtorch_version = "absent"
    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "cpu": model, "cores": os.cpu_count(), "numba_threads": lpsim_threads(),
        "torch_threads": torch.get_num_threads(), "load_average": os.getloadavg(),
        "python": platform.python_version(), "numpy": np.__version__,
        "numba": numba.__version__, "torch": torch.__version__,
        "ml_dtypes": ml_dtypes.__version__, "qtorch": qtorch_version, "lpsim": revision(),
    }


#: rounds of --sweep: each times a batch of every case in turn (timing.per_call_rounds)
ROUNDS = 9


def sweep(args, info) -> int:
    """float32 -> bf16 at every size: per-call time against the peers, and the targets."""
    import ml_dtypes
    import torch
    from tqdm import tqdm

    import lpsim
    from timing import per_call_rounds, throughput_plot

    try:
        from qtorch.quant import float_quantize
    except Exception as error:      # qtorch's extension may not build here
        float_quantize = None
        log(f"qtorch unavailable: {error}")
    sizes = [1 << k for k in range(args.min_log2n, args.max_log2n + 1, 2)]
    stats = lpsim.RoundingStats()
    columns = ["lpsim nearest", "lpsim nearest +stats", "lpsim stochastic",
               "lpsim stochastic +stats", "ml_dtypes round trip", "torch .to(bf16).float()",
               "qtorch nearest"]
    table = {c: [] for c in columns}
    rng = np.random.default_rng(0)
    warm = np.ones(16, np.float32)          # compile or load every kernel before timing
    for mode in ("nearest", "stochastic"):
        for _ in range(1000):
            lpsim.quantize(warm, "bf16", mode, seed=1, out=warm.copy(), stats=stats)
    for n in tqdm(sizes, desc="sizes", file=sys.stderr):
        x = (rng.standard_normal(n) * np.exp2(rng.integers(-8, 8, n))).astype(np.float32)
        out = np.empty_like(x)
        t = torch.from_numpy(x)
        calls = {
            "lpsim nearest": lambda: lpsim.quantize(x, "bf16", out=out),
            "lpsim nearest +stats": lambda: lpsim.quantize(x, "bf16", out=out, stats=stats),
            "lpsim stochastic": lambda: lpsim.quantize(x, "bf16", "stochastic", seed=1,
                                                       out=out),
            "lpsim stochastic +stats": lambda: lpsim.quantize(x, "bf16", "stochastic", seed=1,
                                                              out=out, stats=stats),
            "ml_dtypes round trip": lambda: x.astype(ml_dtypes.bfloat16).astype(np.float32),
            "torch .to(bf16).float()": lambda: t.to(torch.bfloat16).float(),
            "qtorch nearest": None if float_quantize is None else
            (lambda: float_quantize(t, 8, 7, rounding="nearest")),
        }
        timed = per_call_rounds({name: fn for name, fn in calls.items() if fn is not None},
                                budget=args.budget, rounds=ROUNDS)
        for name in calls:
            table[name].append(timed.get(name))

    print(f"# lpsim CPU rounding across sizes, {info['date']}, {info['cpu']}, {info['cores']} "
          f"cores (numba threads {info['numba_threads']}, torch threads "
          f"{info['torch_threads']})")
    print(f"# python {info['python']}, numpy {info['numpy']}, numba {info['numba']}, "
          f"torch {info['torch']}, ml_dtypes {info['ml_dtypes']}, qtorch {info['qtorch']}, "
          f"lpsim {info['lpsim']}")
    print("# command: python benchmarks/bench_quantize.py " + " ".join(sys.argv[1:]))
    print(f"# float32 -> bf16, microseconds per call (median of {ROUNDS} rounds; each round times "
          f"a batch of every case in turn, ~{args.budget / ROUNDS * 1e3:.0f} ms of calls each); "
          "load average at the end: "
          + ", ".join(f"{v:.2f}" for v in os.getloadavg()))
    short = ["nearest", "+stats", "SR", "SR+stats", "ml_dtypes", "torch", "qtorch"]
    print(f"{'n':>6s} " + " ".join(f"{c:>10s}" for c in short) + f" {'best peer':>10s} "
          f"{'SR/near':>8s}")
    verdicts = []
    for i, n in enumerate(sizes):
        row = [table[c][i] for c in columns]
        peers = [v for v in (table["ml_dtypes round trip"][i],
                             table["torch .to(bf16).float()"][i]) if v is not None]
        fastest = min(peers)
        ratio_sr = table["lpsim stochastic"][i] / table["lpsim nearest"][i]
        print(f"2^{n.bit_length() - 1:<4d} " + " ".join(
            f"{'n/a' if v is None else f'{v * 1e6:.2f}':>10s}" for v in row)
            + f" {fastest / table['lpsim nearest'][i]:9.2f}x {ratio_sr:8.2f}")
        verdicts.append({"n": n, "nearest_vs_fastest_peer": fastest / table["lpsim nearest"][i],
                         "stochastic_over_nearest": ratio_sr})
    print("columns: lpsim.quantize(x, 'bf16', out=out) nearest / + RoundingStats / "
          "stochastic (seed=1) / + stats; peers: ml_dtypes bfloat16 round trip, torch "
          "t.to(torch.bfloat16).float(), qtorch float_quantize(t, 8, 7, 'nearest').")
    print("best peer: (fastest of ml_dtypes and torch) / lpsim nearest, above 1 = lpsim "
          "faster; SR/near: lpsim stochastic time / nearest time.")
    small = table["lpsim nearest"][0] * 1e6
    print(f"target: per-call time for {sizes[0]} elements <= 3 us: got {small:.2f} us -> "
          f"{'met' if small <= 3 else 'NOT met'}")
    slow = [v["n"] for v in verdicts if v["nearest_vs_fastest_peer"] < 1]
    print(f"target: nearest at least as fast as the fastest peer at every size: "
          f"{'met' if not slow else 'NOT met at ' + ', '.join(map(str, slow))}")
    worst = max(v["stochastic_over_nearest"] for v in verdicts)
    print(f"target: stochastic within 1.5x of nearest at every size: worst {worst:.2f}x -> "
          f"{'met' if worst <= 1.5 else 'NOT met'}")
    if args.plot:
        series = {c: [None if v is None else n / v / 1e6 for n, v in zip(sizes, table[c])]
                  for c in columns}
        throughput_plot(args.plot, sizes, series, ylabel="million elements per second",
                        title="float32 -> bf16 rounding throughput by array size",
                        note=f"{info['cpu']}, {info['cores']} cores, {info['date']}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"machine": info, "sizes": sizes, "seconds_per_call": table,
                       "verdicts": verdicts}, handle, indent=1)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log2n", type=int_in(0, 30), default=24,
                        help="round 2**LOG2N values (0 .. 30)")
    parser.add_argument("--repeats", type=positive_int, default=7, help="timed runs per case")
    parser.add_argument("--json", type=output_file,
                        help="also write the results as JSON to this path")
    parser.add_argument("--sweep", action="store_true",
                        help="time every size 2**MIN_LOG2N .. 2**MAX_LOG2N (step 4x) instead")
    parser.add_argument("--min-log2n", type=int_in(0, 30), default=4,
                        help="smallest size of --sweep")
    parser.add_argument("--max-log2n", type=int_in(0, 30), default=26,
                        help="largest size of --sweep")
    parser.add_argument("--budget", type=positive_float, default=0.25,
                        help="seconds of calls per case and size in --sweep")
    parser.add_argument("--plot", type=output_file,
                        help="with --sweep: write a throughput-vs-size PNG here")
    args = parser.parse_args(argv)
    if args.min_log2n > args.max_log2n:
        parser.error(f"--min-log2n {args.min_log2n} is above --max-log2n {args.max_log2n}")
    if args.sweep:
        return sweep(args, machine())

    import ml_dtypes
    import torch

    import lpsim

    info = machine()
    n = 1 << args.log2n
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-8, 8, n))).astype(np.float32)
    out = np.empty_like(x)
    buffer = np.empty_like(x)          # in place: refilled with x (untimed) before each call
    t = torch.from_numpy(x)
    log("importing qtorch (it compiles its C++ extension on the first import, ~30 s) ...")
    try:
        from qtorch.quant import float_quantize
    except Exception as error:      # qtorch's extension may not build here
        float_quantize = None
        log(f"qtorch unavailable: {error}")

    def refill():
        np.copyto(buffer, x)

    # (label, format, mode, peer kind, callable, setup); peer kind None is lpsim itself
    threaded_copy = parallel_copy()
    cases = [("np.copyto(out, x)", "-", "-", "copy", lambda: np.copyto(out, x), None),
             ("numba prange copy, all threads", "-", "-", "copy",
              lambda: threaded_copy(x, out), None)]
    for name, (e, m, ml_name, torch_name) in FORMATS.items():
        for mode in MODES:
            cases.append(("lpsim.quantize(x, out=...)", name, mode, None,
                          lambda name=name, mode=mode:
                          lpsim.quantize(x, name, mode, seed=1, out=out), None))
            cases.append(("lpsim.quantize(x, out=x) in place", name, mode, "in place",
                          lambda name=name, mode=mode:
                          lpsim.quantize(buffer, name, mode, seed=1, out=buffer), refill))
            if float_quantize is not None and not name.endswith("fn"):
                cases.append((f"qtorch float_quantize({e}, {m})", name, mode, "qtorch",
                              lambda e=e, m=m, mode=mode:
                              float_quantize(t, e, m, rounding=mode), None))
            if mode == "nearest" and ml_name:
                ml_type = getattr(ml_dtypes, ml_name)
                cases.append((f"ml_dtypes {ml_name} round trip", name, mode, "ml_dtypes",
                              lambda ml_type=ml_type: x.astype(ml_type).astype(np.float32),
                              None))
            if mode == "nearest" and torch_name and hasattr(torch, torch_name):
                torch_type = getattr(torch, torch_name)
                cases.append((f"torch .to({torch_name}).float()", name, mode, "torch",
                              lambda torch_type=torch_type: t.to(torch_type).float(), None))

    rows = []
    for number, (label, fmt, mode, kind, fn, setup) in enumerate(cases, 1):
        log(f"[{number}/{len(cases)}] {label} {fmt} {mode} ...")
        repeats = args.repeats if kind != "qtorch" else max(3, args.repeats // 2)
        seconds = median_seconds(fn, repeats, setup)
        rows.append({"case": label, "format": fmt, "mode": mode, "peer": kind or "lpsim",
                     "seconds": seconds, "Melem_per_s": n / seconds / 1e6})
    copy = max(r["Melem_per_s"] for r in rows if r["peer"] == "copy")
    ours = {(r["format"], r["mode"]): r["Melem_per_s"] for r in rows if r["peer"] == "lpsim"}
    for row in rows:
        row["vs_copy"] = row["Melem_per_s"] / copy
        if row["peer"] not in ("lpsim", "copy", "in place"):
            row["lpsim_over_peer"] = ours[row["format"], row["mode"]] / row["Melem_per_s"]

    def peer_speed(fmt, mode, kind):
        if kind == "copy":
            return copy
        return next((r["Melem_per_s"] for r in rows
                     if (r["format"], r["mode"], r["peer"]) == (fmt, mode, kind)), None)

    verdicts = []
    for fmt, mode, kind, least in TARGETS:
        speed = peer_speed(fmt, mode, kind)
        ratio = None if speed is None else ours[fmt, mode] / speed
        verdicts.append({"format": fmt, "mode": mode, "peer": kind, "target": least,
                         "ratio": ratio, "met": ratio is not None and ratio >= least})

    load = ", ".join(f"{v:.2f}" for v in info["load_average"])
    print(f"# lpsim CPU rounding, {info['date']}, {info['cpu']}, {info['cores']} cores "
          f"(numba threads {info['numba_threads']}, torch threads {info['torch_threads']})")
    print(f"# python {info['python']}, numpy {info['numpy']}, numba {info['numba']}, "
          f"torch {info['torch']}, ml_dtypes {info['ml_dtypes']}, qtorch {info['qtorch']}, "
          f"lpsim {info['lpsim']}")
    print(f"# command: python benchmarks/bench_quantize.py --log2n {args.log2n} "
          f"--repeats {args.repeats}")
    print(f"# n = 2**{args.log2n} float32, median of {args.repeats} runs after a warm-up "
          f"(qtorch: {max(3, args.repeats // 2)}); load average at the end: {load}")
    print(f"{'case':36s} {'format':10s} {'mode':11s} {'Melem/s':>9s} {'vs copy':>8s} "
          f"{'lpsim/peer':>10s}")
    for row in rows:
        ratio = row.get("lpsim_over_peer")
        print(f"{row['case']:36s} {row['format']:10s} {row['mode']:11s} "
              f"{row['Melem_per_s']:9.0f} {row['vs_copy']:8.2f} "
              f"{'' if ratio is None else f'{ratio:9.2f}x':>10s}")
    print("ml_dtypes and torch casts have no stochastic rounding (n/a); fp(6,9,0) has no "
          "ml_dtypes or torch type and e2m1fn no torch cast (n/a); qtorch has no saturating "
          "formats (e4m3fn, e2m1fn: n/a).")
    print("qtorch's 'nearest' rounds ties away from zero (lpsim's 'nearest_away'); its "
          "stochastic mode draws from torch's generator, lpsim's from counter-based Philox.")
    for v in verdicts:
        got = "n/a" if v["ratio"] is None else f"{v['ratio']:.2f}x"
        print(f"target: {v['format']} {v['mode']} >= {v['target']}x {v['peer']}: got {got} "
              f"-> {'met' if v['met'] else 'NOT met'}")
    for fmt, mode, kind, least in TARGETS:     # the same targets for rounding in place
        speed, mine = peer_speed(fmt, mode, kind), peer_speed(fmt, mode, "in place")
        if speed and mine:
            print(f"in place: {fmt} {mode} {mine:.0f} Melem/s = {mine / speed:.2f}x {kind} "
                  f"(target {least}x)")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"machine": info, "n": n, "repeats": args.repeats, "rows": rows,
                       "targets": verdicts}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
