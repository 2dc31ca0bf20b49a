"""Tensor-core accumulation models and block-scaled GEMM inputs in lpsim.ops.matmul.

Every model is checked step by step against lpsim.ops.hardware.reference_matmul (Fractions
via lpsim.reference) on random, cancelling and wide-range data; a hand-worked case pins the
alignment rule; the Hopper models are replayed against torch._scaled_mm's outputs recorded on
an H100 (tests/data), and that recording against the GPU at hand (LPSIM_TEST_GPU=1 only).
"""

import os
import pathlib

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


RECORDING = pathlib.Path(__file__).parent / "data" / "tensor-cores-h100.npz"
#: outputs (of 1024 per case) that each model reproduces bit for bit in the H100 recording
#: (benchmarks/probe_tensor_cores.py, 2026-11-23): the models are approximations; a model
#: change that moves these numbers must update them and lpsim.ops.hardware's docstring
AGREEMENT = {
    "hopper-fp8": dict(zip(
        ["normal-k16", "normal-k32", "normal-k48", "normal-k64", "normal-k128", "normal-k256",
         "normal-k1024", "normal-k4096", "wide-k32", "cancel-k32", "wide-k128", "cancel-k128",
         "wide-k512", "cancel-k512", "big-then-small-k32", "big-then-small-k64",
         "big-then-small-k256"],
        [801, 700, 775, 744, 770, 808, 829, 870, 620, 851, 584, 765, 600, 742, 1024, 984,
         1024])),
}
AGREEMENT["hopper-fp8-promote128"] = dict(AGREEMENT["hopper-fp8"], **{
    "normal-k256": 552, "normal-k1024": 165, "normal-k4096": 34, "wide-k512": 182,
    "cancel-k512": 303, "big-then-small-k256": 997})
#: torch._scaled_mm's use_fast_accum that each model stands for
FAST_ACCUM = {"hopper-fp8": 1, "hopper-fp8-promote128": 0}


def recorded(data, key):
    import ml_dtypes
    return data[key].view(ml_dtypes.float8_e4m3fn).astype(np.float32)


