"""torch's OpenMP threads as lpsim's workers while they spin.

torch's Linux wheels run its CPU operations on GNU OpenMP (``libgomp.so.1``), whose threads
keep spinning for about 10 ms after each parallel region, waiting for the next one.  Inside
a training step that is nearly always: lpsim's own pool threads then share the cores with
spinning threads, and a 2-core machine gives lpsim's kernels about one core.  Run as a
region of that team instead (``GOMP_parallel``, the entry a compiler emits for ``#pragma omp
parallel``), lpsim's ranges go to the spinning threads themselves.

A sleeping team is not used: the region's closing barrier would wait for each thread to
wake (about 6 ms on a 2-core VM), where lpsim's pool does not wait for a worker that has
not started.  :func:`hot_team` looks at the team's threads (whether a thread's CPU clock
advances between two reads, else its state in ``/proc``) and offers the team only while
one of them runs or waits for a core; within
:data:`RECENT` of this thread's last region it does not look (the team spins after that
region as after torch's).  On a 2-core VM a simulated
mxfp8 or nvfp4 training step took 10% to 12% less time so, in alternating steps of one
process (``bench_recipes.py --own-pool`` times both routes), and calls between idle gaps
kept their time.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import sys
import threading
import time

#: the process that imported lpsim: a forked child's OpenMP runtime believes in threads its
#: parent had, which the child does not have, so only this process uses it
_IMPORTED_IN = os.getpid()
#: (GOMP_parallel or None,) once looked up
_FOUND = None
_REGION = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_local = threading.local()
#: per calling thread (native id), the other threads its last team ran on (libgomp keeps a
#: team per thread that starts regions)
_members: dict[int, tuple[int, ...]] = {}
#: per calling thread, when (time.perf_counter) its last region ended
_ended: dict[int, float] = {}


def spins_after_regions(env) -> bool:
    """Whether libgomp's threads spin after a region under the environment ``env``: not
    with ``OMP_WAIT_POLICY=passive`` or ``GOMP_SPINCOUNT=0`` (they sleep at once)."""
    if env.get("OMP_WAIT_POLICY", "").strip().lower() == "passive":
        return False
    return env.get("GOMP_SPINCOUNT", "").strip() != "0"


#: seconds after a region of its own within which a thread offers the team without looking
#: at its threads: libgomp's threads spin for milliseconds after every region, and a look
#: right after a torch operation cost 40 to 200 us on a 2-core VM (a quantization of an
#: NVFP4 operand deals out two passes, the amax and the blocks, back to back); 0 (always
#: look) where they sleep at once
RECENT = 1e-3 if spins_after_regions(os.environ) else 0.0


#: OpenMP threads whose Python thread state is kept between regions (:func:`_keep_thread_state`)
_kept: set[int] = set()
#: own_threads() blocks entered and not left (process-wide)
_OWN = 0


@contextlib.contextmanager
def own_threads():
    """Within the block lpsim's kernels run on lpsim's own pool, never on torch's OpenMP
    team, process-wide (``lpsim.pool.own_threads``): a way to compare the two, or to keep
    lpsim's work off torch's threads."""
    global _OWN
    _OWN += 1
    try:
        yield
    finally:
        _OWN -= 1


def openmp_parallel():
    """torch's ``GOMP_parallel(fn, data, threads, flags)`` when torch is imported and runs on
    libgomp (already loaded: nothing is loaded here), in the process that imported lpsim;
    else None."""
    global _FOUND
    if os.getpid() != _IMPORTED_IN:
        return None
    if _FOUND is not None:
        return _FOUND[0]
    if "torch" not in sys.modules:
        return None                     # not kept: torch may be imported later
    try:
        parallel = ctypes.CDLL("libgomp.so.1", mode=os.RTLD_NOLOAD | os.RTLD_LAZY).GOMP_parallel
        parallel.argtypes = [_REGION, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
        parallel.restype = None
    except (OSError, AttributeError):
        parallel = None
    _FOUND = (parallel,)
    return parallel


def _running(tid: int) -> bool | None:
    """Whether thread ``tid`` of this process runs or waits for a core, None where it is
    gone.  First its CPU clock (Linux's per-thread clock of another thread, ``~tid << 3 |
    6``): where it advances between two reads, the thread runs (15 to 30 us while it spins
    on another core, against 40 to 200 us for its state in ``/proc`` on a 2-core VM); else
    its state in ``/proc`` (R: it may wait for a core another process holds)."""
    clock = (~tid << 3) | 6                 # CPUCLOCK_SCHED of one thread (posix-cpu-timers)
    try:
        first = time.clock_gettime_ns(clock)
        if time.clock_gettime_ns(clock) != first:
            return True
        fd = os.open(f"/proc/self/task/{tid}/stat", os.O_RDONLY)
    except OSError:
        return None
    try:
        stat = os.read(fd, 512)
    finally:
        os.close(fd)
    return stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3] == b"R"


def mark_pool_thread() -> None:
    """Mark the calling thread as one of lpsim's own pool (its ThreadPoolExecutor's
    initializer): work it deals out never goes to an OpenMP team, as libgomp would start a
    team of new threads for each pool thread that asked."""
    _local.in_pool = True


def hot_team():
    """A function ``team(work, threads)`` that runs ``work()`` on an OpenMP team where
    torch's team is running now (or was never seen: the first region finds its threads);
    None where lpsim's own pool should run the work (no libgomp, a sleeping team, within
    :func:`own_threads`, a thread of that pool); a call from within a team's work runs
    alone (libgomp nests no teams)."""
    if getattr(_local, "in_region", False):
        return _alone
    if getattr(_local, "in_pool", False):
        return None
    parallel = openmp_parallel() if _OWN == 0 else None
    if parallel is None:
        return None
    caller = threading.get_native_id()
    members = _members.get(caller)
    if members is not None and time.perf_counter() - _ended.get(caller, -RECENT) >= RECENT:
        states = [_running(tid) for tid in members]
        if None not in states and not any(states):
            return None
    return lambda work, threads: _region(parallel, work, threads)


def _alone(work, threads):
    work()


def _keep_thread_state(tid: int) -> None:
    """Keep the Python thread state of the OpenMP thread ``tid`` (called on it, holding the
    GIL) from one region to the next: ctypes makes a state for a thread Python did not start
    on each call of a callback and drops it on return, about 17 us a thread and region,
    against about 1 us with one kept (one more PyGILState_Ensure, never released: the state
    lives as long as the thread, and the GIL is still released on return)."""
    ctypes.pythonapi.PyGILState_Ensure()
    _kept.add(tid)


#: the regions in flight, by the key GOMP_parallel hands every thread of a team as its data:
#: (work, errors raised, native ids of the threads that ran it)
_IN_FLIGHT: dict[int, tuple] = {}
_keys = itertools.count(1)


def _body(key) -> None:
    """A team thread's part of the region ``key`` (:data:`_IN_FLIGHT`)."""
    work, errors, seen = _IN_FLIGHT[key]
    tid = threading.get_native_id()
    seen.add(tid)
    if tid not in _kept:
        _keep_thread_state(tid)
    _local.in_region = True
    try:
        work()
    except BaseException as error:      # noqa: BLE001 -- raised in the calling thread
        errors.append(error)
    finally:
        _local.in_region = False


#: the one C callback of every region (made once: making one took about 25 us after a torch
#: operation on a 2-core VM, a sixth of a region's cost there)
_BODY = _REGION(_body)


def _region(parallel, work, threads: int) -> None:
    """``work()`` on every thread of an OpenMP team of ``threads`` (the calling thread one of
    them), the GIL released while the team runs; an error any thread raised is raised here
    once the region has ended."""
    errors, seen = [], set()
    caller = threading.get_native_id()
    key = next(_keys)
    _IN_FLIGHT[key] = (work, errors, seen)
    try:
        parallel(_BODY, key, threads, 0)
    finally:
        del _IN_FLIGHT[key]
    _ended[caller] = time.perf_counter()
    _members[caller] = tuple(sorted(seen - {caller}))
    if errors:
        raise errors[0]
