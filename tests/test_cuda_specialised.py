"""The specialised float32 kernels (lpsim_cuda.specialised) against the CPU simulator.

Bit for bit, on every format edge case, for every mode and sr_bits, at sizes that leave 0-3
elements after the groups of four, and at stream offsets that move the Philox blocks; each
test also asserts which kernel ran, so a change that quietly sent every call to the general
kernel fails here.  Under NUMBA_ENABLE_CUDASIM=1 (conftest) in CI; with LPSIM_TEST_GPU=1 on a
GPU the same tests run on the device, and the torch route's tests (raw launches) run too.
"""

import os

import numpy as np
import pytest
from numba import cuda

import lpsim
import lpsim_cuda
from lpsim.rounding import MODES
from lpsim.storage import pack
from lpsim_cuda import specialised
from test_cuda_quantize import edge_cases
from conftest import count_calls

GPU = os.environ.get("LPSIM_TEST_GPU") == "1"


@pytest.fixture
def launches(monkeypatch):
    """The specialised launches made during a test."""
    return count_calls(monkeypatch, specialised, "launch_arrays")


def data(fmt, n, seed=0):
    """n float32 values: the format's edge cases first, then normals across many binades."""
    rng = np.random.default_rng(seed)
    edges = edge_cases(fmt, np.float32)
    x = (rng.standard_normal(n) * 2.0 ** rng.integers(-40, 40, n)).astype(np.float32)
    x[: min(n, edges.size)] = edges[: min(n, edges.size)]
    return rng.permutation(x)


def same_as_cpu(x, fmt, rounding, **kw):
    expected = lpsim.quantize(x, fmt, rounding, **kw)
    got = lpsim_cuda.quantize(cuda.to_device(x), fmt, rounding, **kw).copy_to_host()
    bad = np.flatnonzero(expected.view(np.int32) != got.view(np.int32))
    assert bad.size == 0, (fmt, rounding, kw, x[bad[:4]], expected[bad[:4]], got[bad[:4]])


@pytest.mark.parametrize("fmt", specialised.FORMATS)
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_every_format_equals_the_cpu(fmt, rounding, launches):
    same_as_cpu(data(fmt, 131), fmt, rounding, seed=7)
    assert len(launches) == 1


@pytest.mark.parametrize("fmt", ["bf16", "e4m3fn", "e2m1fn"])
@pytest.mark.parametrize("rounding", sorted(MODES))
def test_every_mode_equals_the_cpu(fmt, rounding, launches):
    same_as_cpu(data(fmt, 70, seed=1), fmt, rounding, seed=11)
    assert len(launches) == 1


@pytest.mark.parametrize("sr_bits", [1, 3, 8, 13, 32])
def test_few_bit_stochastic_rounding(sr_bits, launches):
    same_as_cpu(data("e4m3fn", 64, seed=2), "e4m3fn", "stochastic", seed=5, sr_bits=sr_bits)
    assert len(launches) == 1


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 9, 63, 261])
@pytest.mark.parametrize("offset", [0, 4, 44, 2 ** 40])
def test_sizes_and_offsets(n, offset, launches):
    # the tail (n % 4 elements) takes lane words of the block after the groups'
    same_as_cpu(data("bf16", n, seed=n), "bf16", "stochastic", seed=3, offset=offset,
                stream=9)
    assert len(launches) == 1


@pytest.mark.parametrize("fmt,storage,width", [("bf16", "bfloat16", 16), ("fp16", "float16", 16),
                                               ("e4m3fn", "float8_e4m3fn", 8),
                                               ("e5m2", "float8_e5m2", 8)])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("n", [5, 67])
def test_packed_storage_equals_the_cpu_codes(fmt, storage, width, rounding, n, launches):
    # the fp32 -> bf16 (or float8) store: the rounded values' codes, 8 or 4 bytes per group
    x = data(fmt, n, seed=n + width)
    if not lpsim.parse_format(fmt).has_inf:
        x = np.where(np.isinf(x), np.float32(1), x)          # the storage cannot hold inf
    expected = pack(lpsim.quantize(x, fmt, rounding, seed=4), storage, fmt)
    codes = cuda.device_array(n, np.int16 if width == 16 else np.int8)
    lpsim_cuda.quantize(cuda.to_device(x), fmt, rounding, seed=4, storage=storage, out=codes)
    got = codes.copy_to_host()
    assert np.array_equal(got.view(expected.dtype), expected), (x, got, expected)
    assert len(launches) == 1


