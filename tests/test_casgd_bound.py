"""Theorem 5.7: measured local error of one outer iteration vs local_error_bound."""

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lpsim.casgd import RECIPES, casgd_step, local_error_bound, local_error_bounds, normalize_rows
from lpsim.casgd.recipes import FP32, Rounder


def problem(seed, sb, n, loss, x_scale):
    rng = np.random.default_rng(seed)
    Y = normalize_rows(rng.standard_normal((sb, n)))
    x = rng.uniform(-1, 1, n) * x_scale / np.sqrt(n)
    if loss == "logistic":
        y = np.where(rng.random(sb) < 0.5, -1.0, 1.0)
    else:
        y = rng.standard_normal(sb).astype(np.float32).astype(np.float64)
    return Y, x, y


def _by_weight_format():
    """Recipe keys grouped by u_x: recipes sharing u_x start from the same rounded x."""
    groups = {}
    for key in "ABCDEFGHI":
        groups.setdefault(RECIPES[key].u_x, []).append(key)
    return groups


# 30 examples up to (b, s, n) = (16, 8, 256) with P <= 4, plus the paper's (b, s) = (32, 16)
# at P = 16 (6 s of the ~15 s on 2 cores).  Every recipe whose bound is valid (Omega <= 1/2)
# must stay below Theorem 5.7's total (remainder with C_loc = 1); the examples are fixed
# (derandomized profile), so a failure is reproducible, not a chance event.
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2 ** 32 - 1), b=st.sampled_from([1, 2, 4, 8, 16]),
       s=st.integers(1, 8), n=st.integers(4, 256), P=st.sampled_from([1, 2, 4]),
       eta=st.floats(0.05, 2.0), loss=st.sampled_from(["logistic", "linear"]),
       x_scale=st.floats(0.0, 2.0))
@example(seed=7, b=32, s=16, n=64, P=16, eta=0.5, loss="logistic", x_scale=1.0)
def test_measured_local_error_below_bound(seed, b, s, n, P, eta, loss, x_scale):
    Y, x, y = problem(seed, s * b, n, loss, x_scale)
    checked = []
    for u_x, keys in _by_weight_format().items():
        x0 = np.asarray(Rounder().slot(x, u_x), np.float64)   # the same x in both recurrences
        exact = casgd_step(Y, y, x0, eta, b, s, "fp64", loss=loss, P=P)
        for key, bound in zip(keys, local_error_bounds(Y, x0, y, eta, b, s, P, keys, loss=loss)):
            if not bound.valid:       # outside Theorem 5.7's hypotheses: no claim
                continue
            got = casgd_step(Y, y, x0, eta, b, s, key, loss=loss, P=P)
            err = np.linalg.norm(np.asarray(got, np.float64) - exact)
            assert err <= bound.total, (key, err, bound.terms)
            checked.append(key)
    assert "A" in checked


def test_bounds_of_several_recipes_match_one_at_a_time():
    Y, x, y = problem(5, 4 * 8, 40, "linear", 1.0)
    together = local_error_bounds(Y, x, y, 0.3, 4, 8, 2, "AGHI", loss="linear")
    for key, bound in zip("AGHI", together):
        alone = local_error_bound(Y, x, y, 0.3, 4, 8, 2, key, loss="linear")
        assert bound.terms == alone.terms and bound.total == alone.total


@pytest.fixture(scope="module")
def block():
    return problem(7, 32 * 4, 256, "logistic", 1.0)


