"""lpsim.optim.step.divide_by: the wide CUDA step's division by AdamW's bias corrections.

a / c by the host's reciprocal y = fl32(1/c), one product and two FMAs (the CPU's FMA here is
lpsim.ops.mma.fma32, exact; a GPU's is libdevice's fmaf): bit for bit the IEEE float32
quotient wherever ``ok`` is 1, checked exactly against numpy's float32 division: every
significand of several binades against three divisors, random dividends against every
bias correction of AdamW's usual betas, the binades at the edges of the range it accepts,
and the inputs it must decline.
"""

import numpy as np
import pytest
from numba import njit

from lpsim.optim.step import divide_by


@njit(cache=True)
def _mismatches(a, c, y):
    """(elements where ok is 1 and the bits differ from a / c, elements where ok is 1)."""
    bad = taken = 0
    for i in range(a.size):
        q, ok = divide_by(a[i], c, y)
        if ok:
            taken += 1
            want = np.float32(a[i] / c)
            bad += np.int64(np.float32(q).view(np.int32) != want.view(np.int32))
    return bad, taken


def _divisor(beta, step):
    """AdamW's bias correction 1 - beta**step as lpsim.optim hands it to the kernel."""
    c = np.float32(1 - beta ** step)
    return c, np.float32(1) / c


DIVISORS = [_divisor(b, t) for b in (0.9, 0.95, 0.99, 0.999, 0.9999)
            for t in (1, 2, 3, 7, 10, 100, 1000, 10 ** 4, 10 ** 5)]


def _binade(exponent):
    """Every float32 of the binade [2**exponent, 2**(exponent + 1)), both signs."""
    bits = ((exponent + 127) << 23) | np.arange(1 << 23, dtype=np.int32)
    a = bits.view(np.float32)
    return np.concatenate([a, -a])


@pytest.mark.parametrize("exponent", [-96, -3, 0, 96])
def test_every_significand_of_a_binade(exponent):
    a = _binade(exponent)
    for c, y in (DIVISORS[0], DIVISORS[13], DIVISORS[-1]):     # 0.1, 0.001-ish, 1e-4-ish
        bad, taken = _mismatches(a, c, y)
        assert bad == 0 and taken == a.size, (c, bad, taken)


def test_random_dividends_against_every_bias_correction():
    rng = np.random.default_rng(20261128)
    # log-uniform over the accepted range, both signs, plus random bit patterns
    a = (rng.choice([-1, 1], 200_000) * 2.0 ** rng.uniform(-96, 96, 200_000)).astype(np.float32)
    a = np.concatenate([a, rng.integers(0, 2 ** 32, 50_000, dtype=np.uint32).view(np.float32)])
    for c, y in DIVISORS:
        bad, _ = _mismatches(a, c, y)
        assert bad == 0, c
    # random divisors in (2**-30, 1] with their correctly rounded reciprocals
    for c in (2.0 ** rng.uniform(-30, 0, 40)).astype(np.float32):
        bad, _ = _mismatches(a, c, np.float32(1) / c)
        assert bad == 0, c


def test_zeros_keep_their_sign_and_the_edges_decline():
    c, y = DIVISORS[3]
    for zero in (np.float32(0.0), np.float32(-0.0)):
        q, ok = divide_by(zero, c, y)
        assert ok and np.float32(q).view(np.int32) == zero.view(np.int32)
    declined = [np.float32(np.nan), np.float32(np.inf), np.float32(-np.inf),
                np.float32(2.0 ** -97), np.float32(-(2.0 ** -126)),
                np.float32(2.0 ** -149), np.float32(3e38)]
    for a in declined:
        assert not divide_by(a, c, y)[1], a
    # the largest accepted quotient and the first one beyond it
    assert divide_by(np.float32(2.0 ** 120) * c, c, y)[1]
    assert not divide_by(np.float32(2.0 ** 121) * c, c, y)[1]


@njit(cache=True)
def _both(a, c, y):
    """(elements where divide_by with zeros=False differs from zeros=True where it takes
    them, elements it takes that zeros=True does not, zeros it takes)."""
    differ = extra = zeros = 0
    for i in range(a.size):
        q, ok = divide_by(a[i], c, y)
        q2, ok2 = divide_by(a[i], c, y, False)
        if ok2:
            extra += np.int64(not ok)
            zeros += np.int64(a[i] == 0)
            differ += np.int64(np.float32(q).view(np.int32) != np.float32(q2).view(np.int32))
    return differ, extra, zeros


def test_without_zeros_the_same_quotients_and_zeros_declined():
    rng = np.random.default_rng(20261129)
    a = (rng.choice([-1, 1], 100_000) * 2.0 ** rng.uniform(-101, 122, 100_000)).astype(np.float32)
    a = np.concatenate([a, np.float32([0.0, -0.0, np.nan, np.inf, -np.inf, 2.0 ** -149])])
    for c, y in (DIVISORS[0], DIVISORS[13], DIVISORS[-1]):
        assert _both(a, c, y) == (0, 0, 0), c
        for zero in (np.float32(0.0), np.float32(-0.0)):
            assert not divide_by(zero, c, y, False)[1]
