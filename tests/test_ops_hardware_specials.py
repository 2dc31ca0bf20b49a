"""Tensor-core models of lpsim.ops.matmul: NaN and inf as IEEE 754, and the keywords and
stats that the models take (out_fmt, out_rounding, stats, the result container)."""

import numpy as np
import pytest

import lpsim
from lpsim.ops import hardware as hw
from lpsim.ops.hardware import HARDWARE_MODELS, TensorCoreModel

inf, nan = np.inf, np.nan
NAMES = list(HARDWARE_MODELS)


def finite_operands():
    rng = np.random.default_rng(5)
    a = (rng.standard_normal((4, 64)) * 4).astype(np.float32)
    b = rng.standard_normal((64, 3)).astype(np.float32)
    return a, b


def same(got, want):
    """Equal bit for bit: NaN where NaN, infinities with their signs, the rest equal."""
    got, want = np.asarray(got), np.asarray(want)
    return got.shape == want.shape and np.array_equal(got, want, equal_nan=True)


@pytest.mark.parametrize("name", NAMES)
def test_nan_inputs_give_nan_and_leave_other_outputs_alone(name):
    a, b = finite_operands()
    want = lpsim.ops.matmul(a, b, model=name)
    a[1, 40] = nan
    b[3, 2] = nan
    got = lpsim.ops.matmul(a, b, model=name)
    expect = want.copy()
    expect[1, :] = nan
    expect[:, 2] = nan
    assert same(got, expect)


@pytest.mark.parametrize("name", ["hopper-fp8", "hopper-fp8-promote128"])
def test_inf_is_nan_in_e4m3fn_inputs(name):
    # e4m3fn holds no inf: the hardware's FP8 operand is NaN, so is the output
    a = np.array([[1, 2, 3, 4], [inf, 1, 1, 1], [1, -inf, 1, 1]], np.float32)
    b = np.ones((4, 1), np.float32)
    assert same(lpsim.ops.matmul(a, b, model=name), [[10.0], [nan], [nan]])


@pytest.mark.parametrize("name", ["hopper-fp8", "hopper-fp8-promote128"])
def test_inf_products_of_e5m2_inputs(name):
    a = np.array([[1, 2, 3, 4], [inf, 1, 1, 1], [-inf, 2, 1, 1], [inf, -inf, 1, 1],
                  [inf, 0, 1, 1], [nan, 1, 1, 1]], np.float32)
    b = np.ones((4, 1), np.float32)
    got = lpsim.ops.matmul(a, b, model=name, in_fmt="e5m2")
    assert same(got, [[10.0], [inf], [-inf], [nan], [inf], [nan]])
    b[0, 0] = 0.0                                       # inf * 0
    got = lpsim.ops.matmul(a, b, model=name, in_fmt="e5m2")
    assert same(got, [[9.0], [nan], [nan], [nan], [nan], [nan]])


@pytest.mark.parametrize("promote", [None, 4])
def test_inf_stays_across_chunks_and_promotions(promote):
    model = TensorCoreModel("e5m2", 2, 14, promote)
    k = 8
    a = np.ones((5, k), np.float32)
    a[0, 1] = inf                   # first chunk, finite chunks after it
    a[1, 6] = -inf                  # last chunk, after finite partial sums
    a[2, 1], a[2, 6] = inf, -inf    # +inf and -inf in different chunks and intervals
    a[3, 1], a[3, 6] = inf, inf
    a[4, 3] = 2.0 ** 15             # finite, far above the other terms
    b = np.ones((k, 1), np.float32)
    got = lpsim.ops.matmul(a, b, model=model)
    # row 4: chunks (1, 1), (1, 2**15), (1, 1), (1, 1).  Next to 2**15, 14 bits keep units
    # of 4: the partial sum 2 and the ones are truncated away.  Promoting every 4 products,
    # the second interval starts from 0 and sums its four ones to 4 before the FP32 add
    last = 2.0 ** 15 if promote is None else 2.0 ** 15 + 4
    assert same(got, [[inf], [-inf], [nan], [inf], [last]])


