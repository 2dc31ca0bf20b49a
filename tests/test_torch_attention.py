"""Simulated attention projections (lpsim.torch.SimulatedMultiheadAttention,
simulate(..., attention=True)).

* With quantization off, the module computes what nn.MultiheadAttention computes, across its
  options: outputs and attention weights bit for bit (projections made exact by their data,
  so the attention in between must be the same operations in the same order), and in float64
  the outputs, weights and every gradient within 1e-13 of the plain module's, relative to
  the largest magnitude.  The two differ only in how the projections' GEMMs sum (BLAS
  through lpsim.ops.matmul, three GEMMs for torch's one packed GEMM, the bias added after
  the products): each such sum of K <= 20 terms errs by at most gamma_K = K * 2**-53 (about
  2e-15) of its terms' magnitudes, and the attention's O(1) values carry it on without
  amplifying it by more than a small factor; the bound leaves a factor of 50 (measured:
  5e-16 at most), where a wrong mask, scale or head layout shows at 1e-3 or more.
* With a preset, each projection is the composition by hand of tests/test_torch_recipes.py
  (lpsim.quantize, lpsim.ops.matmul, the output rounded), forward and every gradient bit for
  bit over two steps (SR draws and the RHT's per-layer signs included).
* Telemetry, simulate's choices (attention=, skip=, keep_first_last), refusals that change
  nothing, and a TransformerEncoderLayer model that trains.
"""

import copy
import math
import pickle
import warnings

import pytest

import lpsim

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from lpsim.torch import (PRESETS, Gemm, Operand, Recipe, SimulatedLinear,  # noqa: E402
                         SimulatedMultiheadAttention, report, simulate)
from test_torch_recipes import SEED, Hand, same  # noqa: E402

EXACT = Recipe(*[Gemm(Operand(None), Operand(None), out=None)] * 3, name="exact")
E, HEADS, L, S, N = 16, 4, 6, 5, 2


# --- the same as nn.MultiheadAttention with quantization off -----------------------------

#: (constructor options, call options): the data (cross: L != S; kdim/vdim: other widths),
#: the masks (kpm / mask: "bool", "float", "float3d"), is_causal, need_weights, averaging
CASES = {
    "self-attention": ({}, {}),
    "batch_first": ({"batch_first": True}, {"kpm": "bool"}),
    "unbatched": ({}, {"unbatched": True, "kpm": "bool", "mask": "float3d"}),
    "unbatched, batch_first": ({"batch_first": True}, {"unbatched": True}),
    "cross-attention": ({}, {"cross": True, "mask": "bool"}),
    "kdim, vdim": ({"kdim": 12, "vdim": 20, "batch_first": True}, {"cross": True}),
    "key_padding_mask float": ({}, {"kpm": "float"}),
    "masks bool, per head": ({}, {"kpm": "bool", "mask": "bool", "average": False}),
    "attn_mask float 3-D": ({}, {"mask": "float3d", "need_weights": False}),
    "is_causal": ({"batch_first": True}, {"causal": True, "need_weights": False}),
    "is_causal with weights": ({}, {"causal": True}),
    "is_causal, key_padding_mask": ({}, {"causal": True, "kpm": "bool",
                                         "need_weights": False}),
    "dropout": ({"dropout": 0.3}, {"kpm": "bool"}),
    "dropout, fused": ({"dropout": 0.3}, {"need_weights": False}),
    "no bias": ({"bias": False}, {"mask": "float"}),
    "bias_kv": ({"add_bias_kv": True}, {"kpm": "bool", "mask": "bool"}),
    "zero_attn": ({"add_zero_attn": True}, {"kpm": "float", "mask": "float3d",
                                            "need_weights": False}),
    "bias_kv, zero_attn, kdim": ({"add_bias_kv": True, "add_zero_attn": True, "kdim": 8,
                                  "batch_first": True}, {"cross": True, "kpm": "bool"}),
}


def dyadic(shape, scale, gen):
    """Values k * scale, |k| <= 8: products and sums of a few of them are exact in float32."""
    return torch.randint(-8, 9, shape, generator=gen).float() * scale


