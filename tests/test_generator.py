"""lpsim.Generator: fresh Philox counters per call, save/restore replays, seed= still replays."""

import copy
import math
import pickle
import threading

import numpy as np
import pytest

import lpsim
from lpsim.philox import random_words


def test_sr_loop_with_generator_is_unbiased():
    # 1000 steps of w <- SR_bf16(w + 1e-3) from 1.0: E[w] = 1 + 1000e-3 = 2.0 exactly (SR is
    # unbiased at every step and bf16 holds every value in [1, 4) the walk visits on a 2^-7
    # or 2^-6 grid, no overflow).  Var per step <= q^2/4 with q <= 2^-6, so the standard
    # error of the mean of n = 4096 independent elements is <= sqrt(1000/4)*2^-6/64.
    # Bound |mean - 2| <= 5 standard errors: false alarm < 6e-7 (normal tail).
    n = 4096
    g = lpsim.Generator(1234)
    w = np.ones(n, np.float32)
    for _ in range(1000):
        w = lpsim.quantize(w + np.float32(1e-3), "bf16", "stochastic", generator=g)
    se = math.sqrt(1000 / 4) * 2.0 ** -6 / math.sqrt(n)
    # float32 w + 1e-3 rounds first (relative 2^-24 per step): 1000 * 2^-24 * 4 < 3e-4 bias
    assert abs(w.astype(np.float64).mean() - 2.0) <= 5 * se + 3e-4
    assert 5 * se < 0.02     # the test can fail: the fixed-seed loop ends near 1.0


def test_fixed_seed_in_a_loop_replays_and_drifts():
    # the defect a generator fixes: seed=0 reuses the same uniforms every step
    w = np.ones(4096, np.float32)
    for _ in range(1000):
        w = lpsim.quantize(w + np.float32(1e-3), "bf16", "stochastic", seed=0)
    # each element sees the same uniform every step: it stays at 1.0 when that uniform
    # exceeds 1e-3/2^-7 = 0.128, i.e. with probability ~0.87; exact SR leaves none there
    assert np.mean(w == 1.0) > 0.8


def test_calls_draw_consecutive_counters():
    g = lpsim.Generator(7)
    x = np.full(10, 1 + 2 ** -9, np.float32)          # frac 1/4 of a bf16 quantum
    a = lpsim.quantize(x, "bf16", "stochastic", generator=g)
    b = lpsim.quantize(x, "bf16", "stochastic", generator=g)
    # call 1: elements 0..9 (blocks 0..2); call 2 starts at block 3 = element 12
    assert g.get_state() == (7, 6)
    ra = lpsim.quantize(x, "bf16", "stochastic", seed=7, offset=0)
    rb = lpsim.quantize(x, "bf16", "stochastic", seed=7, offset=12)
    assert np.array_equal(a, ra) and np.array_equal(b, rb)
    words = random_words(22, 4, 7)
    assert len(set(words)) == 22                       # disjoint ranges, no repeats


def test_float64_calls_use_two_lanes():
    g = lpsim.Generator(3)
    x = np.full(5, 1 + 2 ** -9, np.float64)
    a = lpsim.quantize(x, "bf16", "stochastic", generator=g)
    assert g.get_state() == (3, 3)
    assert np.array_equal(a, lpsim.quantize(x, "bf16", "stochastic", seed=3))
    b = lpsim.quantize(x.astype(np.float32), "bf16", "stochastic", generator=g)
    assert np.array_equal(b, lpsim.quantize(x.astype(np.float32), "bf16", "stochastic",
                                            seed=3, offset=12))


@pytest.mark.parametrize("make", [lambda: np.full(5, 5, np.int8), lambda: np.full(5, 5, np.int32),
                                  lambda: np.full(5, 5, np.uint16), lambda: [5, 5, 5, 5, 5],
                                  lambda: [5.0] * 5, lambda: np.full(5, 5, np.int64)])
def test_integer_and_list_calls_reserve_the_float64_blocks_they_draw(make):
    """Integer arrays and lists round in float64 (two lanes a block); the generator counted
    four for int8/16/32 and reserved half the blocks, so the next call drew the same words."""
    g = lpsim.Generator(3)
    a = lpsim.quantize(make(), "fp(5,1,0)", "stochastic", generator=g)
    assert g.get_state() == (3, 3)
    assert np.array_equal(a, lpsim.quantize(np.full(5, 5.0), "fp(5,1,0)", "stochastic", seed=3))


def test_save_and_restore_replays():
    g = lpsim.Generator(99)
    x = np.linspace(1, 2, 1000, dtype=np.float32)
    lpsim.quantize(x, "e4m3", "stochastic", generator=g)
    state = g.get_state()
    first = [lpsim.quantize(x, "e4m3", "stochastic", generator=g) for _ in range(3)]
    g.set_state(state)
    again = [lpsim.quantize(x, "e4m3", "stochastic", generator=g) for _ in range(3)]
    for a, b in zip(first, again):
        assert np.array_equal(a, b)
    assert not np.array_equal(first[0], first[1])
    assert lpsim.Generator(5).manual_seed(99).initial_seed() == 99


def test_deterministic_modes_do_not_advance_and_scalars_take_one_element():
    g = lpsim.Generator(1)
    lpsim.quantize(np.ones(100, np.float32), "bf16", "nearest", generator=g)
    assert g.get_state() == (1, 0)
    lpsim.quantize(1.5, "bf16", "stochastic", generator=g)
    assert g.get_state() == (1, 1)


