"""lpsim.optim keeps torch.optim's contract: meta parameters, resized and re-typed parameters,
torch's flags (maximize, a tensor lr), non-contiguous parameters and gradients, float64
parameters, and a refused step that changes nothing, on every route."""

import copy

import numpy as np
import pytest
import torch
from torch.nn import Parameter

from lpsim.optim import SGD, AdamW

BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
ROUTES = [dict(implementation="fused", foreach=True), dict(implementation="fused",
                                                           foreach=False),
          dict(implementation="reference")]
IDS = ["foreach", "per-tensor", "reference"]


def bits(t):
    return t.detach().contiguous().view(BITS[t.dtype])


def snapshot(opt, params):
    """Everything a step may change: parameter bits, states, counters."""
    states = {i: {k: (bits(v).clone() if torch.is_tensor(v) else copy.copy(v))
                  for k, v in opt.state[p].items()} if p in opt.state else None
              for i, p in enumerate(params)}
    return ([bits(p).clone() for p in params], states, opt.update_stats.__copy__(),
            opt.cancelled_updates)


def assert_snapshots_equal(a, b):
    assert all(torch.equal(x, y) for x, y in zip(a[0], b[0]))
    assert a[1].keys() == b[1].keys()
    for i in a[1]:
        assert (a[1][i] is None) == (b[1][i] is None), i
        if a[1][i] is not None:
            assert a[1][i].keys() == b[1][i].keys(), i
            for k in a[1][i]:
                x, y = a[1][i][k], b[1][i][k]
                assert torch.equal(x, y) if torch.is_tensor(x) else x == y, (i, k)
    assert a[2] == b[2] and a[3] == b[3]


# -- 1. meta parameters ---------------------------------------------------------------------

@pytest.mark.parametrize("route", ROUTES, ids=IDS)
@pytest.mark.parametrize("make", [lambda ps, **kw: AdamW(ps, **kw),
                                  lambda ps, **kw: SGD(ps, momentum=0.9, **kw)],
                         ids=["adamw", "sgd"])
def test_meta_parameters_step_as_in_torch(route, make):
    """torch.optim steps meta tensors (states made on meta, step counts advanced); lpsim did
    too on no route: a segfault on the multi-tensor route (a null data pointer handed to the
    kernel), numpy's conversion error on the others.  A CPU parameter beside it steps as
    it would alone."""
    p = Parameter(torch.zeros(3, device="meta"))
    p.grad = torch.zeros(3, device="meta")
    q = Parameter(torch.randn(50, generator=torch.Generator().manual_seed(0)))
    q_alone = Parameter(q.detach().clone())
    opt = make([q, p], lr=0.1, seed=3, **route)
    alone = make([q_alone], lr=0.1, seed=3, **route)
    ref = torch.optim.AdamW([p.detach().clone().requires_grad_()])
    for _ in range(2):
        q.grad = q_alone.grad = torch.ones(50)
        opt.step()
        alone.step()
    assert opt.state[p]["step"] == 2
    needed = {"step", "exp_avg", "exp_avg_sq"} if isinstance(opt, AdamW) else \
        {"step", "momentum_buffer"}
    assert set(opt.state[p]) == needed
    assert all(v.device.type == "meta" and v.shape == (3,)
               for v in opt.state[p].values() if torch.is_tensor(v))
    assert torch.equal(bits(q), bits(q_alone))
    ref_p = ref.param_groups[0]["params"][0]
    ref_p.grad = torch.zeros(3, device="meta")
    ref.step()                                      # what torch does: it steps
    assert ref.state[ref_p]["exp_avg"].device.type == "meta"


