"""A static budget for each lpsim_cuda kernel on sm_90, read from ptxas and the SASS, no GPU.

Each case is compiled as a GPU run compiles it (numba-cuda's NVVM, for compute capability
9.0), assembled with ``ptxas -arch=sm_90 -v`` (registers, spills, stack frame) and
disassembled with ``nvdisasm`` (the machine code).  From the SASS: loops are found from
backward branches (a ``BRA`` to a label at a lower address); the measured loop is the
innermost one holding the case's global loads; its instructions per element, its 64-bit
integer instructions and the widest global load and store in it are reported.  A
memory-bound kernel reaches copy speed only with warps enough to hide latency (registers),
no local memory traffic, wide accesses and few enough instructions per element, so each
of those is held against a budget:

    python benchmarks/kernel_budget.py [--hot] [--only TEXT] [--json PATH] [--out TXT]

The instruction budget (H100 SXM, the card the project's GPU numbers come from):

    issue rate   132 SMs x 4 schedulers x 1 warp instruction/cycle x 32 threads x 1.755 GHz
                 = 2.97e13 thread instructions/s  (3.35e13 at the 1.98 GHz boost)
    memory       3.0 TB/s read + written (device copy measured 2.73-2.88 TB/s on the
                 project's H100: results/quantize-gpu.txt, optim-gpu.txt, profile-gpu.txt;
                 rounded up, which tightens the budget)
    at copy speed a kernel moving B bytes per element must issue each element's
    instructions in 2.97e13 / (3.0e12 / B) = 9.88 B thread instructions
    budget       half of that, rounded down: latency hiding needs issue slots left over,
                 and FP64 or 64-bit multiplies take more than one slot

    kind        bytes/element                               at copy speed   budget
    quantize    8   (float32 in, float32 out)                      79          39
    packed      6   (float32 in, bf16 out: fp32 -> bf16 store;     59          29
                     bf16 in, float32 out)
    halves      4   (bf16 in, bf16 out)                            39          19
    optim       14  (per parameter, bf16 SR AdamW)                138          69
    blocks      8   (float32 in, float32 out)                      79          39
    quantize64, blocks64: 16 (float64 in and out)                 158          79
    reads       4   (float32 in: NVFP4's tensor amax pass)          39          19

The integer pipe: each scheduler of an sm_90 SM has 16 INT32 lanes against 32 float32 ones,
so the integer instructions (logic, shifts, integer adds and compares, selects, byte
permutes, predicate logic, float compares, and the packed conversion F2FP: :data:`ALU`)
issue one warp instruction every other cycle, and a loop bound by them runs at half the
issue rate.  ``alu/e`` counts them on the straight path, held to half the budget above
(quantize 19, packed 14, halves 9, optim 34, blocks 19).  IMAD and its kin issue on the
float32 pipe's heavy half and are not counted.

Registers: an SM has 65536; the launch (lpsim_cuda.launch) runs 128-thread blocks and aims
at 8 resident per SM, which 64 registers per thread allow (65536 / (64 x 128)); the
optimizer may take 96 (5 blocks).  Spills and local memory: none.

The instruction counts are static.  ``instr/e`` takes every instruction of the loop body
once, cold branches (round_bits, special values) included and inner loops counted once;
subroutines reached by CALL (the divide slow paths) are not counted, only the calls.
``straight`` is the same count of the kernel compiled again, in a process of its own, with
the functions only its fallbacks call replaced by stubs (:func:`stub_cold_paths`): the
instructions one pass issues on data that stays on the straight path (finite values in the
format's range; blocks without NaN or inf), the number held to the budget.

Needs the ``test`` extra (numba-cuda; torch and pytest for the optimizer's arguments, taken
from tests/test_optim_cuda.py) and the ``ptx`` extra (NVVM; nvidia-cuda-nvcc-cu12 carries
ptxas, nvidia-cuda-nvdisasm nvdisasm); exits 3 when NVVM, ptxas or nvdisasm is missing.
To add a kernel, add one ``Case`` to ``CASES``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Callable

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))       # its sibling, however it was loaded
from sass_reading import measure, resources     # noqa: E402

COMMAND = "python benchmarks/kernel_budget.py"

SMS, SCHEDULERS, WARP, CLOCK_HZ = 132, 4, 32, 1.755e9
ISSUE = SMS * SCHEDULERS * WARP * CLOCK_HZ                 # thread instructions per second
BANDWIDTH = 3.0e12                                         # bytes read + written per second
SAFETY = 0.5
#: bytes read + written per element (per parameter for the optimizer)
KINDS = {"quantize": 8, "packed": 6, "halves": 4, "optim": 14, "blocks": 8, "quantize64": 16,
         "blocks64": 16, "reads": 4}
#: registers per thread: 8 resident 128-thread blocks per SM, 5 for the optimizer
REGISTERS = {"optim": 96}
REGISTER_LIMIT = 64


def budget(kind: str) -> int:
    """Instructions per element that the SMs can issue at copy speed, times SAFETY."""
    return int(ISSUE / (BANDWIDTH / KINDS[kind]) * SAFETY)


def alu_budget(kind: str) -> int:
    """Integer-pipe instructions per element at copy speed, times SAFETY: half of
    :func:`budget` (the INT32 lanes issue a warp instruction every other cycle)."""
    return budget(kind) // 2


@dataclasses.dataclass(frozen=True)
class Case:
    """One row: a kernel specialisation and how to read its main loop.

    name: begins with the kernel family (quantize, optim, blocks).  kind: a key of KINDS.
    hot: run on the training hot path (tests/test_kernel_budget.py holds these).
    kernel: () -> (py_func, numba argument types[, launch bounds]), called only when the case
    is compiled.
    elements: elements one pass of the measured loop handles (0: one per global load in it).
    loads: which global loads (of those inside loops) the measured loop must hold: "all";
    for a kernel with a deterministic and a stochastic loop, "philox" (loads in a loop
    whose own or enclosing body draws Philox words) or "plain" (the others); "wide" (loads
    of 8 bytes or more: a kernel whose element-wise fallback has loops of its own);
    "stores" (the loop holding every store of 8 bytes or more: a kernel that also loads
    8-byte words of a table in loops around and beside the measured one); "most" (the loop
    holding the most: a main loop the compiler unrolled, beside its remainder loop).
    cold_loops: loops nested in the measured one are a fallback the hot path skips (the
    optimizer's quads that leave the straight path); their instructions are not counted.
    outer: elements per pass of the loop enclosing the measured one, which share that
    loop's own instructions (a Philox block's words); 0: the enclosing loop is not counted.
    """
    name: str
    kind: str
    hot: bool
    kernel: Callable[[], tuple]
    elements: int = 1
    loads: str = "all"
    outer: int = 0
    cold_loops: bool = False


def _patched_device():
    """numba asks the current device for its compute capability even for compile_ptx."""
    import types
    from unittest import mock
    import numba.cuda.dispatcher as dispatcher
    return mock.patch.object(dispatcher, "get_current_device",
                             lambda: types.SimpleNamespace(compute_capability=(9, 0)))


def _quantize(bits: str, out: str, count: bool):
    """lpsim_cuda.quantize's kernel on container bits ``bits`` written as ``out``."""
    def build():
        import importlib
        import numba
        from numba import types as T
        from lpsim.rounding import Params
        from lpsim.storage import NO_PACKING
        kernels = importlib.import_module("lpsim_cuda.quantize").KERNELS
        b, o = getattr(T, bits), getattr(T, out)
        params = numba.typeof(Params(*[0] * len(Params._fields)))
        packing = T.UniTuple(T.int64, len(NO_PACKING))
        return kernels[count].py_func, (b[::1], o[::1], T.int64, T.int64, params, T.int64,
                                        T.int64, T.int64, T.int64, T.int64, packing,
                                        T.int64[::1])
    return build