@pytest.mark.parametrize("name", ["mxfp8-fp32", "nvfp4-fp32"])
def test_a_block_with_inf_is_nan(name):
    # MX and NVFP4 give a block holding inf or NaN a NaN scale: every product of it is NaN
    a, b = finite_operands()
    want = lpsim.ops.matmul(a, b, model=name)
    a[2, 5] = inf
    got = lpsim.ops.matmul(a, b, model=name)
    expect = want.copy()
    expect[2, :] = nan
    assert same(got, expect)


@pytest.mark.parametrize("model", list(HARDWARE_MODELS.values()) + [
    TensorCoreModel("e5m2", 4, 5, 8), TensorCoreModel("bf16", 16, 24, 32,
                                                      partial_fmt="fp(8,13)")],
    ids=NAMES + ["e5m2-custom", "bf16-custom"])
def test_specials_equal_the_fraction_reference(model):
    rng = np.random.default_rng(11)
    a = rng.standard_normal((12, 40)).astype(np.float32)
    b = rng.standard_normal((40, 3)).astype(np.float32)
    specials = [inf, -inf, nan, 0.0]
    for row in range(1, 12):
        for col in rng.choice(40, size=rng.integers(1, 3), replace=False):
            a[row, col] = specials[rng.integers(4)]
    b[7, 1] = inf
    got = lpsim.ops.matmul(a, b, model=model)
    if isinstance(model.in_fmt, lpsim.blocks.BlockFormat):
        qa, qb = hw.block_inputs(a, b, model.in_fmt)
    else:
        qa, qb = lpsim.quantize(a, model.in_fmt), lpsim.quantize(b, model.in_fmt)
    want = hw.reference_matmul(qa, qb, model)
    assert same(got, want)
    assert np.isinf(got).any() == (model.in_fmt in (lpsim.formats.parse_format("e5m2"),
                                                    lpsim.formats.parse_format("bf16")))


@pytest.mark.parametrize("name", NAMES)
def test_out_fmt_and_out_rounding_round_the_accumulator(name):
    a, b = finite_operands()
    acc = lpsim.ops.matmul(a, b, model=name).astype(np.float64)
    for fmt, mode in (("e2m1fn", "nearest"), ("bf16", "up"), ("bf16", "toward_zero")):
        got = lpsim.ops.matmul(a, b, model=name, out_fmt=fmt, out_rounding=mode)
        assert got.dtype == np.float32
        assert np.array_equal(got, lpsim.quantize(acc, fmt, mode))
    assert not np.array_equal(lpsim.quantize(acc, "e2m1fn"), acc)
    # stochastic: counter o of (seed, stream + 2); inputs use stream and stream + 1
    got = lpsim.ops.matmul(a, b, model=name, out_fmt="bf16", out_rounding="stochastic",
                           seed=7, stream=3)
    assert np.array_equal(got, lpsim.quantize(acc, "bf16", "stochastic", seed=7, stream=5))


def test_result_container_is_numpys_result_type():
    a, b = finite_operands()
    f32 = lpsim.ops.matmul(a, b, model="hopper-fp8")
    assert f32.dtype == np.float32
    f64 = lpsim.ops.matmul(a.astype(np.float64), b, model="hopper-fp8")
    assert f64.dtype == np.float64 and np.array_equal(f32, f64)
    wide = lpsim.ops.matmul(a, b, model="hopper-fp8", out_fmt="fp(8,30)")
    assert wide.dtype == np.float64 and np.array_equal(wide, f64)
    assert lpsim.ops.matmul(a[0], b[:, 0], model="mxfp8-fp32").dtype == np.float32


@pytest.mark.parametrize("name, promotions", [("hopper-fp8", 0),
                                              ("hopper-fp8-promote128", 6)])
