"""The block-per-lane-group kernels (lpsim_cuda.block_groups) against the CPU, bit for bit.

Every preset, scale rule and mode, NaN/inf/zero/huge/tiny elements, 1-D and 2-D arrays and
stream offsets; each test asserts which kernel ran, so a change that quietly sent every
call to the general kernel fails.  Under NUMBA_ENABLE_CUDASIM=1 (conftest), where the
block reductions read whole blocks instead of shuffling; with LPSIM_TEST_GPU=1 the same
tests run on the device (shuffles), plus the torch tensor tests.
"""

import os
from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest
from numba import cuda

import lpsim
import lpsim_cuda.blocks as cuda_blocks
from lpsim.blocks import PRESETS, BlockStats, block, quantize_blocks
from lpsim.blocks.counters import add_counts
from lpsim.storage import BFLOAT16_CODES, FLOAT16_CODES
from lpsim_cuda import block_groups
from conftest import count_calls, without_simulator

GPU = os.environ.get("LPSIM_TEST_GPU") == "1"


@pytest.fixture
def launches(monkeypatch):
    """The block_groups launches made during a test."""
    return count_calls(monkeypatch, block_groups, "launch_flat")


def data(shape, seed=0):
    """float32 values over many binades with zeros, tiny and huge values (no NaN or inf)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * 2.0 ** rng.integers(-24, 24, shape)
    flat = x.reshape(-1)
    flat[::7] = 0.0
    flat[3::11] = 1e-40
    flat[5::13] = 3e38
    return x.astype(np.float32)


def same_as_cpu(x, fmt, rounding, **kw):
    expected = lpsim.quantize(x, fmt, rounding, **kw)
    got = cuda_blocks.quantize(cuda.to_device(x), fmt, rounding, **kw).copy_to_host()
    bad = np.flatnonzero(expected.view(np.int32).ravel() != got.view(np.int32).ravel())
    assert bad.size == 0, (fmt, rounding, kw, x.ravel()[bad[:4]], expected.ravel()[bad[:4]],
                           got.ravel()[bad[:4]])


BLOCKED = [name for name, f in PRESETS.items() if block_groups.lanes_of(f.block)]


def test_the_presets_have_lane_groups():
    assert {"mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4",
            "nvfp4"} <= set(BLOCKED)


@pytest.mark.parametrize("fmt", BLOCKED)
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_every_preset_equals_the_cpu(fmt, rounding, launches):
    same_as_cpu(data((3, 96), seed=1), fmt, rounding, seed=5)
    same_as_cpu(data(64, seed=2), fmt, rounding, seed=5, offset=12)
    assert len(launches) == 2


def counted_as_cpu(x, fmt, rounding, **kw):
    """Values and every counter (BlockStats: elements, the six rounding counters, blocks,
    clipped scales, flushed and NaN blocks) of the counting kernel equal the CPU's."""
    want, got = BlockStats(), BlockStats()
    expected = lpsim.quantize(x, fmt, rounding, stats=want, **kw)
    result = cuda_blocks.quantize(cuda.to_device(x), fmt, rounding, stats=got, **kw)
    assert np.array_equal(result.copy_to_host().view(np.int32), expected.view(np.int32))
    assert got.as_dict() == want.as_dict(), (fmt, rounding)
    return want


def counted_data(shape, seed):
    """data() with a NaN block, an inf block, a block of zeros, a block of values far below
    the others (its scale clipped), one of float32 subnormals (flushed) and a block of tiny
    values beside a large one."""
    x = data(shape, seed=seed)
    flat = x.reshape(-1)
    flat[5] = np.nan
    flat[40] = np.inf
    flat[64:96] = 0
    flat[96:128] *= np.float32(2.0 ** -60)
    flat[128:160] = np.float32(3e-44)
    flat[160:192] = np.float32(1e-30)
    flat[161] = np.float32(1e30)
    return x


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp4", "nvfp4"])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_counted_calls_equal_the_cpu_counters(fmt, rounding, launches):
    kw = {"seed": 3} if rounding == "stochastic" else {}
    stats = counted_as_cpu(counted_data((2, 256), seed=4), fmt, rounding, **kw)
    assert stats.nan_blocks and stats.flushed_blocks and stats.inexact
    unit = np.random.default_rng(6).standard_normal((2, 256)).astype(np.float32)
    stats = counted_as_cpu(unit, fmt, rounding, **kw)      # subnormal results (not e4m3's)
    assert stats.subnormal or fmt == "mxfp8_e4m3"
    assert len(launches) == 2


def test_counted_calls_leave_their_counts_on_the_device_until_read(launches, monkeypatch):
    """Counted block calls (simulated training's telemetry) add into an accumulator per
    stats object, device and format's clip bounds: no copy back and no new device array a
    call.  Read once, the counters equal the CPU's for all the calls; NVFP4 at more given
    tensor scales than accumulators kept (each its own bounds; two here) loses nothing;
    reset zeroes the device side too."""
    from lpsim_cuda import counters
    monkeypatch.setattr(counters, "MAX_BLOCK_ACCUMULATORS", 2)
    drained = count_calls(monkeypatch, counters.DeviceCounters, "drain")
    made = count_calls(monkeypatch, counters, "DeviceCounters")
    got, want = BlockStats(), BlockStats()
    calls = [("mxfp8_e4m3", {}), ("mxfp4", {"seed": 2}), ("mxfp8_e4m3", {})]
    calls += [("nvfp4", {"tensor_scale": 2.0 ** -k}) for k in range(3)]
    for i, (fmt, kw) in enumerate(calls):
        x = counted_data((2, 128), seed=10 + i)
        rounding = "stochastic" if "seed" in kw else "nearest"
        expected = quantize_blocks(x, fmt, rounding, want_elements=False, **kw)
        add_counts(want, expected.counts, x.size)
        result = cuda_blocks.quantize(cuda.to_device(x), fmt, rounding, stats=got, **kw)
        assert np.array_equal(result.copy_to_host().view(np.int32),
                              expected.values.view(np.int32))
    assert len(launches) == len(calls)
    # two MX formats' bounds, then the NVFP4 scales' (two kept here): a read of the two
    # held each time a third set came
    assert len(made) == 5 and len(drained) == 4
    assert got == want and got.nan_blocks and got.clipped_scales and got.flushed_blocks
    got.reset()
    cuda_blocks.quantize(cuda.to_device(counted_data((2, 128), seed=3)), "mxfp8_e4m3",
                         stats=got)
    want = BlockStats()
    lpsim.quantize(counted_data((2, 128), seed=3), "mxfp8_e4m3", stats=want)
    assert got == want


