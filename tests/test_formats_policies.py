"""ml_dtypes' small formats (fn, fnuz, fnu), the string syntax for every option, strict flags.

Each new preset is checked against its ml_dtypes dtype code point by code point (the finite
values), by round-to-nearest casts of random and edge-case float32 inputs, and against
lpsim.reference for every deterministic mode on every code point and midpoint.
"""

import itertools

import ml_dtypes
import numpy as np
import pytest

import lpsim
from lpsim import fp, parse_format, reference
from lpsim.formats import POLICIES, PRESETS
from lpsim.rounding import DETERMINISTIC_MODES

from test_peers_ml_dtypes import edge_values, random_finite
from test_reference_exhaustive import run_case

PEERS = {"e2m1fn": ml_dtypes.float4_e2m1fn, "e2m3fn": ml_dtypes.float6_e2m3fn,
         "e3m2fn": ml_dtypes.float6_e3m2fn, "e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
         "e5m2fnuz": ml_dtypes.float8_e5m2fnuz, "e8m0fnu": ml_dtypes.float8_e8m0fnu}


def peer_values(dtype):
    """Every finite value of an ml_dtypes dtype, from all its codes."""
    bits = {4: 4, 6: 6}.get(ml_dtypes.finfo(dtype).bits, 8)
    v = np.arange(2 ** bits, dtype=np.uint8).view(dtype).astype(np.float64)
    return np.unique(v[np.isfinite(v)])


@pytest.mark.parametrize("name", list(PEERS))
def test_every_code_point_of_the_peer_is_a_value_and_nothing_else(name):
    dtype, fmt = PEERS[name], parse_format(name)
    values = {float(v) for v in reference.enumerate_values(fmt)}
    ours = sorted(values | ({-v for v in values} if fmt.signed else set()))
    assert np.array_equal(np.array(ours), peer_values(dtype))
    info = ml_dtypes.finfo(dtype)
    assert fmt.max_finite == float(info.max) and fmt.bits == info.bits
    assert fmt.min_subnormal == float(info.smallest_subnormal)
    assert fmt.has_inf is False and fmt.has_nan == (name not in ("e2m1fn", "e2m3fn", "e3m2fn"))
    assert parse_format(f"float{fmt.bits}_{name}") is fmt


@pytest.mark.parametrize("name", list(PEERS))
def test_nearest_equals_the_ml_dtypes_cast(name):
    dtype = PEERS[name]
    x = np.concatenate([random_finite(1 << 16), edge_values(dtype)])
    x = x[~np.isnan(x)]       # ml_dtypes casts NaN to -0 in the NaN-free formats; lpsim keeps it
    if name == "e8m0fnu":
        # ml_dtypes rounds every value strictly between 2**-127 and 2**-126 up to 2**-126
        # (its float32-subnormal path); lpsim rounds them to nearest as in the normal range
        x = x[~((np.abs(x) > 2.0 ** -127) & (np.abs(x) < 2.0 ** -126))]
    with np.errstate(over="ignore", invalid="ignore"):
        expected = x.astype(dtype).astype(np.float32)
    # ties between two powers of two: ml_dtypes rounds them away from zero; lpsim's nearest
    # keeps its m = 0 rule (to the even exponent code), and nearest_away is ml_dtypes' cast
    got = lpsim.quantize(x, name, "nearest_away" if name == "e8m0fnu" else "nearest")
    same = (got.view(np.uint32) == expected.view(np.uint32)) | (np.isnan(got) & np.isnan(expected))
    bad = np.flatnonzero(~same)
    assert bad.size == 0, list(zip(x[bad[:5]], got[bad[:5]], expected[bad[:5]]))


# ml_dtypes' two further float names: fp(3,4,0) (IEEE-like) and fp(4,3,4) fnuz (bias 11)
MORE_PEERS = {"float8_e3m4": ml_dtypes.float8_e3m4,
              "float8_e4m3b11fnuz": ml_dtypes.float8_e4m3b11fnuz}