def _specialised(name: str, rounding: str, storage: str | None = None, count: bool = False,
                 half: int = 0):
    """lpsim_cuda.specialised's kernel for format ``name``, ``rounding`` and packed
    ``storage`` (None: float32 out), reading float32 or (``half``) 16-bit codes."""
    def build():
        import importlib
        import numpy as np
        from numba.core.sigutils import normalize_signature
        from lpsim.formats import parse_format
        from lpsim.quantize import plan
        from lpsim.storage import NO_PACKING, storage_params
        S = importlib.import_module("lpsim_cuda.specialised")
        fmt = parse_format(name)
        k = plan(fmt, rounding, np.float32, seed=1).k
        sp = NO_PACKING if storage is None else storage_params(fmt, storage, np.float32)
        width = 4 if sp.width == 0 else sp.width // 8
        kernel = S.kernel(fmt, rounding, k, sp, count, half)
        return (kernel.py_func,
                normalize_signature(S.kernel_signature(width, 2 if half else 4, count))[0],
                kernel.targetoptions.get("launch_bounds"))
    return build


def _block_groups(name: str, rounding: str, count: bool = False, block: int = 0,
                  half: int = 0):
    """lpsim_cuda.block_groups's float32 kernel for block format ``name`` and ``rounding``
    (``count``: the kernel that adds the call's block counters; ``block``: blocks of that
    many elements, a 2-D tile's, with a per-tensor scale found on the device; ``half``: the
    kernel reading bfloat16 or float16 codes, lpsim.storage's kind)."""
    def build():
        import dataclasses
        import importlib
        import numpy as np
        from numba.core import types
        from lpsim.blocks import parse_block_format
        from lpsim.quantize import plan
        G = importlib.import_module("lpsim_cuda.block_groups")
        bfmt = parse_block_format(name)
        if block:
            bfmt = dataclasses.replace(bfmt, block=block)
        request = plan(bfmt.saturating_element, rounding, np.float32, seed=1)
        device_pts = bool(block and bfmt.tensor_scale)
        kernel = G.kernel(bfmt, request.mode, request.k, request.params.W, device_pts, half,
                          count)
        bits = types.int16[::1] if half else types.int32[::1]
        return kernel.py_func, (bits,) + G._signature(count or device_pts)[1:]
    return build


