"""lpsim.optim: fused kernel == reference bit for bit, the papers' lines against exact
arithmetic, weight decay, state dicts, master weights, memory, counters and input errors."""

import copy
import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from lpsim.optim import SGD, AdamW, stream
from lpsim.philox import random_words
from lpsim.reference import round_exact

BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def bits(t):
    return t.detach().view(BITS.get(t.dtype, t.dtype)) if t.dtype in BITS else t.detach()


def run(make, dtype, steps=4, n=23, seed=3, grads=None):
    """Train one parameter of n elements for ``steps`` steps; returns (param, opt)."""
    torch.manual_seed(seed)
    p = torch.nn.Parameter(torch.randn(n).to(dtype))
    opt = make([p])
    gen = torch.Generator().manual_seed(seed + 1)
    for _ in range(steps):
        p.grad = (torch.randn(n, generator=gen) if grads is None else grads()).to(dtype)
        opt.step()
    return p, opt


def assert_same(a, b):
    (pa, oa), (pb, ob) = a, b
    assert torch.equal(bits(pa), bits(pb))
    sa, sb = oa.state[pa], ob.state[pb]
    assert sa.keys() == sb.keys()
    for key in sa:
        if torch.is_tensor(sa[key]):
            assert torch.equal(bits(sa[key]), bits(sb[key])), key
        else:
            assert sa[key] == sb[key], key
    assert oa.update_stats == ob.update_stats
    assert oa.cancelled_updates == ob.cancelled_updates


CASES = [(dtype, update, srnd)
         for dtype in (torch.float32, torch.bfloat16, torch.float16)
         for update in ("nearest", "stochastic", "kahan", "remainder")
         for srnd in ("nearest", "stochastic")
         if update != "remainder" or dtype == torch.bfloat16]


@pytest.mark.parametrize("dtype,update,srnd", CASES)
@pytest.mark.parametrize("algo", ["adamw", "sgd"])
def test_fused_equals_reference(dtype, update, srnd, algo):
    def make(impl):
        kw = dict(update_rounding=update, state_rounding=srnd, seed=11, implementation=impl)
        if algo == "adamw":
            return lambda ps: AdamW(ps, lr=3e-2, weight_decay=0.1, **kw)
        return lambda ps: SGD(ps, lr=3e-2, momentum=0.9, nesterov=True, weight_decay=0.1, **kw)
    assert_same(run(make("reference"), dtype), run(make("fused"), dtype))


@pytest.mark.parametrize("kw", [dict(sr_bits=4), dict(weight_format="fp(5,4)",
                                                         state_format="fp(6,5)"),
                                dict(momentum=0.0), dict(momentum=0.5, dampening=0.25)])
def test_fused_equals_reference_options(kw):
    algo = SGD if "momentum" in kw else AdamW
    def make(impl):
        return lambda ps: algo(ps, lr=1e-1, update_rounding="stochastic",
                               state_rounding="stochastic", seed=5, implementation=impl, **kw)
    assert_same(run(make("reference"), torch.float32, steps=3),
                run(make("fused"), torch.float32, steps=3))