@pytest.mark.parametrize("name", list(MORE_PEERS))
def test_the_other_ml_dtypes_names_are_their_types(name):
    """Every code point, and the cast of every positive float32 from a quarter of the
    smallest subnormal to four times the largest binade (both signs of random and edge
    values), equal ml_dtypes' bit for bit."""
    dtype, fmt = MORE_PEERS[name], parse_format(name)
    values = {float(v) for v in reference.enumerate_values(fmt)}
    assert np.array_equal(np.array(sorted(values | {-v for v in values})), peer_values(dtype))
    assert fmt.bits == ml_dtypes.finfo(dtype).bits and fmt.has_inf == (name == "float8_e3m4")
    lo = np.float32(fmt.min_subnormal / 4).view(np.uint32)
    hi = np.float32(2.0 ** (fmt.emax + 2)).view(np.uint32)
    chunks = [np.arange(start, min(start + (1 << 24), hi), dtype=np.uint32).view(np.float32)
              for start in range(int(lo), int(hi), 1 << 24)]
    for x in chunks + [np.concatenate([random_finite(1 << 16), edge_values(dtype)])]:
        with np.errstate(over="ignore", invalid="ignore"):
            expected = x.astype(dtype).astype(np.float32)
        got = lpsim.quantize(x, fmt)
        same = (got.view(np.uint32) == expected.view(np.uint32)) | (np.isnan(got)
                                                                   & np.isnan(expected))
        bad = np.flatnonzero(~same)
        assert bad.size == 0, list(zip(x[bad[:5]], got[bad[:5]], expected[bad[:5]]))


def test_the_issue_examples():
    assert lpsim.quantize(6.0, "e2m1fn") == 6.0
    assert lpsim.quantize(1e9, "e2m1fn") == 6.0 and lpsim.quantize(-np.inf, "e2m1fn") == -6.0
    assert lpsim.quantize(2.0 ** -127, "e8m0") == 2.0 ** -127
    assert parse_format("float4_e2m1fn") == fp(2, 1, specials="saturate")
    assert np.isnan(lpsim.quantize(0.0, "e8m0fnu")) and np.isnan(lpsim.quantize(-1.0, "e8m0fnu"))
    z = lpsim.quantize(np.array([-0.0, -1e-9], np.float32), "e4m3fnuz")
    assert z.view(np.uint32).tolist() == [0, 0]          # one zero, unsigned
    assert np.isnan(lpsim.quantize(np.inf, "e4m3fnuz"))


POLICY_FORMATS = [fp(4, 3, 1, specials="fnuz"), fp(3, 2, 1, specials="fnuz", subnormals=False),
                  fp(3, 2, 1, specials="fnuz", saturate=True), fp(8, 0, 1, specials="fnu"),
                  fp(3, 1, 0, specials="fnu"), fp(2, 1, specials="saturate"),
                  fp(2, 3, specials="saturate")]


@pytest.mark.parametrize("rounding", DETERMINISTIC_MODES)
@pytest.mark.parametrize("fmt", POLICY_FORMATS, ids=str)
def test_new_policies_match_the_reference_on_every_code_point_and_midpoint(fmt, rounding):
    dtype = np.float64 if fmt.bits <= 6 else np.float32     # both containers, fewer cases
    run_case(fmt, rounding, dtype, finite=True)
    run_case(fmt, rounding, dtype, finite=False)


@pytest.mark.parametrize("fmt", POLICY_FORMATS[:5], ids=str)
def test_new_policies_match_the_reference_in_stochastic_modes(fmt):
    x = np.concatenate([np.linspace(-3 * fmt.max_finite, 3 * fmt.max_finite, 301),
                        [0.0, -0.0, fmt.min_subnormal / 3, -fmt.min_subnormal / 3]]).astype(np.float32)
    for rounding, sr_bits in [("stochastic", None), ("stochastic", 3), ("stochastic_equal", None)]:
        stats = lpsim.RoundingStats()
        got = lpsim.quantize(x, fmt, rounding, seed=11, sr_bits=sr_bits, stats=stats)
        want, want_stats = reference.quantize(x, fmt, rounding, seed=11, sr_bits=sr_bits)
        assert np.array_equal(got.view(np.int32), want.view(np.int32)), (fmt, rounding)
        assert stats.as_dict() == want_stats.as_dict()


def every_format():
    """Presets plus one format for each combination of options."""
    yield from PRESETS.values()
    for specials in POLICIES:
        for subnormals in (True, False):
            for saturate in (True, False):
                for b in (0, -3, 5):
                    yield fp(4, 3, b, subnormals=subnormals, specials=specials,
                             saturate=saturate)


