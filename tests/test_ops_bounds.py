"""Error bounds: Higham's gamma_n for nearest accumulation; concentration for stochastic.

The stochastic checks sum n equal positive terms x after an exact first term (x_0 = s_0):
acc_t = SR(acc_{t-1} + x), t = 1..n-1.  The errors d_t = acc_t - (acc_{t-1} + x) are
martingale increments: SR picks lo <= v = acc_{t-1} + x <= hi, |d_t| < c_t = hi - lo (the
quantum at v), and Var(d_t | past) = f (c_t - f) <= min(c_t**2 / 4, x c_t) with
f = v - lo <= x (acc_{t-1} is a grid point below v).  Stop at tau, the first t with
|acc_t - s_t| >= lam (s_t the exact partial sum): before it v < s_t + lam, so c_t <=
ulp(s_t + lam) =: C_t, a deterministic bound.  Freedman's inequality (Ann. Probab. 3, 1975,
Thm 1.6, in Bernstein form) for the stopped martingale, whose increments are below
R = max C_t and whose predictable variance is below V = sum min(C_t**2 / 4, x C_t), gives
P(|acc_{n-1} - s_{n-1}| >= lam) <= 2 exp(-lam**2 / (2 (V + R lam / 3))).
:func:`sr_radius` returns a lam with that tail <= 1e-6, so each stochastic check has
false-alarm rate (over seeds) below 1e-6, the four together below 4e-6.  The variance term
matters: Azuma-Hoeffding (c_t**2 / 4 alone) gives lam ~ 5.3 for the stagnation test, more
than nearest's error there.
"""

import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

import lpsim
import lpsim.ops as ops

#: false-alarm rate of each stochastic check
ALARM = 1e-6


def sr_radius(first, x, n, m, p=ALARM):
    """A lam with P(|SR sum - exact| >= lam) <= p for first + (n-1) x (module docs)."""
    s = first + x * np.arange(1, n)                  # exact partial sums s_1 .. s_{n-1}
    lam = 2.0 ** -20 * s[-1]
    while True:
        _, e = np.frexp(s + lam)                      # s + lam in [2**(e-1), 2**e)
        c = np.ldexp(1.0, e - 1 - m)                  # C_t (float rounding only raises it)
        var = np.minimum(c * c / 4, x * c).sum()
        tail = 2 * math.exp(-lam * lam / (2 * (var + c.max() * lam / 3)))
        if tail <= p:
            return lam
        lam *= 1.01


@given(acc=st.sampled_from(["bf16", "fp16", "tf32", "fp32", "fp(5,6,0)"]),
       in_fmt=st.sampled_from(["bf16", "fp16", "e4m3"]),
       n=st.integers(1, 60), fused=st.booleans(),
       order=st.sampled_from(["sequential", "pairwise", ("blocked", 4)]),
       seed=st.integers(0, 2 ** 32 - 1))
def test_higham_bound_for_nearest_accumulation(acc, in_fmt, n, fused, order, seed):
    u = lpsim.parse_format(acc).unit_roundoff
    if n * u >= 1:
        return
    rng = np.random.default_rng(seed)
    # magnitudes in [1/4, 4]: no overflow, and no rounding below min_normal
    x = rng.choice([-1, 1], n) * rng.uniform(0.25, 4, n) * (rng.random(n) > 0.1)
    y = rng.choice([-1, 1], n) * rng.uniform(0.25, 4, n)
    x, y = lpsim.quantize(x, in_fmt), lpsim.quantize(y, in_fmt)
    got = ops.dot(x, y, in_fmt=in_fmt, acc_fmt=acc, fused=fused, order=order)
    exact = sum(float(a) * float(b) for a, b in zip(x, y))   # exact: few terms, 2**-18 grid
    assert abs(got - exact) <= ops.gamma(n, u) * float(np.abs(x) @ np.abs(y))


def _sr_sum(n, seed, stream):
    x = np.full(n, lpsim.quantize(1 / 3, "fp16"), np.float32)
    return ops.sum(x, acc_fmt="fp16", acc_rounding="stochastic", order="sequential",
                   seed=seed, stream=stream), float(x[0]) * n


@pytest.mark.parametrize("n", [2 ** 10, 2 ** 13, 2 ** 15])
def test_stochastic_accumulation_error_grows_like_sqrt_n(n):
    got, exact = _sr_sum(n, seed=2024, stream=n)
    x = float(lpsim.quantize(1 / 3, "fp16"))
    bound = sr_radius(x, x, n, m=10)
    assert bound < 3 * math.sqrt(n) * 2.0 ** -11 * exact        # ~ sqrt(n) u s
    assert abs(got - exact) <= bound
    # nearest stagnates once half a quantum exceeds 1/3 (at 1024): error ~ n u, not sqrt(n) u
    nearest = ops.sum(np.full(n, 1 / 3, np.float32), in_fmt="fp16", acc_fmt="fp16",
                      order="sequential")
    if n >= 2 ** 13:
        assert nearest == 1024.0
        assert abs(nearest - exact) > bound


def test_nearest_stagnates_on_one_plus_many_tiny_terms():
    x = np.concatenate([[1.0], np.full(4000, 2.0 ** -10)]).astype(np.float32)
    exact = 1.0 + 4000 * 2.0 ** -10
    assert ops.sum(x, acc_fmt="bf16", order="sequential") == 1.0      # every add is lost
    assert ops.sum(x, acc_fmt="fp32", order="sequential") == exact
    assert ops.sum(x, acc_fmt="bf16", order="pairwise") == exact
    # SR does not stagnate: within lam of exact (false alarm < 1e-6), nearest is not
    lam = sr_radius(1.0, 2.0 ** -10, 4001, m=7)
    assert lam < exact - 1.0
    sr = ops.sum(x, acc_fmt="bf16", acc_rounding="stochastic", order="sequential", seed=1)
    assert abs(sr - exact) < lam


def test_gamma_and_input_cast_factor():
    assert ops.gamma(10, 2.0 ** -8) == (10 * 2.0 ** -8) / (1 - 10 * 2.0 ** -8)
    assert ops.gamma(0, 0.5) == 0
    assert ops.input_cast_factor(100, 2.0 ** -8, 2.0 ** -24) == \
        2 * 2.0 ** -8 + ops.gamma(100, 2.0 ** -24)
    assert ops.gamma(np.int64(10), np.float32(2.0 ** -8)) == ops.gamma(10, 2.0 ** -8)
    with pytest.raises(ValueError, match="n\\*u"):
        ops.gamma(256, 2.0 ** -8)
