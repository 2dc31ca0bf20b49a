"""lpsim.quantize and lpsim.blocks against lpsim.reference, bit for bit, over the whole space of
formats a user can name: e up to 11, m up to the container's, every policy, saturate and
subnormal flag, every bias the container holds, block formats with any element and scale
format, rule and block size, and float64 data beyond float32's range.

Each example takes a CPU path that its format and request select (the float32 nearest kernels,
the 32-bit word fast pass and its finish, the float64 kernel, in place or not, with or
without counters; the block kernel with counters and the float32 word kernel without), so
the draws reach them all.  ``HYPOTHESIS_PROFILE=thorough`` runs ten times the examples.
"""

import math

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.extra.numpy import arrays

import lpsim
from lpsim import blocks, philox, reference, testing
from lpsim.blocks import ELEMENT_EXP_MIN, SCALE_EXP_RANGE
from lpsim.formats import POLICIES
from lpsim.rounding import MODES, STOCHASTIC_MODES

DTYPES = (np.float32, np.float64)
#: every format that fits each container
WHOLE = {dtype: testing.formats(max_e=11, max_m=52, max_bias=None, specials=POLICIES,
                                saturate=None, subnormals=None, dtype=dtype)
         for dtype in DTYPES}
BITS = {4: np.int32, 8: np.int64}
FLOAT32_MAX = float(np.finfo(np.float32).max)
# the reference is exact and slow: fewer examples than the profile's where each costs more
FEW = settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def same(a, b):
    """Elementwise: bit-identical, or both NaN."""
    a, b = np.asarray(a), np.asarray(b)
    return (a.view(BITS[a.itemsize]) == b.view(BITS[b.itemsize])) | (np.isnan(a) & np.isnan(b))


def beyond_float32():
    """float64 values beyond float32's range, both signs (and just past its largest)."""
    return st.floats(FLOAT32_MAX, 1.7e308).flatmap(
        lambda v: st.sampled_from([v, -v, np.nextafter(FLOAT32_MAX, np.inf)]))


def values(fmt, dtype):
    """Inputs where rounding is interesting for ``fmt`` and any container value (inf, NaN)."""
    width = 8 * np.dtype(dtype).itemsize
    parts = [testing.representable(fmt, dtype=dtype, allow_nan=True, allow_infinity=True),
             testing.near_overflow(fmt, dtype=dtype), st.floats(width=width)]
    for strategy in (testing.midpoints, testing.subnormals):
        try:
            parts.append(strategy(fmt, dtype=dtype))
        except ValueError:      # the container cannot hold this format's midpoints (values
            pass                # below its smallest normal)
    if dtype == np.float64:
        parts.append(beyond_float32())
    return st.one_of(parts).map(np.dtype(dtype).type)


# lengths: the scalar finish of a group (a few left), its vector finish, several groups
LENGTHS = st.integers(1, 12) | st.integers(60, 70)


@st.composite
def cases(draw):
    """(format, input array) in a float32 or float64 container."""
    dtype = draw(st.sampled_from(DTYPES))
    fmt = draw(WHOLE[dtype])
    return fmt, draw(arrays(dtype, LENGTHS, elements=values(fmt, dtype)))


def request(draw, dtype):
    """(rounding, keyword arguments) of a random request: seed and sr_bits where they apply."""
    rounding = draw(st.sampled_from(list(MODES)))
    kw = {}
    if rounding in STOCHASTIC_MODES:
        kw["seed"] = draw(st.integers(0, 2 ** 64 - 1))
        if rounding == "stochastic":
            kw["sr_bits"] = draw(st.none() | st.integers(1, philox.WORD_BITS[
                np.dtype(dtype).itemsize]))
    return rounding, kw


@FEW
@given(cases(), st.data())
def test_quantize_equals_the_reference_on_every_format(case, data):
    fmt, x = case
    rounding, kw = request(data.draw, x.dtype)
    stats = data.draw(st.sampled_from([None, lpsim.RoundingStats()]))
    where = data.draw(st.sampled_from(["new", "out", "in place"]))
    if where == "new":
        got = lpsim.quantize(x, fmt, rounding, stats=stats, **kw)
    else:
        out = x.copy() if where == "in place" else np.empty_like(x)
        src = out if where == "in place" else x
        got = lpsim.quantize(src, fmt, rounding, stats=stats, out=out, **kw)
        assert got is out
    want, want_stats = reference.quantize(x, fmt, rounding, **kw)
    wrong = ~same(got, want)
    assert not wrong.any(), (x[wrong][:4], got[wrong][:4], want[wrong][:4])
    if stats is not None:
        assert stats.as_dict() == want_stats.as_dict()


