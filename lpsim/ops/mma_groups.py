"""Blackwell's FP4 tensor-core kinds bit for bit: the block-scaled ``tcgen05.mma`` with
``kind::mxf4`` or ``kind::mxf4nvf4`` (k = 64, E2M1 inputs, E8M0 scales per 32 or 16 products
or UE4M3 scales per 16, f32 result).

MMA-Sim measured these as a group-scaled node (its GST-FDPA: G = 16, F = 35, e_zero = -139,
``mmasim`` 2.1), which differs from the node of :mod:`lpsim.ops.mma` in where the scales act.
Per d_ij and node of 64 products:

1. each group of 16 products a_ik b_kj is summed exactly (E2M1 products are multiples of
   1/4 below 37, so a group sum is an integer number of quarters);
2. the group sum is multiplied by its two scales: significand times significands, exponent
   the sum of the scales' exponents; a group whose products are all zero, or whose scale
   product is zero (a UE4M3 scale of 0), takes the exponent e_zero, a group whose products
   cancel keeps its scales' exponent;
3. the four scaled group sums and C (its own exponent, e_zero when C is zero) are truncated
   toward zero to multiples of 2**(E - 35), E the largest of those exponents, added exactly
   and rounded toward zero to FP32 (subnormals kept, overflow to inf, a zero result +0).

A NaN scale in the node or a NaN C gives NaN (0x7FFFFFFF), an infinite C gives itself.
The node runs on integers here: an input is twice its value (-12 .. 12), a scale its
significand in eighths and its exponent, so step 3 is shifts and adds of int64 words.
"""

from __future__ import annotations


import numpy as np
from numba import njit
from numba.cpython.unsafe.numbers import leading_zeros

from .mma_operands import (FINITE, NAN, NEG_INF, POS_INF, SCALE_NAN, held_value,
                           scale_parts)

_NO_ACC = np.zeros((0, 0), np.float32)


@njit(cache=True, nogil=True, inline="always")
def _truncated(t, up, d):
    """t * 2**(up - d) truncated toward zero, branch-free (t * 2**up fits int64, d >= 0)."""
    sgn = t >> 63
    mag = ((t ^ sgn) - sgn) << up
    return ((mag >> min(d, np.int64(63))) ^ sgn) - sgn