def _optim(cls: str, dtype: str, wide: bool = False, ahead: bool = False, **kw):
    """lpsim_cuda.optim's kernel for the configuration tests/test_optim_cuda.py steps
    (``wide``: the kernel of aligned parameters; ``ahead``: with the next quad loaded
    ahead, lpsim_cuda.optim.LOAD_AHEAD)."""
    def build():
        import importlib
        import numba
        import numpy as np
        import torch
        import lpsim.optim
        sys.path.insert(0, str(ROOT / "tests"))
        from test_optim_cuda import inputs
        arrays, kargs, setup = inputs(getattr(lpsim.optim, cls), getattr(torch, dtype), kw,
                                      37, 0)
        kinds, hp, ints, keys, offset = kargs
        O = importlib.import_module("lpsim_cuda.optim")
        saved, O.LOAD_AHEAD = O.LOAD_AHEAD, ahead
        try:
            kernel = O.optim_kernel(tuple(kinds), tuple(ints), setup.pw, setup.pc, setup.ps,
                                    tuple(setup.sp16), wide)
        finally:
            O.LOAD_AHEAD = saved
        args = O.kernel_arguments(arrays, hp, keys, offset, np.zeros(7, np.int64))
        if wide == "set":           # a set's table, the element types, hp, seed, keys, ...
            table = np.zeros((3, O.COLUMNS), np.int64)
            args = (table, arrays[0], arrays[1], arrays[2], arrays[5], hp, keys[:3],
                    args[-3], np.zeros(7, np.int64), 1, O.TILE_PASSES)
        return (kernel.py_func, tuple(numba.typeof(a) for a in args),
                kernel.targetoptions.get("launch_bounds"))
    return build


def _hadamard(n: int):
    """lpsim_cuda.hadamard's kernel for runs of ``n`` tokens (a wgrad operand's RHT)."""
    def build():
        import importlib
        from numba import types
        kernel = importlib.import_module("lpsim_cuda.hadamard").transposed_kernel(n)
        matrix = types.float32[:, ::1]
        return kernel.py_func, (matrix, types.float32[::1], matrix)
    return build


def _amax():
    """lpsim_cuda.tensor_amax's kernel of float32 bits: NVFP4's first pass over a tensor
    whose scale is found on the device."""
    def build():
        import importlib
        from numba import types
        kernel = importlib.import_module("lpsim_cuda.tensor_amax").amax32_kernel
        return kernel.py_func, (types.int32[::1], types.int64[::1])
    return build


def _blocks(name: str, dtype: str):
    """lpsim_cuda.blocks's kernel for block format ``name`` on ``dtype`` values."""
    def build():
        import importlib
        import numba
        import numpy as np
        from lpsim.blocks.counters import BLOCK_COUNTERS
        from lpsim.blocks.decisions import _element_params, block_params
        from lpsim.blocks.formats import parse_block_format
        from lpsim.philox import LANES
        from lpsim.quantize import plan
        from lpsim.rounding import kernel_params
        bfmt = parse_block_format(name)
        request = plan(bfmt.saturating_element, "stochastic", np.dtype(dtype), seed=1)
        x = np.zeros((2, 64), dtype)
        args = (x, x.copy(), np.zeros((2, 64)), np.zeros((2, 4)),
                np.zeros((2, 4, len(BLOCK_COUNTERS)), np.int64), request.mode, request.k,
                _element_params(bfmt.saturating_element, request.params.W),
                kernel_params(bfmt.scale, np.float64), block_params(bfmt, 1.0),
                request.seed_lo, request.seed_hi, request.stream, request.offset,
                LANES[np.dtype(dtype).itemsize], True, True)
        kernel = importlib.import_module("lpsim_cuda.blocks")._blocks_kernel
        return kernel.py_func, tuple(numba.typeof(a) for a in args)
    return build