@pytest.mark.parametrize("update", ["nearest", "stochastic", "kahan"])
def test_fused_counts_the_slow_pass_like_the_reference(update):
    """Weights in the format's subnormal range leave the vectorised pass for round_bits; the
    counters of both passes must add up (they once lost the slow pass's inexact elements)."""
    def make(impl):
        return lambda ps: AdamW(ps, lr=1e-4, weight_format="fp(5,6)", update_rounding=update,
                                sr_bits=5, seed=5, implementation=impl)
    scaled = torch.randn(4096, generator=torch.Generator().manual_seed(1)) * 2.0 ** -13
    runs = []
    for impl in ("reference", "fused"):
        p, opt = run(make(impl), torch.float32, steps=2, n=4096)
        with torch.no_grad():
            p.copy_(scaled)
        p.grad = torch.randn(4096, generator=torch.Generator().manual_seed(2))
        opt.step()
        runs.append((p, opt))
    stats = runs[0][1].update_stats.as_dict()
    assert stats["subnormal"] > 100 and stats["inexact"] > stats["subnormal"]
    assert_same(*runs)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fused_bf16_moments_equal_the_reference_on_extreme_gradients(dtype):
    """bfloat16 AdamW states to nearest take one fused loop from their codes to their codes
    (lpsim.optim.cpu._moments_bf16: decode, moments, nearest_bf16, encode) and round_bits
    where it declines: gradients of inf, NaN, near float32's largest value, subnormal and
    zero (moments past bfloat16's largest value and below its smallest) give the
    reference's moments, weights and counters bit for bit, NaNs too, over several chunks;
    bfloat16 gradients, and float32 ones (float32 parameters with bfloat16 states)."""
    n = 2 * 4096 + 4099
    gen = torch.Generator().manual_seed(9)
    special = torch.tensor([float("inf"), float("-inf"), float("nan"), 3.3e38, -3.3e38, 1e-40,
                            -1e-45, 0.0, -0.0, 6e19, 1.7e19, -2e-20])

    def grads():
        g = torch.randn(n, generator=gen) * torch.exp2(torch.randint(-130, 128, (n,),
                                                                     generator=gen).float())
        g[:special.numel()] = special
        g[5000:5000 + special.numel()] = special            # a later chunk too
        return g

    runs = []
    for impl in ("reference", "fused"):
        make = lambda ps: AdamW(ps, lr=1e-3, weight_decay=0.1, seed=3, implementation=impl,
                                state_format="bf16")
        gen.manual_seed(9)
        runs.append(run(make, dtype, steps=3, n=n, grads=grads))
    (pr, orf), (pf, ofu) = runs
    assert orf.state[pr]["exp_avg"].dtype == torch.bfloat16
    assert orf.update_stats == ofu.update_stats
    assert orf.cancelled_updates == ofu.cancelled_updates
    for key in ("exp_avg", "exp_avg_sq"):
        assert torch.equal(bits(orf.state[pr][key]), bits(ofu.state[pf][key])), key
        assert torch.isinf(orf.state[pr][key]).any() or key == "exp_avg_sq"
    assert torch.isnan(pr.detach()).any()
    assert torch.equal(bits(pr), bits(pf))


@pytest.mark.parametrize("dtype,update,srnd", CASES)
@pytest.mark.parametrize("algo", ["adamw", "sgd"])
def test_fused_equals_reference_on_nan_and_inf_gradients(dtype, update, srnd, algo):
    """NaN and inf gradients give NaN weights and states of the same codes on both paths: the
    reference once stored them with torch's casts, whose NaN code depends on the path torch
    takes (0xFFFF vectorised, 0x7FC0 scalar for bfloat16), where the kernels keep the float32
    NaN's top half (bfloat16) or lpsim.storage's code (float16)."""
    special = torch.tensor([float("nan"), float("inf"), float("-inf"), -float("nan")])

    def grads():
        g = torch.randn(23, generator=torch.Generator().manual_seed(4))
        g[3:7], g[15:19] = special, special.flip(0)
        return g

    def make(impl):
        kw = dict(update_rounding=update, state_rounding=srnd, seed=11, implementation=impl)
        if algo == "adamw":
            return lambda ps: AdamW(ps, lr=3e-2, weight_decay=0.1, **kw)
        return lambda ps: SGD(ps, lr=3e-2, momentum=0.9, weight_decay=0.1, **kw)
    ref, fused = (run(make(impl), dtype, steps=2, grads=grads)
                  for impl in ("reference", "fused"))
    assert torch.isnan(ref[0].detach()).sum() >= 8
    assert_same(ref, fused)


# -- the papers' lines against exact arithmetic ------------------------------------------

def f32(x):
    """The IEEE float32 rounding of an exact value (each line of the algorithms)."""
    return round_exact(Fraction(x), "fp32").value if x != 0 else Fraction(0)


def uniform_w(seed, step, index, i):
    """The uniform of element i's weight update (lpsim.optim.keys: a 32-bit word)."""
    return Fraction(random_words(1, 4, seed, stream(step, index, 0), i)[0], 2 ** 32)


def sqrt32(x):
    # float64 sqrt rounded to float32 is the correctly rounded float32 sqrt (53 >= 2*24+2)
    return Fraction(float(np.float32(math.sqrt(float(x)))))


