"""One optimizer step of one element: the scalar core that the CPU and CUDA kernels share.

Every function here is ``register_jitable``: numba compiles it into the fused CPU kernel
(:mod:`lpsim.optim.cpu`) and into the CUDA kernel (:mod:`lpsim_cuda.optim`), so the two paths
run one decision.  The reference (:mod:`lpsim.optim.reference`) writes the same lines with
torch ops and :func:`lpsim.quantize`, and tests assert the three agree bit for bit.

Working precision.  The update is computed in IEEE float32, one correctly rounded operation
per line of the papers' algorithms (BF16 paper Appendix B, Algorithms 2-5; SR paper
Algorithm 1); weight decay is part of the update ``u`` and is rounded with it.  The final
``w - u`` (or ``w + y`` for Kahan) is formed in float64, where it is exact unless ``|u|`` is
below ``2**-29 |w|``, and rounded once to the weight format (``lpsim.rounding``): nearest or
stochastic, so small updates are not lost to an intermediate float32 rounding.

NaNs.  Every NaN a step stores (weight, state, compensation, remainder) is the quiet NaN
0x7FC00000 (bfloat16 0x7FC0, float16 lpsim.storage's NaN code): which NaN an operation
returns differs between CPUs (the first operand's, sign flips or not), GPUs (one canonical
NaN) and torch's casts (0xFFFF or 0x7FC0), and the stored bits must not (:func:`quiet_nan`).

Products go through :func:`fmul` so that the CUDA build can make them ``fmul_rn``: numba.cuda
would otherwise contract ``a*b + c`` into an FMA and round differently from the CPU.
"""

from __future__ import annotations

import math

import numpy as np
from numba.extending import register_jitable

from lpsim.ops.mma import fma32 as fma32_exact
from lpsim.philox import block_words, lane_word
from lpsim.rounding import NEAREST, STOCHASTIC, round_fast, round_one
from lpsim.storage import FLOAT16_CODES, code_bits, pack_bits
from lpsim.word32 import bits_float32, float32_bits, like, word

#: update_rounding names -> codes
UPDATES = {"nearest": 0, "stochastic": 1, "kahan": 2, "remainder": 3}
NEAREST_UPDATE, STOCHASTIC_UPDATE, KAHAN, REMAINDER = range(4)
#: how a tensor is stored: float32 bits (int32 view), bfloat16 or float16 codes (int16 view)
STORE_F32, STORE_BF16, STORE_F16 = 0, 1, 2
#: algorithms
ADAMW, SGD = 0, 1
#: counters a kernel returns: lpsim.stats.COUNTERS of the weight rounding, then cancelled
#: updates (u != 0 but the weight did not change)
NCOUNTS = 7


@register_jitable
def fmul(a, b):
    """A product that is never fused with a following add (see the module docstring)."""
    return a * b


@register_jitable
def as_f32(bits):
    return np.int32(bits).view(np.float32)


@register_jitable
def bits_f32(x):
    return np.int64(np.float32(x).view(np.int32))


@register_jitable
def as_f64(bits):
    return np.int64(bits).view(np.float64)


@register_jitable
def bits_f64(x):
    return np.float64(x).view(np.int64)


#: the NaN a step stores, as float32 container bits
QUIET_NAN = 0x7FC00000


@register_jitable
def quiet_nan(bits):
    """float32 container bits (int64 or a 32-bit word) with a NaN made QUIET_NAN.  Branch-free
    and in integers: a float select would let LLVM fold it away (it treats NaNs as equal)."""
    nan = -like(bits, (bits & 0x7FFFFFFF) > 0x7F800000)        # all ones for a NaN
    return (bits & ~nan) | (QUIET_NAN & nan)


@register_jitable
def load(code, kind):
    """float32 container bits (signed, int64) of a stored element."""
    if kind == STORE_BF16:
        return np.int64(code) << 16
    if kind == STORE_F16:
        return np.int64(code_bits(code, FLOAT16_CODES))
    return np.int64(code)