def test_counted_calls_of_other_rules_and_scales(launches):
    """A format whose NaN stays in its element, a scale that clips both ways, and NVFP4
    at a tiny given tensor scale (its quotients are inf: element_exact counts them)."""
    x = counted_data(512, seed=5)
    counted_as_cpu(x, block("e4m3fn", 32, nonfinite="finite"), "nearest")
    counted_as_cpu(x, block("e2m1fn", 16, scale="e4m3fn"), "toward_zero")
    want, got = BlockStats(), BlockStats()
    expected = quantize_blocks(x, "nvfp4", tensor_scale=2e-36, want_elements=False)
    add_counts(want, expected.counts, x.size)
    result = cuda_blocks.quantize(cuda.to_device(x), "nvfp4", tensor_scale=2e-36,
                                  stats=got)
    assert np.array_equal(result.copy_to_host().view(np.int32),
                          expected.values.view(np.int32))
    assert got.as_dict() == want.as_dict()
    assert len(launches) == 3


def test_the_cpu_word_kernels_formats_take_its_float32_steps(launches):
    """Where the CPU's word kernel holds (lpsim.blocks.words_exact), the kernel is built
    with the same float32 steps: MXFP8, MXFP6, MXFP4 and NVFP4, to nearest by one float32
    add and subtract an element."""
    from lpsim.blocks import nearest_words_exact, words_exact
    for name in BLOCKED:
        bfmt = PRESETS[name]
        cuda_blocks.quantize(cuda.to_device(data(64)), bfmt, "nearest")
        words = words_exact(bfmt)
        near = words and nearest_words_exact(bfmt.saturating_element)
        assert any(key[0] == bfmt.saturating_element and key[1] == bfmt.scale
                   and key[6:8] == (words, near) for key in block_groups.KERNELS), name
    for name in ("mxfp8_e4m3", "mxfp4", "nvfp4"):
        assert words_exact(PRESETS[name]) and nearest_words_exact(
            PRESETS[name].saturating_element), name
    assert len(launches) == len(BLOCKED)


@pytest.mark.skipif(not GPU, reason="large arrays: on a GPU (LPSIM_TEST_GPU=1)")
@pytest.mark.parametrize("rounding", ["nearest", "stochastic", "down"])
def test_large_arrays_of_every_preset_equal_the_cpu(rounding, launches):
    """2**18 elements a preset: many blocks of each binade, the float32 steps' fallbacks."""
    x = data((256, 1024), seed=11)
    x[7, 100:104] = np.float32(2.0 ** -149)                   # float32 subnormals
    for fmt in BLOCKED:
        same_as_cpu(x, fmt, rounding, seed=9)
    assert len(launches) == len(BLOCKED)


def test_the_layout_of_a_block():
    """Blocks up to 128 elements take a lane per quad, longer ones (2-D scaling's tiles) a
    warp whose lanes hold several quads; other lengths take the general kernel."""
    layout = block_groups.layout_of
    assert [layout(b) for b in (4, 16, 32, 128, 256, 512, 1024)] == [
        (1, 1), (4, 1), (8, 1), (32, 1), (32, 2), (32, 4), (32, 8)]
    assert all(layout(b) == (0, 0) for b in (0, 1, 2, 12, 96, 384, 2048))


#: 2-D scaling's tiles as blocks: NVFP4's 16 x 16, a 512 and MXFP8 at 32 x 32; one whose NaN
#: stays in its element (its amax and NaN flag reduced apart)
TILES = {"nvfp4 16x16": replace(PRESETS["nvfp4"], block=256),
         "mxfp4 512": replace(PRESETS["mxfp4"], block=512),
         "mxfp8 32x32": replace(PRESETS["mxfp8_e4m3"], block=1024),
         "e4m3 finite 256": block("e4m3fn", 256, nonfinite="finite")}


def far_quad_data(length, seed):
    """Five blocks of ``length`` whose deciding elements lie only in the lanes' last quads:
    the largest magnitude (two blocks, one lane apart), a NaN, an inf; the fifth block all
    tiny but for one normal value there (a scale set by it, not by the first quads)."""
    lanes, quads = block_groups.layout_of(length)
    last = 4 * lanes * (quads - 1)                 # the first element of the last quads
    x = (np.random.default_rng(seed).standard_normal((5, length)) * 0.1).astype(np.float32)
    x[0, last + 7] = 1e6
    x[1, last + 4 * lanes - 1] = -3e5
    x[2, last + 2] = np.nan
    x[3, last + 9] = -np.inf
    x[4] = np.float32(1e-30)
    x[4, last + 4 * lanes - 2] = 2.0
    return x


