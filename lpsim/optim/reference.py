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

from .setup import FP32, Setup
from .step import ADAMW, KAHAN, REMAINDER


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
    lr, decay, b1, omb1, b2, omb2, c1, c2, eps, wd, mu, omd = hp
    w = param.detach().float().clone()     # .float() of a float32 tensor is the tensor
    g = grad.float()
    qs = dict(fmt=s.state_format, rounding=s.state_rounding, seed=seed, sr_bits=s.sr_bits,
              offset=offset)
    if algo == ADAMW:
        m = _f(b1) * state["exp_avg"].float() + _f(omb1) * g
        m = _q(m, stream=streams[1], **qs)
        v = _f(b2) * state["exp_avg_sq"].float() + _f(omb2) * (g * g)
        v = _q(v, stream=streams[2], **qs)
        state["exp_avg"].copy_(m)
        state["exp_avg_sq"].copy_(v)
        u = _f(lr) * ((m / _f(c1)) / (_sqrt(v / _f(c2)) + _f(eps))) + _f(decay) * w
    else:
        g = g + _f(wd) * w
        d = g
        if mu != 0:
            buf = g if first else _f(mu) * state["momentum_buffer"].float() + _f(omd) * g
            buf = _q(buf, stream=streams[1], **qs)
            state["momentum_buffer"].copy_(buf)
            d = g + _f(mu) * buf if nesterov else buf
        u = _f(lr) * d
    if s.update == REMAINDER:
        master = join_remainder(param.detach(), state["remainder"])
        new = _q_update(master.double() - u.double(), FP32, "nearest", seed, streams[0], None,
                        offset, stats).float()
        code, rem = split_remainder(new)
        param.detach().copy_(code)
        state["remainder"].copy_(rem)
        return int(((u != 0) & (_bits(new) == _bits(master))).sum())
    if s.update == KAHAN:
        c = state["kahan_comp"].float()
        y = -u - c
        new = _q_update(w.double() + y.double(), s.weight_format, "nearest", seed, streams[0],
                        None, offset, stats)
        comp = _q((new - w.double()) - y.double(), s.state_format, "nearest", seed, streams[0],
                  None, offset)
        state["kahan_comp"].copy_(comp.float())
    else:
        new = _q_update(w.double() - u.double(), s.weight_format, s.update_rounding, seed,
                        streams[0], s.sr_bits, offset, stats)
    new = new.float()
    param.detach().copy_(new)
    return int(((u != 0) & (_bits(new) == _bits(w))).sum())