@register_jitable
def store(bits, kind, sp16, rounded=False):
    """The stored code of float32 container bits already rounded to the storage's format
    (a NaN: QUIET_NAN's).  ``rounded``: the bits come from a straight-path rounding that
    declines NaN (the caller stores them only where it did not decline), so no NaN is
    looked for."""
    bits = np.int64(bits) if rounded else quiet_nan(np.int64(bits))
    if kind == STORE_BF16:
        return np.int64(bits) >> 16
    if kind == STORE_F16:
        return pack_bits(bits, sp16)
    return np.int64(bits)


@register_jitable
def round32(x, mode, r, k, p, fast):
    """(x rounded to the format of ``p``, ok, flags); x float32, ``p`` float32-container params.

    fast: :func:`lpsim.rounding.round_fast` on 32-bit words (branch-free, so loops over it
    vectorise; flags is then just INEXACT, and the result is valid only where ok = 1); else
    every case
    (:func:`lpsim.rounding.round_one`: round_fast, round_bits where it declines).
    mode < 0: no rounding (the format is float32 itself, see lpsim.optim.setup).
    """
    if mode < 0:                                # the container's own format: exact
        return x, np.int64(1), np.int64(0)
    if fast:                                    # in 32-bit words (lpsim.word32)
        bits, ok, inexact = round_fast(float32_bits(x), mode, word(r), k, p)
        return bits_float32(bits), np.int64(ok), np.int64(inexact)
    bits, flags = round_one(bits_f32(x), mode, r, k, p)
    return as_f32(bits), np.int64(1), np.int64(flags)


@register_jitable
def round64(x, mode, r, k, p, fast):
    """As :func:`round32` for a float64 x and float64-container params."""
    if fast and float64_applies(mode, k, p):
        return by_float64(x, mode, r, p)
    if fast:
        bits, ok, inexact = round_fast(bits_f64(x), mode, r, k, p)
        return as_f64(bits), ok, inexact
    bits, flags = round_one(bits_f64(x), mode, r, k, p)
    return as_f64(bits), np.int64(1), np.int64(flags)


@register_jitable
def by_float64(x, mode, r, p):
    """round_fast(x, mode, r, 32, p) of a float64 x, to nearest or stochastically with a full
    32-bit word, for a format with m < 20 (the optimizers' weight update, Kahan's sum and
    compensation), by float64 arithmetic: (x rounded, ok, inexact).  A GPU issues it on its
    float64 pipe, where the integer form took ~14 instructions of the integer pipe, which
    bounds the optimizer's step.

    q is the format's quantum at x, 2**s of x's last bits (s = 52 - m).  To nearest: x + c
    with c = 2**52 q (x's sign) lies in c's binade, whose spacing is q, so the sum rounds x
    to the quantum, ties to the even multiple (c / q is even), and subtracting c is exact.
    Stochastic: with ``rem`` = |x| mod q in last bits, full-width SR rounds up iff R <
    ceil(rem / 2**(s - 32)), that is iff rem > R 2**(s - 32); adding q - R q / 2**32 - (x's
    last bit) to |x| (two float64 sums of exact products, x's sign on each) and truncating
    to the quantum carries exactly then, and every sum is exact: a multiple of x's last bit
    below the next binade, or past its start, where the exact sum truncates to that start
    too.  ok: round_fast's (x normal in the format, below its top binade)."""
    s = 52 - p.m
    bits = bits_f64(x)
    binade = as_f64(bits & -(np.int64(1) << 52))       # x's sign and power of two, exactly
    if mode == NEAREST:
        c = binade * 2.0 ** (52 - p.m)
        out = (x + c) - c
    else:
        unit = binade * 2.0 ** -(32 + p.m)             # q / 2**32
        # 2**32 - 1 - R as a float64: the float64 2**52 + (~R), less 2**52
        rest = as_f64((np.int64(0x43300000) << 32) | (~r & 0xFFFFFFFF)) - 2.0 ** 52
        t = x + unit * (1 - 2.0 ** (32 - s))
        t = t + rest * unit
        out = as_f64(bits_f64(t) & -(np.int64(1) << s))
    a = abs(x)
    ok = (a >= as_f64(np.int64(p.fast_lo) << 52)) & (a < as_f64(np.int64(p.fast_hi + 1) << 52))
    # inexact: the rounding moved x (a value on the grid stays, both ways; compared as
    # float64s, off the integer pipe)
    return out, np.int64(ok), np.int64(ok & (out != x))


