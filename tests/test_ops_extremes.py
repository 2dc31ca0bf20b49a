"""lpsim.ops at the edges of float64: products, quotients and roots whose float64 residuals
underflow or overflow, checked against exact rational rounding (lpsim.reference)."""

import math
import random
import sys
from fractions import Fraction

import numpy as np
import pytest

from lpsim import ops, reference

MODES = ("up", "down", "toward_zero", "nearest")


def exact(value, fmt, rounding):
    """The reference rounding of a Fraction, as a Fraction (zeros as 0)."""
    return Fraction(reference.round_exact(value, fmt, rounding).value)


def sqrt_fraction(x: float) -> Fraction:
    """A Fraction that rounds as sqrt(x) does in every deterministic mode of formats with
    at most 2**-600 relative spacing: sqrt truncated to 400 extra bits, plus a sticky bit
    far below them when the root is inexact."""
    f = Fraction(x)
    n, d = f.numerator, f.denominator           # d a power of two
    radicand = n * d << 800
    root = math.isqrt(radicand)
    low = Fraction(root, d << 400)
    return low + Fraction(1, d << 420) if root * root != radicand else low


def test_fma_with_a_product_below_float64_rounds_the_exact_result():
    """The issue's repro: a*b = 2**-1100 is not a float64; fma keeps it, as mul does."""
    a, b = 2.0 ** -1000, 2.0 ** -100
    tiny = Fraction(a) * Fraction(b)
    assert ops.fma(a, b, 0.0, "bf16", "up") == ops.mul(a, b, "bf16", "up") == \
        exact(tiny, "bf16", "up") == Fraction(2 ** -133)
    assert ops.fma(a, b, 1.0, "bf16", "up") == exact(1 + tiny, "bf16", "up") == 1.0078125
    assert ops.fma(a, -b, 1.0, "bf16", "down") == exact(1 - tiny, "bf16", "down")
    assert ops.fma(a, b, 1.0, "bf16", "nearest") == 1.0
    # arrays, and the fast path a second call takes
    for _ in range(2):
        got = ops.fma(np.array([a, a, 1.0]), np.array([b, -b, 1.0]), np.array([1.0, 0.0, 1.0]),
                      "bf16", "up")
        assert got.tolist() == [1.0078125, -0.0, 2.0]


def test_fma_with_a_product_beyond_float64_rounds_the_exact_result():
    """a*b = 2**1024 overflows float64; a*b + c is a float64-sized number."""
    big, top = 2.0 ** 512, sys.float_info.max
    value = Fraction(2) ** 1024 - Fraction(top)
    for rounding in MODES:
        assert ops.fma(big, big, -top, "fp(11,50)", rounding) == \
            exact(value, "fp(11,50)", rounding) == 2.0 ** 971
    assert ops.fma(big, big, 0.0, "bf16", "nearest") == math.inf
    assert ops.fma(big, big, 0.0, "fp(8,7,0,saturate=True)", "nearest") == \
        float(reference.max_finite(ops.elementwise.parse_format("fp(8,7,0,saturate=True)")))


def test_fma_stochastic_with_a_tiny_product_rounds_its_exact_result():
    """The exact path draws the element's own word: 1 + 2**-1100 rounds up with
    probability 2**-1093 (never); a product of 2**-1060 (a value of fp(11,50), not a
    float64 product with an exact residual) stays itself."""
    a = np.full(64, 2.0 ** -1000)
    got = ops.fma(a, a * 0 + 2.0 ** -100, np.ones(64), "bf16", "stochastic", seed=5)
    assert (got == 1.0).all()
    got = ops.fma(a, a * 0 + 2.0 ** -60, np.zeros(64), "fp(11,50)", "stochastic", seed=5)
    assert (got == 2.0 ** -1060).all()


