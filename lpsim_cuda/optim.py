"""The fused optimizer step on the GPU: one launch per parameter, the CPU kernel's scalar core.

Each thread steps quads of four consecutive global elements in a grid-stride loop with
:func:`lpsim.optim.step.step_quad`, the function the CPU kernel runs: bf16/fp16 weights and
states are read and written as their 16-bit codes, the float32 work stays in registers, and
the random bits are Philox words made in registers from (seed, step, parameter, element).

Where a parameter's quads are aligned (its global offset a multiple of 4, every array's data
aligned to four elements), each thread reads a quad of every array with one 8- or 16-byte
load before it computes anything and writes it with one store (:func:`_step_quad_vector`):
the four lanes take the straight path (:func:`lpsim.optim.step.step_codes` with
``fast=True``), and a quad where a lane leaves it (NaN, inf, overflow, subnormal results)
is stepped again from its untouched codes by step_quad.  One element per access, with its
stores between the next element's loads, left a thread's memory accesses in series: the
step ran at 0.24 of the bandwidth bound on an H100 (benchmarks/results/gpu-summary.json).

numba.cuda contracts ``a*b + c`` into an FMA (NVVM's default), which rounds once where the
CPU rounds twice; so on a real GPU the step's products (:func:`lpsim.optim.step.fmul`) are
rebound to ``fmul_rn`` (:func:`rebind`), one source compiled with another primitive.  The
simulator runs the Python source as it is.
"""

from __future__ import annotations

import types

import numpy as np
from numba import cuda
from numba.extending import register_jitable

from lpsim.optim import step as core
from lpsim.optim.step import ADAMW, KAHAN, NCOUNTS, REMAINDER, STOCHASTIC
from lpsim.philox import block_words_keyed, round_keys

from . import arrays, launch, vector
from .launch import THREADS

#: resident 128-thread blocks per SM the step kernels are compiled for: ptxas then keeps
#: them within 65536 / (128 x 5) = 102 registers a thread (the wide kernel wants ~118)
BLOCKS_PER_SM = 5
#: whether the wide kernel loads the next quad before it steps its own (its loads in flight
#: during the step's ~140 instructions an element), at 8 registers more: off until a GPU
#: run of benchmarks/bench_optim.py (its "next quad loaded ahead" case) says it pays
LOAD_AHEAD = False
#: the functions of lpsim.optim.step that call fmul, directly or through one another
_USERS = ("adamw_moments", "adamw_update", "adamw_direction", "sgd_gradient", "sgd_buffer",
          "sgd_update", "sgd_direction", "step_codes", "step_element", "step_quad")


def rebind(module, overrides: dict, names=_USERS) -> dict:
    """Copies of ``module``'s functions ``names`` whose globals see ``overrides`` (and each
    other's copies), each registered as jitable: the same source with other primitives."""
    space = dict(vars(module))
    space.update(overrides)
    copies = {}
    for name in names:
        fn = getattr(module, name)
        copies[name] = register_jitable(types.FunctionType(fn.__code__, space, fn.__name__,
                                                           fn.__defaults__, fn.__closure__))
    space.update(copies)
    return copies


if launch.SIMULATOR:
    _step_quad, _step_codes = core.step_quad, core.step_codes
else:                                                      # pragma: no cover (GPU only)
    from numba.cuda import libdevice

    @cuda.jit(device=True)
    def _fmul_rn(a, b):
        return libdevice.fmul_rn(a, b)

    _rebound = rebind(core, {"fmul": _fmul_rn})
    _step_quad, _step_codes = _rebound["step_quad"], _rebound["step_codes"]
#: the wide kernel's fallback for a quad a lane declines (its own name: the kernel budget's
#: straight count stubs it, benchmarks/kernel_budget.py)
_declined_quad = _step_quad


@register_jitable
def _codes4(a, j, present):
    """Elements 4j .. 4j+3 of ``a`` by one wide load, or zeros where the configuration has no
    such tensor (``present``, a constant)."""
    if present:
        c0, c1, c2, c3 = vector.load4(a, j)
        return np.int64(c0), np.int64(c1), np.int64(c2), np.int64(c3)
    zero = np.int64(0)
    return zero, zero, zero, zero


@register_jitable
def _words4(q, stream, ks, drawn):
    """Philox block q of ``stream`` under the seed's round keys ``ks`` where a rounding is
    stochastic (``drawn``), else zeros."""
    if drawn:
        return block_words_keyed(q, stream, ks)
    zero = np.int64(0)
    return zero, zero, zero, zero


@register_jitable
def _quad_codes(j, wb, gb, mb, vb, cb, rb, hp, ints):
    """The codes of local elements 4j .. 4j+3 of each array the configuration has (zeros
    for the others), each array's four by one wide load."""
    algo, update = ints[0], ints[1]
    hasm = algo == ADAMW or hp[10] != 0
    return (_codes4(wb, j, True), _codes4(gb, j, True), _codes4(mb, j, hasm),
            _codes4(vb, j, algo == ADAMW), _codes4(cb, j, update == KAHAN),
            _codes4(rb, j, update == REMAINDER))


