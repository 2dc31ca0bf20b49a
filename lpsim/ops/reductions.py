"""Simulated sums, dot products and GEMM with separate input, accumulator and output formats.

Each output element is an inner product of length K.  Its terms are products a_t b_t of
operands rounded to ``in_fmt``; these are exact in float64 when in_fmt fits float32.  The
accumulator rounds to ``acc_fmt`` after every step, and the result is rounded once more to
``out_fmt`` (FMAC model, Zhang et al. 2018, Sec. 2).  Steps, per ``order``:

* ``"sequential"``: acc = fl(a_0 b_0), then acc = fl(acc + a_t b_t) for t = 1..K-1.
  fused=True (default): one rounding per step (an FMA into the accumulator).  fused=False:
  p = fl(a_t b_t), then fl(acc + p), as a plain ``acc += a[t] * b[t]`` loop does.
* ``("blocked", k)``: each chunk of k consecutive terms is accumulated sequentially from its
  first term; the chunk sums are then added to the first one in order, in acc_fmt.
* ``"pairwise"``: terms are paired bottom-up (1+1, 2+2, 4+4, ...; a binary counter), and the
  remaining power-of-two blocks are added from right to left.  fused=True: a node whose right
  operand is a single term adds its exact product (an FMA); other leaves are fl(a_t b_t).
* ``None`` (default): any order.  When the accumulator is exactly what BLAS computes
  (acc_fmt fp32 with in_fmt fitting float32, or acc_fmt fp64) with nearest rounding, numpy's
  matmul runs, or torch.matmul where :func:`matmul` is given torch tensors (float32/float64
  BLAS: FMA or not, blocked in an order BLAS does not document, so only the bound
  gamma_K(u_acc)|A||B| holds, not a particular sequence of roundings); otherwise
  "sequential".

Random words (stochastic acc_rounding or out_rounding): every rounding has a slot s in
0 .. 2K-1 of its output element o (C order over the broadcast output, 1-D operands promoted
as in numpy): the product or first-term rounding of term t is slot t, an addition whose right
operand starts at term h is slot K + h (unique: a split point of the summation tree), the
output rounding is slot K.  It uses the 32-bit word of counter o*2K + s under (seed, stream)
(:mod:`lpsim.philox`, float32 lane mapping), so results do not depend on threads or tiles.
On the BLAS path the output rounding is ``lpsim.quantize`` of the float32/float64 result
(counter o).  Stochastic decisions use 32 random bits: exact SR of the exact step result for
acc_fmt with m <= 19, within 2**(m-51) of a quantum above that.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np

from ..cpu import entry_point
from ..cpu import threads as cpu_threads
from ..formats import PRESETS, parse_format
from ..quantize import keys, plan, quantize
from ..rounding import STOCHASTIC, kernel_params
from ..stats import check_stats, commit, staged
from ..exact import check_exact
from .kernels import NCOUNTS, ORDER_BLOCKED, ORDER_PAIRWISE, PARALLEL_STEPS, chain, gemm
from .kernels import gemm_items, gemm_kernel, run
from .hardware import _passes_through, dispatch
from .models import AccumulationModel, check_order, get_model
from .operands import (as_array, container_format, deliver, fits_float32, is_torch,
                       round_inputs)


def resolve(model, dtype, in_fmt=None, acc_fmt=None, out_fmt=None, acc_rounding=None,
            out_rounding=None, fused=None, order=None) -> AccumulationModel:
    """The model a call asks for: a named model with overrides, or the keywords alone
    (cached: building and validating a model costs more than a small product; the order is
    checked first, as the cache keys on values and ("blocked", 3.0) == ("blocked", 3))."""
    order = check_order(order)
    key = (model, dtype, in_fmt, acc_fmt, out_fmt, acc_rounding, out_rounding, fused, order)
    try:
        return _resolve_cached(*key)
    except TypeError:       # something unhashable: validation below names it
        return _resolve(*key)


_resolve_cached = functools.lru_cache(maxsize=512)(lambda *key: _resolve(*key))


def _resolve(model, dtype, in_fmt=None, acc_fmt=None, out_fmt=None, acc_rounding=None,
            out_rounding=None, fused=None, order=None) -> AccumulationModel:
    changes = dict(in_fmt=in_fmt, acc_fmt=acc_fmt, out_fmt=out_fmt, acc_rounding=acc_rounding,
                   out_rounding=out_rounding, fused=fused, order=order)
    if model is not None:
        return get_model(model).with_(**changes)
    acc = parse_format(acc_fmt) if acc_fmt is not None else container_format(dtype)
    return AccumulationModel(in_fmt, acc, out_fmt if out_fmt is not None else acc,
                             True if fused is None else fused, order,
                             acc_rounding or "nearest", out_rounding or "nearest")


def _dtype_of(a, b):
    return a.dtype if a.dtype is b.dtype else np.result_type(a.dtype, b.dtype)


def _blas_ok(m: AccumulationModel, in_fmt) -> bool:
    if m.order is not None or m.acc_rounding != "nearest":
        return False
    if m.acc_fmt == PRESETS["fp64"]:
        return True
    return m.acc_fmt == PRESETS["fp32"] and in_fmt.fits(np.float32)[0]


def _promote(a, b, op):
    """Shapes (…, M, K), (…, K, N) as numpy's matmul promotes them, and the batch shape."""
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"{op}: operands must have at least one dimension, got shapes "
                         f"{a.shape} and {b.shape}")
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    if a2.ndim == 2 and b2.ndim == 2 and a2.shape[1] == b2.shape[0]:
        return a2, b2, ()
    if a2.shape[-1] != b2.shape[-2]:
        raise ValueError(f"{op}: shapes {a.shape} and {b.shape} do not match: a has "
                         f"K={a2.shape[-1]} columns, b has {b2.shape[-2]} rows; accepted: "
                         "(..., M, K) and (..., K, N)")
    try:
        batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    except ValueError:
        raise ValueError(f"{op}: batch dimensions {a2.shape[:-2]} and {b2.shape[:-2]} do not "
                         "broadcast") from None
    return a2, b2, batch


