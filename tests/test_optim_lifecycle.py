"""The optimizer lifecycle fuzz: parameters replaced, resized, reshaped, re-typed, re-laid
out and moved to meta, states dropped and loaded from elsewhere, momentum turned off and on,
between steps.

Four worlds take the same drawn operations: lpsim's three routes (multi-tensor, per-tensor,
reference) and torch.optim.  At each step lpsim raises where torch.optim raises and steps
where it steps (or refuses what it documents it refuses: float64 parameters), its three
routes raise the same error or give the same bits (parameters, states, counters), and a
step that raises has changed nothing.  CI runs the "ci" hypothesis profile;
HYPOTHESIS_PROFILE=thorough draws ten times as many sequences.
"""

import copy
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn import Parameter

from lpsim.optim import SGD, AdamW

BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16,
        torch.float64: torch.int64}
ROUTES = [dict(implementation="fused", foreach=True), dict(implementation="fused",
                                                           foreach=False),
          dict(implementation="reference")]
SHAPES = [(5,), (3, 4), (2, 3, 2), (12,), (4, 3)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
OPS = ["step", "momentum", "replace", "resize", "reshape", "retype", "transpose", "meta",
       "drop", "load", "load"]


def bits(t):
    t = t.detach()
    if t.device.type == "meta":
        return (tuple(t.shape), t.dtype)
    return t.contiguous().view(BITS[t.dtype]).clone()


def same(a, b):
    if isinstance(a, tuple) or isinstance(b, tuple):
        return a == b
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def snapshot(opt, params):
    """The parameters' bits, states and counters of a world (what a step may change)."""
    states = [{k: bits(v) if torch.is_tensor(v) else v for k, v in opt.state[p].items()}
              if p in opt.state else None for p in params]
    stats = (opt.update_stats.__copy__(), opt.cancelled_updates) if hasattr(
        opt, "update_stats") else None
    return [bits(p) for p in params], states, stats


def assert_same_snapshot(a, b, what):
    for i, (x, y) in enumerate(zip(a[0], b[0])):
        assert same(x, y), (what, "param", i)
    for i, (x, y) in enumerate(zip(a[1], b[1])):
        assert (x is None) == (y is None), (what, "state", i)
        if x is not None:
            assert x.keys() == y.keys(), (what, "state", i)
            for k in x:
                assert same(x[k], y[k]) if not isinstance(x[k], (int, float)) else \
                    x[k] == y[k], (what, "state", i, k)
    assert a[2] == b[2], (what, "counters")


#: lpsim's message for a state that does not fit its parameter
STATE = re.compile(r"state '\w+' holds \d+ elements (\(.*?\)) of (\S+) on (\S+); its options "
                   r"need \d+ contiguous elements (\(.*?\)) of (\S+) on (\S+) \(")


def refused_by_lpsim_only(error) -> bool:
    """What lpsim refuses by name where torch.optim steps: float64 parameters (its steps
    work in float32); a Kahan compensation or remainder that no longer fits its parameter
    (torch.optim keeps no such state); a state of the parameter's shape left with another dtype by a
    re-typed parameter (torch.optim's SGD adds the new dtype's gradient into the old
    dtype's momentum buffer); a meta parameter whose states stayed on the CPU (torch.optim's
    SGD multiplies the CPU buffer and adds nothing to it: a wrong state, no error)."""
    text = str(error)
    if isinstance(error, TypeError):
        return "dtype torch.float64" in text
    found = STATE.search(text)
    if found is None:
        return False
    shape, dtype, device, need_shape, need_dtype, need_device = found.groups()
    if re.search(r"state '(kahan_comp|remainder)'", text):
        return True         # lpsim's own states: torch.optim keeps none to refuse
    return shape == need_shape and (dtype != need_dtype or (device, need_device) == (
        "cpu", "meta"))


class World:
    """One optimizer and its parameters."""

    def __init__(self, make, values):
        self.params = [Parameter(v.clone()) for v in values]
        self.opt = make(self.params)


def outcome(world):
    try:
        world.opt.step()
    except (TypeError, ValueError, RuntimeError, AssertionError) as e:
        return e
    return None


@st.composite
def sequences(draw):
    n = draw(st.integers(1, 3))
    shapes = [draw(st.sampled_from(SHAPES[:3])) for _ in range(n)]
    dtypes = [draw(st.sampled_from(DTYPES)) for _ in range(n)]
    algo = draw(st.sampled_from(["adamw", "sgd"]))
    update = draw(st.sampled_from(["nearest", "stochastic", "kahan"]))
    ops = draw(st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, n - 1),
                                  st.integers(0, 2 ** 16)), min_size=2, max_size=6))
    return shapes, dtypes, algo, update, ops


