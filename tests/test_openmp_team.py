"""lpsim.openmp_team: lpsim's ranges on torch's spinning OpenMP threads, the same results as
on lpsim's pool, errors raised, no team in a forked child or within a team's work."""

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import lpsim  # noqa: E402
from lpsim import openmp_team, pool  # noqa: E402

needs_libgomp = pytest.mark.skipif(openmp_team.openmp_parallel() is None,
                                   reason="torch does not run on GNU OpenMP here")


@needs_libgomp
def test_a_region_runs_on_two_threads_and_learns_the_others():
    parallel = openmp_team.openmp_parallel()
    ids, barrier = set(), threading.Barrier(2, timeout=30)

    def work():
        ids.add(threading.get_native_id())
        barrier.wait()                  # both threads of the team are in the region at once

    openmp_team._region(parallel, work, 2)
    caller = threading.get_native_id()
    assert len(ids) == 2 and caller in ids
    assert openmp_team._members[caller] == tuple(ids - {caller})
    assert openmp_team._running(caller) is True            # this thread runs
    assert openmp_team._running(2 ** 22 + 12345) is None     # no such thread


@needs_libgomp
def test_regions_of_two_python_threads_at_once_each_run_their_own_work():
    """Every region goes through one C callback, which finds its work by the key the team
    hands it: two Python threads, each with a team of its own, running regions at the same
    time never run each other's work, and each region's error is raised in its own caller."""
    parallel = openmp_team.openmp_parallel()
    done = {0: [], 1: []}
    failures = []

    def caller(me):
        try:
            for i in range(200):
                def work(i=i):
                    done[me].append((i, threading.get_native_id()))
                openmp_team._region(parallel, work, 2)
            def boom():
                raise KeyError(me)
            with pytest.raises(KeyError, match=str(me)):
                openmp_team._region(parallel, boom, 2)
        except BaseException as error:      # noqa: BLE001 -- reported below
            failures.append(error)

    threads = [threading.Thread(target=caller, args=(me,)) for me in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not failures
    for me in (0, 1):
        assert sorted({i for i, _ in done[me]}) == list(range(200))
        assert len(done[me]) == 2 * 200             # each region on its two threads
    assert not openmp_team._IN_FLIGHT               # nothing left behind


@needs_libgomp
def test_a_team_thread_keeps_its_python_state_from_one_region_to_the_next():
    """A thread-local value set in one region is there in the next: the OpenMP thread's
    Python thread state is kept (a state made per callback would start empty each time)."""
    parallel = openmp_team.openmp_parallel()
    caller = threading.get_native_id()
    local, seen, barrier = threading.local(), {}, threading.Barrier(2, timeout=30)

    def mark():
        local.mark = threading.get_native_id()
        barrier.wait()

    def read():
        seen[threading.get_native_id()] = getattr(local, "mark", None)
        barrier.wait()

    openmp_team._region(parallel, mark, 2)
    openmp_team._region(parallel, read, 2)
    members = set(seen) - {caller}
    assert len(seen) == 2 and members and members <= openmp_team._kept
    assert all(seen[tid] == tid for tid in seen)


@needs_libgomp
def test_a_pool_thread_never_starts_a_team():
    """Work dealt out from one of lpsim's pool threads stays on that pool (libgomp would
    start a team of new threads for a thread it has not seen, which any other thread is
    offered)."""
    def ask():
        return openmp_team.hot_team(), openmp_team._local.in_pool
    got = pool.thread_pool(1, os.getpid()).submit(ask).result(timeout=60)
    assert got == (None, True)


@needs_libgomp
def test_the_team_is_offered_only_while_one_of_its_threads_runs(monkeypatch):
    caller = threading.get_native_id()
    monkeypatch.setitem(openmp_team._members, caller, (11, 12))
    monkeypatch.setitem(openmp_team._ended, caller, -1.0)      # no region of late
    states = {11: False, 12: False}
    monkeypatch.setattr(openmp_team, "_running", lambda tid: states[tid])
    assert openmp_team.hot_team() is None                  # asleep: lpsim's pool
    states[12] = True
    assert callable(openmp_team.hot_team())                # one spins: the team
    states[12] = None
    assert callable(openmp_team.hot_team())                # one is gone: a region relearns


@needs_libgomp
def test_right_after_its_own_region_a_thread_offers_the_team_without_looking(monkeypatch):
    """Within RECENT of a region this thread started, its team still spins: hot_team offers
    it without reading the threads' clocks; later it looks again."""
    caller = threading.get_native_id()
    monkeypatch.setitem(openmp_team._members, caller, (11,))
    looked = []
    monkeypatch.setattr(openmp_team, "_running", lambda tid: looked.append(tid) or False)
    now = openmp_team.time.perf_counter()
    monkeypatch.setitem(openmp_team._ended, caller, now)
    assert callable(openmp_team.hot_team()) and looked == []
    monkeypatch.setitem(openmp_team._ended, caller, now - 2 * openmp_team.RECENT)
    assert openmp_team.hot_team() is None and looked == [11]


def test_no_region_counts_as_recent_where_the_team_sleeps_at_once():
    """OMP_WAIT_POLICY=passive or GOMP_SPINCOUNT=0: libgomp's threads sleep after each
    region, so hot_team must look every time (RECENT 0 under them)."""
    spins = openmp_team.spins_after_regions
    assert spins({}) and spins({"OMP_WAIT_POLICY": "active"}) and spins({"GOMP_SPINCOUNT": "1000"})
    assert not spins({"OMP_WAIT_POLICY": " PASSIVE "}) and not spins({"GOMP_SPINCOUNT": "0"})
    script = "import lpsim.openmp_team as t; print(t.RECENT)"
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    for env, want in (({"OMP_WAIT_POLICY": "passive"}, "0.0"), ({}, "0.001")):
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              env={**base, **env}, timeout=300)
        assert done.stdout.strip() == want, done.stderr[-2000:]