CASES = [
    # one kernel, two loops: nearest rounds one element a pass; stochastic rounds one lane a
    # pass of an inner loop whose enclosing pass draws a Philox block (4 float32, 2 float64)
    Case("quantize f32 nearest", "quantize", False, _quantize("int32", "int32", False),
         loads="plain"),
    Case("quantize f32 stochastic", "quantize", False, _quantize("int32", "int32", False),
         loads="philox", outer=4),
    Case("quantize f32->bf16 nearest", "packed", False, _quantize("int32", "int16", False),
         loads="plain"),
    Case("quantize f32->bf16 stochastic", "packed", False,
         _quantize("int32", "int16", False), loads="philox", outer=4),
    Case("quantize f64 nearest", "quantize64", False, _quantize("int64", "int64", False),
         loads="plain"),
    Case("quantize f64 stochastic", "quantize64", False, _quantize("int64", "int64", False),
         loads="philox", outer=2),
    Case("quantize f32 nearest counted", "quantize", False, _quantize("int32", "int32", True),
         loads="plain"),
    Case("quantize f32 stochastic counted", "quantize", False,
         _quantize("int32", "int32", True), loads="philox", outer=4),
    Case("quantize f64 nearest counted", "quantize64", False,
         _quantize("int64", "int64", True), loads="plain"),
    Case("quantize f64 stochastic counted", "quantize64", False,
         _quantize("int64", "int64", True), loads="philox", outer=2),
    # lpsim_cuda.specialised: format and mode compiled in, four elements (one 16-byte load,
    # one Philox block) per thread and pass; float32 calls of the training formats without
    # stats or packing take it: the hot path
    Case("quantize specialised bf16 nearest", "quantize", True,
         _specialised("bf16", "nearest"), elements=4),
    Case("quantize specialised bf16 stochastic", "quantize", True,
         _specialised("bf16", "stochastic"), elements=4),
    Case("quantize specialised e4m3fn stochastic", "quantize", False,
         _specialised("e4m3fn", "stochastic"), elements=4),
    Case("quantize specialised f32->bf16 stochastic", "packed", False,
         _specialised("bf16", "stochastic", "bfloat16"), elements=4),
    Case("quantize specialised bf16 stochastic counted", "quantize", False,
         _specialised("bf16", "stochastic", count=True), elements=4),
    # a bfloat16 tensor's codes read directly (one 8-byte load of four): an fp8 cast of a
    # bf16 activation, to float32 values or kept in bf16
    Case("quantize specialised e4m3fn nearest", "quantize", True,
         _specialised("e4m3fn", "nearest"), elements=4),
    Case("quantize specialised bf16-in e4m3fn nearest", "packed", False,
         _specialised("e4m3fn", "nearest", half=1), elements=4),
    Case("quantize specialised bf16-in e4m3fn->bf16 nearest", "halves", False,
         _specialised("e4m3fn", "nearest", "bfloat16", half=1), elements=4),
    # aligned parameters (the hot path): a pass of the grid-stride loop steps one quad,
    # every array read by one wide load, the lanes straight-line (lpsim_cuda.optim); the
    # configuration benchmarks/bench_optim.py times against torch: bf16 weights, gradients
    # and moments, the update rounded stochastically, the moments to nearest
    Case("optim AdamW bf16 SR update", "optim", True,
         _optim("AdamW", "bfloat16", wide=True, update_rounding="stochastic"), elements=4,
         loads="wide", cold_loops=True),
    # a set's one launch (lpsim_cuda.optim.Table): a pass steps one quad of the tensor its
    # tile found in the table; the tile's own work (the search, a loop of log2(tensors)
    # passes counted once, and reading the row) is shared by its TILE_PASSES (8) quads
    Case("optim AdamW bf16 SR update set", "optim", True,
         _optim("AdamW", "bfloat16", wide="set", update_rounding="stochastic"), elements=4,
         loads="stores", cold_loops=True, outer=32),
    # the moments rounded stochastically too: two more Philox blocks a quad
    Case("optim AdamW bf16 stochastic", "optim", False,
         _optim("AdamW", "bfloat16", wide=True, update_rounding="stochastic",
                state_rounding="stochastic"), elements=4, loads="wide", cold_loops=True),
    Case("optim AdamW bf16 stochastic set", "optim", False,
         _optim("AdamW", "bfloat16", wide="set", update_rounding="stochastic",
                state_rounding="stochastic"), elements=4, loads="stores", cold_loops=True,
         outer=32),
    Case("optim AdamW bf16 stochastic ahead", "optim", False,
         _optim("AdamW", "bfloat16", wide=True, ahead=True, update_rounding="stochastic",
                state_rounding="stochastic"), elements=4, loads="wide", cold_loops=True),
    Case("optim AdamW bf16 nearest", "optim", False,
         _optim("AdamW", "bfloat16", wide=True), elements=4, loads="wide", cold_loops=True),
    # a parameter whose quads are not aligned: a pass of the grid-stride loop steps one quad
    # (its Philox words), the inner loop one parameter of it
    Case("optim AdamW bf16 stochastic unaligned", "optim", False,
         _optim("AdamW", "bfloat16", update_rounding="stochastic",
                state_rounding="stochastic"), outer=4),
    # a pass of the group loop: one element per thread for blocks of up to 32 elements
    # (counted calls, other layouts)
    Case("blocks mxfp8_e4m3 f32", "blocks", False, _blocks("mxfp8_e4m3", "float32")),
    # lpsim_cuda.block_groups: a block per B/4 lanes, four elements (one 16-byte load) each;
    # float32 calls without stats along a contiguous last axis take it: the hot path
    Case("blocks groups mxfp8_e4m3 nearest", "blocks", True,
         _block_groups("mxfp8_e4m3", "nearest"), elements=4),
    Case("blocks groups nvfp4 nearest", "blocks", True, _block_groups("nvfp4", "nearest"),
         elements=4),
    # NVFP4's 16 x 16 weight tiles (simulated training's 2-D blocks): a lane holds two quads
    # and reads them twice; the tensor scale found on the device
    Case("blocks groups nvfp4 16x16 nearest", "blocks", False,
         _block_groups("nvfp4", "nearest", block=256), elements=8),
    # a bfloat16 tensor's codes read directly (one 8-byte load of four), float32 out
    Case("blocks groups mxfp8_e4m3 nearest bf16-in", "packed", False,
         _block_groups("mxfp8_e4m3", "nearest", half=1), elements=4),
    # simulated training's MXFP8 (TransformerEngine's RCEIL scales: one float32 division a
    # block, the scale from the quotient's bits)
    Case("blocks groups mxfp8 rceil nearest", "blocks", False,
         _block_groups("block(e4m3fn, 32, e8m0fnu, 'rceil')", "nearest"), elements=4),
    Case("blocks groups mxfp4 stochastic", "blocks", False,
         _block_groups("mxfp4", "stochastic"), elements=4),
    # the counting variant (lpsim.quantize with stats, simulated training's telemetry)
    Case("blocks groups mxfp8_e4m3 nearest counted", "blocks", False,
         _block_groups("mxfp8_e4m3", "nearest", count=True), elements=4),
    # NVFP4's recipe with its telemetry: activations to nearest, gradients stochastic
    Case("blocks groups nvfp4 nearest counted", "blocks", False,
         _block_groups("nvfp4", "nearest", count=True), elements=4),
    Case("blocks groups nvfp4 stochastic counted", "blocks", False,
         _block_groups("nvfp4", "stochastic", count=True), elements=4),
    Case("blocks mxfp8_e4m3 f64", "blocks64", False, _blocks("mxfp8_e4m3", "float64")),
    # a wgrad operand's RHT along the tokens into the transpose (lpsim_cuda.hadamard): a
    # thread's run of 16 (NVFP4) or 32 (MXFP4) tokens of one feature, in registers
    Case("blocks wgrad rht 16 transposed", "blocks", False, _hadamard(16), elements=0,
         loads="most"),
    Case("blocks wgrad rht 32 transposed", "blocks", False, _hadamard(32), elements=0,
         loads="most"),
    # NVFP4's tensor amax (lpsim_cuda.tensor_amax): four elements a pass by one 16-byte
    # load, read only, before the blocks' pass reads the tensor again (ptxas unrolls its
    # loop four times: 16 elements a pass of the measured loop)
    Case("blocks tensor amax f32", "reads", False, _amax(), elements=16, loads="most"),
]