def test_offsets_that_split_a_philox_block_take_the_general_kernel(launches):
    for offset in (1, 2, 3, 5):
        same_as_cpu(data("bf16", 37), "bf16", "stochastic", seed=3, offset=offset)
    same_as_cpu(data("bf16", 37), "bf16", "nearest", offset=3)   # no random words: any offset
    assert len(launches) == 1


def test_misaligned_and_overlapping_arrays_take_the_general_kernel(launches):
    x = data("bf16", 65)
    whole = cuda.to_device(x)
    expected = lpsim.quantize(x[1:], "bf16", "stochastic", seed=1)
    got = lpsim_cuda.quantize(whole[1:], "bf16", "stochastic", seed=1).copy_to_host()
    assert np.array_equal(expected.view(np.int32), got.view(np.int32))
    assert launches == []                          # x[1:] is 4 bytes past a 16-byte boundary
    inplace = cuda.to_device(x)
    lpsim_cuda.quantize(inplace, "bf16", out=inplace)
    assert np.array_equal(inplace.copy_to_host().view(np.int32),
                          lpsim.quantize(x, "bf16").view(np.int32))
    assert len(launches) == 1                      # out is x itself: the specialised kernel


def test_calls_the_kernels_do_not_cover_take_the_general_kernel(launches):
    x = data("bf16", 40)
    lpsim_cuda.quantize(cuda.to_device(x), "fp(4,3,4)")                  # not a listed format
    lpsim_cuda.quantize(cuda.to_device(x.astype(np.float64)), "bf16")    # float64
    assert launches == []


@pytest.mark.parametrize("fmt", ["bf16", "e4m3fn", "e2m1fn", "e5m2"])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic", "toward_zero"])
def test_counted_kernel_equals_the_cpu_counters(fmt, rounding, launches):
    # every counter (inexact, overflow, underflow, subnormal, NaN, inf) and the element
    # count, summed by warp shuffles; sizes with a tail and more threads than groups
    for n in (3, 131):
        x = data(fmt, n, seed=n)
        want, got = lpsim.RoundingStats(), lpsim.RoundingStats()
        expected = lpsim.quantize(x, fmt, rounding, seed=2, stats=want)
        result = lpsim_cuda.quantize(cuda.to_device(x), fmt, rounding, seed=2, stats=got)
        assert np.array_equal(result.copy_to_host().view(np.int32), expected.view(np.int32))
        assert got == want, (fmt, rounding, n, got, want)
        assert got.elements == n
    assert len(launches) == 2


def test_the_listed_formats_are_specialised():
    for name in specialised.FORMATS:
        assert specialised.specialised(lpsim.parse_format(name), "nearest")
    assert not specialised.specialised(lpsim.parse_format("fp(4,3,4)"), "nearest")


@pytest.mark.skipif(not GPU, reason="raw launches need a GPU (LPSIM_TEST_GPU=1)")
def test_torch_route_equals_the_cpu_and_its_arguments_are_numbas():
    import torch
    rng = np.random.default_rng(4)
    for fmt in ("bf16", "e4m3fn"):
        for rounding, kw in (("nearest", {}), ("stochastic", {"seed": 3, "offset": 8}),
                             ("stochastic", {"seed": 3, "sr_bits": 8})):
            for n in (1, 4099, 1 << 20):
                x = (rng.standard_normal(n) * 2.0 ** rng.integers(-30, 30, n)).astype(
                    np.float32)
                t = torch.from_numpy(x).cuda()
                expected = lpsim.quantize(x, fmt, rounding, **kw)
                for _ in range(2):                   # the first call makes the route
                    got = lpsim_cuda.quantize(t, fmt, rounding, **kw).cpu().numpy()
                    assert np.array_equal(expected.view(np.int32), got.view(np.int32))
                key = (fmt, rounding, kw.get("sr_bits"), type(kw.get("sr_bits")), None, 0)
                assert specialised._ROUTES[key] is not None, specialised.ROUTE_ERRORS
                y = torch.empty_like(t)
                assert lpsim_cuda.quantize(t, fmt, rounding, out=y, **kw) is y
                assert np.array_equal(expected.view(np.int32), y.cpu().numpy().view(np.int32))


