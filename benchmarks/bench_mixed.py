"""lpsim's CPU work between torch operations, as in a simulated training step.

After each parallel operation torch's OpenMP threads keep spinning for milliseconds, each
holding a core; work that runs on other threads right then shares those cores.  This times,
on float32 tensors of 2048 x 1024 (the size of a layer's activations in
benchmarks/bench_recipes.py), each case alone and right after an in-place torch add
(``t.add_(1)``, whose own time is subtracted), in alternating rounds (medians):

* a 2048 x 1024 x 256 FP32 product: numpy's BLAS (what ``lpsim.ops.matmul`` ran for
  tensors before) against ``torch.matmul`` (what it runs now);
* NVFP4 stochastic rounding (``lpsim.quantize``), its threads pulling ranges of the work
  (:mod:`lpsim.pool`, ``PIECES`` ranges a thread) against one fixed range a thread
  (``PIECES = 1``, as before);
* the wgrad operands' transposing copy, torch's ``t.t().contiguous()``, against a plain
  copy (``t.clone()``).

    python benchmarks/bench_mixed.py [--rounds 9] [--json out.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

import lpsim  # noqa: E402
from lpsim import pool  # noqa: E402
from lpsim.cpu import threads as lpsim_threads  # noqa: E402
from timing import cpu_model, output_file, per_call_rounds, positive_int, revision  # noqa: E402


def with_pieces(n, fn):
    """fn with lpsim.pool.PIECES = n for the call."""
    def call():
        old, pool.PIECES = pool.PIECES, n
        try:
            fn()
        finally:
            pool.PIECES = old
    return call


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=positive_int, default=9,
                        help="timed rounds, each case in turn (medians)")
    parser.add_argument("--json", type=output_file, default=None,
                        help="also write the table as JSON to this path")
    args = parser.parse_args(argv)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2048, 1024, generator=g)
    w = torch.randn(256, 1024, generator=g)
    y = torch.randn(2048, 1024, generator=g)           # what the torch add writes
    xa, wa = x.numpy(), w.numpy()
    gen = lpsim.Generator(0)
    nvfp4 = lambda: lpsim.quantize(x, "nvfp4", "stochastic", axis=-1, generator=gen)
    cases = {
        "numpy matmul (numpy's BLAS)": lambda: np.matmul(xa, wa.T),
        "torch.matmul": lambda: torch.matmul(x, w.t()),
        "nvfp4 SR, ranges pulled (lpsim.pool)": nvfp4,
        "nvfp4 SR, one range a thread": with_pieces(1, nvfp4),
        "torch t().contiguous()": lambda: x.t().contiguous(),
        "torch clone()": lambda: x.clone(),
    }
    calls = {"torch add alone": lambda: y.add_(1)}
    for name, fn in cases.items():
        calls[name] = fn
        calls[name + " | after add"] = (lambda fn: lambda: (y.add_(1), fn()))(fn)
    seconds = per_call_rounds(calls, budget=1.0, rounds=args.rounds)
    add = seconds["torch add alone"]
    commit = revision()
    print(f"# bench_mixed: {cpu_model()} ({os.cpu_count()} CPUs, torch {torch.__version__} "
          f"{torch.get_num_threads()} threads, lpsim {lpsim_threads()} threads), "
          f"{datetime.date.today()}, lpsim {commit}")
    print(f"# command: python benchmarks/bench_mixed.py {' '.join(argv or sys.argv[1:])}")
    print(f"# float32 2048 x 1024; median of {args.rounds} alternating rounds; 'after add': "
          f"right after y.add_(1) on a 2048 x 1024 tensor, the add's own "
          f"{1e3 * add:.3f} ms subtracted")
    print(f"{'case':<40} {'alone ms':>9} {'after add ms':>13} {'after/alone':>12}")
    rows = {}
    for name in cases:
        alone, after = seconds[name], seconds[name + " | after add"] - add
        rows[name] = {"alone_ms": 1e3 * alone, "after_add_ms": 1e3 * after}
        print(f"{name:<40} {1e3 * alone:>9.2f} {1e3 * after:>13.2f} {after / alone:>12.2f}")
    pairs = [("torch.matmul", "numpy matmul (numpy's BLAS)"),
             ("nvfp4 SR, ranges pulled (lpsim.pool)", "nvfp4 SR, one range a thread")]
    print("# after a torch add, new / old:")
    for new, old in pairs:
        print(f"#   {new} / {old}: "
              f"{rows[new]['after_add_ms'] / rows[old]['after_add_ms']:.2f}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"device": cpu_model(), "date": str(datetime.date.today()),
                       "commit": commit, "add_ms": 1e3 * add, "cases": rows}, handle,
                      indent=1)


if __name__ == "__main__":
    main()