@register_jitable
def _step_quad_vector(j, n, offset, codes, wb, gb, mb, vb, cb, rb, kinds, hp, ints, keys, ks,
                      pw, pc, ps, sp16, counts):
    """Local elements 4j .. 4j+3 (offset a multiple of 4) from their ``codes``
    (:func:`_quad_codes`), every array written by one wide store, the four lanes by the
    straight path; where a lane declines, the quad by step_quad from its codes in memory,
    which nothing has written yet."""
    algo, update, wmode, smode = ints[0], ints[1], ints[2], ints[4]
    stream_w, stream_m, stream_v = keys[2], keys[3], keys[4]
    q = (offset >> 2) + j
    hasm = algo == ADAMW or hp[10] != 0
    rw0, rw1, rw2, rw3 = _words4(q, stream_w, ks, wmode == STOCHASTIC)
    rm0, rm1, rm2, rm3 = _words4(q, stream_m, ks, smode == STOCHASTIC)
    rv0, rv1, rv2, rv3 = _words4(q, stream_v, ks, smode == STOCHASTIC and algo == ADAMW)
    (w0, w1, w2, w3), (g0, g1, g2, g3), (m0, m1, m2, m3), (v0, v1, v2, v3), \
        (c0, c1, c2, c3), (e0, e1, e2, e3) = codes
    a0 = _step_codes(w0, g0, m0, v0, c0, e0, rw0, rm0, rv0, kinds, hp, ints, pw, pc, ps, sp16,
                     True)
    a1 = _step_codes(w1, g1, m1, v1, c1, e1, rw1, rm1, rv1, kinds, hp, ints, pw, pc, ps, sp16,
                     True)
    a2 = _step_codes(w2, g2, m2, v2, c2, e2, rw2, rm2, rv2, kinds, hp, ints, pw, pc, ps, sp16,
                     True)
    a3 = _step_codes(w3, g3, m3, v3, c3, e3, rw3, rm3, rv3, kinds, hp, ints, pw, pc, ps, sp16,
                     True)
    if a0[7] & a1[7] & a2[7] & a3[7]:
        vector.store4(wb, j, a0[0], a1[0], a2[0], a3[0])
        if hasm:
            vector.store4(mb, j, a0[1], a1[1], a2[1], a3[1])
        if algo == ADAMW:
            vector.store4(vb, j, a0[2], a1[2], a2[2], a3[2])
        if update == KAHAN:
            vector.store4(cb, j, a0[3], a1[3], a2[3], a3[3])
        elif update == REMAINDER:
            vector.store4(rb, j, a0[4], a1[4], a2[4], a3[4])
        counts[0] += (a0[5] & 1) + (a1[5] & 1) + (a2[5] & 1) + (a3[5] & 1)
        counts[6] += a0[6] + a1[6] + a2[6] + a3[6]
    else:
        _declined_quad(q, n, offset, wb, gb, mb, vb, cb, rb, kinds, hp, ints, keys, pw, pc, ps,
                       sp16, counts)


@register_jitable
def _step_all(wb, gb, mb, vb, cb, rb, kinds, hp, ints, keys, offset, pw, pc, ps, sp16, counts):
    """Every quad of one parameter in a grid-stride loop; the counters added into
    ``counts`` with one atomic per counter and thread."""
    n = wb.size
    first = offset // 4
    nquads = (offset + n + 3) // 4 - first
    local = cuda.local.array(NCOUNTS, np.int64)
    for f in range(NCOUNTS):
        local[f] = 0
    j = cuda.grid(1)
    while j < nquads:
        _step_quad(first + j, n, offset, wb, gb, mb, vb, cb, rb, kinds, hp, ints, keys, pw, pc,
                   ps, sp16, local)
        j += cuda.gridsize(1)
    _add_counts(counts, local)


@register_jitable
def _add_counts(counts, local):
    for f in range(NCOUNTS):
        if local[f]:
            cuda.atomic.add(counts, f, local[f])


@register_jitable
def _step_vectors(wb, gb, mb, vb, cb, rb, kinds, hp, ints, keys, ks, offset, pw, pc, ps, sp16,
                  counts, ahead):
    """:func:`_step_all` for a parameter whose quads are aligned: the whole quads by
    :func:`_step_quad_vector` in a grid-stride loop, the last n % 4 elements by thread 0.
    ``ahead`` (a constant): each pass loads the next pass's quad before it steps its own,
    so its loads are in flight while the step computes."""
    n = wb.size
    full = n >> 2
    local = cuda.local.array(NCOUNTS, np.int64)
    for f in range(NCOUNTS):
        local[f] = 0
    j = cuda.grid(1)
    stride = cuda.gridsize(1)
    zero = np.int64(0)
    none = (zero, zero, zero, zero)
    codes = (none, none, none, none, none, none)
    if ahead and j < full:
        codes = _quad_codes(j, wb, gb, mb, vb, cb, rb, hp, ints)
    while j < full:
        if ahead:
            now = codes
            if j + stride < full:
                codes = _quad_codes(j + stride, wb, gb, mb, vb, cb, rb, hp, ints)
        else:
            now = _quad_codes(j, wb, gb, mb, vb, cb, rb, hp, ints)
        _step_quad_vector(j, n, offset, now, wb, gb, mb, vb, cb, rb, kinds, hp, ints, keys,
                          ks, pw, pc, ps, sp16, local)
        j += stride
    if cuda.grid(1) == 0 and (n & 3) != 0:
        _step_quad((offset >> 2) + full, n, offset, wb, gb, mb, vb, cb, rb, kinds, hp, ints,
                   keys, pw, pc, ps, sp16, local)
    _add_counts(counts, local)


