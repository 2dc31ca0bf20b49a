"""lpsim_cuda.blocks against the CPU kernel: the same values, scales and counters, bit for bit.

Runs under NUMBA_ENABLE_CUDASIM=1 (conftest) on a few blocks; with LPSIM_TEST_GPU=1 on a GPU
machine the same tests run on the device.
"""

import numpy as np
import pytest
from numba import cuda

import lpsim
import lpsim_cuda.blocks
from lpsim.blocks import BlockStats, block

from test_blocks import block_data, same

CASES = [("mxfp4", "nearest", None), ("mxfp4", "stochastic", None), ("nvfp4", "stochastic", 5),
         ("mxfp8_e4m3", "toward_zero", None), (block("e3m2fn", 8, "e8m0fnu", "rceil"), "up", None),
         ("mxint8", "nearest_away", None)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: d.__name__)
@pytest.mark.parametrize("bfmt, rounding, sr_bits", CASES, ids=lambda c: str(c))
def test_cuda_blocks_equal_the_cpu_kernel(bfmt, rounding, sr_bits, dtype):
    x = block_data(3, 48, seed=11, dtype=dtype, lo=-6, hi=6)
    x[2, :8] = [np.nan, 1.0, -np.inf, 3.0, 0.0, -0.0, 2.0, 1e-3]
    kw = dict(seed=77, stream=2, offset=3, sr_bits=sr_bits)
    want = lpsim.blocks.quantize_blocks(x, bfmt, rounding, **kw)
    got, shape = lpsim_cuda.blocks.quantize_blocks(cuda.to_device(x), bfmt, rounding, **kw)
    assert shape == x.shape
    assert same(got.values.copy_to_host(), want.values)
    assert same(got.elements.copy_to_host(), want.elements)
    assert same(got.scales.copy_to_host(), want.scales)
    assert np.array_equal(got.counts, want.counts)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: d.__name__)
def test_cuda_tensor_amax_is_the_cpu_pass(dtype):
    """NVFP4's per-tensor largest finite magnitude is found on the device (8 bytes come
    back, not the tensor): the CPU pass's value with NaN, inf, the largest finite value
    negated, subnormals only, and nothing finite at all."""
    info = np.finfo(dtype)
    cases = [block_data(2, 40, seed=3, dtype=dtype),
             np.array([np.nan, -np.inf, 1.5, -info.max, np.inf, 0.0], dtype),
             np.array([info.smallest_subnormal * 3, -info.smallest_subnormal, -0.0], dtype),
             np.array([np.nan, np.inf, -np.inf], dtype), np.zeros(0, dtype)]
    tail = np.linspace(-1, 1, 203).astype(dtype)
    tail[-1] = 7.0                                  # the largest in the n % 4 tail
    cases.append(tail)
    for x in cases:
        want = lpsim.blocks.finite_amax(x.reshape(-1)) if x.size else 0.0
        got = lpsim_cuda.blocks.tensor_amax(cuda.to_device(x))
        assert got == want and type(got) is float, (x, got, want)
        # float32 data off a 16-byte boundary takes the element-wise kernel
        shifted = cuda.to_device(np.concatenate([np.zeros(1, dtype), x.reshape(-1)]))[1:]
        assert lpsim_cuda.blocks.tensor_amax(shifted) == want


def test_cuda_tensor_scales_are_checked_as_on_the_cpu():
    """A given per-tensor scale is rounded to float32 and checked as the CPU path does."""
    x = block_data(2, 32, seed=14)
    got, _ = lpsim_cuda.blocks.quantize_blocks(cuda.to_device(x), "nvfp4", tensor_scale=0.1)
    want = lpsim.blocks.quantize_blocks(x, "nvfp4", tensor_scale=0.1)
    assert got.tensor_scale == want.tensor_scale == float(np.float32(0.1))
    assert same(got.values.copy_to_host(), want.values)
    with pytest.raises(ValueError, match="tensor_scale=0.0 must be a float32 from"):
        lpsim_cuda.blocks.quantize_blocks(cuda.to_device(x), "nvfp4", tensor_scale=0.0)


