"""Imports only go down: the import-linter contracts hold, every module sits in a layer, the
page draws the contract as it is, and the backends that took a rounder refuse to run
without one (docs/architecture.rst)."""

import importlib
import importlib.util
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import lpsim

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _layers_script():
    spec = importlib.util.spec_from_file_location("docs_layers", ROOT / "docs" / "layers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        module._toml()
    except ImportError:
        pytest.skip("reading pyproject.toml needs tomllib (Python 3.11) or tomli")
    return module


def test_the_import_contracts_hold():
    """lint-imports, as .ci/run runs it, on this checkout: imports inside functions count."""
    pytest.importorskip("importlinter", reason="import-linter is in the test extra")
    done = subprocess.run(
        [sys.executable, "-c", "from importlinter.cli import lint_imports_command as run; run()",
         "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_every_module_sits_in_a_layer():
    """A new module (or package) is placed in the layers contract, not left out of it:
    only the root packages and lpsim.__main__ (which runs lpsim.cli) are in no layer."""
    layers = _layers_script().layers()
    listed = {name.strip() for _, layer in layers for name in layer.replace(":", "|").split("|")}
    modules = {".".join(path.relative_to(ROOT).with_suffix("").parts).replace(".__init__", "")
               for package in ("lpsim", "lpsim_cuda") for path in (ROOT / package).rglob("*.py")}
    outside = {"lpsim", "lpsim_cuda", "lpsim.__main__"}
    missing = sorted(m for m in modules - outside
                     if not any(m == name or m.startswith(name + ".") for name in listed))
    assert missing == [], f"put these in a layer of pyproject.toml's contract: {missing}"


def test_the_page_draws_the_contract():
    """docs/architecture.rst shows the layers contract of pyproject.toml (redraw with
    ``python docs/layers.py --write``)."""
    script = _layers_script()
    assert script.page_block() == script.block(script.diagram())


def test_the_diagram_names_its_rooms_and_columns():
    script = _layers_script()
    text = script.diagram([("front", "lpsim.quantize"), ("", "lpsim.blocks | lpsim_cuda.blocks"),
                           ("core", "lpsim.rounding")])
    assert text.splitlines() == [
        "           lpsim      lpsim_cuda",
        " │ front   quantize",
        " │         blocks  |  blocks",
        " ▼ core    rounding"]


def test_the_cpu_block_backend_refuses_a_cuda_array_by_name():
    """lpsim.blocks rounds on the CPU and never calls lpsim_cuda: a CUDA array is refused,
    naming lpsim.quantize, which dispatches it to lpsim_cuda.blocks."""

    class DeviceArray:
        __cuda_array_interface__ = {"shape": (32,), "typestr": "<f4", "data": (0, False),
                                    "version": 3}

    with pytest.raises(TypeError, match=r"rounds on the CPU.*lpsim\.quantize\(x, fmt"):
        lpsim.blocks.quantize(DeviceArray(), "mxfp4")


def test_quantize_fixed_takes_the_carrier_rounder():
    """lpsim.fixed is a backend below the front: quantize_fixed rounds through the rounder
    it is given (lpsim.quantize passes itself) and names the remedy without one."""
    from lpsim.fixed import quantize_fixed
    fmt = lpsim.fixed(8, 4)
    x = np.array([0.3, -9.0, 100.0])
    assert np.array_equal(quantize_fixed(x, fmt, round_with=lpsim.quantize),
                          lpsim.quantize(x, fmt))
    with pytest.raises(TypeError, match=r"lpsim\.quantize\(x, lpsim\.fixed\(wl, fl\)"):
        quantize_fixed(x, fmt)


def test_request_names_stay_where_users_import_them():
    """lpsim.request holds them; lpsim.quantize re-exports the same objects."""
    front = importlib.import_module("lpsim.quantize")      # the module, not the function
    from lpsim import request
    for name in ("plan", "Plan", "keys", "MAX_COUNTER", "check_offset", "check_sr_bits",
                 "check_dtype", "check_scalar_out", "as_container_array"):
        assert getattr(front, name) is getattr(request, name), name
    assert front._check_out is request.check_out