def test_adamw_stochastic_lines_exact():
    """SR paper Algorithm 1 / BF16 paper Algorithm 4 on 6 scalars for 3 steps, every line
    evaluated exactly and rounded (float32 ops, bf16 nearest states, exact SR of w - u)."""
    n, seed, lr, wd, b1, b2, eps = 6, 9, 0.05, 0.1, 0.9, 0.999, 1e-8
    w0 = torch.tensor([1.0, -0.3, 2.5, 1e-3, -7.0, 0.125]).to(torch.bfloat16)
    p = torch.nn.Parameter(w0.clone())
    opt = AdamW([p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd,
                update_rounding="stochastic", seed=seed)
    g_all = torch.randn(3, n, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    F = lambda x: Fraction(float(np.float32(x)))      # the float32 scalars the step takes
    w = [Fraction(float(x)) for x in w0]
    m = [Fraction(0)] * n
    v = [Fraction(0)] * n
    for t in range(1, 4):
        p.grad = g_all[t - 1].clone()
        opt.step()
        c1, c2 = F(1 - b1 ** t), F(1 - b2 ** t)
        for i in range(n):
            g = Fraction(float(g_all[t - 1, i]))
            m[i] = Fraction(round_exact(f32(f32(F(b1) * m[i]) + f32(F(1 - b1) * g)),
                                        "bf16").value)
            v[i] = Fraction(round_exact(f32(f32(F(b2) * v[i]) + f32(F(1 - b2) * f32(g * g))),
                                        "bf16").value)
            mh = f32(m[i] / c1)
            vh = sqrt32(f32(v[i] / c2))
            u = f32(f32(F(lr) * f32(mh / f32(vh + F(eps)))) + f32(F(lr * wd) * w[i]))
            w[i] = Fraction(round_exact(w[i] - u, "bf16", "stochastic",
                                        uniform=uniform_w(seed, t, 0, i)).value)
    assert [Fraction(float(x)) for x in p.detach()] == w


def test_sgd_kahan_lines_exact():
    """BF16 paper Algorithm 3 (SGD, momentum, Kahan) on 5 scalars for 4 steps, exactly."""
    n, lr, mu, wd = 5, 0.01, 0.9, 0.01
    w0 = torch.tensor([1.0, 3.0, -0.5, 100.0, 0.01]).to(torch.bfloat16)
    p = torch.nn.Parameter(w0.clone())
    opt = SGD([p], lr=lr, momentum=mu, weight_decay=wd, update_rounding="kahan", seed=1)
    gen = torch.Generator().manual_seed(2)
    F = lambda x: Fraction(float(np.float32(x)))
    bf = lambda x: Fraction(round_exact(x, "bf16").value) if x != 0 else Fraction(0)
    w = [Fraction(float(x)) for x in w0]
    buf, c = [Fraction(0)] * n, [Fraction(0)] * n
    for t in range(1, 5):
        grad = (torch.randn(n, generator=gen) * 0.1).to(torch.bfloat16)
        p.grad = grad.clone()
        opt.step()
        for i in range(n):
            g = f32(Fraction(float(grad[i])) + f32(F(wd) * w[i]))          # line 4
            buf[i] = bf(g if t == 1 else f32(f32(F(mu) * buf[i]) + f32(F(1) * g)))  # line 5
            u = -f32(F(lr) * buf[i])                                         # line 6
            y = f32(u - c[i])                                                # line 7
            s = bf(w[i] + y)                                                 # line 8
            c[i] = bf((s - w[i]) - y)                                        # line 9
            w[i] = s                                                         # line 10
    assert [Fraction(float(x)) for x in p.detach()] == w
    assert [Fraction(float(x)) for x in opt.state[p]["kahan_comp"]] == c


# -- behaviour ---------------------------------------------------------------------------

def test_bf16_weight_decay_is_not_a_no_op():
    """Zero gradients, lr*wd = 1e-4: nearest cancels every decay (counted), SR decays.

    E[w_N] = w_0 (1 - lr wd)^N; the SR errors are martingale increments bounded by one
    quantum q = 2**-8, so by Azuma-Hoeffding the mean of 2000 elements after N = 100 steps
    is within 1.1 q of it except with probability 2 exp(-2 (1.1)^2 2000 / 100) < 1e-10.
    """
    n, steps = 2000, 100
    out = {}
    for mode in ("nearest", "stochastic"):
        p = torch.nn.Parameter(torch.full((n,), 0.9921875, dtype=torch.bfloat16))  # 1 - 2**-7
        opt = AdamW([p], lr=1e-3, weight_decay=0.1, update_rounding=mode, seed=4)
        for _ in range(steps):
            p.grad = torch.zeros_like(p)
            opt.step()
        out[mode] = (p.detach().float().mean().item(), opt.cancelled_updates)
    assert out["nearest"] == (0.9921875, n * steps)
    expect = 0.9921875 * (1 - 1e-4) ** steps
    assert abs(out["stochastic"][0] - expect) < 1.1 * 2 ** -8
    assert 0.9921875 - out["stochastic"][0] > 0.5 * (0.9921875 - expect)


def test_state_dict_round_trip_resumes_bit_identically():
    make = lambda ps: AdamW(ps, lr=1e-2, update_rounding="stochastic",
                            state_rounding="stochastic", seed=21)
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(40, generator=gen).to(torch.bfloat16) for _ in range(6)]
    p = torch.nn.Parameter(torch.randn(40, generator=gen).to(torch.bfloat16))
    q = torch.nn.Parameter(p.detach().clone())
    a = make([p])
    for g in grads[:3]:
        p.grad = g.clone()
        a.step()
    saved = copy.deepcopy(a.state_dict())       # as torch.save / torch.load would
    q.data.copy_(p.detach())
    b = AdamW([q], lr=0.5, seed=999)             # options come back from the state dict
    b.load_state_dict(saved)
    for g in grads[3:]:
        p.grad, q.grad = g.clone(), g.clone()
        a.step()
        b.step()
    assert torch.equal(bits(p), bits(q))
    assert torch.equal(bits(a.state[p]["exp_avg_sq"]), bits(b.state[q]["exp_avg_sq"]))


@pytest.mark.parametrize("update", ["stochastic", "kahan", "remainder"])
def test_fused_steps_follow_replaced_storage_and_state(update):
    """The fused route keeps numpy views of each parameter and its states between steps; a
    parameter whose storage is reassigned (module.to(), p.data = ...) or a state replaced by
    load_state_dict must be stepped where it now lives, as the reference route does."""
    torch.manual_seed(3)
    w = torch.randn(300).to(torch.bfloat16)
    p1, p2 = torch.nn.Parameter(w.clone()), torch.nn.Parameter(w.clone())
    kw = dict(lr=1e-2, update_rounding=update, seed=5)
    fused, ref = AdamW([p1], **kw), AdamW([p2], implementation="reference", **kw)
    for step in range(7):
        g = torch.randn(300).to(torch.bfloat16)
        p1.grad, p2.grad = g.clone(), g.clone()
        if step == 2:
            p1.data, p2.data = p1.data.clone(), p2.data.clone()
        if step == 4:
            fused.load_state_dict(copy.deepcopy(fused.state_dict()))
            ref.load_state_dict(copy.deepcopy(ref.state_dict()))
        fused.step()
        ref.step()
        assert torch.equal(p1.view(torch.int16), p2.view(torch.int16)), step
        for name, value in ref.state[p2].items():
            if torch.is_tensor(value):
                assert torch.equal(fused.state[p1][name], value), (step, name)


def test_load_master_weights_keeps_the_fp32_master():
    w32 = torch.randn(64, generator=torch.Generator().manual_seed(3))
    p = torch.nn.Parameter(torch.zeros(64, dtype=torch.bfloat16))
    opt = AdamW([p], update_rounding="remainder")
    opt.load_master_weights([w32])
    from lpsim.optim.reference import join_remainder
    assert torch.equal(join_remainder(p.detach(), opt.state[p]["remainder"]), w32)
    assert torch.equal(p.detach(), w32.to(torch.bfloat16))
    q, r = (torch.nn.Parameter(torch.zeros(64, dtype=torch.bfloat16)) for _ in range(2))
    kahan = AdamW([{"params": [q]}, {"params": [r]}], update_rounding="kahan",
                  state_format="fp32")
    kahan.load_master_weights([w32, -w32])
    assert torch.equal(q.detach().float() - kahan.state[q]["kahan_comp"], w32)
    assert torch.equal(r.detach().float() - kahan.state[r]["kahan_comp"], -w32)


@pytest.mark.parametrize("weights, error, match", [
    (lambda: [torch.full((4,), 1.2345678), torch.ones(5)], ValueError,
     r"master weight 1 has shape \(5,\), its parameter \(3,\)"),
    (lambda: [torch.ones(4), "x"], TypeError, "master weight 1 is str; accepted"),
    (lambda: [torch.ones(4), torch.ones(3, dtype=torch.int32)], TypeError,
     "master weight 1 is torch.int32"),
    (lambda: [torch.ones(4), torch.full((3,), 0.1, dtype=torch.float64)], ValueError,
     "master weight 1 is float64 with values float32 does not hold")])
def test_a_refused_load_master_weights_changes_nothing(weights, error, match):
    """Every weight is checked before any parameter or state is written: a bad second
    weight once left the first parameter and its remainder already set."""
    a, b = (torch.nn.Parameter(torch.zeros(n, dtype=torch.bfloat16)) for n in (4, 3))
    opt = AdamW([a, b], update_rounding="remainder")
    with pytest.raises(error, match=match):
        opt.load_master_weights(weights())
    assert torch.equal(a.detach(), torch.zeros(4, dtype=torch.bfloat16)) and not opt.state
    opt.load_master_weights([torch.ones(4), torch.full((3,), 0.5, dtype=torch.float64)])
    assert torch.equal(b.detach().float(), torch.full((3,), 0.5))


@pytest.mark.parametrize("dtype,kw,expect", [
    (torch.bfloat16, dict(update_rounding="stochastic"), 6),
    (torch.bfloat16, dict(update_rounding="kahan"), 8),
    (torch.bfloat16, dict(update_rounding="remainder"), 8),
    (torch.float32, dict(), 12),
    (torch.bfloat16, dict(state_format="fp32", update_rounding="stochastic"), 10),
])
def test_memory_bytes(dtype, kw, expect):
    p = torch.nn.Parameter(torch.zeros(10, dtype=dtype))
    opt = AdamW([p], **kw)
    assert opt.memory_bytes() == expect
    p.grad = torch.ones_like(p)
    opt.step()
    held = p.element_size() + sum(s.element_size() for s in opt.state[p].values()
                                  if torch.is_tensor(s))
    assert held == expect


def test_close_to_torch_in_fp32():
    """FP32 weights and states with nearest rounding are torch.optim's algorithms up to the
    order of float32 operations (torch's AdamW: lerp and w *= 1 - lr wd)."""
    for ours, theirs, kw in [(AdamW, torch.optim.AdamW, dict(weight_decay=0.1)),
                             (SGD, torch.optim.SGD, dict(momentum=0.9, nesterov=True,
                                                         weight_decay=0.1))]:
        p = torch.nn.Parameter(torch.randn(100, generator=torch.Generator().manual_seed(1)))
        q = torch.nn.Parameter(p.detach().clone())
        a, b = ours([p], lr=1e-2, **kw), theirs([q], lr=1e-2, **kw)
        gen = torch.Generator().manual_seed(2)
        for _ in range(20):
            g = torch.randn(100, generator=gen)
            p.grad, q.grad = g.clone(), g.clone()
            a.step()
            b.step()
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6)


