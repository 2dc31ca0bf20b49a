"""lpsim.fixed(wl, fl): exact against the Fraction grid, saturation, SR unbiased, counters."""

from fractions import Fraction

import numpy as np
import pytest

import lpsim


def _nearest_even_grid(x, fmt):
    """Exact RNE to multiples of 2**-fl, then saturation (Fractions)."""
    q = Fraction(1, 2 ** fmt.fl) if fmt.fl >= 0 else Fraction(2 ** -fmt.fl)
    v = Fraction(float(x)) / q
    k = int(v // 1)
    frac = v - k
    if frac > Fraction(1, 2) or (frac == Fraction(1, 2) and k % 2):
        k += 1
    lo = -(2 ** (fmt.wl - 1)) + (1 if fmt.symmetric else 0)
    k = min(max(k, lo), 2 ** (fmt.wl - 1) - 1)
    return float(k * q)


@pytest.mark.parametrize("wl, fl, sym", [(8, 4, False), (4, 0, False), (12, 10, True),
                                         (24, 20, False), (6, -2, False), (1, 3, False)])
def test_nearest_is_exact_on_the_grid(wl, fl, sym):
    fmt = lpsim.fixed(wl, fl, symmetric=sym)
    rng = np.random.default_rng(wl * 100 + fl)
    span = 2.0 ** (wl - 1 - fl)
    grid = (np.arange(-(2 ** min(wl, 10)), 2 ** min(wl, 10)) * 0.5 * fmt.quantum)  # midpoints
    x = np.concatenate([rng.uniform(-1.5 * span, 1.5 * span, 3000), grid, [0.0, -0.0]])
    x = x.astype(np.float32)
    got = lpsim.quantize(x, fmt)
    want = np.array([_nearest_even_grid(v, fmt) for v in x], np.float32)
    assert np.array_equal(got, want)


def test_specials_counters_and_scalars():
    fmt = lpsim.fixed(8, 4)
    assert (fmt.max_finite, fmt.min_finite, fmt.bits) == (127 / 16, -8.0, 8)
    stats = lpsim.RoundingStats()
    x = np.array([np.inf, -np.inf, np.nan, 100.0, 1e-3, 0.0, 0.5, 0.53], np.float64)
    y = lpsim.quantize(x, fmt, stats=stats)
    assert np.array_equal(y[:2], [127 / 16, -8.0]) and np.isnan(y[2])
    assert np.array_equal(y[3:], [127 / 16, 0.0, 0.0, 0.5, 0.5])
    assert stats.as_dict() == dict(elements=8, inexact=5, overflow=1, underflow=1,
                                   subnormal=0, nan=1, inf=2)
    assert lpsim.quantize(0.53, fmt) == 0.5 and lpsim.quantize(-50, fmt) == -8.0
    out = np.empty(3, np.float32)
    assert lpsim.quantize(np.array([1.03, 9, -9], np.float32), fmt, out=out) is out
    assert np.array_equal(out, [1.0, 127 / 16, -8.0])


def test_stochastic_is_unbiased_and_stays_on_the_two_neighbours():
    # x = 0.3 (grid 1/16: neighbours 0.25, 0.3125, P(up) = 0.8).  Mean of n = 20000 draws has
    # standard error sqrt(0.8*0.2/n)/16; |mean - 0.3| <= 5 se: false alarm < 6e-7.
    fmt = lpsim.fixed(8, 4)
    x = np.full(20000, 0.3)
    y = lpsim.quantize(x, fmt, "stochastic", generator=lpsim.Generator(8))
    assert set(np.unique(y)) <= {0.25, 0.3125}
    se = np.sqrt(0.8 * 0.2 / x.size) / 16
    assert abs(y.mean() - 0.3) <= 5 * se


def test_errors():
    with pytest.raises(ValueError, match="wl=0"):
        lpsim.fixed(0, 3)
    with pytest.raises(TypeError, match="fl=1.5"):
        lpsim.fixed(8, 1.5)
    with pytest.raises(ValueError, match=r"fixed\(30,4\) does not fit"):
        lpsim.quantize(np.ones(3, np.float32), lpsim.fixed(30, 4))
    assert lpsim.quantize(np.array([1.1]), lpsim.fixed(30, 4))[0] == 1.125


def test_torch_tensors():
    torch = pytest.importorskip("torch")
    fmt = lpsim.fixed(6, 2)
    x = torch.tensor([0.3, 9.0, -20.0, 1.125], requires_grad=True)
    y = lpsim.quantize(x, fmt)
    assert torch.equal(y.detach(), torch.tensor([0.25, 7.75, -8.0, 1.0]))
    y.sum().backward()
    assert torch.equal(x.grad, torch.tensor([1.0, 0.0, 0.0, 1.0]))   # clamp's gradient
    w = torch.tensor([0.3, 9.0])
    v = w._version
    lpsim.quantize(w, fmt, out=w)
    assert torch.equal(w, torch.tensor([0.25, 7.75])) and w._version > v
