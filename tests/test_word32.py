"""lpsim.word32: 32-bit words in compiled code equal numpy's wrapping uint32 arithmetic."""

import operator

import numpy as np
import pytest
from numba import njit

from lpsim.word32 import as_int64, as_signed64, operand_bits, widen, word

EDGES = np.array([0, 1, 2, 0x7FFF, 0x8000, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0x80000001,
                  0xFFFFFFFE, 0xFFFFFFFF], np.uint32)


def _operands(seed=0, n=4000):
    rng = np.random.default_rng(seed)
    a = np.concatenate([np.repeat(EDGES, EDGES.size), rng.integers(0, 2**32, n, np.uint32)])
    b = np.concatenate([np.tile(EDGES, EDGES.size), rng.integers(0, 2**32, n, np.uint32)])
    return a, b


BINARY = {"add": operator.add, "sub": operator.sub, "and": operator.and_,
          "or": operator.or_, "xor": operator.xor}
COMPARE = {"lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge,
           "eq": operator.eq, "ne": operator.ne}


def _kernel(op):
    @njit
    def words(a, b, out):
        for i in range(a.size):
            out[i] = as_int64(op(word(a[i]), word(b[i])))

    @njit
    def mixed(a, b, out):   # a word meets an int64: the int's low 32 bits
        for i in range(a.size):
            out[i] = as_int64(op(word(a[i]), np.int64(b[i]) - (1 << 32)))
    return words, mixed


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_operators_wrap_like_uint32(name):
    a, b = _operands()
    expected = BINARY[name](a, b).astype(np.int64)       # numpy uint32: wraps
    for kernel in _kernel(BINARY[name]):
        out = np.empty(a.size, np.int64)
        kernel(a, b, out)
        np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("name", sorted(COMPARE))
def test_compares_are_unsigned(name):
    a, b = _operands(1)
    expected = COMPARE[name](a, b)
    out = np.empty(a.size, np.bool_)
    _compare_kernel(COMPARE[name])(a, b, out)
    np.testing.assert_array_equal(out, expected)


def _compare_kernel(op):
    @njit
    def kernel(a, b, out):
        for i in range(a.size):
            out[i] = op(word(a[i]), word(b[i]))
    return kernel


def test_shifts_are_logical_below_32():
    a, _ = _operands(2)
    shifts = np.arange(a.size, dtype=np.int64) % 32

    @njit
    def kernel(a, s, left, right):
        for i in range(a.size):
            left[i] = as_int64(word(a[i]) << s[i])
            right[i] = as_int64(word(a[i]) >> s[i])
    left, right = np.empty(a.size, np.int64), np.empty(a.size, np.int64)
    kernel(a, shifts, left, right)
    np.testing.assert_array_equal(left, (a << shifts.astype(np.uint32)).astype(np.int64))
    np.testing.assert_array_equal(right, (a >> shifts.astype(np.uint32)).astype(np.int64))


def test_unary_inplace_bool_and_unified_variables():
    a, b = _operands(3)

    @njit
    def kernel(a, b, out):
        for i in range(a.size):
            x = word(a[i])
            y = -x
            y += ~word(b[i])
            y |= x > word(b[i])              # a bool operand is 0 or 1
            z = 0                            # an int on one path, a word on the other
            if a[i] & 1:
                z = x ^ word(b[i])
            out[i] = as_int64(y) + (as_int64(z) << 32)
    out = np.empty(a.size, np.int64)
    kernel(a, b, out)
    y = (np.uint32(0) - a) + ~b
    y |= (a > b).astype(np.uint32)
    z = np.where(a & 1, a ^ b, 0).astype(np.int64)
    np.testing.assert_array_equal(out, y.astype(np.int64) + (z << 32))


def test_int64_operands_keep_int64_arithmetic():
    @njit
    def kernel(x):
        return widen(x) + (1 << 40), word(x) + (1 << 40), as_int64(x)
    assert kernel(np.int64(5)) == (5 + 2**40, 5 + 2**40, 5)
    # an int32 widens sign-extended; as a word it is 32 bits (a word returns as an int)
    assert kernel(np.int32(-1)) == (2**40 - 1, 2**32 - 1, -1)


def test_operand_bits_is_the_compiled_width():
    """32 for a word, 64 for an int64 (compiled); 64 in plain Python, where words are int64."""
    @njit
    def kernel(x):
        return operand_bits(word(x)), operand_bits(np.int64(x)), operand_bits(widen(x))
    assert kernel(np.int32(-1)) == (32, 64, 64) and kernel(np.int64(3)) == (64, 64, 64)
    assert operand_bits(word(np.int32(-1))) == 64


def test_plain_python_gives_int64():
    # outside compiled code (the CUDA simulator, a reference run) words are int64
    assert type(word(np.int32(-3))) is np.int64 and word(np.int32(-3)) == -3
    assert widen(np.uint32(7)) == 7 and as_int64(np.int32(2)) == 2


def test_as_signed64_extends_bit_31_compiled_and_in_python():
    @njit
    def kernel(a, out_word, out_int):
        for i in range(a.size):
            out_word[i] = as_signed64(word(a[i]))
            out_int[i] = as_signed64(np.int64(a[i]))
    a, _ = _operands(3)
    want = a.view(np.int32).astype(np.int64)
    out_word, out_int = np.empty(a.size, np.int64), np.empty(a.size, np.int64)
    kernel(a, out_word, out_int)
    np.testing.assert_array_equal(out_word, want)
    np.testing.assert_array_equal(out_int, want)
    python = np.array([as_signed64(np.int64(x)) for x in a[:200]])
    np.testing.assert_array_equal(python, want[:200])
    # a sign-extended int64 (a word's plain-Python form) keeps its value
    assert as_signed64(np.int64(-5)) == -5 and as_signed64(np.int64(2**31 - 1)) == 2**31 - 1