def test_stats_count_every_rounding(name, promotions):
    # inputs: 80 ones (exact) and 120 of 0.1 (inexact in e4m3fn); 2 x 3 outputs of K = 40:
    # 2 chunk partial sums each (chunk 32), one promotion each for the promoting model, and
    # the output rounding (exact: fp32 to fp32)
    a = np.ones((2, 40), np.float32)
    b = np.full((40, 3), 0.1, np.float32)
    stats = lpsim.RoundingStats()
    lpsim.ops.matmul(a, b, model=name, stats=stats)
    assert stats.as_dict() == dict(elements=200 + 12 + promotions + 6, inexact=120,
                                   overflow=0, underflow=0, subnormal=0, nan=0, inf=0)
    stats = lpsim.RoundingStats()
    lpsim.ops.matmul(a, b, model=name, out_fmt="e2m1fn", stats=stats)   # 4.0625 -> 4
    assert stats.as_dict() == dict(elements=200 + 12 + promotions + 6, inexact=126,
                                   overflow=0, underflow=0, subnormal=0, nan=0, inf=0)


def test_stats_count_nan_and_inf():
    a = np.array([[inf, 1.0], [nan, 1.0]], np.float32)
    b = np.ones((2, 1), np.float32)
    stats = lpsim.RoundingStats()
    got = lpsim.ops.matmul(a, b, model="hopper-fp8", in_fmt="e5m2", stats=stats)
    assert same(got, [[inf], [nan]])
    # inputs (6: one inf, one NaN), one partial sum per output, the outputs
    assert stats.as_dict() == dict(elements=10, inexact=0, overflow=0, underflow=0,
                                   subnormal=0, nan=3, inf=3)


@pytest.mark.parametrize("a, b, kw", [
    ([[1e200, -1e200]], [[1e200], [1e200]], dict(model="hopper-fp8", in_fmt="fp64")),
    ([[1e-300] * 4], [[1e-10]] * 4, dict(model=TensorCoreModel(
        in_fmt=None, chunk=4, partial_fmt="fp64", acc_fmt="fp64", out_fmt="fp64"))),
])
def test_operands_whose_float64_products_are_not_exact_are_refused(a, b, kw):
    """The models multiply in float64, exactly only for operands float32 holds: 1e200 *
    1e200 became inf (NaN for the pair, where the exact model gives 0) and 1e-300 * 1e-10
    a rounded subnormal."""
    with pytest.raises(ValueError, match=r"multiplies in float64, exactly for operands "
                                         r"float32 holds, and a"):
        lpsim.ops.matmul(np.array(a), np.array(b), **kw)


def test_a_chunk_of_tiny_products_is_aligned_without_leaving_float64s_range():
    """The alignment scaled by 2**-q, which overflowed to inf for q < -1023 and zeroed tiny
    chunks; float32 operands near its least subnormal give products near 2**-298."""
    model = TensorCoreModel(in_fmt=None, chunk=4, partial_fmt="fp64", acc_fmt="fp64",
                            out_fmt="fp64", align_bits=40)
    a = np.full((1, 4), 2.0 ** -149) * np.array([1, 3, 5, 7])
    b = np.full((4, 1), 2.0 ** -149)
    got = lpsim.ops.matmul(a, b, model=model)
    assert got[0, 0] == hw.reference_matmul(a, b, model)[0, 0] == 16 * 2.0 ** -298


@pytest.mark.parametrize("kw", [dict(model="hopper-fp8"), dict(model="hopper-wgmma-e4m3"),
                                dict(in_fmt="mxfp8_e4m3")])
def test_the_derived_streams_wrap_as_the_streams_do(kw):
    """stream + 1 and stream + 2 (b's and the output's) were refused past 2**64 - 1, naming
    a value the caller never passed."""
    a, b = np.ones((2, 32), np.float32), np.ones((32, 2), np.float32)
    assert lpsim.ops.matmul(a, b, stream=2 ** 64 - 1, **kw)[0, 0] == 32
    with pytest.raises(ValueError, match=r"stream=18446744073709551616 is out of range"):
        lpsim.ops.matmul(a, b, stream=2 ** 64, **kw)