def test_repr_parses_back_for_every_format():
    for fmt in every_format():
        assert parse_format(repr(fmt)) == fmt, repr(fmt)
        assert parse_format(str(fmt).upper()) == fmt


@pytest.mark.parametrize("spec, fmt", [
    ("fp(4,3,0,subnormals=False)", fp(4, 3, subnormals=False)),
    ("fp(4, 3, saturate=True)", fp(4, 3, saturate=True)),
    ("fp(4,3,0,fn,saturate=true)", fp(4, 3, specials="fn", saturate=True)),
    ("fp(5,2,1, specials=\"fnuz\")", fp(5, 2, 1, specials="fnuz")),
    ("e4m3fnuz", fp(4, 3, 1, specials="fnuz")),
    ("fp(8,0,1,fnu)", parse_format("float8_e8m0fnu")),
])
def test_option_syntax(spec, fmt):
    assert parse_format(spec) == fmt


@pytest.mark.parametrize("spec, words", [
    ("fp(4,3,0,subnormals=maybe)", "subnormals=maybe must be True or False"),
    ("fp(4,3,0,rounding=1)", "unknown option 'rounding'"),
    ("fp(4,3,0,wild)", "specials='wild' is unknown"),
    ("fp(4,3,fn,0)", "not understood; accepted"),
    ("fp(4,3,0,saturate=True,fn)", "positional 'fn' after an option"),
    ("fp(4,3,)", "empty argument"),
    ("fp(4,3,0,)", "empty argument"),
    ("fp(4,3,True)", "'true' is not an integer"),
    ("fp(4,3,1e0)", "'1e0' is not an integer"),
    ("fp(4,3,0, saturate, saturate=False)", "contradicts itself.*'saturate' policy"),
    ("fp(4,3,0, specials=saturate, saturate=False)", "contradicts itself"),
    # past Python's 4300-digit limit: its int() message named neither b nor the range
    ("fp(4,3," + "9" * 5000 + ")", r"b has 5000 digits; accepted: fp\(e, m\[, b\]\)"),
    ("fp(" + "1" * 200 + ",3)", "e has 200 digits"),
])
def test_option_syntax_errors_name_the_part(spec, words):
    with pytest.raises(ValueError, match=words):
        parse_format(spec)


@pytest.mark.parametrize("kwargs, words", [
    ({"subnormals": "no"}, "subnormals='no' must be True or False"),
    ({"saturate": "no"}, "saturate='no' must be True or False"),
    ({"saturate": 1}, "saturate=1 must be True or False"),
    ({"subnormals": None}, "subnormals=None must be True or False"),
])
def test_flags_take_booleans_only(kwargs, words):
    with pytest.raises(TypeError, match=words):
        fp(8, 7, **kwargs)
    assert fp(8, 7, subnormals=np.bool_(False)).subnormals is False


def test_within_is_every_value_exact_in_the_other_format():
    """Format.within(other) against the values themselves: every value of each small format
    (e 2..4, m 0..3, every policy, subnormals on and off: 102 formats) rounded to nearest in
    every other, exact (NaN kept) where and only where within says so.  It once ignored
    subnormals flushed by the other format, signs and zero (fnu), infinities and a largest
    value past the other's at the same exponent."""
    from lpsim.storage import decode_codes
    values = {}
    for e, m, policy, subnormals in itertools.product(range(2, 5), range(4), POLICIES,
                                                      (True, False)):
        try:
            fmt = fp(e, m, 0, subnormals=subnormals, specials=policy)
            v = decode_codes(np.arange(2 ** fmt.bits), fmt)
        except ValueError:                  # no such format, or no code layout (fnu, m > 0)
            continue
        # the codes of subnormals are no values of a format without them
        values[fmt] = v if subnormals else v[(v == 0) | ~(np.abs(v) < fmt.min_normal)]
    assert len(values) == 102
    for a, b in itertools.product(values, values):
        q = lpsim.quantize(values[a], b, "nearest")
        exact = bool(np.all((q == values[a]) | (np.isnan(q) & np.isnan(values[a]))))
        assert a.within(b) == exact, (a, b)
