"""The operands of :mod:`lpsim.ops.mma`: values of an instruction's types split into
significands, signs, exponents and classes (finite, NaN, +inf, -inf), and its block scales.

Values come as numpy arrays or torch tensors (a torch 8- or 16-bit float of the type itself is
decoded from its codes through a table); a value the type cannot hold is a ValueError that
names it.  Shared by the fused-node kernel (:mod:`lpsim.ops.mma`) and the group-scaled one
(:mod:`lpsim.ops.mma_groups`).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import njit

from .._extras import is_torch
from ..formats import parse_format
from .mma_table import FORMATS

FINITE, NAN, POS_INF, NEG_INF = 0, 1, 2, 3
ZERO_E = -(1 << 20)      # exponent of a zero input: never a node's maximum


@njit(cache=True, nogil=True, inline="always")
def held_value(m, e, cls):
    """The value of an f32 D the kernels hold as (signed significand with 23 fraction bits,
    exponent, class), as a float64."""
    if cls == NAN:
        return np.nan
    if cls == FINITE:
        return math.ldexp(float(m), int(e) - 23)
    return np.inf if cls == POS_INF else -np.inf


@njit(cache=True, nogil=True)
def decode_values(bits, p, e_sub, e_max, top, has_inf, has_nan, zero_e, mag, sgn, e, cls):
    """Split float64 values (their int64 ``bits``) of a type with ``p`` fraction bits into
    significand magnitudes ``mag``, signs ``sgn`` (0 or -1) and exponents ``e`` (value =
    mag * 2**(e - p), e >= e_sub; zeros get ``zero_e``) and a class (finite, NaN, +inf,
    -inf), from the bit fields: no float arithmetic.  Returns the flat index of the first
    value the type cannot hold (-1: all can): a ValueError must name it."""
    for i in range(bits.size):
        b = bits[i]
        ef = (b >> 52) & 0x7FF
        frac = b & 0xFFFFFFFFFFFFF
        mag[i] = 0
        sgn[i] = -1 if b < 0 else 0
        e[i] = zero_e
        cls[i] = FINITE
        if ef == 0x7FF:
            if frac != 0:
                if not has_nan:               # FP6 and FP4 have no NaN
                    return i
                cls[i] = NAN
            elif not has_inf:
                return i
            else:
                cls[i] = NEG_INF if b < 0 else POS_INF
        elif ef != 0 or frac != 0:
            if ef == 0:                       # float64 subnormal: below every type here
                return i
            ex = ef - 1023
            sh = 52 - p
            if ex < e_sub:
                sh += e_sub - ex
                ex = e_sub
            full = frac | (1 << 52)
            if sh > 53 or (full & ((1 << sh) - 1)) != 0:
                return i
            m = full >> sh
            if ex > e_max or (ex == e_max and m > top):
                return i
            mag[i] = m
            e[i] = ex
    return -1


@functools.lru_cache(maxsize=None)
def code_values_of(dtype):
    """float64 value of every code of a torch 8- or 16-bit float dtype, by code."""
    import torch
    bits = 8 * dtype.itemsize
    codes = torch.arange(2 ** bits, dtype=torch.int32)
    codes = torch.where(codes >= 2 ** (bits - 1), codes - 2 ** bits, codes)
    words = codes.to(torch.int8 if bits == 8 else torch.int16).view(dtype)
    with np.errstate(invalid="ignore"):
        return words.float().numpy().astype(np.float64)


def as_float64(x, name, who="mma"):
    """(float64 numpy copy, library of x, torch device or None) of an operand; torch's
    8- and 16-bit floats by a table of their codes (faster than converting).  Complex
    operands are refused: their imaginary parts would be dropped."""
    if hasattr(x, "detach") and hasattr(x, "dtype") and is_torch(x):
        device = x.device
        if x.dtype.is_complex:
            raise ValueError(f"{who}: {name} is a complex tensor ({x.dtype}); accepted: real "
                             "values of the instruction's type")
        import torch
        if x.dtype == torch.bool:
            raise TypeError(f"{who}: {name} is a bool tensor; accepted: real values of the "
                            "instruction's type")
        x = x.detach().cpu()
        if x.dtype.is_floating_point and x.dtype.itemsize <= 2:
            words = x.contiguous().view(torch.uint8 if x.dtype.itemsize == 1 else torch.int16)
            codes = words.numpy().astype(np.int64) & (2 ** (8 * x.dtype.itemsize) - 1)
            return code_values_of(x.dtype)[codes], "torch", device
        x = x if x.dtype.is_floating_point and x.dtype.itemsize == 8 else x.float()
        with np.errstate(invalid="ignore"):              # NaN codes: no warning
            return x.numpy().astype(np.float64), "torch", device
    given = type(x).__name__
    if getattr(getattr(x, "dtype", None), "kind", None) == "b":
        raise TypeError(f"{who}: {name} is a bool array; accepted: real values of the "
                        "instruction's type")
    try:
        x = np.asarray(x)
        if x.dtype.kind == "c":
            raise ValueError(f"{x.dtype} values have imaginary parts")
        with np.errstate(invalid="ignore"):
            return x.astype(np.float64), "numpy", None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{who}: {name} must be a numpy array or torch tensor of real "
                         f"numbers, not {given} ({exc})") from None


def _tf32_low_bits(x):
    """Flat index of the first float32 value with any of the 13 bits TF32 lacks set, or -1."""
    bits = np.ascontiguousarray(x, np.float64).astype(np.float32).view(np.uint32)
    bad = np.flatnonzero(bits & np.uint32(0x1FFF))
    return int(bad[0]) if bad.size else -1


@functools.lru_cache(maxsize=None)
def type_params(ptx_type):
    """(format, fraction bits, least exponent, largest exponent, largest significand at it,
    has inf, has NaN) of a PTX type, from lpsim's format of it."""
    fmt = parse_format(FORMATS[ptx_type])
    return (fmt, fmt.m, fmt.emin, fmt.emax, (1 << fmt.m) + fmt.max_mantissa, fmt.has_inf,
            fmt.has_nan)


