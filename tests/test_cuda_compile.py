"""Every lpsim_cuda kernel compiles for a real GPU (sm_90), with no GPU: numba-cuda's typing
and code generation run through NVVM, which the CUDA simulator used elsewhere in CI skips.
The PTX also shows any a*b+c contracted into an FMA the CPU path lacks.  This caught two
kernels that ran under the simulator but could not be typed for a GPU (a call forced
inline in philox and in blocks).

It needs NVVM/NVRTC (the ``ptx`` extra: nvidia-cuda-nvcc-cu12, nvidia-cuda-nvrtc-cu12), which
CI installs; without them the test says so and skips.
"""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHECK = r"""
import sys, types
from unittest import mock
import numba
import numba.cuda.dispatcher as dispatcher
from numba import cuda, types as T
from lpsim.rounding import Params
from lpsim.storage import NO_PACKING
import importlib
Q = importlib.import_module("lpsim_cuda.quantize")   # the package exports a function of that name

params = numba.typeof(Params(*[0] * len(Params._fields)))   # round_fast reads its fields
packing = T.UniTuple(T.int64, len(NO_PACKING))
kernels = []
for count, kernel in Q.KERNELS.items():
    for bits in (T.int32, T.int64):
        for out in sorted({bits, T.int16, T.uint8}, key=str):
            kernels.append((f"quantize {bits} -> {out} count={count}", kernel,
                            (bits[::1], out[::1], T.int64, T.int64, params, T.int64, T.int64,
                             T.int64, T.int64, T.int64, packing, T.int64[::1])))
# the general kernels' widening of a 16-bit tensor's codes (lpsim_cuda.arrays.widened)
A = importlib.import_module("lpsim_cuda.arrays")
kernels.append(("widen int16 -> int32", A._widen_kernel(), (T.int16[::1], T.int32[::1], T.int64)))
with mock.patch.object(dispatcher, "get_current_device",
                       lambda: types.SimpleNamespace(compute_capability=(9, 0))):
    for name, kernel, signature in kernels:
        ptx, _ = cuda.compile_ptx(kernel.py_func, signature, cc=(9, 0))
        print(name, "ok", len(ptx))
        report(name, ptx)
"""


OPTIM = r"""
import importlib, sys, types
from unittest import mock
import numba, numpy as np
import numba.cuda.dispatcher as dispatcher
from numba import cuda
sys.path.insert(0, "tests")
from test_optim_cuda import CONFIGS, inputs        # the CUDA-simulator test's arguments
O = importlib.import_module("lpsim_cuda.optim")
with mock.patch.object(dispatcher, "get_current_device",
                       lambda: types.SimpleNamespace(compute_capability=(9, 0))):
    for cls, dtype, kw in CONFIGS:
        arrays, kargs, setup = inputs(cls, dtype, kw, 37, 0)
        kinds, hp, ints, keys, offset = kargs
        for wide in (False, True):                 # element-wise and aligned parameters
            kernel = O.optim_kernel(tuple(kinds), tuple(ints), setup.pw, setup.pc, setup.ps,
                                    tuple(setup.sp16), wide)
            args = O.kernel_arguments(arrays, hp, keys, offset, np.zeros(7, np.int64))
            ptx, _ = cuda.compile_ptx(kernel.py_func, tuple(numba.typeof(a) for a in args),
                                      cc=(9, 0), launch_bounds=(128, O.BLOCKS_PER_SM))
            # the counters summed over the warp before one atomic a warp (one a thread put
            # as many on one address as the grid has threads)
            assert "shfl.sync.down" in ptx, "the counters are added thread by thread"
            # products are fmul_rn on the GPU: any fused float32 multiply-add is one the CPU lacks
            # the GPU build's own instructions (lpsim_cuda.optim: the moments' conversion,
            # the quotient and square root without slow-path calls, bfloat16 stores)
            print("own", cls.__name__, dtype, wide, kw.get("state_rounding", "nearest"),
                  *(ptx.count(op) for op in ("cvt.rn.bf16x2.f32", "rcp.approx.ftz.f32",
                                             "rsqrt.approx.ftz.f32", "0x7632")))
            print(cls.__name__, dtype, wide, "ok", len(ptx), kw, "fma",
                  ptx.count("fma.rn.f32"))
            report(f"optim {cls.__name__} {dtype} {kw['update_rounding']} wide={wide}", ptx)
"""


