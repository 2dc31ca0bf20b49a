"""The rounding core: one scalar decision that both the CPU simulator and lpsim_cuda compile.

Values live in float32 or float64 *containers*; rounding maps a container value to the
container value of the rounded number.  The decision works on the container's bit pattern
with integer arithmetic only (no float operations, so no FMA contraction and no flushing).

How a finite nonzero x is rounded to fp(e, m, b).  Let ``ex = floor(log2|x|)`` and take the
quantum ``2**q`` with ``q = ex - m`` in the normal range and ``q = emin - m`` below it
(``q = emin`` when subnormals are off, so the only values there are 0 and min_normal).
Then ``|x| = (keep + frac) * 2**q`` with integer ``keep`` and ``0 <= frac < 1``, and the
result magnitude is ``(keep + inc) * 2**q`` where ``inc`` is, per mode (frac > 0):

====================  =============================================================
``nearest``           frac > 1/2, or frac == 1/2 and keep odd (ties to even)
``nearest_away``      frac >= 1/2 (ties away from zero)
``toward_zero``       0
``up`` / ``down``     toward +inf / -inf: 1 for positive / negative x
``odd``               1 when keep is even (round to odd: jam the last bit)
``stochastic``        u < frac, with u = R / 2**W the element's uniform (lpsim.philox)
                      sr_bits=k < W: R_k < floor(frac * 2**k), R_k the top k bits of R
``stochastic_equal``  u >= 1/2 (either neighbour with probability 1/2)
====================  =============================================================

"Even" and "odd" are the last bit of the result's encoding in the format: the last mantissa
bit, or the exponent code's last bit when m == 0.  With subnormals off, a tie between 0 and
min_normal goes to 0.

Stochastic rounding is exactly unbiased whenever frac has at most W bits (W = 32 in float32,
62 in float64 containers); otherwise P(up) = ceil(frac 2**W) / 2**W, within 2**-W of frac.
Few-bit SR (``sr_bits=k``) truncates frac to k bits, so it is biased low by less than 2**-k of
a quantum, as hardware that adds k random bits below the rounding point is.

Overflow: a finite x whose rounded magnitude (with unbounded exponent) exceeds max_finite
counts as overflow and becomes +-inf for nearest, nearest_away and both stochastic modes,
for ``up`` above zero and ``down`` below zero; +-max_finite for toward_zero, odd and the other
directed cases.  A format with ``saturate`` always gives +-max_finite; an ``fn`` format gives
NaN where ieee gives inf.  inf inputs are kept (ieee), become +-max_finite (saturate, fn with
saturate=True) or NaN (fn).  NaN inputs are returned unchanged.  Zeros keep their sign, and a
result that underflows to zero keeps the sign of x.  Policy ``fnuz`` (one unsigned zero)
overflows and takes inf to NaN as ``fn`` does, and gives +0 for every zero result.  Policy
``fnu`` (unsigned, no zero: E8M0) takes zero, negative and inf inputs to NaN, and a positive
result that would be 0 to the smallest value (flagged UNDERFLOW and INEXACT).

Flags per element: INEXACT (result differs from x), OVERFLOW, UNDERFLOW (nonzero finite x
rounded to zero), SUBNORMAL (nonzero result below min_normal), NAN_IN, INF_IN.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np
from numba.extending import register_jitable

from .formats import CONTAINERS, SPECIALS, Format
from .philox import WORD_BITS, block_words, lane_word
from .storage import pack_bits
from .word32 import as_int64, as_signed64, bits_float32, float32_bits, like, widen, word

NEAREST, NEAREST_AWAY, TOWARD_ZERO, UP, DOWN, ODD, STOCHASTIC, STOCHASTIC_EQUAL = range(8)
MODES = {
    "nearest": NEAREST, "nearest_away": NEAREST_AWAY, "toward_zero": TOWARD_ZERO,
    "up": UP, "down": DOWN, "odd": ODD,
    "stochastic": STOCHASTIC, "stochastic_equal": STOCHASTIC_EQUAL,
}
DETERMINISTIC_MODES = ("nearest", "nearest_away", "toward_zero", "up", "down", "odd")
STOCHASTIC_MODES = ("stochastic", "stochastic_equal")

INEXACT, OVERFLOW, UNDERFLOW, SUBNORMAL, NAN_IN, INF_IN = 1, 2, 4, 8, 16, 32


def mode_code(rounding: str) -> int:
    """The integer code of a rounding mode name, with a clear error for unknown names."""
    try:
        return MODES[rounding]
    except (KeyError, TypeError):
        raise ValueError(f"unknown rounding {rounding!r}; accepted: {', '.join(MODES)}") from None


class Params(NamedTuple):
    """What the scalar decision needs to know of one (format, container) pair; all int64."""

    M: int          # container mantissa bits
    EB: int         # container exponent bias
    CEMIN: int      # container min normal exponent
    EMAXF: int      # container exponent field of inf/NaN
    SIGN: int       # container sign bit as a signed integer (-2**31 or -2**63)
    MAG: int        # mask of the magnitude bits
    W: int          # random bits per element
    emin: int       # format min normal exponent
    m: int          # format mantissa bits
    qsub: int       # quantum exponent below min_normal
    tiny: int       # container bits of 2**qsub (the smallest positive value)
    maxb: int       # container bits of max_finite
    minnorm: int    # container bits of min_normal
    ovf_inf: int    # magnitude bits of an overflow that goes "to infinity"
    inf_out: int    # magnitude bits an inf input becomes
    nanb: int       # container bits of the quiet NaN
    fast_lo: int    # container exponent fields where round_fast applies: fast_lo..fast_hi
    fast_hi: int
    uzero: int      # 1: zero results are +0 (fnuz, fnu)
    unsigned: int   # 1: no zero, no negatives (fnu)


def _bits_of(value: float, dtype) -> int:
    return int(np.array(value, dtype=dtype).view(np.int64 if dtype.itemsize == 8 else np.int32))


def kernel_params(fmt: Format, dtype) -> Params:
    """The decision's integer parameters for ``fmt`` in a float32/float64 container."""
    return _kernel_params(fmt, np.dtype(dtype))