@pytest.mark.parametrize("name", TILES)
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_tile_sized_blocks_equal_the_cpu(name, rounding, launches):
    """Blocks of 256 .. 1024 elements (a lane holds 2 .. 8 quads): values and counters
    equal the CPU's where what decides a block lies only in the lanes' last quads, and on
    data of every binade; NVFP4's tensor scale found on the device."""
    bfmt, kw = TILES[name], {"seed": 7} if rounding == "stochastic" else {}
    x = far_quad_data(bfmt.block, seed=len(name))
    same_as_cpu(x, bfmt, rounding, **kw)
    stats = counted_as_cpu(x, bfmt, rounding, **kw)
    assert stats.nan_blocks == (bfmt.nonfinite == "nan") * 2
    same_as_cpu(data((2, 2 * bfmt.block), seed=3), bfmt, rounding, **kw)
    assert len(launches) == 3


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp4", "nvfp4 16x16", "mxfp8 32x32"])
def test_a_small_grid_makes_each_lane_take_many_passes(fmt, launches, monkeypatch):
    """A one-block grid: each lane rounds several passes' quads (MXFP8's kernel loads the
    next pass's quad before rounding this one; tiles take a warp a block), the CPU's bits,
    nearest and stochastic."""
    from lpsim_cuda import launch
    monkeypatch.setattr(launch, "GRID_LIMIT", 1)
    bfmt = TILES.get(fmt) or PRESETS[fmt]
    x = data((2, 1024), seed=12)       # 32 threads: 2 (32 x 32) to 16 (MXFP8) passes a lane
    same_as_cpu(x, bfmt, "nearest")
    same_as_cpu(x, bfmt, "stochastic", seed=8)
    assert len(launches) == 2


@pytest.mark.parametrize("rule", ["floor", "ceil", "even", "rceil"])
@pytest.mark.parametrize("rounding", ["up", "odd"])
def test_scale_rules_and_modes(rule, rounding, launches):
    same_as_cpu(data((2, 64), seed=3), block("e4m3fn", 32, rule=rule), rounding)
    assert len(launches) == 1


@pytest.mark.parametrize("rule", ["floor", "ceil", "even", "rceil"])
def test_blocks_whose_largest_magnitude_is_zero_or_subnormal(rule, launches):
    """Power-of-two scales from the amax's exponent field (lpsim.blocks.word_scales): an
    all-zero block, one of float32 subnormals and one of the least normal, between others;
    E8M0 with e4m3, and with fp(3, 2, 6), whose largest exponent is -3: a subnormal amax
    then needs block_scale itself."""
    x = data((6, 32), seed=6)
    x[1] = 0.0
    x[3] = np.float32(2.0 ** -140) * np.arange(-16, 16, dtype=np.float32)
    x[4, :] = np.float32(2.0 ** -126)
    x[4, ::3] = -np.float32(2.0 ** -127)
    x[5] = np.float32(2.0 ** -131) * np.arange(-16, 16, dtype=np.float32)
    for element in ("e4m3fn", "fp(3,2,6)"):
        for rounding, kw in (("nearest", {}), ("stochastic", {"seed": 2}), ("down", {})):
            same_as_cpu(x, block(element, 32, rule=rule), rounding, **kw)
    assert len(launches) == 6


@pytest.mark.parametrize("nonfinite", ["nan", "finite"])
def test_blocks_holding_nan_or_inf(nonfinite, launches):
    x = data((4, 32), seed=4)
    x[0, 3], x[2, 31] = np.nan, -np.inf
    same_as_cpu(x, block("e2m1fn", 32, nonfinite=nonfinite), "nearest")
    same_as_cpu(x, block("e2m1fn", 32, nonfinite=nonfinite), "stochastic", seed=1)
    assert len(launches) == 2


def test_nvfp4_tensor_scale_given_or_found(launches):
    x = data((2, 48), seed=6)
    same_as_cpu(x, "nvfp4", "nearest")                     # found on the device
    expected = quantize_blocks(x, "nvfp4", tensor_scale=0.5, want_elements=False).values
    got = cuda_blocks.quantize(cuda.to_device(x), "nvfp4", tensor_scale=0.5).copy_to_host()
    assert np.array_equal(got.view(np.int32), expected.view(np.int32))
    assert len(launches) == 2


def test_nvfp4_tensor_scale_found_on_the_device_never_comes_back(launches, monkeypatch):
    """A tensor scale found for lpsim.quantize stays on the device (two small kernels, no
    copy to the host): the results equal the CPU's for data reaching float32's largest,
    data so small that the scale takes its least value, zeros (scale 1) and a NaN block."""
    def no_copy(*args, **kwargs):
        raise AssertionError("the tensor scale came back to the host")
    from lpsim_cuda import tensor_amax
    monkeypatch.setattr(tensor_amax, "tensor_amax", no_copy)
    monkeypatch.setattr(cuda_blocks, "tensor_amax", no_copy)     # the general kernel's caller
    # amax / (448 * 6) below the least tensor scale (about 2**-119): the scale is clamped
    tiny = (np.random.default_rng(9).standard_normal((2, 32)) * 1e-34).astype(np.float32)
    nan = data((2, 32), seed=8)
    nan[1, 5] = np.nan
    cases = [(data((2, 48), seed=7), "stochastic"), (tiny, "nearest"),
             (np.zeros((1, 16), np.float32), "nearest"), (nan, "nearest")]
    for x, rounding in cases:
        same_as_cpu(x, "nvfp4", rounding, seed=3)
    assert len(launches) == 4