@given(st.sampled_from(DTYPES).flatmap(lambda dtype: WHOLE[dtype]), st.data())
def test_scalars_equal_the_reference_on_every_format(fmt, data):
    """A Python float rounds as a float64 array of one (the scalar route)."""
    if not fmt.fits(np.float64)[0]:
        return
    v = data.draw(values(fmt, np.float64))
    rounding, kw = request(data.draw, np.float64)
    want, _ = reference.quantize(np.array([v]), fmt, rounding, **kw)
    assert same(np.float64(lpsim.quantize(float(v), fmt, rounding, **kw)), want[0])


# --- block formats ---------------------------------------------------------------------------

ANY64 = WHOLE[np.float64]
#: scale formats: every one whose values are float32 values (e8m0fnu, e4m3fn, bf16, fp(8,10)
#: and the rest of that space); scales reaching below float64's normals are not drawn yet
SCALES = WHOLE[np.float32]


def _least_exp(fmt):
    """The exponent of a format's smallest positive value."""
    return fmt.emin - (fmt.m if fmt.subnormals else 0)


@st.composite
def block_formats(draw, elements=ANY64):
    """Any element format (of ``elements``: those that fit the data's container), any scale
    format and rule, block sizes 1 to 40 (16 and 32 often), a per-tensor scale where the
    scale format takes one, either non-finite rule."""
    scale = draw(SCALES)
    element = draw(elements.filter(lambda e: scale.m > 0 or _least_exp(e) >= ELEMENT_EXP_MIN))
    size = draw(st.sampled_from([16, 32]) | st.integers(1, 40))
    rule = draw(st.sampled_from(list(blocks.RULES)))
    with np.errstate(over="ignore"):
        divisor = float(np.float32(scale.max_finite * element.max_finite))
    tensor = (scale.m > 0 and scale.fits(np.float32)[0] and 0 < divisor < math.inf
              and draw(st.booleans()))
    nonfinite = draw(st.sampled_from(blocks.NONFINITE))
    return blocks.block(element, size, scale, rule, tensor_scale=tensor, nonfinite=nonfinite)


def block_values(dtype):
    """Container values of many magnitudes, zeros, inf and NaN, beyond float32 in float64."""
    width = 8 * np.dtype(dtype).itemsize
    parts = [st.floats(width=width),
             st.integers(-64, 64).map(float),
             st.sampled_from([0.0, -0.0, math.inf, -math.inf, math.nan, 1e-38, 3e-39, 1e-45]),
             st.tuples(st.integers(-8, 8), st.integers(-140, 130)).map(
                 lambda t: math.ldexp(t[0], t[1]))]
    if dtype == np.float64:
        parts += [beyond_float32(), st.tuples(st.integers(-8, 8), st.integers(-1074, 1020)).map(
            lambda t: math.ldexp(t[0], t[1]))]
    return st.one_of(parts).map(np.dtype(dtype).type)


@st.composite
def block_cases(draw):
    dtype = draw(st.sampled_from(DTYPES))
    bfmt = draw(block_formats(WHOLE[dtype]))
    rows = draw(st.integers(1, 3))
    length = draw(st.integers(1, 2 * bfmt.block + 3) if bfmt.block <= 8 else
                  st.sampled_from([bfmt.block, 2 * bfmt.block, bfmt.block + 3, 5]))
    x = draw(arrays(dtype, (rows, length), elements=block_values(dtype)))
    return bfmt, x


def reference_blocks(x, bfmt, rounding, kw):
    uniforms = None
    if rounding in STOCHASTIC_MODES:
        words = philox.random_words(x.size, x.dtype.itemsize, kw["seed"], 0, 0)
        width = philox.WORD_BITS[x.dtype.itemsize]
        uniforms = [[reference.Fraction(int(r), 2 ** width) for r in row]
                    for row in np.array(words, dtype=object).reshape(x.shape)]
    return reference.quantize_blocks(x, bfmt, rounding, uniforms=uniforms,
                                     sr_bits=kw.get("sr_bits"))