@functools.lru_cache(maxsize=512)
def _kernel_params(fmt: Format, dtype: np.dtype) -> Params:
    # cached: a GPU launch would otherwise spend most of its host time here
    fmt.check_fits(dtype)
    M, EB, CEMIN, EMAXF = CONTAINERS[dtype]
    width = dtype.itemsize * 8
    qsub = fmt.emin - fmt.m if fmt.subnormals else fmt.emin
    maxb = _bits_of(fmt.max_finite, dtype)
    infb = EMAXF << M
    nanb = infb | (1 << (M - 1))
    if fmt.saturate:
        ovf_inf = maxb
    else:
        ovf_inf = infb if fmt.specials == "ieee" else nanb
    if fmt.specials == "ieee":
        inf_out = infb
    else:
        inf_out = maxb if fmt.saturate else nanb
    # round_fast covers container normals in the format's normal range below its top binade
    # (no overflow, no subnormal, constant shift M - m); empty when m == M.
    fast_lo, fast_hi = max(fmt.emin + EB, 1), fmt.emax - 1 + EB
    if fmt.m == M or not fmt.signed:
        fast_lo, fast_hi = 1, 0     # fnu: negatives become NaN, which round_fast cannot say
    # an empty range stays empty in 32-bit words (unsigned: a negative bound wraps around);
    # formats whose top binade lies below the container's normals have one
    fast_hi = max(fast_hi, fast_lo - 1)
    return Params(M, EB, CEMIN, EMAXF, -(1 << (width - 1)), (1 << (width - 1)) - 1,
                  WORD_BITS[dtype.itemsize], fmt.emin, fmt.m, qsub,
                  _bits_of(np.ldexp(1.0, qsub), dtype), maxb,
                  _bits_of(fmt.min_normal, dtype), ovf_inf, inf_out, nanb, fast_lo, fast_hi,
                  int(not fmt.has_negative_zero), int(not fmt.signed))


