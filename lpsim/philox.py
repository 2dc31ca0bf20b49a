"""Philox4x32-10, the counter-based generator behind stochastic rounding.

Counter-based: the random words of element ``i`` are a pure function of (seed, stream, i),
so results never depend on thread count, block size, device or rank (Salmon et al., SC'11,
"Parallel random numbers: as easy as 1, 2, 3").  The same function compiles for the CPU
(numba.njit) and the GPU (numba.cuda.jit); integer arithmetic is masked to 32 bits so
numba's widening of products cannot change a word.

How words become the uniform of an element is fixed here, once, for both paths:

* float32 containers use W = 32 random bits: element ``i`` takes word ``i % 4`` of the block
  ``philox(counter=(i // 4, stream), key=seed)``.
* float64 containers use W = 62 random bits: element ``i`` takes words ``2*(i % 2)`` (high 32)
  and ``2*(i % 2) + 1`` (low 30, its top bits) of ``philox(counter=(i // 2, stream), key=seed)``.

The element's uniform is ``u = R / 2**W`` with ``R`` the W-bit integer so formed.  The 128-bit
counter is (block low 32, block high 32, stream low 32, stream high 32); the 64-bit key is the
seed (low 32, high 32).
"""

import functools

import numpy as np
from llvmlite import ir
from numba.extending import register_jitable

MASK32 = 0xFFFFFFFF
_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85

#: random bits per element, by container itemsize
WORD_BITS = {4: 32, 8: 62}
#: elements served by one Philox block, by container itemsize
LANES = {4: 4, 8: 2}


@register_jitable
def _mulhilo(a, b):
    product = np.uint64(a) * np.uint64(b)
    return np.int64(product >> np.uint64(32)), np.int64(product & np.uint64(MASK32))


@register_jitable
def philox4x32(c0, c1, c2, c3, k0, k1):
    """The four 32-bit output words of Philox4x32-10 (inputs and outputs are int64 < 2**32)."""
    for _ in range(10):
        hi0, lo0 = _mulhilo(_M0, c0)
        hi1, lo1 = _mulhilo(_M1, c2)
        c0, c1, c2, c3 = (hi1 ^ c1 ^ k0) & MASK32, lo1, (hi0 ^ c3 ^ k1) & MASK32, lo0
        k0 = (k0 + _W0) & MASK32
        k1 = (k1 + _W1) & MASK32
    return c0, c1, c2, c3


def round_keys(seed_lo: int, seed_hi: int) -> tuple:
    """The 20 round keys of a seed, (k0, k1) of rounds 0 .. 9 (the key schedule of
    :func:`philox4x32`), for :func:`block_words_keyed`.

    Why: a GPU kernel that takes them as arguments loads them once, into uniform registers;
    made from the seed in its loop they cost two adds a round (18 a block), which the
    compiler makes again each pass when registers are short.  The halves are integers in
    [0, 2**32) (:func:`split_key`'s); anything else is refused by name."""
    if type(seed_lo) is not int or type(seed_hi) is not int:
        seed_lo, seed_hi = _half("seed_lo", seed_lo), _half("seed_hi", seed_hi)
    if not (0 <= seed_lo <= MASK32 and 0 <= seed_hi <= MASK32):
        _half("seed_lo", seed_lo), _half("seed_hi", seed_hi)
    return _round_keys(seed_lo, seed_hi)