def apply(op, world, i, arg, gen_values, to_meta):
    """The operation on parameter i of a world (the same in every world)."""
    p = world.params[i]
    if op == "replace":             # .data replaced by new memory of the same shape
        p.data = gen_values(p.shape, p.dtype).to(p.device)
    elif op == "resize":            # .data a prefix of the old memory, another size
        if p.device.type != "meta":
            p.grad = None
            p.data = p.data.reshape(-1)[:1 + arg % p.numel()]
    elif op == "reshape":
        if p.device.type != "meta":
            p.grad = None
            p.data = p.data.reshape(-1)
    elif op == "retype":
        if p.device.type != "meta":
            p.grad = None
            p.data = p.data.to([torch.float32, torch.bfloat16, torch.float16,
                                torch.float64][arg % 4])
    elif op == "transpose":         # the same values, transposed memory
        if p.dim() >= 2 and p.device.type != "meta":
            p.data = p.data.transpose(0, 1).contiguous().transpose(0, 1)
    elif op == "meta":              # what module.to("meta") makes, swapped in place
        if p.device.type != "meta":
            meta = Parameter(torch.empty(p.shape, dtype=p.dtype, device="meta"))
            to_meta(p, meta)
    elif op == "drop":
        world.opt.state.pop(p, None)
    elif op == "momentum":          # an option turned off or on mid-run: SGD's momentum
        group = world.opt.param_groups[0]
        if "momentum" in group:
            group["momentum"] = 0.9 if group["momentum"] == 0 else 0.0


#: half the profile's examples: each runs up to six steps in four worlds
EXAMPLES = max(settings.default.max_examples // 2, 10)


@settings(max_examples=EXAMPLES)
@given(sequences())
def test_lifecycle_follows_torch_and_the_routes_agree(case):
    shapes, dtypes, algo, update, ops = case
    gen = torch.Generator().manual_seed(0)
    values = [torch.randn(s, generator=gen).to(d) for s, d in zip(shapes, dtypes)]

    def make_lpsim(route):
        def make(params):
            kw = dict(lr=0.05, seed=5, update_rounding=update, **route)
            return AdamW(params, **kw) if algo == "adamw" else SGD(params, momentum=0.9, **kw)
        return make

    def make_torch(params):
        return (torch.optim.AdamW(params, lr=0.05) if algo == "adamw"
                else torch.optim.SGD(params, lr=0.05, momentum=0.9))

    worlds = [World(make_lpsim(route), values) for route in ROUTES]
    ref = World(make_torch, values)
    every = worlds + [ref]
    for k, (op, i, arg) in enumerate(ops):
        if op == "load":        # states from elsewhere: torch.optim's state dict, everywhere
            if not states_fit_dtypes(ref):
                continue            # torch casts them on loading, lpsim keeps their dtypes
            saved = copy.deepcopy(ref.opt.state_dict())
            for world in every:
                world.opt.load_state_dict(copy.deepcopy(saved))
        elif op != "step":
            values = torch.randn(64, generator=torch.Generator().manual_seed(arg))

            def gen_values(shape, dtype):
                return values[:torch.Size(shape).numel()].reshape(shape).to(dtype).clone()
            for world in every:
                apply(op, world, i, arg, gen_values, torch.utils.swap_tensors)
        step_all(worlds, ref, arg, k)       # a step after every operation


def states_fit_dtypes(world) -> bool:
    """Whether every floating state tensor has its parameter's dtype: torch.optim's
    load_state_dict casts them to it, lpsim's keeps them (a bfloat16 moment of a float32
    weight would be rounded), so the fuzz loads only states both read alike."""
    return all(v.dtype == p.dtype for p in world.params
               for v in world.opt.state.get(p, {}).values()
               if torch.is_tensor(v) and v.is_floating_point() and v.dim() > 0)


def step_all(worlds, ref, arg, k):
    """One step in every world, with the same gradients (none for some parameters)."""
    grads = []
    for j, p in enumerate(ref.params):
        g = torch.randn(p.shape, generator=torch.Generator().manual_seed(arg + j))
        grads.append(None if (arg >> j) & 4 else g)
    for world in worlds + [ref]:
        for p, g in zip(world.params, grads):
            p.grad = None if g is None else g.to(device=p.device, dtype=p.dtype)
    before = [snapshot(w.opt, w.params) for w in worlds]
    errors = [outcome(w) for w in worlds]
    torch_error = outcome(ref)
    kinds = [type(e) for e in errors]
    assert kinds.count(kinds[0]) == 3, (k, errors)
    if errors[0] is None:
        assert torch_error is None, (k, torch_error)
        now = snapshot(worlds[0].opt, worlds[0].params)
        for w in worlds[1:]:
            assert_same_snapshot(now, snapshot(w.opt, w.params), "routes")
        return
    assert all(str(e) == str(errors[0]) for e in errors), [str(e)[:160] for e in errors]
    assert isinstance(errors[0], (TypeError, ValueError)), errors[0]
    for w, b in zip(worlds, before):        # a refused step changes nothing
        assert_same_snapshot(b, snapshot(w.opt, w.params), "refused")
    assert torch_error is not None or refused_by_lpsim_only(errors[0]), (k, errors[0])
    for world in worlds + [ref]:        # start again from no states, in every world
        world.opt.state.clear()


def test_the_thorough_profile_is_registered():
    """HYPOTHESIS_PROFILE=thorough runs the fuzz with ten times the examples."""
    assert settings.get_profile("thorough").max_examples >= 10 * settings.get_profile(
        "ci").max_examples
