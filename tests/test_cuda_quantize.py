"""lpsim_cuda against the CPU simulator: bit-identical outputs and counters, and its errors.

Runs under NUMBA_ENABLE_CUDASIM=1 (set by conftest) on small arrays of every format's edge
cases; with LPSIM_TEST_GPU=1 on a GPU machine the same tests run on the device (and
test_cuda_gpu.py adds torch, stream, graph and 2**24-element checks).
"""

import ml_dtypes
import numpy as np
import pytest
import torch
from numba import cuda

import lpsim
import lpsim_cuda
from lpsim.rounding import MODES
from lpsim.storage import pack

FORMATS = ["bf16", "e4m3fn", "fp(4,3,4)", "e5m2"]
#: the special-value policies crossed with every mode (ieee with subnormals: FORMATS)
POLICIES = {
    "saturate": dict(specials="saturate"),
    "fn": dict(specials="fn"),
    "fn-saturate": dict(specials="fn", saturate=True),
    "no-subnormals": dict(subnormals=False),
}


def edge_cases(fmt, dtype):
    """Ties, subnormals, overflow (its tie included), NaN, inf and +-0 of ``fmt`` in ``dtype``,
    and the container's neighbours of each on both sides."""
    fmt = lpsim.parse_format(fmt)
    ulp_min = fmt.min_subnormal
    top_quantum = 2.0 ** (fmt.emax - fmt.m)
    values = [0.0, fmt.min_normal, ulp_min, 1.5 * ulp_min, 0.5 * ulp_min, 0.25 * ulp_min,
              fmt.max_finite, fmt.max_finite + top_quantum / 2,    # the overflow tie
              fmt.max_finite + top_quantum / 4, fmt.max_finite * (1 + fmt.epsilon),
              2 * fmt.max_finite, np.inf, np.nan,
              1 + fmt.epsilon / 2, 1 + 1.5 * fmt.epsilon, 1 + fmt.epsilon / 3,
              fmt.min_normal * (1 - fmt.epsilon / 2), 3.0, 0.1]
    with np.errstate(over="ignore"):
        finite = np.array(values, dtype=np.float64).astype(dtype)
    both = np.concatenate([finite, -finite])
    return np.concatenate([both, np.nextafter(both, np.inf, dtype=dtype),
                           np.nextafter(both, -np.inf, dtype=dtype)])


def check_same(x, fmt, rounding, **kw):
    """lpsim_cuda on a device copy of x equals lpsim.quantize bit for bit, counters too."""
    cpu_stats, gpu_stats = lpsim.RoundingStats(), lpsim.RoundingStats()
    expected = lpsim.quantize(x, fmt, rounding, stats=cpu_stats, **kw)
    got = lpsim_cuda.quantize(cuda.to_device(x), fmt, rounding, stats=gpu_stats,
                              **kw).copy_to_host()
    bits = np.int32 if x.dtype == np.float32 else np.int64
    mismatch = np.flatnonzero(expected.view(bits) != got.view(bits))
    assert mismatch.size == 0, (fmt, rounding, x[mismatch[:5]], expected[mismatch[:5]],
                                got[mismatch[:5]])
    assert cpu_stats == gpu_stats, (fmt, rounding, cpu_stats, gpu_stats)


def test_edge_cases_hold_the_overflow_tie_and_its_neighbours():
    fmt = lpsim.parse_format("e4m3fn")
    x = edge_cases(fmt, np.float32)
    tie = np.float32(fmt.max_finite + 2.0 ** (fmt.emax - fmt.m - 1))
    assert tie == 464 and {tie, np.nextafter(tie, np.float32(np.inf)),
                           np.nextafter(tie, np.float32(0))} <= set(x.tolist())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rounding", list(MODES))
def test_every_mode_matches_cpu(rounding, dtype):
    x = np.concatenate([edge_cases(f, dtype) for f in FORMATS])
    for fmt in FORMATS:
        kw = {"seed": 7, "stream": 3} if rounding.startswith("stochastic") else {}
        check_same(x, fmt, rounding, **kw)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("rounding", list(MODES))
def test_policies_match_cpu_in_every_mode(rounding, policy, dtype):
    fmt = lpsim.fp(4, 3, 2, **POLICIES[policy])
    kw = {"seed": 11} if rounding.startswith("stochastic") else {}
    if rounding == "stochastic":
        kw["sr_bits"] = 5
    check_same(edge_cases(fmt, dtype), fmt, rounding, **kw)


