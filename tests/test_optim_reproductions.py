"""The papers' small experiments, shrunk to test size (full runs: examples/optim_papers.py).

SR paper Section 2.2 / Appendix C: a linear loss under Adam with a decaying learning rate;
BF16 SR updates take much longer than FP32 to reach x = 3 at minimum LR 1e-5, about as long
at 5e-5.  BF16 paper Section 3, Figure 2: 10-dimensional least squares, SGD at LR 0.01,
batch 1: nearest-rounded bf16 updates stall far above FP32, SR and Kahan stay near it.
Both are seeded, so they are deterministic; the margins are stated next to each assert.
"""

import math

import pytest
import numpy as np
import torch

from lpsim.optim import SGD, AdamW

#: cosine decay from LR_MAX to the minimum over DECAY steps, then constant; LR_MAX makes
#: the FP32 run reach x = 3 at step 4,600 (the paper's FP32 figure) for minimum LR 1e-5
LR_MAX, DECAY = 3.92e-4, 5000


def toy_steps(dtype, update, lr_min, runs, cap, seed=0):
    """Steps until each of ``runs`` independent x (elements of one tensor) reaches 3;
    f(x) = -(x - 2) + 1 for x < 3, else 0, from x0 = 2; unfinished runs count as cap."""
    x = torch.nn.Parameter(torch.full((runs,), 2.0, dtype=dtype))
    opt = AdamW([x], lr=LR_MAX, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                update_rounding=update, state_format="fp32", seed=seed)
    hit = torch.full((runs,), cap)
    for t in range(cap):
        opt.param_groups[0]["lr"] = lr_min + 0.5 * (LR_MAX - lr_min) * (
            1 + math.cos(math.pi * min(t, DECAY) / DECAY))
        below = x.detach() < 3
        x.grad = torch.where(below, -1.0, 0.0).to(dtype)
        opt.step()
        hit = torch.where(below & (x.detach() >= 3), torch.full_like(hit, t + 1), hit)
        if (x.detach() >= 3).all():
            break
    return hit.double()


@pytest.mark.slow
def test_sr_paper_toy_needs_larger_learning_rates():
    fp32 = {lr: toy_steps(torch.float32, "nearest", lr, 1, 20000)[0].item()
            for lr in (1e-5, 5e-5)}
    assert 4550 <= fp32[1e-5] <= 4650                        # the paper: 4,600
    slow = toy_steps(torch.bfloat16, "stochastic", 1e-5, 64, 15000, seed=1)
    fast = toy_steps(torch.bfloat16, "stochastic", 5e-5, 64, 15000, seed=2)
    se = lambda h: h.std().item() / math.sqrt(h.numel())
    # measured (seeded): slow mean 6,901 (SE 587; capped at 15,000, the paper's 7,700 is
    # uncapped), fast mean ~3,900 (SE ~270): SR at minimum LR 1e-5 is slower than FP32 by
    # more than 3 SE; at 5e-5 it is within 25% of FP32's 4,600 and faster than at 1e-5 by
    # more than 3 SE of the difference
    assert slow.mean().item() - fp32[1e-5] > 3 * se(slow)
    assert abs(fast.mean().item() - fp32[1e-5]) < 0.25 * fp32[1e-5]
    assert slow.mean().item() - fast.mean().item() > 3 * math.hypot(se(slow), se(fast))
    assert (slow >= 15000).sum() < 16                        # most runs did finish


def least_squares(dtype, update, steps=3000, d=10, seed=0, opt_seed=None):
    """Final training loss (mean of the last 4 evaluations on 1,000 samples); data from
    ``seed``, the optimizer's random bits from ``opt_seed`` (default: ``seed``)."""
    gen = torch.Generator().manual_seed(seed)
    w_star = torch.rand(d, generator=gen) * 100
    X = torch.randn(steps, d, generator=gen)
    y = X @ w_star + 0.5 * torch.randn(steps, generator=gen)
    Xe = torch.randn(1000, d, generator=gen)
    ye = Xe @ w_star + 0.5 * torch.randn(1000, generator=gen)
    w = torch.nn.Parameter(torch.zeros(d, dtype=dtype))
    opt = SGD([w], lr=0.01, update_rounding=update, state_format="fp32",
              seed=seed if opt_seed is None else opt_seed)
    losses = []
    for t in range(steps):
        r = X[t] @ w.detach().float() - y[t]
        w.grad = (r * X[t]).to(dtype)
        opt.step()
        if t >= steps - 400 and t % 100 == 99:
            losses.append(0.5 * ((Xe @ w.detach().float() - ye) ** 2).mean().item())
    return sum(losses) / len(losses), opt.cancelled_updates


def test_bf16_paper_least_squares():
    fp32, _ = least_squares(torch.float32, "nearest")
    nearest, cancelled = least_squares(torch.bfloat16, "nearest")
    # SR's final loss varies from run to run (over 12 seeds: mean 0.60, sd 0.18, one run at
    # 1.13), so the test takes the mean of 8 runs (SE about 0.065): its bounds are 6 and 4 SE
    # away, no single seed's luck decides it
    sr = np.mean([least_squares(torch.bfloat16, "stochastic", opt_seed=s)[0]
                  for s in range(8)])
    kahan, _ = least_squares(torch.bfloat16, "kahan")
    # measured: fp32 0.127 (the label noise floor is 0.125), nearest 3.40, sr 0.60, kahan 0.198
    assert nearest > 10 * fp32
    assert cancelled > 0.5 * 3000 * 10                      # most nearest updates cancelled
    assert sr < 8 * fp32 and kahan < 2 * fp32
    assert sr < nearest / 4 and kahan < nearest / 10


@pytest.mark.parametrize("update", ["stochastic", "kahan"])
def test_seeded_runs_replay_bit_identically(update):
    """Same run twice: the losses are bit-identical (seeded randomness, no hidden state)."""
    assert least_squares(torch.bfloat16, update, steps=300) == \
        least_squares(torch.bfloat16, update, steps=300)