@register_jitable
def _increment(keep, rem, s, mode, negative, r, w, k):
    """0 or 1: whether |x| = (keep + rem/2**s) quanta, rem > 0, rounds up in magnitude.

    ``keep``'s last bit is the last bit of the format's code (ties to even, round to odd).
    Straight-line per mode (no early returns, no branches on the data) so that a loop over
    it vectorises.
    """
    inc = np.int64(0)
    if mode == NEAREST or mode == NEAREST_AWAY:
        half = np.int64(1) << min(max(s - 1, 0), 62)  # rem < 2**54 <= half when s > 62
        if mode == NEAREST:
            inc = np.int64((rem > half) | ((rem == half) & ((keep & 1) == 1)))
        else:
            inc = np.int64(rem >= half)
    elif mode == UP:
        inc = np.int64(not negative)
    elif mode == DOWN:
        inc = np.int64(negative)
    elif mode == ODD:
        inc = 1 - (keep & 1)
    elif mode == STOCHASTIC_EQUAL:
        inc = r >> (w - 1)
    elif mode == STOCHASTIC:
        # R_k < t with t = frac * 2**k (rounded up when k == W: exact SR, down for few-bit
        # SR), compared on the top min(s, k) bits of both sides; rem < 2**54, so d <= 62
        d = min(max(s - k, 0), 62)
        t = rem >> d
        if k == w:
            t += np.int64((rem & ((np.int64(1) << d) - 1)) != 0)
        inc = np.int64((r >> (w - min(s, k))) < t)
    return inc


@register_jitable
def _overflows_to_inf(mode, negative):
    if mode == TOWARD_ZERO or mode == ODD:
        return False
    if mode == UP:
        return not negative
    if mode == DOWN:
        return negative
    return True


@register_jitable
def _carry(a, mask, s, lsb, sign, mode, r, W, k, shift0):
    """The magnitude ``a`` rounded at bit ``s`` (``mask`` = 2**s - 1) by adding a per-mode
    amount and truncating, so a round-up is the carry: the decision of :func:`round_fast`
    and :func:`round_fast_sub` (``lsb``: the last bit of the format's code, ``sign``: -1 for
    negative x), making exactly the choices of :func:`_increment`."""
    # ``shift0`` (a constant): s may be 0 (mask 0: a format with the container's mantissa
    # bits, in its normal range), where nothing may be added: the half-quantum terms then
    # take mask's last bit, 1 exactly when s >= 1 (one more operation, so round_fast, whose
    # s is M - m > 0 wherever its result is used, leaves it out)
    add = np.int64(0)                           # toward_zero; odd is settled below
    if mode == NEAREST:
        add = (mask >> 1) + ((lsb & mask) if shift0 else lsb)
    elif mode == NEAREST_AWAY:
        add = (mask >> 1) + ((mask & 1) if shift0 else 1)
    elif mode == UP:
        add = mask & ~sign
    elif mode == DOWN:
        add = mask & sign
    elif mode == STOCHASTIC_EQUAL:
        add = mask & -(r >> (W - 1))
    elif mode == STOCHASTIC:
        j = min(s, k)                           # decision bits: R_j < rem's top j bits
        # (a shift by less than W: j == 0 keeps one bit, which the mask then clears)
        add = (~(r >> (min(W - j, W - 1) if shift0 else W - j))
               & ((np.int64(1) << j) - 1)) << (s - j)
        # full-width SR compares R with rem's top bits rounded up (round_bits' t): ones
        # below them carry any nonzero rest; few-bit SR truncates them
        add |= ((np.int64(1) << (s - j)) - 1) & -np.int64(k == W)
    out = (a + add) & ~mask
    if mode == ODD:
        out += np.int64(((a & mask) != 0) & (lsb == 0)) << s
    return out


@register_jitable
def round_fast(bits, mode, r, k, p):
    """The common case of :func:`round_bits` without branches on the data: (bits, ok, inexact).

    Valid when ``ok`` (x normal in the format, below its top binade, so the shift is M - m and
    nothing overflows or underflows); otherwise the caller runs :func:`round_bits`.  Each mode
    adds an amount below the rounding point and truncates, so a round-up is the carry (into
    the exponent field too); the amounts make exactly the decisions of :func:`_increment`
    (stochastic: the complement of the top bits of R carries iff R_j < rem_j).  With ``mode``
    a constant a loop over it vectorises: a few integer operations, the rest loop-invariant.
    ``bits`` (and ``r``) may be 32-bit words (:mod:`lpsim.word32`, float32 containers on the
    CPU): the same operations then run in 32-bit vector lanes, twice as many.
    """
    M, SIGN, W, m, EB, emin = p.M, p.SIGN, p.W, p.m, p.EB, p.emin
    s = M - m
    mask = (np.int64(1) << s) - 1
    a_lo = p.fast_lo << M                       # ok: a_lo <= |bits| < a_hi
    a_hi = (p.fast_hi + 1) << M
    # the code's last bit: keep's, or with m == 0 the format's exponent code's
    parity = (1 - emin - EB) & 1 if m == 0 else 0
    bits = widen(bits)                          # int64, or a 32-bit word (lpsim.word32)
    sign = -((bits >> (31 if M == 23 else 63)) & 1)     # all ones for negative x, else 0
    a = bits & p.MAG
    rem = a & mask
    out = _carry(a, mask, s, ((a >> s) ^ parity) & 1, sign, mode, r, W, k, False)
    ok = np.int64(a >= a_lo) & np.int64(a < a_hi)     # 0/1 integers: they sum in vectors
    okm = -ok
    return ((out | (bits & SIGN)) & okm) | (bits & ~okm), ok, ok & np.int64(rem != 0)