@settings(FEW, max_examples=max(10, settings.default.max_examples // 4))
@given(block_cases(), st.data())
def test_block_quantize_equals_the_reference_on_every_block_format(case, data):
    bfmt, x = case
    rounding, kw = request(data.draw, x.dtype)
    got = blocks.quantize_blocks(x, bfmt, rounding, **kw)
    values_, elements, scales, counts = reference_blocks(x, bfmt, rounding, kw)
    pts = float(reference.tensor_scale_exact(x, bfmt)) if bfmt.tensor_scale else 1.0
    assert got.tensor_scale == pts
    assert same(got.scales, scales).all(), (got.scales, scales)
    assert same(got.elements, elements).all()
    wrong = ~same(got.values, values_)
    assert not wrong.any(), (x[wrong][:4], got.values[wrong][:4], values_[wrong][:4])
    assert np.array_equal(got.counts, counts)
    # lpsim.quantize: without stats (float32: the word kernel where the format allows it)
    # and with BlockStats, the same values and the counts summed
    assert same(lpsim.quantize(x, bfmt, rounding, **kw), values_).all()
    stats = blocks.BlockStats()
    assert same(lpsim.quantize(x, bfmt, rounding, stats=stats, **kw), values_).all()
    totals = counts.reshape(-1, counts.shape[-1]).sum(axis=0)
    assert [getattr(stats, name) for name in lpsim.stats.COUNTERS] == list(totals[:6])
    assert (stats.clipped_scales, stats.flushed_blocks, stats.nan_blocks) == tuple(totals[6:])


# --- the values the property tests above missed before they drew these formats --------------

def test_formats_with_the_containers_mantissa_bits_keep_exact_values():
    """m = 23 (52) in its normal range: the fast paths' carry added the last bit at shift 0."""
    x = np.float32([1.0000001, 3.0000002, -1.5, 1e-30, 3e38])
    for spec in ["fp(8,23,0,saturate=True)", "fp(7,23,0,saturate)", "fp(6,23,-5,fn)",
                 "fp(7,23,0,fnuz)", "fp(3,23,0,saturate=True)"]:
        for rounding in MODES:
            for stats in (None, lpsim.RoundingStats()):
                got = lpsim.quantize(x, spec, rounding, seed=3, stats=stats)
                want, want_stats = reference.quantize(x, spec, rounding, seed=3)
                assert same(got, want).all(), (spec, rounding, got, want)
                if stats is not None:
                    assert stats.as_dict() == want_stats.as_dict()
    assert same(lpsim.quantize(x[:2], "fp(8,23,0,saturate=True)"), x[:2]).all()
    assert same(lpsim.quantize(x[:2], blocks.block("fp32", 2)), x[:2]).all()
    y = np.array([1 + 2.0 ** -52, 3 + 2.0 ** -51])
    assert same(lpsim.quantize(y, "fp(11,52,0,saturate=True)"), y).all()


def test_zeros_under_an_infinite_reciprocal_stay_zeros():
    for bfmt in [blocks.block("e2m1fn", 2, "bf16", "floor"),
                 blocks.block("e2m1fn", 2, "fp(8,10)", "floor")]:
        for dtype in DTYPES:
            x = np.array([[0, 0], [1e-38, -0.0]], dtype)
            want = reference.quantize_blocks(x, bfmt)[0]
            assert not np.isnan(want).any()
            assert same(lpsim.quantize(x, bfmt), want).all()
            stats = blocks.BlockStats()
            assert same(lpsim.quantize(x, bfmt, stats=stats), want).all()
            assert stats.nan == 0 and stats.nan_blocks == 0


def test_float64_beyond_float32_saturates_the_tensor_scale():
    x = np.array([3.5e38] + [1.0] * 31)
    stats = blocks.BlockStats()
    got = lpsim.quantize(x, "nvfp4", stats=stats)
    assert np.isfinite(got).all()
    values_, elements, scales, counts = reference.quantize_blocks(x.reshape(1, -1), "nvfp4")
    assert same(got, values_[0]).all()
    assert got[0] == float(np.float32(6 * 448 * np.float32(np.finfo(np.float32).max / 2688)))
    totals = counts.reshape(-1, counts.shape[-1]).sum(axis=0)
    assert stats.inexact == totals[0] == 32 and stats.nan == 0
    encoded = blocks.encode(x, "nvfp4")
    assert encoded.tensor_scale == float(np.float32(np.finfo(np.float32).max / np.float32(2688)))
    assert same(blocks.decode(encoded, np.float64), got).all()


def test_quotients_beyond_float32_and_float64_have_the_references_scale():
    bfmt = blocks.block("e2m1fn", 32, "e8m0fnu", "rceil")
    x = np.array([[2.4e39] + [1.0] * 31])
    values_, _, scales, _ = reference.quantize_blocks(x, bfmt)
    assert same(lpsim.blocks.quantize_blocks(x, bfmt).scales, scales).all()
    assert same(lpsim.quantize(x, bfmt), values_).all()
    narrow = blocks.block(lpsim.fp(2, 0, 1), 4, lpsim.fp(2, 0, 7, subnormals=False), "ceil")
    x = np.array([[1.6e308, 1.0, 0.0, -7e299]])
    got = blocks.quantize_blocks(x, narrow, "toward_zero")
    values_, elements, scales, counts = reference.quantize_blocks(x, narrow, "toward_zero")
    assert same(got.elements, elements).all() and np.array_equal(got.counts, counts)


def test_encode_takes_what_quantize_takes():
    for x in [3, 2.5, [1, 2, 3], np.float16([1, 2]), np.arange(5), [[0.5, -6.0]]]:
        decoded = blocks.decode(blocks.encode(x, "mxfp4"), np.float64)
        assert same(decoded, np.asarray(lpsim.quantize(x, "mxfp4"), np.float64)).all()


def test_formats_beyond_float64_and_repeated_options_are_refused_by_name():
    import pytest
    with pytest.raises(ValueError, match=r"b=-2000 is out of range for fp\(4,3\); accepted: "
                                         r"-1016 <= b <= 1065"):
        lpsim.parse_format("fp(4,3,-2000)")
    with pytest.raises(ValueError, match="b=0 is out of range.*none"):
        lpsim.fp(11, 52, specials="fn")
    for spec in ["fp(4,3,0,specials=fn,specials=ieee)", "fp(4,3,0,fn,specials=fn)",
                 "fp(4,3,subnormals=False,subnormals=True)"]:
        with pytest.raises(ValueError, match="twice"):
            lpsim.parse_format(spec)
    lo, hi = lpsim.formats.bias_range(4, 3)
    for b in (lo, hi):
        fmt = lpsim.fp(4, 3, b)
        assert math.isfinite(fmt.max_finite) and fmt.min_subnormal > 0


def test_quotients_below_float64s_normals_round_exactly():
    """float64 data under a large power-of-two scale: x / s below 2**-1022, where the product
    x * (1/s) rounds, is rounded in every mode as the exact quotient (MXFP4 'up' gave 0 for
    2**-1000 under 2**98, where the reference gives the smallest element times the scale)."""
    bfmt = blocks.parse_block_format("mxfp4")
    for tiny in (2.0 ** -1074, 2.0 ** -1000, 2.0 ** -960, -2.0 ** -1050):
        x = np.array([[2.0 ** 100] + [tiny] * 31])
        for mode in ("up", "down", "nearest", "toward_zero", "nearest_away", "odd"):
            values_, elements, scales, counts = reference.quantize_blocks(x, bfmt, mode)
            got = blocks.quantize_blocks(x, bfmt, mode)
            assert same(got.values, values_).all(), (tiny, mode, got.values[0, 1], values_[0, 1])
            assert np.array_equal(got.counts, counts), (tiny, mode)
            assert same(lpsim.quantize(x, bfmt, mode), values_).all(), (tiny, mode)


def test_power_of_two_scales_refuse_what_float64_cannot_scale_exactly():
    """Element formats reaching below 2**-956 and scale formats beyond float64's normals are
    refused by name under power-of-two scales (their quotients or reciprocals would round)."""
    import pytest
    with pytest.raises(ValueError, match=r"element format fp\(2,0,1074\) reaches 2\*\*-1074"):
        blocks.block("fp(2,0,1074)", 2)
    with pytest.raises(ValueError, match=r"element format .*fp64"):
        blocks.block("fp64", 2)
    with pytest.raises(ValueError, match=r"scale format fp\(11,0.*accepted as a power-of-two"):
        blocks.block("e2m1fn", 2, "fp(11,0)")
    with pytest.raises(ValueError, match=r"element format fp\(3,0,955\) reaches 2\*\*-957"):
        blocks.block("fp(3,0,955)", 2)
    assert blocks.block("fp(3,0,954)", 2).element.emin == ELEMENT_EXP_MIN     # the edge
    # scales with mantissa bits scale by fp32(x * r), defined below float64's normals too
    assert _least_exp(blocks.block("e2m1fn", 2, "fp(11,10)").scale) < SCALE_EXP_RANGE[0]