@register_jitable
def sr_by_float32(x, r, p):
    """round_fast(x, STOCHASTIC, r, 32, p) of a float32 x for a format with m < 23 (AdamW's
    stochastically rounded moments on the GPU), by float32 arithmetic: (x rounded, ok).

    With s = 23 - m discarded bits and ``rem`` their value, full-width SR rounds up iff R <
    rem 2**(32 - s), that is iff rem > R's top s bits; adding (2**s - 1 - those bits) last
    bits of x to |x| (one FMA of an exact product, x's sign on it) and truncating to the
    quantum carries exactly then, every sum exact as in :func:`by_float64`.  The count is
    made a float32 as 2**23 + it, less 2**23.  ok: round_fast's."""
    s = 23 - p.m
    bits = float32_bits(x)
    # x's last bit with its sign: its sign and exponent bits, scaled
    last = bits_float32(bits & 0xFF800000) * np.float32(2.0 ** -23)
    count = bits_float32(word(0x4B000000) | (word(~r & 0xFFFFFFFF) >> (32 - s))) \
        - np.float32(2.0 ** 23)
    t = fma32(count, last, x)           # the product is exact: fused or not, one rounding
    a = abs(x)
    ok = ((a >= bits_float32(word(p.fast_lo << 23)))
          & (a < bits_float32(word((p.fast_hi + 1) << 23))))
    return bits_float32(float32_bits(t) & (0xFFFFFFFF ^ ((1 << s) - 1))), np.int64(ok)


@register_jitable
def float64_applies(mode, k, p) -> bool:
    """Whether :func:`by_float64` makes round_fast's decisions (a constant in compiled
    code)."""
    return ((mode == NEAREST or (mode == STOCHASTIC and k == 32 and p.W == 32))
            and p.M == 52 and p.m < 20)


@register_jitable
def round_moments(m, v, mode, rm, rv, k, p):
    """(m, v rounded to the state format, ok): AdamW's moments on the straight path, which
    divides each by its bias correction next.  divide_by declines a dividend that is zero,
    NaN, inf or below 2**-96, or whose quotient passes 2**120 (a bias correction is at most
    1), so a rounding that is right for every float32 normal needs no range check of its
    own: the GPU build rounds bfloat16 moments to nearest by one conversion instruction for
    the two, stochastically by :func:`sr_by_float32` (lpsim_cuda.optim), with ok 1.  Here:
    :func:`round32`'s straight path."""
    m, okm, _ = round32(m, mode, rm, k, p, True)
    v, okv, _ = round32(v, mode, rv, k, p, True)
    return m, v, okm & okv


@register_jitable
def split_remainder(bits):
    """(bfloat16 code, int16 remainder) holding float32 bits exactly (TransformerEngine's
    ``store_param_remainders``): the code is the top half rounded half away from zero, the
    remainder the low half as a signed integer, so join_remainder undoes it.  Branch-free."""
    u = np.int64(bits) & 0xFFFFFFFF
    lo = u & 0xFFFF
    up = lo >> 15
    hi = ((u >> 16) + up) & 0xFFFF
    return hi - ((hi >> 15) << 16), lo - (up << 16)


@register_jitable
def join_remainder(code, rem):
    """float32 container bits of a (bfloat16 code, int16 remainder) pair.  Branch-free."""
    rem = np.int64(rem)
    hi = ((np.int64(code) & 0xFFFF) - ((rem >> 63) & 1)) & 0xFFFF
    u = (hi << 16) | (rem & 0xFFFF)
    return u - ((u >> 31) << 32)


@register_jitable
def adamw_moments(g, m, v, hp):
    """The moments before rounding: b1 m + (1 - b1) g and b2 v + (1 - b2) g g."""
    return fmul(hp[2], m) + fmul(hp[3], g), fmul(hp[4], v) + fmul(hp[5], fmul(g, g))


@register_jitable
def fma32(a, b, c):
    """a * b + c of float32 values rounded once to float32 (an FFMA), for :func:`divide_by`;
    the CUDA build makes it libdevice's fmaf."""
    return fma32_exact(np.float64(a), np.float64(b), np.float64(c))


#: bounds of :func:`divide_by`'s exact route (the smallest dividend also
#: :func:`verified_quotient`'s)
_TINY_DIVIDEND, _HUGE_QUOTIENT = np.float32(2.0 ** -96), np.float32(2.0 ** 120)


