"""Tensor-core accumulation models and block-scaled GEMM inputs in lpsim.ops.matmul.

Every model is checked step by step against lpsim.ops.hardware.reference_matmul (Fractions
via lpsim.reference) on random, cancelling and wide-range data; a hand-worked case pins the
alignment rule; the Hopper model is compared with torch._scaled_mm on a real GPU
(LPSIM_TEST_GPU=1 only).
"""

import os

import numpy as np
import pytest

import lpsim
from lpsim.blocks import BlockFormat
from lpsim.ops import hardware as hw
from lpsim.ops.hardware import HARDWARE_MODELS, TensorCoreModel

CUSTOM = [TensorCoreModel("e4m3fn", 4, 5, 8), TensorCoreModel("e5m2", 8, 3, None),
          TensorCoreModel("bf16", 16, 24, 32, partial_fmt="fp(8,13)", out_fmt="bf16",
                          out_rounding="toward_zero"),
          TensorCoreModel(lpsim.blocks.block("e2m1fn", 8, "e8m0fnu", "rceil"), 8, 10, 16)]


def operands(k, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((3, k)) * 2.0 ** rng.integers(-8, 8, (3, k))
    b = rng.standard_normal((k, 2))
    a[1] = np.abs(a[1])                      # all-positive row against
    b[:, 1] = np.where(np.arange(k) % 2, 1.0, -1.0) * np.abs(b[:, 1])   # alternating signs
    a[2, : k // 2] = 0.0
    return a.astype(np.float32), b.astype(np.float32)


def exact_inputs(a, b, model):
    if isinstance(model.in_fmt, BlockFormat):
        return hw.block_inputs(a, b, model.in_fmt)
    return lpsim.quantize(a, model.in_fmt), lpsim.quantize(b, model.in_fmt)


@pytest.mark.parametrize("k", [1, 37, 200])
@pytest.mark.parametrize("model", list(HARDWARE_MODELS.values()) + CUSTOM,
                         ids=list(HARDWARE_MODELS) + [f"custom{i}" for i in range(len(CUSTOM))])
def test_models_equal_the_fraction_reference_step_by_step(model, k):
    a, b = operands(k, seed=k)
    got = lpsim.ops.matmul(a, b, model=model)
    want = hw.reference_matmul(*exact_inputs(a, b, model), model)
    assert np.array_equal(got, want), np.argwhere(got != want)[:3]


def test_named_models_are_reachable_by_name():
    a, b = operands(64, seed=1)
    assert np.array_equal(lpsim.ops.matmul(a, b, model="hopper-fp8"),
                          hw.tc_matmul(a, b, HARDWARE_MODELS["hopper-fp8"]))
    v = lpsim.ops.matmul(a[0], b[:, 0], model="hopper-fp8-promote128")
    assert v.shape == () or np.ndim(v) == 0


def test_alignment_truncates_below_the_largest_term():
    # terms 1 and 3/16 + 2**-10: with 3 bits kept from 2**0 the unit is 2**-2, so 3/16 + ...
    # truncates to 0 and the chunk sums to 1; with 5 bits the unit is 2**-4: 1 + 3/16
    a = np.array([[1.0, 3 / 16 + 2.0 ** -10]], np.float32)
    b = np.array([[1.0], [1.0]], np.float32)
    assert lpsim.ops.matmul(a, b, model=TensorCoreModel(None, 2, 3))[0, 0] == 1.0
    assert lpsim.ops.matmul(a, b, model=TensorCoreModel(None, 2, 5))[0, 0] == 1 + 3 / 16
    # the partial sum joins the next chunk's alignment: 1 (chunk 1) then 2**-3 is kept with
    # 4 bits (unit 2**-3), but with 3 bits it is truncated away
    a2 = np.array([[1.0, 2.0 ** -3]], np.float32)
    assert lpsim.ops.matmul(a2, b, model=TensorCoreModel(None, 1, 4))[0, 0] == 1.125
    assert lpsim.ops.matmul(a2, b, model=TensorCoreModel(None, 1, 3))[0, 0] == 1.0
    # promotion: every chunk goes to an FP32 accumulator, so nothing is truncated away
    assert lpsim.ops.matmul(a2, b, model=TensorCoreModel(None, 1, 3, 1))[0, 0] == 1.125


def test_block_in_fmt_quantizes_along_k_then_uses_the_model():
    a, b = operands(96, seed=2)
    got = lpsim.ops.matmul(a, b, in_fmt="mxfp8_e4m3", model="fp32", order="sequential")
    aq = lpsim.quantize(a, "mxfp8_e4m3", axis=-1)
    bq = np.ascontiguousarray(lpsim.quantize(b, "mxfp8_e4m3", axis=0))   # a transposed view
    assert np.array_equal(got, lpsim.ops.matmul(aq, bq, model="fp32", order="sequential"))


@pytest.mark.parametrize("kwargs, words", [
    ({"chunk": 0}, "chunk=0"), ({"align_bits": 60}, "align_bits=60"),
    ({"chunk": 32, "promote": 48}, "promote=48.*multiple of chunk=32"),
    ({"out_rounding": "nearest_even"}, "unknown rounding"),
    ({"in_fmt": "mxfp3"}, "unknown format"),
])
def test_bad_models_name_the_value(kwargs, words):
    with pytest.raises(ValueError, match=words):
        TensorCoreModel(**kwargs)


def test_shape_errors():
    with pytest.raises(ValueError, match=r"shapes \(2, 3\) and \(4, 1\)"):
        lpsim.ops.matmul(np.zeros((2, 3), np.float32), np.zeros((4, 1), np.float32),
                         model="hopper-fp8")


@pytest.mark.skipif(os.environ.get("LPSIM_TEST_GPU") != "1",
                    reason="compares with torch._scaled_mm on an H100/H200: needs a GPU "
                           "(run with LPSIM_TEST_GPU=1)")
@pytest.mark.parametrize("k", [16, 64, 256, 1024, 4096])
def test_hopper_model_equals_torch_scaled_mm(k):
    import torch
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.fail("LPSIM_TEST_GPU=1 but no sm_90+ GPU (torch._scaled_mm FP8) is visible")
    rng = np.random.default_rng(k)
    a = lpsim.quantize(rng.standard_normal((64, k)).astype(np.float32), "e4m3fn")
    b = lpsim.quantize(rng.standard_normal((k, 32)).astype(np.float32), "e4m3fn")
    ta = torch.from_numpy(a).cuda().to(torch.float8_e4m3fn)
    tb = torch.from_numpy(b).cuda().to(torch.float8_e4m3fn).t().contiguous().t()
    one = torch.ones((), device="cuda")
    got = torch._scaled_mm(ta, tb, scale_a=one, scale_b=one, out_dtype=torch.float32)
    want = lpsim.ops.matmul(a, b, model="hopper-fp8")
    assert np.array_equal(got.cpu().numpy().astype(np.float64), want)