# --- the tools -------------------------------------------------------------------------

def tool(name: str) -> str | None:
    """``name`` on the PATH, else in an installed nvidia wheel (bin/<name> below nvidia/):
    nvidia-cuda-nvcc-cu12 carries ptxas, nvidia-cuda-nvdisasm nvdisasm."""
    found = shutil.which(name)
    if found:
        return found
    try:
        import nvidia
    except ImportError:
        return None
    for folder in nvidia.__path__:
        for candidate in sorted(pathlib.Path(folder).rglob(f"bin/{name}")):
            if os.access(candidate, os.X_OK):
                return str(candidate)
    return None


def version(path: str) -> str:
    """'13.0' from a CUDA tool's --version."""
    out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
    found = re.search(r"release (\d+\.\d+)", out)
    return found.group(1) if found else "?"


def compile_case(py_func, signature, ptxas: str, nvdisasm: str,
                 launch_bounds=None) -> tuple[str, str]:
    """(ptxas -v's report, SASS) of py_func compiled for sm_90 (with the kernel's own
    launch bounds, which cap its registers)."""
    from numba import cuda
    with _patched_device():
        ptx, _ = cuda.compile_ptx(py_func, signature, cc=(9, 0), launch_bounds=launch_bounds)
    with tempfile.TemporaryDirectory() as folder:
        path = pathlib.Path(folder) / "kernel.ptx"
        path.write_text(ptx)
        cubin = str(path.with_suffix(".cubin"))
        done = subprocess.run([ptxas, "-arch=sm_90", "-v", str(path), "-o", cubin],
                              capture_output=True, text=True, check=True)
        sass = subprocess.run([nvdisasm, "-c", cubin], capture_output=True, text=True,
                              check=True).stdout
    return done.stderr, sass