@register_jitable
def divide_by(a, c, y, zeros=True):
    """(a / c, ok): a float32 ``a`` over a divisor ``c`` in (0, 1] by its reciprocal ``y`` =
    fl32(1 / c), which the host gives (hp), in one product and two FMAs: q = fl(a y), the
    remainder r = a - q c is exact (one FMA), and fl(q + r y) is a / c correctly rounded
    (Markstein's theorem: y correctly rounded, q within an ulp); q itself where r is 0, which
    keeps a zero's sign.  ``ok`` is 0 where the remainder could leave float32's normal range
    or the quotient overflow (a NaN, inf, 0 < |a| < 2**-96, |q| > 2**120): the caller takes
    the IEEE division there.  The wide CUDA step's division by the bias corrections: IEEE
    division there is a reciprocal, a check and a call (a division is ~16 instructions).
    ``zeros`` (a constant): False declines a zero too, and fl(q + r y) is then the quotient
    wherever ok is 1 (r is +0 where it is exact, and q + 0 is q), so neither the test for a
    zero nor the choice of q is made: for a dividend that a straight-path rounding, which
    declines zeros itself, has just made."""
    q = fmul(a, y)
    r = fma32(-q, c, a)
    q1 = fma32(r, y, q)
    ok = (abs(a) >= _TINY_DIVIDEND) & (abs(q) <= _HUGE_QUOTIENT)
    if zeros:
        return q if r == 0 else q1, (a == 0) | ok
    return q1, ok


@register_jitable
def verified_quotient(a, d, y):
    """(a / d, ok) for float32 ``a`` with |a| >= 2**-96 (what :func:`divide_by` takes) from
    ``y``, any approximation of 1 / d: q = a y + (a - a y d) y (one correction), and ok =
    :func:`is_nearest_quotient`, so the quotient is the IEEE one wherever ok is 1.  From y
    within an ulp of 1 / d (``rcp.approx``) it declines a few quotients in a million.  The
    GPU's step divides a moment by its root so (lpsim_cuda.optim): IEEE division's slow path
    is a call, and around it the compiler saved and restored the step's predicates in
    integer instructions."""
    q0 = fmul(a, y)
    q = fma32(fma32(-q0, d, a), y, q0)
    return q, np.int64(is_nearest_quotient(a, d, q))


@register_jitable
def is_nearest_quotient(a, d, q):
    """Whether float32 ``q`` is a / d correctly rounded, proved for |a| >= 2**-96 (False
    where it cannot prove it).

    With r = fl(a - q d) (one FMA) and h half the gap from |q| to its nearer neighbour (a
    power of two from q's exponent: the lower gap's at a power of two), |r| < h d implies
    |a - q d| < h d, as rounding is monotone and h d is a float32 (a normal: where |a - q d|
    is that small, q d is near a and h d >= 2**-122), so |a / d - q| < h: q is the nearest
    float32, and not a tie.  False where |q| < 2**-100 (h would leave the normals, or q is
    zero), where d <= 0 and where anything is NaN."""
    r = fma32(-q, d, a)
    # h: half an ulp of the binade of |q|'s last code below (a quarter ulp at a power of 2)
    h = bits_float32((float32_bits(q) - 1) & 0x7F800000) * np.float32(2.0 ** -24)
    return (abs(r) < fmul(h, d)) & (abs(q) >= np.float32(2.0 ** -100))


@register_jitable
def decoupled_decay(d, w):
    """(lr wd) w, the decay term of AdamW's u; 0 for an infinite weight while lr wd < 1:
    torch.optim.AdamW scales the weight by 1 - lr wd (none at wd 0), which keeps it
    infinite, where 0 inf or inf - inf would make it NaN.  A select, not a branch."""
    return np.float32(0) if (abs(w) == np.inf) & (d < 1) else fmul(d, w)


@register_jitable(error_model="numpy")
def adamw_scaled(mh, vh, w, hp):
    """u = lr mh / (sqrt(vh) + eps) + (lr wd) w from the bias-corrected moments.

    IEEE division (x / 0 is inf or nan, as in torch, not an exception) and math.sqrt (on
    float32, correctly rounded like np.sqrt, and a loop over it vectorises).
    """
    return fmul(hp[0], mh / (np.float32(math.sqrt(vh)) + hp[8])) + decoupled_decay(hp[1], w)