@njit(cache=True, nogil=True)
def group_kernel(qa, qb, sa_sig, sa_exp, sb_sig, sb_exp, cm, ce, ccl, F, L, G, block, e_zero,
                 promote, acc, out):
    """D = A B + C by group-scaled nodes of ``L`` products (the module's docstring) into the
    float32 ``out``.  ``qa`` (M x K) and ``qb`` (K x N): twice the E2M1 inputs (int8);
    ``sa_sig``/``sa_exp`` (M x K/block) and ``sb_sig``/``sb_exp`` (K/block x N): the
    scales' significands in eighths and exponents (SCALE_NAN: NaN); ``cm``/``ce``/``ccl``:
    C's signed significands (23 fraction bits), exponents and classes.  ``promote`` > 0:
    every ``promote`` nodes, and after the last, the chain's D is added to the float32
    ``acc`` (M x N, zeros on entry) and the chain begins again from +0.

    A node's steps run across the row (j innermost), branch-free where every output takes
    them; NaN and inf (a NaN scale, a non-finite C) are set apart afterwards."""
    M, K = qa.shape
    N = qb.shape[1]
    nodes = K // L
    groups = L // G
    P = np.empty(N, np.int32)             # a group's sum of products, in quarters
    nz = np.empty(N, np.int32)            # nonzero where a product of the group is
    T = np.empty((groups, N), np.int64)   # group sums times the scales' significands
    X = np.empty((groups, N), np.int64)   # their exponents (of 2**-8 units)
    hi = np.empty(N, np.int64)
    S = np.empty(N, np.int64)
    nan = np.empty(N, np.int32)
    m_c = np.empty(N, np.int64)
    e_c = np.empty(N, np.int64)
    cl_c = np.empty(N, np.int64)
    up = np.int64(F - 8)                  # a term's shift when its exponent is the node's
    up_c = np.int64(F - 23)
    for i in range(M):
        for j in range(N):
            m_c[j], e_c[j], cl_c[j] = cm[i, j], ce[i, j], ccl[i, j]
        for node in range(nodes):
            nans = False
            for j in range(N):
                nan[j] = 0
                hi[j] = e_c[j] if m_c[j] != 0 else e_zero
            for g in range(groups):
                k0 = node * L + g * G
                for j in range(N):
                    P[j] = 0
                    nz[j] = 0
                for t in range(G):
                    a = np.int32(qa[i, k0 + t])
                    if a == 0:
                        continue
                    for j in range(N):
                        p = a * np.int32(qb[k0 + t, j])
                        P[j] += p
                        nz[j] |= p
                kb = k0 // block
                s_a, x_a = np.int64(sa_sig[i, kb]), np.int64(sa_exp[i, kb])
                nans |= x_a == SCALE_NAN
                s_b, x_b, T_g, X_g = sb_sig[kb], sb_exp[kb], T[g], X[g]
                for j in range(N):
                    nan[j] |= x_b[j] == SCALE_NAN
                    sig = s_a * s_b[j]
                    T_g[j] = P[j] * sig
                    # e_zero where every product or the scale is zero
                    x = np.int64(e_zero) + ((nz[j] != 0) & (sig != 0)) * (
                        x_a + x_b[j] - e_zero)
                    X_g[j] = x
                    hi[j] = max(hi[j], x)
            # a group term is T * 2**(x - 8), C's m_c * 2**(e_c - 23); both truncated to
            # multiples of 2**(hi - F)
            for j in range(N):
                S[j] = _truncated(m_c[j], up_c, max(hi[j] - e_c[j], np.int64(0)))
            for g in range(groups):
                for j in range(N):
                    S[j] += _truncated(T[g, j], up, hi[j] - X[g, j])
            # toward zero to 23 fraction bits, subnormals kept, overflow to inf
            for j in range(N):
                sgn = S[j] >> 63
                mag = (S[j] ^ sgn) - sgn
                x0 = hi[j] - F
                E = max(x0 + 63 - leading_zeros(mag), np.int64(-126))
                sh = E - 23 - x0
                q = (mag >> min(max(sh, np.int64(0)), np.int64(63))) << max(-sh, np.int64(0))
                live = mag != 0
                m_c[j] = ((q ^ sgn) - sgn) if live else np.int64(0)
                e_c[j] = E if live else np.int64(0)
                if cl_c[j] == FINITE and live and E > 127:
                    cl_c[j] = NEG_INF if sgn else POS_INF
            # a NaN scale in the node makes NaN; a NaN or infinite C stays what it is
            for j in range(N):
                cl_c[j] = NAN if nans or nan[j] else cl_c[j]
            last = node + 1 == nodes
            promoting = promote > 0 and ((node + 1) % promote == 0 or last)
            if last or promoting:
                for j in range(N):
                    v = held_value(m_c[j], e_c[j], cl_c[j])
                    if promoting:
                        # one float32 addition (the float64 sum of two float32 values
                        # rounds to the same float32)
                        acc[i, j] = np.float32(np.float64(acc[i, j]) + v)
                        m_c[j], e_c[j], cl_c[j] = 0, 0, FINITE
                    out[i, j] = np.float32(v)


def _twice(mag, sgn, e):
    """Twice the E2M1 values (int8) from :func:`lpsim.ops.mma_operands.decoded`'s parts
    (value = mag * 2**(e - 1), zeros with mag 0)."""
    q = np.where(mag == 0, 0, mag << np.clip(e, 0, 2))
    return np.where(sgn < 0, -q, q).astype(np.int8)


def group_mma(a_parts, b_parts, c_parts, ins, scale_a, scale_b, promote=0):
    """D (float32) of a group-scaled instruction ``ins`` (or of it chained along K, A's and
    B's K a multiple of its k) from the decoded operands (significands, signs, exponents,
    classes; C's significands signed) and the block scales as given."""
    m, k = a_parts[0].shape
    n = b_parts[0].shape[1]
    blocks = k // ins.block
    sa_sig, sa_exp = scale_parts(scale_a, "scale_a", (m, blocks), ins.scale_type, ins.block)
    sb_sig, sb_exp = scale_parts(scale_b, "scale_b", (blocks, n), ins.scale_type, ins.block)
    out = np.empty((m, n), np.float32)
    acc = np.zeros((m, n), np.float32) if promote else _NO_ACC
    cm, ce, ccl = c_parts
    group_kernel(_twice(*a_parts[:3]), _twice(*b_parts[:3]), sa_sig, sa_exp, sb_sig, sb_exp,
                 cm.astype(np.int64), ce.astype(np.int64), ccl.astype(np.int64), ins.F,
                 ins.L, ins.group, ins.block, ins.e_zero, promote, acc, out)
    result = acc if promote else out
    result.view(np.int32)[np.isnan(result)] = 0x7FFFFFFF      # the hardware's canonical NaN
    return result
