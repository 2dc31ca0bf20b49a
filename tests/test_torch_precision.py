"""Precision assignment (Lee, Sharma and Aiken 2023, Sections 3-4) on tiny CNNs."""

import math
import os

import numpy as np
import pytest

import lpsim

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from lpsim.torch.precision import (Candidates, DynamicLossScaler, PrecisionModel,  # noqa: E402
                                   assign, group_tensors)


def tiny_cnn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(36, 10))


def three_gemm_cnn():
    torch.manual_seed(1)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(128, 16), nn.ReLU(), nn.Linear(16, 10))


def train_step(pm, opt, scaler, x, y):
    opt.zero_grad()
    loss = pm.loss(pm(x), y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    pm.end_step()
    return loss.item()


def test_hooks_see_exactly_the_papers_tensor_set():
    net = tiny_cnn()
    x = torch.randn(2, 1, 8, 8)
    pm = PrecisionModel(net, x, assignment="uniform")
    # n = 5 operators + the loss (m = 6): v_1..v_7, dv_1..dv_7, theta/dtheta of conv, linear
    expected = {
        "v1": [(2, 1, 8, 8)], "v2": [(2, 4, 6, 6)], "v3": [(2, 4, 6, 6)], "v4": [(2, 4, 3, 3)],
        "v5": [(2, 36)], "v6": [(2, 10)], "v7": [()],
        "theta1": [(4, 1, 3, 3), (4,)], "theta5": [(10, 36), (10,)],
    }
    expected.update({"d" + k: v for k, v in list(expected.items())})
    assert {s.name: list(s.shapes) for s in pm.tensors} == expected
    assert len(pm.tensors) == 18
    # one training step with an input that requires grad: every site rounds its tensor once
    xg = x.clone().requires_grad_()
    loss = pm.loss(pm(xg), torch.tensor([3, 7]))
    loss.backward()
    for slot in pm.tensors:
        assert pm.site_stats(slot.name).elements == slot.size, slot.name
    # the operators saw rounded values: the output and the weights are low-format values
    lo = pm.assignment.candidates.lo_forward
    out = pm(x).detach().numpy()
    assert np.array_equal(lpsim.quantize(out, lo), out)
    w = net[0].parametrizations.weight.original.detach().numpy()
    assert np.array_equal(net[0].weight.detach().numpy(), lpsim.quantize(w, lo))
    # the gradient reaching the input is a fp(5,2,0) value
    g = xg.grad.numpy()
    assert np.array_equal(lpsim.quantize(g, "fp(5,2,0)"), g)


def test_grouping_follows_algorithm_1():
    pm = PrecisionModel(three_gemm_cnn(), torch.randn(3, 1, 8, 8), assignment="fp32")
    names = [[s.name for s in g] for g in group_tensors(pm.tensors, pm.ops)]
    # GEMMs are operators 1, 4, 8, 10; a group closes after each, the loss group is last
    assert names[0] == ["v1", "dv1", "theta1", "dtheta1"]
    assert names[1][:4] == ["v2", "dv2", "theta2", "dtheta2"] and names[1][-2:] == ["theta4",
                                                                                  "dtheta4"]
    assert names[-1] == ["v11", "dv11", "v12", "dv12"]
    flat = [n for g in names for n in g]
    assert sorted(flat) == sorted(s.name for s in pm.tensors)    # a partition of TS


@pytest.mark.parametrize("r", [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0])
def test_demotion_respects_r_and_demotes_largest_groups_first(r):
    pm = PrecisionModel(three_gemm_cnn(), torch.randn(3, 1, 8, 8), assignment="ours", r=r)
    pi = pm.assignment
    assert pi.ratio_lo() >= r
    groups = sorted(group_tensors(pm.tensors, pm.ops), key=lambda g: -sum(s.size for s in g))
    low = [all(pi.levels[s.name] == "lo" for s in g) for g in groups]
    mixed = [any(pi.levels[s.name] == "lo" for s in g) for g in groups]
    assert low == mixed                               # whole groups only
    k = sum(low)
    assert low == [True] * k + [False] * (len(groups) - k)   # a prefix of the size order
    if k:                                             # and no more than needed
        total = sum(s.size for s in pm.tensors)
        before = sum(s.size for g in groups[:k - 1] for s in g) / total
        assert before < r
    bits = sum(s.size * (pi.candidates.lo_forward.bits if pi.levels[s.name] == "lo" else 16)
               for s in pm.tensors)
    assert pi.aggregate_bits() == bits


def test_baselines():
    pm = PrecisionModel(three_gemm_cnn(), torch.randn(3, 1, 8, 8), assignment="fp32")
    ts, ops = pm.tensors, pm.ops
    assert assign("fp32", ts, ops).aggregate_bits() == 32 * sum(s.size for s in ts)
    assert assign("uniform", ts, ops).ratio_lo() == 1.0
    assert assign("ours", ts, ops, r=1.0).levels == assign("uniform", ts, ops).levels
    assert assign("ours", ts, ops, r=0.0).ratio_lo() == 0.0
    # Eq. (2): v_i, theta_i, dv_{i+1} of the GEMMs but the first and last (ops 4 and 8)
    assert sorted(assign("operator", ts, ops).low()) == sorted(
        ["v4", "theta4", "dv5", "v8", "theta8", "dv9"])
    with pytest.raises(ValueError, match="unknown assignment 'op'"):
        assign("op", ts, ops)
    with pytest.raises(ValueError, match="r=1.5"):
        assign("ours", ts, ops, r=1.5)
    with pytest.raises(ValueError, match="one low bit width"):
        Candidates(hi="fp(6,9,0)", lo_forward="e4m3", lo_backward="fp16")


def _overflow_run(promote, steps=12):
    torch.manual_seed(2)
    pm = PrecisionModel(three_gemm_cnn(), torch.randn(8, 1, 8, 8), assignment="uniform",
                        promote=promote)
    opt = torch.optim.SGD(pm.parameters(), lr=0.01)
    scaler = DynamicLossScaler()
    x = torch.randn(8, 1, 8, 8) * 100          # far beyond fp(4,3,4)'s max of 15
    y = torch.arange(8) % 10
    losses = [train_step(pm, opt, scaler, x, y) for _ in range(steps)]
    return pm, losses


def test_promotion_fires_and_keeps_training_finite_where_no_promotion_diverges():
    pm, losses = _overflow_run(promote=True)
    assert pm.promotions and pm.promotions[0][0] == 0 and pm.promotions[0][1] == "v1"
    assert all(name.startswith(("v", "theta")) for _, name, _ in pm.promotions)
    assert all(ratio > 0.01 for _, _, ratio in pm.promotions)
    assert all(math.isfinite(v) for v in losses[-4:])
    assert all(bool(torch.isfinite(p).all()) for p in pm.parameters())
    report = pm.report()
    assert report["ratio_lo"] < report["ratio_lo_start"] == 1.0
    assert report["aggregate_bits"] > report["aggregate_bits_start"]
    rows = pm.stats_rows(0)
    assert {r["tensor"] for r in rows} == {s.name for s in pm.tensors}
    assert next(r for r in rows if r["tensor"] == "v1")["overflow_ratio"] > 0.5
    assert "| v1 |" in pm.stats_table(0)

    plain, losses = _overflow_run(promote=False)
    assert not plain.promotions
    assert not any(math.isfinite(v) for v in losses)


def test_loss_scaler():
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=1.0)
    s = DynamicLossScaler(init_scale=4.0, growth_interval=2)
    p.grad = torch.tensor([8.0, 4.0])
    assert s.step(opt) and torch.equal(p.detach(), torch.tensor([-1.0, 0.0])) and s.value == 4
    p.grad = torch.tensor([4.0, 4.0])
    assert s.step(opt) and s.value == 8
    p.grad = torch.tensor([float("inf"), 1.0])
    assert not s.step(opt) and s.value == 4 and torch.equal(p.detach(), torch.tensor([-2., -1.]))
    with pytest.raises(ValueError, match="growth_interval=0"):
        DynamicLossScaler(growth_interval=0)