def test_offset_and_in_place_match_cpu():
    x = edge_cases("bf16", np.float32)
    expected = lpsim.quantize(x, "bf16", "stochastic", seed=5, offset=13)
    device = cuda.to_device(x)
    lpsim_cuda.quantize(device, "bf16", "stochastic", seed=5, offset=13, out=device)
    assert np.array_equal(device.copy_to_host().view(np.int32), expected.view(np.int32))


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("fmt", ["bf16", "e4m3fn", "fp(4,3,4)"])
def test_out_overlapping_x_rounds_as_if_x_were_copied_first(fmt, rounding):
    """out a shifted view of x's own memory (either way, by one element or a quad) and
    codes packed into x's own bytes: the bits of rounding a copy of x, as on the CPU (the
    kernels would overwrite values other threads had not read)."""
    base = (np.random.default_rng(1).standard_normal(300) * 10).astype(np.float32)
    for shift in (1, 4, -1, -4):
        lo, hi = (shift, 0) if shift > 0 else (0, -shift)
        n = base.size - abs(shift)
        want = lpsim.quantize(base[lo:lo + n].copy(), fmt, rounding, seed=3)
        d = cuda.to_device(base)
        lpsim.quantize(d[lo:lo + n], fmt, rounding, seed=3, out=d[hi:hi + n])
        got = d.copy_to_host()[hi:hi + n]
        assert np.array_equal(got.view(np.int32), want.view(np.int32)), (shift, fmt)
    if fmt == "bf16":                  # bfloat16 codes packed over x's first or middle bytes
        want = pack(lpsim.quantize(base[:128], fmt, rounding, seed=3), "bfloat16", fmt)
        for start in (0, 4, 64):
            d = cuda.to_device(base[:256])
            out = d.view(np.int16)[start:start + 128]
            lpsim_cuda.quantize(d[:128], fmt, rounding, seed=3, storage="bfloat16", out=out)
            assert np.array_equal(out.copy_to_host().view(np.uint16), want.view(np.uint16))


def test_lpsim_quantize_dispatches_device_arrays():
    x = edge_cases("e5m2", np.float32)
    got = lpsim.quantize(cuda.to_device(x), "e5m2", "nearest")
    assert np.array_equal(got.copy_to_host().view(np.int32),
                          lpsim.quantize(x, "e5m2").view(np.int32))


@pytest.mark.parametrize("storage, fmt", [("bfloat16", "bf16"), ("float16", "fp16"),
                                          ("float8_e5m2", "e5m2"), ("float8_e4m3fn", "e4m3fn")])
def test_packed_storage_matches_cpu_pack(storage, fmt):
    x = edge_cases(fmt, np.float32)
    expected = pack(lpsim.quantize(x, fmt, "stochastic", seed=9), storage, fmt)
    got = lpsim_cuda.quantize(cuda.to_device(x), fmt, "stochastic", seed=9, storage=storage)
    assert np.array_equal(got.copy_to_host(), expected)
    # an ml_dtypes dtype names the storage too, and out= takes unsigned codes
    out = cuda.to_device(np.zeros(x.shape, np.uint16 if expected.itemsize == 2 else np.uint8))
    lpsim_cuda.quantize(cuda.to_device(x), fmt, "stochastic", seed=9, out=out,
                        storage=getattr(ml_dtypes, storage, np.float16))
    assert np.array_equal(out.copy_to_host().view(expected.dtype), expected)


def test_grid_stride_loop_covers_more_than_one_grid(monkeypatch):
    monkeypatch.setattr(lpsim_cuda.launch, "GRID_LIMIT", 1)    # 32 threads for 600 blocks
    x = np.concatenate([edge_cases("e5m2", np.float64)] * 20)
    check_same(x, "e5m2", "stochastic", seed=2, offset=3)


def test_empty_arrays_round_to_empty():
    stats = lpsim.RoundingStats()
    got = lpsim_cuda.quantize(cuda.to_device(np.zeros(0, np.float32)), "bf16", stats=stats)
    assert got.shape == (0,) and stats.as_dict() == dict.fromkeys(stats.as_dict(), 0)


