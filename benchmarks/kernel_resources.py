"""Registers, spills and local memory of every lpsim_cuda kernel for sm_90, without a GPU.

Compiles each kernel specialisation that ``tests/test_cuda_compile.py`` compiles (NVVM, as
CI does) and runs ``ptxas -arch=sm_90 -v`` on its PTX.  Registers set occupancy, the first
suspect when a memory-bound kernel runs far under the copy bandwidth: an H100 SM holds 65536
registers, so a 128-thread block of r registers per thread allows 512 / r blocks per SM.
On the H100 (2026-11-23) this matched the device's own report (55 vs 56 and 119 registers).

    python benchmarks/kernel_resources.py [--out benchmarks/results/kernel-resources.txt]

Needs the ``ptx`` extra (nvidia-cuda-nvcc-cu12 carries ptxas) or ptxas on the PATH.
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import re
import shutil
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def ptxas() -> str:
    found = shutil.which("ptxas")
    if found:
        return found
    try:
        import nvidia.cuda_nvcc
        for folder in nvidia.cuda_nvcc.__path__:
            candidate = pathlib.Path(folder) / "bin" / "ptxas"
            if candidate.exists():
                return str(candidate)
    except ImportError:
        pass
    sys.exit("no ptxas: pip install nvidia-cuda-nvcc-cu12 (lpsim's ptx extra)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="also write the table here")
    args = parser.parse_args()
    os.environ["LPSIM_PTXAS"] = "1"
    os.environ["LPSIM_PTXAS_PATH"] = ptxas()
    sys.path.insert(0, str(ROOT / "tests"))
    import test_cuda_compile as scripts
    lines = [f"# lpsim_cuda kernels for sm_90 (ptxas -v), {datetime.date.today()}",
             f"# command: python benchmarks/kernel_resources.py",
             f"{'kernel':<44} {'regs':>5} {'blocks/SM':>9} {'spill B':>8} {'stack B':>8} "
             f"{'smem B':>7}"]
    for script in (scripts.CHECK, scripts.OPTIM, scripts.BLOCKS, scripts.CASGD):
        for line in scripts._compile(scripts._PREAMBLE + script).splitlines():
            if not line.startswith("resources "):
                continue
            name, info = line[len("resources "):].split(" | ", 1)
            regs = int(re.search(r"Used (\d+) registers", info).group(1))
            spill = sum(int(v) for v in re.findall(r"(\d+) bytes spill", info))
            stack = int(re.search(r"(\d+) bytes stack frame", info).group(1))
            smem = re.search(r"(\d+) bytes smem", info)
            blocks = min(16, 65536 // (regs * 128))      # 128-thread blocks (launch.THREADS)
            lines.append(f"{name:<44} {regs:>5} {blocks:>9} {spill:>8} {stack:>8} "
                         f"{int(smem.group(1)) if smem else 0:>7}")
    print("\n".join(lines))
    if args.out:
        pathlib.Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
