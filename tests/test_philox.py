"""Philox4x32-10 against the Random123 known-answer vectors, on the CPU (njit) and in Python."""

import numpy as np
import pytest
from numba import njit

from lpsim.philox import block_words, philox4x32, random_words

ONES = 0xFFFFFFFF
KAT = [
    ((0, 0, 0, 0, 0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((ONES,) * 6, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
]


@njit
def _jitted(c0, c1, c2, c3, k0, k1):
    return philox4x32(c0, c1, c2, c3, k0, k1)


@pytest.mark.parametrize("inputs, expected", KAT)
def test_known_answers(inputs, expected):
    assert tuple(int(w) for w in philox4x32(*inputs)) == expected
    assert tuple(int(w) for w in _jitted(*inputs)) == expected


@njit
def _jitted_block(block, stream, seed_lo, seed_hi):
    return block_words(block, stream, seed_lo, seed_hi)


def test_block_words_give_the_known_answers_compiled_and_in_python():
    """block_words' counter and key from int64 block, stream and seed halves, all ones
    included (a block of -1 is 2**64 - 1)."""
    for block, stream, seed_lo, seed_hi, expected in ((0, 0, 0, 0, KAT[0][1]),
                                                      (-1, -1, ONES, ONES, KAT[1][1])):
        assert tuple(int(w) for w in _jitted_block(block, stream, seed_lo, seed_hi)) \
            == expected
        assert tuple(int(w) for w in block_words(block, stream, seed_lo, seed_hi)) == expected


def test_counter_layout_block_and_stream():
    # block b of stream t under seed s is philox(counter=(b lo, b hi, t lo, t hi), key=(s lo, s hi))
    b, t, s = (7 << 32) | 5, (3 << 32) | 9, (11 << 32) | 13
    assert tuple(block_words(b, t, s & ONES, s >> 32)) == tuple(philox4x32(5, 7, 9, 3, 13, 11))


def test_words_depend_only_on_index():
    whole = random_words(40, 4, seed=99, stream=2)
    assert random_words(17, 4, seed=99, stream=2, offset=23) == whole[23:]
    assert random_words(40, 4, seed=99, stream=3) != whole
    wide = random_words(10, 8, seed=99)
    assert all(0 <= r < 2 ** 62 for r in wide) and all(0 <= r < 2 ** 32 for r in whole)


def test_words_look_uniform():
    # chi-square over 16 bins of 4096 words; the threshold 45.0 (15 dof) is exceeded with
    # probability about 1e-4 by a uniform generator.
    words = np.array(random_words(4096, 4, seed=2024), dtype=np.uint64)
    counts = np.bincount((words >> np.uint64(28)).astype(np.int64), minlength=16)
    chi2 = ((counts - 256.0) ** 2 / 256.0).sum()
    assert chi2 < 45.0