@pytest.mark.parametrize("route", ROUTES, ids=IDS)
def test_a_parameter_moved_to_meta_after_a_step_is_refused_by_name(route):
    """Its states stay on the CPU: torch.optim raises, lpsim names the state and the
    devices, and nothing steps."""
    p, t = Parameter(torch.zeros(4)), Parameter(torch.zeros(4))
    opt, ref = AdamW([p], seed=1, **route), torch.optim.AdamW([t])
    for x, o in ((p, opt), (t, ref)):
        x.grad = torch.ones(4)
        o.step()
        meta = Parameter(torch.zeros(4, device="meta"))     # what module.to("meta") makes
        meta.grad = torch.ones(4, device="meta")
        torch.utils.swap_tensors(x, meta)                   # the optimizer's parameter moved
    with pytest.raises(ValueError, match="'exp_avg' holds 4 elements .*of torch.float32 on "
                                         "cpu; its options need 4 .* on meta"):
        opt.step()
    assert opt.state[p]["step"] == 1
    with pytest.raises(RuntimeError):
        ref.step()


# -- 2. resized, re-typed and re-laid-out tensors between steps -----------------------------

@pytest.mark.parametrize("foreach", [True, False])
def test_a_resized_parameter_writes_nothing_out_of_bounds(foreach):
    """The issue's repro: p.data = p.data[:10] keeps the data pointer; the cached multi-tensor
    table rewrote the 99,990 elements past the new parameter and read 100,000 gradients from
    a 10-element buffer.  Now: refused by name, like torch.optim, nothing written."""
    p = Parameter(torch.zeros(100000))
    opt = AdamW([p], lr=0.1, seed=1, foreach=foreach)
    p.grad = torch.ones(100000)
    opt.step()
    full = p.data
    before = full.clone()
    p.data = p.data[:10]
    p.grad = torch.ones(10)
    with pytest.raises(ValueError, match="'exp_avg' holds 100000 elements .* need 10"):
        opt.step()
    assert torch.equal(full, before) and opt.state[p]["step"] == 1
    t = Parameter(torch.zeros(100000))
    ref = torch.optim.AdamW([t], lr=0.1)
    t.grad = torch.ones(100000)
    ref.step()
    t.data = t.data[:10]
    t.grad = torch.ones(10)
    with pytest.raises(RuntimeError):
        ref.step()                                  # torch.optim raises too


@pytest.mark.parametrize("foreach", [True, False])
@pytest.mark.parametrize("change, match", [
    # same address, fewer elements
    (lambda st, p: setattr(st["exp_avg"], "data", st["exp_avg"].data[:10]), "holds 10 "),
    # same address and size, another dtype
    (lambda st, p: setattr(st["exp_avg_sq"], "data", st["exp_avg_sq"].data.view(torch.int32)),
     "torch.int32"),
    # same address and size, transposed
    (lambda st, p: setattr(st["exp_avg"], "data", st["exp_avg"].data.view(8, 8).t()),
     "not contiguous"),
    # the parameter reshaped, same address and size: torch.optim refuses its states too
    (lambda st, p: setattr(p, "data", p.data.view(8, 8)), r"holds 64 elements \(64,\)"),
])
def test_a_cached_table_or_view_is_revalidated(foreach, change, match):
    """A state changed through .data keeps its identity (and here its address): the table
    cached for the multi-tensor route and the views cached for the per-tensor one are
    checked against every tensor's address, size, dtype and layout at each step."""
    p, q = Parameter(torch.randn(64)), Parameter(torch.randn(5))
    opt = AdamW([q, p], lr=0.1, seed=1, foreach=foreach)
    for _ in range(2):
        p.grad, q.grad = torch.ones(64), torch.ones(5)
        opt.step()
    change(opt.state[p], p)
    before = snapshot(opt, [q])
    with pytest.raises(ValueError, match=match):
        opt.step()
    assert_snapshots_equal(before, snapshot(opt, [q]))
    assert opt.state[p]["step"] == 2


@pytest.mark.parametrize("route", ROUTES, ids=IDS)
@pytest.mark.parametrize("dtype, error, match", [
    (torch.float64, TypeError, "a parameter has dtype torch.float64"),
    (torch.bfloat16, ValueError, "'exp_avg' holds 64 elements .*of torch.float32"),
    (torch.float16, ValueError, "'exp_avg' holds 64 elements .*of torch.float32")])
