"""Record what a GPU's FP8 and BF16 matrix units return, to fit lpsim's tensor-core models.

Runs ``torch._scaled_mm`` (E4M3 x E4M3 -> FP32, unit scales, with ``use_fast_accum`` off and
on) and a BF16 ``torch.matmul`` (FP32 output) on inputs built to expose the accumulator:
random normals at several K, rows whose terms span many binades, cancelling rows, and one
large term followed by many small ones.  Saves inputs and outputs as an ``.npz``
(``lpsim.ops.hardware`` tests replay it on any machine, no GPU needed).

    python benchmarks/probe_tensor_cores.py --out tests/data/tensor-cores-h100.npz
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

import numpy as np
import torch

E4M3_MAX = 448.0


def cases(rng):
    """(name, a, b) float32 pairs with values exact in E4M3 (a: M x K, b: K x N)."""
    def e4m3(x):
        return torch.from_numpy(np.clip(x, -E4M3_MAX, E4M3_MAX).astype(np.float32)).to(
            torch.float8_e4m3fn).float().numpy()

    out = []
    for k in (16, 32, 48, 64, 128, 256, 1024, 4096):
        out.append((f"normal-k{k}", e4m3(rng.standard_normal((32, k))),
                    e4m3(rng.standard_normal((k, 32)))))
    for k in (32, 128, 512):
        scale = 2.0 ** rng.integers(-6, 7, (32, k))
        out.append((f"wide-k{k}", e4m3(rng.standard_normal((32, k)) * scale),
                    e4m3(rng.standard_normal((k, 32)))))
        a = np.abs(rng.standard_normal((32, k)))
        b = rng.standard_normal((k, 32))
        b[1::2] = -b[0::2]                   # pairs that nearly cancel after rounding
        out.append((f"cancel-k{k}", e4m3(a), e4m3(b * (1 + 2.0 ** -3 * rng.random((k, 32))))))
    for k in (32, 64, 256):
        a = np.ones((32, k), np.float32)
        a[:, 0] = 2.0 ** rng.integers(0, 9, 32)  # one large term, then small ones
        b = e4m3(rng.uniform(2.0 ** -9, 2.0 ** -4, (k, 32)) * rng.choice([-1, 1], (k, 32)))
        b[0] = 1.0
        out.append((f"big-then-small-k{k}", e4m3(a), b))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the .npz to write")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    args = parser.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from timing import require_cuda
    require_cuda("probe_tensor_cores")
    dev = torch.device("cuda")
    one = torch.ones((), device=dev)
    record = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "cuda": torch.version.cuda, "date": datetime.date.today().isoformat()}
    names = []
    for name, a, b in cases(np.random.default_rng(args.seed)):
        ta = torch.from_numpy(a).to(dev).to(torch.float8_e4m3fn)
        tb = torch.from_numpy(b).to(dev).to(torch.float8_e4m3fn).t().contiguous().t()
        # inputs as their E4M3 codes (uint8): tests view them as ml_dtypes.float8_e4m3fn
        record[f"{name}/a"] = ta.view(torch.uint8).cpu().numpy()
        record[f"{name}/b"] = tb.t().contiguous().t().view(torch.uint8).cpu().numpy()
        for fast in (False, True):
            got = torch._scaled_mm(ta, tb, scale_a=one, scale_b=one, out_dtype=torch.float32,
                                   use_fast_accum=fast)
            record[f"{name}/fp8-fast{int(fast)}"] = got.cpu().numpy()
        bf = torch.matmul(torch.from_numpy(a).to(dev).bfloat16(),
                          torch.from_numpy(b).to(dev).bfloat16()).float()
        record[f"{name}/bf16"] = bf.cpu().numpy()
        exact = a.astype(np.float64) @ b.astype(np.float64)
        for key in ("fp8-fast0", "fp8-fast1", "bf16"):
            err = np.abs(record[f"{name}/{key}"] - exact).max()
            print(f"{name:22s} {key:10s} max |out - exact| = {err:.3g}")
        names.append(name)
    record["cases"] = np.array(names)
    np.savez_compressed(args.out, **{k: np.asarray(v) for k, v in record.items()})
    print("wrote", args.out)


if __name__ == "__main__":
    main()