@register_jitable(forceinline=True)
def _shr_or_zero(x, d):
    """x >> d for x < 2**62 and any shift d >= 0 (0 from 62 on), in two shifts below 32:
    LLVM leaves a shift by the operand's width or more undefined, and x may be a word."""
    first = min(d, 31)
    return (x >> first) >> min(d - first, 31)


@register_jitable(forceinline=True)
def _small_increment(a, biased, sign, mode, r, k, p):
    """0 or 1: whether a finite container normal below min_subnormal (|x| = F tiny with
    0 < F < 1; magnitude bits ``a``, exponent field ``biased``) rounds up to min_subnormal:
    the choices of :func:`_increment` on F (ties go to 0, the even code).

    Nearest compares ``a`` with tiny / 2's bits (F > 1/2).  Stochastic rounding needs F's
    top bits as a fixed-point number: F 2**W = sig_top / 2**dd, the significand's bits with
    its top bit at bit W - 1 (or above, where the words are narrower than the significand)
    and dd >= 0 (clamped for lanes at or above tiny, whose choice is not used).  SR compares
    R_k < floor(F 2**k) = sig_top >> (dd + W - k); full-width SR R < ceil(F 2**W), which is
    ((sig_top - 1) >> dd) + 1.
    """
    W, M = p.W, p.M
    one = np.int64(1)
    inc = like(a, 0)                            # toward_zero
    if mode == NEAREST or mode == NEAREST_AWAY:
        # tiny / 2: one exponent field lower, or half the bits where tiny is the container's
        # min normal or subnormal
        half = p.tiny - (one << M) if p.tiny > (one << M) else p.tiny >> 1
        inc = like(a, a > half) if mode == NEAREST else like(a, a >= half)
    elif mode == UP:
        inc = 1 + sign
    elif mode == DOWN:
        inc = -sign
    elif mode == ODD:
        inc = like(a, 1)
    elif mode == STOCHASTIC_EQUAL:
        inc = r >> (W - 1)
    elif mode == STOCHASTIC:
        # the significand's M + 1 bits, shifted left to end at bit W - 1 or, where the random
        # words are narrower than it (float64 containers with float32 words), right by dd
        sig_top = ((a & ((one << M) - 1)) | (one << M)) << max(W - M - 1, 0)
        dd = max(p.qsub + p.EB - 1 - biased, 0) + max(M + 1 - W, 0) + (W - k)
        full = like(a, k == W)
        inc = like(a, (r >> (W - k)) < _shr_or_zero(sig_top - full, dd) + full)
    return inc


@register_jitable(forceinline=True)
def fast_sub_ok(bits, p):
    """1 where :func:`round_fast_sub` applies to ``bits`` (its ``ok``), else 0, in the
    operand's width: what a caller that only needs to find the elements it left computes."""
    M = p.M
    bits = widen(bits)
    a = bits & p.MAG
    # saturating formats: every finite x above is in range (overflow clamps to max_finite)
    top = (p.EMAXF << M) if p.ovf_inf == p.maxb else ((p.fast_hi + 1) << M)
    return like(bits, (a < top) & (((a >> M) >= 1) | (a == 0)) & (p.unsigned == 0))


@register_jitable(forceinline=True)
def pack_conditions(inexact, over, under, sub, width):
    """Four flag conditions (each 0 or 1) as one word, ``width`` bits apart: 1 gives
    round_bits' INEXACT, OVERFLOW, UNDERFLOW, SUBNORMAL; 8 one a byte, the form SIMD lanes
    sum (up to 255 elements)."""
    return inexact | (over << width) | (under << (2 * width)) | (sub << (3 * width))