def _half(name: str, value) -> int:
    """A 32-bit seed half as an int, or the error naming it."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}={value!r} must be an integer in [0, 2**32)")
    if not 0 <= value <= MASK32:
        raise ValueError(f"{name}={value} is out of range; accepted: 0 <= {name} < 2**32")
    return int(value)


@functools.lru_cache(maxsize=256)
def _round_keys(k0: int, k1: int) -> tuple:
    keys = []
    for _ in range(10):
        keys += (k0, k1)
        k0, k1 = (k0 + _W0) & MASK32, (k1 + _W1) & MASK32
    return tuple(keys)


@register_jitable
def philox4x32_keyed(c0, c1, c2, c3, ks):
    """:func:`philox4x32` with its round keys given (:func:`round_keys`): the same words."""
    for r in range(10):
        hi0, lo0 = _mulhilo(_M0, c0)
        hi1, lo1 = _mulhilo(_M1, c2)
        c0, c1, c2, c3 = ((hi1 ^ c1 ^ ks[2 * r]) & MASK32, lo1,
                          (hi0 ^ c3 ^ ks[2 * r + 1]) & MASK32, lo0)
    return c0, c1, c2, c3


def philox4x32_ir(builder, counter, key, mulhi=None, keys=None):
    """:func:`philox4x32` as LLVM IR in 32-bit integers: ``counter`` (four) and ``key`` (two)
    are i64 values below 2**32, the result four such i64 values.  ``mulhi(builder, a, b)``
    makes the high word of the product of two i32 values (None: through an i64 product).

    Why: the Python source computes in 64-bit integers masked to 32 bits, which NVVM keeps
    64-bit (``mul.lo.s64``, as it does an i64 product of two zero-extended words), so ptxas
    adds each product's zero high half and carries the key schedule in 64-bit registers:
    83 SASS instructions a block against 67 from this form with NVVM's ``mulhi``
    (sm_90).  lpsim_cuda compiles it in place of the Python body (:mod:`lpsim_cuda.philox`);
    the tests compile it for the CPU and compare the words.  ``keys``: the 20 round keys as
    i64 values (:func:`philox4x32_keyed`'s), in place of ``key`` and its schedule.
    """
    i32, i64 = ir.IntType(32), ir.IntType(64)
    c = [builder.trunc(x, i32) for x in counter]
    if keys is not None:
        keys = [builder.trunc(x, i32) for x in keys]
        k0, k1 = keys[0], keys[1]
    else:
        k0, k1 = (builder.trunc(x, i32) for x in key)
    if mulhi is None:
        def mulhi(builder, a, b):
            product = builder.mul(builder.zext(a, i64), builder.zext(b, i64))
            return builder.trunc(builder.lshr(product, ir.Constant(i64, 32)), i32)
    m0, m1 = ir.Constant(i32, _M0), ir.Constant(i32, _M1)
    for r in range(10):
        hi0, lo0 = mulhi(builder, c[0], m0), builder.mul(c[0], m0)
        hi1, lo1 = mulhi(builder, c[2], m1), builder.mul(c[2], m1)
        c = [builder.xor(builder.xor(hi1, c[1]), k0), lo1,
             builder.xor(builder.xor(hi0, c[3]), k1), lo0]
        if r < 9 and keys is not None:
            k0, k1 = keys[2 * r + 2], keys[2 * r + 3]
        elif r < 9:
            k0 = builder.add(k0, ir.Constant(i32, _W0))
            k1 = builder.add(k1, ir.Constant(i32, _W1))
    return [builder.zext(x, i64) for x in c]


@register_jitable
def block_words(block, stream, seed_lo, seed_hi):
    """Philox output for element block ``block`` (int64) of stream ``stream``."""
    return philox4x32(block & MASK32, (block >> 32) & MASK32, stream & MASK32,
                      (stream >> 32) & MASK32, seed_lo, seed_hi)


@register_jitable
def block_words_keyed(block, stream, ks):
    """:func:`block_words` with the seed's round keys given (:func:`round_keys`)."""
    return philox4x32_keyed(block & MASK32, (block >> 32) & MASK32, stream & MASK32,
                            (stream >> 32) & MASK32, ks)


@register_jitable
def lane_word(words, lane, lanes):
    """The W-bit random integer R of lane ``lane`` of a block (see the module docstring)."""
    w0, w1, w2, w3 = words
    if lanes == 4:
        if lane == 0:
            return w0
        if lane == 1:
            return w1
        if lane == 2:
            return w2
        return w3
    if lane == 0:
        return (w0 << 30) | (w1 >> 2)
    return (w2 << 30) | (w3 >> 2)


def split_key(value: int, name: str) -> tuple[int, int]:
    """(low 32, high 32) of a 64-bit seed or stream, with a clear error for bad values."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}={value!r} must be an integer in [0, 2**64)")
    value = int(value)
    if not 0 <= value < 2 ** 64:
        raise ValueError(f"{name}={value} is out of range; accepted: 0 <= {name} < 2**64")
    return value & MASK32, value >> 32


def random_words(n: int, itemsize: int, seed: int, stream: int = 0, offset: int = 0):
    """The integers R (W bits) that elements offset .. offset+n-1 draw; W = WORD_BITS[itemsize].

    Pure Python on purpose: it is the readable statement of the mapping, used by tests and
    by the exact reference to reproduce the kernels' stochastic decisions.
    """
    seed_lo, seed_hi = split_key(seed, "seed")
    lanes = LANES[itemsize]
    out = []
    words, block = None, None
    for i in range(offset, offset + n):
        if i // lanes != block:                 # one Philox block serves `lanes` elements
            block = i // lanes
            words = tuple(int(w) for w in block_words(block, stream, seed_lo, seed_hi))
        out.append(int(lane_word(words, i % lanes, lanes)))
    return out
