"""lpsim.optim's multi-tensor CPU step (foreach=True) == the per-tensor kernel (foreach=False)
== the reference, bit for bit: weights, states, counters, over several steps of mixed shapes,
param groups, missing gradients, step counts that differ, replaced storage and state dicts."""

import copy

import numpy as np
import pytest
import torch

from lpsim.optim import SGD, AdamW, multi
from lpsim.optim.cpu import CHUNK
from lpsim.pool import PIECES

BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
#: 1 element, a matrix, more than one chunk, a chunk and a bit, odd small
SHAPES = [(1,), (3, 5), (CHUNK + 37,), (7,), (2, 2 * CHUNK + 3)]
ROUTES = (dict(implementation="fused", foreach=True), dict(implementation="fused",
                                                          foreach=False),
          dict(implementation="reference"))


def bits(t):
    return t.detach().view(BITS[t.dtype]) if t.dtype in BITS else t.detach()


def make_params(dtype, shapes=SHAPES, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=gen).to(dtype)) for shape in shapes]


def train(make, dtype, steps=3, skip=lambda step, i: False, shapes=SHAPES, hook=None):
    """Step ``make(params)`` with seeded gradients; parameter i has no gradient at steps
    where ``skip(step, i)``; ``hook(step, params, opt)`` runs before each step."""
    params = make_params(dtype, shapes)
    opt = make(params)
    gen = torch.Generator().manual_seed(1)
    for step in range(steps):
        for i, p in enumerate(params):
            g = (torch.randn(p.shape, generator=gen) * 0.5).to(p.dtype)
            p.grad = None if skip(step, i) else g
        if hook is not None:
            hook(step, params, opt)
        opt.step()
    return params, opt


def assert_same(a, b):
    (pa, oa), (pb, ob) = a, b
    for i, (x, y) in enumerate(zip(pa, pb)):
        assert torch.equal(bits(x), bits(y)), i
        sa, sb = oa.state[x], ob.state[y]
        assert sa.keys() == sb.keys(), i
        for key in sa:
            if torch.is_tensor(sa[key]):
                assert sa[key].dtype == sb[key].dtype, (i, key)
                assert torch.equal(bits(sa[key]), bits(sb[key])), (i, key)
            else:
                assert sa[key] == sb[key], (i, key)
    assert oa.update_stats == ob.update_stats
    assert oa.cancelled_updates == ob.cancelled_updates


def assert_routes_agree(make, dtype, **kw):
    runs = [train(lambda ps, route=route: make(ps, **route), dtype, **kw) for route in ROUTES]
    assert_same(runs[0], runs[1])
    assert_same(runs[0], runs[2])
    return runs[0]


CASES = [(dtype, update, srnd, sfmt)
         for dtype in (torch.float32, torch.bfloat16, torch.float16)
         for update in ("nearest", "stochastic", "kahan", "remainder")
         for srnd, sfmt in (("nearest", None), ("stochastic", None), ("stochastic", "fp32"),
                            ("stochastic", "bf16" if dtype != torch.bfloat16 else "fp(5,4)"))
         if update != "remainder" or dtype == torch.bfloat16]


@pytest.mark.parametrize("dtype,update,srnd,sfmt", CASES)
@pytest.mark.parametrize("algo", ["adamw", "sgd"])
def test_multi_equals_per_tensor_and_reference(dtype, update, srnd, sfmt, algo):
    def make(ps, **route):
        kw = dict(update_rounding=update, state_rounding=srnd, state_format=sfmt, seed=11,
                  **route)
        if algo == "adamw":
            return AdamW(ps, lr=3e-2, weight_decay=0.1, **kw)
        return SGD(ps, lr=3e-2, momentum=0.9, nesterov=True, weight_decay=0.1, **kw)
    params, opt = assert_routes_agree(make, dtype)
    assert opt.update_stats.elements == 3 * sum(p.numel() for p in params)


def test_groups_missing_grads_step_counts_replaced_storage_and_state():
    """Two groups with different options, parameters without gradients at some steps (so
    step counts differ inside a group), a state tensor replaced at step 1, p.data replaced
    at step 2, the state dict reloaded at step 3: the three routes agree after each change."""
    def make(ps, **route):
        return AdamW([{"params": ps[:3]},
                      {"params": ps[3:], "lr": 1e-1, "update_rounding": "kahan",
                       "weight_decay": 0.0, "betas": (0.8, 0.99)}],
                     lr=3e-2, update_rounding="stochastic", state_rounding="stochastic",
                     seed=7, **route)

    def hook(step, params, opt):
        if step == 1:           # a state tensor replaced by hand
            opt.state[params[2]]["exp_avg"] = opt.state[params[2]]["exp_avg"].clone()
        if step == 2:
            params[1].data = params[1].data.clone()
            params[4].data = params[4].data.clone()
        if step == 3:
            opt.load_state_dict(copy.deepcopy(opt.state_dict()))

    shapes = SHAPES + [(40,)]
    params, opt = assert_routes_agree(
        make, torch.bfloat16, steps=5, shapes=shapes, hook=hook,
        skip=lambda step, i: (i == 0 and step < 2) or (i == 3 and step == 1) or i == 5)
    counts = [opt.state[p].get("step") for p in params]
    assert counts == [3, 5, 5, 4, 5, None]


