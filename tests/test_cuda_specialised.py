"""The specialised float32 kernels (lpsim_cuda.specialised) against the CPU simulator.

Bit for bit, on every format edge case, for every mode and sr_bits, at sizes that leave 0-3
elements after the groups of four, and at stream offsets that move the Philox blocks; each
test also asserts which kernel ran, so a change that quietly sent every call to the general
kernel fails here.  Under NUMBA_ENABLE_CUDASIM=1 (conftest) in CI; with LPSIM_TEST_GPU=1 on a
GPU the same tests run on the device, and the torch route's tests (raw launches) run too.
"""

import os

import ml_dtypes
import numpy as np
import pytest
from numba import cuda

import lpsim
import lpsim_cuda
from lpsim.rounding import MODES
from lpsim.storage import BFLOAT16_CODES, FLOAT16_CODES, pack
from lpsim_cuda import raw_launch, specialised
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


HALVES = [(BFLOAT16_CODES, ml_dtypes.bfloat16, "bfloat16"),
          (FLOAT16_CODES, np.float16, "float16")]


def codes16(dtype, n, seed):
    """n 16-bit codes: every exponent, both signs, zeros, subnormals, inf and NaNs."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(-2 ** 15, 2 ** 15, n).astype(np.int16)
    special = np.array([0, -32768, 1, -32767, 0x3C00, 0x7C00, 0x7F80, 0x7FC1, 0x7E01,
                        -1], np.int64).astype(np.int16)
    codes[: min(n, special.size)] = special[: min(n, special.size)]
    return rng.permutation(codes)


def run_codes(codes, half, fmt, rounding, seed=5, storage=None, stats=None):
    """The specialised kernel of a 16-bit source, launched on numba device arrays (a torch
    CUDA tensor's route is the same kernel): its output bits, or codes with ``storage``."""
    from lpsim.request import plan
    from lpsim.storage import NO_PACKING, storage_params
    n = codes.size
    f = lpsim.parse_format(fmt)
    request = plan(f, rounding, np.float32, seed=seed, size=n)
    sp = NO_PACKING if storage is None else storage_params(f, storage, np.float32)
    out = cuda.device_array(n, np.int32 if storage is None else np.int16)
    counts = cuda.to_device(np.zeros(8, np.int64))
    kernel = specialised.kernel(f, rounding, request.k, sp, stats is not None, half)
    specialised.launch_arrays(kernel, specialised.grid(n, 0), 0, cuda.to_device(codes), out, n,
                              request.seed_lo, request.seed_hi, request.stream,
                              request.offset // 4, counts if stats is not None else None)
    return out.copy_to_host(), counts.copy_to_host()


@pytest.mark.parametrize("half, dtype, name", HALVES)
@pytest.mark.parametrize("fmt", ["bf16", "e4m3fn", "e2m1fn"])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_16_bit_sources_equal_the_cpu_on_their_float32_values(half, dtype, name, fmt,
                                                              rounding):
    """A bfloat16 or float16 tensor's codes, widened in the kernel, round exactly as the CPU
    rounds their float32 values (the same random words: counter i is element i)."""
    codes = codes16(dtype, 71, seed=half)           # 17 groups of four and a tail of 3
    values = codes.view(dtype).astype(np.float32)
    expected = lpsim.quantize(values, fmt, rounding, seed=5)
    got, _ = run_codes(codes, half, fmt, rounding)
    assert np.array_equal(got, expected.view(np.int32)), (fmt, rounding)


def widened_by_numpy(codes, dtype):
    """float32 bits of 16-bit codes, NaN signs and payloads kept: numpy's float16 cast, or
    bfloat16's code as the top half."""
    if dtype is np.float16:
        return codes.view(np.float16).astype(np.float32).view(np.int32)
    return codes.astype(np.int32) << 16


@pytest.mark.parametrize("half, dtype, name", HALVES)
def test_the_general_kernels_widen_codes_as_numpy_does(half, dtype, name):
    """The general kernels' float32 copy of a 16-bit tensor (lpsim_cuda.arrays.widen_bits):
    every NaN kind, subnormals, zeros and infinities of both signs (on a GPU, all 65536
    codes), bit for bit."""
    from lpsim_cuda import arrays
    codes = np.arange(-2 ** 15, 2 ** 15).astype(np.int16) if GPU else codes16(dtype, 257, 4)
    if not GPU:                     # every signalling and quiet NaN kind, both signs
        codes[:8] = np.array([0x7C01, 0x7DFF, 0x7E00, 0x7FFF, 0xFC01, 0xFE00, 0x7F81, 0xFFC1],
                             np.int64).astype(np.int16)
    out = cuda.device_array(codes.size, np.int32)
    arrays.widen_bits(cuda.to_device(codes), half, out, 0, 0)
    assert np.array_equal(out.copy_to_host(), widened_by_numpy(codes, dtype))


@pytest.mark.skipif(not GPU, reason="torch CUDA tensors need a GPU (LPSIM_TEST_GPU=1)")
@pytest.mark.parametrize("fmt", ["fp(4,3,4)", "e4m3fn", "mxfp8_e4m3"])
def test_every_float16_code_of_a_cuda_tensor_rounds_as_the_cpu(fmt):
    """All 65536 float16 codes in a CUDA tensor, through lpsim.quantize: the specialised,
    general and block kernels give the CPU's bits of numpy's float16 array (NaN payloads
    and signs kept; the general kernels once read torch's GPU conversion)."""
    import torch
    codes = np.arange(-2 ** 15, 2 ** 15).astype(np.int16)
    expected = lpsim.quantize(codes.view(np.float16), fmt).view(np.int32)
    t = torch.from_numpy(codes).cuda().view(torch.float16)
    for _ in range(2):                                  # the second call takes the route
        got = lpsim.quantize(t, fmt)
        assert np.array_equal(got.cpu().numpy().view(np.int32), expected), fmt


@pytest.mark.skipif(not GPU, reason="torch CUDA tensors need a GPU (LPSIM_TEST_GPU=1)")
def test_counted_torch_calls_take_a_route_with_the_cpus_counters(monkeypatch):
    """A counted call's first launch builds its request's counted route
    (specialised.CountedRoute), which later counted calls take with their own stats
    objects: values and every counter equal the CPU's, float32 and bfloat16 sources."""
    import torch
    monkeypatch.setattr(specialised, "_COUNTED", {})
    x = (np.random.default_rng(4).standard_normal(4099) * 2.0 ** 12).astype(np.float32)
    for source in (torch.float32, torch.bfloat16):
        t = torch.from_numpy(x).cuda().to(source)
        values = t.float().cpu().numpy()
        for fmt, rounding in (("e4m3fn", "stochastic"), ("bf16", "nearest")):
            want, got = lpsim.RoundingStats(), lpsim.RoundingStats()
            for j in range(3):
                expected = lpsim.quantize(values, fmt, rounding, seed=j, stats=want)
                out = lpsim.quantize(t, fmt, rounding, seed=j, stats=got)
                assert np.array_equal(out.cpu().numpy().view(np.int32),
                                      expected.view(np.int32))
            assert got == want
    routes = list(specialised._COUNTED.values())
    assert len(routes) == 4 and all(isinstance(r, specialised.CountedRoute) for r in routes), \
        specialised.ROUTE_ERRORS


@pytest.mark.parametrize("half, dtype, name", HALVES)
def test_16_bit_sources_with_packed_storage_and_counters(half, dtype, name):
    """float16 or bfloat16 in, a 16-bit store out (the fp8 cast of a bf16 activation kept
    in bf16), and the counted variant's counters equal the CPU's."""
    codes = codes16(dtype, 67, seed=3)
    values = codes.view(dtype).astype(np.float32)
    values = np.where(np.isfinite(values), values, np.float32(0))
    codes = values.astype(dtype).view(np.int16)
    expected = pack(lpsim.quantize(values, "e4m3fn", "stochastic", seed=5), name, "e4m3fn")
    got, _ = run_codes(codes, half, "e4m3fn", "stochastic", storage=name)
    assert np.array_equal(got.view(np.int16), expected)
    want = lpsim.RoundingStats()
    lpsim.quantize(values, "e5m2", "nearest", stats=want)
    _, counts = run_codes(codes, half, "e5m2", "nearest", stats=True)
    assert counts[:7].tolist() == want.counts[1:].tolist() + [codes.size]


def test_16_bit_sources_take_the_specialised_kernel_where_aligned():
    """Alignment and overlap for a 16-bit x: its four elements are one 8-byte access."""
    assert specialised.eligible(9, 8, 64, 0, 0, 4, 2)
    assert not specialised.eligible(9, 4, 64, 0, 0, 4, 2)        # x 4 bytes past 8
    assert specialised.eligible(9, 64, 64, 0, 0, 2, 2)           # in place, same width
    assert not specialised.eligible(9, 64, 72, 0, 0, 4, 2)       # out inside x's bytes
    assert not specialised.eligible(9, 64, 64, 0, 0, 4, 2)       # wider out over x


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
                key = (fmt, rounding, kw.get("sr_bits"), type(kw.get("sr_bits")), None, 0, 0)
                assert specialised._ROUTES[key] is not None, specialised.ROUTE_ERRORS
                y = torch.empty_like(t)
                assert lpsim_cuda.quantize(t, fmt, rounding, out=y, **kw) is y
                assert np.array_equal(expected.view(np.int32), y.cpu().numpy().view(np.int32))
    # the routes launched through the driver with their packed arguments (lpsim_cuda.
    # raw_launch), not through cuda.core's launch after a refusal
    assert raw_launch.STATE == {"on": True, "why": None}, raw_launch.STATE


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
    key = ("bf16", "stochastic", None, type(None), torch.bfloat16, 0, 0)
    assert specialised._ROUTES[key] is not None, specialised.ROUTE_ERRORS


@pytest.mark.skipif(not GPU, reason="raw launches need a GPU (LPSIM_TEST_GPU=1)")
def test_torch_16_bit_tensors_equal_the_cpu_on_every_path():
    """bfloat16 and float16 CUDA tensors through lpsim.quantize and lpsim_cuda.quantize: the
    specialised kernel and its route, packed storage, counters, a misaligned view and a
    format without a specialised kernel (upcast, general kernel) all give the CPU's bits
    of the float32 values, as float32 tensors."""
    import torch

    from lpsim.tensors import widened
    for dtype, half, name in ((torch.bfloat16, BFLOAT16_CODES, "bfloat16"),
                              (torch.float16, FLOAT16_CODES, "float16")):
        x = torch.from_numpy(data("e5m2", 4099, seed=half)).to(dtype)
        values = widened(x).numpy()
        # the element past x is set: the shifted view below reads it, and left empty it held
        # whatever the memory held (a float16 NaN there converts differently through torch)
        t = torch.zeros(4100, dtype=dtype, device="cuda")
        t[:4099] = x.cuda()
        for fmt, rounding, kw in (("e4m3fn", "nearest", {}), ("e5m2", "stochastic", {"seed": 3}),
                                  ("fp(4,3,4)", "nearest", {})):
            expected = lpsim.quantize(values, fmt, rounding, **kw).view(np.int32)
            for call in range(2):                       # the first call makes the route
                for entry, got in (("lpsim", lpsim.quantize(t[:4099], fmt, rounding, **kw)),
                                   ("lpsim_cuda", lpsim_cuda.quantize(t[:4099], fmt, rounding,
                                                                      **kw))):
                    assert got.dtype == torch.float32
                    bits = got.cpu().numpy().view(np.int32)
                    bad = np.flatnonzero(bits != expected)
                    # on a failure, the case and its first differing elements, as bits
                    assert bad.size == 0, (name, fmt, rounding, entry, call, bad.size, [
                        (int(i), hex(values.view(np.uint32)[i]), hex(np.uint32(bits[i])),
                         hex(np.uint32(expected[i]))) for i in bad[:4]])
            shifted = lpsim_cuda.quantize(t[1:], fmt, rounding, **kw)   # 2 bytes off: general
            # the codes' float32 values as lpsim reads them (lpsim.storage.code_bits: every
            # NaN's sign and payload kept), not through torch's conversion
            want = lpsim.quantize(widened(t[1:].cpu()).numpy(), fmt, rounding, **kw)
            _same_bits(shifted.cpu().numpy().view(np.int32), want.view(np.int32),
                       widened(t[1:].cpu()).numpy(), (name, fmt, rounding, "shifted"))
        key = ("e4m3fn", "nearest", None, type(None), None, 0, half)
        assert specialised._ROUTES[key] is not None, specialised.ROUTE_ERRORS
        finite = torch.where(x.isfinite(), x, torch.zeros_like(x)).cuda()
        packed = lpsim_cuda.quantize(finite, "e4m3fn", "stochastic", seed=2, storage=dtype)
        assert packed.dtype == dtype
        codes = pack(lpsim.quantize(finite.float().cpu().numpy(), "e4m3fn", "stochastic",
                                    seed=2), name, "e4m3fn")
        _same_bits(packed.view(torch.int16).cpu().numpy(), codes,
                   finite.float().cpu().numpy(), (name, "e4m3fn", "stochastic", "packed"))
        want, got = lpsim.RoundingStats(), lpsim.RoundingStats()
        lpsim.quantize(values, "e4m3fn", stats=want)
        lpsim.quantize(t[:4099], "e4m3fn", stats=got)
        assert got == want, (name, got, want)


def _same_bits(got, want, values, case):
    """got == want elementwise, else the case and its first differing elements as bits."""
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, (case, bad.size, [
        (int(i), hex(values.view(np.uint32)[i]), hex(int(got[i]) & 0xFFFFFFFF),
         hex(int(want[i]) & 0xFFFFFFFF)) for i in bad[:4]])


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

    def raw(device):                    # torch's raw query takes an integer index only
        if type(device) is not int:
            raise RuntimeError("invalid argument to getCurrentStream")
        asked.append(("raw", device))
        return 1000 + device
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", raw, raising=False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 5)
    assert launch.torch_stream_handle(3) == 1003 and asked == [("raw", 3)]
    # callers pass a tensor's device: with an index, and without one (the current device)
    assert launch.torch_stream_handle(torch.device("cuda", 2)) == 1002
    assert launch.torch_stream_handle(torch.device("cuda")) == 1005
    assert asked[1:] == [("raw", 2), ("raw", 5)]
    monkeypatch.delattr(torch._C, "_cuda_getCurrentRawStream")
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda device: asked.append(("public", device))
                        or types.SimpleNamespace(cuda_stream=2000 + int(device)))
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
