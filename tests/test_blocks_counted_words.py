"""The float32 word kernel with counters (lpsim.quantize with stats, simulated training's
telemetry) against the general counted kernel: values bit for bit and every counter of every
block, in every rounding mode, for every format the word kernel takes; its clipped-scale
bounds against block_scale; and the stats a user sees."""

import numpy as np
import pytest
from numba import njit

import lpsim
from lpsim import blocks
from lpsim.blocks import BLOCK_COUNTERS, BlockStats
from lpsim.pool import PIECES
from lpsim.rounding import MODES, kernel_params

from test_blocks import same
from test_blocks_kernel import WORD_FORMATS, word_kernel_data

#: the word kernel's formats, 2-D tiles as blocks of 256 (NVFP4 weights), a 5-element block
FORMATS = WORD_FORMATS + [blocks.block("e2m1fn", 256, "e4m3fn", "even", tensor_scale=True),
                          blocks.block("e4m3fn", 5, rule="rceil")]


def small_data(rows, length, seed):
    """Values of a few binades with a zero, for arrays too small for special_data."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, length)) * np.exp2(rng.integers(-30, 30, (rows, length)))
    x.reshape(-1)[::3] = 0.0
    return x.astype(np.float32)


def special_data(rows, length, seed, block):
    """word_kernel_data plus whole blocks that flush (float32 subnormals under a scale
    clipped to its smallest value), all-zero blocks, blocks near float32's largest value
    (scales clipped to their largest), and a block of one NaN among zeros."""
    x = word_kernel_data(rows, length, seed)
    rng = np.random.default_rng(seed + 1)
    flat = x.reshape(-1)
    starts = rng.choice(flat.size // block - 1, 8, replace=False) * block
    tiny = (rng.standard_normal(block) * 1e-44).astype(np.float32)
    flat[starts[0]:starts[0] + block] = tiny
    flat[starts[1]:starts[1] + block] = 0.0
    flat[starts[2]:starts[2] + block] = -0.0
    flat[starts[3]:starts[3] + block] = np.float32(3e38) * rng.choice([-1, 1], block)
    flat[starts[4]:starts[4] + block] = 0.0
    flat[starts[4] + block // 2] = np.nan
    flat[starts[5]:starts[5] + block] = np.float32(1e-41)
    return x


def counted_reference(x, bfmt, rounding, **kw):
    """The general counted kernel's result (element values wanted: it runs whatever the
    dtype), its counters per block."""
    return blocks.quantize_blocks(x, bfmt, rounding, want_elements=True, **kw)


def assert_counted_words_equal(x, bfmt, rounding, monkeypatch=None, **kw):
    """The counted word kernel, per block and as sums, and lpsim.quantize's stats equal the
    general counted kernel's; with ``monkeypatch``, the general kernel runs for neither."""
    want = counted_reference(x, bfmt, rounding, **kw)
    if monkeypatch is None:
        _assert_words_equal(x, bfmt, rounding, want, **kw)
        return
    with monkeypatch.context() as m:
        def refuse(*args):
            raise AssertionError("the general counted kernel ran")
        m.setattr(blocks.kernels, "kernel_entry", refuse)
        _assert_words_equal(x, bfmt, rounding, want, **kw)


def _assert_words_equal(x, bfmt, rounding, want, **kw):
    what = (str(bfmt), rounding, x.shape, kw)
    for counts in (True, "totals"):
        got = blocks.quantize_blocks(x, bfmt, rounding, want_elements=False, want_counts=counts,
                                     **kw)
        assert got.tensor_scale == want.tensor_scale, what
        assert same(got.scales, want.scales), what
        assert np.array_equal(got.values.view(np.uint32), want.values.view(np.uint32)), what
        if counts is True:
            bad = np.argwhere((got.counts != want.counts).any(axis=-1))
            assert bad.size == 0, (what, bad[:3], got.counts[tuple(bad[0])],
                                   want.counts[tuple(bad[0])])
        else:
            assert got.counts.shape[1:] == (1, len(BLOCK_COUNTERS)), what
            assert np.array_equal(got.counts.sum(axis=(0, 1)),
                                  want.counts.reshape(-1, len(BLOCK_COUNTERS)).sum(axis=0)), what
    stats, expected = BlockStats(), BlockStats()
    blocks.add_counts(expected, want.counts, x.size)
    # lpsim.quantize, or lpsim.blocks.quantize (which also takes a tensor scale)
    out = (blocks.quantize if "tensor_scale" in kw else lpsim.quantize)(x, bfmt, rounding,
                                                                        stats=stats, **kw)
    assert np.array_equal(out.view(np.uint32), want.values.view(np.uint32)), what
    assert stats.as_dict() == expected.as_dict(), what


ROUNDINGS = [("nearest", {}), ("stochastic", dict(seed=5, stream=2, offset=7)),
             ("up", {}), ("toward_zero", {})]