@register_jitable(forceinline=True)
def round_fast_sub_conditions(bits, mode, r, k, p):
    """:func:`round_fast_sub`'s decision with its flags one a value: (bits, ok, inexact,
    overflow, underflow, subnormal), each 0 or 1 in the operand's width (valid where ok is
    1).  A GPU thread adds them to its counters as they are (lpsim_cuda.block_groups);
    packed into one flags word they pay where SIMD lanes sum them.
    """
    M, SIGN, W, m, EB, emin = p.M, p.SIGN, p.W, p.m, p.EB, p.emin
    parity = (1 - emin - EB) & 1 if m == 0 else 0
    bits = widen(bits)                          # int64, or a 32-bit word (lpsim.word32)
    sign = -((bits >> (31 if M == 23 else 63)) & 1)     # all ones for negative x, else 0
    a = bits & p.MAG
    biased = a >> M
    lo = emin + EB                              # the format's min normal exponent field
    below = lo - min(biased, lo)                # binades below min_normal
    s = min(M - m + below, M)
    # the code's last bit: keep's; at s == M below min_normal keep is the implicit 1 alone
    lsb = (((a >> s) ^ parity) & 1) | np.int64((s == M) & (below != 0))
    out = _carry(a, (np.int64(1) << s) - 1, s, lsb, sign, mode, r, W, k, True)
    inc = _small_increment(a, biased, sign, mode, r, k, p)
    sm = -(np.int64(a < p.tiny) & np.int64(a != 0))
    out = (out & ~sm) | (-inc & p.tiny & sm)
    ok = fast_sub_ok(bits, p)
    over = like(bits, out > p.maxb)
    out = min(out, p.maxb)
    zero = like(bits, out == 0)
    okm = -ok
    signed = bits & SIGN & -(1 - (zero & p.uzero))
    return (((out | signed) & okm) | (bits & ~okm), ok, like(bits, out != a), over,
            zero & like(bits, a != 0), (1 - zero) & like(bits, out < p.minnorm))


@register_jitable(forceinline=True)
def round_fast_sub(bits, mode, r, k, p):
    """:func:`round_fast` for every finite container normal (and zero): (bits, ok, flags).

    One straight-line path: the shift grows by one per binade below min_normal, so the
    format's subnormal quanta come out of the same add-and-truncate; below min_subnormal the
    result is 0 or min_subnormal (:func:`_small_increment`); a saturating format clamps
    overflow to max_finite.  ``ok`` is 0 (the caller runs :func:`round_bits`) for NaN, inf,
    container subnormals, ``fnu`` formats and, unless the format saturates, |x| >= 2**emax.
    ``flags`` are :func:`round_bits`' own (INEXACT, OVERFLOW, UNDERFLOW,
    SUBNORMAL; 0 where ok is 0); always inlined (LLVM ``alwaysinline``), as LLVM's
    cost model leaves the stochastic variant a call, and a loop with a call does not
    vectorise.  Block-scaled elements (lpsim.blocks) need this
    range: most of them are small against their block's scale, and a branch per element
    costs more than the rounding.  As :func:`round_fast`, ``bits`` and ``r`` may be 32-bit
    words: every quantity here is a nonnegative integer below 2**32 in a float32 container
    (differences are taken as ``a - min(a, b)``), and every shift is less than 32.
    """
    out, ok, inexact, over, under, sub = round_fast_sub_conditions(bits, mode, r, k, p)
    return out, ok, pack_conditions(inexact, over, under, sub, 1) & -ok


@register_jitable
def sr_word_applies(p, mode: int, k: int) -> bool:
    """Whether :func:`round_sr_word` makes round_fast_sub's decisions for mode ``mode`` with
    ``k`` random bits and the float32-container Params ``p`` (on the host, and in compiled
    code once a call, before its loops)."""
    return (mode == STOCHASTIC and k == p.W == 32 and p.M == 23 and p.uzero == 0
            and p.unsigned == 0 and 32 - p.qsub <= 127)


@register_jitable(forceinline=True)
def round_sr_word(bits, r, p):
    """:func:`round_fast_sub`'s (bits, ok) for stochastic rounding with a full 32-bit random
    word ``r`` (k = W = 32) of a float32 container word, in fewer operations (the bits are
    valid where ok is 1): the GPU's uncounted SR kernels (lpsim_cuda.specialised for formats
    whose subnormals data reaches, such as e4m3fn, FP6 and FP4; block formats' elements).

    Above the smallest subnormal the quantum is 2**s container units (s = M - m, plus one a
    binade below min_normal) and the result rounds up iff r < rem * 2**(32 - s) (the
    discarded bits as a 32-bit fraction of the quantum; the add-and-truncate's carry).
    Below it, |x| = F * tiny with F < 1 and the result is tiny iff r < ceil(F * 2**32), F *
    2**32 being |x| * 2**(32 - qsub) exactly in float32 (round_fast_sub's
    :func:`_small_increment`).  Needs a signed format with signed zero (``uzero`` 0), float32
    containers and 2**(32 - qsub) a float32; ``ok`` as round_fast_sub's (NaN, inf, container
    subnormals and, unless the format saturates, the top binade left to round_bits)."""
    out, ok, _, _, _, _ = round_sr_word_conditions(bits, r, p)
    return out, ok