BLOCKS = r"""
import importlib, types
from unittest import mock
import numba, numpy as np
import numba.cuda.dispatcher as dispatcher
from numba import cuda
from lpsim.blocks import BLOCK_COUNTERS, _element_params, block_params, parse_block_format
from lpsim.philox import LANES
from lpsim.quantize import plan
from lpsim.rounding import kernel_params
B = importlib.import_module("lpsim_cuda.blocks")
with mock.patch.object(dispatcher, "get_current_device",
                       lambda: types.SimpleNamespace(compute_capability=(9, 0))):
    for name in ("mxfp8_e4m3", "mxfp4", "nvfp4"):
        for dtype in (np.float32, np.float64):
            bfmt = parse_block_format(name)
            request = plan(bfmt.saturating_element, "stochastic", dtype, seed=1)
            x = np.zeros((2, 64), dtype)
            args = (x, x.copy(), np.zeros((2, 64)), np.zeros((2, 4)),
                    np.zeros((2, 4, len(BLOCK_COUNTERS)), np.int64), request.mode, request.k,
                    _element_params(bfmt.saturating_element, request.params.W),
                    kernel_params(bfmt.scale, np.float64), block_params(bfmt, 1.0),
                    request.seed_lo, request.seed_hi, request.stream, request.offset,
                    LANES[np.dtype(dtype).itemsize], True, True)
            ptx, _ = cuda.compile_ptx(B._blocks_kernel.py_func,
                                      tuple(numba.typeof(a) for a in args), cc=(9, 0))
            print(name, np.dtype(dtype), "ok", len(ptx), "fma", ptx.count("fma.rn"))
            report(f"blocks {name} {np.dtype(dtype)}", ptx)
    for bits in (numba.int32[::1], numba.int64[::1]):       # NVFP4's per-tensor amax
        ptx, _ = cuda.compile_ptx(importlib.import_module("lpsim_cuda.tensor_amax")
                                  ._amax_kernel.py_func,
                                  (bits, numba.int64, numba.int64, numba.int64[::1]), cc=(9, 0))
        assert "atom.global.max.s64" in ptx, "no 64-bit atomic max"
        print("amax", bits.dtype, "ok", len(ptx))
        report(f"blocks amax {bits.dtype}", ptx)
    T = importlib.import_module("lpsim_cuda.tensor_amax")
    ptx, _ = cuda.compile_ptx(T.amax32_kernel.py_func, (numba.int32[::1], numba.int64[::1]),
                              cc=(9, 0))
    assert "ld.global.v4" in ptx and "shfl.sync.bfly" in ptx, "no 16-byte load or shuffle"
    print("amax32 ok", len(ptx))
    report("blocks amax32", ptx)
    from lpsim.storage import BFLOAT16_CODES, FLOAT16_CODES
    for half in (BFLOAT16_CODES, FLOAT16_CODES):            # NVFP4 of 16-bit codes
        ptx, _ = cuda.compile_ptx(T.amax_codes_kernel(half).py_func,
                                  (numba.int16[::1], numba.int64[::1]), cc=(9, 0))
        assert "ld.global.v4.u16" in ptx and "shfl.sync.bfly" in ptx, "no 8-byte load"
        print("amax of codes", half, "ok", len(ptx))
    G = importlib.import_module("lpsim_cuda.block_groups")
    ptx, _ = cuda.compile_ptx(T.tensor_scale_kernel.py_func,
                              (numba.int64[::1], numba.float32, numba.float64,
                               numba.float64[::1]), cc=(9, 0))
    print("amax scale ok", len(ptx))
    nv = parse_block_format("nvfp4")
    request = plan(nv.saturating_element, "nearest", np.float32, seed=1)
    kern = G.kernel(nv, request.mode, request.k, request.params.W, True)
    signature = G._signature(True)       # the device scale and counters' arrays too
    ptx, _ = cuda.compile_ptx(kern.py_func, signature, cc=(9, 0))
    print("amax groups with the scale on the device ok", len(ptx))
    report("blocks groups nvfp4 device scale", ptx)
    for name, rounding in (("mxfp8_e4m3", "nearest"), ("mxfp4", "stochastic")):  # counting
        bf = parse_block_format(name)
        request = plan(bf.saturating_element, rounding, np.float32, seed=1)
        kern = G.kernel(bf, request.mode, request.k, request.params.W, False, 0, True)
        ptx, _ = cuda.compile_ptx(kern.py_func, signature, cc=(9, 0))
        assert "shfl.sync" in ptx and "atom.global.add" in ptx, name
        print("counted groups", name, "ok", len(ptx))
    # NVFP4's 16 x 16 weight tiles (a warp a block, two quads a lane, the scale found on the
    # device) and MXFP8 reading bfloat16 codes (without the device scale and counters)
    import dataclasses
    tile = dataclasses.replace(nv, block=256)
    kern = G.kernel(tile, request.mode, request.k, request.params.W, True)
    ptx, _ = cuda.compile_ptx(kern.py_func, signature, cc=(9, 0))
    assert "shfl.sync" in ptx, "tiles"
    print("tile groups ok", len(ptx))
    mx = parse_block_format("mxfp8_e4m3")
    request = plan(mx.saturating_element, "nearest", np.float32, seed=1)
    kern = G.kernel(mx, request.mode, request.k, request.params.W, False, 1)
    ptx, _ = cuda.compile_ptx(kern.py_func, (numba.int16[::1],) + G._signature()[1:],
                              cc=(9, 0))
    assert "ld.global.v4.u16" in ptx, "bf16 codes: four in one 8-byte load"
    print("bf16 groups ok", len(ptx))
"""