@pytest.mark.parametrize("bfmt", FORMATS, ids=str)
def test_counted_word_kernel_equals_the_counted_kernel(bfmt, monkeypatch):
    """Every format the word kernel takes, to nearest, stochastically, upward and toward
    zero, on values reaching every binade of float32 with ties, zeros, NaN, inf, flushed and
    clipped blocks: rows of 1029 (a partial last block) and of whole blocks."""
    bfmt = blocks.parse_block_format(bfmt)
    size = bfmt.block
    for rows, length in ((24, 1029), (16, 8 * size)):
        x = special_data(rows, length, seed=len(str(bfmt)) + length, block=size)
        for rounding, kw in ROUNDINGS:
            assert_counted_words_equal(x, bfmt, rounding, monkeypatch, **kw)


@pytest.mark.parametrize("bfmt", ["mxfp8_e4m3", "mxfp4", "nvfp4", "mxint8"])
@pytest.mark.parametrize("rounding", [m for m in MODES if m not in ("nearest", "up")])
def test_every_rounding_mode_equals_the_counted_kernel(bfmt, rounding, monkeypatch):
    """The other modes (nearest away, down, odd, equal-chance stochastic, full-width and
    few-bit SR) on the presets, on whole rows and a partial last block."""
    x = special_data(8, 300, seed=3, block=32)
    kw = dict(seed=11) if rounding.startswith("stochastic") else {}
    assert_counted_words_equal(x, bfmt, rounding, monkeypatch, **kw)
    if rounding == "stochastic":
        assert_counted_words_equal(x, bfmt, rounding, monkeypatch, sr_bits=4, **kw)


@pytest.mark.parametrize("bfmt", ["mxfp8_e4m3", "nvfp4"])
def test_shapes_axes_and_threads_equal_the_counted_kernel(bfmt, monkeypatch):
    """One element, rows shorter than a block, blocks down the columns (axis 0), and calls
    split over threads in chunks (a row of sums per thread range) with the thresholds
    lowered."""
    monkeypatch.setattr(blocks.kernels, "CHUNK", 64)
    monkeypatch.setattr(blocks.kernels, "SERIAL_BELOW", 128)
    monkeypatch.setattr(blocks.kernels, "PARALLEL_GRAIN", 64)
    monkeypatch.setattr(blocks.kernels, "threads", lambda: 3)
    for i, (rows, length) in enumerate(((1, 1), (5, 7), (3, 40), (40, 100), (64, 256))):
        x = special_data(rows, length, seed=i, block=4) if rows * length >= 64 \
            else small_data(rows, length, seed=i)
        for rounding, kw in ROUNDINGS[:2]:
            assert_counted_words_equal(x, bfmt, rounding, **kw)
            assert_counted_words_equal(x, bfmt, rounding, axis=0, **kw)
    x = special_data(64, 256, seed=9, block=32)
    got = blocks.quantize_blocks(x, bfmt, want_elements=False, want_counts="totals")
    # a row per range: PIECES ranges per thread
    assert got.counts.shape == (3 * PIECES, 1, len(BLOCK_COUNTERS))


def test_large_calls_equal_the_counted_kernel(monkeypatch):
    """Calls of 2**19 elements: NVFP4's scales from the step table and its per-tensor pass
    (the blocks' largest magnitudes from it), MXFP8's grouped loop, over two threads."""
    rng = np.random.default_rng(21)
    x = (rng.standard_normal((128, 4096)) * np.exp2(rng.integers(-60, 60, (128, 256))
                                                    .repeat(16, axis=1))).astype(np.float32)
    x.reshape(-1)[[5, 70000, 300001]] = [np.nan, np.inf, -np.inf]
    x[7, :64] = 1e-40
    monkeypatch.setattr(blocks.kernels, "threads", lambda: 2)
    monkeypatch.setattr(blocks.amax, "threads", lambda: 2)
    for bfmt in ("nvfp4", "mxfp8_e4m3", "mxfp4"):
        for rounding, kw in ROUNDINGS[:2]:
            assert_counted_words_equal(x, bfmt, rounding, **kw)


def test_infinite_quotients_of_a_given_tensor_scale_equal_the_counted_kernel():
    """A given per-tensor scale as small as NVFP4 takes it: x * r overflows float32 for
    large x, which the general step counts as an inf input (not an overflow); the counted
    word kernel sends such blocks to that step too."""
    bfmt = blocks.parse_block_format("nvfp4")
    x = word_kernel_data(16, 320, seed=4)
    x[:, :64] = np.float32(3e38)
    pts = blocks.min_tensor_scale(bfmt)
    want = counted_reference(x, bfmt, "nearest", tensor_scale=pts)
    assert want.counts[..., BLOCK_COUNTERS.index("inf")].sum() > 0   # quotients were inf
    for rounding, kw in ROUNDINGS:
        assert_counted_words_equal(x, bfmt, rounding, tensor_scale=pts, **kw)