def test_lr_scheduler_and_param_groups():
    p = torch.nn.Parameter(torch.ones(4))
    q = torch.nn.Parameter(torch.ones(4))
    opt = SGD([{"params": [p]}, {"params": [q], "lr": 0.0}], lr=0.5)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    for expect in (0.5, 0.75):
        p.grad, q.grad = torch.ones(4), torch.ones(4)
        opt.step()
        sched.step()
        assert torch.equal(p.detach(), torch.full((4,), 1 - expect))
    assert torch.equal(q.detach(), torch.ones(4))
    opt.zero_grad()
    assert p.grad is None


def test_randomness_is_keyed_by_step_and_position():
    """Two parameters with equal values and gradients round differently (position), and
    one parameter's bits change from step to step (no key reused)."""
    p, q = (torch.nn.Parameter(torch.ones(256, dtype=torch.bfloat16)) for _ in range(2))
    opt = SGD([p, q], lr=2 ** -10, update_rounding="stochastic", seed=0)
    changed = []
    for _ in range(2):
        p.grad, q.grad = torch.ones_like(p), torch.ones_like(q)
        before = p.detach().clone()
        opt.step()
        changed.append(p.detach() != before)
    assert not torch.equal(p.detach(), q.detach())
    assert not torch.equal(changed[0], changed[1])


