"""Bad input to lpsim.ops raises an error that names the value and what is accepted."""

import re

import numpy as np
import pytest

import lpsim
import lpsim.ops as ops
from lpsim.ops.hardware import HARDWARE_MODELS

A = np.ones((3, 4), np.float32)
B = np.ones((4, 2), np.float32)


@pytest.mark.parametrize("call, error, pattern", [
    (lambda: ops.matmul(A, np.ones((3, 2), np.float32)), ValueError, r"\(3, 4\).*\(3, 2\)"),
    (lambda: ops.matmul(np.ones((2, 3, 4)), np.ones((3, 4, 2)), in_fmt="bf16"), ValueError,
     "broadcast"),
    (lambda: ops.matmul(np.array([[2 ** 60 + 1]]), B), ValueError,
     "integer 1152921504606846977.*float64"),
    (lambda: ops.matmul(np.ones((3, 4), np.complex64), B), TypeError, "complex64.*float arrays"),
    (lambda: ops.matmul(A, B, order=("blocked", 0)), ValueError, "k=0.*>= 1"),
    (lambda: ops.matmul(A, B, order="zigzag"), ValueError, "'zigzag'.*sequential"),
    (lambda: ops.matmul(A, B, model="bf16-fp64"), ValueError, "'bf16-fp64'.*bf16-fp32"),
    (lambda: ops.matmul(A, B, in_fmt="fp64"), ValueError, "fp64.*float32"),
    (lambda: ops.matmul(A, B, acc_fmt="bf16", acc_rounding="sideways"), ValueError,
     "'sideways'.*nearest"),
    (lambda: ops.matmul(np.ones((3, 4)), np.ones((4, 2)), acc_fmt="bf16"), ValueError,
     "in_fmt=fp64.*fits float32"),
    (lambda: ops.matmul(A, B, acc_fmt="fp64", acc_rounding="stochastic", order="pairwise"),
     ValueError, "acc_fmt=fp64.*'nearest'"),
    (lambda: ops.matmul(A, B, acc_fmt="fp(11,51)"), ValueError, "acc_fmt=fp\\(11,51,0\\)"),
    (lambda: ops.dot(np.ones(3), np.ones(4)), ValueError, "lengths 3 and 4"),
    (lambda: ops.sum(np.ones((2, 3)), axis=2), ValueError, "axis=2 is out of range"),
    (lambda: ops.sum(np.ones((2, 3)), axis=(0, -2)), ValueError, "repeats an axis"),
    (lambda: ops.sum(np.ones(3), axis=0.5), TypeError, "axis=0.5"),
    (lambda: ops.add(np.ones(3), 1.0, "bf16", out=np.ones(2)), ValueError, "out has shape"),
    (lambda: ops.dot(np.ones(3, np.float32), np.ones(3, np.float32), out=[0.0]), TypeError,
     "out is a list"),
    (lambda: ops.add(np.ones(3, np.bool_), 1.0, "bf16"), TypeError, "dtype bool"),
    (lambda: ops.add(np.ones(3, np.float32), 1.0, "fp64"), ValueError, "float32 container"),
    (lambda: ops.add(1.0, 1.0, "fp64", "up"), ValueError, "fp64.*'nearest'"),
    (lambda: ops.add(np.ones(3), np.ones(4), "bf16"), ValueError, "broadcast"),
    (lambda: ops.add(1.0, 1.0, "bf17"), ValueError, "'bf17'"),
    (lambda: ops.fma(1.0 + 2 ** -52, 1.0 + 2 ** -52, 1.0, "bf16"), ValueError,
     "not exact in float64"),
    (lambda: ops.mul(np.ones(2), "x", "bf16"), TypeError, "str"),
    (lambda: ops.matmul(A, B, order=("blocked", True)), ValueError, "k=True.*not bool"),
    (lambda: ops.matmul(A, B, order=("blocked", 2.0)), ValueError, "k=2.0.*integer >= 1"),
    (lambda: ops.matmul(A, B, order=("blocked", np.int64(0))), ValueError,
     "k=np.int64\\(0\\).*integer >= 1"),
    (lambda: ops.matmul(A, B, order=("blocked", 2 ** 70)), ValueError,
     r"k=1180591620717411303424.*<= 2\*\*63 - 1"),
    (lambda: ops.sum(A, acc_fmt="bf16", order=("blocked", np.uint64(2 ** 63))), ValueError,
     r"k=np.uint64\(9223372036854775808\).*<= 2\*\*63 - 1"),
    (lambda: ops.matmul(A, B, model="hopper-fp8", acc_fmt="bf16"), ValueError,
     "acc_fmt='bf16' is not accepted with the tensor-core model 'hopper-fp8'.*accepted with "
     "it: in_fmt, out_fmt, out_rounding"),
    (lambda: ops.matmul(A, B, model="mxfp8-fp32", acc_rounding="stochastic", seed=1),
     ValueError, "acc_rounding='stochastic' is not accepted with the tensor-core model "
     "'mxfp8-fp32'"),
    (lambda: ops.matmul(A, B, model="nvfp4-fp32", order="sequential"), ValueError,
     "order='sequential' is not accepted with the tensor-core model 'nvfp4-fp32'"),
    (lambda: ops.matmul(A, B, model=HARDWARE_MODELS["hopper-fp8"], fused=False), ValueError,
     "fused=False is not accepted with the tensor-core model a TensorCoreModel"),
    (lambda: ops.matmul(A, B, model="hopper-fp8-promote128", stats={}), TypeError,
     r"stats=\{\} is a dict"),
    (lambda: ops.gamma(10, float("nan")), ValueError, "gamma: u=nan.*finite non-negative"),
    (lambda: ops.gamma(10, float("inf")), ValueError, "u=inf.*finite non-negative"),
    (lambda: ops.gamma(10, -2.0 ** -8), ValueError, "u=-0.00390625.*non-negative"),
    (lambda: ops.gamma(-1, 0.1), ValueError, "n=-1.*non-negative integer"),
    (lambda: ops.gamma(2.5, 0.1), ValueError, "n=2.5.*non-negative integer"),
    (lambda: ops.input_cast_factor(3, float("nan"), 0.1), ValueError,
     "input_cast_factor: u_low=nan.*finite"),
    (lambda: ops.input_cast_factor(3, -0.1, 0.1), ValueError, "u_low=-0.1.*non-negative"),
    (lambda: ops.input_cast_factor(3, 0.1, float("inf")), ValueError, "u_acc=inf.*finite"),
    (lambda: ops.input_cast_factor(-2, 0.1, 0.1), ValueError, "n=-2.*non-negative integer"),
    (lambda: ops.input_cast_factor(1.5, 0.1, 0.1), ValueError, "n=1.5.*integer"),
])
def test_errors_name_value_and_accepted(call, error, pattern):
    with pytest.raises(error, match=pattern):
        call()


