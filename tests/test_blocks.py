"""Block-scaled formats: bit-exact against gfloat (OCP floor rule), torchao's MX and NVFP4
casts (their scale rules) and lpsim.reference (every rule and rounding mode); SR unbiased
given the scale; counters; errors."""

import re

import numpy as np
import pytest

import lpsim
from lpsim import blocks, reference
from lpsim.blocks import BLOCK_COUNTERS, BlockStats, block, parse_block_format
from lpsim.rounding import DETERMINISTIC_MODES


def block_data(rows, length, seed, dtype=np.float32, lo=-20, hi=20):
    """Normal values with a random magnitude per block of 8, plus edge rows."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, length)) * 2.0 ** rng.integers(lo, hi, (rows, length // 8, 1)
                                                                  ).repeat(8, 1).reshape(rows, -1)
    x[0, :] = 0.0                                             # an all-zero row
    x[1, : length // 2] = 2.0 ** np.arange(length // 2) % 7.0  # exact small values
    x[1, 0] = -6.0 * 2.0 ** 3                                # amax exactly max * 2**k
    return x.astype(dtype)


def same(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.array_equal(a, b, equal_nan=True) and np.array_equal(np.signbit(a), np.signbit(b))


# --- gfloat: OCP floor rule -----------------------------------------------------------------

GFLOAT = {"mxfp8_e4m3": "format_info_mxfp8_e4m3", "mxfp8_e5m2": "format_info_mxfp8_e5m2",
          "mxfp6_e3m2": "format_info_mxfp6_e3m2", "mxfp6_e2m3": "format_info_mxfp6_e2m3",
          "mxfp4": "format_info_mxfp4_e2m1", "mxint8": "format_info_mxint8"}


@pytest.mark.parametrize("name", list(GFLOAT))
def test_floor_rule_equals_gfloat_quantize_block(name):
    formats = pytest.importorskip("gfloat.formats")
    from gfloat.block import compute_scale_amax, quantize_block
    fi = getattr(formats, GFLOAT[name])
    x = block_data(4, 64, seed=1)
    got = lpsim.quantize(x, name)
    want = np.stack([np.concatenate([quantize_block(fi, row[i:i + 32].astype(np.float64),
                                                    compute_scale_amax)
                                     for i in range(0, 64, 32)]) for row in x])
    if name == "mxint8":
        # gfloat's INT8 is two's complement (-2.0 = -128/64); lpsim's is symmetric (+-127/64)
        scales = np.repeat(lpsim.blocks.quantize_blocks(x, name).scales, 32, axis=1)
        low = want == -2.0 * scales
        assert np.array_equal(got[low], -127 / 64 * scales[low])
        got, want = got[~low], want[~low]
    assert same(got, want.astype(np.float32))


# --- torchao: its scale rules ---------------------------------------------------------------

def torchao_mx(x, elem, rule):
    torch = pytest.importorskip("torch")
    mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    dtype = {"e4m3fn": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2,
             "e2m3fn": "fp6_e2m3", "e3m2fn": "fp6_e3m2", "e2m1fn": torch.float4_e2m1fn_x2}[elem]
    if isinstance(dtype, str):
        from torchao.prototype.mx_formats import constants
        dtype = getattr(constants, f"DTYPE_FP6_{dtype[4:].upper()}")
    t = torch.from_numpy(x)
    scale, data = mx.to_mx(t, dtype, 32, getattr(ScaleCalculationMode, rule.upper()))
    values = mx.to_dtype(data, scale, dtype, 32, torch.float32).numpy()
    return values, scale.view(torch.uint8).numpy().astype(np.int64)


@pytest.mark.parametrize("rule", ["floor", "ceil", "even", "rceil"])
@pytest.mark.parametrize("elem", ["e4m3fn", "e5m2", "e2m3fn", "e3m2fn", "e2m1fn"])
def test_scale_rules_equal_torchao_to_mx(elem, rule):
    x = block_data(16, 128, seed=2, lo=-12, hi=12)      # scales well inside float32 normals
    x[0, :] = 1.0                                        # torchao fp32 scales need amax != 0
    want, want_codes = torchao_mx(x, elem, rule)
    bfmt = block(elem, 32, "e8m0fnu", rule)
    result = lpsim.blocks.quantize_blocks(x, bfmt)
    assert np.array_equal(np.log2(result.scales).astype(np.int64) + 127, want_codes.reshape(16, 4))
    assert same(result.values, want)


@pytest.mark.parametrize("with_tensor_scale", [True, False])
def test_nvfp4_equals_torchao_nvfp4_quantize(with_tensor_scale):
    torch = pytest.importorskip("torch")
    nv = pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor")
    from torchao.prototype.mx_formats.kernels import f4_unpacked_to_f32, unpack_uint4
    x = block_data(8, 64, seed=3, lo=-6, hi=6)
    x[0, :] = 0.5
    t = torch.from_numpy(x)
    pts = nv.per_tensor_amax_to_scale(t.abs().max()) if with_tensor_scale else None
    scales, data = nv.nvfp4_quantize(t, 16, pts)
    q = f4_unpacked_to_f32(unpack_uint4(data)).numpy().reshape(8, 64)
    bfmt = lpsim.blocks.PRESETS["nvfp4"] if with_tensor_scale else block("e2m1fn", 16, "e4m3fn",
                                                                          "even")
    result = lpsim.blocks.quantize_blocks(x, bfmt)
    assert result.tensor_scale == (float(pts) if with_tensor_scale else 1.0)
    assert same(result.scales, scales.float().numpy().reshape(8, 4))
    assert same(result.elements, q)


# --- lpsim.reference: every rule and mode ----------------------------------------------------

RULE_FORMATS = [block("e2m1fn", 32, "e8m0fnu", rule) for rule in blocks.RULES] + [
    block("e4m3fn", 16, "e8m0fnu", "floor", nonfinite="finite"),
    block("e5m2", 8, "fp(5,0,0)", "ceil"),                          # a narrow scale: clipping
    block("e2m3fn", 16, "e4m3fn", "floor"), block("e3m2fn", 16, "ue4m3", "rceil"),
    block("e2m1fn", 16, "ue5m3", "ceil"),
    lpsim.blocks.PRESETS["nvfp4"], lpsim.blocks.PRESETS["mxint8"]]


def edge_data(dtype, seed=4):
    x = block_data(6, 48, seed, dtype, lo=-30, hi=30)
    x[2, :8] = [np.nan, 1.0, -np.inf, 3.0, 0.0, -0.0, 2.0, 1e-3]   # non-finite block
    x[3, :16] = np.float32(3e-39)                                  # subnormal block: clipped
    x[4, 40:] = [1e30, 1e-30, -1e-20, 5.0, 2.5, 0.0, -1.0, 7.0]    # flushed elements
    return x


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: d.__name__)
@pytest.mark.parametrize("bfmt", RULE_FORMATS, ids=str)
def test_every_rule_and_deterministic_mode_equals_the_reference(bfmt, dtype):
    x = edge_data(dtype)
    for rounding in DETERMINISTIC_MODES:
        got = lpsim.blocks.quantize_blocks(x, bfmt, rounding)
        values, elements, scales, counts = reference.quantize_blocks(
            x, bfmt, rounding, tensor_scale=got.tensor_scale if bfmt.tensor_scale else None)
        assert same(got.scales, scales), (rounding, np.argwhere(got.scales != scales)[:3])
        assert same(got.elements, elements), rounding
        assert same(got.values, values), rounding
        assert np.array_equal(got.counts, counts), rounding


@pytest.mark.parametrize("sr_bits", [None, 4])
@pytest.mark.parametrize("bfmt", ["mxfp4", "nvfp4", "mxfp8_e5m2"])
def test_stochastic_equals_the_reference_with_lpsim_random_bits(bfmt, sr_bits):
    x = block_data(6, 48, 4, lo=-4, hi=4)         # one range: NVFP4's tensor scale keeps them
    x[2, :8] = [np.nan, 1.0, -np.inf, 3.0, 0.0, -0.0, 2.0, 1e-3]
    seed, stream, offset = 99, 3, 7
    got = lpsim.blocks.quantize_blocks(x, bfmt, "stochastic", seed=seed, stream=stream,
                                       offset=offset, sr_bits=sr_bits)
    words = np.array(lpsim.philox.random_words(x.size, 4, seed, stream, offset),
                     dtype=object).reshape(x.shape)
    uniforms = [[reference.Fraction(int(r), 2 ** 32) for r in row] for row in words]
    values, elements, scales, counts = reference.quantize_blocks(
        x, bfmt, "stochastic", uniforms=uniforms, sr_bits=sr_bits,
        tensor_scale=got.tensor_scale if parse_block_format(bfmt).tensor_scale else None)
    assert same(got.values, values) and np.array_equal(got.counts, counts)
    again = lpsim.quantize(x, bfmt, "stochastic", seed=seed, stream=stream, offset=offset,
                           sr_bits=sr_bits)
    assert same(again, got.values)
    other = lpsim.quantize(x, bfmt, "stochastic", seed=seed + 1, stream=stream, offset=offset,
                           sr_bits=sr_bits)
    assert not same(other, got.values)


def test_stochastic_is_unbiased_per_element_given_the_scale():
    """4096 copies of one block (same amax, so the same scale), independent random bits.

    Per element, up-count ~ Binomial(4096, frac); Hoeffding: P(|mean - frac| >= 0.06) <=
    2 exp(-2 * 4096 * 0.06**2) < 2e-12, so the 32 checks together false-alarm below 1e-10.
    """
    rng = np.random.default_rng(5)
    row = (rng.standard_normal(32) * 3).astype(np.float32)
    x = np.tile(row, (4096, 1))
    got = lpsim.blocks.quantize_blocks(x, "mxfp4", "stochastic", seed=2024)
    s = got.scales[0, 0]
    assert np.all(got.scales == s)
    y = row.astype(np.float64) / s
    lo = lpsim.quantize(y, "e2m1fn", "down").astype(np.float64)
    lo = np.where(y < 0, -lpsim.quantize(-y, "e2m1fn", "down"), lo)        # toward zero
    hi = np.where(y < 0, -lpsim.quantize(-y, "e2m1fn", "up"), lpsim.quantize(y, "e2m1fn", "up"))
    inside = (np.abs(y) < 6) & (hi != lo)
    frac = np.abs(y - lo) / np.abs(hi - lo)
    up = (got.elements == hi).mean(axis=0)
    assert np.all((got.elements == hi) | (got.elements == lo))
    assert inside.sum() >= 20
    assert np.all(np.abs(up[inside] - frac[inside]) < 0.06), np.abs(up - frac)[inside].max()


# --- API, counters, errors ------------------------------------------------------------------

def test_quantize_routes_block_formats_and_axis():
    x = block_data(64, 96, seed=6).T.copy()              # blocks along axis 0
    got = lpsim.quantize(x, "mxfp8_e4m3", axis=0)
    want = lpsim.quantize(np.ascontiguousarray(x.T), "mxfp8_e4m3").T
    assert same(got, want)
    import torch
    assert same(lpsim.quantize(torch.from_numpy(x), "mxfp4", axis=0).numpy(),
                lpsim.quantize(x, "mxfp4", axis=0))
    assert lpsim.quantize(6.5, "mxfp4") == 6.0
    odd = block_data(3, 40, seed=7)                     # 40 = 32 + a block of 8
    r = lpsim.blocks.quantize_blocks(odd, "mxfp4")
    assert r.scales.shape == (3, 2) and same(r.values[:, 32:],
                                             lpsim.blocks.quantize_blocks(odd[:, 32:], "mxfp4").values)


def test_block_counters():
    x = np.zeros((1, 128), np.float32)
    x[0, :32] = np.linspace(-1, 1, 32)      # scale 2**-2: +-1/31 underflow (|x/s| < 1/4)
    x[0, 32:64] = [1e3] + [1e-6] * 31       # scale 2**7: 1e3/128 = 7.8 saturates to 6
    x[0, 64] = np.nan                       # NaN block
    x[0, 96:] = 1e-40                       # scale clipped at 2**-127; every element flushed
    stats = BlockStats()
    lpsim.quantize(x, "mxfp4", stats=stats)
    assert stats.blocks == 4 and stats.nan_blocks == 1 and stats.clipped_scales == 1
    assert stats.elements == 128 and stats.nan == 1 and stats.overflow == 1
    assert stats.underflow == 2 + 31 + 32 and stats.flushed_blocks == 1
    per_block = lpsim.blocks.quantize_blocks(x, "mxfp4").counts[0]
    assert per_block[:, BLOCK_COUNTERS.index("underflow")].tolist() == [2, 31, 0, 32]
    ceil = BlockStats()
    lpsim.quantize(np.array([[7.9] + [1.0] * 31], np.float32), block("e2m1fn", rule="ceil"),
                   stats=ceil)
    assert ceil.overflow == 0                # ceil: scale 2**1, 7.9 / 2 = 3.95 -> 4
    flushed = BlockStats()
    lpsim.quantize(np.array([[1e-40] * 32], np.float32), "mxfp4", stats=flushed)
    assert flushed.flushed_blocks == 1 and flushed.clipped_scales == 1
    plain = lpsim.RoundingStats()
    lpsim.quantize(x, "mxfp4", stats=plain)
    assert plain.as_dict() == {k: getattr(stats, k) for k in plain.as_dict()}


def test_block_stats_sum_with_their_block_counters():
    """BlockStats + BlockStats (and +=) sums every counter, the block ones included; with a
    plain RoundingStats the element counters sum to a RoundingStats."""
    x = np.ones((4, 32), np.float32)
    x[0, 0] = np.nan
    a, b = BlockStats(), BlockStats()
    lpsim.quantize(x, "mxfp4", stats=a)
    lpsim.quantize(x[:2], "mxfp4", stats=b)
    want = {k: a.as_dict()[k] + b.as_dict()[k] for k in a.as_dict()}
    total = a + b
    assert type(total) is BlockStats and total.as_dict() == want
    assert want["blocks"] == 6 and want["nan_blocks"] == 2
    plain = lpsim.RoundingStats(elements=5, nan=1)
    for mixed in (a + plain, plain + a):
        assert type(mixed) is lpsim.RoundingStats
        assert mixed.elements == a.elements + 5 and mixed.nan == a.nan + 1
    a += b
    assert a.as_dict() == want
    a += plain
    assert a.elements == want["elements"] + 5 and a.blocks == 6


def test_block_sizes_beyond_int64_are_refused_by_name():
    """The kernels index blocks in int64: a block of 2**63 or more is refused when the format
    is made, naming the value and the range (2**63 - 1 itself is a format)."""
    assert block("e4m3fn", 2 ** 63 - 1).block == 2 ** 63 - 1
    for bad in (2 ** 63, np.uint64(2 ** 63), 10 ** 30):
        with pytest.raises(ValueError, match=r"block=.*accepted: an integer >= 1 and <= 2\*\*63 - 1"):
            block("e4m3fn", bad)


def test_presets_and_repr_round_trip():
    for name, bfmt in lpsim.blocks.PRESETS.items():
        assert parse_block_format(repr(bfmt)) == bfmt, repr(bfmt)
        assert bfmt.name == name
    assert lpsim.blocks.PRESETS["nvfp4"] == block("e2m1fn", 16, "ue4m3", "even",
                                                  tensor_scale=True)
    assert lpsim.blocks.PRESETS["mxint8"].element.max_finite == 127 / 64


@pytest.mark.parametrize("kwargs, error, words", [
    ({"element": "e2m1fn", "block": 0}, ValueError, "block=0"),
    ({"element": "e2m1fn", "rule": "round"}, ValueError, "rule='round'.*floor"),
    ({"element": "e2m1fn", "nonfinite": "zero"}, ValueError, "nonfinite='zero'"),
    ({"element": "e2m1fn", "tensor_scale": True}, ValueError, "mantissa bits"),
    ({"element": "e2m1fn", "tensor_scale": 1}, TypeError, "tensor_scale=1"),
    ({"element": "e12m9"}, ValueError, "e=12"),
    ({"element": "float4"}, ValueError, "unknown format"),
    ({"element": "e2m1fn", "rule": ["floor"]}, ValueError, r"rule=\['floor'\] is unknown"),
])
def test_bad_block_formats_name_the_value(kwargs, error, words):
    with pytest.raises(error, match=words):
        lpsim.blocks.BlockFormat(**kwargs)


@pytest.mark.parametrize("spec, words", [
    ("block(e4m3fn,-16)", r"block=-16 is not accepted; accepted: an integer >= 1"),
    ("block(e4m3fn,16,e8m0fnu,rceil,bogus=1)", r"option 'bogus' is unknown; accepted: "
                                               r"tensor_scale=, nonfinite="),
    ("block(e4m3fn,x)", r"block size 'x' is not an integer"),
    ("block(e2m1fn,16,e4m3fn,even,tensor_scale=true,tensor_scale=false)",
     r"option 'tensor_scale' is given twice; accepted: each option once"),
    ("block(e4m3fn,32,e8m0fnu,floor,nonfinite=nan,nonfinite=finite)",
     r"option 'nonfinite' is given twice"),
])
def test_bad_block_format_strings_name_the_part(spec, words):
    """A negative size was "not an integer"; an unknown option a positional argument; an
    option given twice took its last value."""
    with pytest.raises(ValueError, match=words):
        parse_block_format(spec)


def test_bad_calls_name_the_value():
    with pytest.raises(ValueError, match="unknown block format 'mxfp5'"):
        parse_block_format("mxfp5")
    with pytest.raises(ValueError, match="axis=2 is out of range"):
        lpsim.quantize(np.zeros((2, 2), np.float32), "mxfp4", axis=2)
    with pytest.raises(ValueError, match="integer 1152921504606846977"):
        lpsim.quantize(np.array([2 ** 60 + 1]), "mxfp4")        # not exact in float64
    with pytest.raises(ValueError, match="unknown rounding"):
        lpsim.quantize(np.zeros(4, np.float32), "mxfp4", "nearest_even")


def test_tensor_scales_are_float32_with_finite_reciprocals():
    """NVFP4's per-tensor scale is an FP32, and the reciprocals of the block scales under it
    scale the elements: a given one is rounded to float32 (the word and counted kernels then
    agree: they disagreed on 0.1), one below min_tensor_scale (about 2**-119: below it the
    smallest block scale's reciprocal overflows, and zeros became NaN, 0 * inf) or not a
    positive finite float32 is refused by name, and a tensor below about 4e-33 gets the
    least scale instead of an underflowing one."""
    x = block_data(64, 512, seed=8, lo=-6, hi=6)
    x[5, :40] = 0.0                                     # zero blocks: the smallest scale
    least = blocks.min_tensor_scale(parse_block_format("nvfp4"))
    assert 2.0 ** -119 <= least < 2.0 ** -118 and blocks.min_tensor_scale("nvfp4") == least
    for bad in (np.arange(4), np.zeros(4, np.float16), np.zeros((2, 2), np.float32), [1.0]):
        with pytest.raises(TypeError, match="tensor_amax takes a flat float32/float64"):
            blocks.tensor_amax(bad)
    for given in (0.1, 1e-30, 3e38, least):
        want = lpsim.blocks.quantize_blocks(x, "nvfp4", tensor_scale=float(np.float32(given)))
        counted = lpsim.blocks.quantize_blocks(x, "nvfp4", tensor_scale=given)
        words = lpsim.blocks.quantize_blocks(x, "nvfp4", tensor_scale=given,
                                             want_elements=False, want_counts=False)
        assert counted.tensor_scale == float(np.float32(given)), given
        assert not np.isnan(counted.values).any(), given
        assert same(counted.values, want.values) and same(words.values, want.values), given
    below = float(np.nextafter(np.float32(least), np.float32(0)))
    # 10**400: an integer past float64 (a bare OverflowError once)
    for bad in (below, 2.0 ** -126, 0.0, -1.0, np.inf, np.nan, 1e39, 10 ** 400):
        with pytest.raises(ValueError, match=re.escape(f"tensor_scale={bad!r} must be a float32")):
            lpsim.blocks.quantize_blocks(x, "nvfp4", tensor_scale=bad)
    for bad in ("a", "0.5", True, None.__class__):
        with pytest.raises(TypeError, match=re.escape(f"tensor_scale={bad!r} must be a number")):
            lpsim.blocks.quantize_blocks(x, "nvfp4", tensor_scale=bad)
    assert lpsim.blocks.quantize_blocks(x, "nvfp4", tensor_scale=np.float16(0.5)).tensor_scale \
        == 0.5
    tiny = (x * 1e-36).astype(np.float32)               # amax / 2688 is far below the least
    counted = lpsim.blocks.quantize_blocks(tiny, "nvfp4")
    assert counted.tensor_scale == least
    for values in (counted.values, lpsim.quantize(tiny, "nvfp4")):
        assert not np.isnan(values).any()
        assert same(values[5, :40], tiny[5, :40])       # zeros stay zeros, signs and all
        assert same(values, counted.values)


# --- codes ----------------------------------------------------------------------------------

ML_DTYPES = {"e2m1fn": "float4_e2m1fn", "e2m3fn": "float6_e2m3fn", "e3m2fn": "float6_e3m2fn",
             "e4m3fnuz": "float8_e4m3fnuz", "e5m2fnuz": "float8_e5m2fnuz",
             "e8m0fnu": "float8_e8m0fnu", "e4m3fn": "float8_e4m3fn", "e5m2": "float8_e5m2",
             "bf16": "bfloat16"}


@pytest.mark.parametrize("name", list(ML_DTYPES))
def test_codes_are_ml_dtypes_bit_patterns(name):
    import ml_dtypes
    from lpsim.storage import decode_codes, encode_values
    dtype = getattr(ml_dtypes, ML_DTYPES[name])
    bits = ml_dtypes.finfo(dtype).bits
    codes = np.arange(2 ** bits, dtype=np.uint16 if bits == 16 else np.uint8)
    with np.errstate(invalid="ignore"):
        want = codes.view(dtype).astype(np.float64)
    got = decode_codes(codes, name)
    finite = ~np.isnan(want)
    assert np.array_equal(np.isnan(got), ~finite)
    assert same(got[finite], want[finite])
    assert np.array_equal(encode_values(want[finite], name), codes[finite])
    nan = encode_values(np.array([np.nan]), name).astype(codes.dtype)
    if parse_block_format(block(name)).element.has_nan:
        with np.errstate(invalid="ignore"):
            assert np.isnan(nan.view(dtype).astype(np.float64))[0]


@pytest.mark.parametrize("name", list(lpsim.blocks.PRESETS))
def test_encode_decode_round_trip(name):
    x = edge_data(np.float32)[:, :32].T.copy()           # blocks along axis 0
    enc = lpsim.blocks.encode(x, name, axis=0)
    assert same(lpsim.blocks.decode(enc), lpsim.quantize(x, name, axis=0))
    scalar = np.array(-3.3, np.float32)                   # 0-d: decoded as 0-d (was (1,))
    assert same(lpsim.blocks.decode(lpsim.blocks.encode(scalar, name)),
                lpsim.quantize(scalar, name))
    assert lpsim.blocks.decode(lpsim.blocks.encode(scalar, name)).shape == ()
    bfmt = enc.format
    if bfmt.element.bits == 4:
        from lpsim.storage import pack_nibbles, unpack_nibbles
        packed = pack_nibbles(enc.codes)
        assert packed.shape[-1] == enc.codes.shape[-1] // 2
        assert np.array_equal(unpack_nibbles(packed), enc.codes)


def test_decode_of_a_block_longer_than_its_rows_makes_no_block_sized_array():
    """decode repeated each scale block times before trimming to the row: a block of 2**40
    (accepted, and quantized as one block a row) asked numpy for 8 TiB."""
    x = np.random.default_rng(2).standard_normal((3, 70)).astype(np.float32)
    for bfmt in (block("e4m3fn", 2 ** 40), block("e4m3fn", 7)):
        assert same(lpsim.blocks.decode(lpsim.blocks.encode(x, bfmt)), lpsim.quantize(x, bfmt))


@pytest.mark.parametrize("bfmt, part", [(block("fp32", 4), "element format fp32"),
                                         (block("e4m3fn", 4, "fp32", "floor"), "scale format fp32"),
                                         (block("bf16", 4, "fp(8,23,127)"), "scale")])
def test_encode_refuses_a_format_whose_codes_are_wider_than_16_bits(bfmt, part):
    """Its codes were kept in uint16: fp32 elements and scales came back as their low 16
    bits, silently (decode refused them later)."""
    with pytest.raises(ValueError, match=f"encode: .*'s {part}.* has 32-bit codes; accepted: "
                                         "element and scale formats of at most 16 bits"):
        blocks.encode(np.array([1.0, -3.0, 0.7, 100.0], np.float32), bfmt)


def test_decode_refuses_what_encode_did_not_make_by_name():
    with pytest.raises(TypeError, match=r"decode: encoded=3 is not accepted; accepted: what "
                                        r"lpsim\.blocks\.encode returns"):
        lpsim.blocks.decode(3)


@pytest.mark.parametrize("call", [
    lambda x: blocks.quantize(x, "mxfp4", tensor_scale=1e-3),
    lambda x: blocks.quantize_blocks(x, "mxfp8", tensor_scale=2.0),
    lambda x: blocks.encode(x, "mxfp6_e3m2", tensor_scale=1.0),
])
def test_a_tensor_scale_for_a_format_without_one_is_refused(call):
    """It was ignored: the values came back as if no scale had been given."""
    with pytest.raises(ValueError, match=r"tensor_scale=.* is not accepted for mx.*, which "
                                         r"has no per-tensor scale"):
        call(block_data(2, 64, seed=3))


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "nvfp4"])
def test_an_int_float64_cannot_hold_is_refused_without_a_contradiction(fmt):
    """A block format takes integers float64 holds; the refusal said a Python int scalar
    is rounded exactly, of the very scalar it refused (element formats round it exactly)."""
    with pytest.raises(ValueError, match=r"integer 9007199254740993, which float64 cannot "
                                         r"hold exactly; .*not to a block format"):
        lpsim.quantize(2 ** 53 + 1, fmt)
    assert lpsim.quantize(2 ** 53 + 1, "e5m2") == lpsim.quantize(2.0 ** 53, "e5m2")


def test_numpy_integer_scalars_come_back_as_numbers_as_element_formats_give_them():
    for value in (np.int64(3), np.int32(-5), np.uint8(7)):
        got = lpsim.quantize(value, "mxfp4")
        assert type(got) is float and got == float(lpsim.quantize(float(value), "mxfp4"))
        assert type(lpsim.quantize(value, "bf16")) is float


def test_mxint8_codes_are_ocp_twos_complement_int8():
    """They were sign-magnitude (lpsim's Format layout): OCP's INT8 readers took -0.5 for
    -1.5 and -1/64 for -127/64."""
    x = np.array([[1.0, -1.0, 0.5, -0.5, -1 / 64, -127 / 64] + [0.0] * 26], np.float32)
    enc = lpsim.blocks.encode(x, "mxint8")
    assert enc.codes[0, :6].tolist() == [0x40, 0xC0, 0x20, 0xE0, 0xFF, 0x81]
    y = block_data(4, 64, seed=9)
    enc = lpsim.blocks.encode(y, "mxint8")
    scale = np.repeat(2.0 ** (enc.scales.astype(np.float64) - 127), 32, axis=1)
    assert same(enc.codes.view(np.int8) / 64 * scale, lpsim.quantize(y, "mxint8"))
    assert same(lpsim.blocks.decode(enc), lpsim.quantize(y, "mxint8"))


def test_a_nan_element_no_code_can_hold_is_refused():
    """e2m1fn has no NaN code, and with nonfinite="finite" its block's scale is finite:
    encode wrote code 0, so decode gave 0 where quantize gives NaN."""
    bfmt = block("e2m1fn", 4, "e8m0fnu", "floor", nonfinite="finite")
    with pytest.raises(ValueError, match=r"a NaN element of .* has no code"):
        lpsim.blocks.encode(np.array([[1.0, np.nan, 2.0, 3.0]], np.float32), bfmt)
    x = np.array([[1.0, 2.0, 2.0, 3.0]], np.float32)
    assert same(lpsim.blocks.decode(lpsim.blocks.encode(x, bfmt)), lpsim.quantize(x, bfmt))


def test_mxfp4_codes_view_as_ml_dtypes():
    import ml_dtypes
    x = block_data(2, 64, seed=8)
    enc = lpsim.blocks.encode(x, "mxfp4")
    q = enc.codes.view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    s = enc.scales.view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    assert same(q * np.repeat(s, 32, axis=1), lpsim.quantize(x, "mxfp4"))


# --- the element fast path -----------------------------------------------------------------

@pytest.mark.parametrize("container", [np.float64, np.float32], ids=lambda d: d.__name__)
@pytest.mark.parametrize("fmt", ["e2m1fn", "e4m3fn", "e5m2", "e3m2fn", "fp(4,3,0, subnormals=False)",
                                 "fp(1,6,1, specials='fnuz', saturate=True)", "e4m3fnuz",
                                 "fp(3,0,0, saturate=True)", "bf16"])
def test_round_fast_sub_equals_round_bits_wherever_it_applies(fmt, container):
    """Random bit patterns and every code point, midpoint and neighbour of fmt, in every mode
    (stochastic with random words, few-bit too): bits and flags identical (float32
    containers: on 32-bit words, as the float32 block kernel runs it)."""
    from lpsim.rounding import MODES, kernel_params
    from test_blocks_kernel import fast_and_exact

    fmt = lpsim.parse_format(fmt)
    p = kernel_params(fmt, container)._replace(W=32)
    rng = np.random.default_rng(9)
    values = np.array([float(v) for v in reference.enumerate_values(fmt)
                       if fmt.bits <= 9], np.float64)
    mids = ((values[1:] + values[:-1]) / 2 if values.size else values).astype(container)
    wide = rng.standard_normal(4000) * 2.0 ** rng.integers(-30, 30, 4000)
    edges = [0.0, fmt.max_finite * 3, fmt.min_subnormal / 3, np.inf, np.nan]
    with np.errstate(over="ignore"):            # 3 * bf16's max is inf in float32
        x = np.concatenate([values.astype(container), mids, np.nextafter(mids, container(0)),
                            np.nextafter(mids, container(np.inf)), wide.astype(container),
                            np.array(edges, container)])
    x = np.concatenate([x, -x])
    bits = x.view(np.int64) if container == np.float64 else x.view(np.uint32).astype(np.int64)
    rs = rng.integers(0, 2 ** 32, x.size).astype(np.int64)
    for mode in MODES.values():
        for k in (32, 3):
            fast, slow, oks, fflags, sflags = fast_and_exact(x, mode, rs, k, p)
            ok = oks == 1
            assert ok.mean() > 0.5
            assert np.array_equal(fast[ok], slow[ok]), (mode, k, x[ok][fast[ok] != slow[ok]][:4])
            assert np.array_equal(fflags[ok], sflags[ok]), (mode, k)
            assert np.array_equal(fast[~ok], bits[~ok])          # left as they came


def test_block_formats_take_array_likes_and_check_out_first():
    """As lpsim.quantize: lists, integers and float16 upcast exactly; a read-only out is
    refused before anything is written; Python numbers come back as floats."""
    x = np.linspace(-3, 3, 40)
    want = lpsim.quantize(x, "mxfp4")
    assert np.array_equal(lpsim.quantize(x.tolist(), "mxfp4"), want)
    assert np.array_equal(lpsim.quantize(x.astype(np.float16), "mxfp4"),
                          lpsim.quantize(x.astype(np.float16).astype(np.float32), "mxfp4"))
    assert lpsim.quantize(7, "mxfp4") == 6.0 and type(lpsim.quantize(7, "mxfp4")) is float
    readonly = x.copy()
    readonly.setflags(write=False)
    with pytest.raises(ValueError, match="out is read-only"):
        lpsim.quantize(readonly, "mxfp4", out=readonly)
    with pytest.raises(TypeError, match="dtype object"):
        lpsim.quantize(np.array([1, "a"], object), "mxfp4")


@pytest.mark.parametrize("bfmt", ["mxfp4", "nvfp4", blocks.block("e4m3fn", 16)], ids=str)
def test_cached_calls_equal_the_general_path(bfmt, monkeypatch):
    """A second lpsim.quantize call with the same block format, rounding and sr_bits on a
    float32 array without stats runs from a cached plan (lpsim.blocks.quantize_cached,
    without lpsim.blocks.quantize_blocks); the values are the general path's, with and
    without out; in place, a transposed view and another axis (left to the general path)
    and a 1-D array (cached too) as well."""
    rng = np.random.default_rng(31)
    x = (rng.standard_normal((3, 70)) * 2.0 ** rng.integers(-20, 20, (3, 70))).astype(np.float32)
    cases = [("nearest", {}), ("stochastic", dict(seed=5, stream=2, offset=7)),
             ("stochastic", dict(seed=6, sr_bits=4))]
    for rounding, kw in cases:
        want = blocks.quantize_blocks(x, bfmt, rounding, **kw).values
        assert same(lpsim.quantize(x, bfmt, rounding, **kw), want)       # leaves a plan
        key = (bfmt, rounding, kw.get("sr_bits"), type(kw.get("sr_bits")))
        assert key in blocks._WORDS
        general = blocks.quantize_blocks
        with monkeypatch.context() as m:
            # the cached path never calls it
            m.setattr(blocks.fake_quantize, "quantize_blocks", None)
            assert same(lpsim.quantize(x, bfmt, rounding, **kw), want)
            out = np.full_like(x, np.nan)
            assert lpsim.quantize(x, bfmt, rounding, out=out, **kw) is out
            assert same(out, want)
        inplace = x.copy()
        lpsim.quantize(inplace, bfmt, rounding, out=inplace, **kw)
        assert same(inplace, want)
        for y, axis in ((x.T, -1), (x[1], -1), (x, 0)):
            assert same(lpsim.quantize(y, bfmt, rounding, axis=axis, **kw),
                        general(y, bfmt, rounding, axis=axis, **kw).values)


@pytest.mark.parametrize("bfmt", ["mxfp4", "nvfp4", blocks.block("e4m3fn", 16)], ids=str)
def test_counted_and_generated_calls_on_the_cached_path_equal_the_general_path(bfmt,
                                                                              monkeypatch):
    """With stats (RoundingStats or BlockStats) and a Generator, a numpy array's or a plain
    CPU float32 tensor's call runs from the cached plan too: the general path's values,
    counters and generator counters; a stats subclass, a tensor autograd follows and a
    strided tensor take the general paths, with the same values."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(32)
    x = (rng.standard_normal((4, 64)) * 2.0 ** rng.integers(-40, 40, (4, 64))).astype(np.float32)
    x[0, :3] = [np.inf, np.nan, 1e38]

    class Mine(BlockStats):
        pass

    def run(data, rounding, stats_type, general):
        g, stats = lpsim.Generator(9), stats_type()
        with monkeypatch.context() as m:
            if general:
                m.setattr(blocks.fake_quantize, "quantize_cached", lambda *a, **k: None)
            else:       # the cached path never calls these
                m.setattr(blocks.fake_quantize, "quantize_blocks", None)
                m.setattr(lpsim.tensors, "quantize_tensor", None)
            for _ in range(2):
                q = lpsim.quantize(data, bfmt, rounding, generator=g, stats=stats)
        q = q.numpy() if isinstance(q, torch.Tensor) else q
        return q, stats.as_dict(), g.get_state()

    for rounding in ("nearest", "stochastic"):
        lpsim.quantize(x, bfmt, rounding)                   # leaves a plan
        for stats_type in (lpsim.RoundingStats, BlockStats):
            want = run(x, rounding, stats_type, general=True)
            assert want[1]["elements"] == 2 * x.size
            for data in (x, torch.from_numpy(x)):
                got = run(data, rounding, stats_type, general=False)
                assert same(got[0], want[0]) and got[1:] == want[1:], (rounding, stats_type)
        mine = run(x, rounding, Mine, general=True)        # as BlockStats' (the last want)
        assert same(mine[0], want[0]) and mine[1:] == want[1:]
    # tensors left to lpsim.tensors' rules: the values of their numpy copies
    want = lpsim.quantize(x, bfmt, "nearest")
    q = lpsim.quantize(torch.from_numpy(x.copy()).requires_grad_(), bfmt, "nearest")
    assert q.requires_grad and same(q.detach().numpy(), want)
    strided = torch.from_numpy(np.ascontiguousarray(x.T)).T
    assert not strided.is_contiguous() and same(lpsim.quantize(strided, bfmt).numpy(), want)


def test_offsets_past_the_counters_are_refused():
    """Element i uses counter offset + i: a block call whose last counter passes 2**62 is
    refused naming the offset, on the first call and on the cached path, as rounding to an
    element format is."""
    x = np.ones((2, 64), np.float32)
    lpsim.quantize(x, "mxfp4", "stochastic", seed=1)            # leaves a cached plan
    for bfmt in ("mxfp4", "nvfp4"):
        for _ in range(2):
            with pytest.raises(ValueError, match="offset=4611686018427387900"):
                lpsim.quantize(x, bfmt, "stochastic", seed=1, offset=2 ** 62 - 4)
    assert same(lpsim.quantize(x, "mxfp4", "stochastic", seed=1, offset=2 ** 62 - 128),
                lpsim.quantize(x, "mxfp4", "stochastic", seed=1, offset=2 ** 62 - 128))


def test_the_plan_cache_stays_bounded_and_right_under_threads(monkeypatch):
    """Plans of many block formats: the cache clears when full (MAX_CACHED) and every call
    still gives the general path's values, also with four threads filling and reading it at
    once."""
    import threading
    monkeypatch.setattr(blocks.fake_quantize, "MAX_CACHED", 8)
    blocks._WORDS.clear()
    x = np.random.default_rng(4).standard_normal((2, 48)).astype(np.float32)
    formats = [block("e2m1fn", size) for size in range(1, 25)]
    want = {f: blocks.quantize_blocks(x, f).values for f in formats}
    errors = []

    def work(part):
        for _ in range(5):
            for f in formats[part::4]:
                if not same(lpsim.quantize(x, f), want[f]):
                    errors.append(f)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert 0 < len(blocks._WORDS) <= 8


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 32), (2, 0, 5)])
def test_empty_arrays_round_to_empty_arrays(shape):
    """As element formats do (numpy's reshape error before); a bad axis, out or stats still
    gets its error."""
    x = np.zeros(shape, np.float32)
    for name in ("mxfp4", "nvfp4"):
        stats = lpsim.blocks.BlockStats()
        got = lpsim.quantize(x, name, "stochastic", seed=1, axis=0, stats=stats)
        assert got.shape == shape and got.dtype == np.float32 and stats.elements == 0
        out = np.ones(shape, np.float32)
        assert lpsim.quantize(x, name, out=out) is out
    with pytest.raises(ValueError, match="axis=3 is out of range"):
        lpsim.quantize(x, "mxfp4", axis=3)
    with pytest.raises(TypeError, match="stats=3 is a int"):
        lpsim.quantize(x, "mxfp4", stats=3)
    with pytest.raises(ValueError, match="out must be"):
        lpsim.quantize(x, "mxfp4", out=np.zeros(7, np.float32))