def decoded(values, ptx_type, name, zero_e):
    """Significand magnitudes, signs, exponents and classes of an operand (:func:`decode_values`);
    ValueError naming the first value ``ptx_type`` cannot hold."""
    fmt, p, e_sub, e_max, top, has_inf, has_nan = type_params(ptx_type)
    values = np.ascontiguousarray(values)
    mag = np.empty(values.shape, np.int32)
    sgn = np.empty(values.shape, np.int32)
    e = np.empty(values.shape, np.int32)
    cls = np.empty(values.shape, np.int8)
    bad = decode_values(values.view(np.int64).ravel(), p, e_sub, e_max, top, has_inf, has_nan,
                        zero_e, mag.ravel(), sgn.ravel(), e.ravel(), cls.ravel())
    if bad < 0 and ptx_type == "tf32":
        bad = _tf32_low_bits(values)
    if bad >= 0:
        where = np.unravel_index(bad, values.shape)
        value = float(values.ravel()[bad])
        accepted = (f"finite values of {ptx_type} ({fmt!r}: {fmt.m} fraction bits, least "
                    f"exponent {fmt.emin}, largest finite {fmt.max_finite:g})"
                    + (", inf" if fmt.has_inf else ", no inf")
                    + (", NaN" if fmt.has_nan else ", no NaN"))
        raise ValueError(f"mma: {name}[{', '.join(str(int(w)) for w in where)}] = {value!r} "
                         f"is not a value of type {ptx_type}; accepted: {accepted}")
    return mag, sgn, e, cls


_TORCH_NAMES = {"e4m3": "torch.float8_e4m3fn", "e5m2": "torch.float8_e5m2",
                "bf16": "torch.bfloat16", "f16": "torch.float16"}


@njit(cache=True, nogil=True)
def _gather(codes, mask, t_mag, t_sgn, t_e, t_cls, mag, sgn, e, cls):
    """Decode codes through the tables of :func:`_code_tables`."""
    for i in range(codes.size):
        k = codes[i] & mask
        mag[i], sgn[i], e[i], cls[i] = t_mag[k], t_sgn[k], t_e[k], t_cls[k]


@functools.lru_cache(maxsize=None)
def _code_tables(dtype, ptx_type):
    """Significand, sign, exponent and class of every code of a torch 8- or 16-bit dtype
    that is ``ptx_type`` itself (every code valid)."""
    return decoded(code_values_of(dtype), ptx_type, "table", ZERO_E)


