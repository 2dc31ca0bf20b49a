"""Test set-up: lpsim_cuda kernels run under numba's CUDA simulator unless a GPU is asked for.

Set LPSIM_TEST_GPU=1 on a machine with a GPU to run the same tests on the real device.
"""

import hashlib
import os
import pathlib
import random
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def child_pythonpath() -> str:
    """PYTHONPATH for a test's child interpreter: this checkout first, then what the run had
    (a lent GPU machine puts the peers' wheels there; dropping them changes the numpy)."""
    return os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


def without_simulator(script: str) -> str:
    """The output of ``script`` run by a child interpreter in the checkout without numba's
    CUDA simulator (numba-cuda's real modules, no GPU needed: the route-flattening checks,
    tests/flat_stand_ins.py); its error output on failure."""
    import subprocess
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0", PYTHONPATH=child_pythonpath())
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _source_digest() -> str:
    """Hash of the package sources: numba's cache only watches each kernel's own file."""
    digest = hashlib.sha256()
    for path in sorted(ROOT.glob("lpsim*/**/*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


os.environ.setdefault("NUMBA_CACHE_DIR", str(ROOT / ".numba_cache" / _source_digest()))
if os.environ.get("LPSIM_TEST_GPU") != "1":
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
from numba.core import config  # noqa: E402  (a pytest plugin may have imported numba already)

config.reload_config()

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

# Each profile names its parent: hypothesis loads a "ci" profile of its own as the default
# where CI=true, and a profile registered without a parent inherits from the default of the
# moment, so "ci" had other settings (too_slow, print_blob) on CI than on a developer's
# machine, and "thorough" was derandomized there.
_DEFAULT = settings.get_profile("default")
settings.register_profile("ci", _DEFAULT, deadline=None, max_examples=100, derandomize=True,
                          print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", _DEFAULT, deadline=None, max_examples=1000,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _local_constants():
    """The constants of every lpsim and lpsim_cuda source file, in hypothesis' sorted sets."""
    from types import ModuleType

    from hypothesis.internal.constants_ast import constants_from_module
    from hypothesis.internal.conjecture import providers
    found = providers.Constants()
    for path in sorted(ROOT.glob("lpsim*/**/*.py")):
        module = ModuleType(".".join(path.relative_to(ROOT).with_suffix("").parts))
        module.__file__ = str(path)
        found |= constants_from_module(module)
    template = providers._local_constants

    def like(kind):
        pool = template.set_for_type(kind).copy()    # a SortedSet: a fixed order of draws
        pool.clear()
        pool.update(found.set_for_type(kind))
        return pool

    return providers.Constants(integers=like(int), floats=like(float), bytes=like(bytes),
                               strings=like(str))


def freeze_local_constants():
    """Hypothesis (6.131 on) sometimes draws a constant from the source of the local modules
    imported so far, so what a test drew depended on which lpsim modules earlier tests had
    imported: a full run drew inputs the file alone never did.  The pool is fixed here to the
    constants of all of lpsim's sources, whatever is imported, so that a derandomized test
    draws the same examples alone, in the full suite and in any order.  Returns the pool
    (None for a hypothesis without the feature)."""
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:
        return None
    if not hasattr(providers, "_get_local_constants"):
        return None
    frozen = _local_constants()
    providers._get_local_constants = lambda: frozen
    providers.CONSTANTS_CACHE.cache.clear()
    return frozen


LOCAL_CONSTANTS = freeze_local_constants()


@pytest.fixture(autouse=True)
def _same_global_random_state():
    """Each test starts from the same global random state, whatever ran before it: python's
    and numpy's global generators and torch's default one (where torch is imported), so a
    test that draws from them without a seed draws the same alone and in any order."""
    random.seed(0)
    np.random.seed(0)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(0)


def count_calls(monkeypatch, module, name: str) -> list:
    """Replace ``module.name`` by a wrapper that records its first argument on each call and
    return that record: tests assert which kernel route ran."""
    calls = []
    real = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)
    monkeypatch.setattr(module, name, counted)
    return calls


#: test files (by name prefix) whose slow part is the same few large compiles: the
#: optimizer's CPU step kernels and the block kernels.  Under pytest-xdist each group runs
#: in one worker, which compiles them once; spread file by file, every worker compiled each
#: of them (about a minute apiece)
SHARED_COMPILES = {"test_optim": "optim", "test_blocks": "blocks"}


def xdist_group_of(nodeid: str) -> str:
    """The worker group of a test: its file's shared-compile group, else its file."""
    name = pathlib.PurePath(nodeid.split("::", 1)[0]).stem
    return next((g for prefix, g in SHARED_COMPILES.items() if name.startswith(prefix)), name)


def pytest_xdist_make_scheduler(config, log):
    """Whole groups to a worker, by node id.  (xdist's own ``--dist loadgroup`` reads
    ``xdist_group`` marks into the node ids, which pytest 9.2 no longer lets it change: the
    marks were silently ignored and every file spread over every worker.)"""
    from xdist.scheduler import LoadScopeScheduling

    class SharedCompileScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return xdist_group_of(nodeid)
    return SharedCompileScheduling(config, log)


def pytest_runtest_logreport(report):
    """With LPSIM_TEST_DURATIONS set (benchmarks/gpu_session.sh sets it), each test's
    phases append "node id, phase, seconds, outcome" to that file as they end: a run
    stopped at its cap still says which files took its time (pytest's --durations and the
    junit report are written only at the end)."""
    path = os.environ.get("LPSIM_TEST_DURATIONS")
    # under xdist the controller gets each worker's report too: written there, once
    if path and "PYTEST_XDIST_WORKER" not in os.environ:
        with open(path, "a") as f:
            f.write(f"{report.nodeid}\t{report.when}\t{report.duration:.3f}\t"
                    f"{report.outcome}\n")