@register_jitable(error_model="numpy")
def adam_ratio(mh, vh, eps):
    """(mh / (sqrt(vh) + eps), ok) on the straight path: the IEEE operations of
    :func:`adamw_scaled`, ok 1.  mh and vh are quotients :func:`divide_by` took wherever
    the step stays on the straight path (2**-96 <= |mh|, 2**-96 <= vh <= 2**120), and the
    GPU build relies on it: it computes them without a branch (lpsim_cuda.optim: the square
    root's fast path and a quotient it proves correctly rounded), with ok 0 where it cannot
    prove it; the IEEE operations' slow paths are calls, and around them the compiler saved
    and restored the step's predicates."""
    return mh / (np.float32(math.sqrt(vh)) + eps), np.int64(1)


@register_jitable(error_model="numpy")
def adamw_update(m, v, w, hp):
    """u = lr (m / c1) / (sqrt(v / c2) + eps) + (lr wd) w, from the rounded moments (IEEE
    divisions: :func:`adamw_scaled`)."""
    return adamw_scaled(m / hp[6], v / hp[7], w, hp)


@register_jitable
def adamw_direction(g, w, m, v, hp, smode, sk, rm, rv, ps, fast):
    """(u, m, v, ok): AdamW's new moments (rounded to the state format) and its update u.

    BF16 paper Algorithm 4 lines 5-11 (SR paper Algorithm 1 lines 5-10), with decoupled weight
    decay inside u so that it is rounded with the update::

        m = Q_s(b1 m + (1 - b1) g);  v = Q_s(b2 v + (1 - b2) g g)
        u = lr (m / c1) / (sqrt(v / c2) + eps) + (lr wd) w,   c_i = 1 - b_i**t

    hp = (lr, lr*wd, b1, 1-b1, b2, 1-b2, c1, c2, eps, wd, momentum, 1-dampening, 1/c1, 1/c2),
    float32.  fast: m / c1 and v / c2 by :func:`divide_by` (the same quotients; ok 0 where
    it declines).
    """
    m, v = adamw_moments(g, m, v, hp)
    if fast:
        m, v, ok = round_moments(m, v, smode, rm, rv, sk, ps)
        # a rounded moment (smode >= 0) is declined by divide_by where it is zero
        mh, ok1 = divide_by(m, hp[6], hp[12], smode < 0)
        vh, ok2 = divide_by(v, hp[7], hp[13], smode < 0)
        ratio, ok3 = adam_ratio(mh, vh, hp[8])
        # the plain product (lr wd) w: an infinite weight makes w - u NaN, which the
        # straight path declines (decoupled_decay decides on the general path)
        u = fmul(hp[0], ratio) + fmul(hp[1], w)
        return u, m, v, ok & np.int64(ok1 & ok2 & ok3)
    m, okm, _ = round32(m, smode, rm, sk, ps, False)
    v, okv, _ = round32(v, smode, rv, sk, ps, False)
    return adamw_update(m, v, w, hp), m, v, okm & okv


@register_jitable
def sgd_gradient(g, w, hp):
    """g + wd w (coupled weight decay); g itself at wd 0, as torch.optim.SGD (0 inf would
    make an infinite weight NaN).  wd is the same for every element: a uniform select."""
    return g + fmul(hp[9], w) if hp[9] != 0 else g


@register_jitable
def sgd_buffer(g, buf, hp, first):
    """The momentum buffer before rounding: g on the first step, else mu buf + (1 - damp) g."""
    return g if first else fmul(hp[10], buf) + fmul(hp[11], g)


@register_jitable
def sgd_update(g, buf, hp, nesterov):
    """u = lr (g + mu buf) with Nesterov, else lr buf (momentum) or lr g (none)."""
    if hp[10] == 0:
        return fmul(hp[0], g)
    return fmul(hp[0], g + fmul(hp[10], buf) if nesterov else buf)


