"""lpsim's own thread pool, and how a kernel's work is dealt out to it.

Every threaded CPU kernel of lpsim (rounding, block formats, amaxes, simulated GEMMs, the
optimizers) runs a compiled function over ranges of its work units (chunks, blocks, output
items) on this pool, the calling thread taking part.  The ranges are pulled, not assigned:
the work is cut into :data:`PIECES` ranges per thread and each thread takes the next one as
it finishes one, so a thread slowed by another busy thread on its core (the OpenMP threads
torch keeps spinning for milliseconds after each of its operations, another process) takes
fewer of them instead of making the call wait for its fixed share: NVFP4 stochastic
rounding of 2M elements right after a torch operation took 0.77 to 1.03 (median 0.85) of
the time of one fixed range a thread, in six runs of ``benchmarks/bench_mixed.py`` on a
2-core VM.  It is also one way of dealing out work for every kernel, and a call made from
a pool thread finishes.  Results do not depend on the split: lpsim's random words are
counter-based and counters are summed.

Right after torch's operations, whose OpenMP threads then spin for milliseconds waiting
for more, the ranges go to those threads instead (:mod:`lpsim.openmp_team`).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numba import config as numba_config
from numba import get_num_threads
from numba.np.ufunc import parallel as _numba_parallel

from .openmp_team import hot_team, mark_pool_thread, own_threads  # noqa: F401 (own_threads)

#: ranges per thread that a threaded call's work is cut into
PIECES = 4


#: at most this many threads for lpsim's kernels, process-wide (None: no limit): the count of
#: the :func:`limited` block opened last of those open now, in any thread (_OPEN, in the
#: order they opened, under _OPEN_LOCK)
_LIMIT = None
_OPEN: list = []
_OPEN_LOCK = threading.Lock()


@contextlib.contextmanager
def limited(count):
    """Within the block, lpsim's CPU kernels use at most ``count`` threads (an integer >= 1;
    1: the calling thread alone), process-wide.  Of the blocks open at once (nested, or in
    several threads) the one opened last holds; a block that closes hands the limit back to
    those still open, whatever the order they close in, and the limit lifts with the last.

    Why: inside a torch training step torch's OpenMP threads spin on the other cores for
    milliseconds after each of its operations, and lpsim's pool threads share those cores
    with them.  On a 2-core VM, in alternating steps of one process, a simulated mxfp8 or
    nvfp4 step took 3% to 9% less time with lpsim's kernels in the calling thread alone
    (``bench_recipes.py --one-thread`` times it beside the default).  It was measured on no
    larger machine, where more of lpsim's threads may still pay: a choice, not a default."""
    global _LIMIT
    if isinstance(count, (bool, np.bool_)) or not isinstance(count, (int, np.integer)) \
            or count < 1:
        raise ValueError(f"count={count!r} is not accepted; accepted: an integer >= 1")
    block = [int(count)]                # this block's own entry (compared by identity)
    with _OPEN_LOCK:
        _OPEN.append(block)
        _LIMIT = block[0]
    try:
        yield
    finally:
        with _OPEN_LOCK:
            del _OPEN[next(i for i, b in enumerate(_OPEN) if b is block)]
            _LIMIT = _OPEN[-1][0] if _OPEN else None


def threads() -> int:
    """The threads lpsim's own pool may use: ``numba.get_num_threads()`` once numba's threading
    layer runs (``numba.set_num_threads`` starts it), else NUMBA_NUM_THREADS; at most the
    count of an enclosing :func:`limited`.

    Why not always ask numba: asking starts its threading layer, and its OpenMP layer sets
    the OpenMP thread count that torch shares, so a 1-thread torch would run its next ops on
    every core, with other results for bf16 products; lpsim's kernels run on its own pool.
    """
    count = get_num_threads() if _numba_parallel._is_initialized \
        else numba_config.NUMBA_NUM_THREADS
    return count if _LIMIT is None else min(count, _LIMIT)


@functools.cache
def thread_pool(workers, pid):
    # keyed by process id too: a forked child does not inherit the parent's threads
    return ThreadPoolExecutor(workers, thread_name_prefix="lpsim", initializer=mark_pool_thread)


def ranges(workers: int) -> int:
    """How many ranges the work of ``workers`` threads is cut into: PIECES a thread, one
    for one thread."""
    return workers * PIECES if workers > 1 else 1


def pieces(units: int, workers: int) -> list[int]:
    """The boundaries of ``min(units, ranges(workers))`` contiguous ranges of about equal
    size covering units 0 .. units-1 (a numpy integer taken as a Python int, whose products
    do not wrap)."""
    units = int(units)
    if units < 0:
        raise ValueError(f"units={units} is not accepted; accepted: an integer >= 0")
    count = max(1, min(units, ranges(workers)))
    return [units * p // count for p in range(count + 1)]


def deal(run, bounds, workers: int) -> list:
    """``run(bounds[p], bounds[p + 1])`` for every range p, on ``workers`` threads (the
    calling thread and workers - 1 of the pool) that each take the next range as they finish
    one; what each call returned, in range order.  One range or one worker: a call in the
    calling thread.  A range the pool has not started when the calling thread runs out is
    not waited for (a call from a pool thread cannot wait on itself), and an error in any
    range is raised here once every started range has finished.  Where torch's OpenMP
    threads spin, waiting for work, the threads are theirs instead
    (:func:`lpsim.openmp_team.hot_team`)."""
    count = len(bounds) - 1
    if count <= 1 or workers <= 1:
        return [run(bounds[p], bounds[p + 1]) for p in range(count)]
    results = [None] * count
    taken = itertools.count()           # next() of a count is atomic under the GIL

    def work():
        while (p := next(taken)) < count:
            results[p] = run(bounds[p], bounds[p + 1])

    team = hot_team()
    if team is not None:
        team(work, min(workers, count))
        return results
    pool = thread_pool(workers - 1, os.getpid())
    futures = []
    for _ in range(min(workers, count) - 1):
        try:
            futures.append(pool.submit(work))
        except RuntimeError:    # the interpreter is exiting (a non-daemon thread's or an
            break               # atexit call): the calling thread takes the other ranges
    try:
        work()
    finally:
        started = [future for future in futures if not future.cancel()]
        for future in started:
            future.exception()          # wait; raised below
    for future in started:
        future.result()
    return results
