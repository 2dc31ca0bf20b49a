"""lpsim.warmup: what it prepares (the first calls of a program compile nothing after it),
which modes and containers it accepts, and the errors for the others."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import lpsim
from lpsim.warmup import jobs
from conftest import child_pythonpath

ROOT = pathlib.Path(__file__).resolve().parent.parent
HAS_TORCH = importlib.util.find_spec("torch") is not None


def _names(*args, **kwargs):
    return [name for name, _ in jobs(*args, **kwargs)]


def test_a_single_name_is_a_list_of_one():
    # a string is not taken letter by letter (modes 'n', 'e', ... or numpy's dtype 'o')
    assert _names("nearest", "float32") == _names(["nearest"], ["float32"])
    assert lpsim.warmup("up", np.float64, ops=False, blocks=False, optim=False,
                        progress=False) == 1
    assert _names(["up"], [np.dtype("float32"), "float64"], ops=False, blocks=False,
                  optim=False) == ["quantize up float32", "quantize up float64"]


def test_the_list_holds_what_programs_call_first():
    names = _names()
    assert len(names) == len(set(names))
    for mode in lpsim.MODES:
        for dtype in ("float32", "float64"):
            assert f"quantize {mode} {dtype}" in names
            assert f"quantize mxfp4 {mode} {dtype} with stats" in names
        assert f"quantize mxfp4 {mode} float32" in names
        assert f"quantize_blocks mxfp4 {mode} float32 elements" in names
    assert {"quantize nvfp4 nearest float32", "ops.matmul", "ops.matmul hopper-fp8",
            "quantize nearest float32 without stats"} <= set(names)
    steps = {"optim.AdamW bfloat16", "optim.AdamW float32", "optim.AdamW bfloat16 per tensor",
             "optim.SGD bfloat16", "optim.SGD float32", "optim.SGD bfloat16 per tensor"}
    assert steps <= set(names) if HAS_TORCH else not steps & set(names)
    assert not any(n.startswith(("optim.", "ops.", "quantize mxfp4", "quantize nvfp4"))
                   for n in _names(ops=False, blocks=False, optim=False))
    assert _names(["stochastic"], "float64", ops=False, optim=False) == [
        "quantize stochastic float64", "quantize mxfp4 stochastic float64 with stats",
        "quantize nvfp4 nearest float64"]


_FIRST_CALLS = r"""
import json, sys
import numpy as np
import lpsim
from numba.core.registry import CPUDispatcher

def compiled():
    # every numba kernel of lpsim and how many versions it holds (compiled or loaded)
    seen = {}
    for name, module in list(sys.modules.items()):
        if name.startswith("lpsim"):
            for attr, value in list(vars(module).items()):
                values = value.values() if isinstance(value, dict) else [value]
                for i, v in enumerate(values):
                    if isinstance(v, CPUDispatcher):
                        seen[f"{name}.{attr}[{i}]"] = len(v.overloads)
    return seen

lpsim.warmup(["nearest", "stochastic"], "float32", progress=False, optim=OPTIM)
before = compiled()
rng = np.random.default_rng(0)
x = rng.standard_normal((64, 256)).astype(np.float32)
lpsim.quantize(x, "mxfp4"), lpsim.quantize(x, "nvfp4"), lpsim.quantize(x, "bf16")
lpsim.quantize(x, "mxfp8", "stochastic", seed=1, sr_bits=8)
lpsim.quantize(x, lpsim.blocks.block("e4m3fn", 32, "e8m0fnu", "rceil"))
lpsim.ops.matmul(x[:8], x.T[:, :8], acc_fmt="bf16"), lpsim.ops.add(x, x, "bf16")
if OPTIM:
    import torch
    for cls, kw in ((lpsim.optim.AdamW, {}), (lpsim.optim.SGD, {"momentum": 0.9})):
        for dtype in (torch.bfloat16, torch.float32):
            p = torch.nn.Parameter(torch.randn(1000).to(dtype))
            p.grad = torch.randn(1000).to(dtype)
            for rounding in ("nearest", "stochastic"):
                cls([p], lr=1e-3, update_rounding=rounding, seed=0, **kw).step()
after = compiled()
print(json.dumps({k: (before.get(k, 0), n) for k, n in after.items() if n != before.get(k, 0)}))
"""


def test_after_warmup_the_first_calls_compile_nothing():
    # the first mxfp4 call and the first AdamW step used to compile for seconds after it
    code = _FIRST_CALLS.replace("OPTIM", str(HAS_TORCH))
    env = {**os.environ, "PYTHONPATH": child_pythonpath()}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=900)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {}


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(modes="nearst"), ValueError, r"unknown rounding modes \['nearst'\]"),
    (dict(modes=["nearest", 3, ["up"]]), ValueError, r"unknown rounding modes \[3, \['up'\]\]"),
    (dict(modes=5), TypeError, "modes=5 is a int"),
    (dict(containers="float16"), ValueError, r"containers \['float16'\] are not accepted"),
    (dict(containers=["float32", "o", 3.5, None]), ValueError,
     r"containers \['o', 3.5, None\] are not accepted; accepted: float32, float64"),
])
def test_bad_entries_are_named(kwargs, error, match):
    with pytest.raises(error, match=match):
        lpsim.warmup(ops=False, progress=False, **kwargs)