def test_a_cuda_tensor_scale_past_float32_saturates_as_on_the_cpu():
    """The device's scale kernel shares the host's decision (scale_of_amax32): saturated at
    float32's largest, not inf (which made every value NaN)."""
    bfmt = lpsim.blocks.BlockFormat(element=lpsim.fp(2, 0, 0), block=4,
                                    scale=lpsim.fp(2, 1, 148), rule="floor", tensor_scale=True)
    x = block_data(2, 8, seed=15)
    got, _ = lpsim_cuda.blocks.quantize_blocks(cuda.to_device(x), bfmt)
    want = lpsim.blocks.quantize_blocks(x, bfmt)
    assert got.tensor_scale == want.tensor_scale == float(np.finfo(np.float32).max)
    assert same(got.values.copy_to_host(), want.values) and np.isfinite(want.values).all()


@pytest.mark.parametrize("bfmt", ["mxfp4", "nvfp4"])
def test_cuda_values_without_counters_equal_the_counted_ones(bfmt):
    """stats=None skips the per-block counters (want_counts=False): same values and scales,
    NaN blocks included, and no counts."""
    x = block_data(3, 48, seed=13, lo=-6, hi=6)
    x[1, 3] = np.nan
    kw = dict(seed=9, stream=1, offset=5)
    counted, _ = lpsim_cuda.blocks.quantize_blocks(cuda.to_device(x), bfmt, "stochastic", **kw)
    plain, _ = lpsim_cuda.blocks.quantize_blocks(cuda.to_device(x), bfmt, "stochastic",
                                                 want_counts=False, **kw)
    assert plain.counts is None
    assert same(plain.values.copy_to_host(), counted.values.copy_to_host())
    assert same(plain.scales.copy_to_host(), counted.scales.copy_to_host())
    assert same(lpsim.quantize(cuda.to_device(x), bfmt, "stochastic", **kw).copy_to_host(),
                counted.values.copy_to_host())


def test_cuda_quantize_counts_into_stats():
    x = block_data(2, 32, seed=12)
    cpu, gpu = BlockStats(), BlockStats()
    want = lpsim.quantize(x, "mxfp4", "stochastic", seed=5, stats=cpu)
    got = lpsim.quantize(cuda.to_device(x), "mxfp4", "stochastic", seed=5, stats=gpu)
    assert same(got.copy_to_host(), want) and cpu == gpu and gpu.blocks == 2
    with pytest.raises(ValueError, match="axis=0"):
        lpsim_cuda.blocks.quantize(cuda.to_device(x), "mxfp4", axis=0)


def test_cuda_quantize_refuses_a_stats_by_name():
    """A stats that is not a RoundingStats: a TypeError naming it (AttributeError before)."""
    import lpsim_cuda
    x = cuda.to_device(np.ones(32, np.float32))
    with pytest.raises(TypeError, match="stats=3 is a int"):
        lpsim_cuda.quantize(x, "bf16", stats=3)
    with pytest.raises(TypeError, match="stats=3 is a int"):
        lpsim_cuda.blocks.quantize(x, "mxfp4", stats=3)


def rounds_as_on_the_cpu(x, bfmt, rounding):
    """lpsim_cuda.blocks.quantize of x's device copy is the CPU path's result: the same
    values, shape, dtype and counters, through lpsim.quantize and into out= too."""
    kw = dict(seed=7, stream=1, offset=3)
    cpu, gpu = BlockStats(), BlockStats()
    want = lpsim.blocks.quantize(x, bfmt, rounding, stats=cpu, **kw)
    got = lpsim_cuda.blocks.quantize(cuda.to_device(x), bfmt, rounding, stats=gpu, **kw)
    host = got.copy_to_host()
    assert host.shape == want.shape == x.shape and host.dtype == want.dtype, x
    assert same(host, want) and cpu == gpu, (x, host, want)
    routed = lpsim.quantize(cuda.to_device(x), bfmt, rounding, **kw)
    assert same(routed.copy_to_host(), want) and routed.shape == x.shape
    out = cuda.to_device(np.full(x.shape, 5.0, x.dtype))
    assert lpsim_cuda.blocks.quantize(cuda.to_device(x), bfmt, rounding, out=out, **kw) is out
    assert same(out.copy_to_host(), want)


BLOCK_CASES = pytest.mark.parametrize("bfmt, rounding", [
    (bfmt, rounding) for bfmt in ("mxfp8_e4m3", "mxfp4", "nvfp4")
    for rounding in ("nearest", "stochastic")])
DTYPES = pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: d.__name__)