@pytest.mark.parametrize("kw,error,match", [
    (dict(update_rounding="sr"), ValueError, "update_rounding"),
    (dict(state_rounding="up"), ValueError, "state_rounding"),
    (dict(weight_format="fp(9,x)"), ValueError, "fp"),
    (dict(sr_bits=0), ValueError, "sr_bits"),
    (dict(sr_bits=2.5), TypeError, "sr_bits"),
    (dict(seed=-1), ValueError, "seed"),
    (dict(lr=-1.0), ValueError, "lr"),
    (dict(betas=(0.9, 1.0)), ValueError, "betas"),
    (dict(implementation="cuda"), ValueError, "implementation"),
])
def test_bad_options(kw, error, match):
    with pytest.raises(error, match=match):
        AdamW([torch.nn.Parameter(torch.zeros(2))], **kw)


def test_bad_parameters():
    p = torch.nn.Parameter(torch.zeros(2))
    r = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    r.grad = torch.zeros(2, dtype=torch.float64)
    with pytest.raises(TypeError, match="float64"):
        SGD([r]).step()
    with pytest.raises(ValueError, match="nesterov"):
        SGD([p], nesterov=True)


def test_a_parameter_listed_twice_is_refused():
    """torch only warns; stepping it twice per step (two keys, two step counts) would differ
    between the multi-tensor and per-tensor routes, so lpsim refuses it by name."""
    p, q = torch.nn.Parameter(torch.randn(3)), torch.nn.Parameter(torch.randn(2))
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="parameter 2 .* twice"):
        AdamW([q, p, p])
    opt = SGD([q], lr=0.1)
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="listed twice"):
        opt.add_param_group({"params": [p, p]})
    assert len(opt.param_groups) == 1


