"""A bare install imports every module, or the ImportError names the extra that provides it.

Missing packages are simulated in a fresh interpreter by a finder at the head of
``sys.meta_path`` that raises ModuleNotFoundError for them, as Python does for a package that
is not installed.
"""

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

#: every package lpsim may use beyond its core dependencies (numpy, numba, rich, tqdm)
OPTIONAL = ["scipy", "sklearn", "hypothesis", "torch", "matplotlib", "numba_cuda", "ml_dtypes",
            "qtorch", "gfloat", "torchao"]

_PROBE = r"""
import importlib, json, pathlib, sys, warnings
warnings.simplefilter("ignore")
class Missing:  # blocked packages, as if not installed (scipy probes sys.modules for None)
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Missing())
root = pathlib.Path({root!r})
names = sorted(".".join(path.relative_to(root).with_suffix("").parts).replace(".__init__", "")
               for package in ("lpsim", "lpsim_cuda") for path in (root / package).rglob("*.py")
               if path.name != "__main__.py")
results = {{}}
for name in {only!r} or names:
    try:
        importlib.import_module(name)
        results[name] = None
    except Exception as error:
        results[name] = [type(error).__name__, str(error)]
print(json.dumps(results))
"""


def _import_all(blocked, only=()):
    """Import lpsim's modules in a fresh interpreter with ``blocked`` packages missing."""
    code = _PROBE.format(blocked=list(blocked), root=str(ROOT), only=list(only))
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_bare_install_imports_every_module_or_names_the_extra():
    results = _import_all(OPTIONAL)
    assert "lpsim.quantize" in results and "lpsim.casgd.solvers" in results  # the walk found them
    for name in ("lpsim", "lpsim.quantize", "lpsim.ops", "lpsim.cli", "lpsim.reference"):
        assert results[name] is None, (name, results[name])      # the core needs no extra
    for name, outcome in results.items():
        if outcome is not None:
            kind, message = outcome
            assert kind == "ImportError" and 'pip install "lpsim[' in message, (name, outcome)


@pytest.mark.parametrize("module, blocked, extra", [
    ("lpsim.casgd", "scipy", "casgd"),
    ("lpsim.casgd.bound", "scipy", "casgd"),
    ("lpsim.testing", "hypothesis", "test"),
    ("lpsim.casgd.distributed", "torch", "torch"),
    ("lpsim_cuda", "numba_cuda", "cuda"),
])
def test_missing_package_names_its_extra(module, blocked, extra):
    kind, message = _import_all([blocked], only=[module])[module]
    assert kind == "ImportError"
    assert f'pip install "lpsim[{extra}]"' in message and repr(blocked) in message, message


def test_require_returns_the_module_when_present():
    from lpsim._extras import require
    import numpy
    assert require("numpy", extra="core") is numpy


_LAZY = r"""
import importlib, json, sys
blocked = {blocked!r}
class Missing:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Missing())
import lpsim
heavy = sorted(m for m in ("torch", "hypothesis", "sklearn", "lpsim.ops", "lpsim.optim")
               if m in sys.modules)
results = {{}}
for name in {names!r}:
    try:
        results[name] = getattr(lpsim, name) is importlib.import_module("lpsim." + name)
    except Exception as error:
        results[name] = [type(error).__name__, str(error)]
print(json.dumps([heavy, results]))
"""


def _lazy(names, blocked=()):
    code = _LAZY.format(blocked=list(blocked), names=list(names))
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_subpackages_are_attributes_after_a_plain_import():
    # the README's `import lpsim` then `lpsim.ops.matmul(...)` failed unless something had
    # imported lpsim.ops; `import lpsim` itself imports neither torch nor lpsim.ops (scipy:
    # numba imports it)
    import lpsim
    names = list(lpsim._CORE + lpsim._EXTRAS)
    heavy, results = _lazy(names)
    assert heavy == []
    assert results == {name: True for name in names}


def test_every_submodule_is_reachable_as_an_attribute():
    import lpsim
    modules = {path.stem if path.name != "__init__.py" else path.parent.name
               for path in (ROOT / "lpsim").glob("*/__init__.py")} | \
        {path.stem for path in (ROOT / "lpsim").glob("*.py")}
    # fixed, quantize and warmup are the functions of those names; _extras, __main__ private
    assert modules - {"__init__", "__main__", "_extras", "fixed", "quantize", "warmup"} == \
        set(lpsim._CORE + lpsim._EXTRAS)
    assert not set(lpsim._EXTRAS) & set(dir(lpsim)) - set(vars(lpsim))
    assert {"ops", "cli", "blocks"} <= set(dir(lpsim))
    with pytest.raises(AttributeError, match="module 'lpsim' has no attribute 'nope'"):
        lpsim.nope


@pytest.mark.parametrize("name, blocked, extra", [
    ("optim", "torch", "torch"), ("torch", "torch", "torch"), ("casgd", "scipy", "casgd"),
    ("testing", "hypothesis", "test")])
def test_a_missing_extra_is_named_on_attribute_access(name, blocked, extra):
    kind, message = _lazy([name], [blocked])[1][name]
    assert kind == "ImportError" and f'pip install "lpsim[{extra}]"' in message, message