@pytest.mark.skipif(not GPU, reason="raw launches need a GPU (LPSIM_TEST_GPU=1)")
def test_torch_route_of_a_packed_store_equals_the_cpu():
    import torch
    x = data("bf16", 4099, seed=9)
    x = np.where(np.isfinite(x), x, np.float32(0))
    t = torch.from_numpy(x).cuda()
    expected = pack(lpsim.quantize(x, "bf16", "stochastic", seed=2), "bfloat16", "bf16")
    for _ in range(2):                                   # the first call makes the route
        got = lpsim_cuda.quantize(t, "bf16", "stochastic", seed=2, storage=torch.bfloat16)
        assert got.dtype == torch.bfloat16
        assert np.array_equal(got.view(torch.int16).cpu().numpy(), expected)
    key = ("bf16", "stochastic", None, type(None), torch.bfloat16, 0)
    assert specialised._ROUTES[key] is not None, specialised.ROUTE_ERRORS


@pytest.mark.skipif(not GPU, reason="raw launches need a GPU (LPSIM_TEST_GPU=1)")
def test_torch_route_refuses_what_the_general_path_refuses():
    import torch
    t = torch.randn(64, device="cuda")
    lpsim_cuda.quantize(t, "bf16")
    lpsim_cuda.quantize(t, "bf16")                   # the route exists now
    with pytest.raises(ValueError, match="out"):
        lpsim_cuda.quantize(t, "bf16", out=torch.empty(64, device="cuda", dtype=torch.float64))
    with pytest.raises(ValueError, match="shape"):
        lpsim_cuda.quantize(t, "bf16", out=torch.empty(63, device="cuda"))
    with pytest.raises(ValueError, match="offset"):
        lpsim_cuda.quantize(t, "bf16", offset=-1)
    before = t.clone()
    with pytest.raises((TypeError, ValueError), match="seed"):
        lpsim_cuda.quantize(t, "bf16", "stochastic", seed=-1, out=t)
    assert torch.equal(t, before)                    # a refused call changes nothing


def test_torch_stream_handle_asks_torch_for_the_devices_current_stream(monkeypatch):
    """The raw query where torch has it, the public stream object otherwise; both for the
    device asked about (no GPU needed: torch's two entry points are stood in for)."""
    import types

    import torch

    from lpsim_cuda import launch
    asked = []
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream",
                        lambda device: asked.append(("raw", device)) or 1000 + device,
                        raising=False)
    assert launch.torch_stream_handle(3) == 1003 and asked == [("raw", 3)]
    monkeypatch.delattr(torch._C, "_cuda_getCurrentRawStream")
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda device: asked.append(("public", device))
                        or types.SimpleNamespace(cuda_stream=2000 + device))
    assert launch.torch_stream_handle(1) == 2001 and asked[-1] == ("public", 1)


def test_keep_route_keeps_one_route_per_key_and_why_none(monkeypatch):
    """The route table both launch routes share: built once per key, None (with the
    reason) where the build fails or numba's arguments differ, nothing for unhashable keys
    or beyond 1024 routes."""
    monkeypatch.setattr(specialised.launch, "SIMULATOR", False)
    routes, errors, built = {}, {}, []

    def build(ok=True, fail=False):
        def make():
            built.append(1)
            if fail:
                raise RuntimeError("no internals")
            return "route", ok
        return make
    specialised.keep_route(routes, errors, "a", build())
    specialised.keep_route(routes, errors, "a", build())           # kept: not rebuilt
    specialised.keep_route(routes, errors, "b", build(ok=False))
    specialised.keep_route(routes, errors, "c", build(fail=True))
    specialised.keep_route(routes, errors, ["unhashable"], build())
    assert routes == {"a": "route", "b": None, "c": None} and len(built) == 3
    assert errors == {"b": "flat arguments differ from numba's",
                      "c": "RuntimeError('no internals')"}
    full = {i: None for i in range(1024)}
    specialised.keep_route(full, errors, "d", build())
    assert "d" not in full and len(built) == 3