def test_remove_restores_the_plain_model():
    net = tiny_cnn()
    x = torch.randn(2, 1, 8, 8)
    ref = net(x)
    pm = PrecisionModel(net, x, assignment="uniform")
    assert not torch.equal(pm(x), ref)
    plain = pm.remove()
    assert torch.equal(plain(x), ref)


@pytest.mark.skipif(os.environ.get("LPSIM_TEST_GPU") != "1" or not torch.cuda.is_available(),
                    reason="needs a CUDA GPU and LPSIM_TEST_GPU=1 (sites round in lpsim_cuda)")
def test_precision_model_on_cuda():
    net = three_gemm_cnn().cuda()
    x = torch.randn(8, 1, 8, 8, device="cuda")
    pm = PrecisionModel(net, x, assignment="ours", r=0.75)
    opt = torch.optim.SGD(pm.parameters(), lr=0.01)
    loss = train_step(pm, opt, DynamicLossScaler(), x, torch.arange(8, device="cuda") % 10)
    assert math.isfinite(loss)
    rows = pm.stats_rows(0)
    assert all(r["elements"] == s.size for r, s in zip(rows, pm.tensors) if s.name != "dv1")
    lo = pm.assignment.candidates.lo_forward
    w = net[0].parametrizations.weight.original.detach()
    seen = net[0].weight.detach()
    expected = lpsim.quantize(w.cpu().numpy(), pm.assignment.format("theta1"))
    assert np.array_equal(seen.cpu().numpy(), expected) and lo is not None