def test_blocks_whose_quotients_fall_below_the_element_equal_the_counted_kernel():
    """Blocks far below the tensor scale: their scale clamps to its least, and their
    quotients fall below e2m1's smallest subnormal (0.5), where the counted kernel must look
    at every result to tell a flushed block: all of them rounding to 0 (to nearest below
    0.25, toward zero), or some rounding up (to nearest from above 0.25, SR at random, up);
    beside blocks whose largest quotient reaches 0.5, whose results it need not look at.
    8192 blocks on one thread: NVFP4's scales then come from the table of steps, the
    one-loop counted path (lpsim.blocks.word_counts.blocks_counted)."""
    bfmt = blocks.parse_block_format("nvfp4")
    rng = np.random.default_rng(12)
    x = word_kernel_data(128, 1024, seed=12)
    blocks16 = x.reshape(-1, 16)
    sign = rng.choice([-1.0, 1.0], (blocks16.shape[0], 16))
    # at tensor scale 1 a clamped block scale is 2**-9: quotients are x * 512
    blocks16[0::4] = sign[0::4] * rng.uniform(0.10, 0.24, (len(blocks16[0::4]), 16)) / 512
    blocks16[1::4] = sign[1::4] * rng.uniform(0.30, 0.45, (len(blocks16[1::4]), 16)) / 512
    blocks16[2::4] = sign[2::4] * rng.uniform(0.001, 0.01, (len(blocks16[2::4]), 16)) / 512
    want = counted_reference(x, bfmt, "nearest", tensor_scale=1.0)
    flushed = want.counts[..., BLOCK_COUNTERS.index("flushed")].sum()
    assert 0 < flushed < blocks16.shape[0]            # some blocks flush, others do not
    with lpsim.pool.limited(1):
        for rounding, kw in ROUNDINGS:
            assert_counted_words_equal(x, bfmt, rounding, tensor_scale=1.0, **kw)


@njit(cache=True)
def _clip_mismatches(bp, sp, bits):
    """Bits of ``bits`` where clip_bounds' answer differs from block_scale's clipped flag,
    and the bounds."""
    lo, hi = blocks.word_counts.clip_bounds(bp, sp)
    bad = []
    for a in bits:
        if a <= 0 or a >= (np.int64(255) << 23):
            continue
        _, clipped = blocks.block_scale(blocks.bits_value(a, 23, 127), bp, sp)
        if np.int64(a < lo or a >= hi) != clipped:
            bad.append(a)
    return bad, lo, hi


@pytest.mark.parametrize("bfmt, pts", [
    ("mxfp8_e4m3", 1.0), ("mxfp4", 1.0), ("nvfp4", 1.0), ("nvfp4", 3.7e-3), ("nvfp4", 2.5e30),
    (blocks.block("e2m3fn", 32, rule="rceil"), 1.0), (blocks.block("e3m2fn", 32, rule="ceil"), 1.0),
    (blocks.block("e5m2", 16, rule="even"), 1.0), (blocks.block("e2m1fn", 16, "fp(4,5)", "ceil"), 1.0),
    (blocks.block("e4m3fn", 32, "e5m2", "floor"), 1.0)], ids=str)
def test_clip_bounds_are_block_scales_clipped_flag(bfmt, pts):
    """A block's clipped counter is its largest magnitude against two bounds found per call:
    block_scale's own flag at each bound, a bit either side, float32's ends and 2**16 random
    bits, for power-of-two and mantissa-bit scales of every rule."""
    bfmt = blocks.parse_block_format(bfmt)
    bp = blocks.block_params(bfmt, float(np.float32(pts)))
    sp = kernel_params(bfmt.scale, np.float64)
    _, lo, hi = _clip_mismatches(bp, sp, np.zeros(1, np.int64))
    edges = np.array([lo - 1, lo, lo + 1, hi - 1, hi, hi + 1, 1, 2, (255 << 23) - 1], np.int64)
    random = np.random.default_rng(1).integers(1, 255 << 23, 1 << 16)
    bad, _, _ = _clip_mismatches(bp, sp, np.concatenate([edges, random]))
    assert len(bad) == 0, (lo, hi, bad[:4])
    assert 0 < lo < hi <= (255 << 23)


def test_torch_tensors_and_stats_accumulate():
    """lpsim.quantize of a torch tensor with stats takes the same counters; stats add up
    over calls; RoundingStats (no block fields) take the element counters."""
    torch = pytest.importorskip("torch")
    x = special_data(16, 512, seed=8, block=16)
    want = counted_reference(x, "nvfp4", "nearest")
    expected = BlockStats()
    blocks.add_counts(expected, want.counts, x.size)
    blocks.add_counts(expected, want.counts, x.size)
    stats = BlockStats()
    for _ in range(2):
        out = lpsim.quantize(torch.from_numpy(x), "nvfp4", stats=stats)
    assert np.array_equal(out.numpy().view(np.uint32), want.values.view(np.uint32))
    assert stats.as_dict() == expected.as_dict()
    plain, once = lpsim.RoundingStats(), BlockStats()
    lpsim.quantize(x, "nvfp4", stats=plain)
    blocks.add_counts(once, want.counts, x.size)
    assert plain.as_dict() == {k: v for k, v in once.as_dict().items() if k in plain.as_dict()}


def test_want_counts_is_checked():
    """want_counts takes True, False or "totals", by name."""
    with pytest.raises(ValueError, match="want_counts='sums'"):
        blocks.quantize_blocks(np.ones(32, np.float32), "mxfp4", want_counts="sums")
