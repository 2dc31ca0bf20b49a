"""Stochastic rounding is unbiased (and few-bit SR's bias stays within 2**-k of a quantum).

Each check is a two-sided exact binomial test at level 1e-6, so with the fixed seeds below
a correct implementation fails a given check with probability 1e-6 over the choice of seed;
the mean test is a 6-standard-error z test (two-sided normal tail 2e-9, the CLT being
excellent at 2**20 bounded terms), so the whole file (about 20 checks) has a false-alarm
rate below 2.5e-5.
"""

import numpy as np
import pytest
from scipy.stats import binomtest

import lpsim

LEVEL = 1e-6


def ups(x, fmt, n, dtype, seed, **kw):
    """How many of n copies of x round up (away from the lower neighbour)."""
    lo = lpsim.quantize(dtype(x), fmt, "down")
    got = lpsim.quantize(np.full(n, x, dtype), fmt, "stochastic", seed=seed, **kw)
    hi = lpsim.quantize(dtype(x), fmt, "up")
    assert np.all((got == lo) | (got == hi))
    return int(np.count_nonzero(got == hi)), (x - lo) / (hi - lo)


@pytest.mark.parametrize("fmt, frac", [
    ("bf16", 0.5), ("bf16", 0.25), ("bf16", 3 / 128), ("e4m3fn", 0.625),
    ("fp(4,3,4)", 0.125), ("e5m2", 0.75), ("fp16", 1 / 1024),
])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_probability_of_rounding_up_is_the_fraction(fmt, frac, dtype):
    f = lpsim.parse_format(fmt)
    x = 1 + (2 + frac) * f.epsilon
    count, exact = ups(x, fmt, 1 << 17, dtype, seed=1000 + int(frac * 1024))
    assert exact == frac
    assert binomtest(count, 1 << 17, frac).pvalue > LEVEL


def test_tiny_probability_two_to_minus_twenty_in_float64():
    # x = 1 + 2**-20 quanta of bf16: rounds up with probability 2**-20 (16 expected in 2**24)
    x = 1 + 2.0 ** -27
    count, frac = ups(x, "bf16", 1 << 24, np.float64, seed=7)
    assert frac == 2.0 ** -20
    assert binomtest(count, 1 << 24, 2.0 ** -20).pvalue > LEVEL
    assert count > 0


def test_negative_values_and_subnormals_are_unbiased():
    f = lpsim.parse_format("fp16")
    x = -(f.min_subnormal * 2.75)   # between -3 and -2 subnormal quanta, 3/4 of the way to -3
    got = lpsim.quantize(np.full(1 << 16, x, np.float32), f, "stochastic", seed=3)
    count = int(np.count_nonzero(got == np.float32(-3 * f.min_subnormal)))
    assert binomtest(count, 1 << 16, 0.75).pvalue > LEVEL


def test_stochastic_equal_is_a_fair_coin():
    got = lpsim.quantize(np.full(1 << 17, 1 + 2.0 ** -9, np.float32), "bf16",
                         "stochastic_equal", seed=5)
    assert binomtest(int(np.count_nonzero(got > 1)), 1 << 17, 0.5).pvalue > LEVEL


@pytest.mark.parametrize("k", [2, 4, 8])
def test_few_bit_sr_truncates_the_fraction_to_k_bits(k):
    # frac = 0.7: k-bit SR rounds up with probability floor(0.7 * 2**k) / 2**k, a bias of
    # less than 2**-k quanta (here 0.7 - floor(...)/2**k)
    frac = np.float64(0.7)
    x = 1 + (4 + frac) * 2.0 ** -7
    count, exact = ups(x, "bf16", 1 << 17, np.float64, seed=40 + k, sr_bits=k)
    p = np.floor(exact * 2 ** k) / 2 ** k
    assert 0 <= exact - p < 2.0 ** -k
    assert binomtest(count, 1 << 17, p).pvalue > LEVEL


def test_mean_of_stochastic_rounding_tracks_x_over_many_values():
    # the sample mean error over 2**20 random values is within 6 standard errors of zero
    # (false alarm 2e-9 for an unbiased rounding)
    rng = np.random.default_rng(9)
    x = rng.uniform(0.01, 4, 1 << 20)
    err = lpsim.quantize(x, "e4m3", "stochastic", seed=11) - x
    assert abs(err.mean()) < 6 * err.std() / np.sqrt(err.size)
    truncation_err = lpsim.quantize(x, "e4m3", "toward_zero") - x   # the test can tell bias
    assert abs(truncation_err.mean()) > 50 * err.std() / np.sqrt(err.size)