def test_blocked_order_accepts_any_integer_type():
    """("blocked", k) takes numpy integers too, and runs exactly as the Python int."""
    a = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    want = ops.matmul(a, B, acc_fmt="bf16", order=("blocked", 3))
    for k in (np.int64(3), np.int32(3), np.uint8(3)):
        assert np.array_equal(ops.matmul(a, B, acc_fmt="bf16", order=("blocked", k)), want)
        order = ops.MODELS["fp32"].with_(order=("blocked", k)).order
        assert order == ("blocked", 3) and type(order[1]) is int


@pytest.mark.parametrize("op", ["matmul", "matmul_column", "dot", "sum"])
def test_blocked_order_check_does_not_depend_on_earlier_calls(op):
    """("blocked", 3.0) and ("blocked", True) are refused even after ("blocked", 3) and
    ("blocked", 1) ran: the per-call caches key on values, and 3.0 == 3, True == 1."""
    a = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    calls = {"matmul": lambda k: ops.matmul(a, B, acc_fmt="bf16", order=("blocked", k)),
             "matmul_column": lambda k: ops.matmul(a, B[:, :1], acc_fmt="bf16",
                                                   order=("blocked", k)),
             "dot": lambda k: ops.dot(a[0], a[1], acc_fmt="bf16", order=("blocked", k)),
             "sum": lambda k: ops.sum(a, acc_fmt="bf16", order=("blocked", k))}
    call = calls[op]
    for good, bad in ((3, 3.0), (1, True), (np.int64(2), np.float64(2.0))):
        call(good)
        call(good)
        with pytest.raises(ValueError, match=re.escape(f"k={bad!r} is not accepted")):
            call(bad)


