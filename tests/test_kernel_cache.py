"""lpsim's kernels are cached on disk under a stamp of every lpsim source file, so that an
edit of one module (the shared rounding decision, say) never leaves another module's cached
kernel compiled with the old code."""

import json
import os
import shutil
import subprocess
import sys
import time

import lpsim
from lpsim import blocks, kernel_cache


def test_source_stamp_follows_every_file(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "a.py").write_text("x = 1\n")
    (pkg / "sub" / "b.py").write_text("y = 2\n")
    (pkg / "notes.txt").write_text("not source\n")
    first = kernel_cache.source_stamp([str(pkg)])
    assert [entry[0] for entry in first] == [os.path.join("pkg", "a.py"),
                                            os.path.join("pkg", "sub", "b.py")]
    (pkg / "notes.txt").write_text("still not source\n")
    assert kernel_cache.source_stamp([str(pkg)]) == first
    later = time.time() + 10
    os.utime(pkg / "sub" / "b.py", (later, later))               # touched: a new stamp
    assert kernel_cache.source_stamp([str(pkg)]) != first
    (pkg / "a.py").write_text("x = 10\n")                         # new size: a new stamp
    assert kernel_cache.source_stamp([str(pkg)])[0] != first[0]


def test_lpsim_kernels_are_stamped_by_the_whole_package():
    assert kernel_cache.INSTALLED and kernel_cache.install()     # idempotent
    assert kernel_cache.install_compile_locks()
    from numba.core.dispatcher import Dispatcher
    assert Dispatcher.compile.lpsim_locked and not hasattr(
        Dispatcher.compile.__wrapped__, "lpsim_locked")             # wrapped once
    from numba.core import caching
    names = [cls.__name__ for cls in caching.CacheImpl._locator_classes]
    assert sum(name.startswith("Lpsim") for name in names) == len(set(
        name for name in names if name.startswith("Lpsim")))      # installed once
    locator = blocks.finite_amax._cache._impl._locator
    assert type(locator).__name__.startswith("Lpsim")
    own, package = locator.get_source_stamp()
    assert package == kernel_cache.package_stamp()
    files = {entry[0] for entry in package}
    assert os.path.join("lpsim", "rounding.py") in files
    assert os.path.join("lpsim", "blocks", "amax.py") in files
    # a function outside lpsim keeps numba's own locator
    from numba import njit

    def outside(x):
        return x + 1
    foreign = njit(cache=True)(outside)
    assert not type(foreign._cache._impl._locator).__name__.startswith("Lpsim")


RUN = """
import json
import numpy as np
from lpsim import blocks
blocks.finite_amax(np.zeros(4, np.float32))
stats = blocks.finite_amax.stats
print(json.dumps([blocks.__file__, sum(stats.cache_hits.values()),
                  sum(stats.cache_misses.values())]))
"""


def test_an_edit_of_another_module_recompiles_a_cached_kernel(tmp_path):
    """A copy of lpsim, run three times in processes sharing one cache directory: the second
    loads the first's lpsim.blocks kernel; after an edit of lpsim/rounding.py alone (numba's
    own stamp is lpsim/blocks/amax.py's file), the third compiles it again."""
    src = tmp_path / "src"
    here = os.path.dirname(os.path.dirname(os.path.abspath(lpsim.__file__)))
    for package in kernel_cache.PACKAGES:
        if os.path.isdir(os.path.join(here, package)):
            shutil.copytree(os.path.join(here, package), src / package,
                            ignore=shutil.ignore_patterns("__pycache__"))
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(src))

    def run():
        out = subprocess.run([sys.executable, "-c", RUN], env=env, capture_output=True,
                             text=True, check=True, cwd=tmp_path)
        where, hits, misses = json.loads(out.stdout.strip().splitlines()[-1])
        assert where.startswith(str(src))
        return hits, misses

    assert run() == (0, 1)          # compiled and saved
    assert run() == (1, 0)          # loaded
    with open(src / "lpsim" / "rounding.py", "a") as f:
        f.write("# an edit\n")
    assert run() == (0, 1)          # stale: compiled again
    assert run() == (1, 0)


def test_a_forked_child_holds_no_copy_of_the_compile_lock(tmp_path):
    """A child forked while a kernel compiles (a DataLoader worker) once kept the parent's
    flock until it exited, so another process waited up to COMPILE_LOCK_WAIT for a kernel
    already saved; a record lock is the parent's alone, free once it closes its descriptor."""
    import multiprocessing
    path = str(tmp_path / "kernel.lock")
    fd = kernel_cache._acquire(path)
    assert fd is not None
    child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(30,))
    child.start()
    try:
        os.close(fd)                    # the parent's compile is done
        probe = ("import sys; from lpsim import kernel_cache as k; k.COMPILE_LOCK_WAIT = 0.5; "
                 f"sys.exit(0 if k._acquire({path!r}) is not None else 3)")
        done = subprocess.run([sys.executable, "-c", probe], timeout=120,
                              env={**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)})
        assert done.returncode == 0     # 3: the lock still held (by the sleeping child)
    finally:
        child.kill()
        child.join()


def test_a_truncated_cache_entry_is_compiled_again(tmp_path):
    """A truncated cache file (a full disk, a killed writer) made every later call raise
    numba's UnpicklingError; the entry is now dropped with a warning and the kernel compiled
    again, and the run after that loads it."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path), "PYTHONWARNINGS": "default"}
    call = ("import numpy as np, lpsim; print(lpsim.quantize(np.array([1.1], np.float32), "
            "'fp(5,4)', 'up').tolist())")
    runs = []
    for corrupt in (False, True, False):
        if corrupt:
            entries = list(tmp_path.rglob("cpu.round_up-*.nbc"))
            assert entries, sorted(p.name for p in tmp_path.rglob("*"))
            for entry in entries:
                entry.write_bytes(entry.read_bytes()[:200])
        runs.append(subprocess.run([sys.executable, "-c", call], env=env, capture_output=True,
                                   text=True, timeout=600))
    assert [r.returncode for r in runs] == [0, 0, 0], runs[1].stderr[-2000:]
    assert len({r.stdout for r in runs}) == 1
    assert "could not be read (UnpicklingError); it is dropped" in runs[1].stderr
    assert "could not be read" not in runs[2].stderr
