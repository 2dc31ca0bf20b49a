"""A user's own property test, under hypothesis' default settings (200 ms deadline), after
the documented ``lpsim.warmup`` call: no kernel compiles or loads inside an example.  And the
suite's own draws: the same alone, in the full run and in any order (tests/conftest.py)."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import lpsim
from lpsim.testing import assert_rounded, representable
from conftest import child_pythonpath

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module", autouse=True)
def _warmed_up():
    """The documented warm-up, before this file's tests, in the worker that runs them (at
    import it ran in every worker's collection: each compiled these kernels once more)."""
    lpsim.warmup(["nearest", "stochastic"], ["float32"], ops=False, blocks=False,
                 optim=False, progress=False)


# the default profile's deadline, derandomized: the same examples in every run
USER = settings(settings.get_profile("default"), derandomize=True)


@USER
@given(x=hnp.arrays(np.float32, st.integers(0, 64), elements=st.floats(width=32)),
       seed=st.integers(0, 2 ** 64 - 1))
def test_a_user_style_property_meets_the_default_deadline(x, seed):
    y = lpsim.quantize(x, "bf16")
    assert_rounded(y, x, "bf16")
    z = lpsim.quantize(x, "bf16", "stochastic", seed=seed)
    assert_rounded(z, x, "bf16", "stochastic", seed=seed)
    assert np.array_equal(lpsim.quantize(y, "bf16"), y, equal_nan=True)


@USER
@given(v=representable("bf16", dtype=np.float32))
def test_representable_values_are_fixed_points(v):
    assert lpsim.quantize(np.float32(v), "bf16") == v


_DRAWS = r"""
import importlib, json, os, pathlib, pkgutil, sys
if os.environ["PROBE_FREEZE"] == "1":
    sys.path.insert(0, "tests")
    import conftest                     # the suite's profiles and its fixed constant pool
from hypothesis import given, settings, strategies as st
import lpsim
if os.environ["PROBE_IMPORT_ALL"] == "1":   # as a full run has, by the time a test runs
    import lpsim_cuda
    for package in (lpsim, lpsim_cuda):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            importlib.import_module(info.name)
drawn = []

@settings(derandomize=True, database=None, max_examples=300, deadline=None)
@given(st.integers(-2 ** 63, 2 ** 63 - 1), st.floats(), st.text(max_size=3))
def probe(i, f, s):
    drawn.append([i, repr(f), s])

probe()
print(json.dumps(drawn))
"""


def _draws(freeze, import_all):
    env = {**os.environ, "PYTHONPATH": child_pythonpath(), "PROBE_FREEZE": str(int(freeze)),
           "PROBE_IMPORT_ALL": str(int(import_all))}
    done = subprocess.run([sys.executable, "-c", _DRAWS], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_draws_do_not_depend_on_what_earlier_tests_imported():
    # hypothesis (6.131 on) draws constants from the local modules imported so far: a full
    # run, which has imported all of lpsim, drew what the file alone did not
    providers = pytest.importorskip("hypothesis.internal.conjecture.providers")
    if not hasattr(providers, "_get_local_constants"):
        pytest.skip("this hypothesis draws no constants from local modules")
    import conftest
    assert providers._get_local_constants() is conftest.LOCAL_CONSTANTS
    assert len(conftest.LOCAL_CONSTANTS.integers) > 20      # lpsim's, imported or not
    alone = _draws(freeze=True, import_all=False)
    assert _draws(freeze=True, import_all=True) == alone
    assert _draws(freeze=False, import_all=True) != _draws(freeze=False, import_all=False)