@register_jitable
def sgd_direction(g, w, buf, hp, nesterov, first, smode, sk, rb, ps, fast):
    """(u, buf, ok): SGD's update u and momentum buffer (torch.optim.SGD's rules).

    BF16 paper Algorithm 2 lines 3-5 with torch's dampening and Nesterov::

        g = g + wd w;  buf = g (first step) or Q_s(mu buf + (1 - dampening) g)
        u = lr (g + mu buf if nesterov else buf)       (u = lr g without momentum)
    """
    g = sgd_gradient(g, w, hp)
    ok = np.int64(1)
    if hp[10] != 0:
        buf, ok, _ = round32(sgd_buffer(g, buf, hp, first), smode, rb, sk, ps, fast)
    return sgd_update(g, buf, hp, nesterov), buf, ok


@register_jitable
def kahan_y(u, c):
    """The compensated update y = -u - c (BF16 paper Algorithm 5 lines 12-13)."""
    return -u - c


@register_jitable
def kahan_comp(w2, w, y):
    """The new compensation before rounding, (s - w) - y, exact in float64."""
    return (w2 - np.float64(w)) - np.float64(y)


@register_jitable
def apply_update(wb, u, c, rem, update, wmode, wk, rw, pw, pc, fast):
    """Apply the update u to the weight with float32 bits wb;
    (wb, c, rem, flags, cancelled, ok).

    nearest / stochastic: w = Q_w(w - u) (SR paper Algorithm 1 line 10, BF16 paper Algorithms
    2 and 4).  kahan (BF16 paper Algorithms 3 and 5, compensation c in the state format):
    y = -u - c; s = Q_w(w + y) nearest; c = Q_c((s - w) - y); w = s.  remainder: the float32
    master held by the bfloat16 code and the int16 remainder gets w32 = fl32(w32 - u).
    ``pw``: params of the format the weight (or, for remainder, the float32 master) is rounded
    to, in a float64 container; ``pc``: the compensation format's, float64 container.
    """
    w = as_f32(wb)
    if update == REMAINDER:
        master = join_remainder(wb >> 16, rem)
        s, ok, flags = round64(np.float64(as_f32(master)) - np.float64(u), NEAREST, 0, wk, pw,
                               fast)
        new = bits_f32(np.float32(s))                       # exact: s is a float32 value
        new = new if fast else quiet_nan(new)               # fast: not stored unless ok
        code, rem = split_remainder(new)
        return code << 16, c, rem, flags, (u != 0) & (new == master), ok
    if update == KAHAN:
        y = kahan_y(u, c)
        w2, ok, flags = round64(np.float64(w) + np.float64(y), NEAREST, 0, wk, pw, fast)
        cc, okc, _ = round64(kahan_comp(w2, w, y), NEAREST, 0, wk, pc, fast)
        c = np.float32(cc)
        ok &= okc
    else:
        w2, ok, flags = round64(np.float64(w) - np.float64(u), wmode, rw, wk, pw, fast)
    new = bits_f32(np.float32(w2))
    if fast:        # not stored unless ok, and then w2 is a normal: its bits are w's iff
        # its value is (compared as float64s, off a GPU's integer pipe)
        return new, c, rem, flags, (u != 0) & (w2 == np.float64(w)), ok
    # both are float32 bits sign-extended: their low words decide (a 32-bit compare)
    new = quiet_nan(new)
    return new, c, rem, flags, (u != 0) & (np.int32(new) == np.int32(wb)), ok