def test_generator_errors():
    g = lpsim.Generator(1)
    x = np.ones(3, np.float32)
    with pytest.raises(ValueError, match="seed=0 and generator"):
        lpsim.quantize(x, "bf16", "stochastic", seed=0, generator=g)
    with pytest.raises(TypeError, match="not an lpsim.Generator"):
        lpsim.quantize(x, "bf16", "stochastic", generator=3)
    with pytest.raises(ValueError, match="seed=-1"):
        lpsim.Generator(-1)
    with pytest.raises(TypeError, match="get_state"):
        g.set_state([1, 2])
    with pytest.raises(ValueError, match="block=-3"):
        g.set_state((1, -3))


@pytest.mark.parametrize("bad", [
    dict(out=np.empty(5, np.float32)),                          # wrong shape
    dict(stats="counts"),                                       # not a RoundingStats
    dict(sr_bits=40),                                           # beyond float32's words
    dict(out=np.empty(64, np.float32), stream=-1),              # a bad stream
    dict(fmt="mxfp4", out=np.empty(5, np.float32)),            # block format, bad out
])
def test_a_refused_call_gives_its_counters_back(bad):
    fmt = bad.pop("fmt", "bf16")
    x = np.linspace(-1, 1, 64, dtype=np.float32) / 3
    g = lpsim.Generator(7)
    before = g.get_state()
    with pytest.raises((ValueError, TypeError)):
        lpsim.quantize(x, fmt, "stochastic", generator=g, **bad)
    assert g.get_state() == before
    # so the next call draws what it would have drawn without the refused one
    got = lpsim.quantize(x, fmt, "stochastic", generator=g)
    want = lpsim.quantize(x, fmt, "stochastic", generator=lpsim.Generator(7))
    assert np.array_equal(got, want)


def test_counters_given_back_only_when_no_call_took_more():
    g = lpsim.Generator(3)
    x = np.ones(64, np.float32) / 3
    assert g.begin()
    g.take(64, 4)
    g.take(8, 4)                                # one unbroken range: both given back
    g.end(failed=True)
    assert g.get_state() == (3, 0)
    assert g.begin()
    g.take(64, 4)
    lpsim.quantize(x, "bf16", "stochastic", generator=g)    # given back with it
    g.end(failed=True)
    assert g.get_state() == (3, 0)
    assert g.begin()
    g.take(64, 4)
    g.end(failed=False)                         # a call that succeeded keeps its blocks
    assert g.get_state() == (3, 16)
    g.set_state((3, 0))
    taken = []

    def other():                                # another thread takes after this call
        taken.append(g.take(4, 4))

    assert g.begin()
    g.take(64, 4)
    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    g.end(failed=True)
    assert g.get_state() == (3, 17)             # 16 blocks stay taken: a gap, no reuse
    assert taken == [(3, 64)]


def test_threads_sharing_a_generator_never_share_counters():
    g = lpsim.Generator(11)
    starts = []

    def worker():
        for _ in range(500):
            starts.append(g.take(4, 4)[1])

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(starts) == list(range(0, 4 * 2000, 4))


def test_a_generator_near_its_end_says_so():
    g = lpsim.Generator(1).set_state((1, 2 ** 60))
    with pytest.raises(OverflowError, match="element counters end at 2"):
        lpsim.quantize(np.ones(4, np.float32), "bf16", "stochastic", generator=g)
    assert g.get_state() == (1, 2 ** 60)
    g.set_state((1, 2 ** 61 - 1))               # float64: two lanes a block, still room
    lpsim.quantize(np.ones(2), "bf16", "stochastic", generator=g)
    assert g.get_state() == (1, 2 ** 61)


def test_generators_copy_and_pickle():
    g = lpsim.Generator(5)
    lpsim.quantize(np.ones(10, np.float32), "bf16", "stochastic", generator=g)
    for h in (copy.deepcopy(g), pickle.loads(pickle.dumps(g)), copy.copy(g)):
        assert h.get_state() == g.get_state()
        assert np.array_equal(lpsim.quantize(np.ones(10, np.float32) / 3, "bf16", "stochastic",
                                             generator=h),
                              lpsim.quantize(np.ones(10, np.float32) / 3, "bf16", "stochastic",
                                             generator=copy.deepcopy(g)))


def test_a_bad_offset_is_the_same_error_with_a_generator():
    x = np.ones(4, np.float32)
    for offset, error in ((1.0, TypeError), (True, TypeError), (-1, ValueError)):
        with pytest.raises(error, match="offset"):
            lpsim.quantize(x, "bf16", "stochastic", seed=1, offset=offset)
        g = lpsim.Generator(2)
        with pytest.raises(error, match="offset"):
            lpsim.quantize(x, "bf16", "stochastic", generator=g, offset=offset)
        assert g.get_state() == (2, 0)


def test_a_ragged_list_is_the_same_error_with_a_generator():
    g = lpsim.Generator(5)
    for kwargs in ({"seed": 1}, {"generator": g}):
        with pytest.raises(TypeError, match="x of type list is not an array of numbers"):
            lpsim.quantize([[1.0, 2.0], [3.0]], "bf16", "stochastic", **kwargs)
    assert g.get_state() == (5, 0)
