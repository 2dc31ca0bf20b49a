"""The reference step: the papers' lines written with torch ops and :func:`lpsim.quantize`.

Slow (one pass per line) and plain on purpose: it is what the fused kernels are asserted to
equal bit for bit.  Each float32 line is one correctly rounded torch op on float32 tensors
(scalars are float32 too; sqrt goes through float64, see :func:`_sqrt`), the states are
rounded with ``lpsim.quantize`` (float32 container), the weight update ``w - u`` is formed
in float64 and rounded with lpsim.quantize's kernel (float64 container, 32-bit words); the
random bits follow :mod:`lpsim.optim.keys`.
"""

from __future__ import annotations

import numpy as np
import torch

from lpsim import cpu
from lpsim.cpu import NCOUNTS
from lpsim.formats import parse_format
from lpsim.quantize import plan, quantize
from lpsim.rounding import kernel_params
from lpsim.stats import RoundingStats
from lpsim.storage import pack

from .setup import FP32, Setup
from .step import ADAMW, KAHAN, QUIET_NAN, REMAINDER


def _f(x) -> torch.Tensor:
    return torch.tensor(np.float32(x), dtype=torch.float32)


def _q(x, fmt, rounding, seed, stream, sr_bits, offset, stats=None):
    return quantize(x.contiguous(), fmt, rounding, seed=seed, stream=stream, offset=offset,
                    sr_bits=sr_bits if rounding == "stochastic" else None, stats=stats)


def _q_update(x64, fmt, rounding, seed, stream, sr_bits, offset, stats=None):
    """The weight update's rounding: float64 values rounded with lpsim.quantize's kernel
    drawing 32-bit words, four elements to a Philox block (:mod:`lpsim.optim.keys`), where
    quantize itself would draw 62-bit words for a float64 array."""
    x = np.array(x64.contiguous().numpy(), np.float64)           # a copy, rounded in place
    request = plan(fmt, rounding, np.float32, seed=seed, stream=stream,
                   sr_bits=sr_bits if rounding == "stochastic" else None, offset=offset,
                   size=x.size)                                  # 32-bit words, validated
    params = np.array(kernel_params(parse_format(fmt), np.float64)._replace(W=32), np.int64)
    counts = stats.counts if stats is not None else np.zeros(NCOUNTS, np.int64)
    cpu.run(x.reshape(-1), x.reshape(-1), request.mode, params, request.k, request.seed_lo,
            request.seed_hi, request.stream, request.offset, counts)
    return torch.from_numpy(x)


def _sqrt(x32: torch.Tensor) -> torch.Tensor:
    """Correctly rounded float32 sqrt: torch's CPU float32 sqrt is not (about 20% of random
    inputs are one ulp off); through float64 it is (53 >= 2*24 + 2 bits: no double rounding)."""
    return torch.sqrt(x32.double()).float()


def _bits(x32: torch.Tensor) -> torch.Tensor:
    return x32.view(torch.int32).to(torch.int64)


def _load(t: torch.Tensor) -> torch.Tensor:
    """float32 values of a stored tensor, NaNs as the kernels decode them
    (:func:`lpsim.optim.step.load`): torch's float16 cast gives a NaN 0x7FC00000 in its
    vectorised loop and 0x7FFFFFFF in its scalar tail; the kernels keep sign and payload."""
    x = t.detach().float().clone()        # a copy: .float() of a float32 tensor is itself
    if t.dtype == torch.float16:
        h = t.detach().contiguous().view(torch.int16).to(torch.int64).reshape(x.shape)
        nan = ((h & 0x7C00) == 0x7C00) & ((h & 0x3FF) != 0)
        b = (((h >> 15) & 1) << 31) | 0x7F800000 | ((h & 0x3FF) << 13)
        b = torch.where(b >= 1 << 31, b - (1 << 32), b).to(torch.int32).view(torch.float32)
        x = torch.where(nan, b, x)
    return x


def _quiet(x32: torch.Tensor) -> torch.Tensor:
    """x32 with every NaN the quiet NaN the kernels store (lpsim.optim.step.QUIET_NAN)."""
    x32 = x32.float().contiguous()
    nan = torch.tensor(QUIET_NAN, dtype=torch.int32).view(torch.float32)
    return torch.where(torch.isnan(x32), nan, x32)


def _store(dst: torch.Tensor, x32: torch.Tensor) -> None:
    """dst[:] = float32 values already rounded to dst's format, re-encoded as the fused
    kernels store them (:func:`lpsim.optim.step.store`): bfloat16 the float32 bits' top
    half, float16 :func:`lpsim.storage.pack`, a NaN as QUIET_NAN.  Not ``dst.copy_``:
    torch's casts write a NaN as one of several codes (0xFFFF from its vectorised bfloat16
    cast, 0x7FC0 from its scalar one), so the reference's NaNs would depend on torch's path."""
    x32 = _quiet(x32)
    if dst.dtype == torch.bfloat16:
        dst.view(torch.int16).copy_((x32.view(torch.int32) >> 16).to(torch.int16).view_as(dst))
    elif dst.dtype == torch.float16:
        codes = pack(x32.numpy(), "float16", "fp16")
        dst.view(torch.int16).copy_(torch.from_numpy(codes).view_as(dst))
    else:
        dst.copy_(x32)


