"""Record what Microsoft's microxcaling (the MX emulation library) returns, to test lpsim against.

microxcaling (github.com/microsoft/microxcaling) is not on the package index, so CI cannot
install it; this script runs a checkout of it (its pure-torch path, ``custom_cuda`` off) and
saves inputs and outputs as an ``.npz`` that ``tests/test_microxcaling.py`` replays:

* ``quantize/...``: ``mx.mx_ops._quantize_mx`` of one input (normals at scales from 2**-130
  to 2**126, zero blocks, heavy tails, powers of two, values on the grid of half quanta,
  a last partial block) for every MX element type (FP8 E4M3 and E5M2, FP6 E3M2 and E2M3,
  FP4 E2M1, INT8), rounding ``even``, ``nearest`` (half away from zero) and ``floor``,
  along the last axis with blocks of 32, and along the first axis and with blocks of 16 for
  three of them;
* ``linear/...``: ``mx.Linear`` (no BF16 rounding: ``bfloat=0``) forward and backward with
  MXFP8 E4M3 and MXFP4 operands, every MX rounding ``even``: y, dx and dW of given x, W and
  dy.  The inputs keep every FP32 sum of the three GEMMs exact (checked here against
  float64), so the recording does not depend on the BLAS's summation order.

    python benchmarks/record_microxcaling.py --mx-root PATH --out tests/data/microxcaling-mx.npz
"""

from __future__ import annotations

import argparse
import datetime
import pathlib
import subprocess
import sys

import numpy as np

#: (microxcaling element format, lpsim block format of blocks of 32, E8M0 floor scales)
FORMATS = (("fp8_e4m3", "mxfp8_e4m3"), ("fp8_e5m2", "mxfp8_e5m2"), ("fp6_e3m2", "mxfp6_e3m2"),
           ("fp6_e2m3", "mxfp6_e2m3"), ("fp4_e2m1", "mxfp4"), ("int8", "mxint8"))
#: microxcaling's rounding -> lpsim's
ROUNDINGS = (("even", "nearest"), ("nearest", "nearest_away"), ("floor", "toward_zero"))
#: (microxcaling format, lpsim element format) of the cases along axis 0 and blocks of 16
ELEMENTS = (("fp8_e4m3", "e4m3fn"), ("fp6_e2m3", "e2m3fn"), ("fp4_e2m1", "e2m1fn"))
#: mx.Linear's cases: (name, element format), tokens x in_features -> out_features
LINEAR = (("mxfp8_e4m3", "fp8_e4m3"), ("mxfp4", "fp4_e2m1"))
TOKENS, IN_FEATURES, OUT_FEATURES = 128, 96, 64


def quantize_input(rng) -> np.ndarray:
    """The quantization cases' input: float32, 180 x 40 (a block of 32, then one of 8)."""
    cols = 40
    parts = [rng.standard_normal((12, cols)) * scale
             for scale in (1.0, 1e-3, 1e3, 2.0 ** -120, 2.0 ** -130, 2.0 ** 100, 2.0 ** 126)]
    zeros = rng.standard_normal((12, cols))
    zeros[0], zeros[1, :32], zeros[2, ::3] = 0, 0, 0
    parts += [zeros, rng.standard_cauchy((24, cols)),
              2.0 ** rng.integers(-20, 20, (24, cols)) * rng.choice([-1, 1], (24, cols)),
              rng.integers(-64, 64, (36, cols)) / 16]
    return np.concatenate(parts).astype(np.float32)


def bounded(rng, shape) -> np.ndarray:
    """float32 values of magnitude in [0.5, 2) with random signs: their MX quantizations
    have few significant bits over few binades, so the GEMMs' FP32 sums are exact."""
    return (rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)).astype(np.float32)


def _specs(mx, element: str) -> dict:
    rounds = ("round_mx_output", "round_mx_input_grad_input", "round_mx_weight_grad_input",
              "round_mx_grad_output_grad_input", "round_mx_input_grad_weight",
              "round_mx_grad_output_grad_weight")
    from mx.specs import finalize_mx_specs
    return finalize_mx_specs({"w_elem_format": element, "a_elem_format": element,
                              "block_size": 32, "scale_bits": 8, "bfloat": 0,
                              "custom_cuda": False, **{r: "even" for r in rounds}})