def test_a_parameter_re_typed_between_steps_is_refused_like_torch(route, dtype, error, match):
    """p.data = p.data.to(dtype) after a step: torch.optim raises (its states keep the old
    dtype), and so does lpsim, by name, with nothing changed."""
    p, q = Parameter(torch.randn(64)), Parameter(torch.randn(5))
    opt = AdamW([q, p], lr=0.1, seed=1, **route)
    t = Parameter(p.detach().clone())
    ref = torch.optim.AdamW([t], lr=0.1)
    p.grad, q.grad, t.grad = torch.ones(64), torch.ones(5), torch.ones(64)
    opt.step()
    ref.step()
    p.data, t.data = p.data.to(dtype), t.data.to(dtype)
    p.grad, t.grad = None, None
    p.grad, t.grad = torch.ones(64, dtype=dtype), torch.ones(64, dtype=dtype)
    before = snapshot(opt, [q])
    with pytest.raises(error, match=match):
        opt.step()
    assert_snapshots_equal(before, snapshot(opt, [q]))
    with pytest.raises(RuntimeError):
        ref.step()


# -- 10. torch.optim's flags ----------------------------------------------------------------

def test_torch_flags_at_their_defaults_are_taken():
    """A config written for torch.optim: every flag at torch's default, a tensor lr."""
    p = Parameter(torch.zeros(3))
    AdamW([p], lr=torch.tensor(1e-3), betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
          amsgrad=False, maximize=False, foreach=None, capturable=False, differentiable=False,
          fused=None)
    SGD([p], lr=torch.tensor(0.1), momentum=0.0, dampening=0.0, weight_decay=0.0,
        nesterov=False, maximize=False, foreach=None, differentiable=False, fused=None)
    group = AdamW([p], foreach=None).param_groups[0]
    assert group["foreach"] is True and group["maximize"] is False and group["fused"] is None
    assert AdamW([p], foreach=False, fused=True).param_groups[0]["foreach"] is False
    # a torch.optim state dict carries the flags; lpsim keeps its route
    ref = torch.optim.AdamW([p])
    opt = AdamW([p], foreach=False)
    opt.load_state_dict(ref.state_dict())
    assert opt.param_groups[0]["foreach"] is False


@pytest.mark.parametrize("kw, error, match", [
    (dict(fused="yes"), TypeError, "fused='yes' is not a bool"),
    (dict(amsgrad="no"), TypeError, "amsgrad='no'"),
    (dict(maximize=1), TypeError, "maximize=1"),
    (dict(capturable=None), TypeError, "capturable=None"),
    (dict(differentiable="False"), TypeError, "differentiable"),
    (dict(foreach="no"), TypeError, "foreach='no'"),
    (dict(amsgrad=True), ValueError, "amsgrad=True: .* accepted: False"),
    (dict(capturable=True), ValueError, "capturable=True"),
    (dict(differentiable=True), ValueError, "differentiable=True"),
    (dict(foreach=True, fused=True), ValueError, "foreach=True and fused=True"),
    (dict(fused=True, implementation="reference"), ValueError, "fused=True"),
    (dict(lr=torch.tensor([0.1, 0.2])), ValueError, "lr=.* 1-element"),
    (dict(lr=torch.tensor(True)), TypeError, "lr="),
    (dict(lr=torch.tensor(-1.0)), ValueError, "lr=-1.0 is out of range"),
])
def test_torch_flags_lpsim_cannot_honour_are_refused_by_name(kw, error, match):
    with pytest.raises(error, match=match):
        AdamW([Parameter(torch.zeros(2))], **kw)