@register_jitable(forceinline=True)
def round_sr_word_conditions(bits, r, p):
    """:func:`round_sr_word` with :func:`round_fast_sub_conditions`' flags: (bits, ok,
    inexact, overflow, underflow, subnormal), each flag 0 or 1 (valid where ok is 1), read
    off the magnitude before and after the clamp to the largest value, as there."""
    M, m, tiny = p.M, p.m, p.tiny
    bits = widen(bits)
    a = bits & p.MAG
    biased = a >> M
    lo = p.emin + p.EB                          # min_normal's exponent field
    s = min(M - m + (lo - min(biased, lo)), M)  # at most M: past it (below tiny) unused
    f = (a << (32 - s)) & 0xFFFFFFFF            # the discarded bits, a fraction of 2**32
    up = ((a >> s) + like(a, r < f)) << s
    # below tiny: t < 2**32 (above it, t is that of the largest float32 below tiny, unused);
    # 2**(32 - qsub) from its bits: where p is data, not constants (the CPU), a power was a
    # call per element that kept a loop from vectorising (5.5 against 0.3 ns an element)
    t = bits_float32(min(a, tiny - 1)) * bits_float32(like(a, (32 - p.qsub + 127) << 23))
    ceil = like(a, np.uint32(math.ceil(t)))
    small = tiny if r < ceil else 0             # cheap arms: selects, not branches
    up = small if a < tiny else up
    out = min(up, p.maxb)
    top = (p.EMAXF << M) if p.ovf_inf == p.maxb else ((p.fast_hi + 1) << M)
    ok = like(a, a < top) & (like(a, biased >= 1) | like(a, a == 0))
    zero = like(a, out == 0)
    return (out | (bits & p.SIGN), ok, like(a, out != a), like(a, up > p.maxb),
            zero & like(a, a != 0), (1 - zero) & like(a, out < p.minnorm))


@register_jitable(forceinline=True)
def nearest32(yb, cw, lw):
    """The float32 magnitude of the word ``yb`` rounded to nearest even in a format with
    ``m`` mantissa bits and min normal exponent ``emin`` (``cw`` = 23 - m, ``lw`` = emin + 150
    - m: :func:`nearest32_words`), subnormals included: (|y| + c) - c in float32 arithmetic,
    with c = 1.5 * 2**23 times the quantum of y's binade (or of the format's subnormals), so
    the adder's own rounding to nearest even is the decision.  Exact where
    :func:`nearest32_exact` holds, for |y| below 2**(105 + m) (:func:`nearest32_top`); above
    it c saturates at the largest exponent, which only a caller that clamps to a smaller
    largest value may use."""
    a = yb & 0x7FFFFFFF
    e = min(max((a >> 23) + cw, lw), 254)
    c = bits_float32((e << 23) | 0x400000)
    return (bits_float32(a) + c) - c