def operand(x, ptx_type, name, shape):
    """(significands, signs, exponents, classes) of an operand (None if its shape is not
    ``shape``), whether it is torch's, its device and its shape.  A torch tensor of the
    instruction's own 8- or 16-bit type is decoded from its codes through a table; anything
    else through float64 values, checked."""
    torch_tensor = is_torch(x) and hasattr(x, "dtype")
    if torch_tensor and str(x.dtype) == _TORCH_NAMES.get(ptx_type) and tuple(x.shape) == shape:
        import torch
        words = x.detach().cpu().contiguous().view(
            torch.uint8 if x.dtype.itemsize == 1 else torch.int16).numpy()
        parts = tuple(np.empty(shape, dt) for dt in (np.int32, np.int32, np.int32, np.int8))
        _gather(words.ravel(), 0xFF if x.dtype.itemsize == 1 else 0xFFFF,
                *_code_tables(x.dtype, ptx_type), *(p.ravel() for p in parts))
        return parts, True, x.device, shape
    values, lib, device = as_float64(x, name)
    if values.shape != shape:
        return None, lib == "torch", device, values.shape
    return decoded(values, ptx_type, name, ZERO_E), lib == "torch", device, shape


SCALE_NAN = 1 << 20        # scale_parts' exponent of a NaN scale
SCALE_NAMES = {"ue8m0": "E8M0", "ue4m3": "UE4M3"}


def scale_parts(x, name, shape, scale_type="ue8m0", block=32):
    """Block scales as int32 (significands in eighths, exponents): value = sig / 8 * 2**exp,
    NaN with the exponent SCALE_NAN.  ``"ue8m0"``: powers of two from 2**-127 to 2**127
    (significand 8); ``"ue4m3"``: the non-negative E4M3 values, 0 to 448 (subnormals at
    exponent -6, zero with significand 0).  ValueError naming a wrong shape or the first
    value that is not a scale of the type."""
    values = as_float64(x, name)[0]
    if values.shape != shape:
        raise ValueError(f"mma: {name} has shape {values.shape}; accepted: {shape}, one "
                         f"{SCALE_NAMES[scale_type]} scale per {block} products")
    nan = np.isnan(values)
    with np.errstate(invalid="ignore"):
        frac, exp = np.frexp(values)
    exp = exp - 1               # value = (2 frac) * 2**exp, 1 <= 2 frac < 2
    if scale_type == "ue8m0":
        sig = np.full(values.shape, 8)
        bad = ~nan & ((frac != 0.5) | (exp < -127) | (exp > 127))
        accepted = "powers of two from 2**-127 to 2**127, and NaN"
    else:
        normal = values >= 2.0 ** -6
        exp = np.where(normal, exp, -6)
        with np.errstate(invalid="ignore", over="ignore"):
            sig = np.where(normal, frac * 16, values * 2.0 ** 9)
        bad = ~nan & ((values < 0) | (values > 448) | (sig != np.floor(sig)))
        accepted = "the E4M3 values from 0 to 448 (no sign), and NaN"
    if bad.any():
        where = tuple(int(w) for w in np.argwhere(bad)[0])
        article = "an" if scale_type == "ue8m0" else "a"
        raise ValueError(f"mma: {name}[{', '.join(map(str, where))}] = "
                         f"{float(values[where])!r} is not {article} "
                         f"{SCALE_NAMES[scale_type]} scale; accepted: {accepted}")
    return (np.where(nan, 0, sig).astype(np.int32),
            np.where(nan, SCALE_NAN, exp).astype(np.int32))


def scale_exponents(x, name, shape):
    """The int32 exponents of E8M0 scales per 32 products (NaN: SCALE_NAN), as
    :func:`scale_parts` checks them."""
    return scale_parts(x, name, shape)[1]


def fold_scales(mag, e, cls, scales, block, axis):
    """Each element's exponent plus its block's scale exponent (along K: ``axis`` 1 of A, 0 of
    B); a NaN scale makes every element of its block NaN, zeros included."""
    per = np.repeat(scales, block, axis=axis)
    nan = per == SCALE_NAN
    live = (mag != 0) & (cls == FINITE) & ~nan
    e[live] += per[live]
    cls[nan] = NAN