def test_dominant_term_moves(block):
    Y, x, y = block
    args = (Y, x, y, 0.5, 32, 4)
    c16 = local_error_bound(*args, 16, "C")
    # Sec. 5.3: at P = 16 the BF16 margin AllReduce C(P) u_AR_r dominates Omega_C (~1.5e-1)
    assert c16.omega == pytest.approx(2.4 * 16 * 2.0 ** -8, rel=1e-12)
    assert 0.14 < c16.omega < 0.16 and c16.valid
    promoted = local_error_bound(*args, 16, RECIPES["C"].replace(u_AR_r="f"))
    assert promoted.omega < c16.omega / 10
    # all-FP32: the length-sb gradient GEMV leads; BF16 storage of A (Recipe B) takes over
    assert local_error_bound(*args, 16, "A").dominant == "u_g"
    assert local_error_bound(*args, 16, "B").dominant == "u_A"
    ratio = c16.terms["u_AR_r"] / promoted.terms["u_AR_r"]
    assert ratio == pytest.approx(2.0 ** 16, rel=1e-12)     # u_bf16 / u_fp32
    # Recipe D differs from C only in the Gram AllReduce: only E_u_AR_G changes, by 2^16
    d16 = local_error_bound(*args, 16, "D")
    for key in c16.terms:
        want = c16.terms[key] * (2.0 ** 16 if key == "u_AR_G" else 1)
        assert d16.terms[key] == pytest.approx(want, rel=1e-12), key
    # all-FP32 Recipe A is 2^16 smaller in every storage slot than C's BF16 ones
    a16 = local_error_bound(*args, 16, "A")
    assert a16.terms["u_A"] * 2 ** 16 == pytest.approx(c16.terms["u_A"], rel=1e-12)
    assert a16.total < c16.total / 100
    # Sec. 5.2: the correction sum needs (s-1) b u_c < 1, which BF16 breaks at long s
    long_s = problem(3, 32 * 16, 64, "logistic", 1.0)
    bad = local_error_bound(*long_s, 0.5, 32, 16, 1, RECIPES["C"].replace(u_c="b"))
    assert not bad.valid and bad.omega == np.inf
    assert local_error_bound(*long_s, 0.5, 32, 16, 1, "C").valid


def test_bound_input_errors(block):
    Y, x, y = block
    with pytest.raises(ValueError, match="s\\*b = 96"):
        local_error_bound(Y, x, y, 0.5, 32, 3, 1, "C")
    with pytest.raises(ValueError, match="eta=0"):
        local_error_bound(Y, x, y, 0, 32, 4, 1, "C")
    assert FP32.unit_roundoff == 2.0 ** -24


@pytest.mark.parametrize("rounding,frac,seeds", [("nearest", 0.3, [0]), ("up", 0.3, [0]),
                                                 ("toward_zero", 0.7, [0]),
                                                 ("stochastic", 0.7, range(20))])
def test_bound_charges_each_slot_its_modes_unit_roundoff(rounding, frac, seeds):
    # one row, b = s = 1, exact x^(s) = 1 + frac ulp of bf16: directed and stochastic u_x err
    # by up to one ulp (2u), which the bound must cover
    from scipy.special import expit
    from lpsim.casgd import Slot
    Y, x0, y = np.array([[1.0]]), np.array([1.0]), np.array([1.0])
    eta = frac * 2.0 ** -7 / expit(-1.0)
    rec = RECIPES["A"].replace(u_x=Slot("bf16", rounding=rounding))
    exact = casgd_step(Y, y, x0, eta, 1, 1, "fp64")
    bd = local_error_bound(Y, x0, y, eta, 1, 1, 1, rec)
    assert bd.valid
    for seed in seeds:
        got = np.asarray(casgd_step(Y, y, x0, eta, 1, 1, rec, seed=seed), np.float64)
        assert np.linalg.norm(got - exact) <= bd.total


def test_bound_holds_for_a_directed_fp32_u_x():
    from lpsim.casgd import Slot
    Y, x0, y = np.full((1, 16), 0.25), np.ones(16), np.array([1.0])
    rec = RECIPES["A"].replace(u_x=Slot("fp32", rounding="up"))
    exact = casgd_step(Y, y, x0, 1e-6, 1, 1, "fp64")
    err = np.linalg.norm(np.asarray(casgd_step(Y, y, x0, 1e-6, 1, 1, rec), np.float64) - exact)
    bd = local_error_bound(Y, x0, y, 1e-6, 1, 1, 1, rec)
    assert bd.valid and 0 < err <= bd.total


def test_poisson_bound_overflow_is_not_valid():
    # margins near 360: the bound's estimate exp(|Y||x| + R) overflows; the step is finite
    Y, x, y = np.array([[1.0], [1.0]]), np.array([360.0]), np.array([0.0, 0.0])
    assert np.isfinite(casgd_step(Y, y, x, 1e-160, 1, 2, "fp64", loss="poisson")).all()
    bd = local_error_bound(Y, x, y, 1e-160, 1, 2, 1, "A", loss="poisson")
    assert not bd.valid and bd.total == np.inf
    assert all(v == np.inf or v == 0 for v in bd.terms.values())