def attention_pair(options, dtype, exact_data):
    """A plain nn.MultiheadAttention and its simulated copy (the exact recipe), same values."""
    torch.manual_seed(1)
    plain = nn.MultiheadAttention(E, HEADS, **options).to(dtype)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in plain.named_parameters():
            if exact_data and name == "out_proj.weight":
                # a signed permutation / 2: each output one product, exact in any order
                perm = torch.randperm(E, generator=gen)
                signs = torch.randint(0, 2, (E,), generator=gen) * 2 - 1
                p.copy_(torch.eye(E)[perm] * signs[:, None] * 0.5)
            elif exact_data:
                p.copy_(dyadic(p.shape, 0.125, gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=dtype) * 0.5)
    sim = SimulatedMultiheadAttention.from_attention(copy.deepcopy(plain), EXACT,
                                                     generator=lpsim.Generator(SEED))
    return plain, sim


def inputs(module, call, dtype, exact_data):
    """(query, key, value) and the keywords of a call: the inputs require grad."""
    gen = torch.Generator().manual_seed(3)
    s = S if call.get("cross") else L

    def tensor(length, width):
        shape = (length, width) if call.get("unbatched") else \
            (N, length, width) if module.batch_first else (length, N, width)
        t = dyadic(shape, 0.25, gen) if exact_data else torch.randn(shape, generator=gen)
        return t.to(dtype).requires_grad_()
    query = tensor(L, E)
    if call.get("cross"):
        key, value = tensor(s, module.kdim), tensor(s, module.vdim)
    else:
        key = value = query
    n = 1 if call.get("unbatched") else N
    kwargs = {"need_weights": call.get("need_weights", True),
              "average_attn_weights": call.get("average", True)}
    kpm = call.get("kpm")
    if kpm is not None:
        pad = torch.zeros(n, s, dtype=torch.bool)
        pad[:, -2:] = torch.tensor([[True, False], [True, True]])[:n]
        kwargs["key_padding_mask"] = (pad if kpm == "bool" else
                                      torch.where(pad, -5.0, 0.5).to(dtype))[
            0 if call.get("unbatched") else slice(None)]
    mask = call.get("mask")
    if call.get("causal"):
        kwargs["attn_mask"] = nn.Transformer.generate_square_subsequent_mask(L, dtype=dtype)
        kwargs["is_causal"] = True
    elif mask == "bool":
        kwargs["attn_mask"] = torch.rand(L, s, generator=gen) < 0.3
    elif mask is not None:
        shape = (n * HEADS, L, s) if mask == "float3d" else (L, s)
        kwargs["attn_mask"] = torch.randn(shape, generator=gen).to(dtype)
    return (query, key, value), kwargs


def run(module, args, kwargs, dtype):
    torch.manual_seed(4)                # the same dropout draws for both modules
    out, weights = module(*args, **kwargs)
    gen = torch.Generator().manual_seed(5)
    loss = (out * torch.randn(out.shape, generator=gen).to(dtype)).sum()
    if weights is not None:
        loss = loss + (weights * torch.randn(weights.shape, generator=gen).to(dtype)).sum()
    grads = torch.autograd.grad(loss, list(args[:1] if args[0] is args[1] else args)
                                + list(module.parameters()))
    return out, weights, grads


def both(case, dtype, exact_data):
    """(output, weights, gradients) of the simulated module and of nn.MultiheadAttention."""
    options, call = CASES[case]
    plain, sim = attention_pair(options, dtype, exact_data)
    assert [n for n, _ in sim.named_parameters()] == [n for n, _ in plain.named_parameters()]
    args, kwargs = inputs(plain, call, dtype, exact_data)
    return run(sim, args, kwargs, dtype), run(plain, args, kwargs, dtype)


@pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask")
@pytest.mark.parametrize("case", CASES)
def test_exact_recipe_outputs_and_weights_equal_nn_multihead_attention_bit_for_bit(case):
    (out, weights, _), (want, want_weights, _) = both(case, torch.float32, exact_data=True)
    assert out.shape == want.shape and same(out, want)
    assert (weights is None) == (want_weights is None)
    assert weights is None or same(weights, want_weights)


@pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask")
@pytest.mark.parametrize("case", CASES)
def test_exact_recipe_gradients_equal_nn_multihead_attention_in_float64(case):
    (out, weights, grads), (want, want_weights, want_grads) = both(case, torch.float64,
                                                                   exact_data=False)
    for got, ref in [(out, want), (weights, want_weights), *zip(grads, want_grads)]:
        if ref is None:
            assert got is None
            continue
        assert got.dtype == torch.float64 and got.shape == ref.shape
        limit = 1e-13 * (1 + float(ref.detach().abs().max()))
        assert torch.allclose(got, ref, rtol=0, atol=limit, equal_nan=True)