@pytest.mark.parametrize("where", [0, 3, 4 * 64 - 1, 4 * 64, 766, 767, 770])
def test_the_tensor_amax_pass_finds_the_largest_wherever_it_lies(where):
    """The float32 amax kernel (its passes run from the array's end back to its start, the
    n % 4 tail apart) finds the largest finite magnitude at the first and last element of a
    pass, of the last whole group and in the tail, past NaN and inf: 771 elements are three
    passes of the simulator's 64 threads and a tail of three."""
    from lpsim_cuda import tensor_amax
    x = (np.random.default_rng(where).standard_normal(771) * 1e3).astype(np.float32)
    x[[10, 500]] = np.nan, -np.inf
    x[where] = -3e7
    assert tensor_amax.tensor_amax(cuda.to_device(x)) == 3e7 == float(np.float32(3e7))


def test_calls_the_kernels_do_not_cover_take_the_general_kernel(launches):
    same_as_cpu(data((2, 40), seed=7), "mxfp8_e4m3", "nearest")         # 32 does not divide 40
    same_as_cpu(data((2, 64), seed=7).astype(np.float64), "mxfp4", "nearest")   # float64
    same_as_cpu(data(64, seed=7), "mxfp4", "stochastic", seed=1, offset=2)  # split Philox block
    same_as_cpu(data(96, seed=7), block("e4m3fn", 12), "nearest")        # 12 / 4 lanes
    assert launches == []


@pytest.mark.parametrize("half, dtype", [(BFLOAT16_CODES, ml_dtypes.bfloat16),
                                         (FLOAT16_CODES, np.float16)])
@pytest.mark.parametrize("fmt, rounding", [("mxfp8_e4m3", "nearest"), ("mxfp4", "stochastic"),
                                           ("nvfp4", "nearest"), ("finite", "nearest")])
def test_16_bit_sources_equal_the_cpu_on_their_float32_values(half, dtype, fmt, rounding):
    """The kernels reading bfloat16 or float16 codes (a torch tensor's, launched here on
    numba arrays) give the CPU's bits of the codes' float32 values: blocks with NaN or inf,
    zeros and subnormals included; NVFP4 at a given tensor scale; a format whose NaN stays
    in its element (its block's amax reduced apart from the NaN flag)."""
    from lpsim.request import plan
    rng = np.random.default_rng(half)
    values = data(256, seed=half).astype(dtype)
    values[rng.integers(0, 256, 3)] = [np.nan, np.inf, -np.inf]
    codes = values.view(np.int16)
    x = values.astype(np.float32)
    bfmt = block("e4m3fn", 32, nonfinite="finite") if fmt == "finite" else PRESETS[fmt]
    fmt = bfmt
    scale = {"tensor_scale": 0.5} if bfmt.tensor_scale else {}
    expected = quantize_blocks(x, fmt, rounding, seed=4, want_elements=False, **scale).values
    request = plan(bfmt.saturating_element, rounding, np.float32, seed=4, size=x.size)
    out = cuda.device_array(x.size, np.float32)
    xb = cuda.to_device(codes)
    assert block_groups.eligible(bfmt, 256, 256, 8, 1024, request.mode, 0, 2)
    block_groups.launch_flat(bfmt, request, 0.5 if bfmt.tensor_scale else 1.0, xb, out,
                             x.size, half=half)
    got = out.copy_to_host()
    assert np.array_equal(got.view(np.int32), expected.view(np.int32)), fmt


@pytest.mark.parametrize("half, dtype", [(BFLOAT16_CODES, ml_dtypes.bfloat16),
                                         (FLOAT16_CODES, np.float16)])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_nvfp4_of_16_bit_codes_finds_its_tensor_scale_from_the_codes(half, dtype, rounding):
    """NVFP4 of bfloat16 or float16 codes whose tensor scale is to be found: the amax kernel
    of the codes (each widened exactly) and the block kernel reading them give the CPU's
    bits for the codes' float32 values, NaN and inf blocks included; for bfloat16 also data
    so small that the scale takes its least value (float16 has no such values)."""
    from lpsim.request import plan
    from lpsim_cuda import tensor_amax
    bfmt = PRESETS["nvfp4"]
    rng = np.random.default_rng(half + 7)
    cases = [data(256, seed=half + 3).astype(dtype)]
    cases[0][rng.integers(0, 256, 3)] = [np.nan, np.inf, -np.inf]
    if dtype is ml_dtypes.bfloat16:
        cases.append((rng.standard_normal(64) * 1e-34).astype(dtype))
    for values in cases:
        x = values.astype(np.float32)
        expected = quantize_blocks(x, bfmt, rounding, seed=4, want_elements=False).values
        request = plan(bfmt.saturating_element, rounding, np.float32, seed=4, size=x.size)
        out = cuda.device_array(x.size, np.float32)
        xb = cuda.to_device(values.view(np.int16))
        with tensor_amax.ENQUEUE:
            block_groups.launch_flat(bfmt, request, 1.0, xb, out, x.size,
                                     tensor_amax.device_tensor_scale(xb, bfmt, half),
                                     half=half)
        got = out.copy_to_host()
        assert np.array_equal(got.view(np.int32), expected.view(np.int32)), values.size


@pytest.mark.parametrize("half, dtype", [(BFLOAT16_CODES, ml_dtypes.bfloat16),
                                         (FLOAT16_CODES, np.float16)])
