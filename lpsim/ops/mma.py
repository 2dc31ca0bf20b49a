"""One NVIDIA tensor-core instruction, D = A B + C, bit for bit as the hardware computes it.

:func:`mma` runs an ``mma`` or ``wgmma`` opcode of a GPU generation (the table and its numbers:
:mod:`lpsim.ops.mma_table`) with the rule MMA-Sim measured on the hardware.  Per output d_ij,
K is cut into fused nodes of L products, and each node, with C the previous node's result
(the instruction's C for the first), does:

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

The node is computed on integers in one compiled numba loop: the significands of A and B
are decoded once, a product is one integer multiply, and the alignment is a shift, so a
256x256x4096 FP8 GEMM runs as 2**28 multiply-shift-adds.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ..formats import parse_format
from .mma_table import FORMATS, RNE_FP16, RZ_E8M13, Instruction, lookup

_FINITE, _NAN, _POS_INF, _NEG_INF = 0, 1, 2, 3
_ZERO_E = -(1 << 20)      # exponent of a zero input: never a node's maximum


@njit(cache=True, nogil=True)
def _decode(values, p, e_sub, e_max, top, has_inf, zero_e, m, e, cls):
    """Split float64 ``values`` of a type with ``p`` fraction bits into signed integer
    significands ``m`` and exponents ``e`` (value = m * 2**(e - p), e >= e_sub; zeros get
    ``zero_e``) and a class (finite, NaN, +inf, -inf).  Returns the flat index of the first
    value the type cannot hold (-1: all can): a ValueError must name it."""
    flat = values.ravel()
    fm, fe, fc = m.ravel(), e.ravel(), cls.ravel()
    for i in range(flat.size):
        v = flat[i]
        fm[i] = 0
        fe[i] = zero_e
        fc[i] = _FINITE
        if v != v:
            fc[i] = _NAN
        elif math.isinf(v):
            if not has_inf:
                return i
            fc[i] = _POS_INF if v > 0 else _NEG_INF
        elif v != 0.0:
            ex = math.frexp(v)[1] - 1
            if ex < e_sub:
                ex = e_sub
            scaled = math.ldexp(v, p - ex)
            sig = int(scaled)
            if sig != scaled or ex > e_max or (ex == e_max and abs(sig) > top):
                return i
            fm[i] = sig
            fe[i] = ex
    return -1


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


@njit(cache=True, nogil=True)
def _round(S, x0, rho):
    """The output code (int32 bits of FP32, or FP16 bits) of S * 2**x0 rounded by ``rho``;
    zero gives +0 and overflow inf, as the hardware does."""
    if S == 0:
        return 0
    a = -S if S < 0 else S
    nb = math.frexp(float(a))[1] - 1          # a < 2**53: exact
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
def _special(am, acl, bm, bcl, i, j, k0, L, ccl):
    """Class of a node's IEEE sum when an input or C is NaN or inf."""
    pos = ccl == _POS_INF
    neg = ccl == _NEG_INF
    nan = ccl == _NAN
    for t in range(k0, k0 + L):
        ca, cb = acl[i, t], bcl[j, t]
        if ca == _FINITE and cb == _FINITE:
            continue
        if ca == _NAN or cb == _NAN:
            nan = True
            continue
        if (ca == _FINITE and am[i, t] == 0) or (cb == _FINITE and bm[j, t] == 0):
            nan = True                                         # inf * 0
            continue
        sa = ca == _NEG_INF or (ca == _FINITE and am[i, t] < 0)
        sb = cb == _NEG_INF or (cb == _FINITE and bm[j, t] < 0)
        if sa != sb:
            neg = True
        else:
            pos = True
    if nan or (pos and neg):
        return _NAN
    return _NEG_INF if neg else _POS_INF


