"""Native storage: pack rounded container values into bfloat16 / float16 / float8 bit patterns.

Rounding happens first (any format, any mode); packing only re-encodes a value that the
storage type holds exactly, so it never rounds.  This is the fp32 -> bf16 stochastic-rounding
store that low-precision optimizers need, done in one pass on the GPU.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
from numba import njit, prange
from numba.extending import register_jitable

from .formats import CONTAINERS, Format, fp, parse_format
from .word32 import like, operand_bits, widen

#: storage name -> (the format it encodes, its bit width)
STORAGE: dict[str, tuple[Format, int]] = {
    "bfloat16": (fp(8, 7), 16),
    "float16": (fp(5, 10), 16),
    "float8_e5m2": (fp(5, 2), 8),
    "float8_e4m3fn": (fp(4, 3, specials="fn"), 8),
}


class StorageParams(NamedTuple):
    """Integers the packer needs: container layout, storage layout, special codes."""

    width: int      # storage bits (0: no packing)
    M: int          # container mantissa bits
    EB: int         # container exponent bias
    EMAXF: int      # container exponent field of inf/NaN
    MAG: int        # container magnitude mask
    sub_shift: int  # container-subnormal significand -> storage subnormal mantissa shift
    m: int          # storage mantissa bits
    bias: int       # storage exponent bias
    emin: int       # storage min normal exponent
    inf_code: int
    nan_code: int


NO_PACKING = StorageParams(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)


def storage_name(storage) -> str:
    """Normalise a storage spec to a STORAGE key: a name, a torch dtype or a numpy/ml_dtypes dtype.

    Accepted: "bfloat16" (or "bf16"), "float16" ("fp16", "half"), "float8_e5m2",
    "float8_e4m3fn", torch.bfloat16 etc., ml_dtypes.bfloat16 etc. and np.float16.
    """
    if isinstance(storage, str):
        name = storage
    elif type(storage).__module__ == "torch":
        name = str(storage).replace("torch.", "")
    else:
        try:
            name = np.dtype(storage).name          # numpy and ml_dtypes scalar types
        except TypeError:
            name = None
    name = {"bf16": "bfloat16", "fp16": "float16", "half": "float16"}.get(name, name)
    if name not in STORAGE:
        raise ValueError(f"unknown storage {storage!r}; accepted: {', '.join(STORAGE)} (names, "
                         "torch dtypes or numpy/ml_dtypes dtypes)")
    return name


def storage_params(fmt, storage, dtype) -> StorageParams:
    """Validate that ``storage`` holds every result of ``fmt`` and return the packer's params.

    Cached per (format, storage, container dtype): the GPU path asks on every call.
    """
    return _storage_params(parse_format(fmt), storage_name(storage), np.dtype(dtype))


@functools.lru_cache(maxsize=256)
def _storage_params(fmt: Format, name: str, dtype: np.dtype) -> StorageParams:
    target, width = STORAGE[name]
    problems = []
    if fmt.m > target.m or fmt.emax > target.emax or fmt.max_finite > target.max_finite:
        problems.append("its range or precision exceeds the storage's")
    if fmt.emin - fmt.m < target.emin - target.m:
        problems.append("its finest spacing is below the storage's smallest subnormal")
    if fmt.has_inf and not target.has_inf:
        problems.append("it keeps or produces inf, which the storage cannot hold (use "
                        "specials='saturate' or 'fn')")
    if problems:
        raise ValueError(f"storage {name} cannot hold format {fmt!r}: {'; '.join(problems)}")
    M, EB, CEMIN, EMAXF = CONTAINERS[dtype]
    inf_code = ((2 ** target.e - 1) << target.m) if target.has_inf else 0
    nan_code = (2 ** target.e - 1) << target.m | (2 ** target.m - 1 if name == "float8_e4m3fn"
                                                 else 1 << (target.m - 1))
    return StorageParams(width, M, EB, EMAXF, (1 << (8 * dtype.itemsize - 1)) - 1,
                         (target.emin - target.m) - (CEMIN - M), target.m, target.bias,
                         target.emin, inf_code, nan_code)


@register_jitable
def pack_bits(bits, sp):
    """Storage bit pattern (as a signed integer of sp.width bits) of container bits ``bits``.

    In the operand's width: an int64, or a 32-bit word (lpsim.word32) from a float32
    container, so that a GPU kernel packing a word stays in 32-bit instructions (a word's
    negative code is its low sp.width bits, sign-extended by lpsim.word32.as_signed64 or a
    narrowing store).  Every quantity is nonnegative (the exponent compared as a field), and
    the right shifts are capped below the operand's width (:func:`lpsim.word32.operand_bits`;
    the sign is its top bit: an int64 holds float32 container bits sign-extended): ``a`` is
    below 2^31 (float32) or 2^63, so the value is the same, and a larger shift is undefined
    in LLVM.  Where the parameters are compile-time constants (the CUDA kernels bake them)
    LLVM folded ``0 >> 125`` (a zero into float16) to garbage."""
    width, M, EB, EMAXF, MAG, sub_shift, m, bias, emin, inf_code, nan_code = sp
    bits = widen(bits)
    a = bits & MAG
    cap = operand_bits(bits) - 1
    if bias == EB and emin == 1 - EB and sub_shift == M - m and inf_code == EMAXF << m:
        # the storage has the container's exponents (bfloat16 in float32): every finite
        # value's code, subnormals and inf included, is the magnitude's top bits and the
        # sign, a NaN the storage's NaN; a few operations where the kernels bake ``sp``
        if cap == 31 and M - m + width == 32:   # a word whose top bits are the code
            code = (bits >> (M - m)) & ((np.int64(1) << width) - 1)
        else:
            code = (a >> (M - m)) | (((bits >> cap) & 1) << (width - 1))
        code = like(bits, nan_code) if a > (EMAXF << M) else code
        return code - ((code >> (width - 1)) << width)
    biased = a >> M
    fracmask = (np.int64(1) << M) - 1
    if biased == EMAXF:
        code = like(bits, nan_code if (a & fracmask) != 0 else inf_code)
    elif biased == 0:
        code = a >> min(sub_shift, cap)
    elif biased >= emin + EB:                   # a normal of the storage format
        code = ((biased + (bias - EB)) << m) | ((a & fracmask) >> (M - m))
    else:                                       # a subnormal: shifted by its binades below
        code = ((a & fracmask) | (np.int64(1) << M)) >> min(emin + EB - m + M - biased, cap)
    if ((bits >> cap) & 1) != 0 and not (biased == EMAXF and (a & fracmask) != 0):
        code |= np.int64(1) << (width - 1)
    if code >= (np.int64(1) << (width - 1)):
        code -= np.int64(1) << width
    return code


#: 16-bit storage a value is read from (:func:`code_bits`): bfloat16 or float16 codes
BFLOAT16_CODES, FLOAT16_CODES = 1, 2


@register_jitable
def code_bits(code, half):
    """float32 bits (an int32) of a bfloat16 (``half`` = BFLOAT16_CODES) or float16
    (FLOAT16_CODES) code given as a 16-bit integer: what the kernels read 16-bit tensors
    as, exactly, NaN payloads kept.  bfloat16's are its top half; float16's exponent is
    re-biased (normal), its subnormal f * 2**-24 converted (exact), inf and NaN keep their
    payload.  An int32 stays a 32-bit word where the caller rounds (lpsim.word32)."""
    if half == BFLOAT16_CODES:
        return np.int32(np.int32(code) << 16)
    h = np.int32(code) & 0xFFFF
    mag = h & 0x7FFF
    if mag >= 0x7C00:
        b = (mag << 13) | 0x7F800000
    elif mag >= 0x0400:
        b = (mag << 13) + (112 << 23)
    else:
        b = np.int64(np.float32(np.float32(mag) * np.float32(2.0 ** -24)).view(np.int32))
    return np.int32(((h & 0x8000) << 16) | b)


@njit(parallel=True, cache=True)
def _pack_array(xb, out, sp):
    for i in prange(xb.size):
        out[i] = pack_bits(xb[i], sp)


def pack(rounded: np.ndarray, storage, fmt) -> np.ndarray:
    """Pack container values already rounded to ``fmt`` into ``storage`` bits (int16/int8 array).

    View the result as ``ml_dtypes.bfloat16`` (etc.) or ``torch.from_numpy(...).view(...)``.
    A value the storage does not hold (not rounded first) is a ValueError naming the first
    such value: its bits would have been another value's (1e30 into float16 came out
    -12.6), silently.
    """
    if not isinstance(rounded, np.ndarray) or rounded.dtype not in (np.float32, np.float64):
        raise TypeError(f"pack takes a float32/float64 numpy array, not {type(rounded).__name__}"
                        f" {getattr(rounded, 'dtype', '')}")
    sp = storage_params(fmt, storage, rounded.dtype)
    flat = np.ascontiguousarray(rounded).reshape(-1)
    out = np.empty(flat.size, np.int16 if sp.width == 16 else np.int8)
    _pack_array(flat.view(np.int32 if flat.dtype == np.float32 else np.int64), out, sp)
    # the codes read back: every value, -0, inf and NaN (any payload) as it was given
    target = STORAGE[storage_name(storage)][0]
    back = decode_codes(out.view(np.uint16 if sp.width == 16 else np.uint8), target)
    held = ((back == flat) & (np.signbit(back) == np.signbit(flat))
            | (np.isnan(flat) & np.isnan(back)))
    if not held.all():
        first = int(np.argmin(held))
        raise ValueError(f"pack: {flat[first]!r} (element {first} of the flattened array) is not "
                         f"a value of {storage_name(storage)}; accepted: values rounded to "
                         f"{parse_format(fmt)!r} first (lpsim.quantize), which it holds")
    return out.reshape(rounded.shape)


# --- codes of any small format (block elements and scales) --------------------------------

def _code_layout(fmt: Format, max_bits: int = 16):
    if fmt.specials == "fnu" and fmt.m:
        raise ValueError(f"codes of {fmt!r}: unsigned formats without zero are encoded with "
                         "m = 0 only (E8M0)")
    if fmt.bits > max_bits:
        raise ValueError(f"codes of {fmt!r}: formats of at most {max_bits} bits have codes here")
    return fmt.e + fmt.m, (1 << fmt.m) - 1


def encode_values(values, fmt) -> np.ndarray:
    """The bit patterns (uint16; uint64 for formats wider than 16 bits) of values of ``fmt``
    (already rounded to it), as ml_dtypes lays them out: sign, exponent code, mantissa; NaN
    as the format's NaN code (fn: all ones, fnuz: 0x80, fnu: all ones, saturate: 0, which a
    NaN block scale marks), E8M0 as exponent + 127.  Use
    ``.astype(np.uint8).view(ml_dtypes.float4_e2m1fn)`` etc."""
    fmt = parse_format(fmt)
    shift, mmask = _code_layout(fmt, 64)
    v = np.asarray(values, np.float64)
    a = np.abs(v)
    nan = np.isnan(v)
    with np.errstate(divide="ignore", invalid="ignore"):
        _, e2 = np.frexp(np.where(a > 0, a, 1.0))
        ex = e2.astype(np.int64) - 1
        normal = ex >= fmt.emin
        expcode = np.where(normal, ex + fmt.bias, 0)
        quantum = np.ldexp(1.0, np.where(normal, ex, fmt.emin) - fmt.m)
        mant = (a / quantum).astype(np.int64) - np.where(normal, 1 << fmt.m, 0)
    mant = np.where(a > 0, mant, 0)
    expcode = np.where(a > 0, expcode, 0)
    code = (expcode << fmt.m) | (mant & mmask)
    if fmt.specials == "fnu":
        code = code - 1
    sign = np.signbit(v) & fmt.signed & ~((a == 0) & (not fmt.has_negative_zero))
    code = code | (sign.astype(np.int64) << shift)
    if fmt.has_inf:
        code = np.where(np.isinf(v), (np.signbit(v).astype(np.int64) << shift)
                        | (((1 << fmt.e) - 1) << fmt.m), code)
    if fmt.specials == "ieee" and fmt.m == 0 and nan.any():
        # the top exponent code with no mantissa bits is inf's: a NaN would decode as inf
        raise ValueError(f"encode_values: {fmt!r} has no NaN code (an IEEE-style format "
                         "without mantissa bits), and the values hold a NaN; accepted: values "
                         "without NaN, or a format with a NaN code")
    nan_code = {"ieee": (((1 << fmt.e) - 1) << fmt.m) | (1 << max(fmt.m - 1, 0)),
                "fn": (1 << shift) - 1, "fnuz": 1 << shift, "fnu": (1 << shift) - 1,
                "saturate": 0}[fmt.specials]
    code = np.where(nan, np.uint64(nan_code), code.astype(np.uint64))  # bit 63: the sign of fp64
    return code.astype(np.uint16 if fmt.bits <= 16 else np.uint64)


def decode_codes(codes, fmt) -> np.ndarray:
    """float64 values of the bit patterns ``codes`` of ``fmt`` (the inverse of encode_values)."""
    fmt = parse_format(fmt)
    shift, mmask = _code_layout(fmt)
    c = _checked_codes(codes, (1 << fmt.bits) - 1, "decode_codes", "codes").astype(np.int64)
    if fmt.specials == "fnu":
        mag = c + 1
        sign = np.zeros_like(c, bool)
    else:
        mag = c & ((1 << shift) - 1)
        sign = (c >> shift) & 1 == 1
    expcode, mant = mag >> fmt.m, mag & mmask
    value = np.where(expcode == 0, np.ldexp(mant.astype(np.float64), fmt.emin - fmt.m),
                     np.ldexp((mant | (1 << fmt.m)).astype(np.float64),
                              expcode - fmt.bias - fmt.m))
    value = np.where(sign, -value, value)
    top = (1 << fmt.e) - 1
    if fmt.specials == "ieee":
        value = np.where(expcode == top, np.where(mant == 0, np.copysign(np.inf, value),
                                                  np.nan), value)
    elif fmt.specials in ("fn", "fnu"):
        value = np.where(c == (1 << shift) - 1 if fmt.specials == "fnu" else
                         (expcode == top) & (mant == mmask), np.nan, value)
    elif fmt.specials == "fnuz":
        value = np.where(c == 1 << shift, np.nan, value)
    return value


def pack_nibbles(codes) -> np.ndarray:
    """Two 4-bit codes per byte along the last axis, the first in the low nibble (torchao's
    float4_e2m1fn_x2 layout); the last axis must be even."""
    codes = _integer_codes(codes, 15, "pack_nibbles", "codes")
    if codes.shape[-1] % 2:
        raise ValueError(f"pack_nibbles needs an even last axis, not {codes.shape[-1]}")
    return (codes[..., ::2] & 0xF) | ((codes[..., 1::2] & 0xF) << 4)


def _checked_codes(codes, top: int, name: str, what: str) -> np.ndarray:
    """``codes`` as an integer array, or an error naming what is wrong: floats would be
    truncated (bools read as codes) and codes past ``top`` cut to their low bits."""
    given = np.asarray(codes)
    if given.dtype.kind not in "ui":
        raise TypeError(f"{name}: {what} of dtype {given.dtype} are not accepted; accepted: "
                        f"integer codes 0 .. {top}")
    if given.size and (int(given.min()) < 0 or int(given.max()) > top):
        raise ValueError(f"{name}: {what} from {given.min()} to {given.max()} are not "
                         f"accepted; accepted: 0 .. {top}")
    return given


def _integer_codes(codes, top: int, name: str, what: str) -> np.ndarray:
    """:func:`_checked_codes` as a uint8 array of at least one dimension."""
    given = _checked_codes(codes, top, name, what)
    if given.ndim == 0:
        raise ValueError(f"{name}: a 0-d array of {what} is not accepted; accepted: an "
                         "array of at least one dimension (pairs along the last)")
    return given.astype(np.uint8)


def unpack_nibbles(packed) -> np.ndarray:
    """The inverse of :func:`pack_nibbles`."""
    packed = _integer_codes(packed, 255, "unpack_nibbles", "bytes")
    out = np.empty(packed.shape[:-1] + (2 * packed.shape[-1],), np.uint8)
    out[..., ::2], out[..., 1::2] = packed & 0xF, packed >> 4
    return out
