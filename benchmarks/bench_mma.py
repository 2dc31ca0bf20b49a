"""lpsim.ops.mma against MMA-Sim (mmasim): bit-for-bit agreement per instruction, and speed.

    python benchmarks/bench_mma.py [--outputs 100000] [--gemm-slice 16]
                                   [--out benchmarks/results/mma-cpu.txt]

1. For every (arch, instruction) lpsim models (wgmma at n = 256), at least ``--outputs``
   outputs on uniform random codes of the input types (C: random FP32/FP16 codes), each
   instruction call run by both simulators; prints equal / total output codes.
2. A 256 x 256 x 4096 FP8 GEMM as a Hopper kernel runs it with fast accumulation: tiles of
   ``wgmma.m64n256k32.f32.e4m3.e4m3``, each K step's D fed back as the next step's C
   (4 x 128 instructions).  lpsim runs all of them; mmasim runs the first ``--gemm-slice``
   instructions of the chain and its time is scaled to the 512 (its rate is the same per
   instruction).  Both on one thread (numba and torch).  Checks the 8 x 8 corner of lpsim's
   D against mmasim's fused-node chain over the full K = 4096.  The same GEMM through
   ``lpsim.ops.matmul(model="hopper-wgmma-e4m3")`` (one call) is timed and checked equal,
   code for code, to the chain of instruction calls.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
import zlib

os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import numba                                   # noqa: E402
import numpy as np                             # noqa: E402
import torch                                   # noqa: E402
from tqdm import tqdm                          # noqa: E402

import lpsim                                   # noqa: E402
from lpsim.ops import matmul, mma              # noqa: E402
from lpsim.ops.mma_table import (code_values, instructions, lookup,  # noqa: E402
                                  mmasim_simulator, random_codes, random_scales)

CASES = instructions(256)


def codes(x):
    return x.view(torch.int16 if x.dtype == torch.float16 else torch.int32)


def agreement(outputs):
    rows = []
    for arch, instruction in tqdm(CASES, desc="bit for bit", unit="instr"):
        ins = lookup(arch, instruction)
        sim = mmasim_simulator(arch, instruction)
        rng = np.random.default_rng(zlib.crc32(f"{arch} {instruction}".encode()))
        equal = total = 0
        t_lp = t_sim = 0.0
        while total < outputs:
            a = random_codes((ins.m, ins.k), ins.a_type, rng)
            b = random_codes((ins.k, ins.n), ins.b_type, rng)
            c = random_codes((ins.m, ins.n), ins.c_type, rng)
            scales = {}
            if ins.block:
                scales = dict(
                    scale_a=random_scales((ins.m, ins.k // ins.block), rng, ins.scale_type),
                    scale_b=random_scales((ins.k // ins.block, ins.n), rng, ins.scale_type))
            t = time.perf_counter()
            want = sim(a, b, c, *scales.values())
            t_sim += time.perf_counter() - t
            t = time.perf_counter()
            got = mma(code_values(a, ins.a_type), code_values(b, ins.b_type), c, arch=arch,
                      instruction=instruction, **scales)
            t_lp += time.perf_counter() - t
            equal += int((codes(got) == codes(want)).sum())
            total += want.numel()
        rows.append((arch, instruction, equal, total, t_lp, t_sim))
    return rows


def gemm(slice_calls):
    M, N, K, tm, tk = 256, 256, 4096, 64, 32
    instruction = "wgmma.m64n256k32.f32.e4m3.e4m3"
    rng = np.random.default_rng(0)
    # finite values of moderate range, as a GEMM's operands are
    A = torch.from_numpy(rng.standard_normal((M, K)).astype(np.float32)).to(torch.float8_e4m3fn)
    B = torch.from_numpy(rng.standard_normal((K, N)).astype(np.float32)).to(torch.float8_e4m3fn)
    C = torch.zeros((M, N), dtype=torch.float32)
    calls = [(i, k) for i in range(0, M, tm) for k in range(0, K, tk)]

    def run_lpsim():
        D = C.clone()
        for i, k in tqdm(calls, desc="lpsim GEMM", unit="wgmma", leave=False):
            D[i:i + tm] = mma(A[i:i + tm, k:k + tk], B[k:k + tk], D[i:i + tm],
                              arch="hopper", instruction=instruction)
        return D

    mma(A[:tm, :tk], B[:tk], C[:tm], arch="hopper", instruction=instruction)   # compiled
    t = time.perf_counter()
    D = run_lpsim()
    t_lp = time.perf_counter() - t
    # the same GEMM as one call: matmul with the named model (inputs rounded to E4M3, a
    # no-op here), one kernel over the whole of M, N and K
    A32, B32 = A.float().numpy(), B.float().numpy()
    matmul(A32[:64, :64], B32[:64, :8], model="hopper-wgmma-e4m3")              # compiled
    t_model = []
    for _ in range(3):
        t = time.perf_counter()
        D_model = matmul(A32, B32, model="hopper-wgmma-e4m3")
        t_model.append(time.perf_counter() - t)
    model_equal = int((D_model.view(np.int32) == codes(D).numpy()).sum())

    sim = mmasim_simulator("hopper", instruction)
    d = C[:tm].clone()
    t = time.perf_counter()
    for i, k in tqdm(calls[:slice_calls], desc="mmasim GEMM slice", unit="wgmma", leave=False):
        d = sim(A[i:i + tm, k:k + tk], B[k:k + tk], d)
    t_sim_slice = time.perf_counter() - t
    t_sim = t_sim_slice * len(calls) / slice_calls
    # the corner of D through mmasim's chain of fused nodes over all of K
    a_vec = A[:8, None, :].expand(-1, 8, -1)
    b_vec = B[:, :8].T[None, :, :].expand(8, -1, -1)
    corner = sim.dpa(a_vec, b_vec, C[:8, :8])
    corner_equal = int((codes(corner) == codes(D[:8, :8].contiguous())).sum())
    return dict(calls=len(calls), t_lp=t_lp, t_sim=t_sim, t_sim_slice=t_sim_slice,
                slice_calls=slice_calls, corner_equal=corner_equal, t_model=min(t_model),
                model_equal=model_equal)


def fp4_gemm():
    """The 256x256x4096 NVFP4 GEMM of ``tcgen05.mma.m128n256k64.kind::mxf4nvf4.block16``
    chained along K (E2M1 values, UE4M3 scales per 16): lpsim in one call
    (``chained_matmul``, what ``ops.matmul(model="blackwell-nvfp4")`` runs after its block
    quantization) against mmasim's 64 calls for the first 128 rows, every output compared."""
    from mmasim import nv_ptx

    from lpsim.ops.mma import chained_matmul
    M, N, K, tm, tk = 256, 256, 4096, 128, 64
    opcode = "tcgen05.mma.m128n256k64.kind::mxf4nvf4.block16.f32.e2m1.e2m1.ue4m3"
    ins = lookup("blackwell", opcode)
    rng = np.random.default_rng(0)
    fp4 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])
    A = fp4[rng.integers(0, 8, (M, K))] * rng.choice([-1, 1], (M, K))
    B = fp4[rng.integers(0, 8, (K, N))] * rng.choice([-1, 1], (K, N))
    # finite scales (a NaN would make its row NaN)
    sa, sb = (torch.nan_to_num(random_scales(shape, rng, "ue4m3").float(), nan=1.0).to(
        torch.float8_e4m3fn) for shape in ((M, K // 16), (K // 16, N)))
    chained_matmul(A[:tm, :tk], B[:tk], ins, scales=(sa[:tm, :4], sb[:4]))       # compiled
    t_lp = []
    for _ in range(3):
        t = time.perf_counter()
        D = chained_matmul(A, B, ins, scales=(sa, sb))
        t_lp.append(time.perf_counter() - t)
    sim = nv_ptx.TCGen05MMABlockScale("Blackwell", opcode.removeprefix("tcgen05.mma."))
    At, Bt = torch.from_numpy(A[:tm]).half(), torch.from_numpy(B).half()     # exact
    d = torch.zeros((tm, N), dtype=torch.float32)
    t = time.perf_counter()
    for k in tqdm(range(0, K, tk), desc="mmasim NVFP4 GEMM rows 0-127", unit="call",
                  leave=False):
        d = sim(At[:, k:k + tk], Bt[k:k + tk], d, sa[:tm, k // 16:(k + tk) // 16],
                sb[k // 16:(k + tk) // 16])
    t_sim = (time.perf_counter() - t) * M / tm
    equal = int((D[:tm].view(np.int32) == codes(d).numpy()).sum())
    return dict(t_lp=min(t_lp), t_sim=t_sim, equal=equal, total=tm * N)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outputs", type=int, default=100_000,
                        help="random outputs whose accumulation lpsim and mmasim compare")
    parser.add_argument("--gemm-slice", type=int, default=16,
                        help="instructions of the GEMM that mmasim also runs (it is slower)")
    parser.add_argument("--out", default=None, help="write the table here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    import mmasim
    rows = agreement(args.outputs)
    g = gemm(args.gemm_slice)
    f4 = fp4_gemm()
    macs = 256 * 256 * 4096
    cpu = platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        pass
    lines = [
        f"# {datetime.date.today()}  {cpu}, {os.cpu_count()} cores (shared with other jobs), "
        f"one thread each (numba {numba.__version__}, torch {torch.__version__} "
        f"set_num_threads(1)); lpsim {lpsim.__version__}, "
        f"mmasim {getattr(mmasim, '__version__', '2.1.1')}, numpy {np.__version__}",
        f"# command: python {' '.join(sys.argv)}",
        "# bit for bit: random codes of the input types (NaN, inf, subnormals, zeros), "
        "C random codes; seconds: all calls of the case",
        f"{'arch':<10} {'instruction':<36} {'equal':>8} / {'total':<8} {'lpsim s':>8} "
        f"{'mmasim s':>9}",
    ]
    for arch, ins, eq, tot, tl, ts in rows:
        lines.append(f"{arch:<10} {ins:<36} {eq:>8} / {tot:<8} {tl:8.2f} {ts:9.2f}")
    eq_all = sum(r[2] for r in rows)
    tot_all = sum(r[3] for r in rows)
    lines.append(f"{'all':<10} {f'{len(rows)} (arch, instruction) pairs':<36} {eq_all:>8} / "
                 f"{tot_all:<8}")
    lines += [
        "",
        f"# 256x256x4096 FP8 GEMM: {g['calls']} x wgmma.m64n256k32.f32.e4m3.e4m3, D fed back "
        "as C along K (fast accumulation), standard normal inputs rounded to e4m3",
        f"lpsim.ops.mma   {g['t_lp']:8.2f} s  {macs / g['t_lp']:.3e} MAC/s  (all "
        f"{g['calls']} instructions)",
        f"mmasim          {g['t_sim']:8.2f} s  {macs / g['t_sim']:.3e} MAC/s  (scaled from "
        f"{g['slice_calls']} instructions in {g['t_sim_slice']:.2f} s)",
        f"ops.matmul      {g['t_model']:8.2f} s  {macs / g['t_model']:.3e} MAC/s  "
        "(model='hopper-wgmma-e4m3': one call, best of 3)",
        f"speed-up        {g['t_sim'] / g['t_lp']:8.1f} x (ops.mma calls), "
        f"{g['t_sim'] / g['t_model']:.1f} x (ops.matmul)",
        f"ops.matmul's D equal to the chain of ops.mma calls: {g['model_equal']} / "
        f"{256 * 256}",
        f"D[:8, :8] equal to mmasim's chain over K = 4096: {g['corner_equal']} / 64",
        "",
        "# 256x256x4096 NVFP4 GEMM: tcgen05.mma.m128n256k64.kind::mxf4nvf4.block16 (UE4M3) "
        "chained along K, random E2M1 values and finite UE4M3 scales",
        f"lpsim           {f4['t_lp']:8.2f} s  {macs / f4['t_lp']:.3e} MAC/s  (one call, "
        "best of 3)",
        f"mmasim          {f4['t_sim']:8.2f} s  {macs / f4['t_sim']:.3e} MAC/s  (rows 0-127, "
        "64 calls, times 2)",
        f"speed-up        {f4['t_sim'] / f4['t_lp']:8.1f} x",
        f"D[:128] equal to mmasim's chain: {f4['equal']} / {f4['total']}",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