@pytest.mark.parametrize("where", [0, 255, 256, 767, 770])
def test_the_amax_of_16_bit_codes_finds_the_largest_wherever_it_lies(half, dtype, where):
    """The amax kernel of bfloat16 or float16 codes: the largest finite magnitude of their
    float32 values at a pass edge, in the last whole group and in the n % 4 tail, past NaN
    and inf and float16 subnormals (771 codes: three passes of 64 threads and a tail of 3)."""
    from lpsim_cuda import tensor_amax
    values = (np.random.default_rng(where).standard_normal(771) * 10).astype(dtype)
    values[[10, 500]] = np.nan, -np.inf
    values[[20, 21]] = dtype(2.0 ** -20), dtype(-(2.0 ** -24))      # subnormal in float16
    values[where] = dtype(-1000.0)
    amax = cuda.to_device(np.zeros(1, np.int64))
    codes = cuda.to_device(values.view(np.int16))
    launch_kernel = tensor_amax.amax_codes_kernel(half)
    launch_kernel[2, 32](codes, amax)
    assert np.int64(amax.copy_to_host()[0]) == np.float32(1000.0).view(np.int32)


def test_16_bit_sources_need_8_byte_alignment():
    bfmt = PRESETS["mxfp8_e4m3"]
    assert not block_groups.eligible(bfmt, 64, 64, 4, 16, 0, 0, 2)       # x off 8 bytes
    assert not block_groups.eligible(bfmt, 64, 64, 16, 16, 0, 0, 2)      # out over x
    assert block_groups.eligible(bfmt, 64, 64, 8, 256, 0, 0, 2)


@pytest.mark.skipif(not GPU, reason="torch CUDA tensors need a GPU (LPSIM_TEST_GPU=1)")
def test_torch_16_bit_tensors_equal_the_cpu(launches, monkeypatch):
    """bfloat16 and float16 tensors through lpsim.quantize: MX formats and NVFP4 read the
    codes (one launch each; NVFP4's scale, given or found from the codes on the device);
    every result is the CPU's float32 bits.  A request's later calls (MX counted or not,
    NVFP4 finding its scale) take its route (raw launches of the codes' kernels), per
    dtype."""
    import torch
    monkeypatch.setattr(block_groups, "_ROUTES", {})
    monkeypatch.setattr(block_groups, "_COUNTED", {})
    for dtype in (torch.bfloat16, torch.float16):
        t = torch.from_numpy(data((16, 256), seed=9)).to(dtype).cuda()
        x = t.float().cpu().numpy()
        for fmt, kw in (("mxfp8_e4m3", {}), ("mxfp4", {"seed": 1}), ("nvfp4", {})):
            rounding = "stochastic" if "seed" in kw else "nearest"
            expected = lpsim.quantize(x, fmt, rounding, **kw)
            got = lpsim.quantize(t, fmt, rounding, **kw)
            assert got.dtype == torch.float32
            assert np.array_equal(got.cpu().numpy().view(np.int32), expected.view(np.int32))
        expected = quantize_blocks(x, "nvfp4", tensor_scale=0.25, want_elements=False).values
        got = cuda_blocks.quantize(t, "nvfp4", tensor_scale=0.25)
        assert np.array_equal(got.cpu().numpy().view(np.int32), expected.view(np.int32))
        stats, want = lpsim.RoundingStats(), lpsim.RoundingStats()
        lpsim.quantize(t, "mxfp8_e4m3", stats=stats)
        lpsim.quantize(x, "mxfp8_e4m3", stats=want)
        assert stats == want
    # per dtype: the two MX calls, NVFP4 with its scale found and with it given, the counted
    # MX call
    assert len(launches) == 10
    for dtype in (torch.bfloat16, torch.float16):
        t = torch.from_numpy(data((16, 256), seed=10)).to(dtype).cuda()
        x = t.float().cpu().numpy()
        for fmt, kw in (("mxfp8_e4m3", {}), ("mxfp4", {"seed": 2}), ("nvfp4", {})):
            rounding = "stochastic" if "seed" in kw else "nearest"
            got = lpsim.quantize(t, fmt, rounding, **kw)
            expected = lpsim.quantize(x, fmt, rounding, **kw)
            assert np.array_equal(got.cpu().numpy().view(np.int32), expected.view(np.int32))
        stats, want = lpsim.RoundingStats(), lpsim.RoundingStats()
        got = lpsim.quantize(t, "mxfp8_e4m3", stats=stats)
        expected = lpsim.quantize(x, "mxfp8_e4m3", stats=want)
        assert np.array_equal(got.cpu().numpy().view(np.int32), expected.view(np.int32))
        assert stats == want
    assert len(launches) == 10, block_groups.ROUTE_ERRORS
    halves = [r for routes in (block_groups._ROUTES, block_groups._COUNTED)
              for key, r in routes.items() if key[5]]         # (the key's 16-bit kind)
    # per dtype: MXFP8, MXFP4, NVFP4 found, NVFP4 given, MXFP8 counted
    assert len(halves) == 10 and all(r is not None and r.in_bytes == 2 for r in halves), \
        block_groups.ROUTE_ERRORS


