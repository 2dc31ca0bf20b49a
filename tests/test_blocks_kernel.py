"""The block kernel's thresholds against lpsim.reference: chunks, threads, the fast and the
exact element step, partial last blocks; and the shared element decision at the points where
a fast path is easiest to get wrong (full-width SR with a rest wider than its random word,
values far below the element format's smallest subnormal)."""

import numpy as np
import pytest
from numba import njit

import lpsim
from lpsim import blocks, reference
from lpsim.rounding import (DETERMINISTIC_MODES, MODES, STOCHASTIC, kernel_params, round_bits,
                            round_fast_sub)
from lpsim.blocks.decisions import (block_params, element_fast32, element_params32,
                                    element_stochastic32)
from lpsim.blocks.word_scales import pow2_words
from lpsim.word32 import as_int64, word

from test_blocks import same


def sweep_data(rows, length, dtype, seed):
    """Normal values of a few magnitudes plus every case that leaves the fast element step:
    NaN and inf (in a
    ``nonfinite="finite"`` block), float64 subnormal quotients, values 2**-60 under their
    block's largest one (rest wider than 62 bits), zeros of both signs."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, length)) * 2.0 ** (rng.integers(-8, 8, (rows, length)) // 4)
    x = x.astype(dtype)
    flat = x.reshape(-1)
    picks = rng.choice(flat.size, size=min(flat.size, 12), replace=False)
    tiny = 1e-300 if dtype == np.float64 else 1e-30
    specials = [np.nan, 0.0, -0.0, 7.5, np.inf, -np.inf, tiny, -tiny, 2.0 ** -60, 3e-39,
                5e-324, -1e-40]
    flat[picks] = np.array(specials[:picks.size], dtype)
    return x


def reference_of(x, bfmt, rounding, got, seed=None, stream=0, offset=0, sr_bits=None):
    bfmt = blocks.parse_block_format(bfmt)
    uniforms = None
    if rounding.startswith("stochastic"):
        words = lpsim.philox.random_words(x.size, x.dtype.itemsize, seed, stream, offset)
        width = lpsim.philox.WORD_BITS[x.dtype.itemsize]
        uniforms = [[reference.Fraction(int(r), 2 ** width) for r in row]
                    for row in np.array(words, dtype=object).reshape(x.shape)]
    return reference.quantize_blocks(x, bfmt, rounding, uniforms=uniforms, sr_bits=sr_bits,
                                     tensor_scale=got.tensor_scale if bfmt.tensor_scale else None)


def assert_equal_to_reference(x, bfmt, rounding, **kw):
    got = blocks.quantize_blocks(x, bfmt, rounding, **kw)
    values, elements, scales, counts = reference_of(x, bfmt, rounding, got, **kw)
    assert same(got.scales, scales)
    assert same(got.elements, elements)
    assert same(got.values, values)
    assert np.array_equal(got.counts, counts)
    # lpsim.quantize without stats skips the counters in a loop of its own: the same values
    assert same(lpsim.quantize(x, bfmt, rounding, **kw), values)
    return got


# rows x length: one element, a partial block only, exact blocks, a partial last block per
# row, rows shorter than a block, and (with CHUNK lowered) many chunks with rows across them
SHAPES = [(1, 1), (1, 5), (2, 32), (3, 40), (5, 7), (4, 100), (1, 333)]




@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: d.__name__)
@pytest.mark.parametrize("bfmt", ["mxfp4", "nvfp4", blocks.block("e4m3fn", 16, nonfinite="finite"),
                                  blocks.block("e3m2fn", 8, "ue4m3", "rceil")], ids=str)
@pytest.mark.parametrize("threads", ["serial", "threaded"])
def test_sizes_across_every_threshold_equal_the_reference(bfmt, dtype, threads, monkeypatch):
    if threads == "threaded":
        monkeypatch.setattr(blocks.kernels, "CHUNK", 64)
        monkeypatch.setattr(blocks.kernels, "SERIAL_BELOW", 128)
        monkeypatch.setattr(blocks.kernels, "PARALLEL_GRAIN", 64)
    for i, (rows, length) in enumerate(SHAPES):
        x = sweep_data(rows, length, dtype, seed=i)
        assert_equal_to_reference(x, bfmt, "nearest")
        assert_equal_to_reference(x, bfmt, "stochastic", seed=5, stream=1, offset=3)
    x = sweep_data(3, 100, dtype, seed=9)
    for rounding in DETERMINISTIC_MODES[1:]:
        assert_equal_to_reference(x, bfmt, rounding)
    assert_equal_to_reference(x, bfmt, "stochastic", seed=6, sr_bits=3)
    assert_equal_to_reference(x, bfmt, "stochastic_equal", seed=7, offset=1)


@pytest.mark.parametrize("rule", ["floor", "ceil", "even", "rceil"])
def test_power_of_two_scales_of_zero_and_subnormal_amaxes_equal_the_reference(rule):
    """The float32 word kernel's power-of-two scale from the amax's exponent field
    (lpsim.blocks.word_scales.pow2_words) for blocks of zeros and of float32 subnormals up
    to 2**-127: E8M0 with e4m3 takes it (such a scale clamps to the least), E8M0 with
    fp(3, 2, 6), whose largest exponent is -3, must not."""
    x = np.zeros((4, 32), np.float32)
    x[1] = np.float32(2.0 ** -131) * np.arange(-16, 16, dtype=np.float32)
    x[2] = np.float32(2.0 ** -140) * np.arange(-16, 16, dtype=np.float32)
    x[3] = np.linspace(-3, 3, 32, dtype=np.float32)
    for element in ("e4m3fn", "fp(3,2,6)"):
        for rounding in ("nearest", "stochastic"):
            assert_equal_to_reference(x, blocks.block(element, 32, rule=rule), rounding,
                                      seed=1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: d.__name__)
def test_blocks_of_container_subnormals_equal_the_reference(dtype):
    """A block whose largest magnitude is a subnormal of the container (its amax is read from
    the container bits), next to blocks of normal values."""
    tiny = np.finfo(dtype).smallest_subnormal
    x = np.zeros((2, 40), dtype)
    x[0, :32] = tiny * np.arange(-16, 16)
    x[0, 32:] = tiny * 3
    x[1] = np.linspace(-5, 5, 40)
    x[1, 5] = tiny
    for rounding in ("nearest", "up", "stochastic"):
        for bfmt in ("mxfp4", blocks.block("e4m3fn", 8, nonfinite="finite")):
            assert_equal_to_reference(x, bfmt, rounding, seed=1)


@pytest.mark.parametrize("bfmt", ["mxfp4", "mxfp8_e5m2", "nvfp4",
                                  blocks.block("e3m2fn", 8, "ue4m3", "rceil")], ids=str)
def test_float32_steps_whose_product_underflows_equal_the_reference(bfmt):
    """The float32 word step computes x / s as a float32 product; next to 1e30, x = 1e-45
    gives a product that underflows to 0 (or to a float32 subnormal), where x / s is not 0:
    rounding up or to odd gives the element's smallest value, so the step must hand these
    to the exact float64 step."""
    x = np.zeros((4, 32), np.float32)
    x[:, 0] = 1e30
    x[:, 1:] = np.float32(1e-45) * np.arange(1, 32)
    x[1, 1:] *= -1
    x[2, 1:] = np.float32(3e-39)
    x[3, 0] = 3.0
    x[3, 1:] = np.float32(1e-45) * np.arange(1, 32)                # a subnormal product
    for rounding in ("nearest", "up", "down", "odd", "toward_zero"):
        assert_equal_to_reference(x, bfmt, rounding)
    assert_equal_to_reference(x, bfmt, "stochastic", seed=3)


def test_threaded_large_array_equals_the_serial_kernel(monkeypatch):
    """A 2**19-element array runs on the thread pool; the calling thread alone gives the same
    bits and counts (the random words are counter-based)."""
    x = sweep_data(128, 4100, np.float32, seed=10)        # 4100: a partial block per row
    for rounding in ("nearest", "stochastic"):
        threaded = blocks.quantize_blocks(x, "mxfp4", rounding, seed=3)
        with monkeypatch.context() as m:
            m.setattr(blocks.kernels, "SERIAL_BELOW", 1 << 62)
            serial = blocks.quantize_blocks(x, "mxfp4", rounding, seed=3)
        assert same(threaded.values, serial.values) and same(threaded.scales, serial.scales)
        assert np.array_equal(threaded.counts, serial.counts)
    # and the serial kernel against the scalar core: q = round(x / s) in the element format
    got = blocks.quantize_blocks(x[:4], "mxfp4", "nearest")
    s = np.repeat(got.scales, 32, axis=1)[:, :4100]
    finite = np.isfinite(s)
    y = np.where(finite, x[:4].astype(np.float64) / np.where(finite, s, 1), np.nan)
    want = lpsim.quantize(y, blocks.PRESETS["mxfp4"].saturating_element)
    assert same(got.elements[finite], want[finite])


@njit
def _fast_and_exact(xb, mode, rs, k, p, fast, slow, oks, fflags, sflags):
    for i in range(xb.size):
        fast[i], oks[i], fflags[i] = round_fast_sub(xb[i], mode, rs[i], k, p)
        slow[i], sflags[i] = round_bits(xb[i], mode, rs[i], k, p)


@njit
def _fast_on_words_and_exact(xb, mode, rs, k, p, fast, slow, oks, fflags, sflags):
    # as the float32 block kernel runs it: bits and random words as lpsim.word32 words
    for i in range(xb.size):
        bits, ok, flags = round_fast_sub(word(xb[i]), mode, word(rs[i]), k, p)
        fast[i], oks[i], fflags[i] = as_int64(bits), as_int64(ok), as_int64(flags)
        slow[i], sflags[i] = round_bits(np.int64(xb[i]), mode, np.int64(rs[i]), k, p)


def fast_and_exact(x, mode, rs, k, p):
    """(fast bits, exact bits, ok, fast flags, exact flags) of round_fast_sub and round_bits
    on the values x: float64 containers on int64, float32 containers on 32-bit words (bits
    compared as unsigned 32-bit patterns)."""
    out = [np.empty(x.size, np.int64) for _ in range(5)]
    if x.dtype == np.float32:
        _fast_on_words_and_exact(x.view(np.int32), mode, rs.astype(np.uint32), k, p, *out)
        out[1] &= 0xFFFFFFFF
    else:
        _fast_and_exact(x.view(np.int64), mode, rs.astype(np.int64), k, p, *out)
    return out


CONTAINERS = [(np.float64, 32), (np.float64, 62), (np.float32, 32)]


@pytest.mark.parametrize("container, W", CONTAINERS, ids=lambda c: getattr(c, "__name__", c))
@pytest.mark.parametrize("fmt", ["e2m1fn", "e4m3fn", "fp(4,3,0, subnormals=False)",
                                 "fp(1,6,1, specials='fnuz', saturate=True)", "e5m2"])
def test_fast_element_step_equals_round_bits_where_sr_is_hardest(fmt, container, W):
    """Full-width SR rounds the rest up to W bits (round_bits' t); the fast step must too,
    when the rest is wider than W (a float64 register with float32 words) and when it is
    wider than 62 bits (values far below min_subnormal); in float32 containers the step runs
    on 32-bit words.  R is set to the threshold itself and its neighbours, where a floor and
    a ceiling differ; every mode, few-bit SR too."""
    fmt = lpsim.parse_format(fmt)
    p = kernel_params(fmt, container)._replace(W=W)
    rng = np.random.default_rng(12)
    low = max(fmt.emin - 80, -125) if container == np.float32 else fmt.emin - 80
    mag = 2.0 ** rng.integers(low, fmt.emax, 3000).astype(np.float64)
    x = mag * (1 + rng.random(3000))
    tiny = np.finfo(container).tiny
    x[::7] = np.maximum(fmt.min_subnormal * 2.0 ** -rng.integers(1, 1000, x[::7].size),
                        tiny * (1 + rng.random(x[::7].size)))                 # far below
    x = np.concatenate([x, -x]).astype(container)
    # R at the top W bits of each rest (as a fraction of its quantum 2**q), and next to it:
    # a floor and a ceiling differ there when the rest has more bits than W
    xd = x.astype(np.float64)
    _, ex = np.frexp(np.abs(xd))
    q = np.maximum(ex - 1 - fmt.m, fmt.emin - fmt.m if fmt.subnormals else fmt.emin)
    frac = np.ldexp(np.abs(xd), -q) % 1.0
    top = np.floor(np.ldexp(frac, W)).astype(np.int64)
    for mode in MODES.values():
        for k in (W, 3):
            for shift in (0, -1, 1):
                rs = np.clip(top + shift, 0, 2 ** W - 1) if k == W else \
                    rng.integers(0, 2 ** W, x.size)
                fast, slow, oks, fflags, sflags = fast_and_exact(x, mode, rs, k, p)
                ok = oks == 1
                assert ok.mean() > 0.9, (mode, k)
                bad = np.flatnonzero(ok & ((fast != slow) | (fflags != sflags)))
                assert bad.size == 0, (mode, k, shift, x[bad[:3]], rs[bad[:3]])


@pytest.mark.parametrize("bfmt, rounding", [
    (blocks.block("e2m1fn", 5), "stochastic"),          # 5 of 8 lanes busy per block
    (blocks.block("e4m3fn", 40, nonfinite="finite"), "nearest"),   # two elements per lane
    (blocks.block("e3m2fn", 64, "ue4m3", "rceil"), "up"),
])
def test_cuda_kernel_lanes_and_groups_equal_the_cpu_kernel(bfmt, rounding):
    """lpsim_cuda's groups of lanes: blocks shorter than their group, longer than a warp, a
    partial last block, NaN and inf in a finite-rule block: the CPU kernel's bits and counts
    (the CUDA simulator unless LPSIM_TEST_GPU=1)."""
    from numba import cuda

    import lpsim_cuda.blocks
    x = sweep_data(2, 100, np.float32, seed=21)
    kw = dict(seed=8, stream=1, offset=5)
    want = blocks.quantize_blocks(x, bfmt, rounding, **kw)
    got, _ = lpsim_cuda.blocks.quantize_blocks(cuda.to_device(x), bfmt, rounding, **kw)
    assert same(got.values.copy_to_host(), want.values)
    assert same(got.elements.copy_to_host(), want.elements)
    assert same(got.scales.copy_to_host(), want.scales)
    assert np.array_equal(got.counts, want.counts)


def word_kernel_data(rows, length, seed):
    """float32 blocks whose largest magnitude lies anywhere in float32's range (subnormals
    and near its largest value included), elements down to 2**-40 under it, a third of them
    ties at a random bit (some land on the element grid: ties to even), zeros of both signs,
    and a few NaN and inf."""
    rng = np.random.default_rng(seed)
    top = rng.integers(-149, 128, (rows, length // 16 + 1)).repeat(16, axis=1)[:, :length]
    e = np.maximum(top - rng.integers(0, 40, (rows, length)), -149)
    x = np.ldexp(1 + 0.99 * rng.random((rows, length)), e).astype(np.float32)
    bits = x.view(np.uint32)
    cut = rng.integers(1, 24, (rows, length)).astype(np.uint32)
    tie = rng.random((rows, length)) < 1 / 3
    bits[tie] = ((bits[tie] >> cut[tie]) << cut[tie]) | (np.uint32(1) << (cut[tie] - 1))
    x *= rng.choice(np.float32([-1, 1]), (rows, length))
    flat = x.reshape(-1)
    picks = rng.choice(flat.size, 12, replace=False)
    flat[picks] = np.float32([0, -0.0, 0, -0.0, np.nan, np.inf, -np.inf, 0, -0.0, 0, 0, 0])
    return x


WORD_FORMATS = ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4", "mxint8",
                "nvfp4", blocks.block("e2m1fn", 16, "e4m3fn", "even"),
                blocks.block("e5m2", 16, rule="even"), blocks.block("e3m2fn", 32, rule="ceil"),
                blocks.block("e2m3fn", 32, rule="rceil"), blocks.block("e4m3fn", 24),
                blocks.block("e2m1fn", 32, nonfinite="finite"),
                blocks.block("fp(3,2,0, subnormals=False)", 32),
                blocks.block("fp(3,0,0)", 32, "e8m0fnu", "floor")]   # m = 0: ties by code


@pytest.mark.parametrize("bfmt", WORD_FORMATS, ids=str)
def test_float32_word_kernel_equals_the_counted_kernel(bfmt):
    """lpsim.quantize without stats runs the float32 word kernel: its scale in integer steps
    (scale_words), nearest rounding as a float32 add (nearest32), blocks of 16 and 32 as
    loops of a literal length.  Against the counted kernel (reference-tested above), bit
    for bit, on 2**18 values per format built to reach every binade of every block, ties
    included; rows of 1029 end in a partial block, rows of 1024 do not (the word kernel
    finds a group's bounds in one step where its blocks are whole and in one row)."""
    bfmt = blocks.parse_block_format(bfmt)
    bp = blocks.block_params(bfmt, 1.0)
    # mxint8 (one unsigned zero), a format without subnormals and m = 0 take element_fast32
    e = bfmt.element
    assert bool(bp.near32) == (e.specials != "fnuz" and e.subnormals and e.m >= 1)
    assert bool(bp.snear32) == (not bfmt.pow2)
    for rows, length in ((256, 1029), (48, 1024)):
        x = word_kernel_data(rows, length, seed=len(str(bfmt)) + length)
        for rounding in ("nearest", "stochastic", "up"):
            counted = blocks.quantize_blocks(x, bfmt, rounding, seed=4)
            words = blocks.quantize_blocks(x, bfmt, rounding, seed=4, want_elements=False,
                                           want_counts=False)
            assert words.counts is None                     # the word kernel ran
            assert same(words.scales, counted.scales), (length, rounding)
            got, want = words.values.view(np.uint32), counted.values.view(np.uint32)
            bad = np.flatnonzero(got != want)
            assert bad.size == 0, (length, rounding, x.reshape(-1)[bad[:3]],
                                   got.reshape(-1)[bad[:3]], want.reshape(-1)[bad[:3]])


@njit(cache=True)
def _pow2_against_block_scale(bp, sp, bits):
    """The largest magnitude bits among ``bits`` whose scale_words scale (the integer steps
    of pow2_exponent where pow2_words holds) differs from block_scale's; -1 for none."""
    for a in bits:
        want, _ = blocks.block_scale(blocks.bits_value(a, 23, 127), bp, sp)
        if blocks.scale_words(word(np.int32(a)), bp, sp) != want:
            return a
    return np.int64(-1)


@pytest.mark.parametrize("element", ["e4m3fn", "e5m2", "e2m1fn", "e3m2fn", "e2m3fn",
                                     "fp(3,2,6)"])
def test_rceil_scales_from_integer_steps_equal_block_scale(element):
    """Under rceil the word kernels (rows, columns, lpsim_cuda's block groups) take the scale
    2**ceil(log2 d), d = fp32(amax / max), from d's bits (pow2_exponent) for every largest
    magnitude: equal to block_scale's float64 steps for every float32 bit pattern whose
    quotient is a subnormal (where d <= 2**-127 and 2**-127 < d < 2**-126 part), for 300
    patterns either side of each binade's first and for 2**20 random ones."""
    bfmt = blocks.block(element, 32, "e8m0fnu", "rceil")
    bp, sp = blocks.block_params(bfmt), kernel_params(bfmt.scale, np.float64)
    assert pow2_words(np.int64(0), bp)
    rng = np.random.default_rng(3)
    edges = (np.arange(255, dtype=np.int64)[:, None] << 23) + np.arange(-300, 300)
    top = float(np.float32(bfmt.saturating_element.max_finite)) * 2.0 ** -126
    low = np.arange(int(np.float32(top).view(np.int32)) + 2, dtype=np.int64)
    bits = np.concatenate((edges.reshape(-1), low,
                           rng.integers(0, 255 << 23, 1 << 20, dtype=np.int64)))
    bits = bits[(bits >= 0) & (bits < (255 << 23))]
    assert _pow2_against_block_scale(bp, sp, bits) == -1


@njit(cache=True)
def _steps_against_scale_words(bp, sp, extra):
    """Mismatches between :func:`lpsim.blocks._scale_steps`' table and scale_words (scale and
    reciprocal as the word kernel takes it) at every step, two bits either side of each, and
    the magnitude bits ``extra``; the number of scale values and the steps (none: no table)."""
    rct, ri0, rsh = blocks._reciprocals(bp, sp)
    base, thr, svals, rvals, kshift = blocks._scale_steps(bp, sp, rct, ri0, rsh, 1 << 30)
    # the steps: inside a bucket (thr) or on its first bits (where base moves on)
    starts = np.flatnonzero(base[1:] != base[:-1] + (thr[:-1] < (255 << 23))) + 1
    steps = np.sort(np.concatenate((thr[thr < (255 << 23)].astype(np.int64),
                                    starts.astype(np.int64) << kshift)))
    bad = 0
    for a in np.concatenate((steps - 2, steps - 1, steps, steps + 1, steps + 2, extra)):
        if base.size == 0 or a < 0 or a >= (np.int64(255) << 23):
            continue
        i = base[a >> kshift] + np.int64(a >= thr[a >> kshift])
        s = np.float32(blocks.scale_words(word(a), bp, sp))
        r = (as_int64(np.float32(s).view(np.int32)) >> rsh) - ri0
        rc = rct[r] if 0 <= r < rct.size else np.float32(bp.pts_inv) / s
        bad += np.int64(svals[i] != s) | np.int64(rvals[i] != rc)
    return bad, svals.size, steps


@pytest.mark.parametrize("bfmt", ["nvfp4", blocks.block("e2m1fn", 16, "fp(4,5)", "even"),
                                  blocks.block("e4m3fn", 32, "e5m2", "even")], ids=str)
@pytest.mark.parametrize("pts", [1.0, 3.7e-3, 1.2345e-30, 2.5e30, 1 / 3, 1.2535e35])
def test_scale_step_table_equals_scale_words(bfmt, pts):
    """The word kernel takes scales rounded to nearest (NVFP4's UE4M3) from a table of the
    steps of scale_words in the largest magnitude's bits, for calls of STEPS_FROM blocks or
    more: at every step, next to it, at 0, at the top and at 2**16 random bits, the table's
    scale and reciprocal are scale_words' own, for per-tensor scales from 1e-30 to 1e35 (where
    the last step lies just under float32's largest value)."""
    bfmt = blocks.parse_block_format(bfmt)
    bp = blocks.block_params(bfmt, float(np.float32(pts)))
    sp = kernel_params(bfmt.scale, np.float64)
    extra = np.concatenate([[0, 1, (255 << 23) - 1],
                            np.random.default_rng(7).integers(0, 255 << 23, 1 << 16)])
    bad, values, steps = _steps_against_scale_words(bp, sp, extra.astype(np.int64))
    assert values > 8 and steps.size == values - 1 and bad == 0, (values, steps.size, bad)


def test_word_kernel_takes_the_step_table_on_large_calls():
    """An NVFP4 call of 2**19 elements (32768 blocks: the call takes the table)
    equals the counted kernel bit for bit, to nearest: blocks whose largest magnitude is a
    step of the table or one bit either side of it, and random blocks over 2**-60 .. 2**60."""
    rng = np.random.default_rng(11)
    bfmt = blocks.parse_block_format("nvfp4")
    pts = 0.01171875
    _, _, steps = _steps_against_scale_words(blocks.block_params(bfmt, pts),
                                             kernel_params(bfmt.scale, np.float64),
                                             np.zeros(0, np.int64))
    x = (rng.standard_normal((128, 4096)) * np.exp2(rng.integers(-60, 60, (128, 256))
                                                    .repeat(16, axis=1))).astype(np.float32)
    tops = np.concatenate([steps - 1, steps, steps + 1]).astype(np.uint32).view(np.float32)
    x.reshape(-1, 16)[:tops.size] *= 0.5 * tops[:, None] / np.abs(x.reshape(-1, 16)[:tops.size]).max(1, keepdims=True)
    x.reshape(-1, 16)[:tops.size, 3] = tops * rng.choice([-1, 1], tops.size)
    assert x.size // 16 >= 2 * blocks.STEPS_FROM
    counted = blocks.quantize_blocks(x, bfmt, tensor_scale=pts)
    words = blocks.quantize_blocks(x, bfmt, tensor_scale=pts, want_elements=False,
                                   want_counts=False)
    assert words.counts is None
    assert same(words.scales, counted.scales)
    assert np.array_equal(words.values.view(np.uint32), counted.values.view(np.uint32))


def test_a_calls_tables_are_made_for_the_call_not_its_ranges():
    """The step table is made once a call, by the call's block count (a range of a thread
    holds fewer: a 2048 x 256 NVFP4 call on two threads is eight ranges of 4096 blocks, each
    of which made its own table, or divided per block below STEPS_FROM); the counted
    kernels' clip bounds are clip_bounds' own, 0 and 0 uncounted."""
    bfmt = blocks.parse_block_format("nvfp4")
    bp = blocks.block_params(bfmt, 0.01171875)
    sp = kernel_params(bfmt.scale, np.float64)
    small = blocks.kernels.tables_of(bp, sp, blocks.STEPS_FROM - 1, False)
    large = blocks.kernels.tables_of(bp, sp, blocks.STEPS_FROM, True)
    assert small[3][0].size == 0 and large[3][0].size > 0
    assert small[4:] == (0, 0)
    assert large[4:] == tuple(blocks.word_counts.clip_bounds(bp, sp)) and large[4] > 0
    rct, ri0, rsh = blocks._reciprocals(bp, sp)
    assert np.array_equal(large[0], rct) and large[1:3] == (ri0, rsh)
    mx = blocks.parse_block_format("mxfp8")                  # powers of two: no table
    mx_tables = blocks.kernels.tables_of(blocks.block_params(mx, 1.0),
                                         kernel_params(mx.scale, np.float64), 1 << 20, False)
    assert mx_tables[0].size == 0 and mx_tables[3][0].size == 0


@pytest.mark.parametrize("size", [16, 32, 5])
def test_block_amaxes_are_every_blocks_largest_magnitude(size, monkeypatch):
    """NVFP4's per-tensor pass also finds each block's largest magnitude bits (a NaN's or an
    inf's where the block holds one) and returns the largest finite magnitude: equal to
    numpy's on blocks with NaN, inf, -0 and subnormals, in one range and split over three
    threads (AMAX_GRAIN lowered)."""
    rng = np.random.default_rng(size)
    rows, length = 7, 12 * size
    x = (rng.standard_normal((rows, length))
         * np.exp2(rng.integers(-149, 120, (rows, length)))).astype(np.float32)
    flat = x.reshape(-1)
    flat[[2, size + 1, 5 * size, 9 * size + 3]] = [np.nan, np.inf, -np.inf, -np.nan]
    flat[11 * size:12 * size] = -0.0
    bits = (flat.view(np.uint32) & 0x7FFFFFFF).reshape(-1, size)
    finite = np.abs(flat[np.isfinite(flat)])
    for threads in (1, 3):
        monkeypatch.setattr(blocks.amax, "AMAX_GRAIN", 64 if threads > 1 else 1 << 20)
        monkeypatch.setattr(blocks.amax, "threads", lambda: threads)
        amax, bam = blocks.tensor_amaxes(x, size)
        assert amax == float(finite.max())
        assert bam.dtype == np.int32 and np.array_equal(bam, bits.max(axis=1))
    assert blocks.tensor_amaxes(np.full((2, size), np.nan, np.float32), size)[0] == 0.0


def test_tensor_amaxes_refuses_what_is_not_rows_of_whole_blocks():
    """Other dtypes, layouts and sizes are refused by name: a row length the size does not
    divide would put blocks across rows (it gave a silently misaligned amax array)."""
    rows = np.ones((2, 32), np.float32)
    for bad in (rows.astype(np.float64), rows.reshape(-1), rows.T, [[1.0] * 32]):
        with pytest.raises(TypeError, match="2-D C-contiguous float32"):
            blocks.tensor_amaxes(bad, 16)
    for size in (0, -16, 2 ** 70, 12, 1.5, True):
        with pytest.raises(ValueError, match=f"size={size!r}"):
            blocks.tensor_amaxes(rows, size)


@pytest.mark.parametrize("bfmt", ["nvfp4", blocks.block("e2m1fn", 16, "e4m3fn", "even",
                                                        tensor_scale=True, nonfinite="finite"),
                                  blocks.block("e2m1fn", 16, "e4m3fn", "even")], ids=str)
def test_word_kernel_with_the_blocks_amaxes_equals_the_counted_kernel(bfmt, monkeypatch):
    """A large NVFP4-like call to nearest (the table's loop, one block after another; and
    stochastic and upward, the grouped loop) with its tensor scale computed (the blocks' largest magnitudes from the per-tensor pass),
    or without a tensor scale (each block finds its own): values, scales and tensor scale
    equal the counted kernel's bit for bit, with NaN and inf blocks at the ends of rows, in
    the middle and back to back, and the same on a row length that is not whole blocks."""
    rng = np.random.default_rng(17)
    x = (rng.standard_normal((64, 4096)) * np.exp2(rng.integers(-40, 40, (64, 256))
                                                   .repeat(16, axis=1))).astype(np.float32)
    flat = x.reshape(-1)
    for i, v in zip((0, 4095, 4096, 70000, 70016, 70032, flat.size - 1),
                    (np.inf, np.nan, -np.inf, np.nan, np.inf, -np.inf, np.nan)):
        flat[i] = v
    assert x.size // 16 >= 2 * blocks.STEPS_FROM      # the call takes the table
    for module in (blocks.amax, blocks.kernels):          # the amax pass and the kernel
        monkeypatch.setattr(module, "threads", lambda: 2)
    for y, rounding in ((x, "nearest"), (x[:, :4090], "nearest"), (x, "stochastic"),
                        (x, "up")):
        kw = dict(seed=9) if rounding == "stochastic" else {}
        counted = blocks.quantize_blocks(y, bfmt, rounding, **kw)
        words = blocks.quantize_blocks(y, bfmt, rounding, want_elements=False,
                                       want_counts=False, **kw)
        assert words.counts is None and words.tensor_scale == counted.tensor_scale
        assert same(words.scales, counted.scales)
        assert np.array_equal(words.values.view(np.uint32), counted.values.view(np.uint32))
        # the cached path takes the same pass
        lpsim.quantize(np.ascontiguousarray(y), bfmt, rounding, **kw)
        got = lpsim.quantize(np.ascontiguousarray(y), bfmt, rounding, **kw)
        assert np.array_equal(got.view(np.uint32), counted.values.view(np.uint32))


@njit
def _stochastic32_mismatches(x, words, recips, scales, p32, bp):
    """Elements where element_stochastic32's ok differs from element_fast32's full-word SR,
    or, where both take it, its quotient or value bits do; and how many element_fast32
    took."""
    bad = taken = 0
    for i in range(x.size):
        for j in range(recips.size):
            r = word(np.uint32(words[i]))
            q1, v1, ok1, _ = element_fast32(x[i], r, recips[j], scales[j], STOCHASTIC, 32,
                                            p32, bp)
            q2, v2, ok2 = element_stochastic32(x[i], words[i], recips[j], scales[j], p32, bp)
            k1, k2 = as_int64(ok1), as_int64(ok2)
            differ = (np.float32(q1).view(np.int32) != np.float32(q2).view(np.int32)
                      or np.float32(v1).view(np.int32) != np.float32(v2).view(np.int32))
            bad += np.int64(k1 != k2 or (k1 == 1 and differ))
            taken += k1
    return bad, taken


@pytest.mark.parametrize("name", ["mxfp4", "nvfp4", "mxfp8_e4m3", "mxfp6_e2m3"])
def test_element_stochastic32_is_element_fast32_with_full_words(name):
    """lpsim.blocks.decisions.element_stochastic32 (the uncounted GPU block kernels'
    full-word SR step) gives element_fast32's ok and, where ok, its quotient and value:
    values of every binade the blocks meet, zeros, NaN, inf, against power-of-two and
    NVFP4-style scales (with a tensor scale), random words."""
    bfmt = blocks.PRESETS[name]
    p32 = element_params32(bfmt)
    bp = block_params(bfmt, 0.75)
    rng = np.random.default_rng(20261129)
    x = (rng.standard_normal(20_000) * np.exp2(rng.integers(-40, 40, 20_000))).astype(np.float32)
    x[:5] = [0.0, -0.0, np.inf, np.nan, 1e-45]
    words = rng.integers(0, 2 ** 32, x.size).astype(np.int64)
    scales = np.float32([2.0 ** -3, 1.0, 2.0 ** 5, 0.8125, 3.5])
    recips = (np.float32(1) / scales).astype(np.float32)
    bad, taken = _stochastic32_mismatches(x, words, recips, scales, p32, bp)
    assert bad == 0 and taken > x.size, (name, bad, taken)
