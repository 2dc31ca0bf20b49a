"""Simulated training recipes (lpsim.torch.simulate): every preset's GEMMs, forward and
backward, equal bit for bit the composition written here by hand with lpsim.quantize and
lpsim.ops.matmul; the RHT is orthogonal; SR gradients are unbiased (one z-test, false alarm
1e-5); gradcheck passes on the exact recipe; bad recipes are refused by field name.

The same tests run on a GPU with LPSIM_TEST_GPU=1 (the CUDA cases; lpsim_cuda quantizes and
cuBLAS multiplies without TF32 there).
"""

import copy
import os
import re
import warnings

import numpy as np
import pytest

import lpsim

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from lpsim.blocks import BlockFormat, BlockStats, block  # noqa: E402
from lpsim.ops import HARDWARE_MODELS  # noqa: E402
from lpsim.ops.instruction_models import InstructionModel  # noqa: E402
from lpsim.philox import random_words  # noqa: E402
from lpsim.torch import (PRESETS, Gemm, Operand, Recipe, SimulatedLinear, report,  # noqa: E402
                         simulate)
from lpsim.torch.simulate import RHT_STREAM, quantize_operand  # noqa: E402

GPU = os.environ.get("LPSIM_TEST_GPU") == "1"
DEVICES = ["cpu"] + (["cuda"] if GPU else [])
SEED = 20261126


# --- the composition, by hand -------------------------------------------------------------