def row_of(case: Case, report: str, sass: str) -> dict:
    """The table's row: resources, loop facts, the budgets and the rules it breaks."""
    row = {"kernel": case.name, "kind": case.kind, "hot": case.hot,
           "elements_per_iteration": case.elements, "outer_elements": case.outer,
           **resources(report),
           **measure(sass, case)}
    row["local_bytes"] = row["stack_bytes"] + row["local_op_bytes"]
    row["register_limit"] = REGISTERS.get(case.kind, REGISTER_LIMIT)
    row["budget"] = budget(case.kind)
    row["alu_budget"] = alu_budget(case.kind)
    row["fails"] = [rule for rule, broken in (
        ("registers", row["registers"] > row["register_limit"]),
        ("spills", row["spill_bytes"] > 0), ("local", row["local_bytes"] > 0),
        ("instructions", row["loop_instructions_per_element"] > row["budget"]),
        ("alu", row["loop_alu_per_element"] > row["alu_budget"])) if broken]
    return row


# --- the table -------------------------------------------------------------------------

def header(ptxas: str, nvdisasm: str, command: str) -> list[str]:
    import numba_cuda
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True,
                            text=True, cwd=ROOT).stdout.strip() or "?"
    lines = [f"# lpsim_cuda kernel budget, {datetime.date.today()}, lpsim {commit}",
             f"# command: {command}",
             f"# device: sm_90 via NVVM (numba-cuda {numba_cuda.__version__}), ptxas "
             f"{version(ptxas)} / nvdisasm {version(nvdisasm)}, no GPU",
             f"# budget: {SMS} SMs x {SCHEDULERS} x {WARP} threads x {CLOCK_HZ / 1e9:g} GHz = "
             f"{ISSUE:.3g} thread instructions/s; {BANDWIDTH / 1e12:.1f} TB/s; x {SAFETY:g}"]
    lines.append("# instructions/element: " + ", ".join(
        f"{kind} {nbytes} B -> {budget(kind)}" for kind, nbytes in KINDS.items()))
    lines.append(f"# registers <= {REGISTER_LIMIT} (optim {REGISTERS['optim']}); no spills, no "
                 "local memory; instr/e = static SASS count of the measured loop, per element; "
                 "straight = the same with the fallbacks stubbed (held to the budget); alu/e = "
                 "its integer-pipe instructions (held to half the budget)")
    return lines


COLUMNS = (("kernel", 38, "kernel"), ("hot", 3, "hot"), ("registers", 4, "regs"),
           ("spill_bytes", 5, "spill"), ("local_bytes", 5, "local"),
           ("loop_instructions", 5, "loop"), ("elements_per_iteration", 4, "elem"),
           ("outer_elements", 5, "outer"),
           ("loop_instructions_per_element", 7, "instr/e"),
           ("straight_instructions_per_element", 8, "straight"), ("budget", 6, "budget"),
           ("straight_alu_per_element", 5, "alu/e"), ("alu_budget", 3, "alu"),
           ("loop_int64_per_element", 6, "int64/e"), ("loop_calls", 5, "calls"),
           ("load_bits", 4, "ld"), ("store_bits", 4, "st"), ("fails", 0, "fails"))