PHILOX = r"""
import types
from unittest import mock
import numba.cuda.dispatcher as dispatcher
from numba import cuda, types as T
import lpsim_cuda                                   # registers the CUDA form of philox4x32
from lpsim.philox import block_words


def draw(out, block, stream, seed_lo, seed_hi):
    w0, w1, w2, w3 = block_words(block, stream, seed_lo, seed_hi)
    out[0] = w0 ^ w1 ^ w2 ^ w3


with mock.patch.object(dispatcher, "get_current_device",
                       lambda: types.SimpleNamespace(compute_capability=(9, 0))):
    ptx, _ = cuda.compile_ptx(draw, (T.int64[::1], T.int64, T.int64, T.int64, T.int64),
                              cc=(9, 0))
print("philox ok", ptx.count("mul.hi.u32"), ptx.count("mul.lo.s64"))
"""


CASGD = r"""
import importlib, types
from unittest import mock
import numba.cuda.dispatcher as dispatcher
from numba import cuda, types as T
from lpsim.rounding import Params
K = importlib.import_module("lpsim_cuda.casgd")
pc = T.UniTuple(T.int64, len(Params._fields))
fp32 = T.Tuple(())                       # lpsim.casgd.inner.FP32_PARAMS (recipes A, C, D)


def inner_sig(pc, ps, gram=T.float32):
    return (T.float32[::1], gram[:, ::1], T.float64[::1], T.float64[::1], T.float64[::1],
            T.int64, T.int64, T.float64, T.int64, pc, ps)


kernels = {
    "inner": (K._inner_kernel, inner_sig(pc, pc)),
    "inner shared": (K._inner_kernel_shared, inner_sig(pc, fp32)),
    "inner shared fp32": (K._inner_kernel_shared, inner_sig(fp32, fp32)),
    "inner shared f64 gram": (K._inner_kernel_shared, inner_sig(pc, pc, T.float64)),
    "gather_csr": (K._gather_csr_kernel, (T.int64[::1], T.int64[::1], T.int16[::1],
                                          T.int64[::1], T.int16[:, ::1])),
}
with mock.patch.object(dispatcher, "get_current_device",
                       lambda: types.SimpleNamespace(compute_capability=(9, 0))):
    for name, (kernel, sig) in kernels.items():
        ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0),
                                  launch_bounds=kernel.targetoptions.get("launch_bounds"))
        # the residual's exp: 16 explicit FMAs, inlined for the logistic and Poisson losses;
        # any other fma.rn.f64 would be a contraction the CPU does not make
        if name.startswith("inner"):
            assert ptx.count("fma.rn.f64") == 32, ptx.count("fma.rn.f64")
            # a step's latency: one barrier (after its rows), the tree by shuffles, the next
            # Gram row prefetched into L1, delta_c from shared memory where it fits
            assert ptx.count("bar.sync") == 1, ptx.count("bar.sync")
            assert ptx.count("shfl.sync.down") >= 2, ptx.count("shfl.sync.down")
            assert ptx.count("prefetch.global.L1") >= 1
            assert ("ld.shared.f64" in ptx) == ("shared" in name)
            assert ".maxntid 1024, 1, 1" in ptx          # b >= 32: 1024 threads launch
            # fp32 slots compile the hardware conversion alone: no 64-bit max of the
            # rounding core (which the tf32 slot's kernels keep)
            assert ("max.s64" in ptx) != name.endswith("fp32"), name
        print(name, "ok", len(ptx))
        report(f"casgd {name}", ptx)
"""