@njit(cache=True, nogil=True)
def _code_of(cls, out16):
    """The output code of NaN or an infinity."""
    if cls == _NAN:
        return 0x7FFF if out16 else 0x7FFFFFFF
    if out16:
        return 0x7C00 if cls == _POS_INF else 0xFC00
    return 0x7F800000 if cls == _POS_INF else -0x800000


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
            return 0, 0, _NAN
        return 0, 0, _NEG_INF if neg else _POS_INF
    if ef == 0:
        m, e = frac, e_sub
    else:
        m, e = frac | (1 << p), ef - bias
    return (-m if neg else m), e, _FINITE


@njit(cache=True, nogil=True)
def mma_kernel(am, ae, acl, bm, be, bcl, cm, ce, ccl, pc, pab, F, L, e_zero, rho, out):
    """D = A B + C by fused nodes of ``L`` products (the module's docstring) into the int32
    output codes ``out``.  ``am``/``ae``/``acl`` (M x K) and ``bm``/``be``/``bcl`` (N x K:
    B transposed) are the inputs' significands, exponents and classes, with ``pab`` the
    fraction bits of a product; ``cm``/``ce``/``ccl`` C's, with ``pc`` its fraction bits."""
    M, K = am.shape
    N = bm.shape[0]
    nodes = K // L
    out16 = rho == RNE_FP16
    p_out = 10 if out16 else 23
    a_special = np.zeros((M, nodes), np.bool_)
    b_special = np.zeros((N, nodes), np.bool_)
    for i in range(M):
        for t in range(K):
            if acl[i, t] != _FINITE:
                a_special[i, t // L] = True
    for j in range(N):
        for t in range(K):
            if bcl[j, t] != _FINITE:
                b_special[j, t // L] = True
    P = np.empty(L, np.int64)
    E = np.empty(L, np.int64)
    for i in range(M):
        for j in range(N):
            m_c, e_c, cl_c, p_c = cm[i, j], ce[i, j], ccl[i, j], pc
            bits = 0
            for node in range(nodes):
                k0 = node * L
                if cl_c != _FINITE or a_special[i, node] or b_special[j, node]:
                    bits = _code_of(_special(am, acl, bm, bcl, i, j, k0, L, cl_c), out16)
                else:
                    e_max = e_c if m_c != 0 else e_zero
                    zero = False
                    for t in range(L):
                        P[t] = am[i, k0 + t] * bm[j, k0 + t]
                        E[t] = ae[i, k0 + t] + be[j, k0 + t]
                        if E[t] > e_max:
                            e_max = E[t]
                        zero |= P[t] == 0
                    if zero and e_zero > e_max:
                        e_max = e_zero
                    x0 = e_max - F
                    S = _shift(m_c, e_c - p_c - x0)
                    for t in range(L):
                        S += _shift(P[t], E[t] - pab - x0)
                    bits = _round(S, x0, rho)
                m_c, e_c, cl_c = _unpack(bits, out16)
                p_c = p_out
            out[i, j] = bits


def _as_float64(x, name):
    """(float64 numpy copy, library of x, torch device or None) of an operand."""
    if hasattr(x, "detach") and hasattr(x, "dtype") and type(x).__module__.startswith("torch"):
        device = x.device
        x = x.detach().cpu()
        x = x if x.dtype.is_floating_point and x.dtype.itemsize == 8 else x.float()
        with np.errstate(invalid="ignore"):              # NaN codes: no warning
            return x.numpy().astype(np.float64), "torch", device
    try:
        with np.errstate(invalid="ignore"):
            return np.asarray(x).astype(np.float64), "numpy", None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"mma: {name} must be a numpy array or torch tensor of numbers, not "
                         f"{type(x).__name__} ({exc})") from None


def _tf32_low_bits(x):
    """Flat index of the first float32 value with any of the 13 bits TF32 lacks set, or -1."""
    bits = np.ascontiguousarray(x, np.float64).astype(np.float32).view(np.uint32)
    bad = np.flatnonzero(bits & np.uint32(0x1FFF))
    return int(bad[0]) if bad.size else -1


def _decoded(values, ptx_type, name, shape, zero_e, transposed=False):
    """Significands, exponents and classes of an operand (:func:`_decode`); ValueError
    naming the first value ``ptx_type`` cannot hold (``transposed``: values is B.T)."""
    fmt = parse_format(FORMATS[ptx_type])
    m = np.empty(values.shape, np.int64)
    e = np.empty(values.shape, np.int64)
    cls = np.empty(values.shape, np.int8)
    bad = _decode(np.ascontiguousarray(values), fmt.m, fmt.emin, fmt.emax,
                  (1 << fmt.m) + fmt.max_mantissa, fmt.has_inf, zero_e, m, e, cls)
    if bad < 0 and ptx_type == "tf32":
        bad = _tf32_low_bits(values)
    if bad >= 0:
        where = np.unravel_index(bad, shape)[::-1 if transposed else 1]
        value = float(values.ravel()[bad])
        accepted = (f"finite values of {ptx_type} ({fmt!r}: {fmt.m} fraction bits, least "
                    f"exponent {fmt.emin}, largest finite {fmt.max_finite:g})"
                    + (", inf" if fmt.has_inf else ", no inf") + " and NaN")
        raise ValueError(f"mma: {name}[{', '.join(str(int(w)) for w in where)}] = {value!r} "
                         f"is not a value of type {ptx_type}; accepted: {accepted}")
    return m, e, cls


def mma(a, b, c, *, arch, instruction):
    """D = A B + C of one tensor-core ``instruction`` (a PTX opcode such as
    ``"mma.m16n8k16.f32.bf16.bf16.f32"`` or ``"wgmma.m64n8k32.f32.e4m3.e4m3"``) on the GPU
    generation ``arch`` ("volta", "turing", "ampere", "ada", "hopper", "blackwell"), bit for
    bit as the hardware computes it (the module's docstring).

    ``a`` (m x k), ``b`` (k x n) and ``c`` (m x n) are numpy arrays or torch tensors holding
    values of the instruction's A, B and C types (torch or ml_dtypes float8/bf16/fp16 dtypes,
    or float32/float64 containers whose values the type can hold; a tf32 operand is float32
    with the low 13 bits zero).  Returns D as float32 (float16 for an ``.f16`` result), a
    numpy array, or a torch tensor on a's device when a is one.  A wrong shape, an unknown or
    missing instruction, or a value the type cannot hold is a ValueError naming it."""
    ins: Instruction = lookup(arch, instruction)
    A, lib, device = _as_float64(a, "a")
    B, _, _ = _as_float64(b, "b")
    C, _, _ = _as_float64(c, "c")
    for name, arr, want in (("a", A, (ins.m, ins.k)), ("b", B, (ins.k, ins.n)),
                            ("c", C, (ins.m, ins.n))):
        if arr.shape != want:
            raise ValueError(f"mma: {name} has shape {arr.shape}; {ins.opcode} on {ins.arch} "
                             f"accepts {name} of shape {want} (m={ins.m}, n={ins.n}, "
                             f"k={ins.k})")
    am, ae, acl = _decoded(A, ins.a_type, "a", A.shape, _ZERO_E)
    Bt = np.ascontiguousarray(B.T)
    bm, be, bcl = _decoded(Bt, ins.b_type, "b", Bt.shape, _ZERO_E, transposed=True)
    cm, ce, ccl = _decoded(C, ins.c_type, "c", C.shape, 0)
    pa = parse_format(FORMATS[ins.a_type]).m
    pb = parse_format(FORMATS[ins.b_type]).m
    pc = parse_format(FORMATS[ins.c_type]).m
    out = np.empty((ins.m, ins.n), np.int32)
    mma_kernel(am, ae, acl, bm, be, bcl, cm, ce, ccl, pc, pa + pb, ins.F, ins.L, ins.e_zero,
               ins.rho, out)
    d = (out.astype(np.uint16).view(np.float16) if ins.rho == RNE_FP16
         else out.view(np.float32))
    if lib == "torch":
        import torch
        return torch.from_numpy(d.copy()).to(device)
    return d