# --- a preset: each projection is the composition by hand --------------------------------

class HandLinear(torch.autograd.Function):
    """One projection's three GEMMs by hand (tests/test_torch_recipes.Hand)."""

    @staticmethod
    def forward(ctx, x, weight, bias, hand):
        ctx.hand, ctx.has_bias = hand, bias is not None
        ctx.save_for_backward(x, weight)
        return hand.forward(x, weight, bias)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        dx, dw, db = ctx.hand.backward(x, weight, dy)
        return dx, dw, db if ctx.has_bias else None, None


def attention_by_hand(m, hands, query, key, value, low=None):
    """(L, N, E) inputs, need_weights=True, no masks: torch's steps, projections by hand;
    low: the dtype of an enclosing autocast, which the projections' outputs are cast to
    (exact there), as nn.Linear's are."""
    tgt, bsz, src = query.shape[0], query.shape[1], key.shape[0]
    e, heads = m.embed_dim, m.num_heads
    hd = e // heads
    w = m.in_proj_weight.chunk(3) if m._qkv_same_embed_dim else \
        (m.q_proj_weight, m.k_proj_weight, m.v_proj_weight)
    b = m.in_proj_bias.chunk(3)
    with torch.autocast("cpu", enabled=False):      # the hand's GEMMs are lpsim's own
        q, k, v = (HandLinear.apply(x.reshape(-1, x.shape[-1]), wi, bi, hand).reshape(
            x.shape[0], bsz, e).to(low or x.dtype)
            for x, wi, bi, hand in zip((query, key, value), w, b, hands))
    q = q.view(tgt, bsz * heads, hd).transpose(0, 1)
    k = k.view(src, bsz * heads, hd).transpose(0, 1)
    v = v.view(src, bsz * heads, hd).transpose(0, 1)
    weights = torch.softmax(torch.bmm(q * math.sqrt(1.0 / hd), k.transpose(-2, -1)), dim=-1)
    o = torch.bmm(weights, v).transpose(0, 1).reshape(tgt * bsz, e)
    with torch.autocast("cpu", enabled=False):
        out = HandLinear.apply(o, m.out_proj.weight, m.out_proj.bias, hands[3]).to(
            low or o.dtype)
    return out.view(tgt, bsz, e), weights.view(bsz, heads, tgt, src).mean(dim=1)


@pytest.mark.parametrize("name, options", [("mxfp8", {}), ("nvfp4", {}),
                                           ("fp8_current", {"kdim": 32, "vdim": 64})])
def test_each_projection_equals_the_composition_by_hand(name, options):
    """Self-attention (or cross-attention with other widths), two steps: blocks of 32 along
    K, 16 x 16 weight blocks and the RHT over 32 tokens; SR draws from one generator in the
    order the projections run, forward and backward, as simulate's layers share one."""
    r, width = PRESETS[name], 32
    torch.manual_seed(0)
    plain = nn.MultiheadAttention(width, HEADS, **options)
    with torch.no_grad():
        plain.in_proj_bias.normal_()
        plain.out_proj.bias.normal_()
    hand_module = copy.deepcopy(plain)
    sim = SimulatedMultiheadAttention.from_attention(plain, r, generator=lpsim.Generator(SEED))
    g = lpsim.Generator(SEED)
    hands = [Hand(r, generator=g, layer=i) for i in range(4)]
    tgt, src = 16, 32 if options else 16
    for step in range(2):
        query = (torch.randn(tgt, 2, width) * (1 + step)).requires_grad_()
        key = torch.randn(src, 2, plain.kdim).requires_grad_() if options else query
        value = torch.randn(src, 2, plain.vdim).requires_grad_() if options else query
        wrt = [query, key, value] if options else [query]
        dy = torch.randn(tgt, 2, width) * 1e-2
        out, weights = sim(query, key, value)
        grads = torch.autograd.grad((out * dy).sum(), wrt + list(plain.parameters()))
        want, want_weights = attention_by_hand(hand_module, hands, query, key, value)
        want_grads = torch.autograd.grad((want * dy).sum(),
                                         wrt + list(hand_module.parameters()))
        assert same(out, want) and same(weights, want_weights), (step, "forward")
        names = ["input"] * len(wrt) + [n for n, _ in plain.named_parameters()]
        for n, got, ref in zip(names, grads, want_grads, strict=True):
            assert same(got, ref), (step, n)
    assert [sim.projections[p].steps for p in sim.projections] == [2] * 4