@pytest.mark.parametrize("fmt", ["bf16", "fp(11,23)", "fp(11,50)"])
def test_tiny_operands_against_the_reference(fmt):
    """div with a subnormal dividend, sqrt of subnormals and fma with products below 2**-969
    (their FMA residuals underflow), every deterministic mode, seeded draws."""
    rng = random.Random(35)
    for _ in range(60):
        a = math.ldexp(rng.getrandbits(52) | 1, rng.randint(-1126, -1000))
        b = math.ldexp(rng.getrandbits(53) | 1 << 52, rng.randint(-1126, -1000))
        x = math.ldexp(rng.getrandbits(52) | 1, rng.randint(-1126, -950))
        p = math.ldexp(rng.getrandbits(26) | 1, rng.randint(-590, -420))
        q = math.ldexp(rng.getrandbits(26) | 1, rng.randint(-590, -420))
        c = rng.choice([0.0, 1.0, -1.0, -5e-324, math.ldexp(rng.getrandbits(52), -1126)])
        for rounding in MODES:
            assert ops.div(a, b, fmt, rounding) == exact(Fraction(a) / Fraction(b), fmt,
                                                         rounding), (a, b, rounding)
            assert ops.sqrt(x, fmt, rounding) == exact(sqrt_fraction(x), fmt, rounding), \
                (x, rounding)
            got = ops.fma(p, q, c, fmt, rounding)
            want = reference.round_exact(Fraction(p) * Fraction(q) + Fraction(c), fmt,
                                         rounding).value
            assert got == want and math.copysign(1, got) == math.copysign(1, want), \
                (p, q, c, rounding)


def test_sqrt_and_div_of_subnormals_in_arrays_match_scalars():
    rng = np.random.default_rng(35)
    x = np.ldexp(rng.integers(1, 1 << 52, 200).astype(np.float64), -1126)
    y = np.ldexp(rng.integers(1 << 52, 1 << 53, 200).astype(np.float64), -1100)
    for rounding in ("up", "down"):
        roots = ops.sqrt(x, "fp(11,50)", rounding)
        quotients = ops.div(x, y, "fp(11,50)", rounding)
        assert roots.tolist() == [ops.sqrt(float(v), "fp(11,50)", rounding) for v in x]
        assert quotients.tolist() == [ops.div(float(u), float(v), "fp(11,50)", rounding)
                                      for u, v in zip(x, y)]
        assert [Fraction(v) for v in roots[:20]] == \
            [exact(sqrt_fraction(float(v)), "fp(11,50)", rounding) for v in x[:20]]


def _sequential(terms, acc_fmt, rounding):
    """The sequential fused accumulation in Fractions: acc = fl(acc + t) from fl(t_0)."""
    acc = exact(terms[0], acc_fmt, rounding)
    for t in terms[1:]:
        acc = exact(acc + t, acc_fmt, rounding)
    return acc


@pytest.mark.parametrize("rounding", ["up", "down"])
def test_reductions_with_subnormal_and_huge_float32_terms(rounding):
    """dot, sum and matmul take operands that fit float32: their products (2**-298 ..
    2**256) and steps stay inside float64's exact range.  Pinned against Fractions."""
    t, big = np.float32(2.0 ** -149), np.float32(3e38)
    x = np.array([1.0, t, -t, t, big, -big, 1.0], np.float32)
    y = np.array([1.0, t, t, t, big, big, t], np.float32)
    acc = "fp(11,50)"
    want = _sequential([Fraction(float(u)) * Fraction(float(v)) for u, v in zip(x, y)], acc,
                       rounding)
    kw = dict(acc_fmt=acc, acc_rounding=rounding, out_rounding=rounding, order="sequential")
    assert Fraction(float(ops.dot(x, y, **kw))) == want
    assert Fraction(float(ops.matmul(x[None, :], y[:, None], **kw)[0, 0])) == want
    assert Fraction(float(ops.matmul(np.stack([x, x]), np.stack([y, y], 1), **kw)[1, 1])) \
        == want
    assert Fraction(float(ops.sum(x, **kw))) == _sequential([Fraction(float(u)) for u in x],
                                                            acc, rounding)