@pytest.mark.skipif(not GPU, reason="torch CUDA tensors need a GPU (LPSIM_TEST_GPU=1)")
def test_torch_tensors_equal_the_cpu(launches, monkeypatch):
    """Each format's first call launches through numba and builds its request's raw route,
    which later calls take: MX formats one kernel (their BlockParams are fixed), NVFP4
    three (its tensor scale found on the device on every call, then its blocks)."""
    import torch
    monkeypatch.setattr(block_groups, "_ROUTES", {})
    for fmt in ("mxfp8_e4m3", "nvfp4", "mxfp4"):
        x = data((64, 256), seed=8)
        expected = lpsim.quantize(x, fmt, "stochastic", seed=3)
        t = torch.from_numpy(x).cuda()
        got = lpsim.quantize(t, fmt, "stochastic", seed=3)
        assert np.array_equal(got.cpu().numpy().view(np.int32), expected.view(np.int32))
        y = torch.empty_like(t)
        assert lpsim.quantize(t, fmt, "stochastic", seed=3, out=y) is y
        assert torch.equal(y.view(torch.int32), got.view(torch.int32))
        z = lpsim.quantize(t[:, :128].contiguous(), fmt, "stochastic", seed=3, offset=4)
        want = lpsim.quantize(np.ascontiguousarray(x[:, :128]), fmt, "stochastic", seed=3,
                              offset=4)
        assert np.array_equal(z.cpu().numpy().view(np.int32), want.view(np.int32))
        if fmt == "nvfp4":                      # the route finds each tensor's own scale
            small = t * 2.0 ** -20
            got = lpsim.quantize(small, fmt, "stochastic", seed=3)
            want = lpsim.quantize(small.cpu().numpy(), fmt, "stochastic", seed=3)
            assert np.array_equal(got.cpu().numpy().view(np.int32), want.view(np.int32))
    assert len(launches) == 3                  # each format's first call
    routes = {key[0].name: route for key, route in block_groups._ROUTES.items()}
    assert set(routes) == {"mxfp8_e4m3", "mxfp4", "nvfp4"}, block_groups.ROUTE_ERRORS
    assert isinstance(routes["nvfp4"], block_groups.ScaledBlockRoute)
    assert all(r is not None for r in routes.values()), block_groups.ROUTE_ERRORS


@pytest.mark.skipif(not GPU, reason="torch CUDA tensors need a GPU (LPSIM_TEST_GPU=1)")
def test_nvfp4_with_its_tensor_scale_given_takes_a_route(launches, monkeypatch):
    """NVFP4 with the caller's tensor scale: the first call launches through numba and
    builds a route, which later calls take with their own scales (no route per scale),
    each the CPU's bits; a bad scale is still refused by name, a counted call still takes
    numba's launch."""
    import torch
    monkeypatch.setattr(block_groups, "_ROUTES", {})
    x = data((32, 256), seed=11)
    t = torch.from_numpy(x).cuda()
    for scale in (0.25, 0.25, 3.0, 1e-3):
        for rounding, kw in (("nearest", {}), ("stochastic", {"seed": 4})):
            want = quantize_blocks(x, "nvfp4", rounding, tensor_scale=scale,
                                   want_elements=False, **kw).values
            got = cuda_blocks.quantize(t, "nvfp4", rounding, tensor_scale=scale, **kw)
            assert np.array_equal(got.cpu().numpy().view(np.int32), want.view(np.int32))
    assert len(launches) == 2                  # the first call of each rounding
    given = [r for key, r in block_groups._ROUTES.items() if key[-1]]
    assert len(given) == 2 and all(type(r) is block_groups.BlockRoute for r in given), \
        block_groups.ROUTE_ERRORS
    with pytest.raises(ValueError, match="tensor_scale=inf"):
        cuda_blocks.quantize(t, "nvfp4", tensor_scale=float("inf"))
    stats = BlockStats()
    cuda_blocks.quantize(t, "nvfp4", tensor_scale=0.25, stats=stats)
    assert len(launches) == 3


@pytest.mark.skipif(not GPU, reason="torch CUDA tensors need a GPU (LPSIM_TEST_GPU=1)")
def test_counted_torch_calls_take_a_route_with_the_cpus_counters(launches, monkeypatch):
    """A counted MX or NVFP4 call's first launch builds its request's counted route, which
    later counted calls take with their own stats objects: values and every counter equal
    the CPU's (two stats objects, so the counters array is each call's own)."""
    import torch
    monkeypatch.setattr(block_groups, "_COUNTED", {})
    x = data((64, 256), seed=9)
    t = torch.from_numpy(x).cuda()
    for fmt, rounding in (("mxfp8_e4m3", "nearest"), ("mxfp4", "stochastic"),
                          ("nvfp4", "stochastic")):
        for calls in (1, 3):
            want, got = BlockStats(), BlockStats()
            for j in range(calls):
                expected = lpsim.quantize(x, fmt, rounding, seed=j, stats=want)
                out = lpsim.quantize(t, fmt, rounding, seed=j, stats=got)
                assert np.array_equal(out.cpu().numpy().view(np.int32),
                                      expected.view(np.int32))
            assert got == want
    assert len(launches) == 3                  # each request's first call
    routes = {key[0].name: route for key, route in block_groups._COUNTED.items()}
    assert isinstance(routes.pop("nvfp4"), block_groups.ScaledBlockRoute), \
        block_groups.ROUTE_ERRORS
    assert all(isinstance(r, block_groups.CountedBlockRoute) for r in routes.values()), \
        block_groups.ROUTE_ERRORS