# -- options and states changed between steps -----------------------------------------------

ROUTES = [dict(implementation="fused", foreach=True), dict(implementation="fused",
                                                           foreach=False),
          dict(implementation="reference")]


@pytest.mark.parametrize("change", [("momentum", 0.9), ("update_rounding", "kahan"),
                                    ("update_rounding", "remainder")])
def test_an_option_turned_on_mid_run_starts_its_state_at_zero(change):
    """Momentum warm-up, or Kahan / remainder switched on: the state it needs starts at zero
    on every route (the fused kernels wrote past a 1-element stand-in before: heap
    corruption), and the routes agree bit for bit."""
    name, value = change
    runs = []
    for route in ROUTES:
        torch.manual_seed(0)
        p = torch.nn.Parameter(torch.randn(3000).to(torch.bfloat16))
        opt = (SGD([p], lr=0.1, seed=2, **route) if name == "momentum"
               else AdamW([p], lr=1e-2, seed=2, **route))
        gen = torch.Generator().manual_seed(1)
        for i in range(3):
            p.grad = torch.randn(3000, generator=gen).to(torch.bfloat16)
            if i == 1:
                opt.param_groups[0][name] = value
            opt.step()
        runs.append((p, opt))
    state = runs[0][1].state[runs[0][0]]
    extra = {0.9: "momentum_buffer", "kahan": "kahan_comp", "remainder": "remainder"}[value]
    assert state[extra].numel() == 3000 and state[extra].abs().sum() > 0
    for other in runs[1:]:
        assert_same(runs[0], other)


@pytest.mark.parametrize("route", ROUTES, ids=["foreach", "per-tensor", "reference"])
@pytest.mark.parametrize("bad, match", [
    (lambda st, p: st.__setitem__("exp_avg", torch.zeros(100)), "holds 100 elements"),
    (lambda st, p: st.__setitem__("exp_avg", st["exp_avg"].bfloat16()), "torch.bfloat16"),
    (lambda st, p: st.__setitem__("exp_avg_sq", torch.zeros(200, 2)[:, 0]), "not contiguous"),
    (lambda st, p: st.__setitem__("exp_avg", None), "holds a NoneType"),
    (lambda st, p: st.__setitem__("step", 2.5), "'step' is 2.5")])
def test_a_state_that_does_not_fit_its_parameter_is_refused(route, bad, match):
    """A checkpoint of another model or a parameter whose dtype changed: a ValueError naming
    the state (the kernels indexed it as the parameter: out-of-bounds writes), nothing
    stepped, the step count kept."""
    p = torch.nn.Parameter(torch.randn(200))
    opt = AdamW([p], lr=1e-2, seed=2, **route)
    p.grad = torch.randn(200)
    opt.step()
    before = p.detach().clone()
    bad(opt.state[p], p)
    with pytest.raises(ValueError, match=match):
        opt.step()
    assert torch.equal(p.detach(), before) and opt.state[p]["step"] in (1, 2.5)


@pytest.mark.parametrize("option, value, match", [
    ("update_rounding", "Stochastic", "unknown update_rounding"),
    ("implementation", "referense", "unknown implementation"),
    ("state_rounding", "up", "unknown state_rounding"), ("foreach", "no", "not a bool"),
    ("sr_bits", 0, "sr_bits=0 is out of range"), ("sr_bits", 99, "out of range"),
    ("seed", -1, "seed=-1")])
def test_group_options_are_checked_at_every_step(option, value, match):
    """param_groups are dicts a user changes: sr_bits=-3 gave wrong weights in the fused
    kernel, 'referense' ran fused and state_rounding='up' ran nearest, silently."""
    p, q = torch.nn.Parameter(torch.randn(5)), torch.nn.Parameter(torch.randn(5))
    opt = AdamW([p], lr=1e-2, seed=2)
    p.grad = torch.randn(5)
    opt.param_groups[0][option] = value
    with pytest.raises((ValueError, TypeError), match=match):
        opt.step()
    assert opt.state[p] == {}
    with pytest.raises((ValueError, TypeError), match=match):
        opt.add_param_group({"params": [q], option: value})
    assert len(opt.param_groups) == 1