@pytest.mark.parametrize("name", list(AGREEMENT))
def test_hopper_models_against_an_h100_recording(name):
    """What torch._scaled_mm returned on an H100, replayed: per case, the number of outputs
    the model reproduces exactly is pinned, and every output lies within 6 units of the
    model's kept bit (2**(E - 13), E the exponent of the largest product) per 32-product
    chunk of it: the envelope observed, not a proven bound."""
    data = np.load(RECORDING)
    assert str(data["device"]).startswith("NVIDIA H100")
    for case in data["cases"]:
        a, b = recorded(data, f"{case}/a"), recorded(data, f"{case}/b")
        hardware = data[f"{case}/fp8-fast{FAST_ACCUM[name]}"].astype(np.float64)
        model = lpsim.ops.matmul(a, b, model=name)
        assert int(np.sum(hardware == model)) == AGREEMENT[name][str(case)], case
        top = np.max(np.abs(a.astype(np.float64))[:, :, None] * np.abs(b)[None], axis=1)
        unit = np.exp2(np.floor(np.log2(top)) - 13)
        assert np.all(np.abs(hardware - model) <= 6 * unit * -(-a.shape[1] // 32)), case


@pytest.mark.skipif(os.environ.get("LPSIM_TEST_GPU") != "1",
                    reason="replays torch._scaled_mm on an H100/H200: needs a GPU "
                           "(run with LPSIM_TEST_GPU=1)")
def test_the_h100_recording_is_what_this_gpu_returns():
    """The recording above is reproducible: torch._scaled_mm on this GPU gives its bits."""
    import torch
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.fail("LPSIM_TEST_GPU=1 but no sm_90+ GPU (torch._scaled_mm FP8) is visible")
    data = np.load(RECORDING)
    one = torch.ones((), device="cuda")
    for case in data["cases"]:
        ta = torch.from_numpy(recorded(data, f"{case}/a")).cuda().to(torch.float8_e4m3fn)
        tb = torch.from_numpy(recorded(data, f"{case}/b")).cuda().to(torch.float8_e4m3fn)
        tb = tb.t().contiguous().t()
        for fast in (0, 1):
            got = torch._scaled_mm(ta, tb, scale_a=one, scale_b=one, out_dtype=torch.float32,
                                   use_fast_accum=bool(fast)).cpu().numpy()
            assert np.array_equal(got.view(np.int32),
                                  data[f"{case}/fp8-fast{fast}"].view(np.int32)), (case, fast)


@pytest.mark.skipif(os.environ.get("LPSIM_TEST_GPU") != "1",
                    reason="runs torch._scaled_mm on an H100/H200: needs a GPU "
                           "(run with LPSIM_TEST_GPU=1)")
@pytest.mark.parametrize("seed", [20261127, 7])
def test_fresh_inputs_on_this_gpu_equal_the_model(seed):
    """The recording's 17 input families drawn with seeds it was not recorded with (the
    probe's own generator): torch._scaled_mm on this GPU, both ``use_fast_accum`` settings,
    equals ``ops.wgmma_matmul`` code for code."""
    import importlib.util

    import torch

    from lpsim.ops import wgmma_matmul
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.fail("LPSIM_TEST_GPU=1 but no sm_90+ GPU (torch._scaled_mm FP8) is visible")
    spec = importlib.util.spec_from_file_location(
        "probe_tensor_cores", pathlib.Path(__file__).parent.parent / "benchmarks"
        / "probe_tensor_cores.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    one = torch.ones((), device="cuda")
    for name, a, b in probe.cases(np.random.default_rng(seed)):
        a8 = torch.from_numpy(a).to(torch.float8_e4m3fn)
        b8 = torch.from_numpy(b).to(torch.float8_e4m3fn)
        ta, tb = a8.cuda(), b8.cuda().t().contiguous().t()
        for fast, promote in ((False, 128), (True, None)):
            want = torch._scaled_mm(ta, tb, scale_a=one, scale_b=one, out_dtype=torch.float32,
                                    use_fast_accum=fast).cpu()
            got = wgmma_matmul(a8, b8, promote=promote)
            same = (got.view(torch.int32) == want.view(torch.int32)) | (got.isnan()
                                                                         & want.isnan())
            assert bool(same.all()), \
                f"seed {seed}, {name}, fast={fast}: {int((~same).sum())} of {want.numel()} differ"


@pytest.mark.parametrize("in_fmt", ["mxfp8_e4m3", "nvfp4"])
def test_a_batched_block_matmul_blocks_b_along_k(in_fmt):
    # b's K is its second to last axis when batched (numpy.matmul's layout); its rows span
    # binades, so blocks down the batch axis would differ from blocks along K
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2, 3, 32)).astype(np.float32)
    b = (rng.standard_normal((2, 32, 4)) * np.exp2(np.arange(32))[None, :, None] / 2 ** 16
         ).astype(np.float32)
    got = lpsim.ops.matmul(a, b, in_fmt=in_fmt, model="fp32")
    by_hand = lpsim.ops.matmul(lpsim.quantize(a, in_fmt, axis=-1),
                               lpsim.quantize(b, in_fmt, axis=-2), model="fp32")
    assert np.array_equal(got.view(np.uint32), by_hand.view(np.uint32))
    if in_fmt == "mxfp8_e4m3":      # no tensor scale: each slice's own product too
        each = np.stack([lpsim.ops.matmul(a[i], b[i], in_fmt=in_fmt, model="fp32")
                         for i in range(2)])
        assert np.array_equal(got.view(np.uint32), each.view(np.uint32))
        vector = lpsim.ops.matmul(a[0], b[0, :, 1], in_fmt=in_fmt, model="fp32")
        assert np.array_equal(vector.view(np.uint32), each[0, :, 1].view(np.uint32))