def test_wrapping_leaves_batch_norm_statistics_alone():
    net = three_gemm_cnn()
    before = net[1].running_mean.clone(), int(net[1].num_batches_tracked)
    pm = PrecisionModel(net, torch.randn(4, 1, 8, 8) + 3, assignment="fp32")
    assert torch.equal(net[1].running_mean, before[0])
    assert int(net[1].num_batches_tracked) == before[1] and pm.model.training


def test_wrapping_keeps_each_modules_own_mode():
    """A BatchNorm frozen in eval mode inside a model in training stays frozen."""
    net = three_gemm_cnn()
    net[1].eval()
    PrecisionModel(net, torch.randn(4, 1, 8, 8), assignment="uniform")
    assert net.training and not net[1].training and net[3].training


def test_a_deep_copy_rounds_and_counts_on_its_own():
    import copy
    net = tiny_cnn()
    x, y = torch.randn(4, 1, 8, 8), torch.zeros(4, dtype=torch.long)
    plain = copy.deepcopy(net)
    pm = PrecisionModel(net, x, assignment="uniform")
    twin = copy.deepcopy(pm)
    twin.loss(twin(x), y).backward()
    assert twin.site_stats("v1").elements == x.numel() and pm.site_stats("v1").elements == 0
    for name in twin.assignment.levels:         # the copy alone back to fp32
        twin.assignment.levels[name] = "fp32"
    twin._apply_formats()
    with torch.no_grad():
        assert torch.equal(twin(x), plain(x)) and not torch.equal(pm(x), plain(x))
    twin.remove()
    with torch.no_grad():
        assert not torch.equal(pm(x), plain(x))     # the original keeps its hooks
    assert torch.equal(pm.remove()(x), plain(x))


def test_integer_inputs_pass_unrounded_and_unsupported_operators_are_named():
    emb = nn.Sequential(nn.Embedding(4000, 8), nn.Flatten(), nn.Linear(16, 10))
    ids = torch.tensor([[1025, 3001]])
    seen = []
    emb[0].register_forward_pre_hook(lambda mod, args: seen.append(args[0].clone()))
    pm = PrecisionModel(emb, ids, assignment="operator")
    pm(ids)
    assert torch.equal(seen[-1], ids)
    lstm = nn.Sequential(nn.LSTM(4, 4))
    with pytest.raises(ValueError, match=r"operator '0' \(LSTM\) returns a tuple"):
        PrecisionModel(lstm, torch.randn(3, 2, 4))
    assert not lstm[0]._forward_hooks
    normed = tiny_cnn()
    nn.utils.parametrizations.weight_norm(normed[4])
    with pytest.raises(ValueError, match=r"module '4' has parametrized \['weight'\]"):
        PrecisionModel(normed, torch.randn(2, 1, 8, 8))