#: the counters of cached products (calls without stats: written, never read)
_DISCARD = np.zeros(NCOUNTS, np.int64)
#: the batch index of an unbatched product (writable, as the kernels' signature has it;
#: they never write it)
_NO_BATCH = np.zeros(1, np.int64)


def _batch_index(shape, batch):
    """For each batch element (C order), the index of the operand's own batch slice."""
    if not batch:
        return _NO_BATCH
    idx = np.arange(math.prod(shape), dtype=np.int64).reshape(shape) if shape else \
        np.zeros((), np.int64)
    return np.broadcast_to(idx, batch).flatten()    # a writable copy: one kernel signature


class _Setup(NamedTuple):
    """What a (model, operand dtype) pair needs per call, computed once."""

    in_fmt: object
    dtype: np.dtype          # the result container
    blas: bool               # numpy's matmul is the accumulator
    hw: bool                 # fp64 accumulator, nearest: plain float64 steps
    mode: int
    omode: int
    pva: np.ndarray          # accumulator Params (W = 32) as int64
    pvo: np.ndarray
    order: int               # ORDER_BLOCKED or ORDER_PAIRWISE
    blk: int                 # chunk width; 0: K (sequential, pairwise)
    fused: bool
    common: tuple            # the kernels' (mode, omode, k, ko, pva, pvo)


