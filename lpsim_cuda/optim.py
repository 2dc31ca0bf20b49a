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

A *set* (the tensors of one param group that share dtypes and step count, as
:mod:`lpsim.optim.multi` groups them on the CPU) is stepped by one launch (:class:`Table`): a
device table holds each tensor's addresses, size and streams, the grid-stride loop runs over
tiles of TILE_PASSES x THREADS quads numbered across the set, and each tile finds its tensor
by a binary search of the table, then steps its quads with the same functions as the
per-tensor kernels.  A thread's counters are int32 (it steps far fewer than 2**31
elements), summed over its warp in int64 at its end and added into the int64 ones by one
atomic per warp and counter (one a thread put two atomics a thread, the inexact and the
cancelled counts, ~170 000 a step at 10**8 parameters, on two neighbouring addresses).
A launch through numba costs tens of microseconds of host time, so a model of a few hundred
tensors spent milliseconds a step launching before.

The straight path is bound by the integer pipe, which issues at half the float32 rate
(benchmarks/kernel_budget.py's ``alu/e``), so it keeps work off it: bfloat16 moments rounded
to nearest by one ``cvt.rn.bf16x2.f32`` for the two (:mod:`lpsim_cuda.ptx`) instead of ~9
integer instructions each; the quotient m / (sqrt(v) + eps) without IEEE division's and
square root's branches to slow-path calls, around which the compiler kept the step's
predicates in integer registers (the square root by its own fast path, the quotient from
``rcp.approx`` with a proof that it is the correctly rounded one,
:func:`lpsim.optim.step.verified_quotient`); the weight's rounding from float64 in float64
arithmetic (:func:`lpsim.optim.step.by_float64`); bfloat16 arrays read and written as
float32 bits a pair of codes at a time (:func:`_load4`, :func:`_store4`).  Where a check
cannot answer, the quad takes the general path, as it does for a NaN.  AdamW's bf16 SR step
went from 142.5 to 90.8 straight instructions a parameter and from 82 to 33.8 integer ones.

numba.cuda contracts ``a*b + c`` into an FMA (NVVM's default), which rounds once where the
CPU rounds twice; so on a real GPU the step's products (:func:`lpsim.optim.step.fmul`) are
rebound to ``fmul_rn`` (:func:`rebind`), one source compiled with another primitive, and the
explicit FMAs of the bias corrections' division (:func:`lpsim.optim.step.divide_by`) to
libdevice's ``fmaf``.  The simulator runs the Python source as it is (its FMA exact in float64,
:func:`lpsim.ops.mma.fma32`).
"""

from __future__ import annotations

import contextlib
import ctypes
import types

import numpy as np
from numba import cuda
from numba.extending import register_jitable

from lpsim.optim import step as core
from lpsim.optim.step import ADAMW, KAHAN, NCOUNTS, REMAINDER, STOCHASTIC
from lpsim.philox import block_words_keyed, round_keys

from . import arrays, launch, ptx, specialised, vector
from .counters import add_warp_count
from .launch import THREADS

#: resident 128-thread blocks per SM the step kernels are compiled for: ptxas then keeps
#: them within 65536 / (128 x 5) = 102 registers a thread (the wide kernel wants ~118)
BLOCKS_PER_SM = 5
#: whether the wide kernel loads the next quad before it steps its own (its loads in flight
#: during the step's ~140 instructions an element), at 8 registers more: off until a GPU
#: run of benchmarks/bench_optim.py (its "next quad loaded ahead" case) says it pays
LOAD_AHEAD = False
#: the functions of lpsim.optim.step that call fmul, fma32, round_moments or adam_ratio,
#: directly or through one another
_USERS = ("divide_by", "adamw_moments", "decoupled_decay", "adamw_scaled", "adamw_update",
          "adamw_direction", "sgd_gradient", "sgd_buffer", "sgd_update", "sgd_direction",
          "step_codes", "step_element", "step_quad")


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


@register_jitable
def _bfloat16_grid(p) -> bool:
    """Whether float32-container Params ``p`` round as bfloat16 does from 2**-96 to 2**121
    (the range lpsim.optim.step.round_moments' caller keeps): 7 mantissa bits, normal from
    2**-126, finite past 2**121; a constant in compiled code."""
    return p.M == 23 and p.m == 7 and p.emin == -126 and p.maxb >= 0x7C000000


if launch.SIMULATOR:
    _step_quad, _step_codes = core.step_quad, core.step_codes
else:                                                      # pragma: no cover (GPU only)
    from numba.cuda import libdevice

    @cuda.jit(device=True)
    def _fmul_rn(a, b):
        return libdevice.fmul_rn(a, b)

    @cuda.jit(device=True)
    def _fmaf(a, b, c):
        return libdevice.fmaf(a, b, c)

    @cuda.jit(device=True)
    def _fadd_rn(a, b):
        return libdevice.fadd_rn(a, b)

    @register_jitable
    def _root(x):
        """sqrt(x) by the fast path of the compiler's own correctly rounded square root
        (sqrt.rn: MUFU.RSQ, two products, two FMAs), which it takes for x from 2**-101 to
        the largest float32 (and leaves to a call elsewhere).  adam_ratio's ``vh`` lies
        there wherever the straight path keeps the step: a quotient divide_by took, so from
        2**-96 to 2**120 (lpsim.optim.step.adam_ratio)."""
        y = ptx.rsqrt_approx(x)
        s = _fmul_rn(x, y)
        return _fmaf(_fmaf(-s, s, x), _fmul_rn(y, np.float32(0.5)), s)

    @register_jitable
    def _round_moments(m, v, mode, rm, rv, k, p):
        """Moments to bfloat16 nearest by one ``cvt.rn.bf16x2.f32`` for the two, or
        stochastically by float32 arithmetic (lpsim.optim.step.sr_by_float32; the shared
        source's lpsim.optim.step.round_moments says why ok is 1); every other state format
        and mode as the shared source."""
        if mode == core.NEAREST and _bfloat16_grid(p):
            m, v = ptx.bf16_nearest2(m, v)
            return m, v, np.int64(1)
        if mode == STOCHASTIC and k == 32 and _bfloat16_grid(p):
            # in float32 arithmetic (its ok, too, is the divisions' to decide)
            return _sr_by_float32(m, rm, p)[0], _sr_by_float32(v, rv, p)[0], np.int64(1)
        return core.round_moments(m, v, mode, rm, rv, k, p)

    _floats = rebind(core, {"fmul": _fmul_rn, "fma32": _fmaf},
                     ("verified_quotient", "is_nearest_quotient", "sr_by_float32"))
    _quotient, _sr_by_float32 = _floats["verified_quotient"], _floats["sr_by_float32"]

    @register_jitable
    def _adam_ratio(mh, vh, eps):
        """(mh / (sqrt(vh) + eps), ok) without a branch or a call: lpsim.optim.step.adam_ratio
        on the GPU, by :func:`_root` and lpsim.optim.step.verified_quotient from
        ``rcp.approx``."""
        d = _fadd_rn(_root(vh), eps)
        return _quotient(mh, d, ptx.rcp_approx(d))

    _rebound = rebind(core, {"fmul": _fmul_rn, "fma32": _fmaf,
                             "round_moments": _round_moments, "adam_ratio": _adam_ratio})
    _step_quad, _step_codes = _rebound["step_quad"], _rebound["step_codes"]
#: the general step of a quad the wide path does not take: one of its lanes declined, it is
#: a tensor's partial last quad, or a set's tensor that is not aligned (its own name: the
#: kernel budget's straight count stubs it, benchmarks/kernel_budget.py)
_general_quad = _step_quad


@register_jitable
def _codes4(a, j, present):
    """Elements 4j .. 4j+3 of ``a`` by one wide load, or zeros where the configuration has no
    such tensor (``present``, a constant)."""
    if present:
        c0, c1, c2, c3 = vector.load4(a, j)
        return np.int64(c0), np.int64(c1), np.int64(c2), np.int64(c3)
    zero = np.int64(0)
    return zero, zero, zero, zero


def _load4(a, j, present, halves):
    """:func:`_codes4`, or where ``halves`` (a constant: ``a`` holds bfloat16 codes) the four
    as float32 bits (lpsim_cuda.vector.load4_halves), which the step then takes as float32
    storage (:func:`_vector_kinds`)."""
    if present and halves:
        b0, b1, b2, b3 = vector.load4_halves(a, j)
        return np.int64(b0), np.int64(b1), np.int64(b2), np.int64(b3)
    return _codes4(a, j, present)


def _store4(a, j, halves, w0, w1, w2, w3):
    """vector.store4, or where ``halves`` (a constant) the codes of four float32 bit
    patterns (vector.store4_halves)."""
    if halves:
        vector.store4_halves(a, j, w0, w1, w2, w3)
    else:
        vector.store4(a, j, w0, w1, w2, w3)


if not launch.SIMULATOR:                                   # pragma: no cover (NVVM only)
    from numba.core import types as _types
    from numba.core.extending import overload

    def _holds_codes(a) -> bool:
        """Whether the array (or pointer) type ``a`` holds 16-bit codes."""
        return getattr(a, "dtype", None) == _types.int16

    # numba types both branches of the source: arrays of 16-bit codes take it, others the
    # branch that holds for them (the halves forms take only 16-bit codes)
    @overload(_load4, target="cuda")
    def _load4_cuda(a, j, present, halves):
        if _holds_codes(a):
            return _load4
        return lambda a, j, present, halves: _codes4(a, j, present)

    @overload(_store4, target="cuda")
    def _store4_cuda(a, j, halves, w0, w1, w2, w3):
        if _holds_codes(a):
            return _store4
        return lambda a, j, halves, w0, w1, w2, w3: vector.store4(a, j, w0, w1, w2, w3)


@register_jitable
def _halves(kinds):
    """Which of the weight, gradient and state arrays hold bfloat16 codes, which the wide
    step reads and writes as float32 bits at the quad (:func:`_load4`, :func:`_store4`)."""
    bf16 = core.STORE_BF16
    return kinds[0] == bf16, kinds[1] == bf16, kinds[2] == bf16


@register_jitable
def _vector_kinds(kinds):
    """The storage kinds the wide step runs its lanes with: float32 where :func:`_halves`
    holds, so the lanes see the bits the quad made; the same values, without a shift each
    way an element."""
    wh, gh, sh = _halves(kinds)
    f32 = core.STORE_F32
    return f32 if wh else kinds[0], f32 if gh else kinds[1], f32 if sh else kinds[2]


@register_jitable
def _words4(q, stream, ks, drawn):
    """Philox block q of ``stream`` under the seed's round keys ``ks`` where a rounding is
    stochastic (``drawn``), else zeros."""
    if drawn:
        return block_words_keyed(q, stream, ks)
    zero = np.int64(0)
    return zero, zero, zero, zero


@register_jitable
def _quad_codes(j, wb, gb, mb, vb, cb, rb, kinds, hp, ints):
    """The codes of local elements 4j .. 4j+3 of each array the configuration has (zeros
    for the others; a bfloat16 array's as float32 bits, :func:`_load4`), each array's four
    by one wide load."""
    algo, update = ints[0], ints[1]
    hasm = algo == ADAMW or hp[10] != 0
    wh, gh, sh = _halves(kinds)
    return (_load4(wb, j, True, wh), _load4(gb, j, True, gh), _load4(mb, j, hasm, sh),
            _load4(vb, j, algo == ADAMW, sh), _load4(cb, j, update == KAHAN, sh),
            _codes4(rb, j, update == REMAINDER))


@register_jitable
def _step_quad_vector(j, n, offset, codes, wb, gb, mb, vb, cb, rb, kinds, hp, ints, keys, ks,
                      pw, pc, ps, sp16, counts):
    """Local elements 4j .. 4j+3 (offset a multiple of 4) from their ``codes``
    (:func:`_quad_codes`), every array written by one wide store, the four lanes by the
    straight path; whether it stored them.  Where a lane declines, nothing is written and
    the caller steps the quad by :data:`_general_quad` from its codes in memory."""
    algo, update, wmode, smode = ints[0], ints[1], ints[2], ints[4]
    stream_w, stream_m, stream_v = keys[2], keys[3], keys[4]
    q = (offset >> 2) + j
    hasm = algo == ADAMW or hp[10] != 0
    rw0, rw1, rw2, rw3 = _words4(q, stream_w, ks, wmode == STOCHASTIC)
    rm0, rm1, rm2, rm3 = _words4(q, stream_m, ks, smode == STOCHASTIC)
    rv0, rv1, rv2, rv3 = _words4(q, stream_v, ks, smode == STOCHASTIC and algo == ADAMW)
    (w0, w1, w2, w3), (g0, g1, g2, g3), (m0, m1, m2, m3), (v0, v1, v2, v3), \
        (c0, c1, c2, c3), (e0, e1, e2, e3) = codes
    vk = _vector_kinds(kinds)
    a0 = _step_codes(w0, g0, m0, v0, c0, e0, rw0, rm0, rv0, vk, hp, ints, pw, pc, ps, sp16, True)
    a1 = _step_codes(w1, g1, m1, v1, c1, e1, rw1, rm1, rv1, vk, hp, ints, pw, pc, ps, sp16, True)
    a2 = _step_codes(w2, g2, m2, v2, c2, e2, rw2, rm2, rv2, vk, hp, ints, pw, pc, ps, sp16, True)
    a3 = _step_codes(w3, g3, m3, v3, c3, e3, rw3, rm3, rv3, vk, hp, ints, pw, pc, ps, sp16, True)
    if a0[7] & a1[7] & a2[7] & a3[7]:
        wh, _, sh = _halves(kinds)
        _store4(wb, j, wh, a0[0], a1[0], a2[0], a3[0])
        if hasm:
            _store4(mb, j, sh, a0[1], a1[1], a2[1], a3[1])
        if algo == ADAMW:
            _store4(vb, j, sh, a0[2], a1[2], a2[2], a3[2])
        if update == KAHAN:
            _store4(cb, j, sh, a0[3], a1[3], a2[3], a3[3])
        elif update == REMAINDER:
            vector.store4(rb, j, a0[4], a1[4], a2[4], a3[4])
        counts[0] += (a0[5] & 1) + (a1[5] & 1) + (a2[5] & 1) + (a3[5] & 1)
        counts[6] += a0[6] + a1[6] + a2[6] + a3[6]
        return True
    return False


@register_jitable
def _step_all(wb, gb, mb, vb, cb, rb, kinds, hp, ints, keys, offset, pw, pc, ps, sp16, counts):
    """Every quad of one parameter in a grid-stride loop; the counters added into
    ``counts`` (:func:`_add_counts`)."""
    n = wb.size
    first = offset // 4
    nquads = (offset + n + 3) // 4 - first
    local = cuda.local.array(NCOUNTS, np.int32)
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
    """A thread's counters added into ``counts``, summed over its warp first (int64): one
    atomic a warp and counter (:func:`lpsim_cuda.counters.add_warp_count`).  Every lane of
    the warp calls it, at the kernel's end."""
    for f in range(NCOUNTS):
        add_warp_count(counts, f, np.int64(local[f]))


@register_jitable
def _step_vectors(wb, gb, mb, vb, cb, rb, kinds, hp, ints, keys, ks, offset, pw, pc, ps, sp16,
                  counts, ahead):
    """:func:`_step_all` for a parameter whose quads are aligned: the whole quads by
    :func:`_step_quad_vector` in a grid-stride loop, the last n % 4 elements by thread 0.
    ``ahead`` (a constant): each pass loads the next pass's quad before it steps its own,
    so its loads are in flight while the step computes."""
    n = wb.size
    full = n >> 2
    local = cuda.local.array(NCOUNTS, np.int32)
    for f in range(NCOUNTS):
        local[f] = 0
    j = cuda.grid(1)
    stride = cuda.gridsize(1)
    zero = np.int64(0)
    none = (zero, zero, zero, zero)
    codes = (none, none, none, none, none, none)
    if ahead and j < full:
        codes = _quad_codes(j, wb, gb, mb, vb, cb, rb, kinds, hp, ints)
    while j < full:
        if ahead:
            now = codes
            if j + stride < full:
                codes = _quad_codes(j + stride, wb, gb, mb, vb, cb, rb, kinds, hp, ints)
        else:
            now = _quad_codes(j, wb, gb, mb, vb, cb, rb, kinds, hp, ints)
        if not _step_quad_vector(j, n, offset, now, wb, gb, mb, vb, cb, rb, kinds, hp, ints,
                                 keys, ks, pw, pc, ps, sp16, local):
            _general_quad((offset >> 2) + j, n, offset, wb, gb, mb, vb, cb, rb, kinds, hp,
                          ints, keys, pw, pc, ps, sp16, local)
        j += stride
    if cuda.grid(1) == 0 and (n & 3) != 0:
        _step_quad((offset >> 2) + full, n, offset, wb, gb, mb, vb, cb, rb, kinds, hp, ints,
                   keys, pw, pc, ps, sp16, local)
    _add_counts(counts, local)


#: the set table's columns: lpsim.optim.multi.Table's row (addresses of weight, gradient and
#: states, element count, global offset, the three streams at step 0), then the tensor's
#: quads, its first tile and whether its whole quads take the wide path (see Table)
W, G, M, V, C, R, N, OFFSET, SW, SM, SV, QUADS, FIRST, WIDE = range(14)
COLUMNS = 14
#: passes a thread makes over a tile of a set (a tile: TILE_PASSES x THREADS quads of one
#: tensor), so that the search of the table and the reading of a row serve several quads
#: (8: 98 straight instructions a parameter against 4's 102; a tile is then 4096 elements,
#: and a tensor smaller than that leaves the rest of its tile's threads idle for a pass)
TILE_PASSES = 8


@register_jitable
def _row_of(table, tile):
    """The table row whose tiles hold ``tile``: the last one whose FIRST is <= tile (a row
    of no tiles shares its FIRST with the next row, which is found instead)."""
    lo = 0
    hi = table.shape[0] - 1
    while lo < hi:
        mid = (lo + hi + 1) >> 1
        if table[mid, FIRST] <= tile:
            lo = mid
        else:
            hi = mid - 1
    return lo


@register_jitable
def _step_rows(table, pw_, pg_, ps_, pr_, kinds, hp, ints, seed, ks, pw, pc, ps, sp16, counts,
               tiles, passes):
    """Every tile of a set's table in a grid-stride loop over the blocks: thread t of a
    block steps quads t, t + THREADS, ... (``passes`` of them) of its tile's tensor, whole
    quads of an aligned tensor (WIDE) by :func:`_step_quad_vector`, others (the last,
    partial quad; every quad of a tensor that is not aligned) by step_quad.  ``seed``:
    (seed_lo, seed_hi, the step's stream shift); ``pw_`` .. ``pr_``: arrays of the weight,
    gradient, state and remainder element types (the table's addresses are read as those).
    ``passes`` is an argument, not a constant, so that the pass loop is not unrolled."""
    local = cuda.local.array(NCOUNTS, np.int32)
    for f in range(NCOUNTS):
        local[f] = 0
    tile = cuda.blockIdx.x
    while tile < tiles:
        i = _row_of(table, tile)
        n, offset, quads = table[i, N], table[i, OFFSET], table[i, QUADS]
        full = (n >> 2) if table[i, WIDE] != 0 else 0
        wb, gb = vector.pointer(table[i, W], pw_), vector.pointer(table[i, G], pg_)
        mb, vb = vector.pointer(table[i, M], ps_), vector.pointer(table[i, V], ps_)
        cb, rb = vector.pointer(table[i, C], ps_), vector.pointer(table[i, R], pr_)
        keys = (seed[0], seed[1], table[i, SW] + seed[2], table[i, SM] + seed[2],
                table[i, SV] + seed[2])
        j = (tile - table[i, FIRST]) * (passes * THREADS) + cuda.threadIdx.x
        for _ in range(passes):
            if j >= quads:
                break
            done = False
            if j < full:
                codes = _quad_codes(j, wb, gb, mb, vb, cb, rb, kinds, hp, ints)
                done = _step_quad_vector(j, n, offset, codes, wb, gb, mb, vb, cb, rb, kinds,
                                         hp, ints, keys, ks, pw, pc, ps, sp16, local)
            if not done:
                _general_quad((offset >> 2) + j, n, offset, wb, gb, mb, vb, cb, rb, kinds, hp,
                              ints, keys, pw, pc, ps, sp16, local)
            j += THREADS
        tile += cuda.gridDim.x
    _add_counts(counts, local)


def _make_kernel(kinds, ints, pw, pc, ps, sp16, wide=False):
    """The step kernel of one configuration: storage kinds, the integer options (algorithm,
    update, modes, sr bits, nesterov, first step) and the formats' parameters are
    compile-time constants, so each branch on them folds away and the decision keeps only
    the registers its own case needs (AdamW bf16 SR: 162 -> 90 per thread).  The
    hyperparameters, keys (and the seed's round keys, ``ks``) and offset stay arguments:
    they change from step to step.
    ``wide``: the aligned kernel (:func:`_step_vectors`), which a call takes where
    :func:`aligned` holds; "set": the kernel of a set's table (:func:`_step_rows`)."""
    KINDS, INTS, PW, PC, PS, SP16, AHEAD = kinds, ints, pw, pc, ps, sp16, LOAD_AHEAD

    if wide == "set":
        def kernel(table, pw_, pg_, ps_, pr_, hp, seed, ks, counts, tiles, passes):
            _step_rows(table, pw_, pg_, ps_, pr_, KINDS, hp, INTS, seed, ks, PW, PC, PS, SP16,
                       counts, tiles, passes)
    elif wide:
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
    grid = launch.grid_size(nquads, launch.current_device(), BLOCKS_PER_SM)
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
    device array ``counts`` (NCOUNTS int64), read by the optimizer when asked.  From a
    configuration's second step on, the launch is its :class:`StepRoute`'s."""
    with launch.device_of(param):
        sdtype = np.int16 if setup.state_dtype.itemsize == 2 else np.int32
        kinds, hp, ints, keys, offset = kargs
        n = param.numel()
        if n == 0:
            return
        # each array's (address, elements, bytes an element): a placeholder's where absent
        parts = [(t.data_ptr(), t.numel(), t.element_size()) if t is not None else
                 (launch.address(launch.placeholder((1,), dt)), 1, np.dtype(dt).itemsize)
                 for t, dt in ((param, None), (grad, None), (m, sdtype), (v, sdtype),
                               (c, sdtype), (r, np.int16))]
        wide = offset % 4 == 0 and all(ptr % (4 * size) == 0 for ptr, _, size in parts)
        kernel = optim_kernel(tuple(kinds), tuple(ints), setup.pw, setup.pc, setup.ps,
                              tuple(setup.sp16), wide)
        nquads = max(n // 4, 1) if wide else (offset + n + 3) // 4 - offset // 4
        device = launch.current_device()
        grid = launch.grid_size(nquads, device, BLOCKS_PER_SM)
        route = _STEP_ROUTES.get((kernel, launch.address(counts)))
        if route:
            route(parts, hp, keys, offset, grid,
                  specialised._core_stream(launch.torch_stream_handle(param.device)))
            return
        stream = launch.torch_stream(param.device)
        views = [arrays._torch_bits(t) if t is not None else launch.placeholder((1,), dt)
                 for t, dt in ((param, None), (grad, None), (m, sdtype), (v, sdtype),
                               (c, sdtype), (r, np.int16))]
        args = kernel_arguments(views, hp, keys, offset, counts)
        kernel[grid, THREADS, stream](*args)

        def build():
            made = StepRoute(kernel, args)
            mine = made.arguments([(launch.address(a), a.size, a.dtype.itemsize)
                                   for a in args[:6]], hp, keys, offset)
            return made, _numbas(made, mine, args, stream)
        specialised.keep_route(_STEP_ROUTES, ROUTE_ERRORS, (kernel, launch.address(counts)),
                               build)


def _numbas(route, mine, args, stream) -> bool:
    """Whether ``mine``, a route's flat arguments, are numba's own for a launch with
    ``args``."""
    return specialised._same(mine, specialised._numba_arguments(route.compiled, args, stream))


class StepRoute(specialised.Route):
    """A per-tensor step kernel's launch for torch tensors without numba's dispatcher, which
    typed and flattened its 89 flat arguments and wrapped the six tensors in numba arrays
    at every call (on an H200, GPT-2's 148 tensors stepped one launch each took 43.3 ms, ~290
    µs a tensor).  The counters' flat arguments are made once; the arrays', hyperparameters'
    and keys' at each call, the round keys' when the seed changes.  Checked once against
    numba's own for the launch that made it (:func:`step`)."""

    def __init__(self, kern, args):
        import numba
        super().__init__(kern, 0, 0, tuple(numba.typeof(a) for a in args))
        counts = args[-1]
        self.tail = specialised._array_arguments(launch.address(counts), counts.size, 8)
        self._ks = self._ks_flat = None

    def arguments(self, parts, hp, keys, offset) -> list:
        """``parts``: each of the six arrays' (address, elements, bytes an element)."""
        if self._ks is None or self._ks[0] != keys[:2]:     # the round keys: the seed's
            ks = round_keys(keys[0], keys[1])
            self._ks, self._ks_flat = (tuple(keys[:2]), ks), specialised._scalars(*ks)
        flat = [v for ptr, n, size in parts
                for v in specialised._array_arguments(ptr, n, size)]
        return (flat + [ctypes.c_float(v) for v in hp] + specialised._scalars(*keys)
                + self._ks_flat + specialised._scalars(offset) + self.tail)

    def __call__(self, parts, hp, keys, offset, blocks, stream):
        self.launch(stream, blocks, self.arguments(parts, hp, keys, offset))


#: (per-tensor kernel, counters' address) -> StepRoute, or None (numba's launch)
_STEP_ROUTES: dict = {}


class Table:
    """A set's device table: one launch steps every tensor of it (:func:`_step_rows`).

    ``rows``: lpsim.optim.multi.Table's rows, (weight, gradient, m, v, Kahan, remainder
    addresses (0: absent), element count, global offset, the three streams at step 0) per
    tensor; ``setup``: the set's lpsim.optim.setup.Setup; ``device``: the torch device of
    its tensors (the table then goes up through pinned memory on torch's stream), or None
    for numba device arrays (whose addresses come from :func:`lpsim_cuda.vector.address_of`).
    A step refreshes the gradients' addresses (:meth:`refresh`) and uploads the table with
    them; the host never waits for the device.
    """

    def __init__(self, rows, setup, device=None):
        with self._on_device(device):
            self._build(rows, setup, device)

    @staticmethod
    def _on_device(device):
        """A context that makes ``device`` (a torch device, or None) current."""
        if device is None:
            return contextlib.nullcontext()
        import torch                                        # pragma: no cover (GPU only)
        return torch.cuda.device(device)

    def _build(self, rows, setup, device):
        self.setup, self.device = setup, device
        self.host = np.zeros((len(rows), COLUMNS), np.int64)
        self.host[:, :QUADS] = np.asarray(rows, np.int64).reshape(len(rows), QUADS)
        bits = [np.int32 if kind == core.STORE_F32 else np.int16 for kind in setup.kinds]
        self.protos = tuple(launch.placeholder((4,), dt) for dt in (*bits, np.int16))
        self.sizes = np.array([np.dtype(dt).itemsize for dt in (*bits, bits[2], bits[2],
                                                                 np.int16)], np.int64)
        for column in (M, V, C, R):             # an absent state: a placeholder never read
            proto = self.protos[3 if column == R else 2]
            self.host[self.host[:, column] == 0, column] = vector.address_of(proto)
        n, offset = self.host[:, N], self.host[:, OFFSET]
        self.host[:, QUADS] = quads = (offset + n + 3) // 4 - offset // 4
        tiles = -(-quads // (TILE_PASSES * THREADS))
        self.host[:, FIRST] = np.cumsum(tiles) - tiles
        self.tiles = int(tiles.sum())
        self.elements = int(n.sum())
        self._keys = (None, None)
        self._held = None
        self._sent = (None, None)           # the table last copied to the device, its stream
        #: (kernel, counters' address) -> its TableRoute, or False: numba's launch
        self._routes = {}

    def refresh(self, grads) -> None:
        """Set the gradients' addresses (torch tensors or numba device arrays), and with them
        which tensors take the wide path: every array aligned to four of its elements."""
        self.host[:, G] = [g.data_ptr() if launch.is_torch(g) else vector.address_of(g)
                           for g in grads]
        aligned = (self.host[:, OFFSET] % 4 == 0) & np.all(
            self.host[:, W:R + 1] % (4 * self.sizes) == 0, axis=1)
        self.host[:, WIDE] = aligned

    def step(self, hp, ints, seed, step: int, counts, stream=0) -> None:
        """Launch the step of the set at step count ``step`` (hyperparameters ``hp``, the
        per-tensor kernel's ``ints``, ``seed`` = (lo, hi)); counters are added into the
        device array ``counts``.  Torch tensors' sets launch on torch's current stream of
        their device, others on ``stream``."""
        if self.tiles == 0:
            return
        with self._on_device(self.device):
            if self.device is not None:                     # pragma: no cover (GPU only)
                stream = launch.torch_stream(self.device)
            self._launch(hp, ints, seed, step, counts, stream)

    def _launch(self, hp, ints, seed, step, counts, stream):
        setup = self.setup
        kernel = optim_kernel(tuple(setup.kinds), tuple(ints), setup.pw, setup.pc, setup.ps,
                              tuple(setup.sp16), "set")
        if self._keys[0] != tuple(seed):
            self._keys = (tuple(seed), round_keys(*seed))
        grid = launch.grid_size(self.tiles * THREADS, launch.current_device(), BLOCKS_PER_SM)
        keys = (seed[0], seed[1], int(step) << 24)
        found = self._routes.get((kernel, launch.address(counts)))
        if found:                   # the raw launch: no typing, flattening or table wrapper
            found(self._upload_tensor().data_ptr(), hp, keys, self._keys[1], grid,
                  specialised._core_stream(launch.torch_stream_handle(self.device)))
            return
        args = (self._upload(stream), *self.protos, hp, keys, self._keys[1], counts,
                self.tiles, TILE_PASSES)
        kernel[grid, THREADS, stream](*args)
        if self.device is not None:

            def build():
                made = TableRoute(kernel, args)
                mine = made.arguments(launch.address(args[0]), hp, keys, self._keys[1])
                return made, _numbas(made, mine, args, stream)
            specialised.keep_route(self._routes, ROUTE_ERRORS,
                                   (kernel, launch.address(counts)), build)

    def _upload(self, stream):
        """The table on the device, copied on the launch's stream."""
        if self.device is None:
            return cuda.to_device(self.host, stream=stream)
        held = self._upload_tensor()                       # pragma: no cover (GPU only)
        desc = {"shape": self.host.shape, "strides": None, "data": (held.data_ptr(), False),
                "typestr": self.host.dtype.str, "version": 2}
        return cuda.from_cuda_array_interface(desc, owner=held, sync=False)

    def _upload_tensor(self):                                # pragma: no cover (GPU only)
        """The table as a torch tensor on its device: copied there through pinned memory on
        torch's current stream where it changed since the last copy (a step's gradients
        elsewhere) or the stream did, else the last copy (no kernel writes it, and the
        stream orders its copy before this launch): two operations fewer a step."""
        import torch
        stream = launch.torch_stream_handle(self.device)
        if (self._held is None or self._sent[1] != stream
                or not np.array_equal(self._sent[0], self.host)):
            self._held = torch.from_numpy(self.host).pin_memory().to(self.device,
                                                                     non_blocking=True)
            self._sent = (self.host.copy(), stream)
        return self._held


#: the set kernel's arguments after its placeholders: hp, keys, round keys, counts, tiles
#: and passes (the placeholders' number follows the set's storage kinds)
_AFTER_PROTOS = 6


class TableRoute(specialised.Route):
    """A set kernel's launch without numba's dispatcher, whose typing and flattening of 90
    flat arguments ran each step (its flattening of the hyperparameters, keys and round
    keys alone takes ~50 µs on a 2-core VM; a kernel at 10**7 parameters takes ~90 µs on an
    H200), and without the numba wrapper of each step's uploaded table.  The arguments of
    the set's table shape, placeholders and counters are made once; those of the table's
    address, the hyperparameters, keys and round keys each step.  Checked once against
    numba's own for the launch that made it (:meth:`Table._launch`)."""

    def __init__(self, kern, args):
        import numba
        super().__init__(kern, 0, 0, tuple(numba.typeof(a) for a in args))
        self.fix(args)

    def fix(self, args) -> None:
        """The flat arguments of ``args`` (a launch's: the table, the placeholders, then
        :data:`_AFTER_PROTOS`) that stay from step to step."""
        table, protos, counts = args[0], args[1:-_AFTER_PROTOS], args[-3]
        array = specialised._array_arguments
        rows, columns = table.shape
        # the table's flat arguments around its address: meminfo, parent, size, itemsize |
        # address | shape, strides (C order, int64)
        self.head = [0, 0, rows * columns, 8]
        self.shape = [rows, columns, columns * 8, 8]
        self.protos = [v for a in protos for v in array(launch.address(a), a.size,
                                                       a.dtype.itemsize)]
        self.tail = (array(launch.address(counts), counts.size, 8)
                     + specialised._scalars(*args[-2:]))
        self._ks = self._ks_flat = None

    def arguments(self, table_ptr: int, hp, keys, ks) -> list:
        if ks is not self._ks:          # the round keys change with the seed only
            self._ks, self._ks_flat = ks, specialised._scalars(*ks)
        return (self.head + [table_ptr] + self.shape + self.protos
                + [ctypes.c_float(v) for v in hp] + specialised._scalars(*keys)
                + self._ks_flat + self.tail)

    def __call__(self, table_ptr, hp, keys, ks, blocks, stream):
        self.launch(stream, blocks, self.arguments(table_ptr, hp, keys, ks))


#: route key (kernel, counters' address) -> why it keeps numba's launch
ROUTE_ERRORS: dict = {}