def test_blocked_order_takes_the_largest_int64():
    """k = 2**63 - 1, the kernels' bound, is one block: the sequential order."""
    a = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    k = 2 ** 63 - 1
    for kw in ({}, {"acc_rounding": "stochastic", "seed": 2}, {"fused": False}):
        assert np.array_equal(ops.matmul(a, B, acc_fmt="bf16", order=("blocked", k), **kw),
                              ops.matmul(a, B, acc_fmt="bf16", order="sequential", **kw))
        assert ops.sum(a, acc_fmt="bf16", order=("blocked", np.uint64(k)), **kw) == \
            ops.sum(a, acc_fmt="bf16", order="sequential", **kw)


@pytest.mark.parametrize("call", [
    lambda s: ops.matmul(A, B, acc_fmt="bf16", stats=s, out=np.zeros((3, 3), np.float32)),
    lambda s: ops.dot(A, A, acc_fmt="bf16", stats=s, out=np.zeros(7, np.float32)),
    lambda s: ops.sum(A, acc_fmt="bf16", stats=s, out=np.zeros(7, np.float32)),
    lambda s: ops.add(A, A, "bf16", in_fmt="e4m3fn", stats=s, out=np.zeros(3, np.float32)),
    lambda s: ops.add(A, A, "bf16", in_fmt="e4m3fn", stats=s, offset=-1),
    lambda s: ops.matmul(A, B, in_fmt="e4m3fn", acc_fmt="bf16", acc_rounding="stochastic",
                         seed=-1, stats=s),
    lambda s: ops.matmul(np.ones((2, 3, 4), np.float32), B, in_fmt="mxfp8", stats=s,
                         out=np.zeros(1, np.float32)),
])
def test_a_refused_call_leaves_its_stats_as_they_were(call):
    """The inputs' roundings (and the whole product) were counted before a bad out, offset
    or seed was found: the call raised, and its stats had grown."""
    stats = lpsim.RoundingStats()
    ops.matmul(np.full((3, 4), 1.1, np.float32), B, acc_fmt="bf16", stats=stats)
    before = stats.as_dict()
    assert before["inexact"] > 0
    with pytest.raises(ValueError):
        call(stats)
    assert stats.as_dict() == before


@pytest.mark.parametrize("fused", ["False", "no", 2, [1], np.array([True])])
def test_fused_takes_a_bool_only(fused):
    """The string "False" ran as fused=True."""
    with pytest.raises(TypeError, match=r"fused=.* is not accepted; accepted: True or False"):
        ops.matmul(A, B, in_fmt="fp32", acc_fmt="bf16", order="sequential", fused=fused)
    with pytest.raises(TypeError, match=r"fused="):
        ops.AccumulationModel(None, "bf16", "bf16", fused, None, "nearest", "nearest")
    x = np.array([[1.0, 2.0 ** -8 + 2.0 ** -18]], np.float32)
    kw = dict(in_fmt="fp32", acc_fmt="bf16", order="sequential")
    assert ops.matmul(x, np.ones((2, 1), np.float32), fused=np.bool_(False), **kw)[0, 0] == 1.0
