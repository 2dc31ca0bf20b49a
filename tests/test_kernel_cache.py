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
