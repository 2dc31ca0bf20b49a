"""Packing rounded values into native storage equals torch's and ml_dtypes' own encodings;
storage specs (names, torch and numpy/ml_dtypes dtypes) normalise to one name."""

import ml_dtypes
import numpy as np
import pytest

from numba import njit

import lpsim
from lpsim.storage import (BFLOAT16_CODES, FLOAT16_CODES, code_bits, decode_codes,
                           encode_values, pack, pack_bits, pack_nibbles, storage_name,
                           storage_params, unpack_nibbles)
from lpsim.word32 import as_signed64, word

CASES = [("bfloat16", "bf16", ml_dtypes.bfloat16), ("float16", "fp16", np.float16),
         ("float8_e5m2", "e5m2", ml_dtypes.float8_e5m2),
         ("float8_e4m3fn", "e4m3fn", ml_dtypes.float8_e4m3fn)]


@pytest.mark.parametrize("storage, fmt, peer", CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pack_equals_the_peer_encoding(storage, fmt, peer, dtype):
    width = np.dtype(peer).itemsize * 8
    codes = np.arange(2 ** width, dtype=np.uint16 if width == 16 else np.uint8)
    with np.errstate(invalid="ignore"):
        values = codes.view(peer).astype(dtype)      # every code point, incl. subnormals, inf, NaN
    rng = np.random.default_rng(0)
    x = np.concatenate([values, rng.standard_normal(4096).astype(dtype)])
    rounded = lpsim.quantize(x, fmt, "stochastic", seed=1)
    got = pack(rounded, storage, fmt)
    with np.errstate(over="ignore", invalid="ignore"):
        expected = rounded.astype(peer).view(np.int16 if width == 16 else np.int8)
    nan = np.isnan(rounded)
    assert np.array_equal(got[~nan], expected[~nan])
    assert np.all(np.isnan(got[nan].view(peer).astype(np.float32)))
    # every NaN, whatever its sign and payload, is the storage's one quiet NaN code
    assert nan.sum() >= 2 and np.all(got[nan] == storage_params(fmt, storage, dtype).nan_code)


@pytest.mark.parametrize("words", [False, True], ids=["int64", "words"])
@pytest.mark.parametrize("storage, fmt, peer", CASES)
def test_pack_bits_with_constant_parameters_equals_the_runtime_packing(storage, fmt, peer,
                                                                        words):
    """The CUDA kernels compile pack_bits with the storage parameters as constants; LLVM then
    folds every shift, and one of 64 or more is undefined: float16's zero packed to garbage
    on an H100 (2026-11-26) and on this CPU alike, until the shifts were capped.  The
    specialised quantize kernels pack 32-bit words (lpsim.word32): the same codes, NaNs
    whose payload lies in the bits a bfloat16 drops included."""
    SP = storage_params(fmt, storage, np.float32)

    @njit
    def baked(bits, out):
        for i in range(bits.size):
            if words:
                out[i] = as_signed64(pack_bits(word(bits[i]), SP))
            else:
                out[i] = pack_bits(bits[i], SP)

    width = np.dtype(peer).itemsize * 8
    codes = np.arange(2 ** width, dtype=np.uint16 if width == 16 else np.uint8)
    with np.errstate(invalid="ignore"):
        values = codes.view(peer).astype(np.float32)
    nans = np.array([0x7F800001, 0xFF800001, 0x7FC00000, 0x7F80FFFF], np.uint32).view(np.float32)
    x = np.concatenate([values, nans, np.float32([0.0, -0.0])])
    got = np.empty(x.size, np.int64)        # the signed code itself, before any store
    baked(x.view(np.int32), got)
    assert np.array_equal(got, pack(x, storage, fmt).astype(np.int64))
    assert np.all(got[-6:-2] == SP.nan_code)
    assert got[-2] == 0 and got[-1] == -2 ** (width - 1)     # +0 and -0: the sign bit alone


def test_storage_must_hold_the_format():
    with pytest.raises(ValueError, match="storage float16 cannot hold format bf16"):
        pack(np.zeros(3, np.float32), "float16", "bf16")
    with pytest.raises(ValueError, match="produces inf"):
        pack(np.zeros(3, np.float32), "float8_e4m3fn", lpsim.fp(4, 2, saturate=True))
    with pytest.raises(ValueError, match="produces inf"):
        pack(np.zeros(3, np.float32), "float8_e4m3fn", "fp(4,3,4)")
    with pytest.raises(ValueError, match="finest spacing"):
        pack(np.zeros(3, np.float32), "float8_e4m3fn", lpsim.fp(4, 3, 4, saturate=True))
    x = np.array([1000.0, -0.3, 2.0 ** -9], np.float32)
    fmt = lpsim.fp(4, 2, specials="saturate")      # 7-bit saturating values in float8_e4m3fn
    assert np.array_equal(pack(lpsim.quantize(x, fmt), "float8_e4m3fn", fmt).view(
        ml_dtypes.float8_e4m3fn).astype(np.float32), np.array([448, -0.3125, 0]))
    with pytest.raises(ValueError, match="unknown storage 'int8'"):
        pack(np.zeros(3, np.float32), "int8", "bf16")


@pytest.mark.parametrize("values, storage, fmt", [
    ([1.0, 1e30], "float16", "fp16"),          # beyond the range: once the code of -12.6
    ([1e5], "float16", "fp16"),                # once NaN's code
    ([0.5, 1.1], "bfloat16", "bf16"),          # more bits than bf16: once truncated
    ([1000.0], "float8_e4m3fn", "e4m3fn"),     # once -0.0137's code
    ([2.0 ** -10], "float8_e4m3fn", "e4m3fn")])  # below its smallest subnormal
def test_a_value_the_storage_does_not_hold_is_refused(values, storage, fmt):
    """pack takes values rounded first; one the storage does not hold got another value's
    code, silently.  Held values, -0, inf where the storage has it and NaN pass (above)."""
    x = np.array(values, np.float32)
    with pytest.raises(ValueError, match=f"pack: .* is not a value of {storage}"):
        pack(x, storage, fmt)
    np.testing.assert_array_equal(        # rounded first: taken (e4m3fn's 1000 is NaN)
        pack(lpsim.quantize(x, fmt, "nearest"), storage, fmt).view(
            {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16,
             "float8_e4m3fn": ml_dtypes.float8_e4m3fn}[storage]).astype(np.float32),
        lpsim.quantize(x, fmt, "nearest"))


@pytest.mark.parametrize("spec, name", [
    ("bf16", "bfloat16"), ("half", "float16"), ("float8_e5m2", "float8_e5m2"),
    (ml_dtypes.bfloat16, "bfloat16"), (ml_dtypes.float8_e4m3fn, "float8_e4m3fn"),
    (np.dtype(ml_dtypes.float8_e5m2), "float8_e5m2"), (np.float16, "float16")])
def test_storage_name_takes_names_and_numpy_ml_dtypes_dtypes(spec, name):
    assert storage_name(spec) == name


def test_storage_name_takes_torch_dtypes_and_refuses_others_by_name():
    torch = pytest.importorskip("torch")
    assert storage_name(torch.float8_e4m3fn) == "float8_e4m3fn"
    for bad in (np.float32, ml_dtypes.float8_e4m3fnuz, torch.int8, 3):
        with pytest.raises(ValueError, match=f"unknown storage {bad!r}; accepted: bfloat16"):
            storage_name(bad)


def test_storage_params_are_cached_per_format_storage_and_container():
    first = storage_params("e4m3fn", "float8_e4m3fn", np.float32)
    assert storage_params(lpsim.parse_format("e4m3fn"), ml_dtypes.float8_e4m3fn,
                          "float32") is first
    assert storage_params("e4m3fn", "float8_e4m3fn", np.float64) is not first


@njit
def _all_code_bits(codes, half, out):
    for i in range(codes.size):
        out[i] = code_bits(codes[i], half)


@pytest.mark.parametrize("half, peer", [(BFLOAT16_CODES, ml_dtypes.bfloat16),
                                        (FLOAT16_CODES, np.float16)])
def test_code_bits_reads_every_16_bit_code_as_its_peer_does(half, peer):
    """Every one of the 65536 codes, compiled and in Python (the CUDA simulator's way),
    equals ml_dtypes' / numpy's exact widening to float32, bit for bit: subnormals, signed
    zeros, inf and NaN payloads included."""
    codes = np.arange(-2 ** 15, 2 ** 15, dtype=np.int64).astype(np.int16)
    expected = codes.view(peer).astype(np.float32).view(np.int32)
    out = np.zeros(codes.size, np.int32)
    _all_code_bits(codes, half, out)
    assert np.array_equal(out, expected)
    picks = codes[::97]
    assert [int(code_bits(c, half)) for c in picks] == expected[::97].tolist()


@pytest.mark.parametrize("call, error, match", [
    (lambda: pack_nibbles(np.uint8(3)), ValueError, r"a 0-d array of codes is not accepted"),
    (lambda: pack_nibbles([17, 2]), ValueError, r"codes from 2 to 17 are not accepted; "
                                                r"accepted: 0 \.\. 15"),
    (lambda: pack_nibbles([-1, 2]), ValueError, r"codes from -1 to 2"),
    (lambda: pack_nibbles([300, 2]), ValueError, r"codes from 2 to 300"),
    (lambda: pack_nibbles([1.5, 2.7]), TypeError, r"codes of dtype float64 are not accepted"),
    (lambda: unpack_nibbles(np.uint8(3)), ValueError, r"a 0-d array of bytes"),
    (lambda: unpack_nibbles([256, 0]), ValueError, r"bytes from 0 to 256"),
])
def test_nibble_packing_refuses_what_it_would_cut_or_truncate(call, error, match):
    """A code past 15 was cut to its low nibble and a float truncated, silently."""
    with pytest.raises(error, match=match):
        call()
    assert pack_nibbles(np.array([[1, 2], [3, 15]], np.int64)).tolist() == [[0x21], [0xF3]]
    assert unpack_nibbles([0x21, 0xF3]).tolist() == [1, 2, 3, 15]


def test_a_nan_in_a_format_without_a_nan_code_is_refused():
    """fp(5, 0) has no NaN code (its top exponent code is inf's): the NaN came back as inf."""
    with pytest.raises(ValueError, match=r"fp\(5,0,0\) has no NaN code"):
        encode_values([1.0, np.nan], "fp(5,0)")
    assert decode_codes(encode_values([np.inf, -2.0], "fp(5,0)"), "fp(5,0)").tolist() == [
        np.inf, -2.0]


@pytest.mark.parametrize("codes, error, match", [
    ([1.7], TypeError, r"codes of dtype float64 are not accepted; accepted: integer codes "
                       r"0 \.\. 255"),
    ([True], TypeError, r"codes of dtype bool"),
    ([1000], ValueError, r"codes from 1000 to 1000 are not accepted; accepted: 0 \.\. 255"),
    ([-1, 3], ValueError, r"codes from -1 to 3 are not accepted")])
def test_decode_codes_refuses_what_it_would_truncate_or_wrap(codes, error, match):
    """1.7 was read as code 1, 1000 as its low byte and -1 as NaN, silently."""
    with pytest.raises(error, match=match):
        decode_codes(codes, "e4m3fn")
    assert decode_codes(np.array([], np.int64), "e4m3fn").size == 0
    assert decode_codes(np.uint8(0x38), "e4m3fn") == 1.0