@DTYPES
@BLOCK_CASES
def test_cuda_zero_d_arrays_round_as_on_the_cpu(bfmt, rounding, dtype):
    """A 0-d array is one block of one, as on the CPU (an IndexError before): a value, a
    signed zero, a NaN block (each simulated launch takes a fraction of a second)."""
    for value in [2.7, -0.0, np.nan]:
        rounds_as_on_the_cpu(np.array(value, dtype), bfmt, rounding)


@DTYPES
@BLOCK_CASES
def test_cuda_empty_arrays_round_as_on_the_cpu(bfmt, rounding, dtype):
    """An empty array rounds to an empty array of its shape, as on the CPU (a
    ZeroDivisionError before where the last axis is empty)."""
    for shape in [(0,), (3, 0), (0, 40), (2, 0, 5)]:
        rounds_as_on_the_cpu(np.zeros(shape, dtype), bfmt, rounding)


def test_cuda_blocks_refuse_host_arrays_by_name():
    """A numpy x or out: lpsim_cuda.quantize's TypeError naming it and the kinds accepted
    (numba's AttributeError from inside before), and out's dtype and shape checked as
    lpsim_cuda.quantize checks them, before anything is written."""
    x = np.ones(32, np.float32)
    accepted = "numpy array in host memory; lpsim_cuda takes torch CUDA tensors, CuPy arrays"
    with pytest.raises(TypeError, match=f"x is a {accepted}"):
        lpsim_cuda.blocks.quantize(x, "mxfp4")
    with pytest.raises(TypeError, match=f"x is a {accepted}"):
        lpsim_cuda.blocks.quantize_blocks(x, "mxfp4")
    with pytest.raises(TypeError, match=f"out is a {accepted}"):
        lpsim_cuda.blocks.quantize(cuda.to_device(x), "mxfp4", out=np.empty_like(x))
    with pytest.raises(TypeError, match=f"x is a {accepted}"):
        lpsim_cuda.blocks.quantize(x, "mxfp4", out=cuda.to_device(x))
    with pytest.raises(TypeError, match="x has dtype int32; accepted: float32, float64"):
        lpsim_cuda.blocks.quantize(cuda.to_device(np.ones(32, np.int32)), "mxfp4")
    out = cuda.to_device(np.full(32, 5.0))
    with pytest.raises(ValueError, match="out has dtype float64; it must be x's float32"):
        lpsim_cuda.blocks.quantize(cuda.to_device(x), "mxfp4", out=out)
    with pytest.raises(ValueError, match=r"out must have shape \(32,\), got \(4, 8\)"):
        lpsim_cuda.blocks.quantize(cuda.to_device(x), "mxfp4",
                                   out=cuda.to_device(np.zeros((4, 8), np.float32)))
    assert (out.copy_to_host() == 5.0).all()


@pytest.mark.parametrize("shape, axis", [((32,), 1), ((32,), 5), ((32,), -2), ((1, 32), 2),
                                         ((1, 32), 1.0), ((1, 32), None), ((1, 32), True)])
def test_a_bad_axis_gets_the_cpus_error(shape, axis):
    """Every path refuses an axis the array lacks, or one that is no integer, with the CPU's
    error (the CUDA path took any axis of a 1-D array as its last)."""
    x = np.linspace(-2, 2, 32, dtype=np.float32).reshape(shape)
    with pytest.raises((TypeError, ValueError)) as cpu:
        lpsim.quantize(x, "mxfp4", axis=axis)
    for call in (lpsim.quantize, lpsim_cuda.blocks.quantize):
        with pytest.raises(cpu.type, match=str(cpu.value).replace("(", r"\(").replace(")", r"\)")):
            call(cuda.to_device(x), "mxfp4", axis=axis)
    with pytest.raises(cpu.type):
        lpsim_cuda.blocks.quantize_blocks(cuda.to_device(x), "mxfp4", axis=axis)


def test_a_wrong_out_is_named_without_an_element_format_hint():
    """A block format's out of the wrong dtype is refused by name, with nothing written and
    no hint at storage=, which block formats do not take."""
    x = cuda.to_device(np.linspace(-2, 2, 64, dtype=np.float32))
    out = cuda.to_device(np.full(64, 7.0))
    with pytest.raises(ValueError, match=r"out has dtype float64; it must be x's float32$"):
        lpsim.quantize(x, "mxfp8_e4m3", out=out)
    assert np.all(out.copy_to_host() == 7.0)