@register_jitable
def step_codes(wc, gc, mc, vc, cc, rc, rw, rm, rv, kinds, hp, ints, pw, pc, ps, sp16, fast):
    """One element's step from its stored codes (weight, gradient, moments, compensation,
    remainder) and random words (weight, first and second moment): the codes to store, the
    weight rounding's flags, whether the update was cancelled, and ok.

    fast=False: every case (round_one), ok = 1.  fast=True: the straight path
    (round_fast: flags is INEXACT alone), valid only where ok = 1; a GPU kernel runs it on
    four elements at once and takes the quad through the general path where a lane declines.
    Codes of tensors a configuration lacks are ignored (pass 0) and come back unchanged.
    """
    wkind, gkind, skind = kinds
    algo, update, wmode, wk, smode, sk, nesterov, first = ints
    wbits = load(wc, wkind)
    w = as_f32(wbits)
    g = as_f32(load(gc, gkind))
    hasm = algo == ADAMW or hp[10] != 0         # SGD without momentum has no buffer
    m = as_f32(load(mc, skind)) if hasm else np.float32(0)
    c = as_f32(load(cc, skind)) if update == KAHAN else np.float32(0)
    rem = np.int64(rc) if update == REMAINDER else np.int64(0)
    if algo == ADAMW:
        u, m, v, ok = adamw_direction(g, w, m, as_f32(load(vc, skind)), hp, smode, sk, rm, rv,
                                      ps, fast)
        vc = store(bits_f32(v), skind, sp16, fast and smode >= 0)
    else:
        u, m, ok = sgd_direction(g, w, m, hp, nesterov, first, smode, sk, rm, ps, fast)
    if hasm:
        mc = store(bits_f32(m), skind, sp16, fast and smode >= 0)
    nb, c, rem, flags, cancelled, oku = apply_update(wbits, u, c, rem, update, wmode, wk, rw,
                                                     pw, pc, fast)
    if update == KAHAN:
        cc = store(bits_f32(c), skind, sp16, fast)
    elif update == REMAINDER:
        rc = rem
    return (store(nb, wkind, sp16, fast), mc, vc, cc, rc, flags, np.int64(cancelled),
            np.int64(ok & oku))


@register_jitable
def step_element(i, rw, rm, rv, wb, gb, mb, vb, cb, rb, kinds, hp, ints, pw, pc, ps, sp16,
                 counts):
    """Step local element i given its random words (weight, first and second moment);
    every case (round_one), counters added to ``counts``."""
    algo, update = ints[0], ints[1]
    hasm = algo == ADAMW or hp[10] != 0
    zero = np.int64(0)
    wc, mc, vc, cc, rc, flags, cancelled, _ = step_codes(
        wb[i], gb[i], mb[i] if hasm else zero, vb[i] if algo == ADAMW else zero,
        cb[i] if update == KAHAN else zero, rb[i] if update == REMAINDER else zero,
        rw, rm, rv, kinds, hp, ints, pw, pc, ps, sp16, False)
    wb[i] = wc
    if hasm:
        mb[i] = mc
    if algo == ADAMW:
        vb[i] = vc
    if update == KAHAN:
        cb[i] = cc
    elif update == REMAINDER:
        rb[i] = rc
    for f in range(6):
        counts[f] += (flags >> f) & 1
    counts[6] += cancelled


@register_jitable
def step_quad(q, n, offset, wb, gb, mb, vb, cb, rb, kinds, hp, ints, keys, pw, pc, ps, sp16,
              counts):
    """Step the elements of global indices 4q .. 4q+3 that lie in this (local) tensor.

    The unit of work of both kernels.  Element i (global) of the tensor (``offset`` is the
    global index of its local element 0) draws its 32-bit words from lane i % 4 of Philox
    block i // 4 of streams keys[2] (the weight update), keys[3] (first moment / momentum)
    and keys[4] (second moment), key (keys[0], keys[1]) = the seed: see
    :mod:`lpsim.optim.keys`.
    kinds = (weight, grad, state) storage; ints = (algorithm, update, weight mode, weight
    sr bits, state mode, state sr bits, nesterov, first step).
    """
    algo, wmode, smode = ints[0], ints[2], ints[4]
    seed_lo, seed_hi, stream_w, stream_m, stream_v = keys
    zero = np.int64(0)
    w0 = w1 = w2 = w3 = zero
    if wmode == STOCHASTIC:
        w0, w1, w2, w3 = block_words(q, stream_w, seed_lo, seed_hi)
    m0 = m1 = m2 = m3 = v0 = v1 = v2 = v3 = zero
    if smode == STOCHASTIC:
        m0, m1, m2, m3 = block_words(q, stream_m, seed_lo, seed_hi)
        if algo == ADAMW:
            v0, v1, v2, v3 = block_words(q, stream_v, seed_lo, seed_hi)
    for lane in range(4):
        i = 4 * q + lane - offset
        if i < 0 or i >= n:
            continue
        step_element(i, lane_word((w0, w1, w2, w3), lane, 4), lane_word((m0, m1, m2, m3), lane, 4),
                     lane_word((v0, v1, v2, v3), lane, 4), wb, gb, mb, vb, cb, rb, kinds, hp,
                     ints, pw, pc, ps, sp16, counts)