@pytest.mark.skipif(not GPU, reason="torch CUDA tensors need a GPU (LPSIM_TEST_GPU=1)")
def test_torch_route_refuses_what_the_general_path_refuses(monkeypatch):
    """With a route in place, calls it does not cover still take the general path and
    its checks: an unaligned stochastic offset, another axis, a wrong out, a bad seed."""
    import torch
    monkeypatch.setattr(block_groups, "_ROUTES", {})
    x = data((8, 64), seed=2)
    t = torch.from_numpy(x).cuda()
    lpsim.quantize(t, "mxfp8_e4m3", "stochastic", seed=1)             # builds the route
    assert any(r is not None for r in block_groups._ROUTES.values())
    got = lpsim.quantize(t, "mxfp8_e4m3", "stochastic", seed=1, offset=2)
    want = lpsim.quantize(x, "mxfp8_e4m3", "stochastic", seed=1, offset=2)
    assert np.array_equal(got.cpu().numpy().view(np.int32), want.view(np.int32))
    got = lpsim.quantize(t, "mxfp8_e4m3", "stochastic", seed=1, axis=0)
    want = lpsim.quantize(x, "mxfp8_e4m3", "stochastic", seed=1, axis=0)
    assert np.array_equal(got.cpu().numpy().view(np.int32), want.view(np.int32))
    with pytest.raises(ValueError, match="seed"):
        lpsim.quantize(t, "mxfp8_e4m3", "stochastic", seed=-1)
    with pytest.raises((ValueError, TypeError)):
        lpsim.quantize(t, "mxfp8_e4m3", "stochastic", seed=1, out=torch.empty(3, device="cuda"))


@pytest.mark.skipif(not GPU, reason="torch CUDA tensors need a GPU (LPSIM_TEST_GPU=1)")
@pytest.mark.parametrize("fmt, rounding, kw", [("mxfp8_e4m3", "stochastic", {"seed": 4}),
                                               ("nvfp4", "nearest", {}),
                                               ("mxfp4", "nearest", {"stats": True})])
def test_torch_tensors_blocked_along_another_axis_take_these_kernels(fmt, rounding, kw,
                                                                     launches):
    """A torch tensor blocked along an axis that is not its last goes through these
    kernels on a copy with that axis last (not the general kernel, which waits for the
    tensor's stream): the CPU's bits, counters and shape, for a 3-D tensor and a
    channels_last 4-D one."""
    import torch
    cases = [(data((64, 3, 40), seed=5), 0), (data((2, 32, 5, 3), seed=6), 1)]
    for x, axis in cases:
        t = torch.from_numpy(x).cuda()
        if x.ndim == 4:
            t = t.to(memory_format=torch.channels_last)
        want_stats, got_stats = BlockStats(), BlockStats()
        extra = {k: v for k, v in kw.items() if k != "stats"}
        want = lpsim.quantize(x, fmt, rounding, axis=axis,
                              stats=want_stats if "stats" in kw else None, **extra)
        got = lpsim.quantize(t, fmt, rounding, axis=axis,
                             stats=got_stats if "stats" in kw else None, **extra)
        assert got.shape == t.shape
        assert np.array_equal(got.cpu().numpy().view(np.int32), want.view(np.int32))
        assert got_stats == want_stats
    assert len(launches) == len(cases)


@pytest.mark.skipif(not GPU, reason="torch CUDA tensors need a GPU (LPSIM_TEST_GPU=1)")
def test_torch_block_calls_follow_the_torch_rules_on_a_gpu():
    """A CUDA tensor that requires grad (a parameter: its array interface raises), a lazily
    negated view and ``out=`` go through lpsim.quantize's torch rules as on the CPU: the
    straight-through gradient, the negated values, out written; the CPU's bits each."""
    import torch
    x = data((4, 64), seed=9)
    want = lpsim.quantize(x, "mxfp8_e4m3")
    p = torch.nn.Parameter(torch.from_numpy(x).cuda())
    y = lpsim.quantize(p, "mxfp8_e4m3")
    assert y.requires_grad
    assert np.array_equal(y.detach().cpu().numpy().view(np.int32), want.view(np.int32))
    y.sum().backward()
    assert torch.equal(p.grad, torch.ones_like(p))
    negated = torch._neg_view(torch.from_numpy(x).cuda())
    got = lpsim.quantize(negated, "mxfp8_e4m3")
    assert np.array_equal(got.cpu().numpy().view(np.int32),
                          lpsim.quantize(-x, "mxfp8_e4m3").view(np.int32))
    out = torch.empty(4, 64, device="cuda")
    assert lpsim.quantize(torch.from_numpy(x).cuda(), "mxfp8_e4m3", out=out) is out
    assert np.array_equal(out.cpu().numpy().view(np.int32), want.view(np.int32))


@pytest.mark.parametrize("half", [0, 1, 2])
def test_nvfp4_route_compiles_the_kernels_numbas_dispatch_picks(monkeypatch, half):
    """The raw route of NVFP4 with a found tensor scale compiles each of its three kernels
    for the argument types the numba path launches them with (the scale kernel's divisor is
    a float32; ``half``: the amax and block kernels of bfloat16 or float16 codes), so it
    runs the same specialisation; no GPU needed: the compiles are stood in for, the types
    recorded."""
    import numba

    from lpsim.blocks import block_params, parse_block_format
    from lpsim.blocks.amax import min_tensor_scale
    from lpsim_cuda import specialised, tensor_amax
    compiled = {}

    class Recorder:
        def __init__(self, kern, mode, out_bytes, signature=None, in_bytes=4):
            compiled[kern] = tuple(signature)
    class BlockRecorder:                   # BlockRoute compiles block_groups._signature
        def __init__(self, kern, mode, bp, bfmt, ts=None, half=0):
            self.in_bytes = 2 if half else 4
            compiled[kern] = tuple(block_groups._signature(ts is not None, self.in_bytes))
    monkeypatch.setattr(specialised, "Route", Recorder)
    monkeypatch.setattr(block_groups, "BlockRoute", BlockRecorder)
    amax, ts = np.zeros(1, np.int64), np.zeros(2, np.float64)
    monkeypatch.setattr(tensor_amax, "scratch", lambda: (amax, ts))
    bfmt = parse_block_format("nvfp4")
    bp = block_params(bfmt, 1.0)
    kern = object()
    block_groups.ScaledBlockRoute(kern, 0, bp, bfmt, half=half)
    xb = np.zeros(16, np.int16 if half else np.int32)
    # what device_tensor_scale and launch_flat pass
    launched = {
        tensor_amax.amax_codes_kernel(half) if half else tensor_amax.amax32_kernel: (xb, amax),
        tensor_amax.tensor_scale_kernel: (amax, bfmt.tensor_scale_divisor,
                                          min_tensor_scale(bfmt), ts),
        kern: (xb, np.zeros(16, np.float32), 16, bp.pts, bp.pts_inv, 1, 2, 3, 4, ts,
               np.zeros(11, np.int64)),
    }
    for k, args in launched.items():
        assert compiled[k] == tuple(numba.typeof(a) for a in args), k