def test_matmul_with_a_block_in_fmt_on_float64_operands():
    """The issue's repro: float64 operands with in_fmt='mxfp4' and a bf16 accumulator were
    refused as 'in_fmt=fp64'.  Block values that float32 holds are simulated as they are
    (the float32 operands' results, in float64), every call alike (a second call ran a
    cached product without the block rounding); values beyond float32 are refused naming
    the block format."""
    import lpsim
    rng = np.random.default_rng(35)
    a = rng.standard_normal((4, 64)).astype(np.float32)
    b = rng.standard_normal((64, 3)).astype(np.float32)
    qa = lpsim.blocks.quantize(a, "mxfp4", axis=-1)
    qb = lpsim.blocks.quantize(b, "mxfp4", axis=0)
    want = ops.matmul(qa, qb, acc_fmt="bf16")
    for x, y in ((a, b), (a, b), (a.astype(np.float64), b.astype(np.float64)),
                 (a.astype(np.float64), b.astype(np.float64))):
        got = ops.matmul(x, y, in_fmt="mxfp4", acc_fmt="bf16")
        assert got.dtype == x.dtype and np.array_equal(got, want)
    huge = a.astype(np.float64)
    huge[0, :2] = 3e39                          # block values beyond float32
    with pytest.raises(ValueError, match=r"in_fmt='mxfp4' gives block values .* that float32 "
                                         r"cannot hold.*acc_fmt=bf16"):
        ops.matmul(huge, b.astype(np.float64), in_fmt="mxfp4", acc_fmt="bf16")
    assert np.isfinite(ops.matmul(huge, b.astype(np.float64), in_fmt="mxfp4")).all()


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp(11,50)", "fp64"])
@pytest.mark.parametrize("x, y, z", [(2.0 ** 600, 2.0 ** 600, -math.inf),
                                     (2.0 ** 600, -2.0 ** 600, math.inf),
                                     (-2.0 ** 700, 2.0 ** 700, -math.inf)])
def test_fma_of_a_product_beyond_float64_and_an_infinite_addend_is_the_addend(fmt, x, y, z):
    """x*y is finite (2**1200), so x*y + z is z's infinity; the float64 product overflowed to
    inf and inf - inf gave NaN for every format narrower than float64 (arrays too)."""
    assert ops.fma(x, y, z, fmt) == z
    got = ops.fma(np.array([x, 1.5]), np.array([y, 2.0]), np.array([z, 0.25]), fmt)
    assert got[0] == z and got[1] == 3.25


def test_tensor_core_chunk_sums_are_exact_at_the_widest_alignment_accepted():
    """A chunk's chunk + 1 aligned terms are summed in float64: with align_bits 49 or 50 and
    chunks of 32 the sum needed more than 53 bits and rounded to nearest before its
    rounding toward zero (17 - 2**-49 came out 17).  The widest accepted alignment is exact;
    one more bit is refused by name."""
    from lpsim.ops.hardware import TensorCoreModel, reference_matmul
    for chunk in (16, 31, 32):
        top = 53 - chunk.bit_length()
        model = TensorCoreModel(in_fmt="fp32", chunk=chunk, align_bits=top)
        a = np.array([[-2.0 ** -(top - 1)] + [1.0] * 17], np.float32)
        b = np.ones((18, 1), np.float32)
        got, want = ops.matmul(a, b, model=model), reference_matmul(a, b, model)
        assert np.array_equal(np.float64(got), want) and got[0, 0] < 17, (chunk, got, want)
        with pytest.raises(ValueError, match=f"align_bits={top + 1} is not accepted with "
                                             f"chunk={chunk}; accepted: 1..{top}"):
            TensorCoreModel(in_fmt="fp32", chunk=chunk, align_bits=top + 1)


@pytest.mark.parametrize("rounding, sign", [("down", -1.0), ("nearest", 1.0), ("up", 1.0)])
def test_an_exact_zero_fma_on_the_rational_path_takes_ieees_sign(rounding, sign):
    # a*b = 2**-1027 is below float64's safe range (the rational path): the exact zero sum
    # is -0 under rounding down and +0 otherwise, as on the float64 path (IEEE 754 6.3)
    a, b = 2.0 ** -5, 2.0 ** -1022
    for fmt in ("fp32", "bf16"):
        got = float(ops.fma(a, b, -(a * b), fmt, rounding))
        assert got == 0 and math.copysign(1.0, got) == sign, (fmt, rounding, got)
        safe = float(ops.fma(a, 2.0 ** -900, -(a * 2.0 ** -900), fmt, rounding))
        assert math.copysign(1.0, safe) == sign