def table(rows: list[dict]) -> list[str]:
    def cell(value, size, first):
        if isinstance(value, bool):
            value = "yes" if value else ""
        elif value is None:
            value = "-"
        elif isinstance(value, list):
            value = ",".join(value) or "-"
        return f"{value:<{size}}" if first else f"{value:>{size}}"
    lines = [" ".join(cell(title, size, i == 0 or not size)
                      for i, (_, size, title) in enumerate(COLUMNS))]
    for row in rows:
        lines.append(" ".join(cell(row.get(key, ""), size, i == 0 or not size)
                              for i, (key, size, _) in enumerate(COLUMNS)))
    return lines


def stub_cold_paths() -> None:
    """Replace the functions only a kernel's fallback calls by stubs of the same types, before
    anything compiles: the kernels then hold their straight path alone, whose count is what
    a run on typical data issues per element.  Fallbacks: round_bits (what the straight
    rounding declines: NaN, inf, overflow, container subnormals); the block kernels' exact
    element step and their float64 steps, which only blocks holding NaN or inf (or
    elements the float32 steps decline) take, the float64 scale of a block whose
    largest magnitude is not a float32 normal (all zeros, say), a counted kernel's tally of
    a NaN block and its element step for a block whose largest quotient overflows float32
    (only under a tiny given tensor scale), and the optimizer's wide kernel's step of a
    quad one of whose lanes declined (NaN, inf, overflow, subnormals)."""
    import importlib
    import numpy as np
    from numba.extending import register_jitable
    from lpsim.word32 import word

    @register_jitable
    def round_bits(bits, mode, r, k, p):
        return np.int64(bits), np.int64(0)

    @register_jitable
    def element_exact(xv, recip, s, mode, r, k, p, bp):
        return np.int64(0), np.float64(xv), np.int64(0)

    @register_jitable
    def element_fast(xv, recip, s, mode, r, k, p, bp):
        return np.int64(0), np.float64(xv), np.int64(1), np.int64(0)

    @register_jitable
    def block_scale(amax, bp, sp):
        return np.float64(amax), np.int64(0)

    @register_jitable
    def overflowed_element(xv, rc, s32, s, r, bp, mode, k, p32, p, c):
        zero = word(np.int32(0))
        return np.float32(xv), (zero, zero, zero, zero), zero, c

    @register_jitable
    def tally_nonfinite(c, b):
        return c

    # in every module that holds the function, not only where it is defined: a kernel calls
    # the name its own module imported
    for name, stub in (("round_bits", round_bits), ("element_exact", element_exact),
                       ("element_fast", element_fast), ("block_scale", block_scale)):
        _replace_everywhere(name, stub)
    # the counted block kernels' cold steps, under these names wherever they are imported
    # (overflowed_element is another name of element32, which stays)
    counting = importlib.import_module("lpsim_cuda.block_counting")
    for name, stub in (("overflowed_element", overflowed_element),
                       ("tally_nonfinite", tally_nonfinite)):
        _replace_everywhere(name, stub, getattr(counting, name))

    @register_jitable
    def declined_quad(q, n, offset, wb, gb, mb, vb, cb, rb, kinds, hp, ints, keys, pw, pc, ps,
                      sp16, counts):
        counts[0] += 1

    importlib.import_module("lpsim_cuda.optim")._general_quad = declined_quad


def _replace_everywhere(name: str, stub, original=None) -> None:
    """Bind ``name`` to ``stub`` in every lpsim and lpsim_cuda module that holds the
    original (imported there or defined there) under that name; ``original``: the object,
    where it is not the function of that name (an alias)."""
    import importlib
    import pkgutil
    import lpsim
    import lpsim_cuda
    modules = []
    for package in (lpsim, lpsim_cuda):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            try:            # a module whose extra is missing holds no kernel step either
                modules.append(importlib.import_module(info.name))
            except ImportError:
                continue
    if original is None:
        original = next(vars(m)[name] for m in modules if vars(m).get(name) is not None
                        and getattr(vars(m)[name], "__name__", "") == name)
    held = [module for module in modules if vars(module).get(name) is original]
    if not held:            # a stub that replaces nothing leaves a cold path in the count
        raise RuntimeError(f"no lpsim module holds {name} to stub")
    for module in held:
        setattr(module, name, stub)