def test_mixed_dtypes_in_a_group():
    """float32 and bfloat16 parameters of one group are two sets (two Setups)."""
    def make(ps, **route):
        return SGD(ps, lr=1e-2, momentum=0.5, update_rounding="stochastic", seed=2, **route)

    def hook(step, params, opt):
        if step == 0:
            for i in (1, 3):
                g, params[i].grad = params[i].grad.float(), None
                params[i].data = params[i].data.float()
                params[i].grad = g
    assert_routes_agree(make, torch.bfloat16, hook=hook)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_offsets_and_threads(dtype, monkeypatch):
    """The kernel over a table with global offsets (DTensor shards) and split across
    threads equals the per-tensor kernel at those offsets."""
    from lpsim.optim import cpu
    from lpsim.optim.setup import resolve
    from lpsim.optim.step import ADAMW

    group = dict(weight_format=None, state_format=None, update_rounding="stochastic",
                 state_rounding="stochastic", sr_bits=None)
    setup = resolve(group, torch.empty(0, dtype=dtype), dtype)
    sizes, offsets = [5, 3 * CHUNK + 11, 1, 700], [3, CHUNK - 2, 0, 5 * CHUNK + 1]
    hp = tuple(np.float32(x) for x in (1e-2, 1e-3, 0.9, 0.1, 0.999, 0.001, 0.1, 0.001, 1e-8,
                                       0.1, 0, 1))
    hp += (np.float32(1) / hp[6], np.float32(1) / hp[7])       # the host's 1 / c1, 1 / c2
    ints = (ADAMW, setup.update, setup.wmode, setup.wk, setup.smode, setup.sk, 0, 1)
    seed = (123, 456)

    def tensors():
        g = torch.Generator().manual_seed(5)
        return [[torch.randn(n, generator=g).to(dtype) for _ in range(4)] for n in sizes]
    one = tensors()
    expect = np.zeros(7, np.int64)
    for i, ((w, g, m, v), n, off) in enumerate(zip(one, sizes, offsets)):
        keys = seed + (10 * i + 1, 10 * i + 2, 10 * i + 3)
        views = [cpu.bits_view(t) for t in (w, g, m, v)] + [np.zeros(1, np.int16)] * 2
        expect += cpu.step(*views, setup.kinds, hp, ints, keys, off, setup)
    for workers, grain in ((1, multi.GRAIN), (3, 1)):
        monkeypatch.setattr(multi, "GRAIN", grain)
        many = tensors()
        rows = [(w.data_ptr(), g.data_ptr(), m.data_ptr(), v.data_ptr(), 0, 0, n, off,
                 10 * i + 1, 10 * i + 2, 10 * i + 3)
                for i, ((w, g, m, v), n, off) in enumerate(zip(many, sizes, offsets))]
        table = multi.Table(rows, setup, workers)
        # PIECES ranges per thread (one range for one thread), pulled by the threads
        assert table.workers == workers
        # (cuts that fall in one work unit are one)
        assert table.bounds == [0, table.total] if workers == 1 else \
            workers < len(table.bounds) - 1 <= workers * PIECES
        counts = table.step(hp, ints, seed, 0)
        assert np.array_equal(counts, expect)
        for a, b in zip(one, many):
            for x, y in zip(a, b):
                assert torch.equal(bits(x), bits(y))


def test_errors_on_the_multi_tensor_route():
    p = torch.nn.Parameter(torch.zeros(4, 4))
    q = torch.nn.Parameter(torch.zeros(3))
    opt = AdamW([q, p])
    q.grad = torch.zeros(3)
    p.grad = torch.zeros(4, 4).to_sparse()
    with pytest.raises(TypeError, match="sparse"):
        opt.step()
    assert opt.state.get(q) is None         # nothing stepped: q has no state, no step count
    p.grad = torch.zeros(4, 4)
    opt.step()
    del opt.state[p]["exp_avg_sq"]         # a missing state starts again at zero
    opt.step()
    assert opt.state[p]["exp_avg_sq"].shape == (4, 4) and opt.state[p]["step"] == 2
    opt.state[p]["exp_avg_sq"] = torch.zeros(3)
    with pytest.raises(ValueError, match="'exp_avg_sq' holds 3 elements"):
        opt.step()
    r = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    r.grad = torch.zeros(2, dtype=torch.float64)
    with pytest.raises(TypeError, match="parameter 0 .* torch.float64"):
        SGD([r])
    with pytest.raises(TypeError, match="foreach"):
        SGD([q], foreach=1)