def test_under_autocast_the_projections_stay_the_recipes_and_come_in_its_dtype():
    """Inside ``torch.autocast(bfloat16)`` the four projections are the recipe's GEMMs (not
    autocast's bfloat16 ones), their outputs in bfloat16 as nn.Linear's there, and the
    attention between them autocast's own, as nn.MultiheadAttention's: equal bit for bit
    to the composition by hand cast so, forward and backward."""
    r, width = PRESETS["mxfp8"], 32
    torch.manual_seed(0)
    plain = nn.MultiheadAttention(width, HEADS)
    hand_module = copy.deepcopy(plain)
    sim = SimulatedMultiheadAttention.from_attention(plain, r, generator=lpsim.Generator(SEED))
    g = lpsim.Generator(SEED)
    hands = [Hand(r, generator=g, layer=i) for i in range(4)]
    query = torch.randn(32, 2, width).requires_grad_()
    dy = torch.randn(32, 2, width) * 1e-2
    with torch.autocast("cpu", torch.bfloat16):
        out, weights = sim(query, query, query)
        want, want_weights = attention_by_hand(hand_module, hands, query, query, query,
                                               low=torch.bfloat16)
    assert out.dtype == want.dtype == torch.bfloat16
    assert same(out, want) and same(weights, want_weights)
    grads = torch.autograd.grad((out.float() * dy).sum(), [query] + list(plain.parameters()))
    want_grads = torch.autograd.grad((want.float() * dy).sum(),
                                     [query] + list(hand_module.parameters()))
    for got, ref in zip(grads, want_grads, strict=True):
        assert same(got, ref)


# --- telemetry, simulate ----------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, width=32, **options):
        super().__init__()
        self.attn = nn.MultiheadAttention(width, HEADS, **options)
        self.mlp = nn.Sequential(nn.Linear(width, 64), nn.ReLU(), nn.Linear(64, width))

    def forward(self, x):
        return self.mlp(x + self.attn(x, x, x, need_weights=False)[0])


def test_report_lists_the_four_projections_with_their_counts():
    model = simulate(Block(kdim=64), "mxfp8", generator=1, attention=True)
    x, key = torch.randn(16, 2, 32), torch.randn(32, 2, 64)
    out = model.attn(x, key, torch.randn(32, 2, 32))[0]
    out.sum().backward()
    rows = report(model).rows
    layers = list(dict.fromkeys(r["layer"] for r in rows))
    assert layers == ["attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.out_proj", "mlp.0",
                      "mlp.2"]
    assert all(sum(r["layer"] == n for r in rows) == 6 for n in layers)
    count = {(r["layer"], r["gemm"], r["operand"]): r["elements"] for r in rows}
    assert count["attn.q_proj", "fprop", "x"] == x.numel()
    assert count["attn.k_proj", "fprop", "x"] == key.numel()
    assert count["attn.k_proj", "fprop", "w"] == 32 * 64
    assert count["attn.out_proj", "wgrad", "dy"] == x.numel()
    assert count["mlp.0", "fprop", "x"] == 0
    t = model.attn.telemetry
    assert t["k_proj", "fprop", "x"].elements == key.numel() and len(t) == 24
    model.attn.reset_telemetry()
    assert all(s.elements == 0 for s in model.attn.telemetry.values())