HADAMARD = r"""
import importlib, types
from unittest import mock
import numba.cuda.dispatcher as dispatcher
from numba import cuda, types as T
H = importlib.import_module("lpsim_cuda.hadamard")
matrix = T.float32[:, ::1]
with mock.patch.object(dispatcher, "get_current_device",
                       lambda: types.SimpleNamespace(compute_capability=(9, 0))):
    for n in H.SIZES:
        ptx, _ = cuda.compile_ptx(H.transposed_kernel(n).py_func, (matrix, T.float32[::1], matrix),
                                  cc=(9, 0))
        print("rht", n, "ok", ptx.count("mul.rn.f32") % n, ptx.count("mul.rn.f32") > 0,
              ptx.count("fma.rn.f32"), ptx.count(".local"))
"""


def _compile(script):
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=600, cwd=ROOT)
    if done.returncode == 3:
        pytest.skip("no NVVM/NVRTC here (pip install nvidia-cuda-nvcc-cu12 "
                    f"nvidia-cuda-nvrtc-cu12): {done.stdout.strip()[:120]}")
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    return done.stdout


def test_quantize_kernels_compile_for_sm90():
    assert _compile(_PREAMBLE + CHECK).count(" ok ") == 13


def test_optimizer_kernel_compiles_for_sm90_without_contractions():
    lines = _compile(_PREAMBLE + OPTIM).splitlines()
    assert len([x for x in lines if " ok " in x]) == 8, lines
    # the explicit FMAs alone, nine in each of the aligned AdamW kernel's four lanes: two a
    # division by a bias correction (lpsim.optim.step.divide_by: m / c1, v / c2), two of
    # the square root's fast path and three of the quotient by it (lpsim_cuda.optim._root,
    # lpsim.optim.step.verified_quotient), and with stochastic moments one a moment
    # (lpsim.optim.step.sr_by_float32); any other float32 one is a contraction (float64
    # ones may be: lpsim.optim.step.by_float64's products are exact)
    for x in (x for x in lines if " ok " in x):
        wide_adamw = x.startswith("AdamW") and x.split()[2] == "True"
        want = (44 if "'state_rounding': 'stochastic'" in x else 36) if wide_adamw else 0
        assert x.endswith(f"fma {want}"), x
    # the aligned bf16 AdamW kernels take the GPU build's instructions: a reciprocal and a
    # root approximation a lane, one paired conversion a lane where the moments are rounded
    # to nearest, and one prmt per two codes stored (weights, m, v: six a quad)
    wide_bf16 = [x.split() for x in lines if x.startswith("own AdamW torch.bfloat16 True")]
    assert len(wide_bf16) == 2, lines
    for _, _, _, _, states, cvt, rcp, rsqrt, prmt in wide_bf16:
        assert (int(rcp), int(rsqrt)) == (4, 4), wide_bf16
        assert int(cvt) == (4 if states == "nearest" else 0), wide_bf16
        assert int(prmt) >= 6, wide_bf16