def test_a_stats_that_is_not_a_rounding_stats_is_refused_by_name():
    with pytest.raises(TypeError, match="stats=3 is a int; accepted: an lpsim.RoundingStats"):
        lpsim.quantize(np.ones(32, np.float32), "mxfp4", stats=3)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tensor_amax_on_every_layout_and_split(dtype, monkeypatch):
    """tensor_amax is the largest finite magnitude, ignoring NaN and inf: through the
    compiled entry point (contiguous), numba's dispatcher (a strided view), and the split
    over threads (AMAX_GRAIN lowered so a small array has several ranges)."""
    rng = np.random.default_rng(4)
    x = (rng.standard_normal(4099) * np.exp2(rng.integers(-20, 20, 4099))).astype(dtype)
    x[[3, 700, 4000]] = [np.inf, -np.nan, -np.inf]
    finite = np.abs(x[np.isfinite(x)])
    assert blocks.tensor_amax(x) == float(finite.max())
    assert blocks.tensor_amax(x[::3]) == float(np.abs(x[::3][np.isfinite(x[::3])]).max())
    monkeypatch.setattr(blocks.amax, "AMAX_GRAIN", 512)
    monkeypatch.setattr(blocks.amax, "threads", lambda: 3)
    assert blocks.tensor_amax(x) == float(finite.max())
    assert blocks.tensor_amax(np.full(7, np.nan, dtype)) == 0.0


