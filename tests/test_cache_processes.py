"""Processes sharing numba's on-disk cache: a kernel compiled after others were loaded from
the cache must neither crash nor run another kernel's code.

numba numbers the functions it compiles per process, so two kernels with one qualified name
(closures of one factory) can get the same symbol in two processes; a third process that
loads both from the cache then runs one with the other's runtime environment
("NRT_adapt_ndarray_to_python: 'descr' is NULL").  The sequence below crashed lpsim's
per-mode kernels before each got a name of its own.
"""

import contextlib
import io
import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import lpsim
    from lpsim import ops
    results = {}
    for spec in sys.argv[1:]:
        what, mode, dtype = spec.split(":")
        x = np.array([0.1, -2.3, 3e-3, 500.0, 1e-30, 7e4, -0.0, np.inf], dtype)
        if what == "quantize":
            y = lpsim.quantize(x, "bf16", mode, seed=7, stream=2**63 + 5, offset=3)
        else:
            y = ops.dot(x[:6], x[:6][::-1], acc_fmt="bf16", order="sequential",
                        acc_rounding=mode, seed=7)
        results[spec] = np.asarray(y, np.float64).tobytes().hex()
    print(json.dumps(results))
""")


def _run(cache, *specs):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), "PYTHONPATH": ROOT}
    done = subprocess.run([sys.executable, "-c", SCRIPT, *specs], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_kernels_compiled_after_cache_loads_stay_correct(tmp_path):
    """Process 1 compiles one kernel; process 2 loads it and compiles several more;
    process 3 loads them all.  Each result equals the one computed in this process."""
    first = "quantize:nearest:float32"
    # several closures of the per-mode kernel factory in both containers (the kernels whose
    # symbols collided), and a kernel of lpsim.ops; not every kernel, which cost a minute and a
    # half of compiles (each takes 5-10 s) and tests nothing more
    every = [f"quantize:{mode}:float32" for mode in ("toward_zero", "stochastic")]
    every += [f"quantize:{mode}:float64" for mode in ("nearest", "up")]
    every += ["dot:nearest:float32"]
    _run(tmp_path, first)
    second = _run(tmp_path, first, *every)
    third = _run(tmp_path, first, *every)
    assert second == third
    assert third == _in_this_process(first, *every)


def _in_this_process(*specs):
    """SCRIPT's results computed here (this process compiled or loaded its kernels alone)."""
    output, argv = io.StringIO(), sys.argv
    sys.argv = ["-c", *specs]
    try:
        with contextlib.redirect_stdout(output):
            exec(SCRIPT, {})
    finally:
        sys.argv = argv
    return json.loads(output.getvalue().strip().splitlines()[-1])


CONCURRENT = textwrap.dedent("""
    import gc, json
    import numpy as np
    import lpsim
    from numba.core.dispatcher import Dispatcher
    lpsim.quantize(np.linspace(-3, 3, 100), "fp(4,5)", "up")
    print(json.dumps(sorted(
        f"{d.py_func.__module__}.{d.py_func.__qualname__}{sig}" for d in gc.get_objects()
        if isinstance(d, Dispatcher) and d.py_func.__module__.startswith("lpsim")
        for sig, n in d._cache_misses.items() if n)))
""")


@pytest.mark.slow
def test_processes_started_together_compile_each_kernel_once(tmp_path):
    """Two processes on an empty cache want the same kernels at once: each kernel compiles
    in one of them while the other waits on its lock and loads it (lpsim.kernel_cache).
    Without the locks (LPSIM_COMPILE_LOCK=0) both compile most of them, so the sets meet."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path), "PYTHONPATH": ROOT}
    env.pop("LPSIM_COMPILE_LOCK", None)
    runs = [subprocess.Popen([sys.executable, "-c", CONCURRENT], env=env, cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    compiled = []
    for run in runs:
        out, err = run.communicate(timeout=600)
        assert run.returncode == 0, err[-3000:]
        compiled.append(set(json.loads(out.strip().splitlines()[-1])))
    assert compiled[0] | compiled[1], "nothing compiled: the cache was not empty"
    assert not compiled[0] & compiled[1], sorted(compiled[0] & compiled[1])[:5]
