"""lpsim.pool: the ranges of a threaded call are pulled by the threads, cover the work once,
come back in order, and a slow thread does not hold the others' work."""

import threading

import numpy as np
import pytest

from lpsim import pool
from lpsim.pool import PIECES, deal, pieces


@pytest.mark.parametrize("units,workers", [(0, 1), (1, 4), (5, 2), (7, 3), (1000, 2),
                                           (10**6 + 3, 8)])
def test_pieces_cover_the_units_once_in_order(units, workers):
    bounds = pieces(units, workers)
    assert bounds[0] == 0 and bounds[-1] == units
    assert all(a <= b for a, b in zip(bounds, bounds[1:]))
    assert len(bounds) - 1 == max(1, min(units, workers * PIECES if workers > 1 else 1))


def test_pieces_of_numpy_and_huge_counts_do_not_wrap():
    huge = np.int64(2**62)
    bounds = pieces(huge, 2)
    assert bounds[-1] == 2**62 and all(type(b) is int for b in bounds)
    assert all(0 < b - a for a, b in zip(bounds, bounds[1:]))
    with pytest.raises(ValueError, match="units=-1"):
        pieces(-1, 2)


def test_deal_returns_each_range_once_in_order():
    bounds = pieces(1000, 3)
    seen = []
    got = deal(lambda a, b: (seen.append((a, b)), np.arange(a, b).sum())[1], bounds, 3)
    assert sorted(seen) == list(zip(bounds, bounds[1:]))
    assert got == [np.arange(a, b).sum() for a, b in zip(bounds, bounds[1:])]
    assert sum(got) == np.arange(1000).sum()


def test_a_held_thread_does_not_hold_the_other_ranges():
    """The thread that takes the first range waits until every other range is done: with
    one fixed range per thread it would hold half of them and wait for ever (10 s here)."""
    bounds = pieces(64, 2)
    rest_done, done = threading.Event(), []

    def run(a, b):
        if a == 0:
            assert rest_done.wait(10), "the other ranges waited for the held thread"
        else:
            done.append(a)
            if len(done) == len(bounds) - 2:
                rest_done.set()
        return a
    assert deal(run, bounds, 2) == bounds[:-1]


def test_an_error_in_a_range_is_raised_once_the_started_ranges_finish():
    """Nothing of the call runs after it raised (the caller may free what the ranges
    write); the ranges not yet started are dropped."""
    started, finished = [], []

    def run(a, b):
        started.append(a)
        if a == 8:
            raise ValueError("range 8")
        threading.Event().wait(0.001)
        finished.append(a)
        return a
    for _ in range(20):
        started.clear(), finished.clear()
        with pytest.raises(ValueError, match="range 8"):
            deal(run, list(range(0, 65, 8)), 2)
        assert 8 in started and sorted(started) == sorted(finished + [8])


def test_a_call_from_a_pool_thread_finishes():
    """A range that deals out work of its own (the pool's one thread busy with it) runs that
    work itself instead of waiting for the pool."""
    inner = lambda a, b: deal(lambda c, d: d - c, pieces(b - a, 2), 2)
    got = deal(lambda a, b: sum(inner(a, b)), pieces(100, 2), 2)
    assert sum(got) == 100


def test_limited_caps_the_threads_and_restores_the_limit():
    """Within limited(n) a kernel deals its work to at most n threads (1: the calling thread
    alone), the same values; nested limits, and the previous limit after an error."""
    import threading

    import lpsim
    before = pool.threads()
    x = np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32)
    want = lpsim.quantize(x, "mxfp4")
    with pool.limited(1):
        assert pool.threads() == 1
        seen = set()
        pool.deal(lambda a, b: seen.add(threading.get_ident()), pool.pieces(64, 2),
                  pool.threads())
        assert seen == {threading.get_ident()}
        np.testing.assert_array_equal(lpsim.quantize(x, "mxfp4").view(np.int32),
                                      want.view(np.int32))
        with pool.limited(np.int64(5)):
            assert pool.threads() == min(before, 5)
        assert pool.threads() == 1
    assert pool.threads() == before
    with pytest.raises(RuntimeError):
        with pool.limited(1):
            raise RuntimeError("inside")
    assert pool.threads() == before


@pytest.mark.parametrize("count", [0, -1, 1.5, True, "2", None])
def test_limited_refuses_a_count_that_is_not_an_integer_of_one_or_more(count):
    before = pool.threads()
    with pytest.raises(ValueError, match="count="):
        with pool.limited(count):
            pass
    assert pool.threads() == before


def test_limited_blocks_of_several_threads_closing_out_of_order_lift_the_limit():
    """Each block once saved and restored one process-wide value: when the first of two
    threads' blocks closed first, the second's close restored the first's count and lpsim
    stayed on one thread for the rest of the process (and the first's close dropped the
    second's limit while it was open)."""
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def first():
        with pool.limited(1):
            a_in.set()
            b_in.wait()
        a_out.set()

    def second():
        a_in.wait()
        with pool.limited(2):
            b_in.set()
            a_out.wait()
            seen["after the first closed"] = pool._LIMIT
    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert seen == {"after the first closed": 2}
    assert pool._LIMIT is None and not pool._OPEN


def test_a_threaded_call_while_the_interpreter_exits_runs_in_the_calling_thread():
    """concurrent.futures takes no new work once the interpreter exits: a large call from an
    atexit handler (or a non-daemon thread still running then) raised "cannot schedule new
    futures after shutdown"; the calling thread now takes every range."""
    import subprocess
    import sys
    script = ("import atexit, numpy as np, lpsim\n"
              "x = np.random.default_rng(0).standard_normal(1 << 21).astype(np.float32)\n"
              "want = lpsim.quantize(x, 'e4m3fn', 'stochastic', seed=3)\n"
              "def late():\n"
              "    got = lpsim.quantize(x, 'e4m3fn', 'stochastic', seed=3)\n"
              "    print('same' if np.array_equal(got.view(np.int32), want.view(np.int32))"
              " else 'differ')\n"
              "atexit.register(late)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "same", done.stderr[-2000:]
