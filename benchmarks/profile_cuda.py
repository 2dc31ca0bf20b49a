"""Where lpsim_cuda's time goes on a GPU: per-call host overhead, kernel resources, variants.

Prints (1) a cProfile of many lpsim_cuda.quantize calls on a 1-element tensor, (2) registers,
local memory and shared memory per thread of each compiled kernel, (3) the time of the
rounding kernel on 2**26 float32 values at several grid sizes, with and without counting,
next to experimental variants (round_fast first; one element per thread per pass, so
loads coalesce) and a numba copy kernel.  SASS of the rounding kernel goes to --sass.

    python benchmarks/profile_cuda.py [--sass out.sass]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys

import numpy as np
import torch
from numba import cuda

import lpsim
import lpsim_cuda
import lpsim_cuda.blocks  # noqa: F401  (sys.modules entries below)
import lpsim_cuda.optim  # noqa: F401
from lpsim.philox import block_words, lane_word
from lpsim.quantize import plan
from lpsim.rounding import STOCHASTIC, round_bits, round_fast
from lpsim_cuda import launch

from timing import cuda_time, require_cuda  # the script's folder is on sys.path


@cuda.jit
def _copy(xb, outb):
    i = cuda.grid(1)
    while i < xb.size:
        outb[i] = xb[i]
        i += cuda.gridsize(1)


@cuda.jit
def _fast_first(xb, outb, mode, k, p, seed_lo, seed_hi, stream, lanes):
    """round_fast, round_bits only where it declines; a Philox block of 4 lanes per thread."""
    nblocks = (xb.size + lanes - 1) // lanes
    j = cuda.grid(1)
    while j < nblocks:
        if mode >= STOCHASTIC:
            words = block_words(j, stream, seed_lo, seed_hi)
        else:
            words = (np.int64(0), np.int64(0), np.int64(0), np.int64(0))
        for lane in range(lanes):
            i = j * lanes + lane
            if i < xb.size:
                r = lane_word(words, lane, lanes)
                bits, ok, _ = round_fast(xb[i], mode, r, k, p)
                if not ok:
                    bits, _ = round_bits(xb[i], mode, r, k, p)
                outb[i] = bits
        j += cuda.gridsize(1)


@cuda.jit
def _fast_coalesced(xb, outb, mode, k, p):
    """round_fast first, one element per thread per pass (deterministic modes only)."""
    i = cuda.grid(1)
    while i < xb.size:
        bits, ok, _ = round_fast(xb[i], mode, 0, k, p)
        if not ok:
            bits, _ = round_bits(xb[i], mode, 0, k, p)
        outb[i] = bits
        i += cuda.gridsize(1)


def resources(name, kernel):
    try:
        regs = kernel.get_regs_per_thread()
        local = kernel.get_local_mem_per_thread()
        shared = kernel.get_shared_mem_per_block()
    except Exception as exc:                            # noqa: BLE001 (a report, not a check)
        print(f"{name}: {exc!r}")
        return
    for sig in regs:
        print(f"{name:28s} regs {regs[sig]:4d}  local B/thread {local[sig]:6d}  shared B/block "
              f"{shared[sig]:6d}  {str(sig)[:80]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sass", help="write the rounding kernel's SASS here")
    args = parser.parse_args()
    require_cuda("profile_cuda")
    q = sys.modules["lpsim_cuda.quantize"]      # the module (lpsim_cuda.quantize is the function)
    dev = torch.device("cuda")

    # (1) host overhead per call
    one = torch.ones(1, device=dev)
    for rounding in ("nearest", "stochastic"):
        lpsim_cuda.quantize(one, "bf16", rounding, seed=1)
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(2000):
        lpsim_cuda.quantize(one, "bf16")
    torch.cuda.synchronize()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
    print("\n".join(out.getvalue().splitlines()[:45]))

    # (2) kernel resources
    stats = lpsim.RoundingStats()
    lpsim_cuda.quantize(one, "bf16", stats=stats)
    x = torch.randn(2 ** 26, device=dev)
    y = torch.empty_like(x)
    xb, yb = x.view(torch.int32), y.view(torch.int32)
    for mode in ("nearest", "stochastic"):
        lpsim_cuda.quantize(x, "bf16", mode, seed=1, out=y)
    lpsim.quantize(x[:2 ** 20], "mxfp8_e4m3")             # compiles a block kernel
    for count, kernel in q.KERNELS.items():
        resources(f"rounding kernel count={count}", kernel)
    blocks, optim = sys.modules["lpsim_cuda.blocks"], sys.modules["lpsim_cuda.optim"]
    for name in dir(blocks):
        obj = getattr(blocks, name)
        if hasattr(obj, "overloads") and obj.overloads:
            resources(f"blocks.{name}", obj)
    for kernel in optim.KERNELS.values():
        resources("optim.optim_kernel", kernel)
    for key, kernel in sys.modules["lpsim_cuda.specialised"].KERNELS.items():
        fmt, mode, k, sp, count, half = key        # lpsim_cuda.specialised.kernel's key
        resources(f"specialised {fmt} {mode} k={k} packed={sp.width != 0} count={count} "
                  f"source={'float32' if not half else f'16-bit codes {half}'}", kernel)
    if args.sass:
        with open(args.sass, "w") as f:
            for sig in list(q.KERNELS[False].overloads):
                f.write(f"// {sig}\n{q.KERNELS[False].inspect_sass(sig)}\n")

    # (3) kernel timings, 2**26 float32 -> bf16
    n = x.numel()
    gb = 8 * n / 1e9
    cx, cy = cuda.as_cuda_array(xb), cuda.as_cuda_array(yb)
    sms = cuda.get_current_device().MULTIPROCESSOR_COUNT
    print(f"\nSMs {sms}; GB/s for {n} float32 (read + write)")
    t = 1e3 * cuda_time(lambda: y.copy_(x), 20)
    print(f"torch copy                          {gb / t * 1e3:8.1f} GB/s")
    for blocks_per_sm in (4, 8, 16, 32):
        grid = sms * blocks_per_sm
        t = 1e3 * cuda_time(lambda: _copy[grid, 256](cx, cy))
        print(f"numba copy grid {grid:6d}x256          {gb / t * 1e3:8.1f} GB/s")
    for mode in ("nearest", "stochastic"):
        # None: the kernels' own grid (lpsim_cuda.specialised.STREAM_BLOCKS_PER_SM an SM)
        for limit in (None, sms * 8, sms * 16, sms * 128):
            launch.GRID_LIMIT = limit          # read at each launch (launch.grid_size)
            t = 1e3 * cuda_time(lambda: lpsim_cuda.quantize(x, "bf16", mode, seed=1, out=y))
            print(f"lpsim_cuda {mode:10s} grid cap {str(limit):6s}   {gb / t * 1e3:8.1f} GB/s")
        launch.GRID_LIMIT = None
        t = 1e3 * cuda_time(lambda: lpsim_cuda.quantize(x, "bf16", mode, seed=1, out=y,
                                                   stats=stats))
        print(f"lpsim_cuda {mode:10s} counting          {gb / t * 1e3:8.1f} GB/s")
        r = plan("bf16", mode, np.float32, seed=1, size=n)
        pv = r.params
        for blocks_per_sm in (8, 32):
            grid = sms * blocks_per_sm
            t = 1e3 * cuda_time(lambda: _fast_first[grid, 128](cx, cy, r.mode, r.k, pv, r.seed_lo,
                                                          r.seed_hi, r.stream, r.lanes))
            print(f"variant fast-first {mode:10s} grid {grid:5d} {gb / t * 1e3:8.1f} GB/s")
        if mode == "nearest":
            for blocks_per_sm in (8, 32):
                grid = sms * blocks_per_sm
                t = 1e3 * cuda_time(lambda: _fast_coalesced[grid, 256](cx, cy, r.mode, r.k, pv))
                print(f"variant coalesced nearest grid {grid:5d}  {gb / t * 1e3:8.1f} GB/s")
    resources("variant _fast_first", _fast_first)
    resources("variant _fast_coalesced", _fast_coalesced)


if __name__ == "__main__":
    main()
