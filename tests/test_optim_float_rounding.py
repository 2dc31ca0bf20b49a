"""lpsim.optim.step.by_float64 and sr_by_float32: the GPU step's roundings in floating-point
arithmetic (its update to nearest and stochastic from float64, its moments stochastic from
float32).

They must make lpsim.rounding.round_fast's decisions (value, ok and the inexact flag) for
every input and every 32-bit random word: checked bit for bit on weights minus updates
of many magnitudes, on rests that sit exactly at a random word's threshold (R equal to the
top 32 discarded bits, with and without bits below them) or at a tie, on R = 0 and R =
2**32 - 1, and on values whose rounding up carries into the next binade; compiled and as
plain Python (the CUDA simulator runs the source).
"""

import numpy as np
import pytest
from numba import njit

from lpsim.formats import parse_format
from lpsim.optim.step import bits_f64, by_float64, float64_applies, sr_by_float32
from lpsim.rounding import NEAREST, STOCHASTIC, kernel_params, round_fast


@njit(cache=True)
def _differences(x, mode, r, p):
    """(elements where by_float64 and round_fast differ, elements round_fast takes)."""
    bad = taken = 0
    for i in range(x.size):
        b1, ok1, in1 = round_fast(bits_f64(x[i]), mode, r[i], 32, p)
        v2, ok2, in2 = by_float64(x[i], mode, r[i], p)
        taken += ok1
        if ok1 != ok2 or (ok1 and (b1 != bits_f64(v2) or in1 != in2)):
            bad += 1
    return bad, taken


def _cases(p, n, seed):
    """(x, r): weights minus updates, the threshold cases and carries described above."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(n).astype(np.float32).astype(np.float64)
    u = (rng.standard_normal(n) * 10.0 ** rng.integers(-12, 2, n)).astype(np.float32)
    bits = (w - u).view(np.int64).copy()
    s = 52 - p.m
    eighth = n // 8
    # rests with few bits set, and rests of every size below the quantum
    bits[:eighth] &= ~np.int64((1 << 32) - 1) | rng.integers(0, 4, eighth)
    bits[eighth:2 * eighth] = ((bits[eighth:2 * eighth] & ~np.int64((1 << s) - 1))
                               | rng.integers(0, 1 << s, eighth))
    # ties: exactly half a quantum, the quantum's last bit odd or even
    bits[7 * eighth:] = ((bits[7 * eighth:] & ~np.int64((1 << s) - 1)) | (np.int64(1) << (s - 1))
                         ^ (rng.integers(0, 2, n - 7 * eighth) << s))
    # all ones below the top bits: a round up carries into the next binade
    bits[2 * eighth:3 * eighth] |= ((np.int64(1) << 52) - 1) ^ rng.integers(0, 1 << 20, eighth)
    r = rng.integers(0, 2 ** 32, n)
    # R at the threshold: the top 32 discarded bits (the rest's lower bits decide)
    r[:eighth] = (bits[:eighth] >> (s - 32)) & 0xFFFFFFFF
    r[3 * eighth:3 * eighth + 1000] = 0
    r[3 * eighth + 1000:3 * eighth + 2000] = 2 ** 32 - 1
    return bits.view(np.float64), r.astype(np.int64)


@pytest.mark.parametrize("mode", [NEAREST, STOCHASTIC])
@pytest.mark.parametrize("name", ["bf16", "fp16", "e4m3fn", "e5m2"])
def test_the_same_decisions_as_round_fast(name, mode):
    p = kernel_params(parse_format(name), np.float64)._replace(W=32)
    assert float64_applies(mode, 32, p)
    x, r = _cases(p, 400_000, 20261129)
    bad, taken = _differences(x, mode, r, p)
    assert bad == 0 and taken > x.size // 2, (bad, taken)


def test_where_it_does_not_apply():
    bf16 = kernel_params(parse_format("bf16"), np.float64)._replace(W=32)
    fp32 = kernel_params(parse_format("fp32"), np.float64)._replace(W=32)
    assert not float64_applies(STOCHASTIC, 16, bf16)        # few-bit SR
    assert not float64_applies(NEAREST, 32, fp32)           # kept bits past the high word


def test_the_same_decisions_as_plain_python():
    p = kernel_params(parse_format("bf16"), np.float64)._replace(W=32)
    x, r = _cases(p, 16_000, 20261130)
    for i in range(0, x.size, 8):
        for mode in (NEAREST, STOCHASTIC):
            want = round_fast(np.int64(bits_f64(x[i])), mode, np.int64(r[i]), 32, p)
            value, ok, inexact = by_float64(np.float64(x[i]), mode, np.int64(r[i]), p)
            assert ok == want[1], i
            if ok:
                assert (np.float64(value).view(np.int64), inexact) == (want[0], want[2]), i


@njit(cache=True)
def _differences32(x, bits, r, p):
    """(elements where sr_by_float32 and round_fast differ, elements round_fast takes)."""
    bad = taken = 0
    for i in range(x.size):
        b1, ok1, _ = round_fast(np.int64(bits[i]), STOCHASTIC, r[i], 32, p)
        v2, ok2 = sr_by_float32(x[i], r[i], p)
        taken += ok1
        if ok1 != ok2 or (ok1 and np.int32(b1) != np.int32(np.float32(v2).view(np.int32))):
            bad += 1
    return bad, taken


def _cases32(p, n, seed):
    """(x, its bits, r): float32 values of many magnitudes, every discarded bit set (a
    round up carries into the next binade), R at the threshold, R = 0 and 2**32 - 1."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * 2.0 ** rng.integers(-20, 20, n)).astype(np.float32)
    bits = x.view(np.int32).copy()
    s = 23 - p.m
    quarter = n // 4
    bits[:quarter] |= np.int32((1 << s) - 1)
    r = rng.integers(0, 2 ** 32, n)
    # R's top s bits equal to the rest: the decision's edge
    r[quarter:2 * quarter] = (bits[quarter:2 * quarter].astype(np.int64) & ((1 << s) - 1)) \
        << (32 - s)
    r[2 * quarter:2 * quarter + 1000] = 0
    r[2 * quarter + 1000:2 * quarter + 2000] = 2 ** 32 - 1
    return bits.view(np.float32), bits, r.astype(np.int64)


@pytest.mark.parametrize("name", ["bf16", "fp16", "e4m3fn", "e5m2"])
def test_moments_in_float32_make_round_fasts_decisions(name):
    p = kernel_params(parse_format(name), np.float32)
    x, bits, r = _cases32(p, 400_000, 20261131)
    bad, taken = _differences32(x, bits, r, p)
    assert bad == 0 and taken > x.size // 4, (bad, taken)
    for i in range(0, 4000, 4):                          # the source as plain Python
        want = round_fast(np.int64(bits[i]), STOCHASTIC, np.int64(r[i]), 32, p)
        value, ok = sr_by_float32(np.float32(x[i]), np.int64(r[i]), p)
        assert ok == want[1], i
        if ok:
            assert np.int32(np.float32(value).view(np.int32)) == np.int32(want[0]), i