def test_a_torch_optim_state_dict_loads():
    """torch.optim.AdamW's state dict (no lpsim options, a tensor step) loads its moments
    and step count; the group keeps its lpsim options (a KeyError at the next step before)."""
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(100))
    q = torch.nn.Parameter(p.detach().clone())
    ref = torch.optim.AdamW([p], lr=1e-2, weight_decay=0.0)
    for _ in range(3):
        p.grad = torch.randn(100)
        ref.step()
    opt = AdamW([q], lr=5.0, seed=1, update_rounding="stochastic", weight_decay=0.0)
    opt.load_state_dict(ref.state_dict())
    group = opt.param_groups[0]
    assert group["lr"] == 1e-2 and group["update_rounding"] == "stochastic"
    assert group["foreach"] is True and opt.state[q]["step"] == 3
    assert torch.equal(opt.state[q]["exp_avg"], ref.state[p]["exp_avg"])
    with torch.no_grad():
        q.copy_(p)
    q.grad = p.grad = torch.randn(100)
    opt.step()
    ref.step()
    assert torch.allclose(q, p, rtol=0, atol=1e-6)


@pytest.mark.parametrize("route", ROUTES, ids=["foreach", "per-tensor", "reference"])
def test_a_torch_sgd_state_dict_keeps_its_momentum_buffer(route):
    """torch.optim.SGD keeps a momentum buffer and no step count: the resumed step is not a
    first step (torch's rule: buf = g only where there is no buffer), so FP32 nearest goes on
    as torch.optim.SGD does (the buffer was replaced by the gradient before: 0.15 off)."""
    gen = torch.Generator().manual_seed(0)
    w0 = torch.randn(100, generator=gen)
    grads = [torch.randn(100, generator=gen) for _ in range(5)]
    kw = dict(lr=0.1, momentum=0.9, dampening=0.25, weight_decay=0.01)
    q = torch.nn.Parameter(w0.clone())
    ref = torch.optim.SGD([q], **kw)
    for g in grads[:2]:
        q.grad = g.clone()
        ref.step()
    p = torch.nn.Parameter(q.detach().clone())
    opt = SGD([p], lr=5.0, momentum=0.5, seed=1, **route)
    opt.load_state_dict(ref.state_dict())
    assert "step" not in opt.state[p]
    for g in grads[2:]:
        p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        ref.step()
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(opt.state[p]["momentum_buffer"], ref.state[q]["momentum_buffer"],
                               rtol=1e-5, atol=1e-6)


INF_CASES = [(SGD, torch.optim.SGD, dict(lr=0.1)), (SGD, torch.optim.SGD, dict(lr=0.0)),
             (SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.5)),
             (SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=0.1)),
             (SGD, torch.optim.SGD, dict(lr=0.0, momentum=0.9, weight_decay=0.1)),
             (AdamW, torch.optim.AdamW, dict(lr=0.1, weight_decay=0.0)),
             (AdamW, torch.optim.AdamW, dict(lr=0.1, weight_decay=0.01)),
             (AdamW, torch.optim.AdamW, dict(lr=0.0, weight_decay=0.01)),
             (AdamW, torch.optim.AdamW, dict(lr=0.5, weight_decay=2.0))]


@pytest.mark.parametrize("ours, theirs, kw", INF_CASES)
def test_an_infinite_weight_steps_as_in_torch(ours, theirs, kw):
    """FP32 nearest: an infinite weight is infinite or NaN where torch.optim's is (weight
    decay 0 adds no 0 inf; AdamW's decoupled decay keeps inf while lr wd < 1, is NaN at
    lr wd = 1), on every route, which agree bit for bit."""
    w = torch.tensor([math.inf, -math.inf, 1.0, -2.0, math.inf, -math.inf])
    grads = [torch.tensor([1.0, 1.0, -1.0, 0.5, -3.0, 0.0]), torch.tensor([2.0, -1.0, 0.25,
                                                                           1.0, 1.0, -1.0])]
    q = torch.nn.Parameter(w.clone())
    ref = theirs([q], **kw)
    runs = []
    for route in ROUTES:
        p = torch.nn.Parameter(w.clone())
        opt = ours([p], seed=1, **route, **kw)
        runs.append((p, opt))
    for g in grads:
        q.grad = g.clone()
        ref.step()
        for p, opt in runs:
            p.grad = g.clone()
            opt.step()
        p = runs[0][0].detach()
        assert torch.equal(p.isnan(), q.isnan()) and torch.equal(p.isinf(), q.isinf())
        torch.testing.assert_close(p, q.detach(), rtol=1e-5, atol=1e-6, equal_nan=True)
    for other in runs[1:]:
        assert_same(runs[0], other)