@pytest.mark.parametrize("mode", ["nearest", "stochastic", "up"])
def test_word_kernel_leaves_element_formats_below_float32_normals_to_the_counted_one(mode):
    """An element format whose normals start below float32's (round_fast_sub's 32-bit lanes
    hold only nonnegative quantities) is rounded as the counted kernel rounds it: 255 of 256
    elements differed."""
    fmt = blocks.block("fp(8,8,12, specials='saturate')", 32, "e8m0fnu", "floor")
    assert not blocks.words_exact(fmt)
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    words = blocks.quantize(x, fmt, mode, seed=3)
    counted = blocks.quantize(x, fmt, mode, seed=3, stats=blocks.BlockStats())
    assert same(words, counted)


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_block_formats_refuse_out_with_a_scalar(fmt):
    """A scalar is returned rounded, so out= with it is refused by name, as element formats
    refuse it (block formats ignored it, even a string)."""
    for x in (1.2345, np.float32(1.2345), 3):
        for out in (np.zeros(3), "not an array"):
            with pytest.raises(TypeError, match="out= applies to arrays"):
                lpsim.quantize(x, fmt, out=out)
    assert lpsim.quantize(1.2345, fmt) == lpsim.quantize(np.array([1.2345]), fmt)[0]


@pytest.mark.parametrize("scale", ["e4m3fn", "fp(5,3)", "fp(6,2)", "fp(7,4)"])
def test_min_tensor_scale_is_the_least_float32_with_finite_reciprocals(scale):
    # found by bisection over float32 bits: it holds, and the float32 below it does not
    from lpsim.blocks.amax import _reciprocal_finite
    bfmt = blocks.block("e2m1fn", 16, scale=scale, rule="even", tensor_scale=True)
    least = np.float32(blocks.min_tensor_scale(bfmt))
    smin = np.float32(bfmt.scale.min_subnormal)
    assert _reciprocal_finite(least, smin)
    assert not _reciprocal_finite(np.nextafter(least, np.float32(0)), smin)