def join_remainder(code: torch.Tensor, rem: torch.Tensor) -> torch.Tensor:
    """float32 master of bfloat16 codes and int16 remainders (see lpsim.optim.step)."""
    hi = code.view(torch.int16).to(torch.int64) & 0xFFFF
    rem = rem.to(torch.int64)
    hi = torch.where(rem < 0, (hi - 1) & 0xFFFF, hi)
    u = (hi << 16) | (rem & 0xFFFF)
    return torch.where(u >= 0x80000000, u - (1 << 32), u).to(torch.int32).view(torch.float32)


def split_remainder(master: torch.Tensor):
    """(bfloat16 tensor, int16 remainder) holding a float32 tensor exactly."""
    u = _bits(master) & 0xFFFFFFFF
    hi, lo = u >> 16, u & 0xFFFF
    up = lo >= 0x8000
    hi = (hi + up.to(torch.int64)) & 0xFFFF
    lo = torch.where(up, lo - 0x10000, lo)
    hi = torch.where(hi >= 0x8000, hi - 0x10000, hi)
    return hi.to(torch.int16).view(torch.bfloat16), lo.to(torch.int16)


def step(algo: int, param, grad, state: dict, s: Setup, hp, nesterov: bool, first: bool,
         seed: int, streams, offset: int, stats: RoundingStats) -> int:
    """One step of one (local) parameter in place; adds to ``stats``, returns cancelled updates.

    hp and the lines: :func:`lpsim.optim.step.adamw_direction` / ``sgd_direction`` /
    ``apply_update``.  streams = (weight, first moment, second moment).
    """
    # (hp[12:]: 1 / c1 and 1 / c2, the GPU's divide_by)
    lr, decay, b1, omb1, b2, omb2, c1, c2, eps, wd, mu, omd = hp[:12]
    w = _load(param)
    g = _load(grad)
    qs = dict(fmt=s.state_format, rounding=s.state_rounding, seed=seed, sr_bits=s.sr_bits,
              offset=offset)
    if algo == ADAMW:
        m = _f(b1) * _load(state["exp_avg"]) + _f(omb1) * g
        m = _q(m, stream=streams[1], **qs)
        v = _f(b2) * _load(state["exp_avg_sq"]) + _f(omb2) * (g * g)
        v = _q(v, stream=streams[2], **qs)
        _store(state["exp_avg"], m)
        _store(state["exp_avg_sq"], v)
        dw = _f(decay) * w
        if decay < 1:       # an infinite weight keeps torch's w (1 - lr wd): infinite
            dw = torch.where(torch.isinf(w), torch.zeros_like(dw), dw)
        u = _f(lr) * ((m / _f(c1)) / (_sqrt(v / _f(c2)) + _f(eps))) + dw
    else:
        if wd != 0:         # torch.optim.SGD adds no 0 w (an infinite weight stays so)
            g = g + _f(wd) * w
        d = g
        if mu != 0:
            buf = g if first else _f(mu) * _load(state["momentum_buffer"]) + _f(omd) * g
            buf = _q(buf, stream=streams[1], **qs)
            _store(state["momentum_buffer"], buf)
            d = g + _f(mu) * buf if nesterov else buf
        u = _f(lr) * d
    if s.update == REMAINDER:
        master = join_remainder(param.detach(), state["remainder"])
        new = _q_update(master.double() - u.double(), FP32, "nearest", seed, streams[0], None,
                        offset, stats).float()
        new = _quiet(new)
        code, rem = split_remainder(new)
        param.detach().copy_(code)
        state["remainder"].copy_(rem)
        return int(((u != 0) & (_bits(new) == _bits(master))).sum())
    if s.update == KAHAN:
        c = _load(state["kahan_comp"])
        y = -u - c
        new = _q_update(w.double() + y.double(), s.weight_format, "nearest", seed, streams[0],
                        None, offset, stats)
        comp = _q((new - w.double()) - y.double(), s.state_format, "nearest", seed, streams[0],
                  None, offset)
        _store(state["kahan_comp"], comp)
    else:
        new = _q_update(w.double() - u.double(), s.weight_format, s.update_rounding, seed,
                        streams[0], s.sr_bits, offset, stats)
    new = _quiet(new)
    _store(param.detach(), new)
    return int(((u != 0) & (_bits(new) == _bits(w))).sum())
