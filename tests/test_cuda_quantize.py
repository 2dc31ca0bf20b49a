"""lpsim_cuda against the CPU simulator: bit-identical outputs and counters.

Runs under NUMBA_ENABLE_CUDASIM=1 (set by conftest) on small arrays of every format's edge
cases; with LPSIM_TEST_GPU=1 on a GPU machine the same tests run on the device, plus a
2**24-element random check per format and mode.
"""

import os

import numpy as np
import pytest
from numba import config, cuda

import lpsim
import lpsim_cuda
from lpsim.rounding import MODES
from lpsim.storage import pack

ON_GPU = not config.ENABLE_CUDASIM
FORMATS = ["bf16", "e4m3fn", "fp(4,3,4)", "e5m2"]


def edge_cases(fmt, dtype):
    """Ties, subnormals, overflow, NaN, inf and +-0 of ``fmt``, held in ``dtype``."""
    fmt = lpsim.parse_format(fmt)
    ulp_min = fmt.min_subnormal
    values = [0.0, fmt.min_normal, ulp_min, 1.5 * ulp_min, 0.5 * ulp_min, 0.25 * ulp_min,
              fmt.max_finite, fmt.max_finite * (1 + fmt.epsilon / 4),
              fmt.max_finite * (1 + fmt.epsilon), 2 * fmt.max_finite, np.inf, np.nan,
              1 + fmt.epsilon / 2, 1 + 1.5 * fmt.epsilon, 1 + fmt.epsilon / 3,
              fmt.min_normal * (1 - fmt.epsilon / 2), 3.0, 0.1]
    finite = np.array(values, dtype=np.float64)
    with np.errstate(over="ignore"):
        both = np.concatenate([finite, -finite]).astype(dtype)
    return np.concatenate([both, np.nextafter(both, np.inf, dtype=dtype)])


def check_same(x, fmt, rounding, **kw):
    cpu_stats, gpu_stats = lpsim.RoundingStats(), lpsim.RoundingStats()
    expected = lpsim.quantize(x, fmt, rounding, stats=cpu_stats, **kw)
    got = lpsim_cuda.quantize(cuda.to_device(x), fmt, rounding, stats=gpu_stats,
                              **kw).copy_to_host()
    bits = np.int32 if x.dtype == np.float32 else np.int64
    mismatch = np.flatnonzero(expected.view(bits) != got.view(bits))
    assert mismatch.size == 0, (fmt, rounding, x[mismatch[:5]], expected[mismatch[:5]],
                                got[mismatch[:5]])
    assert cpu_stats == gpu_stats


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rounding", list(MODES))
def test_every_mode_matches_cpu(rounding, dtype):
    x = np.concatenate([edge_cases(f, dtype) for f in FORMATS])
    for fmt in FORMATS:
        kw = {"seed": 7, "stream": 3} if rounding.startswith("stochastic") else {}
        check_same(x, fmt, rounding, **kw)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("specials", ["ieee", "saturate", "fn"])
@pytest.mark.parametrize("subnormals", [True, False])
def test_policies_match_cpu(specials, subnormals, dtype):
    fmt = lpsim.fp(4, 3, 2, specials=specials, subnormals=subnormals)
    x = edge_cases(fmt, dtype)
    for rounding in ["nearest", "up", "toward_zero", "stochastic"]:
        check_same(x, fmt, rounding, seed=11, sr_bits=5 if rounding == "stochastic" else None)


def test_offset_and_in_place_match_cpu():
    x = edge_cases("bf16", np.float32)
    expected = lpsim.quantize(x, "bf16", "stochastic", seed=5, offset=13)
    device = cuda.to_device(x)
    lpsim_cuda.quantize(device, "bf16", "stochastic", seed=5, offset=13, out=device)
    assert np.array_equal(device.copy_to_host().view(np.int32), expected.view(np.int32))


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


def test_errors_name_the_problem():
    with pytest.raises(TypeError, match="host memory"):
        lpsim_cuda.quantize(np.zeros(4, np.float32), "bf16")
    with pytest.raises(TypeError, match="float32, float64"):
        lpsim_cuda.quantize(cuda.to_device(np.zeros(4, np.int32)), "bf16")
    with pytest.raises(ValueError, match="out must have shape"):
        lpsim_cuda.quantize(cuda.to_device(np.zeros(4, np.float32)), "bf16",
                            out=cuda.to_device(np.zeros(5, np.float32)))
    with pytest.raises(ValueError, match="storage float16 cannot hold"):
        lpsim_cuda.quantize(cuda.to_device(np.zeros(4, np.float32)), "bf16", storage="float16")
    with pytest.raises(ValueError, match="packed 16-bit storage"):
        lpsim_cuda.quantize(cuda.to_device(np.zeros(4, np.float32)), "bf16", storage="bfloat16",
                            out=cuda.to_device(np.zeros(4, np.float32)))
    with pytest.raises(ValueError, match="does not fit"):
        lpsim_cuda.quantize(cuda.to_device(np.zeros(4, np.float32)), "fp64")


@pytest.mark.skipif(not ON_GPU or os.environ.get("LPSIM_TEST_GPU") != "1",
                    reason="needs a real GPU (LPSIM_TEST_GPU=1)")
def test_large_random_matches_cpu_on_gpu():
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2 ** 32, 1 << 24, dtype=np.uint64).astype(np.uint32)
    for fmt in FORMATS + ["fp(6,9,0)", "fp16"]:
        x = np.concatenate([bits.view(np.float32), edge_cases(fmt, np.float32)])
        for rounding in MODES:
            check_same(x, fmt, rounding, seed=1234)


def test_warmup_compiles_every_specialisation():
    lpsim_cuda.warmup()
    x = cuda.to_device(np.array([1.0, 1.0625], np.float64))
    packed = lpsim_cuda.quantize(x, "e4m3fn", storage="float8_e4m3fn").copy_to_host()
    assert packed.tolist() == [0x38, 0x38]      # 1.0625 ties to 1.0 in e4m3fn