def test_simulate_swaps_attention_keeping_parameters_state_and_copies():
    model = Block()
    params, keys = list(model.parameters()), list(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # no warning: nothing is left unsimulated
        simulate(model, "mxfp8", generator=1, attention=True)
    attn = model.attn
    assert isinstance(attn, SimulatedMultiheadAttention) and \
        isinstance(attn, nn.MultiheadAttention)
    assert type(attn.out_proj) is not SimulatedLinear        # run by attn's own out_proj GEMM
    assert all(p is q for p, q in zip(params, model.parameters())) and \
        len(params) == len(list(model.parameters()))
    assert list(model.state_dict()) == keys
    assert [attn.projections[p].layer_index for p in attn.projections] == [0, 1, 2, 3]
    assert [model.mlp[0].layer_index, model.mlp[2].layer_index] == [4, 5]
    x = torch.randn(32, 2, 32)
    before = attn.in_proj_weight.detach().clone()
    model(x).square().mean().backward()
    opt.step()
    assert not torch.equal(before, attn.in_proj_weight)
    model.eval()
    with torch.no_grad():
        y = model(x)
        for other in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
            assert isinstance(other.attn, SimulatedMultiheadAttention)
            assert torch.equal(other(x), y)
    # a new recipe for attention already simulated, attention=True or not
    simulate(model, "fp8_current")
    assert attn is not model.attn and model.attn.recipe.name == "fp8_current"
    assert model.attn.in_proj_weight is attn.in_proj_weight


def test_attention_false_warns_and_skip_leaves_a_module_whole():
    model = Block()
    with pytest.warns(UserWarning, match=r"\['attn\.out_proj'\].*attention=True"):
        simulate(model, "mxfp8")
    assert type(model.attn) is nn.MultiheadAttention
    model = Block()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        simulate(model, "mxfp8", attention=True, skip=["attn"])
    assert type(model.attn) is nn.MultiheadAttention and isinstance(model.mlp[0],
                                                                    SimulatedLinear)
    model = simulate(Block(), "mxfp8", attention=True,
                     skip=lambda name, m: isinstance(m, nn.MultiheadAttention))
    assert type(model.attn) is nn.MultiheadAttention


def test_keep_first_last_takes_an_attention_module_as_one_layer():
    model = nn.Sequential(Block(), nn.Linear(32, 32))
    simulate(model, "nvfp4", attention=True)
    attn = model[0].attn
    assert {g.recipe.name for g in attn.projections.values()} == {"bf16"}
    assert [model[0].mlp[0].recipe.name, model[0].mlp[2].recipe.name,
            model[1].recipe.name] == ["nvfp4", "nvfp4", "bf16"]


# --- refusals ---------------------------------------------------------------------------

def _calls():
    x = torch.randn(16, 2, 32)
    nested = torch.nested.nested_tensor([torch.randn(3, 32), torch.randn(5, 32)],
                                         layout=torch.jagged)
    return [
        ((torch.randn(2, 16, 2, 32),) * 3, {}, r"query of shape \(2, 16, 2, 32\); accepted"),
        ((x, torch.randn(16, 32), torch.randn(16, 32)), {},
         r"key of shape \(16, 32\) with a 3-D query; accepted: a 3-D key"),
        ((torch.randn(16, 2, 31),) * 3, {}, r"its last dimension is 31; accepted: 32"),
        ((x, torch.randn(16, 2, 32), torch.randn(15, 2, 32)), {},
         r"accepted: the same sequence and batch sizes"),
        ((x, torch.randn(16, 3, 32), torch.randn(16, 3, 32)), {},
         r"accepted: the same batch size"),
        ((x, x, x), {"key_padding_mask": torch.zeros(2, 16, dtype=torch.int64)},
         r"key_padding_mask of dtype torch\.int64; accepted: bool"),
        ((x, x, x), {"key_padding_mask": torch.zeros(16, 2, dtype=torch.bool)},
         r"key_padding_mask of shape \(16, 2\); accepted: \(2, 16\)"),
        ((x, x, x), {"attn_mask": torch.zeros(16, 15)},
         r"attn_mask of shape \(16, 15\); accepted: \(16, 16\) or \(8, 16, 16\)"),
        ((x, x, x), {"is_causal": True}, r"is_causal=True needs attn_mask"),
        ((nested,) * 3, {}, r"query is a nested tensor.*enable_nested_tensor=False"),
        ((torch.randn(12, 2, 32).requires_grad_(),) * 3, {},   # the RHT's 16 and blocks of 16
         r"layer 'attn\.q_proj': wgrad\.a\.fmt: block 16 does not divide K = 24"),
        ((x, torch.randn(12, 2, 32).requires_grad_(), torch.randn(12, 2, 32)), {},
         r"layer 'attn\.k_proj': wgrad\.a\.fmt: block 16 does not divide K = 24"),
    ]


def test_bad_calls_are_refused_and_change_nothing():
    every_layer = PRESETS["nvfp4"].with_(keep_first_last=False)
    model = simulate(Block(), every_layer, generator=3, attention=True)
    attn = model.attn
    state = attn.projections["q_proj"].generator.get_state()
    for args, kwargs, match in _calls():
        with pytest.raises(ValueError, match=match):
            attn(*args, **kwargs)
    assert attn.projections["q_proj"].generator.get_state() == state
    assert all(s.elements == 0 for s in attn.telemetry.values())
    assert [g.steps for g in attn.projections.values()] == [0] * 4
    with torch.no_grad():                    # no backward to follow: no wgrad to refuse
        assert attn(*(torch.randn(12, 2, 32),) * 3)[0].shape == (12, 2, 32)


@pytest.mark.parametrize("make, error, match", [
    (lambda: simulate(Block(), "mxfp8", attention="yes"), TypeError, r"attention='yes'"),
    (lambda: simulate(Block(), "mxfp8", attention=True, skip=["attn.out_proj"]), ValueError,
     r"skip=\['attn\.out_proj'\]: a projection of the attention module 'attn'.*"
     r"accepted: skip=\['attn'\]"),
    (lambda: simulate(nn.MultiheadAttention(32, 4), "mxfp8", attention=True), ValueError,
     r"model is itself the layer to swap \(MultiheadAttention\).*from_attention"),
    (lambda: simulate(nn.Linear(32, 32), "mxfp8"), ValueError,
     r"model is itself the layer to swap \(Linear\).*SimulatedLinear\.from_linear"),
    (lambda: SimulatedMultiheadAttention(32, 4), TypeError, r"from_attention"),
    (lambda: SimulatedMultiheadAttention.from_attention(nn.Linear(32, 32), "mxfp8"),
     TypeError, r"accepted: an nn\.MultiheadAttention"),
])
def test_bad_simulate_calls_are_refused(make, error, match):
    with pytest.raises(error, match=match):
        make()


class _OwnAttention(nn.MultiheadAttention):
    def forward(self, query, key, value, **kwargs):
        out, weights = super().forward(query, key, value, **kwargs)
        return out * 2, weights


def test_attention_with_a_forward_of_its_own_is_refused_and_hooks_move():
    """A subclass's own forward would be replaced by the simulated one: refused by name,
    before any layer is made; a plain module's hooks move to its simulated module."""
    model = nn.Sequential(nn.Linear(32, 32), _OwnAttention(32, 4))
    with pytest.raises(ValueError, match=r"module '1' is a _OwnAttention, an "
                                         r"nn.MultiheadAttention subclass with its own forward"):
        simulate(model, "mxfp8", attention=True)
    assert type(model[0]) is nn.Linear and not model[0]._forward_pre_hooks
    attn = nn.MultiheadAttention(32, 4).eval()
    seen = []
    attn.register_forward_hook(lambda module, args, out: seen.append(out[0].shape))
    model = simulate(nn.Sequential(attn), "mxfp8", attention=True, generator=0)
    assert isinstance(model[0], SimulatedMultiheadAttention) and not model[0].training
    x = torch.randn(32, 2, 32)
    model[0](x, x.clone(), x.clone())
    assert seen == [(32, 2, 32)]


def test_a_refused_simulate_leaves_the_model_unswapped():
    model = nn.Sequential(nn.Linear(32, 40), Block(40, kdim=32))
    with pytest.raises(ValueError, match=r"layer '1\.attn\.q_proj': fprop\.a\.fmt: block 32 "
                                         r"does not divide K = 40"):
        simulate(model, "mxfp8", attention=True, skip=["0"])
    assert type(model[1].attn) is nn.MultiheadAttention and \
        not any(isinstance(m, SimulatedLinear) for m in model.modules())


# --- a transformer trains ---------------------------------------------------------------

def test_a_transformer_encoder_layer_trains_and_its_inference_is_simulated():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 32), nn.TransformerEncoderLayer(
        32, HEADS, 64, dropout=0.0, batch_first=True), nn.Linear(32, 32))
    simulate(model, "mxfp8", generator=0, attention=True)
    attn = model[1].self_attn
    assert isinstance(attn, SimulatedMultiheadAttention)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    x = torch.randn(4, 16, 32)
    target = x.roll(1, dims=1)              # each token's predecessor: attention's work
    losses = []
    for _ in range(8):
        opt.zero_grad()
        loss = (model(x) - target).square().mean()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < 0.8 * losses[0], losses
    assert [g.steps for g in attn.projections.values()] == [8] * 4
    # eval + no_grad is nn.TransformerEncoderLayer's fast path, which would read the
    # projection weights directly: the simulated attention keeps it out
    model.eval()
    attn.reset_telemetry()
    with torch.no_grad():
        model(x)
    assert attn.telemetry["q_proj", "fprop", "x"].elements == x.numel()
