"""Timing helpers shared by the benchmark scripts: per-call time at any size, and plots."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time

import numpy as np

# the argparse types the example scripts use: a bad option is argparse's usage error naming
# it, before any work, not a traceback at the end of a run
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from _arguments import int_in, output_file, positive_float, positive_int  # noqa: E402,F401


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    try:
        with open("/proc/cpuinfo") as handle:
            return next(line.split(":", 1)[1].strip() for line in handle
                        if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def revision() -> str:
    """lpsim's short commit, with " + local changes" when lpsim or lpsim_cuda differ from it
    ("unknown" without git): what a results header names as the code it timed."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        rev = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--", "../lpsim",
                                "../lpsim_cuda"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "unknown"
    return (rev or "unknown") + (" + local changes" if dirty else "")


def per_call_rounds(calls: dict, *, budget: float = 0.2, rounds: int = 5) -> dict:
    """Seconds per call of each of ``calls`` (name -> fn), timed in alternation: each round
    times one batch of every case in turn, a batch being as many calls as fit in
    ``budget / rounds`` seconds (one call at least); the median over the rounds.

    Alternating keeps a drift of this machine's speed (up to 2x within minutes) from
    favouring whichever case ran in a fast phase.  Small arrays need thousands of calls per
    batch for a stable microsecond figure; large ones one call.  Each case first warms up
    for a fifth of the budget (one call at least): a process's first hundreds of
    microsecond calls run at half speed here (caches, branch history, the clock).
    """
    number = {}
    for name, fn in calls.items():
        fn()
        start = time.perf_counter()
        fn()
        once = max(time.perf_counter() - start, 1e-7)
        for _ in range(int(budget / 5 / once)):
            fn()
        number[name] = max(1, int(budget / rounds / once))
    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            start = time.perf_counter()
            for _ in range(number[name]):
                fn()
            times[name].append((time.perf_counter() - start) / number[name])
    return {name: float(np.median(t)) for name, t in times.items()}


def throughput_plot(path, sizes, series: dict, *, title: str, ylabel: str, note: str = ""):
    """A log-log plot of one line per series (name -> values per size; None skips)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for name, values in series.items():
        pairs = [(s, v) for s, v in zip(sizes, values) if v is not None]
        if pairs:
            style = "-" if name.startswith("lpsim") else "--"
            ax.plot(*zip(*pairs), style, marker="o", markersize=3, label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("elements per call")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    if note:
        fig.text(0.01, 0.01, note, fontsize=7, alpha=0.7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def cuda_time(fn, repeats: int = 20) -> float:
    """Median device seconds per call, timed with CUDA events after a warm-up call."""
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


def require_cuda(what: str) -> None:
    """Stop with a clear message where torch sees no CUDA device (a GPU-only mode), not a
    traceback from inside torch."""
    import torch
    if not torch.cuda.is_available():
        raise SystemExit(f"{what}: no CUDA device is visible; this runs on a GPU "
                         "(benchmarks/gpu_session.sh runs it on a lent one)")
