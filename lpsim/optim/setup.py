"""What a kernel needs to know of one parameter: its formats, storage kinds and rounding codes.

Why: the reference, the CPU kernel and the CUDA kernel take the same resolved description,
so they cannot disagree about a default or a storage type.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
import torch

from lpsim.formats import Format, parse_format
from lpsim.rounding import NEAREST, STOCHASTIC, Params, kernel_params
from lpsim.storage import NO_PACKING, StorageParams, storage_params

from .step import REMAINDER, STORE_BF16, STORE_F16, STORE_F32, UPDATES

BF16, FP16, FP32 = parse_format("bf16"), parse_format("fp16"), parse_format("fp32")
#: torch dtype -> (storage kind, the format it holds, the integer dtype of its bits)
STORAGE = {
    torch.float32: (STORE_F32, FP32, torch.int32),
    torch.bfloat16: (STORE_BF16, BF16, torch.int16),
    torch.float16: (STORE_F16, FP16, torch.int16),
}
STATE_ROUNDINGS = ("nearest", "stochastic")


class Setup(NamedTuple):
    """A parameter's resolved options (see :class:`lpsim.optim.AdamW` for their meaning)."""

    weight_format: Format
    state_format: Format
    state_dtype: torch.dtype        # bfloat16 / float16 when the state format is one, else float32
    update: int                     # step.UPDATES code
    update_rounding: str
    state_rounding: str
    sr_bits: int | None
    kinds: tuple                    # storage kinds of (weight, grad, state)
    wmode: int                      # rounding mode code of the weight update
    wk: int                         # its random bits (32: all of the element's word)
    smode: int                      # -1: the state format is float32 (no rounding)
    sk: int
    pw: Params                      # the update's target format, float64 container, W = 32
    pc: Params                      # the state format, float64 container (Kahan compensation)
    ps: Params                      # the state format, float32 container
    sp16: StorageParams             # float16 packing (float32 container)


def storage_of(dtype: torch.dtype, what: str):
    if dtype not in STORAGE:
        raise TypeError(f"{what} has dtype {dtype}; lpsim.optim steps torch.float32, "
                        "torch.bfloat16 and torch.float16 tensors")
    return STORAGE[dtype]


def resolve(group: dict, param: torch.Tensor, grad_dtype: torch.dtype) -> Setup:
    """The Setup of ``param`` (dtype and grad dtype) under ``group``'s options (cached: a
    step resolves every parameter, and resolving costs more than a small parameter's
    kernel)."""
    key = (group["weight_format"], group["state_format"], group["update_rounding"],
           group["state_rounding"], group["sr_bits"], param.dtype, grad_dtype)
    try:
        return _resolve_cached(*key)
    except TypeError:       # an unhashable option: _resolve names it
        return _resolve(*key)


def _resolve(weight_format, state_format, update_rounding, state_rounding, sr_bits, dtype,
             grad_dtype) -> Setup:
    group = dict(weight_format=weight_format, state_format=state_format,
                 update_rounding=update_rounding, state_rounding=state_rounding,
                 sr_bits=sr_bits)
    wkind, native, _ = storage_of(dtype, "a parameter")
    gkind = storage_of(grad_dtype, "a gradient")[0]
    param = torch.empty(0, dtype=dtype)
    wfmt = native if group["weight_format"] is None else parse_format(group["weight_format"])
    if wkind == STORE_F32:
        wfmt.check_fits(np.float32)
    else:
        storage_params(wfmt, str(param.dtype).replace("torch.", ""), np.float32)
    sfmt = native if group["state_format"] is None else parse_format(group["state_format"])
    sfmt.check_fits(np.float32)
    sdtype = {BF16: torch.bfloat16, FP16: torch.float16}.get(sfmt, torch.float32)
    update = UPDATES[group["update_rounding"]]
    if update == REMAINDER and (param.dtype != torch.bfloat16 or wfmt != BF16):
        raise ValueError(f"update_rounding='remainder' keeps a float32 master as a bfloat16 "
                         f"parameter plus a 16-bit remainder, so it needs torch.bfloat16 "
                         f"parameters with weight_format bf16, not {param.dtype} / {wfmt!r}")
    sr_bits = group["sr_bits"]
    stochastic = group["update_rounding"] == "stochastic"
    wk = sr_bits if (sr_bits is not None and stochastic) else 32
    sk = min(sr_bits, 32) if (sr_bits is not None and group["state_rounding"] == "stochastic") \
        else 32
    target = FP32 if update == REMAINDER else wfmt
    return Setup(wfmt, sfmt, sdtype, update, group["update_rounding"], group["state_rounding"],
                 sr_bits, (wkind, gkind, STORAGE[sdtype][0]),
                 STOCHASTIC if stochastic else NEAREST, wk,
                 -1 if sfmt == FP32 else STOCHASTIC if group["state_rounding"] == "stochastic"
                 else NEAREST, sk,
                 kernel_params(target, np.float64)._replace(W=32),  # keys: 32-bit words
                 kernel_params(sfmt, np.float64),
                 kernel_params(sfmt, np.float32),
                 storage_params(FP16, "float16", np.float32) if STORE_F16 in
                 (wkind, gkind, STORAGE[sdtype][0]) else NO_PACKING)


def master_weight(weight, position: int, p: torch.Tensor) -> torch.Tensor:
    """Master weight ``position`` as float32 on ``p``'s device: a real floating tensor of
    p's shape whose values float32 holds (float64 ones rounded would be lost), else an
    error naming it."""
    if not isinstance(weight, torch.Tensor) or not weight.is_floating_point():
        kind = type(weight).__name__ if not isinstance(weight, torch.Tensor) else weight.dtype
        raise TypeError(f"master weight {position} is {kind}; accepted: a floating-point "
                        "torch tensor (float32)")
    if weight.shape != p.shape:
        raise ValueError(f"master weight {position} has shape {tuple(weight.shape)}, its "
                         f"parameter {tuple(p.shape)}")
    w32 = weight.detach().to(device=p.device, dtype=torch.float32)
    if weight.dtype == torch.float64:
        w = weight.detach().to(p.device)
        if not ((w32.double() == w) | w.isnan()).all():
            raise ValueError(f"master weight {position} is float64 with values float32 does "
                             "not hold (they would be rounded, not kept); accepted: float32 "
                             "weights")
    return w32


_resolve_cached = functools.lru_cache(maxsize=256)(_resolve)

