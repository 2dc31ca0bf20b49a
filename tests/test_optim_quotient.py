"""lpsim.optim.step.verified_quotient: the GPU step's division of a moment by its root.

It takes any approximation y of 1 / d (a GPU's ``rcp.approx``) and answers ok = 1 only where
it has proved its quotient the IEEE float32 one.  The CPU runs the same source (its FMA
exact, lpsim.ops.mma.fma32): every quotient it accepts is checked bit for bit against
numpy's float32 division, with y correctly rounded, y off by a few ulps (worse than
``rcp.approx``'s one), and y wrong by far (the proof must then decline, never accept a
wrong quotient); how often it declines with a good y (a cost, not a correctness question)
is bounded too, as are the inputs it must decline.
"""

import numpy as np
from numba import njit

from lpsim.optim.step import is_nearest_quotient, verified_quotient


@njit(cache=True)
def _check(a, d, y):
    """(accepted quotients whose bits differ from a / d, accepted quotients)."""
    bad = taken = 0
    for i in range(a.size):
        q, ok = verified_quotient(a[i], d[i], y[i])
        if ok:
            taken += 1
            want = np.float32(a[i] / d[i])
            bad += np.int64(np.float32(q).view(np.int32) != want.view(np.int32))
    return bad, taken


def _operands(n, seed):
    """Dividends log-uniform over what the step gives (|a| from 2**-96, both signs) and
    divisors sqrt(v) + eps over a wide range, as float32, plus dividends and divisors at
    and next to powers of two (quotients at the edges of binades); those whose quotient lies
    where the proof works (2**-99 .. 2**119; outside it the step declines anyway)."""
    rng = np.random.default_rng(seed)
    a = (rng.choice([-1, 1], n) * 2.0 ** rng.uniform(-96, 100, n)).astype(np.float32)
    d = (2.0 ** rng.uniform(-60, 60, n)).astype(np.float32)
    edge = np.float32(2.0) ** rng.integers(-90, 90, n // 4).astype(np.float32)
    a[: n // 4] = edge * (1 + rng.integers(-2, 3, n // 4) * np.float32(2.0 ** -23))
    d[n // 8: n // 4] = np.float32(2.0) ** rng.integers(-40, 40, n // 8).astype(np.float32)
    q = np.abs(a.astype(np.float64) / d)
    keep = (q >= 2.0 ** -99) & (q <= 2.0 ** 119) & (np.abs(a) >= 2.0 ** -96)
    return a[keep], d[keep]


def _ulps_off(y, k):
    """y moved by k ulps (k an integer array), as float32."""
    return (y.view(np.int32) + k.astype(np.int32)).view(np.float32)


def test_a_correctly_rounded_reciprocal_gives_ieee_quotients_and_rare_declines():
    a, d = _operands(400_000, 20261129)
    bad, taken = _check(a, d, np.float32(1) / d)
    assert bad == 0
    # declines: quotients one correction leaves more than h from a / d (near ties); a few
    # in a million are expected, a thousand in a million would be a slow step
    assert a.size - taken <= a.size // 1000, a.size - taken


def test_an_approximate_reciprocal_never_gives_a_wrong_quotient():
    a, d = _operands(400_000, 20261130)
    rng = np.random.default_rng(7)
    y = np.float32(1) / d
    for spread in (1, 4, 64):                 # rcp.approx is within 1 ulp
        bad, taken = _check(a, d, _ulps_off(y, rng.integers(-spread, spread + 1, a.size)))
        assert bad == 0, spread
        if spread == 1:
            assert a.size - taken <= a.size // 1000, a.size - taken


def test_a_wrong_reciprocal_is_caught():
    # y far from 1 / d: the correction cannot reach the quotient, and the proof must decline
    # (any accepted quotient must still be the IEEE one)
    a, d = _operands(200_000, 20261131)
    rng = np.random.default_rng(8)
    for y in ((np.float32(1) / d) * np.float32(1.001),
              rng.uniform(0.5, 2, a.size).astype(np.float32)):
        bad, taken = _check(a, d, y.astype(np.float32))
        assert bad == 0
        assert taken < a.size // 2


def test_edges_decline():
    one = np.float32(1)
    cases = [(one, np.float32(0)), (one, np.float32(-2)), (one, np.float32(np.nan)),
             (np.float32(np.nan), one), (np.float32(np.inf), one), (one, np.float32(np.inf)),
             # quotients below 2**-100: zero, subnormal, tiny
             (np.float32(2.0 ** -90), np.float32(2.0 ** 20)),
             (np.float32(2.0 ** -96), np.float32(2.0 ** 60)),
             (np.float32(2.0 ** -96), np.float32(2.0 ** 10))]
    for a, d in cases:
        y = one / d if d != 0 else np.float32(np.inf)
        q, ok = verified_quotient(a, d, np.float32(y))
        assert not ok, (a, d, q)
    # and an ordinary one is taken
    q, ok = verified_quotient(np.float32(3), np.float32(7), one / np.float32(7))
    assert ok and q == np.float32(3) / np.float32(7)


@njit(cache=True)
def _candidates(a, d, moves):
    """(candidates accepted that are not a / d, candidates a / d accepted, candidates a / d):
    each a / d moved by each of ``moves`` codes, tried as q."""
    wrong = right = exact = 0
    for i in range(a.size):
        want = np.float32(a[i] / d[i])
        for k in moves:
            q = np.int32(want.view(np.int32) + k).view(np.float32)
            ok = is_nearest_quotient(a[i], d[i], q)
            if k == 0:
                exact += 1
                right += np.int64(ok)
            else:
                wrong += np.int64(ok)
    return wrong, right, exact


def test_the_proof_accepts_the_nearest_quotient_alone():
    # every candidate near a / d is tried: only the IEEE quotient may pass
    a, d = _operands(100_000, 20261132)
    moves = np.array([-3, -2, -1, 0, 1, 2, 3])
    wrong, right, exact = _candidates(a, d, moves)
    assert wrong == 0 and right >= exact - exact // 1000, (wrong, right, exact)