def test_block_kernel_compiles_for_sm90():
    lines = _compile(_PREAMBLE + BLOCKS).splitlines()
    assert len([x for x in lines if " ok " in x and " fma " in x]) == 6, lines
    assert len([x for x in lines if x.startswith("amax") and " ok " in x]) == 7, lines
    assert len([x for x in lines if x.startswith("counted groups")]) == 2, lines
    assert "tile groups ok" in "\n".join(lines) and "bf16 groups ok" in "\n".join(lines)
    # the element step has no a*b+c the CPU would round twice: no contraction may appear
    assert all(x.endswith("fma 0") for x in lines if " fma " in x), lines


def test_kernels_draw_philox_words_in_32_bit_products():
    """lpsim_cuda's overload of philox4x32 is the one a kernel compiles: ten rounds of two
    32-bit high products, no 64-bit multiply (the Python body's form)."""
    assert _compile(_PREAMBLE + PHILOX).strip().endswith("philox ok 20 0")


def test_casgd_kernels_compile_for_sm90_without_contractions():
    out = _compile(_PREAMBLE + CASGD)
    assert all(f"{name} ok" in out for name in ("inner", "inner shared", "inner shared fp32",
                                                "inner shared f64 gram", "gather_csr")), out


#: exits 3 when this machine has no NVVM/NVRTC; report(name, ptx) prints ptxas's registers,
#: spills and local memory for sm_90 when LPSIM_PTXAS=1 (benchmarks/kernel_resources.py)
_PREAMBLE = r"""
import os, subprocess, sys, tempfile
from numba import cuda
try:
    cuda.compile_ptx(lambda o: None, "void(int64[::1])", cc=(9, 0))
except Exception as err:
    print("no CUDA compiler:", type(err).__name__, str(err)[:200])
    sys.exit(3)


def report(name, ptx):
    if os.environ.get("LPSIM_PTXAS") != "1":
        return
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "kernel.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        done = subprocess.run([os.environ.get("LPSIM_PTXAS_PATH", "ptxas"), "-arch=sm_90", "-v",
                               path, "-o", path + ".cubin"], capture_output=True, text=True)
    info = [line.split("info    : ")[-1] for line in done.stderr.splitlines()
            if "Used" in line or "spill" in line]
    print("resources", name, "|", "; ".join(info) or done.stderr.strip()[:200])
"""


def test_hadamard_kernel_compiles_for_sm90_in_registers_without_contractions():
    """Each run length: the products are mul.rn (a whole number of runs' worth), no sum is
    fused with a product, and the run stays in registers (no local memory)."""
    lines = [x for x in _compile(_PREAMBLE + HADAMARD).splitlines() if x.startswith("rht")]
    assert [x.split()[1] for x in lines] == ["2", "4", "8", "16", "32"], lines
    assert all(x.endswith("ok 0 True 0 0") for x in lines), lines