@functools.lru_cache(maxsize=512)
def _setup(m: AccumulationModel, dtype: np.dtype, same_dtype: bool, op: str) -> _Setup:
    in_fmt = m.in_fmt or (container_format(dtype) if same_dtype else PRESETS["fp64"])
    if not m.out_fmt.fits(dtype)[0]:
        dtype = np.dtype(np.float64)
    m.out_fmt.check_fits(dtype)
    acc_plan = plan(m.acc_fmt, m.acc_rounding, np.float64)
    out_plan = plan(m.out_fmt, m.out_rounding, np.float64)
    blas = _blas_ok(m, in_fmt)
    hw = False
    if not blas:
        if not in_fmt.fits(np.float32)[0]:
            raise ValueError(f"{op}: in_fmt={in_fmt!r} (float64 operands without in_fmt are "
                             "fp64) is too wide for the per-step simulation, whose products "
                             "must be exact in float64; accepted: an in_fmt that fits float32 "
                             "(e.g. 'fp32', 'bf16'), or acc_fmt='fp64' with order=None (BLAS)")
        hw = not check_exact(m.acc_fmt, "acc_fmt")
        if hw and m.acc_rounding != "nearest":
            raise ValueError(f"{op}: acc_fmt=fp64 supports acc_rounding='nearest' only, not "
                             f"{m.acc_rounding!r}")
    pva = np.array(kernel_params(m.acc_fmt, np.float64)._replace(W=32), np.int64)
    pvo = np.array(kernel_params(m.out_fmt, np.float64)._replace(W=32), np.int64)
    if m.order == "pairwise":
        order, blk = ORDER_PAIRWISE, 0
    elif isinstance(m.order, tuple):
        order, blk = ORDER_BLOCKED, m.order[1]
    else:
        order, blk = ORDER_BLOCKED, 0
    common = (acc_plan.mode, out_plan.mode, 32, 32, pva, pvo)
    return _Setup(in_fmt, dtype, blas, hw, acc_plan.mode, out_plan.mode, pva, pvo, order, blk,
                  bool(m.fused), common)


def _kernel_array(x, keep=False):
    """x as a C-contiguous writable float64 array (numba compiles read-only or non-C arrays
    as other signatures), copying only when needed; keep: a float32 x stays float32 (the
    chain reads it as it is), copied only when it is read-only or not C-contiguous."""
    dtype = _F32 if keep and x.dtype is _F32 else _F64
    if x.dtype is dtype and x.flags.c_contiguous and x.flags.writeable:
        return x
    return np.array(x, dtype, order="C")


_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)
_ndarray = np.ndarray
#: operand dtypes a cached product takes as they are (others are converted, and checked,
#: by as_array on every call)
_CONTAINER_DTYPES = (np.dtype(np.float32), _F64)


