"""One NVIDIA tensor-core instruction, D = A B + C, bit for bit as the hardware computes it.

:func:`mma` runs an ``mma``, ``wgmma`` or ``tcgen05.mma`` opcode of a GPU generation (the
table and its numbers: :mod:`lpsim.ops.mma_table`) with the rule MMA-Sim measured on the
hardware. Per output d_ij, K is cut into fused nodes of L products, and each node, with C
the previous node's result (the instruction's C for the first), does:

1. every product a_ik b_kj exactly: significand in [0, 4), exponent e_a + e_b (subnormal
   inputs at the type's least exponent);
2. the largest exponent E over the products and C, a zero term counting as ``e_zero``;
3. every term truncated toward zero to a multiple of 2**(E - F) (no guard or sticky bit);
4. the truncated terms added exactly (integers here: no rounding can occur);
5. the sum rounded once: toward zero to FP32 (or to 13 fraction bits for FP8 inputs, then
   held as FP32) or to nearest even FP16, overflow giving inf; a zero result is +0.

NaN and inf follow IEEE 754 within a node (a NaN input, inf * 0 or +inf + -inf give NaN,
other infinite products or C give that inf) and the hardware's canonical NaN is returned:
0x7FFFFFFF (f32) or 0x7FFF (f16).

On the hardware: ``torch._scaled_mm`` recorded on an H100 (``tests/data/tensor-cores-h100.npz``,
17 input families, K = 16 .. 4096) is reproduced code for code, all 17408 outputs of each
``use_fast_accum`` setting, by :func:`wgmma_matmul` (``wgmma.m64nNk32.f32.e4m3.e4m3`` chained
along K; by default promoted to float32 every 128 products), where the chunk models of
:mod:`lpsim.ops.hardware` match 77.5% and 62.3% (``tests/test_mma.py``).

The node is computed on integers in one compiled numba loop: the significands of A and B
are decoded once, a product is one integer multiply, and the alignment is a shift, so a
256x256x4096 FP8 GEMM runs as 2**28 multiply-shift-adds.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, types
from numba.cpython.unsafe.numbers import leading_zeros
from numba.extending import intrinsic

from .mma_groups import group_mma
from .mma_operands import (FINITE, NAN, NEG_INF, POS_INF, SCALE_NAMES, ZERO_E, as_float64,
                           decoded, fold_scales, held_value, operand, scale_exponents,
                           type_params)
from .mma_table import RNE_FP16, RZ_E8M13, RZ_FP32, Instruction, lookup

_ROWS = 64          # rows of D per block of mma_kernel
_NO_ACC = np.zeros((0, 0), np.float32)      # mma_kernel's acc when nothing is promoted


@intrinsic
def _ashr32(typingctx, x, d):
    """x >> d on int32 words (0 <= d <= 31): numba's ``>>`` widens to int64, which halves
    the lanes of the vectorised node sum."""
    sig = types.int32(types.int32, types.int32)

    def codegen(context, builder, signature, args):
        return builder.ashr(args[0], args[1])
    return sig, codegen


def _binary32(name):
    """An int32 operation on int32 words (numba's arithmetic widens to int64, and a 64-bit
    multiply vectorises at half the lanes)."""
    @intrinsic
    def op(typingctx, x, y):
        sig = types.int32(types.int32, types.int32)

        def codegen(context, builder, signature, args):
            return getattr(builder, name)(args[0], args[1])
        return sig, codegen
    return op


_add32, _sub32, _mul32, _xor32 = (_binary32(n) for n in ("add", "sub", "mul", "xor"))


@njit(cache=True, nogil=True, inline="always")
def _shift(x, s):
    """x * 2**s truncated toward zero (the node's alignment of a term)."""
    if s >= 0:
        return x << s
    if s < -62:
        return 0
    if x >= 0:
        return x >> -s
    return -((-x) >> -s)


@njit(cache=True, nogil=True, inline="always")
def _msb(a):
    """Position of the leading one bit of 0 < a < 2**64 (a binary search of shifts)."""
    n = 0
    for w in (32, 16, 8, 4, 2, 1):
        if a >> w:
            a >>= w
            n += w
    return n


@njit(cache=True, nogil=True, inline="always")
def _round(S, x0, rho):
    """The output code (int32 bits of FP32, or FP16 bits) of S * 2**x0 rounded by ``rho``;
    zero gives +0 and overflow inf, as the hardware does."""
    if S == 0:
        return 0
    a = -S if S < 0 else S
    nb = _msb(a)
    if rho == RNE_FP16:
        k, e_sub = 10, -14
    elif rho == RZ_E8M13:
        k, e_sub = 13, -126
    else:
        k, e_sub = 23, -126
    E = x0 + nb
    if E < e_sub:
        E = e_sub
    r = E - k - x0
    if r <= 0:
        q = a << -r
    elif r > 61:
        q = 0
    else:
        q = a >> r
        if rho == RNE_FP16:
            rem = a - (q << r)
            half = 1 << (r - 1)
            if rem > half or (rem == half and (q & 1) == 1):
                q += 1
    if q == 0:
        return 0
    if rho == RNE_FP16:
        bits = 0x7C00 if E > 15 else min(((E + 14) << 10) + q, 0x7C00)
        return bits | 0x8000 if S < 0 else bits
    if E > 127:
        bits = 0x7F800000
    else:
        bits = ((E + 126) << 23) + (q << (23 - k))
    return bits | -0x80000000 if S < 0 else bits


@njit(cache=True, nogil=True)
def _special(am, asg, acl, bm, bsg, bcl, i, j, k0, L, ccl):
    """Class of a node's IEEE sum when an input or C is NaN or inf."""
    pos = ccl == POS_INF
    neg = ccl == NEG_INF
    nan = ccl == NAN
    for t in range(k0, k0 + L):
        ca, cb = acl[i, t], bcl[t, j]
        if ca == FINITE and cb == FINITE:
            continue
        if ca == NAN or cb == NAN:
            nan = True
            continue
        if (ca == FINITE and am[i, t] == 0) or (cb == FINITE and bm[t, j] == 0):
            nan = True                                         # inf * 0
            continue
        sa = ca == NEG_INF or (ca == FINITE and asg[i, t] < 0)
        sb = cb == NEG_INF or (cb == FINITE and bsg[t, j] < 0)
        if sa != sb:
            neg = True
        else:
            pos = True
    if nan or (pos and neg):
        return NAN
    return NEG_INF if neg else POS_INF


@njit(cache=True, nogil=True)
def _code_of(cls, out16):
    """The output code of NaN or an infinity."""
    if cls == NAN:
        return 0x7FFF if out16 else 0x7FFFFFFF
    if out16:
        return 0x7C00 if cls == POS_INF else 0xFC00
    return 0x7F800000 if cls == POS_INF else -0x800000


@njit(cache=True, nogil=True)
def _unpack(bits, out16):
    """(significand, exponent, class) of an output code as the next node's C."""
    if out16:
        ef, frac, neg, p, bias, e_sub = (bits >> 10) & 0x1F, bits & 0x3FF, (bits >> 15) & 1, \
            10, 15, -14
        top = 0x1F
    else:
        ef, frac, neg, p, bias, e_sub = (bits >> 23) & 0xFF, bits & 0x7FFFFF, \
            (bits >> 31) & 1, 23, 127, -126
        top = 0xFF
    if ef == top:
        if frac != 0:
            return 0, 0, NAN
        return 0, 0, NEG_INF if neg else POS_INF
    if ef == 0:
        m, e = frac, e_sub
    else:
        m, e = frac | (1 << p), ef - bias
    return (-m if neg else m), e, FINITE


@njit(cache=True, nogil=True, inline="always")
def fma32(a, b, c):
    """a * b + c of float32 values (as float64) rounded once to float32, as the FFMA
    instruction does: the product is exact in float64, the sum rounds to odd there (its
    error by TwoSum moves an inexact even result one unit toward it), and the cast to
    float32 then rounds once, correctly (53 >= 24 + 2 bits)."""
    p = a * b
    t = p + c
    if not math.isfinite(t) or t == 0.0:
        return np.float32(t)
    bp = t - p
    err = (p - (t - bp)) + (c - bp)
    if err != 0.0:
        m, e = math.frexp(t)
        mi = np.int64(m * 9007199254740992.0)       # the 53-bit significand, signed
        if mi % 2 == 0:
            t = math.ldexp(float(mi + (1 if err > 0 else -1)), e - 53)
    return np.float32(t)


@njit(cache=True, nogil=True)
def mma_kernel(am, asg, ae, acl, bm, bsg, be, bcl, cm, ce, ccl, pc, F, L, e_zero, rho, S, out,
               promote, acc, psa, psb):
    """D = A B + C by fused nodes of ``L`` products (the module's docstring) into the int32
    output codes ``out``.  ``am``/``asg``/``ae``/``acl`` (M x K) and the same of B (K x N)
    are the inputs' significand magnitudes, signs (0 or -1), exponents and classes, A's
    magnitudes shifted left by F minus a product's fraction bits so that a product's term
    is (am * bm) >> (E_max - e_a - e_b).  ``cm``/``ce``/``ccl`` are C's signed significands,
    exponents and classes, ``pc`` its fraction bits.  ``S`` (N) holds a row's node sums:
    int32 where they fit (F = 13: terms below 2**15), else int64.

    ``promote`` > 0 (f32 results only): every ``promote`` nodes, and after the last, the
    chain's result is added to the float32 accumulator ``acc`` (M x N, zeros on entry) with
    one float32 addition and the chain begins again from C = +0, as a GEMM that promotes its
    partial sums to CUDA-core registers does; ``out`` then holds the last partial's codes.
    With block scales ``psa`` (M x promotions) and ``psb`` (promotions x N, float32 values;
    empty: none) the addition is DeepGEMM's FFMA instead: acc = fl32(sa * sb) * D + acc,
    rounded once.

    Node by node for a block of rows of D, then row by row within it, a node's steps run
    across the row (j innermost, B's rows contiguous): branch-free int32 loops (products
    are below 2**28) the compiler vectorises, the rounding of f32 results among them."""
    M, K = am.shape
    N = bm.shape[1]
    nodes = K // L
    out16 = rho == RNE_FP16
    p_out = 10 if out16 else 23
    b_special = np.zeros((nodes, N), np.bool_)
    b_zero = np.zeros((nodes, N), np.bool_)
    for t in range(K):
        for j in range(N):
            b_special[t // L, j] |= bcl[t, j] != FINITE
            b_zero[t // L, j] |= bm[t, j] == 0
    b_any = np.zeros(nodes, np.bool_)
    for node in range(nodes):
        for j in range(N):
            b_any[node] |= b_special[node, j]
    k_out = 13 if rho == RZ_E8M13 else 23
    # rows in blocks of ROWS, node by node: a node's slice of B stays in cache for the block
    # (row by row, the whole of B was read from memory once per row)
    R = max(1, min(M, _ROWS))
    M_c = np.empty((R, N), np.int64)
    E_c = np.empty((R, N), np.int64)
    CL_c = np.empty((R, N), np.int64)
    cs = np.empty(R, np.int64)
    cl_new = np.empty(N, np.int64)
    hi = np.empty(N, np.int32)
    for i0 in range(0, M, R):
        rows = min(R, M - i0)
        for r in range(rows):
            cs[r] = 0
            for j in range(N):
                M_c[r, j], E_c[r, j], CL_c[r, j] = cm[i0 + r, j], ce[i0 + r, j], ccl[i0 + r, j]
                cs[r] += CL_c[r, j] != FINITE
        p_c = pc
        for node in range(nodes):
            k0 = node * L
            for r in range(rows):
                i = i0 + r
                m_c, e_c, cl_c = M_c[r], E_c[r], CL_c[r]
                c_special = cs[r]
                a_special = a_zero = False
                for t in range(L):
                    a_special |= acl[i, k0 + t] != FINITE
                    a_zero |= am[i, k0 + t] == 0
                for j in range(N):
                    # C's exponent, or e_zero where C or a product is zero
                    if m_c[j] == 0:
                        hi[j] = e_zero
                    elif a_zero or b_zero[node, j]:
                        hi[j] = max(e_c[j], e_zero)
                    else:
                        hi[j] = e_c[j]
                for t in range(L):
                    a_e = ae[i, k0 + t]
                    for j in range(N):
                        hi[j] = max(hi[j], np.int32(a_e + be[k0 + t, j]))
                for j in range(N):
                    S[j] = _shift(m_c[j], e_c[j] - p_c - hi[j] + F)
                for t in range(L):
                    a_m, a_e, a_s = am[i, k0 + t], ae[i, k0 + t], asg[i, k0 + t]
                    for j in range(N):
                        d = min(_sub32(hi[j], _add32(a_e, be[k0 + t, j])), np.int32(31))
                        q = _ashr32(_mul32(a_m, bm[k0 + t, j]), d)
                        s = _xor32(a_s, bsg[k0 + t, j])
                        S[j] += _sub32(_xor32(q, s), s)
                last = node + 1 == nodes
                promoting = promote > 0 and ((node + 1) % promote == 0 or last)
                special = a_special or b_any[node] or c_special > 0
                if out16:
                    for j in range(N):
                        if a_special or b_special[node, j] or cl_c[j] != FINITE:
                            bits = _code_of(_special(am, asg, acl, bm, bsg, bcl, i, j, k0, L,
                                                     cl_c[j]), out16)
                        else:
                            bits = _round(S[j], hi[j] - F, rho)
                        m_c[j], e_c[j], cl_new[j] = _unpack(bits, out16)
                else:
                    # rounded toward zero to k_out fraction bits, straight into the next C's
                    # (significand with 23 fraction bits, exponent, class): a branch-free loop
                    for j in range(N):
                        x = np.int64(S[j])
                        a = -x if x < 0 else x
                        x0 = np.int64(hi[j] - F)
                        E = max(x0 + 63 - leading_zeros(a), np.int64(-126))
                        sh = E - k_out - x0
                        q = (a << min(-sh, np.int64(63))) if sh <= 0 else \
                            (a >> min(sh, np.int64(63)))
                        q <<= 23 - k_out
                        m_c[j] = -q if x < 0 else q
                        e_c[j] = E
                        cl_new[j] = FINITE if E <= 127 or a == 0 else \
                            (NEG_INF if x < 0 else POS_INF)
                    if special:
                        for j in range(N):
                            if a_special or b_special[node, j] or cl_c[j] != FINITE:
                                cl_new[j] = _special(am, asg, acl, bm, bsg, bcl, i, j, k0, L,
                                                     cl_c[j])
                                m_c[j], e_c[j] = 0, 0
                c_special = 0
                for j in range(N):
                    cl_c[j] = cl_new[j]
                    c_special += cl_new[j] != FINITE
                if last or promoting:
                    for j in range(N):
                        if out16:
                            bits = _code_of(cl_c[j], True) if cl_c[j] != FINITE else \
                                _round(m_c[j], e_c[j] - 10, RNE_FP16)
                        else:
                            bits = _code_of(cl_c[j], False) if cl_c[j] != FINITE else \
                                _round(m_c[j], e_c[j] - 23, RZ_FP32)
                        out[i, j] = bits
                        if promoting:
                            v = held_value(m_c[j], e_c[j], cl_c[j])
                            if psa.size:
                                blk = node // promote
                                scale = np.float32(np.float64(psa[i, blk]) * psb[blk, j])
                                acc[i, j] = fma32(np.float64(scale), v, np.float64(acc[i, j]))
                            else:
                                # one float32 addition (the float64 sum of two float32
                                # values rounds to the same float32)
                                acc[i, j] = np.float32(np.float64(acc[i, j]) + v)
                            m_c[j], e_c[j], cl_c[j] = 0, 0, FINITE
                    if promoting:
                        c_special = 0
                cs[r] = c_special
            p_c = p_out


def mma(a, b, c, *, arch, instruction, scale_a=None, scale_b=None):
    """D = A B + C of one tensor-core ``instruction`` (a PTX opcode such as
    ``"mma.m16n8k16.f32.bf16.bf16.f32"`` or ``"wgmma.m64n8k32.f32.e4m3.e4m3"``) on the GPU
    generation ``arch`` ("volta", "turing", "ampere", "ada", "hopper", "blackwell"), bit for
    bit as the hardware computes it (the module's docstring).

    ``a`` (m x k), ``b`` (k x n) and ``c`` (m x n) are numpy arrays or torch tensors holding
    values of the instruction's A, B and C types (torch or ml_dtypes float8/bf16/fp16 dtypes,
    or float32/float64 containers whose values the type can hold; a tf32 operand is float32
    with the low 13 bits zero).  Returns D as float32 (float16 for an ``.f16`` result), a
    numpy array, or a torch tensor on a's device when a is one.  A wrong shape, an unknown or
    missing instruction, or a value the type cannot hold is a ValueError naming it.

    Block-scaled instructions (``tcgen05.mma ... kind::mxf8f6f4.block32 ... ue8m0``,
    ``kind::mxf4`` and ``kind::mxf4nvf4``) take ``scale_a`` (m x k/block) and ``scale_b``
    (k/block x n), one scale per block of products: E8M0 scales (powers of two from 2**-127
    to 2**127, or NaN; torch float8_e8m0fnu or float containers) or, for ``ue4m3``, E4M3
    values from 0 to 448 or NaN (torch float8_e4m3fn without the sign bit, which the
    hardware ignores, or float containers).  In ``kind::mxf8f6f4`` a scale's exponent joins
    each product's; the FP4 kinds scale exact sums of 16 products
    (:mod:`lpsim.ops.mma_groups`).  A NaN scale makes its block's products NaN.  Other
    instructions refuse scales."""
    ins: Instruction = lookup(arch, instruction)
    if (scale_a is None or scale_b is None) if ins.block else \
            (scale_a is not None or scale_b is not None):
        raise ValueError(f"mma: {ins.opcode} on {ins.arch} takes "
                         + (f"scale_a and scale_b (its {SCALE_NAMES[ins.scale_type]} block scales)"
                            if ins.block else
                            "no scale_a or scale_b (it is not block-scaled)"))
    decoded = []
    for name, x, ptx_type, want in (("a", a, ins.a_type, (ins.m, ins.k)),
                                    ("b", b, ins.b_type, (ins.k, ins.n)),
                                    ("c", c, ins.c_type, (ins.m, ins.n))):
        parts, is_torch, device, shape = operand(x, ptx_type, name, want)
        if parts is None:
            raise ValueError(f"mma: {name} has shape {shape}; {ins.opcode} on {ins.arch} "
                             f"accepts {name} of shape {want} (m={ins.m}, n={ins.n}, "
                             f"k={ins.k})")
        decoded.append((parts, is_torch, device))
    (am, asg, ae, acl), lib_torch, device = decoded[0]
    bm, bsg, be, bcl = decoded[1][0]
    cm, csg, ce, ccl = decoded[2][0]
    if ins.group:
        d = group_mma(decoded[0][0], decoded[1][0], ((cm ^ csg) - csg, ce, ccl), ins,
                      scale_a, scale_b)
        return _delivered(d, lib_torch, device)
    if ins.block:
        blocks = ins.k // ins.block
        fold_scales(am, ae, acl, scale_exponents(scale_a, "scale_a", (ins.m, blocks)),
                     ins.block, 1)
        fold_scales(bm, be, bcl, scale_exponents(scale_b, "scale_b", (blocks, ins.n)),
                     ins.block, 0)
    shift = ins.F - type_params(ins.a_type)[1] - type_params(ins.b_type)[1]
    assert shift >= 0, "a product's significand is never wider than F bits"
    am <<= shift
    out = np.empty((ins.m, ins.n), np.int32)
    S = np.empty(ins.n, np.int32 if ins.F <= 13 else np.int64)
    mma_kernel(am, asg, ae, acl, bm, bsg, be, bcl, (cm ^ csg) - csg, ce, ccl,
               type_params(ins.c_type)[1], ins.F, ins.L, ins.e_zero, ins.rho, S, out,
               0, _NO_ACC, _NO_ACC, _NO_ACC)
    d = (out.astype(np.uint16).view(np.float16) if ins.rho == RNE_FP16
         else out.view(np.float32))
    return _delivered(d, lib_torch, device)


def _delivered(d, lib_torch, device):
    """D as a torch tensor on ``device`` where A was one, else the numpy array."""
    if lib_torch:
        import torch
        return torch.from_numpy(d.copy()).to(device)
    return d


def wgmma_matmul(a, b, *, types: str = "e4m3.e4m3", promote: int | None = 128):
    """A @ B (float32) as a Hopper FP8 GEMM kernel computes it from ``wgmma.m64nNk32.f32``
    instructions (``types``: A's and B's, ``"e4m3.e4m3"`` ... ``"e5m2.e5m2"``): rows in
    tiles of 64 and columns in tiles of up to 256, K in steps of 32 (both padded with
    zeros), each instruction's D fed back as its C.

    ``promote``: every ``promote`` products (a multiple of 32) the partial sum, begun from
    zero, is added to a float32 accumulator with one float32 addition.  128 is cuBLASLt's
    for ``torch._scaled_mm`` by default: with it this gives every output an H100 recorded
    (``tests/data/tensor-cores-h100.npz``, 17 input families, K = 16 .. 4096), code for code;
    ``promote=None`` (no promotion, one chain along K) gives every output of
    ``use_fast_accum=True``.  Scales are 1: multiply the result by the scales as the
    epilogue does.  ``a`` (m x k), ``b`` (k x n): numpy arrays or torch tensors holding
    values of those types; the result follows ``a``'s library."""
    a_type, b_type = _wgmma_types(types)
    if promote is not None and (isinstance(promote, bool) or not isinstance(
            promote, (int, np.integer)) or promote < 32 or promote % 32):
        raise ValueError(f"wgmma_matmul: promote={promote!r} is not accepted; accepted: None "
                         "or a positive multiple of 32")
    A, lib, device = as_float64(a, "a", "wgmma_matmul")
    B = as_float64(b, "b", "wgmma_matmul")[0]
    if A.ndim != 2 or B.ndim != 2 or A.shape[1] != B.shape[0]:
        raise ValueError(f"wgmma_matmul: a {A.shape} and b {B.shape} are not an m x k and a "
                         "k x n matrix")
    n = B.shape[1]
    ins = lookup("hopper", f"wgmma.m64n{min(256, -(-max(n, 1) // 8) * 8)}k32.f32.{a_type}."
                           f"{b_type}")
    result = chained_matmul(A, B, ins, promote, who="wgmma_matmul")
    if lib == "torch":
        import torch
        return torch.from_numpy(result).to(device)
    return result


def chained_matmul(A, B, ins: Instruction, promote=None, who="matmul", scales=None,
                   promote_scales=None, names=("a", "b", "scale_a", "scale_b")):
    """A @ B (float64 arrays of values of the instruction's A and B types) as a GEMM kernel
    computes it from ``ins`` chained along K: K padded with zeros to a multiple of the
    instruction's k, each instruction's D fed back as its C from C = +0, and every
    ``promote`` products (a multiple of the instruction's k; None: never, the chain's D is
    the result) the chain's D added to a float32 accumulator and the chain begun again.
    Tiling over M and N does not change a value, so the whole GEMM is one kernel call.
    float32 result (float16 for an f16 chain without promotion).  ``scales``: a
    block-scaled instruction's (scale_a, scale_b), M x K/32 and K/32 x N with K rounded up
    to whole blocks.  ``promote_scales``: float32 (scale_a, scale_b), M x P and P x N for the
    P promotions, with which each promotion is DeepGEMM's FFMA (:func:`mma_kernel`)."""
    (m, k), n = A.shape, B.shape[1]
    kp = -(-k // ins.k) * ins.k
    if kp == 0:                    # an empty sum: +0
        return np.zeros((m, n), np.float16 if ins.rho == RNE_FP16 and promote is None
                        else np.float32)
    if kp != k:
        A = np.concatenate([A, np.zeros((m, kp - k))], axis=1)
        B = np.concatenate([B, np.zeros((kp - k, n))], axis=0)
    parts = []
    for name, x, ptx_type in ((names[0], A, ins.a_type), (names[1], B, ins.b_type)):
        try:
            parts.append(decoded(x, ptx_type, name, ZERO_E))
        except ValueError as err:      # a value the type cannot hold
            raise ValueError(f"{who}: {str(err).removeprefix('mma: ')}") from None
    (am, asg, ae, acl), (bm, bsg, be, bcl) = parts
    nodes = 0 if promote is None else min(int(promote) // ins.L, 1 << 62)
    if ins.group:
        zero = np.zeros((m, n), np.int64)
        return group_mma(parts[0], parts[1], (zero, zero, zero), ins, scales[0], scales[1],
                         nodes)
    if ins.block:
        blocks = kp // ins.block
        try:
            ea = scale_exponents(scales[0], names[2], (m, blocks))
            eb = scale_exponents(scales[1], names[3], (blocks, n))
        except ValueError as err:      # a scale its type cannot hold
            raise ValueError(f"{who}: {str(err).removeprefix('mma: ')}") from None
        fold_scales(am, ae, acl, ea, ins.block, 1)
        fold_scales(bm, be, bcl, eb, ins.block, 0)
    am <<= ins.F - type_params(ins.a_type)[1] - type_params(ins.b_type)[1]
    zero = np.zeros((m, n), np.int32)
    codes = np.empty((m, n), np.int32)
    S = np.empty(n, np.int32 if ins.F <= 13 else np.int64)
    # (an interval beyond K promotes once, at the end, as any interval >= K does)
    acc = np.zeros((m, n), np.float32) if nodes else _NO_ACC
    psa, psb = (_NO_ACC, _NO_ACC) if promote_scales is None else (
        np.ascontiguousarray(x, np.float32) for x in promote_scales)
    mma_kernel(am, asg, ae, acl, bm, bsg, be, bcl, zero, zero, zero.astype(np.int8),
               type_params(ins.c_type)[1], ins.F, ins.L, ins.e_zero, ins.rho, S, codes,
               nodes, acc, psa, psb)
    if nodes:
        acc.view(np.int32)[np.isnan(acc)] = 0x7FFFFFFF      # the hardware's canonical NaN
        return acc
    return (codes.astype(np.uint16).view(np.float16) if ins.rho == RNE_FP16
            else codes.view(np.float32))


def _wgmma_types(types) -> tuple[str, str]:
    fp8 = ("e4m3", "e5m2")
    parts = types.split(".") if isinstance(types, str) else ()
    if len(parts) != 2 or parts[0] not in fp8 or parts[1] not in fp8:
        raise ValueError(f"wgmma_matmul: types={types!r} is not accepted; accepted: "
                         "'e4m3.e4m3', 'e4m3.e5m2', 'e5m2.e4m3', 'e5m2.e5m2'")
    return parts[0], parts[1]