def test_errors_name_the_problem():
    x = cuda.to_device(np.zeros(4, np.float32))
    with pytest.raises(TypeError, match="host memory"):
        lpsim_cuda.quantize(np.zeros(4, np.float32), "bf16")
    with pytest.raises(TypeError, match="dtype int32; accepted: float32, float64"):
        lpsim_cuda.quantize(cuda.to_device(np.zeros(4, np.int32)), "bf16")
    with pytest.raises(TypeError, match="of type list is not a CUDA array"):
        lpsim_cuda.quantize([1.0], "bf16")
    with pytest.raises(ValueError, match=r"x is not C-contiguous \(shape \(4,\), strides \(8,\)"):
        lpsim_cuda.quantize(cuda.to_device(np.zeros(8, np.float32))[::2], "bf16")
    with pytest.raises(ValueError, match="out must have shape"):
        lpsim_cuda.quantize(x, "bf16", out=cuda.to_device(np.zeros(5, np.float32)))
    with pytest.raises(ValueError, match="out has dtype float64; it must be x's float32"):
        lpsim_cuda.quantize(x, "bf16", out=cuda.to_device(np.zeros(4, np.float64)))
    with pytest.raises(ValueError, match="storage float16 cannot hold"):
        lpsim_cuda.quantize(x, "bf16", storage="float16")
    with pytest.raises(ValueError, match="unknown storage 'int8'"):
        lpsim_cuda.quantize(x, "bf16", storage="int8")
    with pytest.raises(ValueError, match="out has dtype float32; storage='bfloat16' writes "
                                         "packed 16-bit codes, so out must be an int16"):
        lpsim_cuda.quantize(x, "bf16", storage="bfloat16", out=x)
    with pytest.raises(ValueError, match=r"out has dtype >u2; storage='bfloat16' writes "
                                         r"packed 16-bit codes.*native byte order"):
        # once written byte-swapped, silently
        lpsim_cuda.quantize(x, "bf16", storage="bfloat16",
                            out=cuda.to_device(np.zeros(4, ">u2")))
    with pytest.raises(ValueError, match="does not fit"):
        lpsim_cuda.quantize(x, "fp64")
    with pytest.raises(ValueError, match=r"'mxfp4' is a block format; accepted there: "
                                         r"lpsim\.quantize\(x, fmt\)"):   # "unknown format"
        lpsim_cuda.quantize(x, "mxfp4")


@pytest.mark.parametrize("dtype", [torch.float8_e5m2, torch.float8_e4m3fn, torch.int32])
def test_torch_dtypes_outside_float32_float64_are_refused_by_name(dtype):
    with pytest.raises(TypeError, match=f"x has dtype {dtype}; lpsim_cuda rounds torch.float32 "
                                        "and torch.float64 tensors"):
        lpsim_cuda.quantize(torch.zeros(4).to(dtype), "bf16")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_torch_16_bit_tensors_pass_the_dtype_check_but_must_be_on_the_gpu(dtype):
    with pytest.raises(TypeError, match="x is a CPU torch tensor"):
        lpsim_cuda.quantize(torch.zeros(4).to(dtype), "bf16")


def test_torch_out_must_match_the_storage_dtype():
    x = cuda.to_device(np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="out has dtype torch.float16; storage='bfloat16' writes "
                                         "torch.bfloat16 values, so out must be a "
                                         "torch.bfloat16 tensor$"):
        lpsim_cuda.quantize(x, "bf16", storage="bfloat16", out=torch.zeros(4, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"out has dtype torch.float32; .* \(drop storage= to get "
                                         "torch.float32 results\\)"):
        lpsim_cuda.quantize(x, "bf16", storage="bfloat16", out=torch.zeros(4))
    with pytest.raises(ValueError, match="x holds torch.float32 values, so out must be"):
        lpsim_cuda.quantize(x, "bf16", out=torch.zeros(4, dtype=torch.float64))
    with pytest.raises(TypeError, match="out is a CPU torch tensor"):
        lpsim_cuda.quantize(x, "bf16", out=torch.zeros(4))


def test_warmup_compiles_every_specialisation():
    lpsim_cuda.warmup()
    x = cuda.to_device(np.array([1.0, 1.0625], np.float64))
    packed = lpsim_cuda.quantize(x, "e4m3fn", storage="float8_e4m3fn").copy_to_host()
    assert packed.tolist() == [0x38, 0x38]      # 1.0625 ties to 1.0 in e4m3fn