def test_the_default_loss_scaler_steps_a_well_behaved_model_every_step():
    """Growth every step skipped every other step: 2^16 overflows fp(5,2,0)'s 57344 in the
    scaled loss gradient, the scale halves, grows again, ...  Now only the first step is
    skipped (the paper's initial 2^16), then the scale stays at 2^15 for 2000 steps."""
    net = tiny_cnn()
    x, y = torch.randn(8, 1, 8, 8), torch.arange(8) % 10
    pm = PrecisionModel(net, x, assignment="uniform")
    opt, scaler = torch.optim.SGD(pm.parameters(), lr=0.01), DynamicLossScaler()
    stepped = []
    for _ in range(8):
        opt.zero_grad()
        scaler.scale(pm.loss(pm(x), y)).backward()
        stepped.append(scaler.step(opt))
        pm.end_step()
    assert stepped == [False] + [True] * 7 and scaler.value == 2.0 ** 15


def test_site_stats_names_an_unknown_tensor():
    """It stripped the name's first character and looked that up: 'weight' gave
    KeyError: 'eight'."""
    pm = PrecisionModel(nn.Sequential(nn.Linear(4, 3)), torch.randn(2, 4))
    for name in ("weight", "v9", "x", "d"):
        with pytest.raises(KeyError, match=rf"no tensor '{name}' in this model; accepted: a "
                                           r"name of self\.tensors \(v1, dv1"):
            pm.site_stats(name)
    for slot in pm.tensors:
        assert pm.site_stats(slot.name).elements == 0


@pytest.mark.parametrize("theta, error", [("0.01", TypeError), (None, TypeError),
                                          (True, TypeError), (1.0, ValueError)])
def test_theta_is_refused_by_name(theta, error):
    """A string or None once failed in a bare comparison that named nothing."""
    with pytest.raises(error, match=f"theta={theta!r}"):
        PrecisionModel(nn.Linear(2, 2), torch.randn(1, 2), theta=theta)


@pytest.mark.parametrize("r, same", [(np.float32(0.5), 0.5), (np.float64(0.75), 0.75),
                                     (np.int64(1), 1.0), (np.int8(0), 0.0)])
def test_r_takes_numpy_numbers(r, same):
    """A numpy float or integer in [0, 1] was refused as 'must be a number in [0, 1]'."""
    x = torch.randn(3, 1, 8, 8)
    got = PrecisionModel(three_gemm_cnn(), x, r=r).assignment.levels
    assert got == PrecisionModel(three_gemm_cnn(), x, r=same).assignment.levels


@pytest.mark.parametrize("r, error", [(True, TypeError), (np.bool_(False), TypeError),
                                      ("0.5", TypeError), (None, TypeError),
                                      (np.float32(1.5), ValueError), (-0.25, ValueError),
                                      (float("nan"), ValueError)])
def test_r_is_refused_by_name(r, error):
    with pytest.raises(error, match="r="):
        PrecisionModel(three_gemm_cnn(), torch.randn(3, 1, 8, 8), r=r)


@pytest.mark.parametrize("name, value, error", [
    ("init_scale", float("inf"), ValueError), ("init_scale", float("nan"), ValueError),
    ("init_scale", 0.0, ValueError), ("init_scale", -1.0, ValueError),
    ("init_scale", 10 ** 400, ValueError), ("init_scale", "1", TypeError),
    ("init_scale", True, TypeError), ("growth_factor", float("inf"), ValueError),
    ("growth_factor", float("nan"), ValueError), ("growth_factor", 0.5, ValueError),
    ("growth_factor", None, TypeError), ("backoff_factor", 1.0, ValueError),
    ("backoff_factor", 0.0, ValueError), ("backoff_factor", float("nan"), ValueError),
    ("backoff_factor", True, TypeError), ("growth_interval", 2.0, ValueError),
    ("growth_interval", 0, ValueError), ("growth_interval", True, ValueError),
], ids=lambda v: str(v)[:12])
def test_loss_scaler_refuses_bad_arguments_by_name(name, value, error):
    """init_scale=inf was taken, and then every step was skipped (inf * 0.5 = inf); a NaN
    passed the comparisons too.  numpy numbers are taken as numbers."""
    with pytest.raises(error, match=f"{name}="):
        DynamicLossScaler(**{name: value})
    s = DynamicLossScaler(init_scale=np.float32(8), growth_factor=np.int64(2),
                          backoff_factor=np.float64(0.25), growth_interval=np.int32(3))
    assert (s.value, s.growth_factor, s.backoff_factor, s.growth_interval) == (8, 2, 0.25, 3)
    assert type(s.value) is float and type(s.growth_interval) is int