COUNTED_CHECK = r"""
import sys
import numpy as np
from numba.core import sigutils
sys.path.insert(0, "tests")
from flat_stand_ins import Device, flatten
from lpsim_cuda import block_groups, specialised

xb, outf = Device(1024, np.int32, 0x7F0000001000), Device(1024, np.float32, 0x7F0000002000)
ts, counts = Device(2, np.float64, 0x7F0000003000), Device(11, np.int64, 0x7F0000004000)
route = block_groups.CountedBlockRoute.__new__(block_groups.CountedBlockRoute)
stand_in = Device(9, np.int64, 0x7F0000008000)
route.scale, route.tail, route.in_bytes = (0.5, 2.0), (ts, stand_in), 4
route.fix()
keys = (11, 22, 33, 44)
args = (xb, outf, 1024, *route.scale, *keys, ts, counts)
theirs = flatten(block_groups._signature(True), args)
mine = route.arguments(xb.ptr, outf.ptr, 1024, keys, counts)
other = route.arguments(xb.ptr, outf.ptr, 1024, keys, Device(11, np.int64, 0x7F0000005000))
uncounted = flatten(block_groups._signature(True), args[:-1] + (stand_in,))
print("uncounted", specialised._same(route.arguments(xb.ptr, outf.ptr, 1024, keys), uncounted))
print("same", specialised._same(mine, theirs), len(mine),
      "moved", other[-3] == 0x7F0000005000 and specialised._same(other[:-3], mine[:-3]))
# the route of a bfloat16 or float16 tensor's codes (2 bytes a value in)
route.in_bytes = 2
codes = Device(1024, np.int16, 0x7F0000009000)
args = (codes, outf, 1024, *route.scale, *keys, ts, counts)
print("codes", specialised._same(route.arguments(codes.ptr, outf.ptr, 1024, keys, counts),
                                 flatten(block_groups._signature(True, 2), args)))
# NVFP4 of 16-bit codes whose scale is found: the amax launch reads the codes (2 bytes each)
import types as pytypes
from numba.core import types
scaled, launched = block_groups.ScaledBlockRoute.__new__(block_groups.ScaledBlockRoute), []
amax = Device(1, np.int64, 0x7F000000A000)
scaled.in_bytes, scaled.scale_flat = 2, []
scaled.amax_flat = specialised._array_arguments(amax.ptr, 1, 8)
scaled.amax = scaled.scale = pytypes.SimpleNamespace(
    launch=lambda stream, blocks, flat: launched.append(flat))
scaled.block = lambda *args: None
scaled(codes.ptr, outf.ptr, 1024, keys, 0, 3)
print("amax", specialised._same(launched[0], flatten((types.int16[::1], types.int64[::1]),
                                                     (codes, amax))))
# an element format's counted route (specialised.CountedRoute): codes of 2 bytes in, float32
# bits out, the stats object's accumulator (seven slots)
route = specialised.CountedRoute.__new__(specialised.CountedRoute)
route.in_bytes, route.out_bytes = 2, 4
codes, slots = Device(1024, np.int16, 0x7F0000006000), Device(7, np.int64, 0x7F0000007000)
args = (codes, outf, 1024, 11, 22, 33, 44, slots)
theirs = flatten(sigutils.normalize_signature(specialised.kernel_signature(4, 2, True))[0],
                 args)
mine = route.counted_arguments(codes.ptr, outf.ptr, 1024, (11, 22, 33, 44), slots)
print("element", specialised._same(mine, theirs), len(mine))
# NVFP4 with the caller's tensor scale: a plain route built at one scale, called at another
route = block_groups.BlockRoute.__new__(block_groups.BlockRoute)
route.scale, route.tail, route.in_bytes = (0.5, 2.0), (), 4
route.fix()
theirs = flatten(block_groups._signature(), (xb, outf, 1024, 0.25, 4.0, *keys))
mine = route.arguments(xb.ptr, outf.ptr, 1024, keys, None, (0.25, 4.0))
print("given", specialised._same(mine, theirs), len(mine))
"""


def test_the_counted_routes_flatten_as_numba_does():
    """A counted call's raw launch (block_groups.CountedBlockRoute for block formats,
    specialised.CountedRoute for element formats) builds the flat arguments numba's launch
    builds for the counting kernel's signature (numba's flattening run on stand-ins of device
    arrays, no GPU), each call's counters array in its own place.  On a GPU the route checks
    the same once against the real launch."""
    out = without_simulator(COUNTED_CHECK)
    assert out.split() == ["uncounted", "True", "same", "True", "35", "moved", "True",
                           "codes", "True", "amax", "True", "element", "True", "26",
                           "given", "True", "21"], out