def test_a_thread_whose_clock_stands_still_is_asked_in_proc(monkeypatch):
    """Where the clock does not advance between the two reads (a thread waiting for a core
    another process holds), the thread's state decides: this thread's is R (running)."""
    monkeypatch.setattr(openmp_team.time, "clock_gettime_ns", lambda clock: 7)
    assert openmp_team._running(threading.get_native_id()) is True


def test_a_running_thread_is_seen_by_its_cpu_clock():
    """_running reads a thread's CPU clock twice, then its state: a thread spinning in
    compiled code without the GIL runs (or waits for a core, where other processes hold
    them), one blocked on an event does not, a thread that ended is gone (None)."""
    from numba import njit

    @njit(nogil=True)
    def spin(n):
        x = np.uint64(1)                        # xorshift steps: no closed form to fold
        for _ in range(n):
            x ^= x << np.uint64(13)
            x ^= x >> np.uint64(7)
            x ^= x << np.uint64(17)
        return x
    spin(1)                                     # compiled before the threads start
    stop, ids = threading.Event(), {}

    def spinner():
        ids["spin"] = threading.get_native_id()
        spin(1 << 30)                           # a second or two

    def waiter():
        ids["wait"] = threading.get_native_id()
        stop.wait()
    threads = [threading.Thread(target=spinner), threading.Thread(target=waiter)]
    for t in threads:
        t.start()
    while len(ids) < 2:
        threading.Event().wait(0.01)
    def looks(tid, count):
        # each after a pause that releases the GIL: the spinner needs it to enter the
        # compiled loop, and may be off its core for a moment (another process)
        for _ in range(count):
            threading.Event().wait(0.002)
            yield openmp_team._running(tid)
    try:
        assert any(looks(ids["spin"], 200))
        assert not any(looks(ids["wait"], 20))
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert openmp_team._running(ids["wait"]) is None


@needs_libgomp
@pytest.mark.parametrize("route", ["team", "pool"])
def test_either_route_gives_the_same_bits_and_counts(monkeypatch, route):
    """Stochastic NVFP4 with counters (ranges of blocks, counter-based random words, sums)
    on torch's team and on lpsim's pool: equal to one thread's."""
    x = np.random.default_rng(3).standard_normal((512, 1024)).astype(np.float32)

    def run():
        stats = lpsim.blocks.BlockStats()
        q = lpsim.quantize(x, "nvfp4", "stochastic", axis=-1, generator=lpsim.Generator(9),
                           stats=stats)
        return q, stats.as_dict()

    with pool.limited(1):
        want = run()
    used = []
    real = openmp_team._region
    monkeypatch.setattr(openmp_team, "_region", lambda *a: used.append(1) or real(*a))
    if route == "team":
        monkeypatch.setattr(pool, "hot_team", lambda: lambda work, threads: openmp_team._region(
            openmp_team.openmp_parallel(), work, threads))
    else:
        monkeypatch.setattr(pool, "hot_team", lambda: None)
    got = run()
    assert np.array_equal(got[0], want[0]) and got[1] == want[1]
    assert bool(used) == (route == "team")


@needs_libgomp
def test_an_error_in_a_team_thread_is_raised_and_nested_calls_run_alone(monkeypatch):
    monkeypatch.setattr(pool, "hot_team", lambda: lambda work, threads: openmp_team._region(
        openmp_team.openmp_parallel(), work, threads))

    def failing(a, b):
        if a >= 6:
            raise ZeroDivisionError(f"range {a}")
        return a

    with pytest.raises(ZeroDivisionError, match="range"):
        pool.deal(failing, list(range(20)), 2)
    monkeypatch.undo()
    inner_routes = []

    def outer(a, b):
        inner_routes.append(openmp_team.hot_team())
        return sum(pool.deal(lambda c, d: c, list(range(8)), 2))

    monkeypatch.setattr(pool, "hot_team", lambda: (
        openmp_team._alone if getattr(openmp_team._local, "in_region", False) else
        lambda work, threads: openmp_team._region(openmp_team.openmp_parallel(), work,
                                                  threads)))
    assert pool.deal(outer, list(range(9)), 2) == [21] * 8
    assert all(route is openmp_team._alone for route in inner_routes)


def test_no_team_without_torch_or_in_a_forked_child():
    """Without torch imported nothing is looked up (no runtime is loaded); a child forked
    after lpsim's import takes lpsim's pool and finishes (a team would wait for threads
    only its parent had; the child runs no torch operation, which would wait so too)."""
    code = (
        "import sys, os, numpy as np\n"
        "import lpsim, lpsim.openmp_team as t\n"
        "assert 'torch' not in sys.modules and t.openmp_parallel() is None\n"
        "import torch\n"
        "x = torch.randn(256, 1024)\n"
        "torch.mm(x, x.t())\n"
        "q = lpsim.quantize(x, 'nvfp4', 'stochastic', axis=-1, generator=lpsim.Generator(1))\n"
        "xn = x.numpy()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    again = lpsim.quantize(xn, 'nvfp4', 'stochastic', axis=-1,\n"
        "                           generator=lpsim.Generator(1))\n"
        "    ok = t.openmp_parallel() is None and np.array_equal(again, q.numpy())\n"
        "    os._exit(0 if ok else 3)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "sys.exit(os.waitstatus_to_exitcode(status))\n")
    if not hasattr(os, "fork"):
        pytest.skip("no fork here")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