def record_linear(mx, torch, rng, record: dict) -> None:
    """mx.Linear's y, dx and dW for each LINEAR case, with the check that every sum of its
    GEMMs was exact (float64 of the same quantized operands gives the same values)."""
    x, w, dy = (bounded(rng, s) for s in ((TOKENS, IN_FEATURES), (OUT_FEATURES, IN_FEATURES),
                                          (TOKENS, OUT_FEATURES)))
    record.update({"linear/x": x, "linear/w": w, "linear/dy": dy})
    for name, element in LINEAR:
        layer = mx.Linear(IN_FEATURES, OUT_FEATURES, bias=False, mx_specs=_specs(mx, element))
        layer.weight.data.copy_(torch.from_numpy(w))
        xt = torch.from_numpy(x.copy()).requires_grad_()
        y = layer(xt)
        y.backward(torch.from_numpy(dy))
        y64 = layer_float64(mx, torch, element, x, w, dy)
        for key, got in (("y", y.detach()), ("dx", xt.grad), ("dw", layer.weight.grad)):
            value = got.numpy()
            if not np.array_equal(value.astype(np.float64), y64[key]):
                sys.exit(f"linear {name} {key}: an FP32 sum was not exact; the recording "
                         "would depend on the BLAS's order")
            record[f"linear/{name}/{key}"] = value
        print(f"linear {name}: y, dx, dW recorded (every FP32 sum exact)")


def layer_float64(mx, torch, element, x, w, dy) -> dict:
    """The three GEMMs of mx.Linear in float64 on its own quantized operands."""
    from mx.formats import ElemFormat
    from mx.mx_ops import _quantize_mx

    def q(a, axis):
        return _quantize_mx(torch.from_numpy(a.copy()), 8, ElemFormat.from_str(element),
                            axes=[axis], block_size=32, round="even").double()
    return {"y": (q(x, -1) @ q(w, -1).t()).numpy(),
            "dx": (q(dy, -1) @ q(w, 0)).numpy(),
            "dw": (q(dy, -2).t() @ q(x, -2)).numpy()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mx-root", required=True, type=pathlib.Path,
                        help="a checkout of github.com/microsoft/microxcaling (its mx package)")
    parser.add_argument("--out", required=True, help="the .npz to write")
    parser.add_argument("--seed", type=int, default=20261129, help="seed of the inputs")
    args = parser.parse_args()
    if not (args.mx_root / "mx" / "mx_ops.py").is_file():
        parser.error(f"--mx-root {args.mx_root}: no mx/mx_ops.py there; accepted: a checkout "
                     "of github.com/microsoft/microxcaling")
    sys.path.insert(0, str(args.mx_root))
    import torch
    import mx
    from mx.formats import ElemFormat
    from mx.mx_ops import _quantize_mx
    torch.set_num_threads(1)
    commit = subprocess.run(["git", "-C", str(args.mx_root), "rev-parse", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "unknown"
    rng = np.random.default_rng(args.seed)
    x = quantize_input(rng)
    record = {"microxcaling_commit": commit, "torch": torch.__version__,
              "date": datetime.date.today().isoformat(), "seed": args.seed,
              "command": "python benchmarks/record_microxcaling.py --mx-root <checkout> "
                         f"--out {args.out}", "quantize/x": x}

    def run(element, rounding, axis, block):
        return _quantize_mx(torch.from_numpy(x.copy()), 8, ElemFormat.from_str(element),
                            axes=[axis], block_size=block, round=rounding).numpy()
    for element, _ in FORMATS:
        for rounding, _ in ROUNDINGS:
            record[f"quantize/{element}/{rounding}/axis-1/block32"] = run(element, rounding,
                                                                          -1, 32)
    for element, _ in ELEMENTS:
        record[f"quantize/{element}/even/axis0/block32"] = run(element, "even", 0, 32)
        record[f"quantize/{element}/even/axis-1/block16"] = run(element, "even", -1, 16)
    print(f"quantize: {sum(k.count('/') == 4 for k in record)} cases recorded")
    record_linear(mx, torch, rng, record)
    np.savez_compressed(args.out, **{k: np.asarray(v) for k, v in record.items()})
    print("wrote", args.out, f"(microxcaling {commit})")


if __name__ == "__main__":
    main()