@register_jitable(forceinline=True)
def nearest_bf16(b):
    """The float32 bits ``b`` (a word) rounded to nearest even on bfloat16's grid, in bits:
    add 0x7FFF plus the kept part's last bit, clear the low half.  Equal to :func:`nearest32`
    with its sign for every finite value below bfloat16's largest (subnormals included:
    bfloat16's quanta are float32's shifted by 16 bits); five integer operations where
    nearest32 with its sign takes a dozen."""
    return (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000


@register_jitable
def nearest32_words(m, emin):
    """(cw, lw): :func:`nearest32`'s words for a format of ``m`` mantissa bits and min normal
    exponent ``emin``."""
    return word(23 - m), word(emin + 150 - m)


def nearest32_exact(fmt) -> bool:
    """Whether :func:`nearest32` is round_bits' nearest rounding of float32 values to
    ``fmt`` (before overflow): a signed format with signed zero and subnormals, of 1 to 21
    mantissa bits, whose values are float32 values (then c is a float32 normal) and whose
    normals start at float32's or above (a float32 subnormal's quantum is then the format's
    subnormal one), with a subnormal quantum of at most 2**104 (c's exponent field for it,
    ``lw``, at most 254).  Not m = 0: a tie there goes to the even exponent code, which the
    bias decides and the float32 add does not see (it takes the even power of two's
    significand); not m = 22: c = 3 * 2**e puts |y| + c in the binade above, whose quantum
    is twice the format's."""
    return (fmt.subnormals and fmt.specials in SPECIALS and 1 <= fmt.m <= 21
            and -126 <= fmt.emin and fmt.emin - fmt.m <= 104 and fmt.fits(np.float32)[0])


@register_jitable
def nearest32_top(m):
    """The float32 magnitude bits below which :func:`nearest32` has the right c for a
    format of ``m`` mantissa bits (c's exponent field stays below 255): 2**(105 + m)."""
    return min(232 + m, 255) << 23


@register_jitable
def nearest32_consts(p):
    """(cw, lw, lim, largest) of a nearest32 pass to ``p``'s format (float32 container): the
    words of :func:`nearest32_words`, the magnitude below which the pass
    decides (2**(105 + m), and for a format that does not saturate its largest value), and
    what a result is clamped to: a saturating format's largest value (its overflow, which
    FP4 and FP8 data meet often, stays in the pass), else inf (no clamp)."""
    cw, lw = nearest32_words(p.m, p.emin)
    top = nearest32_top(p.m)
    if p.ovf_inf == p.maxb:                     # saturating: overflow is the largest value
        return cw, lw, bits_float32(word(top)), bits_float32(word(p.maxb))
    return cw, lw, bits_float32(word(min(top, p.maxb))), np.float32(np.inf)


@register_jitable(forceinline=True)
def nearest32_step(xv, cw, lw, lim, largest):
    """(nearest32 of the float32 xv with its sign, at most ``largest`` in magnitude, 1) where
    |x| < lim, else (xv, 0)."""
    b = float32_bits(xv)
    ok = abs(xv) < lim                          # false for NaN: a float compare, one lane op
    v = bits_float32(float32_bits(min(nearest32(b, cw, lw), largest)) | (b & 0x80000000))
    return (v if ok else xv), like(b, ok)


@register_jitable
def round_bits(bits, mode, r, k, p):
    """Round one container value given as signed-integer bits; returns (bits, flags).

    ``r`` is the element's W-bit random integer (ignored by deterministic modes), ``k`` the
    stochastic bits used (W for full SR), ``p`` the :class:`Params` tuple.
    """
    (M, EB, CEMIN, EMAXF, SIGN, MAG, W, emin, m, qsub, tiny, maxb, minnorm, ovf_inf,
     inf_out, nanb, _, _, uzero, unsigned) = p
    bits = np.int64(bits)
    negative = bits < 0
    a = bits & MAG
    fracmask = (np.int64(1) << M) - 1
    biased = a >> M
    if biased == EMAXF:
        if a & fracmask:
            return bits, NAN_IN
        if unsigned and negative:
            return nanb, INF_IN | INEXACT                   # fnu has no negatives, -inf too
        out = inf_out
        flags = INF_IN if out == a else INF_IN | INEXACT   # saturate / fn change an inf
    elif a == 0:
        if unsigned:
            return nanb, INEXACT                            # fnu has no zero
        return (np.int64(0) if uzero else bits), 0
    elif unsigned and negative:
        return nanb, INEXACT                                # fnu has no negatives
    else:
        if biased > 0:
            ex = biased - EB
            lsb = ex - M
            sig = (a & fracmask) | (np.int64(1) << M)
        else:
            top = 0
            while (a >> (top + 1)) != 0:
                top += 1
            lsb = CEMIN - M
            ex = lsb + top
            sig = a
        q = ex - m if ex >= emin else qsub
        s = q - lsb
        if s <= 0:
            out = a
        elif ex >= q:
            keep = a >> s
            rem = a & ((np.int64(1) << s) - 1)
            # ties to even / round to odd look at the last bit of the *format's* encoding:
            # the kept significand's last bit, or the exponent code's when m == 0
            code_lsb = (sig >> s) if (m > 0 or ex < emin) else ex + 1 - emin
            inc = 0 if rem == 0 else _increment(code_lsb, rem, s, mode, negative, r, W, k)
            out = (keep + inc) << s
        else:
            inc = _increment(np.int64(0), sig, s, mode, negative, r, W, k)
            out = tiny if inc else np.int64(0)
        flags = 0
        if out > maxb:
            flags = OVERFLOW
            out = ovf_inf if _overflows_to_inf(mode, negative) else maxb
        if out == 0 and unsigned:
            out = tiny
            flags |= UNDERFLOW
        if out != a:
            flags |= INEXACT
        if out == 0:
            flags |= UNDERFLOW
        elif out < minnorm:
            flags |= SUBNORMAL
    if out == nanb or (out == 0 and uzero):
        return out, flags
    return (out + SIGN if negative else out), flags


@register_jitable
def round_one(bits, mode, r, k, p):
    """:func:`round_bits`' (bits, flags) by :func:`round_fast` where that applies (one
    straight-line path: a GPU warp of typical data never diverges), round_bits elsewhere."""
    out, ok, inexact = round_fast(bits, mode, r, k, p)
    if ok:
        return out, inexact * INEXACT
    return round_bits(bits, mode, r, k, p)


@register_jitable
def round_one_sub(bits, mode, r, k, p):
    """:func:`round_one` with :func:`round_fast_sub` as its straight path: the format's
    subnormals too, so that a warp of data reaching them (e4m3fn's below 2**-6: about one
    element in 80 of unit-normal data, most warps of 128 elements) does not diverge."""
    out, ok, flags = round_fast_sub(bits, mode, r, k, p)
    if ok:
        return out, flags
    return round_bits(bits, mode, r, k, p)


@register_jitable(forceinline=True)
def round_one_word(bits, mode, r, k, p, sub):
    """:func:`round_one` (``sub``: :func:`round_one_sub`) of float32 container bits, its
    straight path in 32-bit words (:mod:`lpsim.word32`): GPU integer units run 64-bit
    operations as two or more instructions, so the specialised CUDA kernels round through
    this.  (bits, flags) as int64, the bits sign-extended as round_bits gives them."""
    if sub:
        out, ok, flags = round_fast_sub(word(bits), mode, word(r), k, p)
    else:
        out, ok, inexact = round_fast(word(bits), mode, word(r), k, p)
        flags = inexact * INEXACT
    if ok != 0:
        return as_signed64(out), as_int64(flags)
    return round_bits(np.int64(bits), mode, r, k, p)


@register_jitable
def tally(counts, flags):
    """The six counters (COUNTERS order) ``counts`` plus one element's ``flags``."""
    return (counts[0] + (flags & INEXACT), counts[1] + ((flags & OVERFLOW) >> 1),
            counts[2] + ((flags & UNDERFLOW) >> 2), counts[3] + ((flags & SUBNORMAL) >> 3),
            counts[4] + ((flags & NAN_IN) >> 4), counts[5] + ((flags & INF_IN) >> 5))


@register_jitable
def round_element(xb, outb, i, r, mode, k, p, sp):
    """Round element i of xb (random word r) into outb: as container bits, or packed into
    native storage when ``sp.width`` is set (:mod:`lpsim.storage`); returns its flags."""
    bits, flags = round_one(xb[i], mode, r, k, p)
    outb[i] = bits if sp[0] == 0 else pack_bits(bits, sp)
    return flags


@register_jitable
def round_block(xb, outb, block, offset, mode, k, p, seed_lo, seed_hi, stream, lanes, sp):
    """Round the elements of one Philox block (global indices block*lanes ...) of ``xb``.

    The unit of work of the GPU path for stochastic modes (one block per thread in a
    grid-stride loop); the CPU kernel in :mod:`lpsim.quantize` reaches the same decisions
    by a vectorised route.  Returns the counters (COUNTERS order) of its elements.
    """
    n = xb.size
    if mode >= STOCHASTIC:
        words = block_words(block, stream, seed_lo, seed_hi)
    else:
        words = (np.int64(0), np.int64(0), np.int64(0), np.int64(0))
    counts = (0, 0, 0, 0, 0, 0)
    for lane in range(lanes):
        i = block * lanes + lane - offset
        if i >= 0 and i < n:
            flags = round_element(xb, outb, i, lane_word(words, lane, lanes), mode, k, p, sp)
            counts = tally(counts, flags)
    return counts


@register_jitable
def block_range(n, offset, lanes):
    """(first block, number of blocks) covering global elements offset .. offset+n-1."""
    first = offset // lanes
    return first, (offset + n + lanes - 1) // lanes - first
