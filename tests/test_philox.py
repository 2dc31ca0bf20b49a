"""Philox4x32-10 against the Random123 known-answer vectors, on the CPU (njit) and in Python."""

import numpy as np
import pytest
from numba import njit, types
from numba.extending import intrinsic

from lpsim.philox import (block_words, block_words_keyed, philox4x32, philox4x32_ir,
                          random_words, round_keys)

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


@intrinsic
def _philox_ir(typingctx, c0, c1, c2, c3, k0, k1):
    """philox4x32_ir compiled for the CPU (its generic high product)."""
    def codegen(context, builder, signature, args):
        return context.make_tuple(builder, signature.return_type,
                                  philox4x32_ir(builder, args[:4], args[4:]))
    return types.UniTuple(types.int64, 4)(c0, c1, c2, c3, k0, k1), codegen


@njit
def _ir_words(inputs, out):
    for i in range(inputs.shape[0]):
        c0, c1, c2, c3, k0, k1 = inputs[i]
        out[i] = _philox_ir(c0, c1, c2, c3, k0, k1)
        out[i + inputs.shape[0]] = philox4x32(c0, c1, c2, c3, k0, k1)


def test_philox_ir_gives_the_python_words():
    """The 32-bit IR form that lpsim_cuda compiles (lpsim_cuda.philox) equals philox4x32 on
    the known answers, on words with the top bit set and on 20000 random inputs."""
    rng = np.random.default_rng(7)
    inputs = np.concatenate([np.array([k[0] for k in KAT], np.int64),
                             np.array([[ONES, 0, 0x80000000, 1, ONES, 0x80000001]], np.int64),
                             rng.integers(0, 2 ** 32, (20000, 6), dtype=np.int64)])
    out = np.zeros((2 * len(inputs), 4), np.int64)
    _ir_words(inputs, out)
    assert [tuple(out[i]) for i in range(len(KAT))] == [k[1] for k in KAT]
    assert np.array_equal(out[:len(inputs)], out[len(inputs):])


@intrinsic
def _philox_keyed_ir(typingctx, c0, c1, c2, c3, ks):
    """philox4x32_ir with the round keys given, compiled for the CPU."""
    def codegen(context, builder, signature, args):
        keys = [builder.extract_value(args[4], i) for i in range(20)]
        return context.make_tuple(builder, signature.return_type,
                                  philox4x32_ir(builder, args[:4], None, keys=keys))
    return types.UniTuple(types.int64, 4)(c0, c1, c2, c3, ks), codegen


@njit
def _keyed_words(blocks, streams, ks, out):
    for i in range(blocks.shape[0]):
        b, t = blocks[i], streams[i]
        out[i] = block_words_keyed(b, t, ks)
        out[i + blocks.shape[0]] = _philox_keyed_ir(b & ONES, (b >> 32) & ONES, t & ONES,
                                                     (t >> 32) & ONES, ks)


def test_words_from_round_keys_equal_the_seeds():
    """block_words_keyed with round_keys(seed) gives block_words' words, in Python, compiled
    and through the 32-bit IR form the GPU compiles: known answers, the all-ones corner and
    random blocks, streams and seeds (a key schedule off by one round fails every word)."""
    rng = np.random.default_rng(11)
    for seed_lo, seed_hi in ((0, 0), (ONES, ONES), *rng.integers(0, 2 ** 32, (4, 2))):
        ks = round_keys(seed_lo, seed_hi)
        assert len(ks) == 20 and all(0 <= k <= ONES for k in ks)
        blocks = np.concatenate([[0, -1], rng.integers(-2 ** 63, 2 ** 63, 300)]).astype(np.int64)
        streams = np.concatenate([[0, -1], rng.integers(-2 ** 63, 2 ** 63, 300)]).astype(np.int64)
        out = np.zeros((2 * len(blocks), 4), np.int64)
        _keyed_words(blocks, streams, ks, out)
        want = np.array([_jitted_block(b, t, seed_lo, seed_hi)
                         for b, t in zip(blocks, streams)], np.int64)
        assert np.array_equal(out[:len(blocks)], want)
        assert np.array_equal(out[len(blocks):], want)
        assert tuple(int(w) for w in block_words_keyed(int(blocks[5]), int(streams[5]), ks)) \
            == tuple(int(w) for w in want[5])
    assert tuple(int(w) for w in block_words_keyed(-1, -1, round_keys(ONES, ONES))) == KAT[1][1]


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


def test_round_keys_refuse_what_is_no_seed_half():
    """round_keys takes the seed's 32-bit halves (integers, numpy's too) and names the bad
    value otherwise (it masked 2**70 and -1 and took "12", 1.5 and True)."""
    assert round_keys(np.uint64(ONES), np.int64(3)) == round_keys(ONES, 3)
    for bad in ("12", 1.5, True, None):
        with pytest.raises(TypeError, match="seed_lo=.* must be an integer in"):
            round_keys(bad, 0)
    for bad in (-1, 2 ** 32, 2 ** 70):
        with pytest.raises(ValueError, match=f"seed_hi={bad} is out of range"):
            round_keys(0, bad)
