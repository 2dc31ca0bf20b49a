"""Error bounds: Higham's gamma_n for nearest accumulation; sqrt(n) growth for stochastic.

The stochastic test uses Azuma-Hoeffding: the SR errors of a sum of n equal positive terms
form a martingale whose step t lies in an interval of length c_t = the quantum at twice the
exact partial sum (while the computed sum stays below that), so
P(|fl(s) - s| >= (lam/2) sqrt(sum c_t**2)) <= 2 exp(-lam**2 / 2) = 1e-6 at lam = 5.39.
With c_t <= 4 u s_t that bound is about 1.15 lam sqrt(n) u s: it grows like sqrt(n) u s,
while nearest loses ~ n u s.  The three stochastic checks' false-alarm rate is below 3e-6.
"""

import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

import lpsim
import lpsim.ops as ops

LAM = math.sqrt(2 * math.log(2e6))


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
    quanta = [2.0 ** (math.floor(math.log2(2 * x * (t + 1))) - 10) for t in range(n)]
    bound = LAM / 2 * math.sqrt(sum(c * c for c in quanta))
    assert bound < 1.2 * LAM * math.sqrt(n) * 2.0 ** -11 * exact     # ~ sqrt(n) u s
    assert got < 2 * exact
    assert abs(got - exact) <= bound
    # nearest stagnates once half a quantum exceeds 1/3 (at 1024): error ~ n u, not sqrt(n) u
    nearest = ops.sum(np.full(n, 1 / 3, np.float32), in_fmt="fp16", acc_fmt="fp16",
                      order="sequential")
    if n >= 2 ** 13:
        assert nearest == 1024.0
        assert abs(nearest - exact) > bound


def test_nearest_stagnates_on_one_plus_many_tiny_terms():
    x = np.concatenate([[1.0], np.full(4000, 2.0 ** -10)]).astype(np.float32)
    assert ops.sum(x, acc_fmt="bf16", order="sequential") == 1.0      # every add is lost
    assert ops.sum(x, acc_fmt="fp32", order="sequential") == 1.0 + 4000 * 2.0 ** -10
    sr = ops.sum(x, acc_fmt="bf16", acc_rounding="stochastic", order="sequential", seed=1)
    assert abs(sr - (1 + 4000 * 2.0 ** -10)) < 0.5
    assert ops.sum(x, acc_fmt="bf16", order="pairwise") == 1.0 + 4000 * 2.0 ** -10


def test_gamma_and_input_cast_factor():
    assert ops.gamma(10, 2.0 ** -8) == (10 * 2.0 ** -8) / (1 - 10 * 2.0 ** -8)
    assert ops.gamma(0, 0.5) == 0
    assert ops.input_cast_factor(100, 2.0 ** -8, 2.0 ** -24) == \
        2 * 2.0 ** -8 + ops.gamma(100, 2.0 ** -24)
    with pytest.raises(ValueError, match="n\\*u"):
        ops.gamma(256, 2.0 ** -8)
    with pytest.raises(ValueError, match="n=-1"):
        ops.gamma(-1, 0.1)
    with pytest.raises(ValueError, match="u_low"):
        ops.input_cast_factor(3, -0.1, 0.1)