def by_hand(t, op, axis, g, amax=None):
    """One operand quantized as the recipe says, written out with lpsim.quantize."""
    t = t.detach().float()
    fmt = op.fmt
    if fmt is None:
        return t
    if isinstance(fmt, BlockFormat) and op.blocks_2d:
        k = fmt.block
        r, c = t.shape
        tiles = t.reshape(r // k, k, c // k, k).transpose(1, 2).reshape(r // k, c // k, k * k)
        square = block(fmt.element, k * k, fmt.scale, fmt.rule, tensor_scale=fmt.tensor_scale)
        q = lpsim.quantize(tiles, square, op.rounding, generator=g)
        return q.reshape(r // k, c // k, k, k).transpose(1, 2).reshape(r, c)
    if isinstance(fmt, BlockFormat):
        return lpsim.quantize(t, fmt, op.rounding, generator=g, axis=axis)
    if op.scaling == "none":
        return lpsim.quantize(t, fmt, op.rounding, generator=g)
    amax = float(t.abs().max()) if amax is None else amax
    s = np.float32(np.float32(fmt.max_finite) / np.float32(amax)) if amax else 1.0
    # divided by s on t's device: torch divides a GPU tensor by a host number as a product
    # with its reciprocal, which rounds twice
    s = torch.tensor(float(s), device=t.device)
    return lpsim.quantize(t * s, fmt, op.rounding, generator=g) / s


def hand_rht(t, step, n, layer=0):
    """The RHT of the columns of t (blocks of n tokens), as the recipe defines it: each
    run of n tokens times its factors d / sqrt(n) (float32), then the Sylvester recursion
    H_2k v = [H_k (a + b), H_k (a - b)] (a, b: v's halves), in t's dtype (numpy)."""
    words = np.array(random_words(n, 4, SEED, RHT_STREAM + layer, step * n), dtype=np.uint64)
    tt = t.detach().t().cpu().numpy().reshape(-1, n)
    kind = tt.dtype.type
    signs = np.where(words >> np.uint64(31), -1.0, 1.0).astype(kind)
    y = sylvester(tt * (signs * kind(1 / np.sqrt(n))))
    return torch.from_numpy(y).reshape(t.shape[1], t.shape[0]).t().to(t.device)


def sylvester(v):
    """H v along the last axis by the Sylvester recursion, in v's dtype."""
    if v.shape[-1] == 1:
        return v
    a, b = np.split(v, 2, axis=-1)
    return np.concatenate([sylvester(a + b), sylvester(a - b)], axis=-1)


def as_it_lies(op, device):
    """Whether the layer quantizes a 2-D operand in blocks down its columns where it lies:
    on the CPU, blocks of one row (not 2-D), rounded deterministically, without a tensor
    scale (lpsim.blocks.columns: C order; else a transposed copy's transpose)."""
    return device.type == "cpu" and not op.blocks_2d and not op.fmt.tensor_scale \
        and lpsim.rounding.mode_code(op.rounding) < lpsim.rounding.STOCHASTIC


def product(a, b, gemm, b_rows=False, natural=False):
    """a @ b with the operands laid out as the layer passes them: a row-major, b
    column-major (the transpose of a row-major K-major matrix), or row-major with b_rows
    (the layer's weight in dgrad, quantized as it is stored, where it is not in blocks
    along the columns or they lie where it is), or as they come with ``natural`` (the CPU's
    wgrad of element formats and of MX rounded deterministically without an RHT: dy's
    quantized transpose as a view, x row-major).  BLAS sums each output in an order
    that depends on the layouts: a difference far below the output's rounding, but one
    that a sum with cancellation shows."""
    device = a.device
    if not natural:
        a = a.contiguous()
        b = b.contiguous() if b_rows else b.t().contiguous().t()
    if device.type == "cuda" and gemm.accumulate is None:
        # cuBLAS too picks its summation order by the layouts (the wgrad of fp8_current
        # differed in its last bits on an H200 when a came column-major)
        torch.backends.cuda.matmul.allow_tf32 = False
        return a @ b
    return lpsim.ops.matmul(a.cpu(), b.cpu(), model=gemm.accumulate).to(device)


def out(y, gemm, bias=None):
    y = y + bias.detach() if bias is not None else y
    return y if gemm.out is None else lpsim.quantize(y, gemm.out)


class Hand:
    """The recipe's three GEMMs by hand, steps in the layer's order of random draws; layer:
    the layer's index (its RHT signs), generator: one shared with other layers' (SEED's)."""

    def __init__(self, recipe, generator=None, layer=0):
        self.r, self.step, self.history = recipe, 0, {}
        self.g = generator if generator is not None else lpsim.Generator(SEED)
        self.layer = layer

    def q(self, t, gemm, role, axis):
        g = getattr(self.r, gemm)
        op = g.a if role == lpsim.torch.recipes.GEMMS[gemm][0] else g.b
        amax = None
        if op.scaling == "delayed":
            hist = self.history.setdefault((gemm, role), [])
            amax = max(hist[-op.history:]) if hist else 0.0
            hist.append(float(t.abs().max()))
        return by_hand(t, op, axis, self.g, amax)

    def forward(self, x, w, b):
        self.wq = self.q(w, "fprop", "w", -1)
        return out(product(self.q(x, "fprop", "x", -1), self.wq.t(), self.r.fprop), self.r.fprop,
                   b)

    def backward(self, x, w, dy):
        r = self.r
        shared = r.dgrad.b == r.fprop.b and r.fprop.b.blocks_2d
        dyq = self.q(dy, "dgrad", "dy", -1)
        wq = self.wq if shared else self.q(w, "dgrad", "w", 0)
        # the weight in blocks down its columns: a transposed copy's transpose, unless the
        # CPU quantizes it as it lies (lpsim.blocks.columns)
        down_columns = isinstance(r.dgrad.b.fmt, BlockFormat) and not r.dgrad.b.blocks_2d \
            and not as_it_lies(r.dgrad.b, w.device)
        dx = out(product(dyq, wq, r.dgrad, b_rows=not down_columns), r.dgrad)
        dyw, xw = dy, x.detach().float()
        if r.rht:
            dyw = hand_rht(dyw, self.step, r.rht, self.layer)
            xw = hand_rht(xw, self.step, r.rht, self.layer)
        # the CPU's wgrad of element formats and of MX rounded deterministically: quantized
        # as they lie, no transposing copies
        natural = dy.device.type == "cpu" and not r.rht and not isinstance(
            r.wgrad.accumulate, InstructionModel) and all(
                not isinstance(op.fmt, BlockFormat) or as_it_lies(op, dy.device)
                for op in (r.wgrad.a, r.wgrad.b))
        dw = out(product(self.q(dyw, "wgrad", "dy", 0).t(), self.q(xw, "wgrad", "x", 0),
                     r.wgrad, natural=natural), r.wgrad)
        self.step += 1
        return dx, dw, dy.sum(0)


def layer_and_data(recipe, device, in_f=64, out_f=32, tokens=64, seed=0):
    torch.manual_seed(seed)
    linear = nn.Linear(in_f, out_f).to(device)
    layer = SimulatedLinear.from_linear(linear, recipe, generator=lpsim.Generator(SEED))
    x = (torch.randn(tokens, in_f, device=device) * 3).requires_grad_()
    dy = torch.randn(tokens, out_f, device=device) * 1e-3
    return layer, x, dy


def same(a, b):
    return torch.equal(a, b) or (a.isnan() == b.isnan()).all() and torch.equal(
        a.nan_to_num(), b.nan_to_num())


def equal_over_steps(recipe, device, steps=3, hand=None, scales=None, autocast=None,
                     **dims):
    """The layer and the composition by hand (``hand``: a class like Hand) step by step;
    scales: x's factor at each step (default 1, 2, 3, ...); dims: layer_and_data's sizes.
    autocast: None, or the dtype of a ``torch.autocast`` the layer's forward runs in (its
    output comes in that dtype, the gradient too; the composition by hand runs without)."""
    layer, x, dy = layer_and_data(recipe, device, **dims)
    hand = (hand or Hand)(layer.recipe)
    for step in range(steps):
        # delayed scaling sees a growing tensor: saturation
        scale = 1.0 + step if scales is None else scales[step]
        xs = (x.detach() * scale).requires_grad_()
        layer.weight.grad = layer.bias.grad = None
        with torch.autocast(device, autocast or torch.bfloat16, enabled=autocast is not None):
            y = layer(xs)
        assert y.dtype == (autocast or torch.float32), (step, y.dtype)
        g = dy.to(y.dtype)
        y.backward(g)
        with torch.no_grad():
            y_hand = hand.forward(xs, layer.weight, layer.bias)
            dx, dw, db = hand.backward(xs, layer.weight, g.float())
        assert same(y.float(), y_hand), (step, "fprop")
        assert same(xs.grad, dx), (step, "dgrad")
        assert same(layer.weight.grad, dw), (step, "wgrad")
        assert same(layer.bias.grad, db), (step, "bias")
    return layer


@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2", "fp(4,3,4)", "bf16", "fp(8,30,127)"])
def test_the_device_tensor_scale_is_the_host_ones(fmt):
    """The per-tensor scale computed by torch operations on a 0-d amax (what a GPU keeps on
    the device) equals lpsim.torch.gemms.tensor_scale bit for bit: 10^5 random float32 bit
    patterns (NaN, inf, zeros, subnormals, both signs) and the edges, on the CPU and, with
    LPSIM_TEST_GPU=1, on the GPU."""
    from lpsim.torch.gemms import device_tensor_scale, tensor_scale
    f = lpsim.parse_format(fmt)
    bits = np.random.default_rng(5).integers(0, 2 ** 32, 10 ** 5, dtype=np.uint64)
    edges = np.array([0, 0x80000000, 1, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F7FFFFF,
                      0x00800000, 0x3F800000], np.uint64)
    amaxes = np.concatenate([edges, bits]).astype(np.uint32).view(np.float32)
    want = np.array([tensor_scale(float(a), f) for a in amaxes], np.float32)
    for device in DEVICES:
        got = torch.stack([device_tensor_scale(torch.tensor(a, device=device), f)
                           for a in amaxes[:2000]]) if device == "cuda" else None
        if got is None:     # the CPU: one vector call is the same elementwise operations
            got = device_tensor_scale(torch.from_numpy(amaxes), f)
            assert np.array_equal(got.numpy().view(np.int32), want.view(np.int32)), fmt
        else:
            assert np.array_equal(got.cpu().numpy().view(np.int32), want[:2000].view(np.int32))


@pytest.mark.parametrize("device", DEVICES)
def test_delayed_scaling_takes_the_amax_of_its_last_history_steps(device):
    """history=2: a large first step leaves the window after two more steps, and the scale
    follows the later, smaller amaxes again (the composition by hand windows its list)."""
    e4m3 = Operand("e4m3fn", scaling="delayed", history=2)
    e5m2 = Operand("e5m2", scaling="delayed", history=2)
    recipe = Recipe(Gemm(e4m3, e4m3), Gemm(e5m2, e4m3), Gemm(e5m2, e4m3), name="short")
    equal_over_steps(recipe, device, steps=4, scales=[400.0, 1.0, 1.0, 1.0])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_equals_its_composition_by_hand(name, device):
    equal_over_steps(PRESETS[name], device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_under_autocast_equals_its_composition_by_hand(name, device):
    """Inside ``torch.autocast(bfloat16)``, where users train, the GEMMs stay the recipe's
    (autocast would make lpsim's FP32 products bfloat16 ones) and the output, exact in
    bfloat16, comes in bfloat16 as nn.Linear's does there."""
    equal_over_steps(PRESETS[name], device, steps=2, autocast=torch.bfloat16)


def test_under_autocast_an_output_not_exact_in_its_dtype_stays_float32():
    """The output's dtype: x's without autocast (float64 too), autocast's where the recipe's
    fprop output is exact in it, float32 where not (bf16 values under float16 autocast, an
    FP32 output): the values are the recipe's either way; a backward pass inside the
    autocast region gives the same gradients as one outside."""
    from lpsim.torch.gemms import holds
    assert holds(lpsim.parse_format("bf16"), torch.bfloat16)
    assert holds(lpsim.parse_format("e4m3fn"), torch.float16)
    assert not holds(lpsim.parse_format("bf16"), torch.float16)     # range
    assert not holds(lpsim.parse_format("fp(5,10,15)"), torch.bfloat16)     # mantissa
    assert not holds(lpsim.parse_format("fp(8,7,140)"), torch.bfloat16)     # subnormals
    assert not holds(None, torch.bfloat16) and holds(None, torch.float32)
    assert holds("e5m2", torch.bfloat16) and not holds("fp32", torch.bfloat16)
    assert not holds(lpsim.fixed(8, 4), torch.bfloat16) and not holds("bf16", torch.int32)
    with pytest.raises(ValueError):
        holds("fp99", torch.bfloat16)
    mx = PRESETS["mxfp8"]
    wide = mx.with_(fprop=Gemm(mx.fprop.a, mx.fprop.b, out=None), name="wide")
    cases = [(mx, torch.float16, torch.float32), (wide, torch.bfloat16, torch.float32),
             (mx, torch.bfloat16, torch.bfloat16)]
    for recipe, low, want in cases:
        layer, x, dy = layer_and_data(recipe, "cpu")
        twin, _, _ = layer_and_data(recipe, "cpu")
        with torch.autocast("cpu", low):
            y = layer(x)
            y.backward(dy.to(y.dtype))     # inside the region: the same GEMMs
            assert layer(x.detach().double()).dtype == torch.float64
        y_plain = twin(x.detach())
        y_plain.backward(dy.to(y.dtype).float())
        assert y.dtype == want, (recipe.name, low)
        assert same(y.float(), y_plain), (recipe.name, low)
        assert same(layer.weight.grad, twin.weight.grad), (recipe.name, low)


@pytest.mark.parametrize("device", DEVICES)
def test_tensor_core_accumulation_equals_lpsim_ops_matmul_with_the_model(device):
    fp8 = PRESETS["fp8_current"]
    r = fp8.with_(fprop=Gemm(fp8.fprop.a, fp8.fprop.b, accumulate="hopper-fp8-promote128"),
                  wgrad=Gemm(fp8.wgrad.a, fp8.wgrad.b, accumulate="hopper-fp8", out=None))
    assert r.fprop.accumulate == HARDWARE_MODELS["hopper-fp8-promote128"].with_(in_fmt=None)
    equal_over_steps(r, device, steps=2)
    mx = PRESETS["mxfp8"]
    equal_over_steps(mx.with_(dgrad=Gemm(mx.dgrad.a, mx.dgrad.b, accumulate="bf16-fp32")),
                     device, steps=1)


def test_the_two_dimensional_weight_is_quantized_once_for_fprop_and_dgrad():
    layer, x, dy = layer_and_data("nvfp4", "cpu")
    layer(x).backward(dy)
    t = layer.telemetry
    assert t["fprop", "w"].elements == layer.weight.numel() and t["dgrad", "w"].elements == 0
    # a 16 x 16 block's scale serves rows and columns alike: quantizing along either axis of
    # the 2-D-blocked weight gives the same values
    op = layer.recipe.fprop.b
    w = layer.weight.detach()
    assert torch.equal(quantize_operand(w, op, -1), quantize_operand(w, op, 0))


# --- the RHT, SR and gradcheck -----------------------------------------------------------

def test_rht_with_quantization_off_leaves_wgrad_within_float32_rounding():
    exact = Operand(None)
    plain = Gemm(exact, exact, out=None)
    layer, x, dy = layer_and_data(Recipe(plain, plain, plain, rht=16), "cpu", tokens=64)
    dy = dy * 1e3
    layer(x).backward(dy)
    rotated = layer.weight.grad.double()
    xd, dyd = x.detach().double(), dy.double()
    assert not torch.equal(layer.weight.grad, (dy.t() @ x.detach()))   # the RHT did run
    # the RHT's butterfly is a sum tree of depth 4 with exact factors 1/4 (lpsim.torch.
    # hadamard): |fl(T dy) - T dy| <= g4 |T||dy|, the same for x, then a float32 GEMM over
    # 64 tokens: |error| <= (2 g4 + g4^2 + g64 (1 + g4)^2) (|T||dy|)^T (|T||x|), |T| = 1/4
    u = 2.0 ** -24
    g = [n * u / (1 - n * u) for n in (4, 64)]
    bound = (2 * g[0] + g[0] ** 2 + g[1] * (1 + g[0]) ** 2)
    ones = torch.ones(16, 16, dtype=torch.float64) / 4
    abs_t = lambda t: torch.matmul(ones, t.abs().reshape(-1, 16, t.shape[1])).reshape(t.shape)
    limit = bound * (abs_t(dyd).t() @ abs_t(xd))
    assert ((rotated - dyd.t() @ xd).abs() <= limit).all()


def test_rht_signs_differ_per_step_and_layer():
    from lpsim.torch.simulate import rht_signs
    a, b, c = rht_signs(1, 0, 0, 16), rht_signs(1, 0, 1, 16), rht_signs(1, 1, 0, 16)
    assert set(np.unique(a)) <= {-1.0, 1.0}
    assert not np.array_equal(a, b) and not np.array_equal(a, c)


def test_a_layer_draws_its_rht_signs_a_window_of_steps_at_once(monkeypatch):
    """A layer draws RHT_WINDOW steps' signs in one draw (one copy to a GPU, whose host
    waits for it): each step's row equals that step's own draw, across the window's end and
    after the generator is reseeded; the rows transform bit for bit as the numpy signs."""
    from lpsim.torch import gemms
    draws = []
    real = gemms.rht_signs
    monkeypatch.setattr(gemms, "rht_signs", lambda *a: draws.append(a) or real(*a))
    monkeypatch.setattr(gemms, "RHT_WINDOW", 4)
    layer = gemms.LinearGemms("nvfp4", generator=lpsim.Generator(5), index=3)
    t = torch.randn(8, 32)
    for step in range(6):
        layer.steps = step
        row = layer.rht_signs(16, t.device)
        want = real(5, 3, step, 16)
        assert row.dtype == torch.float32 and np.array_equal(row.numpy(), want)
        for x in (t, t.double()):
            assert torch.equal(gemms.rht(x, row), gemms.rht(x, want))
    assert [a[2] for a in draws] == [0, 4]
    layer.generator.manual_seed(6)
    assert np.array_equal(layer.rht_signs(16, t.device).numpy(), real(6, 3, 5, 16))
    assert np.array_equal(real(6, 3, 5, 16, 3)[1:], np.stack([real(6, 3, k, 16)
                                                             for k in (6, 7)]))
    for bad in (0, -2, 2.0, True):
        with pytest.raises(ValueError, match=f"steps={bad!r}"):
            real(6, 3, 5, 16, bad)


@pytest.mark.parametrize("name", ["nvfp4", "mxfp4"])
def test_stochastically_rounded_gradients_are_unbiased(name):
    """z = sum(mean - x) / sqrt(sum var / R) over 4096 elements and R = 256 draws is N(0, 1)
    for an unbiased rounding: |z| < 4.42 fails with probability 1e-5 when it is."""
    op = PRESETS[name].dgrad.a
    assert op.rounding == "stochastic"
    torch.manual_seed(3)
    x = torch.randn(16, 256) * torch.exp2(torch.randint(-6, 6, (16, 1)).float())
    g = lpsim.Generator(7)
    draws = 256
    total = torch.zeros_like(x, dtype=torch.float64)
    for _ in range(draws):
        total += quantize_operand(x, op, -1, generator=g).double()
    lo = quantize_operand(x, op.with_(rounding="down"), -1).double()
    hi = quantize_operand(x, op.with_(rounding="up"), -1).double()
    xd, mean = x.double(), total / draws
    # elements between two neighbours (not those a block's scale saturates, whose SR is
    # clamped, nor those an FP32 reciprocal moved by an ulp): the z-test's population
    inside = (lo < xd) & (xd < hi)
    assert inside.float().mean() > 0.9
    exact = (lo == hi) & (lo == xd)
    assert torch.equal(mean[exact], xd[exact])
    p = (xd - lo) / torch.where(inside, hi - lo, torch.ones_like(xd))
    var = torch.where(inside, (hi - lo) ** 2 * p * (1 - p), torch.zeros_like(xd))
    sd = (var.sum() / draws).sqrt()
    z = float(torch.where(inside, mean - xd, torch.zeros_like(xd)).sum() / sd)
    assert abs(z) < 4.42, z
    # and the test can fail: means biased by 1/256 of each element's step are far outside
    off = torch.where(inside, mean - xd + (hi - lo) / 2 ** 8, torch.zeros_like(xd))
    assert abs(float(off.sum() / sd)) > 4.42


def test_gradcheck_passes_on_the_exact_recipe_with_rht_in_float64():
    exact = Operand(None)
    plain = Gemm(exact, exact, out=None)
    torch.manual_seed(0)
    linear = nn.Linear(8, 4).double()
    layer = SimulatedLinear.from_linear(linear, Recipe(plain, plain, plain, rht=4),
                                        generator=lpsim.Generator(1))
    x = torch.randn(2, 4, 8, dtype=torch.float64, requires_grad=True)
    # each backward draws the next step's signs: equal only up to float64 rounding
    assert torch.autograd.gradcheck(lambda x, w, b: _functional(layer, x, w, b),
                                    (x, layer.weight, layer.bias), nondet_tol=1e-12)


def _functional(layer, x, w, b):
    from lpsim.torch.gemms import _LinearFunction
    return _LinearFunction.apply(x.reshape(-1, 8), w, b, layer)


# --- simulate, telemetry, refusals -------------------------------------------------------

def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 32))


def test_simulate_keeps_the_parameters_and_any_optimizer_trains_them():
    model = mlp()
    params = list(model.parameters())
    keys = list(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert simulate(model, "nvfp4", generator=5) is model
    assert [p is q for p, q in zip(params, model.parameters())] == [True] * len(params)
    assert list(model.state_dict()) == keys
    assert [m.recipe.name for m in model if isinstance(m, SimulatedLinear)] == \
        ["bf16", "nvfp4", "bf16"]            # keep_first_last
    before = model[2].weight.detach().clone()
    x = torch.randn(16, 32)
    model(x).square().mean().backward()
    opt.step()
    assert not torch.equal(before, model[2].weight)
    simulate(model, "mxfp8")                 # a new recipe for simulated layers
    assert [m.recipe.name for m in model if isinstance(m, SimulatedLinear)] == ["mxfp8"] * 3


def test_skip_by_name_or_callable_and_unknown_names_refused():
    model = simulate(mlp(), "mxfp8", skip=["2"])
    assert type(model[2]) is nn.Linear and isinstance(model[0], SimulatedLinear)
    model = simulate(mlp(), "mxfp8", skip=lambda name, m: m.in_features == 32)
    assert type(model[0]) is nn.Linear and isinstance(model[4], SimulatedLinear)
    with pytest.raises(ValueError, match=r"skip=\['9'\]"):
        simulate(mlp(), "mxfp8", skip=["9"])


def test_multihead_attention_projections_are_named_not_swapped():
    model = nn.Sequential(nn.MultiheadAttention(32, 4), nn.Linear(32, 32))
    with pytest.warns(UserWarning, match=r"0\.out_proj"):
        simulate(model, "mxfp8")
    assert type(model[0].out_proj) is not SimulatedLinear and \
        isinstance(model[1], SimulatedLinear)


def test_an_encoder_layer_in_inference_runs_the_simulated_layers():
    """nn.TransformerEncoderLayer's inference fast path (eval, no grad, batch_first) reads
    linear1's and linear2's weights directly; a simulated layer keeps it out of that path."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).eval()
    plain = copy.deepcopy(layer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")         # its attention's projections: not simulated
        simulate(layer, "mxfp8", generator=1)
    x = torch.randn(2, 16, 32)
    with torch.no_grad():
        y = layer(x)
    assert layer.linear1.telemetry["fprop", "x"].elements == x.numel()
    assert layer.linear2.telemetry["fprop", "w"].elements == 64 * 32
    assert not torch.equal(y, plain(x))


def test_telemetry_counts_equal_the_hand_composition_counts():
    layer, x, dy = layer_and_data("nvfp4", "cpu")
    x = (x.detach() * 1e4).requires_grad_()
    layer(x).backward(dy)
    expect = BlockStats()
    lpsim.quantize(x.detach(), PRESETS["nvfp4"].fprop.a.fmt, stats=expect)
    assert layer.telemetry["fprop", "x"] == expect
    rows = report(nn.Sequential(layer)).rows
    assert len(rows) == 6 and rows[0]["elements"] == x.numel()
    assert {r["gemm"] for r in rows} == {"fprop", "dgrad", "wgrad"}


def test_telemetry_every_n_steps_counts_those_steps_only():
    model = simulate(nn.Sequential(nn.Linear(32, 32)), "mxfp8", telemetry=3)
    x = torch.randn(32, 32)
    for _ in range(4):                       # steps 0 and 3 counted
        model(x).sum().backward()
    assert model[0].telemetry["fprop", "x"].elements == 2 * x.numel()
    off = simulate(nn.Sequential(nn.Linear(32, 32)), "mxfp8", telemetry=False)
    off(x).sum().backward()
    assert all(s.elements == 0 for s in off[0].telemetry.values())
    for bad in (0, -1, 2.5, "often"):
        with pytest.raises(ValueError, match="telemetry="):
            simulate(nn.Sequential(nn.Linear(32, 32)), "mxfp8", telemetry=bad)


def test_delayed_scaling_saturates_a_growing_tensor_and_the_report_says_where():
    model = simulate(nn.Sequential(nn.Linear(32, 32)), "fp8_delayed")
    x = torch.randn(8, 32)
    model(x)
    model(x * 1000)                          # scale from the first step's amax: saturates
    rep = report(model)
    worst = rep.worst()
    assert (worst["gemm"], worst["operand"]) == ("fprop", "x") and worst["saturated"] > 0
    assert "saturated" in str(rep).splitlines()[0]


def test_a_refused_call_changes_nothing():
    model = simulate(mlp(), "nvfp4")
    x = torch.randn(24, 32)                  # 24 tokens: the RHT's 16 does not divide them
    before = [dict(s.as_dict()) for s in model[2].telemetry.values()]
    with pytest.raises(ValueError, match=r"layer '2': wgrad\.a\.fmt: block 16 does not "
                                         r"divide K = 24 of wgrad \(its tokens\)"):
        model(x)
    assert [s.as_dict() for s in model[2].telemetry.values()] == before
    assert model[2].steps == 0
    with torch.no_grad():
        assert model(x).shape == (24, 32)    # no backward to follow: no wgrad to refuse


@pytest.mark.parametrize("x, error, match", [
    (torch.ones(2, 32, dtype=torch.int64), TypeError, r"input of dtype torch\.int64 is not "
                                                      r"accepted; accepted: a floating point"),
    (torch.tensor(1.0), ValueError, r"a 0-d input is not accepted"),
    ([1.0] * 32, TypeError, r"input of type list is not accepted"),
])
def test_an_input_nn_linear_refuses_is_refused_and_changes_nothing(x, error, match):
    """An integer input came back as the float32 result cast to its dtype (truncated), a
    0-d one raised an IndexError from the shape."""
    model = simulate(mlp(), "nvfp4")
    before = [dict(s.as_dict()) for s in model[0].telemetry.values()]
    with pytest.raises(error, match=match):
        model[0](x)
    assert [s.as_dict() for s in model[0].telemetry.values()] == before


@pytest.mark.parametrize("make, match", [
    (lambda: simulate(nn.Linear(40, 32), "mxfp8"),
     r"fprop\.a\.fmt: block 32 does not divide K = 40 of fprop \(its in_features\)"),
    (lambda: simulate(nn.Linear(32, 40), "mxfp8"),
     r"dgrad\.a\.fmt: block 32 does not divide K = 40"),
    (lambda: simulate(nn.Linear(32, 24), Recipe(Gemm(Operand("bf16"), Operand(
        "nvfp4", blocks_2d=True)))), r"fprop\.b\.fmt: 16 x 16 blocks of w need both its "
                                     r"dimensions divisible by 16; 24 is not"),
    (lambda: Operand(block("e4m3fn", 32, "e2m1fn")), r"cannot hold the scales"),
    (lambda: Operand(None, "stochastic"), r"rounding='stochastic' is asked of an operand "
                                          r"kept exact"),
    (lambda: Operand("fp32", "stochastic"), r"kept exact"),
    (lambda: Operand("e4m3fn", sr_bits=4), r"sr_bits=4 needs rounding='stochastic'"),
    (lambda: Operand("e4m3fn", "stochastic", sr_bits=33), r"sr_bits=33 is out of range"),
    (lambda: Operand("e4m3fn", "stochastic", sr_bits=2.0), r"sr_bits=2.0 is not an integer"),
    (lambda: Operand("e4m3fn", scaling="delayed", history=0), r"history=0 is not accepted"),
    (lambda: Operand("e4m3fn", scaling="delayed", history=2 ** 40),
     r"history=1099511627776 is not accepted; accepted: an integer 1 \.\. 1048576"),
    (lambda: Operand("e8m0fnu"), r"fmt='e8m0fnu' holds no negative values"),
    (lambda: Gemm(out="e8m0fnu"), r"out='e8m0fnu' holds no negative values"),
    (lambda: Gemm(Operand("e4m3fn"), Operand(None), out="fp64"),
     r"out='fp64' does not fit the float32 result of a GEMM of quantized operands"),
    (lambda: Operand("mxfp8", scaling="current"), r"scaling='current' needs an element format"),
    (lambda: Operand("e4m3fn", scaling="amax"), r"scaling='amax' is unknown"),
    (lambda: Operand("bf16", blocks_2d=True), r"blocks_2d=True needs a block format"),
    (lambda: Operand("e4m3fnx"), r"fmt='e4m3fnx'"),
    (lambda: Operand("fp64"), r"fmt='fp64' does not fit the float32 containers"),
    (lambda: Operand("fp(8,30,0)", "stochastic"), r"fmt='fp\(8,30,0\)' does not fit"),
    (lambda: Operand(block("fp(9,10)")), r"does not fit the float32 containers"),
    (lambda: report(3), r"model=3 is not a torch.nn.Module"),
    (lambda: Gemm(accumulate="tpu"), r"accumulate='tpu'"),
    (lambda: Recipe(rht=12), r"rht=12 is not accepted"),
    (lambda: simulate(mlp(), "fp4"), r"unknown recipe 'fp4'"),
    (lambda: simulate(mlp(), "nvfp4", generator=torch.Generator()), r"generator="),
])
def test_bad_recipes_are_refused_by_field(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


def test_numpy_integers_are_taken_as_ints():
    assert Operand("e4m3fn", "stochastic", sr_bits=np.int64(8)).sr_bits == 8
    assert Operand("e4m3fn", scaling="delayed", history=np.int32(4)).history == 4
    assert type(Recipe(rht=np.int64(16)).rht) is int
    assert isinstance(simulate(mlp(), "mxfp8", generator=np.uint64(3))[0], SimulatedLinear)


@pytest.mark.parametrize("rht", [2 ** 32, 2 ** 40, np.uint64(2 ** 63), 2 ** 70])
def test_an_rht_larger_than_its_signs_is_refused_when_made(rht):
    """rht=2**40 was taken, and failed inside a backward pass naming rht_signs' n: the recipe
    takes the sizes rht_signs draws signs for, the one limit of lpsim.torch.hadamard."""
    from lpsim.torch.hadamard import RHT_SIZE_LIMIT, rht_signs
    match = rf"rht={re.escape(repr(rht))} is not accepted; accepted: None or a power of " \
            rf"two, 2 <= rht < {RHT_SIZE_LIMIT}"
    with pytest.raises(ValueError, match=match):
        Recipe(rht=rht)
    with pytest.raises(ValueError, match=match):
        PRESETS["mxfp8"].with_(rht=rht)
    with pytest.raises(ValueError, match=rf"n={RHT_SIZE_LIMIT} is not accepted"):
        rht_signs(0, 0, 0, RHT_SIZE_LIMIT)
    assert Recipe(rht=RHT_SIZE_LIMIT // 2).rht == 2 ** 31


def test_first_refusal_leaves_the_model_unswapped():
    model = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 40), nn.Linear(40, 32))
    with pytest.raises(ValueError, match="layer '1'"):
        simulate(model, "mxfp8")
    assert all(type(m) is nn.Linear for m in model)


def test_a_parametrized_layer_is_refused_and_the_model_left_as_it_was():
    """A parametrization (weight_norm) computes the weight from other Parameters; a simulated
    layer would hold one computed snapshot that no optimizer trains: refused by name."""
    model = mlp()
    nn.utils.parametrizations.weight_norm(model[0])
    names = [n for n, _ in model.named_parameters()]
    with pytest.raises(ValueError, match=r"layer '0' has parametrized \['weight'\]"):
        simulate(model, "mxfp8")
    assert [n for n, _ in model.named_parameters()] == names
    assert all(not isinstance(m, SimulatedLinear) for m in model.modules())


def test_out_wider_than_float32_is_taken_where_both_operands_are_exact():
    """A float64 model under an exact recipe keeps float64 outputs (gradcheck's case)."""
    exact = Gemm(out="fp64")
    layer = SimulatedLinear.from_linear(nn.Linear(3, 2).double(), Recipe(exact, exact, exact))
    x = torch.randn(4, 3, dtype=torch.float64)
    assert torch.equal(layer(x), x @ layer.weight.t() + layer.bias)


class _Adapter(nn.Linear):
    """An nn.Linear subclass with a parameter and a forward of its own (LoRA's shape)."""

    def __init__(self):
        super().__init__(32, 32)
        self.a = nn.Parameter(torch.ones(2, 32))

    def forward(self, x):
        return super().forward(x) + (x @ self.a.t()).sum(-1, keepdim=True)


class _Residual(nn.Linear):
    def forward(self, x):
        return super().forward(x) + x


def _legacy_weight_norm(model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")         # torch's deprecation of the legacy form
        nn.utils.weight_norm(model[2])


def _spectral_norm(model):
    nn.utils.spectral_norm(model[2])


def _adapter(model):
    model[2] = _Adapter()


def _residual(model):
    model[2] = _Residual(32, 32)


def _lazy(model):
    model[2] = nn.LazyLinear(32)


@pytest.mark.parametrize("change, match", [
    (_legacy_weight_norm, r"layer '2' \(Linear\) has the parameters \['weight_g', 'weight_v'\]"),
    (_spectral_norm, r"layer '2' \(Linear\) has the parameters \['weight_orig'\]"),
    (_adapter, r"layer '2' \(_Adapter\) has the parameters \['a'\] besides"),
    (_residual, r"layer '2' is a _Residual, an nn.Linear subclass with its own forward"),
    (_lazy, r"layer '2' \(LazyLinear\) has uninitialized parameters")])
def test_layers_whose_state_a_simulated_layer_would_drop_are_refused(change, match):
    """A simulated layer holds a weight, a bias and nn.Linear's map: a weight computed from
    other parameters (legacy weight_norm, spectral_norm), an adapter's parameters or forward,
    and a lazy layer's unmade weight were once dropped silently (the weight never trained, a
    residual vanished); refused by name, the model left as it was (no hook added either)."""
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                          nn.Linear(32, 32))
    change(model)
    names = [n for n, _ in model.named_parameters()]
    with pytest.raises(ValueError, match=match):
        simulate(model, "mxfp8", skip=["4"])
    assert [n for n, _ in model.named_parameters()] == names
    assert all(not isinstance(m, SimulatedLinear) and not m._forward_pre_hooks
               for m in (model[0], model[4]))
    simulate(model, "mxfp8", skip=["2"])       # skipped, the rest is simulated
    assert isinstance(model[0], SimulatedLinear) and not isinstance(model[2], SimulatedLinear)


@pytest.mark.parametrize("bad", [3, nn.ReLU()])
def test_from_linear_refuses_what_is_not_a_linear_layer(bad):
    """Once an AttributeError (no in_features) from deep inside."""
    for call in (SimulatedLinear.check, SimulatedLinear.from_linear):
        with pytest.raises(TypeError, match=f"linear={type(bad).__name__}: accepted: an "
                                            "nn.Linear"):
            call(bad, "bf16")


def test_a_simulated_layer_keeps_the_hooks_and_mode_of_the_layer_it_replaces():
    """Hooks registered on a layer fire on its simulated layer and their handles still
    remove them; an eval-mode layer stays in eval mode (they were once dropped)."""
    model = mlp().eval()
    seen = []
    handle = model[2].register_forward_hook(lambda module, args, out: seen.append(out.shape))
    model[2].register_forward_pre_hook(lambda module, args: seen.append("pre"))
    simulate(model, "mxfp8", generator=0)
    assert isinstance(model[2], SimulatedLinear)
    assert [m.training for m in model] == [False] * 5
    model(torch.randn(32, 32))
    assert seen == ["pre", (32, 64)]
    handle.remove()
    model(torch.randn(32, 32))
    assert seen == ["pre", (32, 64), "pre"]
    simulate(model, "nvfp4", generator=0)      # simulated again: the guard hook not doubled
    assert len(model[2]._forward_pre_hooks) == 2


def test_a_second_derivative_through_a_simulated_layer_is_refused():
    """The backward pass's GEMMs are quantized compositions of detached tensors: a gradient
    penalty through them was once silently zero; torch now refuses it by name."""
    exact = Gemm(out=None)
    layer = SimulatedLinear.from_linear(nn.Linear(4, 3).double(), Recipe(exact, exact, exact))
    x = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    y = torch.tanh(layer(x))
    g, = torch.autograd.grad(y.sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        (g ** 2).sum().backward()


def test_report_worst_is_none_before_anything_is_counted():
    model = simulate(mlp(), "mxfp8", generator=0)
    assert report(model).worst() is None
    model(torch.randn(32, 32)).sum().backward()
    worst = report(model).worst()
    assert worst is not None and worst["elements"] > 0


def test_a_layer_used_in_several_places_is_simulated_in_each():
    shared = nn.Linear(32, 32)
    model = simulate(nn.Sequential(shared, nn.ReLU(), shared), "mxfp8", generator=2)
    assert isinstance(model[0], SimulatedLinear) and model[2] is model[0]
    assert model[0].weight is shared.weight
    model(torch.randn(32, 32)).sum().backward()
    assert report(model).rows[0]["elements"] > 0 and shared.weight.grad is not None


def test_a_frozen_layer_checks_no_wgrad_tokens():
    """wgrad's K is the token count: checked only where the weight takes a gradient (dgrad
    alone runs for a frozen layer, whose input may still need one)."""
    model = simulate(mlp(), "mxfp8", generator=3)
    x = torch.randn(48, 32, requires_grad=True)          # 48 tokens: no 32-blocks along K
    with pytest.raises(ValueError, match="does not divide K = 48 of wgrad"):
        model(x)
    for p in model.parameters():
        p.requires_grad_(False)
    model(x).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_layers_accept_batched_and_bfloat16_inputs():
    model = simulate(mlp(), "mxfp8", generator=1)
    x = torch.randn(2, 16, 32)
    y = model(x)
    assert y.shape == (2, 16, 32)
    yb = model(x.bfloat16())
    assert yb.dtype == torch.bfloat16
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=r"accepted: \(\.\.\., 32\)"):
            model(torch.randn(4, 31))


# --- peers: torchao's MX and NVFP4 casts of the same operands -----------------------------

def test_mxfp8_and_nvfp4_operands_equal_torchao_casts():
    mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
    nv = pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor")
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.kernels import f4_unpacked_to_f32, unpack_uint4
    torch.manual_seed(4)
    t = torch.randn(64, 128) * torch.exp2(torch.randint(-8, 8, (64, 1)).float())
    mxfp8 = PRESETS["mxfp8"]
    for op, axis in [(mxfp8.fprop.a, -1), (mxfp8.dgrad.b, 0), (mxfp8.wgrad.a, 0)]:
        rows = t if axis == -1 else t.t().contiguous()      # torchao blocks the last axis
        scale, data = mx.to_mx(rows, torch.float8_e4m3fn, 32, ScaleCalculationMode.RCEIL)
        want = mx.to_dtype(data, scale, torch.float8_e4m3fn, 32, torch.float32)
        assert torch.equal(quantize_operand(t, op, axis), want if axis == -1 else want.t())
    # NVFP4 (1 x 16, FP32 tensor scale): elements q, E4M3 scales s and the tensor scale pts
    # of torchao; lpsim's value is q * s * pts rounded once (exact in float64, then float32).
    # Rows within 2**5 of one another: every block scale is an E4M3 normal
    t = torch.randn(64, 128) * torch.exp2(torch.randint(-2, 3, (64, 1)).float())

    def torchao_nvfp4(t):
        pts = nv.per_tensor_amax_to_scale(t.abs().max())
        scales, data = nv.nvfp4_quantize(t, 16, pts)
        q = f4_unpacked_to_f32(unpack_uint4(data)).reshape(t.shape).double()
        s = scales.float().double().reshape(t.shape[0], -1).repeat_interleave(16, dim=1)
        return (q * s * float(pts)).float(), s

    op = PRESETS["nvfp4"].fprop.a
    want, _ = torchao_nvfp4(t)
    assert torch.equal(quantize_operand(t, op, -1), want)
    # the one difference: a block whose scale is below E4M3's smallest normal (2**-6) keeps
    # its subnormal scale in lpsim (a cast to E4M3), where torchao clamps it to 2**-6
    t[0] *= 2.0 ** -16 * float(t.abs().max() / t[0].abs().max())    # scales near 448 * 2**-16
    want, s = torchao_nvfp4(t)
    got = quantize_operand(t, op, -1)
    assert float(s[0].min()) == 2.0 ** -6 and not torch.equal(got[0], want[0])
    assert torch.equal(got[1:], want[1:])


@pytest.mark.parametrize("name", ["e4m3fn", "e5m2"])
def test_the_device_scale_is_the_host_scale(name):
    """device_tensor_scale (the torch operations a GPU runs, here on the CPU) gives
    tensor_scale's float32 bits for every kind of amax: zero, subnormal (whose scale
    overflows to float32's largest), normal, the format's largest, inf and NaN (scale 1)."""
    from lpsim.formats import parse_format
    from lpsim.torch.gemms import device_tensor_scale, tensor_scale
    fmt = parse_format(name)
    values = [0.0, -0.0, 1e-45, 1e-40, 1.17e-38, 1e-30, 3e-3, 1.0, 448.0, 57344.0, 3.4e38,
              float("inf"), float("nan"), -1.0]
    for v in values:
        got = device_tensor_scale(torch.tensor(v, dtype=torch.float32), fmt)
        assert got.dtype == torch.float32 and got.shape == ()
        want = np.float32(tensor_scale(float(np.float32(v)), fmt))
        assert np.float32(float(got)).tobytes() == want.tobytes(), (v, float(got), want)


def test_the_device_amax_is_the_host_amax():
    """device_amax (three torch operations) equals lpsim's CPU amax: the largest finite
    magnitude, 0 when there is none."""
    from lpsim.blocks.amax import tensor_amax
    from lpsim.torch.gemms import device_amax
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0)) * 7
    x[[3, 5, 7]] = torch.tensor([float("nan"), float("-inf"), float("inf")])
    assert float(device_amax(x)) == tensor_amax(x.numpy())
    assert float(device_amax(x.to(torch.bfloat16))) == \
        tensor_amax(x.to(torch.bfloat16).float().numpy())
    assert float(device_amax(torch.full((5,), float("nan")))) == 0.0


def test_delayed_scaling_trains_after_an_inference_pass():
    """The amax history made in an inference pass (a validation step first) is an
    inference tensor, which the next training step could not write."""
    model = simulate(mlp(), "fp8_delayed", generator=lpsim.Generator(0))
    with torch.inference_mode():
        model(torch.randn(16, 32))
    model(torch.randn(16, 32)).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
