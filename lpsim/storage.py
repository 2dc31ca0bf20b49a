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
    """Storage bit pattern (as a signed integer of sp.width bits) of container bits ``bits``."""
    width, M, EB, EMAXF, MAG, sub_shift, m, bias, emin, inf_code, nan_code = sp
    bits = np.int64(bits)
    a = bits & MAG
    biased = a >> M
    fracmask = (np.int64(1) << M) - 1
    if biased == EMAXF:
        code = nan_code if a & fracmask else inf_code
    elif biased == 0:
        code = a >> sub_shift
    else:
        ex = biased - EB
        if ex >= emin:
            code = ((ex + bias) << m) | ((a & fracmask) >> (M - m))
        else:
            code = ((a & fracmask) | (np.int64(1) << M)) >> (emin - m - ex + M)
    if bits < 0 and not (biased == EMAXF and a & fracmask):
        code |= np.int64(1) << (width - 1)
    if code >= (np.int64(1) << (width - 1)):
        code -= np.int64(1) << width
    return code


@njit(parallel=True, cache=True)
def _pack_array(xb, out, sp):
    for i in prange(xb.size):
        out[i] = pack_bits(xb[i], sp)


def pack(rounded: np.ndarray, storage, fmt) -> np.ndarray:
    """Pack container values already rounded to ``fmt`` into ``storage`` bits (int16/int8 array).

    View the result as ``ml_dtypes.bfloat16`` (etc.) or ``torch.from_numpy(...).view(...)``.
    """
    if not isinstance(rounded, np.ndarray) or rounded.dtype not in (np.float32, np.float64):
        raise TypeError(f"pack takes a float32/float64 numpy array, not {type(rounded).__name__}"
                        f" {getattr(rounded, 'dtype', '')}")
    sp = storage_params(fmt, storage, rounded.dtype)
    flat = np.ascontiguousarray(rounded).reshape(-1)
    out = np.empty(flat.size, np.int16 if sp.width == 16 else np.int8)
    _pack_array(flat.view(np.int32 if flat.dtype == np.float32 else np.int64), out, sp)
    return out.reshape(rounded.shape)