def test_copies_and_pickles_step_on():
    """copy.deepcopy and pickle keep the counters and the copy steps (an AttributeError on
    _stats before), with the original's bits."""
    import pickle
    p = torch.nn.Parameter(torch.randn(50).to(torch.bfloat16))
    opt = AdamW([p], lr=1e-2, seed=4, update_rounding="stochastic")
    p.grad = torch.randn(50).to(torch.bfloat16)
    opt.step()
    for copied in (copy.deepcopy(opt), pickle.loads(pickle.dumps(opt))):
        q = copied.param_groups[0]["params"][0]
        assert copied.update_stats == opt.update_stats
        q.grad = p.grad.clone()
        copied.step()
        assert copied.update_stats.elements == 100
    pa = copy.deepcopy(p)
    opt.step()
    assert torch.equal(bits(p), bits(q)) and not torch.equal(bits(p), bits(pa))


def test_numpy_scalar_hyperparameters_give_the_python_floats_bits():
    """torch.optim takes numpy scalars; the constants are formed from Python floats, so
    lr=np.float32(x) steps as lr=float(np.float32(x)) does."""
    runs = []
    for cast in (np.float32, float):
        make = lambda ps: AdamW(ps, lr=cast(np.float32(3e-2)), eps=cast(np.float32(1e-6)),
                                betas=(cast(np.float32(0.9)), 0.99),
                                weight_decay=cast(np.float32(0.1)), seed=5)
        runs.append(run(make, torch.bfloat16))
    assert_same(*runs)
    with pytest.raises(TypeError, match="real number"):
        AdamW([torch.nn.Parameter(torch.zeros(1))], lr=np.bool_(True))


def test_load_state_dict_runs_torchs_hooks_on_the_whole_dict():
    """The pre-hooks saw each state as just its step (the tensors were set aside first) and
    what one returned was overwritten; the post-hooks ran before the moments were back."""
    p = torch.nn.Parameter(torch.randn(4))
    opt = AdamW([p], seed=0)
    p.grad = torch.randn(4)
    opt.step()
    q = torch.nn.Parameter(torch.randn(4))
    loaded = AdamW([q], seed=0)
    seen = []

    def pre(optimizer, state_dict):
        seen.append(sorted(state_dict["state"][0]))
        state_dict = copy.deepcopy(state_dict)
        state_dict["state"][0]["exp_avg"] = torch.zeros(4)
        return state_dict
    loaded.register_load_state_dict_pre_hook(pre)
    loaded.register_load_state_dict_post_hook(lambda o: seen.append(sorted(o.state[q])))
    loaded.load_state_dict(opt.state_dict())
    assert seen == [["exp_avg", "exp_avg_sq", "step"]] * 2
    assert torch.equal(loaded.state[q]["exp_avg"], torch.zeros(4))
    assert torch.equal(loaded.state[q]["exp_avg_sq"], opt.state[p]["exp_avg_sq"])


def test_load_state_dict_keeps_states_of_unknown_ids_as_torch_does():
    """A KeyError, raised with the groups and part of the state already replaced."""
    p = torch.nn.Parameter(torch.randn(4))
    opt = AdamW([p], seed=0)
    p.grad = torch.randn(4)
    opt.step()
    saved = copy.deepcopy(opt.state_dict())
    saved["state"][7] = {"step": torch.tensor(1.0), "extra": torch.ones(2)}
    q = torch.nn.Parameter(torch.randn(4))
    loaded = AdamW([q], lr=0.5, seed=1)
    loaded.load_state_dict(saved)
    assert loaded.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    assert loaded.state[7]["step"] == 1 and torch.equal(loaded.state[7]["extra"], torch.ones(2))
    q.grad = torch.randn(4)
    loaded.step()


def test_another_algorithms_state_dict_is_refused_before_anything_changes():
    """SGD's state dict loaded into AdamW silently, and the next step raised KeyError: 'eps';
    a group emptied of a hyperparameter is named at the step too."""
    s = torch.nn.Parameter(torch.randn(3))
    sgd = SGD([s], lr=0.1, momentum=0.9)
    s.grad = torch.randn(3)
    sgd.step()
    p = torch.nn.Parameter(torch.randn(3))
    opt = AdamW([p], lr=0.3)
    with pytest.raises(ValueError, match=r"a param group has no 'betas'; AdamW's "
                                         r"hyperparameters \(lr, betas, eps"):
        opt.load_state_dict(sgd.state_dict())
    assert opt.param_groups[0]["lr"] == 0.3 and len(opt.state) == 0
    del opt.param_groups[0]["eps"]
    p.grad = torch.randn(3)
    before = p.detach().clone()
    with pytest.raises(ValueError, match=r"a param group has no 'eps'"):
        opt.step()
    assert torch.equal(p.detach(), before)