def _straight_rows(argv: list[str]):
    """Start this script with --straight on the same cases (a process of its own, so that no
    kernel compiled with the real fallbacks is reused); the caller collects its rows."""
    out = tempfile.NamedTemporaryFile(suffix=".json", delete=False)
    out.close()
    # a cache directory of its own: a CPU kernel it compiled with the stubs must never be
    # saved where another process (a test run's workers) would load it
    cache = tempfile.mkdtemp(prefix="lpsim-straight-cache-")
    env = dict(os.environ, NUMBA_CACHE_DIR=cache, NUMBA_ENABLE_CUDASIM="0")
    process = subprocess.Popen([sys.executable, __file__, "--straight", "--json", out.name,
                                *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True, cwd=ROOT, env=env)
    process.cache = cache
    return process, pathlib.Path(out.name)


def _merge_straight(rows: list[dict], process, path: pathlib.Path) -> None:
    """Add each row's straight-path counts (and the instruction and ALU rules on them) from the
    --straight process; a row it could not measure keeps the static count's verdict."""
    _, err = process.communicate()
    if getattr(process, "cache", None):
        shutil.rmtree(process.cache, ignore_errors=True)
    if process.returncode:
        raise RuntimeError(f"the --straight run failed: {err[-2000:]}")
    straight = {r["kernel"]: r for r in json.loads(path.read_text())["rows"]}
    path.unlink()
    for row in rows:
        found = straight[row["kernel"]]
        count = row["straight_instructions_per_element"] = \
            found["loop_instructions_per_element"]
        alu = row["straight_alu_per_element"] = found.get("loop_alu_per_element")
        if count is None:                   # not measured: the static verdicts stay
            continue
        row["fails"] = [rule for rule in row["fails"] if rule not in ("instructions", "alu")]
        if count > row["budget"]:
            row["fails"].append("instructions")
        if alu is not None and alu > row["alu_budget"]:
            row["fails"].append("alu")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hot", action="store_true", help="only the hot-path kernels")
    parser.add_argument("--only", help="only the cases whose name contains this")
    parser.add_argument("--json", help="write the rows (and the header) here")
    parser.add_argument("--out", help="also write the table here")
    parser.add_argument("--straight", action="store_true",
                        help="compile with the fallbacks stubbed (stub_cold_paths) and count "
                             "the straight path alone (the default run starts one itself)")
    args = parser.parse_args(argv)
    os.environ["NUMBA_ENABLE_CUDASIM"] = "0"        # before numba's import: NVVM, not the simulator
    sys.path.insert(0, str(ROOT))                   # this checkout's lpsim, not an installed one
    ptxas, nvdisasm = tool("ptxas"), tool("nvdisasm")
    missing = [name for name, path in (("ptxas", ptxas), ("nvdisasm", nvdisasm)) if not path]
    if missing:
        print(f"no {' or '.join(missing)}: pip install -e '.[ptx]' "
              "(nvidia-cuda-nvcc-cu12, nvidia-cuda-nvdisasm)")
        sys.exit(3)
    try:
        from numba import cuda
        cuda.compile_ptx(lambda o: None, "void(int64[::1])", cc=(9, 0))
    except Exception as err:                        # no numba-cuda, no NVVM
        print("no CUDA compiler (the ptx extra):", type(err).__name__, str(err)[:200])
        sys.exit(3)
    cases = [c for c in CASES if (c.hot or not args.hot) and (args.only or "") in c.name]
    if args.straight:
        stub_cold_paths()
    else:
        filters = (["--hot"] if args.hot else []) + (["--only", args.only] if args.only else [])
        straight = _straight_rows(filters)
    compiled: dict = {}                  # several rows read one kernel's two loops
    rows = []
    for case in cases:
        py_func, signature, *bounds = case.kernel()
        key = (py_func, tuple(signature))
        if key not in compiled:
            compiled[key] = compile_case(py_func, signature, ptxas, nvdisasm, *bounds)
        try:
            rows.append(row_of(case, *compiled[key]))
        except ValueError:
            if not args.straight:
                raise
            # the stubs can merge the loops a case tells apart (the general kernel's
            # deterministic and stochastic loops): no straight count for it
            rows.append({"kernel": case.name, "loop_instructions_per_element": None,
                         "loop_alu_per_element": None})
        print(table(rows)[-1], flush=True)
    if not args.straight:
        _merge_straight(rows, *straight)
    command = " ".join([COMMAND, *(argv if argv is not None else sys.argv[1:])])
    head = header(ptxas, nvdisasm, command)
    lines = head + table(rows)
    print("\n".join(lines))
    if args.out:
        pathlib.Path(args.out).write_text("\n".join(lines) + "\n")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"header": head, "rows": rows},
                                                      indent=1) + "\n")


if __name__ == "__main__":
    main()
