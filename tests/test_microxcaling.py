"""lpsim's MX quantization and simulated MX linear layers equal microxcaling's, bit for bit.

microxcaling (github.com/microsoft/microxcaling, the MX emulation library; not on the
package index) is replayed from ``tests/data/microxcaling-mx.npz``, which
``benchmarks/record_microxcaling.py`` wrote from a checkout of it (its commit, torch version,
date and command are in the file).  Its roundings ``even``, ``nearest`` and ``floor`` are
lpsim's ``nearest``, ``nearest_away`` and ``toward_zero``; its shared exponent is OCP's
(``floor(log2(amax)) - emax``, E8M0, clamped at 2**-127), lpsim's ``'floor'`` scale rule.
The values agree everywhere; a zero's sign differs in two known places: microxcaling's INT8
is sign-magnitude and OCP's MXINT8 two's complement (a negative value that rounds to zero
is -0 there, +0, the only zero, in lpsim), and microxcaling divides an element by its
block's scale before it rounds, so an element far below the block's largest underflows to
-0 there, whose ``torch.sign`` is +0 (lpsim keeps the -0 of roundTiesToEven).
"""

import pathlib

import numpy as np
import pytest

import lpsim
from lpsim.blocks.formats import BlockFormat

torch = pytest.importorskip("torch")

RECORDING = pathlib.Path(__file__).parent / "data" / "microxcaling-mx.npz"
BLOCK_FORMATS = {"fp8_e4m3": "mxfp8_e4m3", "fp8_e5m2": "mxfp8_e5m2", "fp6_e3m2": "mxfp6_e3m2",
                 "fp6_e2m3": "mxfp6_e2m3", "fp4_e2m1": "mxfp4", "int8": "mxint8"}
ELEMENTS = {"fp8_e4m3": "e4m3fn", "fp6_e2m3": "e2m3fn", "fp4_e2m1": "e2m1fn"}
ROUNDINGS = {"even": "nearest", "nearest": "nearest_away", "floor": "toward_zero"}


@pytest.fixture(scope="module")
def recording():
    with np.load(RECORDING) as data:
        return {key: data[key] for key in data.files}


def _cases():
    with np.load(RECORDING) as data:
        return sorted(k for k in data.files if k.startswith("quantize/") and k.count("/") == 4)


def test_the_recording_names_its_source(recording):
    assert len(str(recording["microxcaling_commit"])) == 40
    assert "record_microxcaling.py" in str(recording["command"])
    assert len(_cases()) == 24


@pytest.mark.parametrize("case", _cases())
def test_quantize_equals_microxcaling(recording, case):
    _, element, rounding, axis, block = case.split("/")
    x, want = recording["quantize/x"], recording[case]
    size = int(block.removeprefix("block"))
    fmt = BLOCK_FORMATS[element] if size == 32 else \
        BlockFormat(ELEMENTS[element], size, "e8m0fnu", "floor")
    got = lpsim.quantize(x, fmt, ROUNDINGS[rounding], axis=int(axis.removeprefix("axis")))
    differ = (got.view(np.uint32) != want.view(np.uint32)) & ~_zero_signs(x, want, got, element)
    first = np.argwhere(differ)[:3].tolist()
    assert not differ.any(), (f"{case}: {int(differ.sum())} elements differ, first at {first}: "
                              f"x={[x[i, j] for i, j in first]} microxcaling="
                              f"{[want[i, j] for i, j in first]} lpsim="
                              f"{[got[i, j] for i, j in first]}")


def _zero_signs(x, want, got, element):
    """Where the two differ only in a zero's sign, as the module docstring says they may:
    INT8's -0 (sign-magnitude) against +0, and microxcaling's +0 for a negative element whose
    quotient by its block's scale underflows float32 (``torch.sign`` of that -0 is +0)
    against -0, the sign roundTiesToEven keeps."""
    plus, minus = np.uint32(0), np.uint32(0x80000000)
    w, g = want.view(np.uint32), got.view(np.uint32)
    if element == "int8":
        return (w == minus) & (g == plus)
    return (w == plus) & (g == minus) & (x < 0)


@pytest.mark.parametrize("name", ["mxfp8_e4m3", "mxfp4"])
def test_simulated_linear_equals_mx_linear(recording, name):
    # mx.Linear with bfloat=0 quantizes each GEMM's operands along its K (x and W along
    # in_features, dy along out_features and W down its columns, dy and x along the tokens)
    # and keeps FP32 outputs: an lpsim recipe of that format everywhere with out=None
    from lpsim.torch import Gemm, Operand, Recipe, SimulatedLinear
    op = Operand(name)
    recipe = Recipe(Gemm(op, op, out=None), Gemm(op, op, out=None), Gemm(op, op, out=None))
    x, w, dy = (torch.from_numpy(recording[f"linear/{k}"].copy()) for k in ("x", "w", "dy"))
    base = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
    base.weight.data.copy_(w)
    layer = SimulatedLinear.from_linear(base, recipe, telemetry=False)
    xt = x.clone().requires_grad_()
    y = layer(xt)
    y.backward(dy)
    for key, got in (("y", y.detach()), ("dx", xt.grad), ("dw", layer.weight.grad)):
        want = recording[f"linear/{name}/{key}"]
        assert np.array_equal(got.numpy().view(np.uint32), want.view(np.uint32)), (name, key)
