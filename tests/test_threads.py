"""lpsim's own thread pool leaves torch's thread count alone (numba's OpenMP threading layer,
once started, sets the OpenMP thread count that torch shares)."""

import os
import pathlib
import subprocess
import sys

from conftest import child_pythonpath

ROOT = pathlib.Path(__file__).resolve().parent.parent

SCRIPT = """
import numpy as np, torch
import lpsim, lpsim.ops as ops
from lpsim import cpu
from lpsim.optim import AdamW
torch.set_num_threads(1)
x = np.random.default_rng(0).standard_normal(2 * cpu.SERIAL_BELOW).astype(np.float32)
lpsim.quantize(x, "bf16", "stochastic", seed=1)                  # the thread pool path
lpsim.quantize(x.reshape(-1, 32), "mxfp8_e4m3", axis=-1)          # block formats
a = np.random.default_rng(1).standard_normal((96, 512)).astype(np.float32)
ops.matmul(a, a.T.copy(), acc_fmt="bf16")                         # threaded GEMM
p = torch.nn.Parameter(torch.randn(1 << 18).bfloat16())
p.grad = torch.randn_like(p)
AdamW([p], update_rounding="stochastic", seed=0).step()          # threaded optimizer step
assert cpu.threads() >= 1
print(torch.get_num_threads())
"""


def test_lpsim_keeps_torch_at_one_thread():
    env = {**os.environ, "PYTHONPATH": child_pythonpath(), "OMP_NUM_THREADS": "1"}
    env.pop("NUMBA_NUM_THREADS", None)
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == "1", done.stdout