def test_a_tensor_scale_past_float32_saturates_and_the_values_clip():
    """Where scale max * element max < 1 (here 3 * 2**-147) the quotient amax32 / divisor
    passes float32's range: the per-tensor scale was inf and every value NaN, uncounted.
    It saturates at float32's largest; the values clip to the format's largest, their block
    scales counted as clipped; the exact reference agrees."""
    from lpsim import reference
    bfmt = blocks.BlockFormat(element=lpsim.fp(2, 0, 0), block=1, scale=lpsim.fp(2, 1, 148),
                              rule="floor", tensor_scale=True)
    x = np.array([[1.0, -0.5, 0.0]], np.float32)
    with np.errstate(over="raise"):
        got = blocks.quantize_blocks(x, bfmt, "nearest", want_counts=True)
    top = float(np.finfo(np.float32).max)
    assert got.tensor_scale == top == float(reference.tensor_scale_exact(x, bfmt))
    values, _, scales, counts = reference.quantize_blocks(x, bfmt, "nearest")
    assert np.array_equal(got.values, values) and np.isfinite(values).all()
    assert np.array_equal(got.counts, counts) and counts[0, :2, 6].tolist() == [1, 1]
    assert abs(got.values[0, 0]) == 2 * 1.5 * 2.0 ** -147 * top     # the largest value


def test_tensor_scale_from_saturates_beyond_float32_and_keeps_the_least():
    """NVFP4's tensor scale of an amax, against its definition: fp32(amax32 / 2688) with
    amax32 = fp32(amax) saturated at float32's largest (float64 data beyond it, inf), at
    least min_tensor_scale, 1 where amax32 is 0 (5e-324 too); no overflow warning."""
    from lpsim.blocks.amax import tensor_scale_from
    bfmt = parse_block_format("nvfp4")
    least, top = blocks.min_tensor_scale(bfmt), np.finfo(np.float32).max
    divisor = np.float32(bfmt.tensor_scale_divisor)
    for amax in (0.0, 1.0, 2.5, 1e-40, 5e-324, float(top), 3.4028236e38, 1e300, np.inf,
                 np.float32(7.0), np.float64(448.0 * 6 * 3)):
        with np.errstate(all="ignore"):
            amax32 = min(np.float32(amax), top)
            want = 1.0 if amax32 == 0 else max(float(np.float32(amax32 / divisor)), least)
        with np.errstate(over="raise", invalid="raise", divide="raise"):   # no overflow
            assert tensor_scale_from(amax, bfmt) == want, amax