def _make_kernel(kinds, ints, pw, pc, ps, sp16, wide=False):
    """The step kernel of one configuration: storage kinds, the integer options (algorithm,
    update, modes, sr bits, nesterov, first step) and the formats' parameters are
    compile-time constants, so each branch on them folds away and the decision keeps only
    the registers its own case needs (AdamW bf16 SR: 162 -> 90 per thread).  The
    hyperparameters, keys (and the seed's round keys, ``ks``) and offset stay arguments:
    they change from step to step.
    ``wide``: the aligned kernel (:func:`_step_vectors`), which a call takes where
    :func:`aligned` holds."""
    KINDS, INTS, PW, PC, PS, SP16, AHEAD = kinds, ints, pw, pc, ps, sp16, LOAD_AHEAD

    if wide:
        def kernel(wb, gb, mb, vb, cb, rb, hp, keys, ks, offset, counts):
            _step_vectors(wb, gb, mb, vb, cb, rb, KINDS, hp, INTS, keys, ks, offset, PW, PC,
                          PS, SP16, counts, AHEAD)
    else:
        def kernel(wb, gb, mb, vb, cb, rb, hp, keys, ks, offset, counts):
            _step_all(wb, gb, mb, vb, cb, rb, KINDS, hp, INTS, keys, offset, PW, PC, PS, SP16,
                      counts)

    if launch.SIMULATOR:
        return cuda.jit(kernel)
    return cuda.jit(kernel, launch_bounds=(THREADS, BLOCKS_PER_SM))   # pragma: no cover


#: configuration -> its kernel (profile_cuda.py and kernel_budget.py read what was made)
KERNELS: dict = {}


def optim_kernel(kinds: tuple, ints: tuple, pw, pc, ps, sp16, wide: bool = False):
    """The step kernel of a configuration (:func:`_make_kernel`), made once."""
    key = (kinds, ints, pw, pc, ps, sp16, wide, LOAD_AHEAD, BLOCKS_PER_SM)
    found = KERNELS.get(key)
    if found is None:
        found = KERNELS[key] = _make_kernel(kinds, ints, pw, pc, ps, sp16, wide)
    return found


def aligned(offset: int, arrays) -> bool:
    """Whether a parameter can take the wide kernel: its first element starts a Philox
    quad and every array's data is aligned to four of its elements."""
    return offset % 4 == 0 and all(launch.address(a) % (4 * a.dtype.itemsize) == 0
                                   for a in arrays)


def step_arrays(wb, gb, mb, vb, cb, rb, kinds, hp, ints, keys, offset, setup, counts,
                stream=0):
    """Launch the step over flat integer device arrays of one parameter's bits (in place);
    the NCOUNTS counters are added into the device array ``counts``."""
    n = wb.size
    if n == 0:
        return
    wide = aligned(offset, (wb, gb, mb, vb, cb, rb))
    nquads = max(n // 4, 1) if wide else (offset + n + 3) // 4 - offset // 4
    grid = launch.grid_size(nquads, launch.current_device())
    kinds, ints, sp16 = tuple(kinds), tuple(ints), tuple(setup.sp16)
    kernel = optim_kernel(kinds, ints, setup.pw, setup.pc, setup.ps, sp16, wide)
    kernel[grid, THREADS, stream](*kernel_arguments((wb, gb, mb, vb, cb, rb), hp, keys, offset,
                                                    counts))


def kernel_arguments(arrays, hp, keys, offset, counts) -> tuple:
    """A step kernel's arguments: the six arrays, the hyperparameters, the keys (seed halves
    and streams), the seed's 20 Philox round keys (lpsim.philox.round_keys: the wide kernel
    draws with them, which ptxas holds in uniform registers instead of making the key
    schedule again each pass), the offset and the counters."""
    return (*arrays, hp, keys, round_keys(keys[0], keys[1]), offset, counts)


def step(param, grad, m, v, c, r, kargs, setup, counts):                # pragma: no cover
    """Step torch CUDA tensors (contiguous) on torch's current stream; counters go to the
    device array ``counts`` (NCOUNTS int64), read by the optimizer when asked."""
    with launch.device_of(param):
        stream = launch.torch_stream(param.device)
        sdtype = np.int16 if setup.state_dtype.itemsize == 2 else np.int32
        views = [arrays._torch_bits(t) if t is not None else launch.placeholder((1,), dt)
                 for t, dt in ((param, None), (grad, None), (m, sdtype), (v, sdtype),
                               (c, sdtype), (r, np.int16))]
        step_arrays(*views, *kargs, setup, counts, stream)
