"""The kernels split for compile time give the same bits as the general ones.

``lpsim.ops.kernels.gemm_plain`` (deterministic modes, blocked order: no random-word and no
pairwise code) must equal ``gemm`` bit for bit and counter for counter; ``lpsim.warmup``
prepares both; the quantize kernel's in-place path (one fast-pass call site, a plain copy
loop) equals its out-of-place path.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import lpsim
import lpsim.ops as ops
from lpsim.ops import kernels, reductions
from lpsim.rounding import DETERMINISTIC_MODES, MODES, kernel_params


def _operands(rng, M, K, N):
    # values spread over many binades, with exact zeros and ties of a short format
    A = (rng.standard_normal((1, M, K)) * 2.0 ** rng.integers(-30, 30, (1, M, K)))
    B = (rng.standard_normal((1, K, N)) * 2.0 ** rng.integers(-30, 30, (1, K, N)))
    A[0, 0, :2] = 0.0
    B[0, -1, :] = 1.0 + 2.0 ** -8           # halfway cases of bf16 products
    return A.astype(np.float32).astype(np.float64), B.astype(np.float32).astype(np.float64)


@pytest.mark.parametrize("mode", DETERMINISTIC_MODES)
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp(4,3,4)"])
def test_gemm_plain_equals_gemm(mode, fused, fmt):
    rng = np.random.default_rng(zlib.crc32(f"{mode} {fused} {fmt}".encode()))
    M, K, N = 3, 37, 5
    A, B = _operands(rng, M, K, N)
    pv = np.array(kernel_params(lpsim.parse_format(fmt), np.float64), np.int64)
    code = MODES[mode]
    ia = ib = np.zeros(1, np.int64)
    for blk in (K, 8):
        results = []
        for kernel in (kernels.gemm, kernels.gemm_plain):
            out = np.full((1, M, N), np.nan)
            cnt = np.zeros(kernels.NCOUNTS, np.int64)
            nitems = kernels.gemm_items(1, M, N, K)
            kernel(A, B, ia, ib, out, code, code, 32, 32, pv, pv, 0, 0, 0,
                   kernels.ORDER_BLOCKED, blk, fused, False, 0, nitems, cnt)
            results.append((out.view(np.int64).copy(), cnt.copy()))
        np.testing.assert_array_equal(results[0][0], results[1][0])
        np.testing.assert_array_equal(results[0][1], results[1][1])
        assert results[0][1][kernels.NCOUNTS - 1] > 0


def test_matmul_routes_deterministic_blocked_to_gemm_plain(monkeypatch):
    """run() hands gemm's deterministic blocked calls to gemm_plain, and only those."""
    monkeypatch.setattr(reductions, "_PRODUCTS", {})     # no cached plan from earlier calls
    used = []
    real = kernels.first_call
    monkeypatch.setattr(kernels, "first_call",
                        lambda kernel, what: used.append(kernel) or real(kernel, what))
    A = np.ones((3, 4), np.float32)
    B = np.ones((4, 2), np.float32)
    results = [ops.matmul(A, B, acc_fmt="bf16"),
               ops.matmul(A, B, acc_fmt="bf16", order=("blocked", 2), acc_rounding="down"),
               ops.matmul(A, B, acc_fmt="bf16", order="pairwise"),
               ops.matmul(A, B, acc_fmt="bf16", acc_rounding="stochastic", seed=1)]
    assert used == [kernels.gemm_plain, kernels.gemm_plain, kernels.gemm, kernels.gemm]
    for result in results:
        np.testing.assert_array_equal(result, np.full((3, 2), 4.0, np.float32))


def test_warmup_prepares_both_gemm_kernels():
    lpsim.warmup(["nearest"], ["float32"], ops=True, blocks=False, optim=False, progress=False)
    assert kernels.gemm_plain.overloads
    assert kernels.gemm.overloads
    assert lpsim.cpu.NEAREST32.overloads       # lpsim.quantize's float32 nearest kernel
    assert lpsim.cpu.NEAREST32_ALL.overloads   # ... and its small calls


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rounding", ["nearest", "toward_zero", "stochastic"])
def test_in_place_equals_out_of_place(dtype, rounding):
    rng = np.random.default_rng(7)
    # two chunks and a tail, with values that take the slow pass (subnormal, overflow, inf)
    n = 2 * 8192 + 100
    top = 120 if dtype == np.float32 else 1000
    x = (rng.standard_normal(n) * 2.0 ** rng.integers(-top, top, n)).astype(dtype)
    x[::97] = np.inf
    x[5::101] = 1e-45 if dtype == np.float32 else 1e-310
    stats_out, stats_in = lpsim.RoundingStats(), lpsim.RoundingStats()
    expected = lpsim.quantize(x, "bf16", rounding, seed=3, stats=stats_out)
    y = x.copy()
    assert lpsim.quantize(y, "bf16", rounding, seed=3, out=y, stats=stats_in) is y
    np.testing.assert_array_equal(y.view(np.int64 if dtype == np.float64 else np.int32),
                                  expected.view(np.int64 if dtype == np.float64
                                                else np.int32))
    assert stats_in == stats_out