def test_torch_adam_s_coupled_weight_decay_is_refused_by_name():
    """torch.optim.Adam's groups carry decoupled_weight_decay=False (L2 decay in the
    gradient); lpsim's AdamW decays decoupled, so such a state dict or group is refused by
    name (it loaded and stepped with the other decay before), and torch's AdamW one loads."""
    p = Parameter(torch.randn(4))
    ref = torch.optim.Adam([p], lr=0.1, weight_decay=0.5)
    p.grad = torch.randn(4)
    ref.step()
    q = Parameter(p.detach().clone())
    opt = AdamW([q], lr=0.2, weight_decay=0.5)
    with pytest.raises(ValueError, match="decoupled_weight_decay=False: .* accepted: True"):
        opt.load_state_dict(ref.state_dict())
    assert opt.param_groups[0]["lr"] == 0.2 and opt.state[q] == {}
    with pytest.raises(ValueError, match="decoupled_weight_decay=False"):
        opt.add_param_group({"params": [Parameter(torch.zeros(2))],
                             "decoupled_weight_decay": False})
    with pytest.raises(ValueError, match="decoupled_weight_decay=False"):
        AdamW([{"params": [Parameter(torch.zeros(2))], "decoupled_weight_decay": False}])
    opt.param_groups[0]["decoupled_weight_decay"] = False
    q.grad = torch.ones(4)
    with pytest.raises(ValueError, match="decoupled_weight_decay=False"):
        opt.step()
    assert opt.state[q] == {}
    opt.param_groups[0]["decoupled_weight_decay"] = True
    opt.load_state_dict(torch.optim.AdamW([p], lr=0.1).state_dict())
    opt.step()


def test_sgd_has_torch_sgd_s_signature():
    with pytest.raises(TypeError):
        SGD([Parameter(torch.zeros(2))], amsgrad=False)     # as torch.optim.SGD
    with pytest.raises(TypeError, match="fused"):
        SGD([Parameter(torch.zeros(2))], fused="yes")


def test_a_flag_changed_in_a_group_is_checked_at_the_step():
    p = Parameter(torch.zeros(3))
    opt = AdamW([p])
    p.grad = torch.ones(3)
    opt.param_groups[0]["amsgrad"] = True
    with pytest.raises(ValueError, match="amsgrad=True"):
        opt.step()
    opt.param_groups[0]["amsgrad"] = False
    opt.param_groups[0]["maximize"] = "yes"
    with pytest.raises(TypeError, match="maximize='yes'"):
        opt.step()
    assert opt.state.get(p) is None