def _torch_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``torch.matmul`` of two float32 or float64 arrays (views where torch can take them):
    the BLAS of torch's own thread pool, so a product between torch operations on the CPU
    does not share the cores with the threads torch's pool keeps spinning after them (which
    made numpy's BLAS there several times slower); in the operands' dtype under
    ``torch.autocast`` too."""
    import torch

    from ..tensors import autocast_off

    def tensor(x):
        if x.flags.writeable and min(x.strides, default=0) >= 0:
            return torch.from_numpy(x)
        return torch.from_numpy(np.array(x))      # read-only or reversed: a copy
    with autocast_off("cpu"):
        return torch.matmul(tensor(a), tensor(b)).numpy()


def _run(a, b, m: AccumulationModel, *, seed, stream, stats, op, torch_blas=False):
    """a (…, M, K), b (…, K, N) already rounded to in_fmt; the simulated product.
    torch_blas: the BLAS path multiplies with torch.matmul (the operands were tensors)."""
    a2, b2, batch = _promote(a, b, op)
    dtype = a2.dtype if a2.dtype is b2.dtype else np.result_type(a2, b2)
    setup = _setup(m, dtype, a.dtype == b.dtype, op)
    dtype = setup.dtype
    M, K, N = a2.shape[-2], a2.shape[-1], b2.shape[-1]
    shape = batch + (M, N)
    # seed=None: a fresh seed when either rounding is stochastic
    seed_lo, seed_hi, stream64 = keys(seed, stream, max(setup.mode, setup.omode))
    seed = seed_lo | (seed_hi << 32)

    if setup.blas:
        work = np.float32 if m.acc_fmt == PRESETS["fp32"] else np.float64
        a2, b2 = a2.astype(work, copy=False), b2.astype(work, copy=False)
        c = _torch_matmul(a2, b2) if torch_blas else np.matmul(a2, b2)
        if m.out_fmt == container_format(work):   # every mode: c is already a work value
            if stats is not None:       # rounding a container value to itself: exact
                stats.add(c.size, [0] * 6)
            return c.astype(dtype, copy=False)
        if not m.out_fmt.fits(work)[0]:
            c = c.astype(np.float64)
        return quantize(c, m.out_fmt, m.out_rounding, seed=seed, stream=stream64 % (1 << 64),
                        stats=stats).astype(dtype, copy=False)

    out = np.empty(shape, np.float64)
    if K == 0 or out.size == 0:
        out[...] = 0.0
        return out.astype(dtype)
    order, blk = setup.order, setup.blk or K
    threads = cpu_threads() if out.size * K >= PARALLEL_STEPS else 1
    if N == 1 and order == ORDER_BLOCKED and not batch:
        # one output column: the register chain (X[o], Y[o] the operands of output o), on
        # float32 operands as they are
        keep = a2.dtype is _F32 and b2.dtype is _F32
        X, Y = _kernel_array(a2, keep), _kernel_array(b2.reshape(1, K), keep)
        if M > 1:
            Y = np.repeat(Y, M, axis=0)
        counts = run(chain, M, K, threads, X, Y, out.reshape(-1), *setup.common, seed_lo,
                     seed_hi, stream64, blk, setup.fused, setup.hw)
        if stats is not None:
            stats.add(counts[NCOUNTS - 1], counts[:NCOUNTS - 1])
        return out.astype(dtype, copy=False)
    # C-contiguous and writable (numba compiles read-only arrays as another signature)
    A, B = _kernel_array(a2.reshape((-1, M, K))), _kernel_array(b2.reshape((-1, K, N)))
    ia, ib = _batch_index(a2.shape[:-2], batch), _batch_index(b2.shape[:-2], batch)
    common = setup.common + (seed_lo, seed_hi, stream64)
    if N == 1 and order == ORDER_BLOCKED:
        X = np.ascontiguousarray(A[ia].reshape(-1, K))
        Y = np.repeat(B[ib].reshape(-1, K), M, axis=0) if M > 1 else B[ib].reshape(-1, K)
        counts = run(chain, X.shape[0], K, threads, X, Y, out.reshape(-1), *common, blk,
                     setup.fused, setup.hw)
    else:
        nitems = gemm_items(out.size // (M * N), M, N, K)
        counts = run(gemm, nitems, K * out.size // nitems, threads, A, B, ia, ib,
                     out.reshape((-1, M, N)), *common, order, blk, setup.fused, setup.hw)
    if stats is not None:
        stats.add(counts[NCOUNTS - 1], counts[:NCOUNTS - 1])
    return out.astype(dtype, copy=False)


class _Product(NamedTuple):
    """A product of two operands of one model, dtypes and shapes on one thread of the
    per-step kernels, with everything :func:`_run` works out per call worked out once
    (matmul's general call path costs more than the kernel on a 16 x 16 product)."""

    in_fmt: object           # the operands' format, or None (as given)
    setup: _Setup
    shape: tuple             # (M, K, N)
    nitems: int
    chain: bool              # the register chain (M = N = 1, blocked order), else gemm
    kernel: object           # the kernel's compiled entry point
    keep: bool               # float32 operands go to the chain as they are (else float64)

    def args(self, A, B, out, seed_lo, seed_hi, stream, counts):
        """The kernel's arguments: A (M, K) and B (K, N) float64 (float32 for a chain that
        keeps them), out (M, N)."""
        M, K, N = self.shape
        s = self.setup
        if self.chain:
            return (A.reshape((1, K)), B.reshape((1, K)), out.reshape(1)) + s.common + \
                (seed_lo, seed_hi, stream, s.blk or K, s.fused, s.hw, 0, 1, counts)
        return (A.reshape((1, M, K)), B.reshape((1, K, N)), _NO_BATCH, _NO_BATCH,
                out.reshape((1, M, N))) + s.common + (seed_lo, seed_hi, stream, s.order,
                                                      s.blk or K, s.fused, s.hw, 0,
                                                      self.nitems, counts)

    def __call__(self, a, b, seed, stream):
        """The (M, N) result of a (M, K) @ b (K, N) (or any shapes of those sizes)."""
        if self.in_fmt is not None:
            a, b = quantize(a, self.in_fmt), quantize(b, self.in_fmt)
        s = self.setup
        out = np.empty(self.shape[::2])
        if seed is None and type(stream) is int and stream == 0 and s.mode < STOCHASTIC and \
                s.omode < STOCHASTIC:
            seeds = (0, 0, 0)               # what keys() gives a deterministic request
        else:
            seeds = keys(seed, stream, max(s.mode, s.omode))
        # C order and writable, as the kernel's signature has them
        self.kernel(*self.args(_kernel_array(a, self.keep), _kernel_array(b, self.keep), out,
                               *seeds, _DISCARD))
        return out.astype(s.dtype, copy=False)


#: (op, a.dtype, b.dtype, a.shape, b.shape, model and its keywords) -> _Product
_PRODUCTS: dict = {}
#: products kept at most
MAX_CACHED = 256


def _cached_product(op, a, b, stats, out, model_keys):
    """(the _Product of this call or None, its key or None when it is not one to cache):
    numpy float32/float64 operands, no stats, no out.  The order (the last model key) is
    checked first: the key compares values, and ("blocked", True) == ("blocked", 1)."""
    if model_keys[-1] is not None:
        model_keys = model_keys[:-1] + (check_order(model_keys[-1]),)
    if type(a) is not _ndarray or type(b) is not _ndarray or stats is not None or \
            out is not None or a.dtype not in _CONTAINER_DTYPES or \
            b.dtype not in _CONTAINER_DTYPES:
        return None, None
    key = (op, a.dtype, b.dtype, a.shape, b.shape) + model_keys
    try:
        return _PRODUCTS.get(key), key
    except TypeError:               # unhashable keywords: validated by the general path
        return None, None


def _remember_product(key, a, b, m: AccumulationModel, op):
    """Store the _Product of this call in _PRODUCTS when its product runs on one thread
    in one of :func:`_run`'s kernels without a batch (a (M, K), b (K, N), not BLAS)."""
    if key is None or a.ndim != 2 or b.ndim != 2:
        return
    setup = _setup(m, a.dtype if a.dtype is b.dtype else np.result_type(a, b),
                   a.dtype == b.dtype, op)
    (M, K), N = a.shape, b.shape[1]
    chain_ = N == 1 and setup.order == ORDER_BLOCKED
    if setup.blas or min(M, K, N) == 0 or M * N * K >= PARALLEL_STEPS or (chain_ and M > 1):
        return
    kernel = chain if chain_ else gemm_kernel(setup.order, setup.mode, setup.omode)
    keep = chain_ and a.dtype is _F32 and b.dtype is _F32
    product = _Product(m.in_fmt, setup, (M, K, N), 1 if chain_ else gemm_items(1, M, N, K),
                       chain_, None, keep)
    work = np.float32 if keep else np.float64
    args = product.args(np.zeros((M, K), work), np.zeros((K, N), work), np.zeros((M, N)), 0,
                        0, 0, np.zeros(NCOUNTS, np.int64))
    if len(_PRODUCTS) >= MAX_CACHED:     # a program whose shapes moved on: start afresh
        _PRODUCTS.clear()
    _PRODUCTS[key] = product._replace(
        kernel=entry_point(kernel, args, f"lpsim.ops' {kernel.__name__} kernel"))


def _counted_on_success(func):
    """``func`` (matmul, dot or sum) with its ``stats`` staged (lpsim.stats.staged): added
    into only once the call has succeeded, so that a call refused after it counted (a bad
    ``out`` is found as the result is delivered) changes nothing."""
    @functools.wraps(func)
    def call(*args, stats=None, **kwargs):
        if stats is None:
            return func(*args, **kwargs)
        scratch = staged(stats)
        result = func(*args, stats=scratch, **kwargs)
        commit(stats, scratch)
        return result
    return call


def _finish(result, like_torch, out, op):
    """The result as the caller's kind: a torch tensor for torch inputs, else numpy's
    conventions (``out=``, 0-d results as numpy scalars)."""
    if like_torch and out is None:
        import torch
        result = np.asarray(result)     # 0-d stays 0-d (np.ascontiguousarray makes it 1-d)
        if not (result.flags.c_contiguous and result.flags.writeable):
            result = result.copy()
        return torch.from_numpy(result)
    return deliver(result, out, op)


@_counted_on_success
def matmul(a, b, *, model=None, in_fmt=None, acc_fmt=None, out_fmt=None, acc_rounding=None,
           out_rounding=None, fused=None, order=None, seed=None, stream=0, stats=None,
           out=None):
    """a @ b with inputs rounded to in_fmt, a per-step rounded accumulator and an output format.

    a (..., M, K), b (..., K, N) (1-D and batch dimensions as numpy.matmul): float32/float64
    arrays or CPU torch tensors.  model: a name in :data:`lpsim.ops.MODELS` or an
    :class:`AccumulationModel`; the other keywords override it.  Without a model: in_fmt None
    (operands as given), acc_fmt the container's format (fp32 or fp64), out_fmt = acc_fmt,
    nearest rounding, fused=True, order=None.  fused=True (the default, as in the named
    models) is an FMA into the accumulator: acc = fl(acc + a_t b_t), one rounding per step.
    A plain loop ``acc += a[t] * b[t]`` in the accumulator's precision rounds the product
    first: to reproduce it pass fused=False and order="sequential" (with in_fmt and acc_fmt
    "fp32" that equals a float32 loop bit for bit).  Steps, orders, the BLAS path and the
    counter of each random word: this module's docs.  The result container is numpy's result
    type, float64 when out_fmt does not fit float32.  stats counts every rounding
    (accumulator and output; on the BLAS path the output only).  A tensor-core model
    (:mod:`lpsim.ops.hardware`) takes in_fmt, out_fmt and out_rounding; its own accumulator
    fixes the rest, so acc_fmt, acc_rounding, fused and order raise a ValueError with it.
    """
    op = "matmul"
    product, key = _cached_product(op, a, b, stats, out, (model, in_fmt, acc_fmt, out_fmt,
                                                          acc_rounding, out_rounding, fused,
                                                          order))
    if product is not None:
        return product(a, b, seed, stream)
    like_torch = is_torch(a) or is_torch(b)
    block = None            # a block in_fmt: a and b come back as its values
    if not _passes_through(model, in_fmt):   # tensor-core models, block in_fmt
        _check_stats(stats, op)
        given = in_fmt
        done, a, b, model, in_fmt = dispatch(a, b, model, in_fmt, seed, stream, stats,
                                             acc_fmt=acc_fmt, out_fmt=out_fmt,
                                             acc_rounding=acc_rounding,
                                             out_rounding=out_rounding, fused=fused,
                                             order=order)
        if done is not None:
            return _finish(done, like_torch, out, op)
        if in_fmt is None and given is not None:
            block, key = given, None    # not cached: a cached product would skip the blocks
    a, b = as_array(a, "a", op), as_array(b, "b", op)
    if block is not None and fits_float32(a) and fits_float32(b):
        in_fmt = PRESETS["fp32"]        # block values that float32 holds: taken as they are
    m = resolve(model, _dtype_of(a, b), in_fmt, acc_fmt, out_fmt, acc_rounding, out_rounding,
                fused, order)
    _check_stats(stats, op)
    if block is None:
        a, b = round_inputs((a, b), m.in_fmt, ("a", "b"), op, stats)
    try:
        result = _run(a, b, m, seed=seed, stream=stream, stats=stats, op=op,
                      torch_blas=like_torch)
    except ValueError as error:
        if block is None or "too wide for the per-step simulation" not in str(error):
            raise
        raise ValueError(
            f"matmul: in_fmt={block!r} gives block values (element times scale) that float32 "
            "cannot hold, and the per-step accumulator simulation (acc_fmt="
            f"{m.acc_fmt!r}) needs operands that fit float32, so that every product is exact "
            "in float64; accepted with these operands: acc_fmt='fp64' with order=None "
            "(float64 BLAS on the block values) or a tensor-core model (lpsim.ops."
            "HARDWARE_MODELS)") from None
    _remember_product(key, a, b, m, op)
    if a.ndim == 1 and b.ndim == 1:
        result = result[..., 0, 0]
    elif a.ndim == 1:
        result = result[..., 0, :]
    elif b.ndim == 1:
        result = result[..., 0]
    return _finish(result, like_torch, out, op)


@_counted_on_success
def dot(x, y, *, model=None, in_fmt=None, acc_fmt=None, out_fmt=None, acc_rounding=None,
        out_rounding=None, fused=None, order=None, seed=None, stream=0, stats=None, out=None):
    """Inner products over the last axis of x and y (shapes (..., K), broadcast), simulated.

    The same keywords and steps as :func:`matmul`; output element o (C order over the
    broadcast leading shape) uses counters o*2K ...  A 1-D pair gives a 0-d result.
    fused=True (default) is an FMA into the accumulator; a plain ``acc += x[t] * y[t]`` loop
    rounds each product first: pass fused=False to reproduce it.
    """
    op = "dot"
    product, key = _cached_product(op, x, y, stats, out, (model, in_fmt, acc_fmt, out_fmt,
                                                          acc_rounding, out_rounding, fused,
                                                          order))
    if product is not None:
        return product(x, y, seed, stream)[0, 0]
    like_torch = is_torch(x) or is_torch(y)
    x, y = as_array(x, "x", op), as_array(y, "y", op)
    if x.ndim == 0 or y.ndim == 0:
        raise ValueError(f"dot: operands must have at least one dimension, got shapes "
                         f"{x.shape} and {y.shape}")
    if x.shape[-1] != y.shape[-1]:
        raise ValueError(f"dot: shapes {x.shape} and {y.shape} do not match: lengths "
                         f"{x.shape[-1]} and {y.shape[-1]} differ; accepted: (..., K) and "
                         "(..., K)")
    m = resolve(model, _dtype_of(x, y), in_fmt, acc_fmt, out_fmt, acc_rounding, out_rounding,
                fused, order)
    _check_stats(stats, op)
    x, y = round_inputs((x, y), m.in_fmt, ("x", "y"), op, stats)
    result = _run(x[..., None, :], y[..., :, None], m, seed=seed, stream=stream, stats=stats,
                  op=op)
    if x.ndim == 1 and y.ndim == 1:
        _remember_product(key, x[None, :], y[:, None], m, op)
    return _finish(result[..., 0, 0], like_torch, out, op)


@_counted_on_success
def sum(x, axis=None, *, model=None, in_fmt=None, acc_fmt=None, out_fmt=None,  # noqa: A001
        acc_rounding=None, out_rounding=None, fused=None, order=None, seed=None, stream=0,
        stats=None, out=None):
    """Sums of x over ``axis`` (None: every element, in C order; an int or a tuple of ints,
    as numpy.sum), simulated: the terms x_t (= x_t * 1) in C order of the reduced axes.

    The same keywords and steps as :func:`matmul`; fused=False rounds each x_t to acc_fmt
    before adding it, fused=True adds it exactly.  Output element o (C order over the axes
    kept) uses counters o*2K ..., K the number of terms.
    """
    op = "sum"
    like_torch = is_torch(x)
    x = as_array(x, "x", op)
    axes = _axes(axis, x.ndim, op)
    m = resolve(model, x.dtype, in_fmt, acc_fmt, out_fmt, acc_rounding, out_rounding, fused,
                order)
    _check_stats(stats, op)
    (x,) = round_inputs((x,), m.in_fmt, ("x",), op, stats)
    kept = [d for d in range(x.ndim) if d not in axes]
    K = math.prod(x.shape[d] for d in axes)
    terms = np.transpose(x, kept + list(axes)).reshape(tuple(x.shape[d] for d in kept) + (K,))
    ones = np.ones((terms.shape[-1], 1), x.dtype)
    result = _run(terms[..., None, :], ones, m, seed=seed, stream=stream, stats=stats, op=op)
    return _finish(result[..., 0, 0], like_torch, out, op)


def _axes(axis, ndim: int, op: str) -> tuple:
    """``axis`` (None, an int or a tuple of ints) as sorted non-negative axes, numpy's way."""
    if axis is None:
        return tuple(range(ndim))
    items = axis if isinstance(axis, tuple) else (axis,)
    out = []
    for a in items:
        if isinstance(a, bool) or not isinstance(a, (int, np.integer)):
            raise TypeError(f"{op}: axis={axis!r} must be None, an integer or a tuple of "
                            "integers")
        if not -ndim <= a < ndim:
            raise ValueError(f"{op}: axis={axis!r} is out of range for an array of "
                             f"{ndim} dimensions")
        out.append(int(a) % ndim)
    if len(set(out)) != len(out):
        raise ValueError(f"{op}: axis={axis!r} repeats an axis")
    return tuple(sorted(out))


def _check_stats(stats, op: str) -> None:
    check_stats(stats, where=f"{op}: ")