@pytest.mark.parametrize("route", ROUTES, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("algo", ["adamw", "sgd"])
def test_maximize_steps_as_the_negated_gradient(route, dtype, algo):
    """torch.optim's maximize negates the gradient (before SGD's weight decay): lpsim's
    maximize=True gives the bits of maximize=False with -g, stochastic rounding included."""
    def make(ps, **kw):
        kw.update(route, lr=0.05, seed=9, update_rounding="stochastic", weight_decay=0.1)
        return AdamW(ps, **kw) if algo == "adamw" else SGD(ps, momentum=0.9, **kw)
    gen = torch.Generator().manual_seed(0)
    w0 = torch.randn(3, 70, generator=gen).to(dtype)
    a, b = Parameter(w0.clone()), Parameter(w0.clone())
    oa, ob = make([a], maximize=True), make([b])
    for _ in range(3):
        g = torch.randn(3, 70, generator=gen).to(dtype)
        a.grad, b.grad = g, -g
        oa.step()
        ob.step()
    assert torch.equal(bits(a), bits(b))
    assert oa.update_stats == ob.update_stats


def test_maximize_follows_torch_in_fp32():
    torch.manual_seed(0)
    w0 = torch.randn(100)
    a, b = Parameter(w0.clone()), Parameter(w0.clone())
    opt = AdamW([a], lr=1e-2, maximize=True, seed=1)
    ref = torch.optim.AdamW([b], lr=1e-2, maximize=True)
    for _ in range(3):
        a.grad = b.grad = torch.randn(100)
        opt.step()
        ref.step()
    assert torch.allclose(a, b, rtol=0, atol=1e-6) and not torch.equal(a.detach(), w0)


@pytest.mark.parametrize("route", ROUTES, ids=IDS)
def test_a_tensor_lr_steps_as_its_float(route):
    """torch and torchao take a 0-d tensor lr (schedulers fill it in place): its value, read
    at each step, gives the bits of the same Python float."""
    runs = []
    for lr in (torch.tensor(3e-2), 3e-2):
        p = Parameter(torch.randn(40, generator=torch.Generator().manual_seed(2)))
        opt = AdamW([p], lr=lr, seed=4, update_rounding="stochastic", **route)
        for i in range(3):
            if i == 2:
                if torch.is_tensor(lr):
                    opt.param_groups[0]["lr"].fill_(1e-2)
                else:
                    opt.param_groups[0]["lr"] = float(torch.tensor(1e-2))
            p.grad = torch.ones(40)
            opt.step()
        runs.append(bits(p))
    assert torch.equal(*runs)


# -- 11. non-contiguous parameters and gradients --------------------------------------------

LAYOUTS = {
    # (make the parameter's storage from the logical values, the gradient likewise)
    "transposed": (lambda x: x.t().contiguous().t(), lambda g: g),
    "transposed grad": (lambda x: x, lambda g: g.t().contiguous().t()),
    "both transposed": (lambda x: x.t().contiguous().t(), lambda g: g.t().contiguous().t()),
    "expanded grad": (lambda x: x, lambda g: g[:1].expand(g.shape)),
    "channels_last": (lambda x: x.view(4, 3, 5, 5).contiguous(
        memory_format=torch.channels_last).view_as(x.view(4, 3, 5, 5)), lambda g: g),
    "sliced": (lambda x: torch.zeros(x.shape[0], x.shape[1] + 3, dtype=x.dtype)[:, 2:-1]
               .copy_(x), lambda g: g),
}


@pytest.mark.parametrize("route", ROUTES, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_non_contiguous_tensors_step_as_contiguous_ones(route, dtype, layout):
    """torch steps transposed views, expanded gradients and channels_last conv weights; lpsim
    refused them.  Each element now gets the bits it gets in a contiguous parameter holding
    the same logical values (stochastic rounding: random words keyed by the logical index),
    and the parameter keeps its layout."""
    make_param, make_grad = LAYOUTS[layout]
    gen = torch.Generator().manual_seed(5)
    shape = (4, 75)
    w0 = torch.randn(shape, generator=gen).to(dtype)
    flat = Parameter(w0.clone())
    odd = Parameter(make_param(w0.clone()) if layout != "channels_last"
                    else make_param(w0.clone()))
    if layout == "channels_last":
        flat = Parameter(w0.clone().view(4, 3, 5, 5))
    assert torch.equal(bits(odd), bits(flat)) and (layout.endswith("grad") or
                                                   not odd.is_contiguous())
    strides = odd.stride()
    kw = dict(lr=0.05, seed=7, update_rounding="stochastic", state_rounding="stochastic",
              **route)
    small = Parameter(torch.randn(7, generator=gen).to(dtype))     # a neighbour in the group
    small2 = Parameter(small.detach().clone())
    oa, ob = AdamW([small, flat], **kw), AdamW([small2, odd], **kw)
    for _ in range(3):
        g = torch.randn(shape, generator=gen).to(dtype)
        if layout == "expanded grad":
            g = g[:1].expand(shape).contiguous()
        gs = torch.randn(7, generator=gen).to(dtype)
        small.grad, small2.grad = gs, gs.clone()
        flat.grad = g.clone().view(flat.shape)
        og = make_grad(g.clone())
        odd.grad = og.view(odd.shape) if og.is_contiguous() else og.reshape(odd.shape) \
            if layout == "channels_last" else og
        oa.step()
        ob.step()
    assert odd.stride() == strides
    assert torch.equal(bits(odd), bits(flat)) and torch.equal(bits(small), bits(small2))
    for name in ("exp_avg", "exp_avg_sq"):
        assert torch.equal(bits(oa.state[flat][name]).reshape(-1),
                           bits(ob.state[odd][name]).reshape(-1))
    assert oa.update_stats == ob.update_stats
    assert oa.cancelled_updates == ob.cancelled_updates


def test_a_torch_optim_state_of_a_channels_last_weight_loads_and_steps():
    """torch.optim's states of a channels_last weight are channels_last too; loaded into
    lpsim they hold the same logical values, in lpsim's logical order."""
    w = torch.randn(4, 3, 5, 5).contiguous(memory_format=torch.channels_last)
    p, q = Parameter(w.clone()), Parameter(w.clone())
    ref = torch.optim.AdamW([p], lr=1e-2)
    p.grad = torch.randn(4, 3, 5, 5)
    ref.step()
    assert not ref.state[p]["exp_avg"].is_contiguous()
    opt = AdamW([q], lr=1e-2, seed=1)
    opt.load_state_dict(ref.state_dict())
    assert torch.equal(opt.state[q]["exp_avg"], ref.state[p]["exp_avg"])
    with torch.no_grad():
        q.copy_(p)
    q.grad = p.grad = torch.randn(4, 3, 5, 5)
    opt.step()
    ref.step()
    assert torch.allclose(q, p, rtol=0, atol=1e-6)


def test_a_parameter_whose_elements_share_memory_is_refused_like_torch():
    p = Parameter(torch.zeros(1).expand(3))
    p.grad = torch.ones(3)
    for route in ROUTES:
        with pytest.raises(ValueError, match="parameter 0 .* share memory"):
            AdamW([p], **route).step()
    with pytest.raises(RuntimeError):
        torch.optim.AdamW([p]).step()


# -- 12. a refused step changes nothing -----------------------------------------------------

BAD = {
    "sparse": (lambda p: p.grad.to_sparse(), TypeError, "sparse"),
    "resized state": (None, ValueError, "'exp_avg' holds"),
    "bad step": (None, ValueError, "'step' is"),
    "re-typed": (None, TypeError, "float64"),
    # hyperparameters a scheduler or a user set in a group after it was added
    "lr None": (None, TypeError, "lr=None must be a real number"),
    "betas of one": (None, ValueError, r"betas=\(0.9,\) must be a pair"),
}


@pytest.mark.parametrize("route", ROUTES, ids=IDS)
@pytest.mark.parametrize("bad", list(BAD))
def test_a_refused_step_changes_nothing(route, bad):
    """With foreach=False a sparse gradient on the second parameter raised after the first
    was updated.  Every parameter, gradient and state is checked first, on every route:
    parameters, states, step counts and counters are as they were, in both groups."""
    gen = torch.Generator().manual_seed(3)
    params = [Parameter(torch.randn(n, generator=gen).to(torch.bfloat16)) for n in (30, 9, 12)]
    opt = AdamW([{"params": params[:2]}], lr=0.1, seed=2, update_rounding="stochastic",
                **route)
    opt.add_param_group({"params": params[2:], "lr": 0.2})
    for _ in range(2):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen).to(torch.bfloat16)
        opt.step()
    victim = params[1]
    if bad == "sparse":
        victim.grad = victim.grad.to_sparse()
    elif bad == "resized state":
        opt.state[params[2]]["exp_avg"] = torch.zeros(3, dtype=torch.bfloat16)
    elif bad == "bad step":
        opt.state[params[2]]["step"] = -1
    elif bad == "lr None":
        opt.param_groups[1]["lr"] = None
    elif bad == "betas of one":
        opt.param_groups[1]["betas"] = (0.9,)
    else:
        victim.data = victim.data.double()
        victim.grad = None
        victim.grad = torch.ones(9, dtype=torch.float64)
    before = snapshot(opt, [params[0], params[2]])
    _, error, match = BAD[bad]
    with pytest.raises(error, match=match):
        opt.step()
    assert_snapshots_equal(before, snapshot(opt, [params[0], params[2]]))


@pytest.mark.parametrize("route", ROUTES, ids=IDS)
@pytest.mark.parametrize("cls, bad, match", [
    (SGD, {"lr": 1e39}, "param group 1: lr=1e[+]39 overflows float32"),
    (SGD, {"momentum": 1e39}, "param group 1: momentum=1e[+]39 overflows float32"),
    (AdamW, {"lr": torch.tensor(1e39, dtype=torch.float64)}, "param group 1: lr="),
    (AdamW, {"lr": 1e30, "weight_decay": 1e10}, "param group 1: lr[*]weight_decay=1e[+]40"),
    (AdamW, {"eps": float("inf")}, "param group 1: eps=inf overflows")])
@pytest.mark.parametrize("warnings_as_errors", [False, True])
def test_a_hyperparameter_float32_cannot_hold_is_refused_before_any_group_steps(
        route, cls, bad, match, warnings_as_errors):
    """A group's lr = 1e39 (a finite float64) overflowed float32 only once groups before it
    had stepped (and raised there under warnings-as-errors, its step count advanced): every
    group's hyperparameters are checked in float32 first, and the refused step leaves
    parameters, states, step counts and counters as they were."""
    import warnings
    gen = torch.Generator().manual_seed(5)
    params = [Parameter(torch.randn(n, generator=gen)) for n in (7, 5)]
    opt = cls([{"params": params[:1]}, {"params": params[1:]}], lr=0.1, seed=1,
              **({"momentum": 0.9} if cls is SGD else {}), **route)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    opt.step()
    opt.param_groups[1].update(bad)
    before = snapshot(opt, params)
    with warnings.catch_warnings():
        if warnings_as_errors:
            warnings.simplefilter("error")
        with pytest.raises(ValueError, match=match):
            opt.step()
    assert_snapshots_equal(before, snapshot(opt, params))
    assert all(opt.state[p]["step"] == 1 for p in params)
    with pytest.raises(ValueError, match=match.replace("param group 1", "param group 2")):
        opt.add_param_group({"params": [Parameter(torch.zeros(2))], **bad})
    assert len(opt.param_groups) == 2


def test_the_float32_check_refuses_exactly_the_numbers_float32_rounds_to_inf():
    """check_float32 compares with 2**128 less half an ulp of float32's largest: at and
    around that tie, at float32's largest, at inf and NaN it refuses exactly what a float32
    cast makes infinite (or NaN)."""
    from lpsim.optim.options import FLOAT32_OVERFLOW, check_float32
    top = float(np.finfo(np.float32).max)
    edges = [top, FLOAT32_OVERFLOW, np.nextafter(FLOAT32_OVERFLOW, 0.0),
             np.nextafter(FLOAT32_OVERFLOW, np.inf), 2.0 ** 128, 1e38, 1e39, float("inf"),
             float("nan"), 0.0, 5e-324]
    for x in edges + [-x for x in edges]:
        with np.errstate(over="ignore"):
            finite = bool(np.isfinite(np.float32(x)))
        if finite:
            check_float32("lr", x)
        else:
            with pytest.raises(ValueError, match="overflows float32"):
                check_float32("lr", x)


@pytest.mark.parametrize("cls, bad, error, match", [
    (AdamW, {"betas": (0.9,)}, ValueError, "must be a pair"),
    (AdamW, {"lr": -1.0}, ValueError, "lr=-1.0 is out of range"),
    (AdamW, {"lr": float("nan")}, TypeError, "lr=nan must be a real number"),
    (AdamW, {"lr": "0.1"}, TypeError, "lr='0.1' must be a real number"),
    (AdamW, {"lr": 10 ** 400}, ValueError, "lr=1000.* is out of range; accepted: a number "
     "float64 holds"),
    (SGD, {"momentum": -10 ** 400}, ValueError, "momentum=-1000.* is out of range"),
    (AdamW, {"eps": -1.0}, ValueError, "eps=-1.0 is out of range"),
    (AdamW, {"betas": (1.5, 0.9)}, ValueError, r"betas\[0\]=1.5 is out of range"),
    (SGD, {"dampening": 2.0}, ValueError, "dampening=2.0 is out of range"),
    (SGD, {"nesterov": True}, ValueError, "nesterov=True needs momentum > 0")])
def test_add_param_group_refuses_what_the_constructor_refuses(cls, bad, error, match):
    """A group added later (or given to the constructor as a dict) is held to the
    constructor's ranges; a refused group is not added."""
    opt = cls([Parameter(torch.zeros(2))])
    with pytest.raises(error, match=match):
        opt.add_param_group({"params": [Parameter(torch.zeros(3))], **bad})
    assert len(opt.param_groups) == 1
    with pytest.raises(error, match=match):
        cls([{"params": [Parameter(torch.zeros(3))], **bad}])


@pytest.mark.parametrize("cls", [SGD, AdamW])
@pytest.mark.parametrize("dtype, kw, match", [
    (torch.float32, dict(update_rounding="remainder"), "update_rounding='remainder' .* needs "
     "torch.bfloat16"),
    (torch.float32, dict(state_format="fp(8,3,127)"), "fp"),
    (torch.bfloat16, dict(weight_format="fp16"), "fp16")])
def test_options_the_parameters_cannot_take_are_refused_when_the_group_is_given(cls, dtype,
                                                                                 kw, match):
    """A format too wide for its storage, or remainder without bfloat16 parameters, was
    accepted and refused only at the first step: now by the constructor and add_param_group
    (the group not added), with the step's error; the optimizer steps on."""
    p = Parameter(torch.ones(3, dtype=dtype))
    with pytest.raises(ValueError, match=match):
        cls([p], lr=0.1, **kw)
    opt = cls([Parameter(torch.ones(2, dtype=dtype))], lr=0.1)
    with pytest.raises(ValueError, match=match):
        opt.add_param_group({"params": [p], **kw})
    assert len(opt.param_groups) == 1
    q = opt.param_groups[0]["params"][0]
    q.grad = torch.ones_like(q)
    opt.step()
    assert torch.all(q < 1)


# -- 13. float64 parameters -----------------------------------------------------------------

def test_float64_parameters_are_refused_in_init_and_add_param_group():
    """torch steps float64 parameters in float64; lpsim's steps work in float32 and store
    float32, bfloat16 and float16, so it refuses them when they are given, by name."""
    r = Parameter(torch.zeros(2, dtype=torch.float64))
    with pytest.raises(TypeError, match="parameter 1 .* torch.float64"):
        AdamW([Parameter(torch.zeros(2)), r])
    opt = SGD([Parameter(torch.zeros(2))])
    with pytest.raises(TypeError, match="parameter 0 .* torch.float64"):
        opt.add_param_group({"params": [r]})
    assert len(opt.param_groups) == 1


def test_a_refused_group_leaves_the_optimizer_able_to_step():
    """A group refused by add_param_group (here an integer lr past float64's range, which
    once raised a bare OverflowError and kept the group) is not added: the next step runs."""
    p = Parameter(torch.ones(4, dtype=torch.bfloat16))
    opt = AdamW([p], lr=0.5, seed=0)
    with pytest.raises(ValueError, match="lr="):
        opt.add_param_group({"params": [Parameter(torch.ones(3, dtype=torch.bfloat16))],
                             "lr": 10 ** 400})
    p.grad = torch.ones_like(p)
    opt.step()
    assert len(opt.param_groups) == 1 and torch.all(p < 1)
