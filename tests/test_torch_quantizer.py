"""lpsim.torch.quantizer / Quantizer: forward rounds x, backward rounds the incoming gradient."""

import numpy as np
import pytest

import lpsim

torch = pytest.importorskip("torch")
from lpsim.torch import Quantizer, Rounding, quantizer  # noqa: E402


def test_forward_and_backward_equal_lpsim_quantize_of_the_right_tensors():
    # h = Q(x * w) elementwise, L = sum(c * h): dL/dh = c, so dL/dw = round_b(c) * x exactly
    x = torch.tensor([0.7, -1.3, 2.9, 0.011])
    w = torch.tensor([1.1, 0.37, -2.2, 5.0], requires_grad=True)
    c = torch.tensor([0.123, -7.77, 3.3, 1e-3])
    q = quantizer("fp(4,3,4)", "fp(5,2,0)")
    h = q(x * w)
    (c * h).sum().backward()
    assert np.array_equal(h.detach().numpy(),
                          lpsim.quantize((x * w).detach().numpy(), "fp(4,3,4)"))
    expected = lpsim.quantize(c.numpy(), "fp(5,2,0)") * x.numpy()
    assert np.array_equal(w.grad.numpy(), expected)


def test_two_layer_linear_model_hand_computed_gradient():
    # y = Qo(W2 Qa(W1 x)), L = y: dL/dW2 = Qb_o(1) Qa(W1 x)^T, dL/dW1 = Qb_a(W2^T Qb_o(1)) x^T
    torch.manual_seed(0)
    x = torch.randn(3, dtype=torch.float64)
    W1 = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    W2 = torch.randn(1, 4, dtype=torch.float64, requires_grad=True)
    qa, qo = Quantizer("e4m3", "e5m2"), Quantizer("bf16", "e4m3")
    a = qa(W1 @ x)
    y = qo(W2 @ a)
    y.sum().backward()
    r = lambda v, f: torch.from_numpy(lpsim.quantize(v.detach().numpy(), f))  # noqa: E731
    a_ref = r(W1 @ x, "e4m3")
    g_y = r(torch.ones(1, dtype=torch.float64), "e4m3")
    assert torch.equal(W2.grad, torch.outer(g_y, a_ref))
    assert torch.equal(W1.grad, torch.outer(r(W2.detach().t() @ g_y, "e5m2"), x))


def test_gradcheck_where_rounding_is_exact():
    # fp64 on both sides is the identity on float64: gradcheck checks the plumbing
    q = quantizer("fp64", "fp64")
    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: q(t) ** 2, (x,))
    # a None side is the identity; gradients of a bf16 input come back in bf16
    xb = torch.randn(4).to(torch.bfloat16).requires_grad_()
    y = quantizer(None, "e5m2")(xb)
    assert y.dtype == torch.bfloat16
    (y.float() * 3.3).sum().backward()
    assert xb.grad.dtype == torch.bfloat16
    assert torch.equal(xb.grad.float(), torch.full((4,), lpsim.quantize(3.3, "e5m2")))


def test_stochastic_sides_with_a_generator_replay_and_count():
    g = lpsim.Generator(4)
    stats_f, stats_b = lpsim.RoundingStats(), lpsim.RoundingStats()
    q = quantizer("e4m3", "e4m3", "stochastic", "stochastic", generator=g,
                  forward_stats=stats_f, backward_stats=stats_b)
    x = torch.linspace(-3, 3, 64, requires_grad=True)
    state = g.get_state()
    y = q(x)
    y.backward(torch.full((64,), 0.3))
    g.set_state(state)
    ref_y = lpsim.quantize(x.detach().numpy(), "e4m3", "stochastic", generator=g)
    ref_g = lpsim.quantize(np.full(64, 0.3, np.float32), "e4m3", "stochastic", generator=g)
    assert np.array_equal(y.detach().numpy(), ref_y)
    assert np.array_equal(x.grad.numpy(), ref_g)
    assert stats_f.elements == 64 and stats_b.elements == 64


def test_rounding_sites_are_mutable_and_checked():
    site = Rounding("e4m3")
    q = quantizer(site, None)
    x = torch.tensor([1.3])
    assert q(x).item() == 1.25
    site.fmt = lpsim.parse_format("bf16")
    assert q(x).item() == lpsim.quantize(1.3, "bf16")
    with pytest.raises(ValueError, match="unknown rounding 'nearst'"):
        quantizer("bf16", None, "nearst")
    with pytest.raises(ValueError, match="unknown format"):
        Quantizer("bf17")
    with pytest.raises(TypeError, match="torch tensor"):
        quantizer("bf16")(np.ones(2))


# --- issue 35: torch's module conventions ------------------------------------------------
def test_quantizer_modules_pickle_and_load_with_the_same_outputs(tmp_path):
    # torch.save of a model holding a Quantizer failed: "Can't pickle local object"
    import copy
    import pickle
    torch.manual_seed(0)
    g = lpsim.Generator(7)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), Quantizer("e4m3", "e5m2"),
                                torch.nn.Linear(5, 3),
                                Quantizer("bf16", "e4m3", "stochastic", "stochastic",
                                          generator=g))
    path = tmp_path / "model.pt"
    torch.save(model, path)
    loaded = torch.load(path, weights_only=False)
    x = torch.randn(4, 6)
    state = g.get_state()
    want = model(x)
    want.sum().backward()
    assert loaded[3].quantize.forward.generator.get_state() == state   # saved before the call
    got = loaded(x)
    got.sum().backward()
    assert torch.equal(got, want)
    for p, q in zip(model.parameters(), loaded.parameters()):
        assert torch.equal(p.grad, q.grad)
    for clone in (pickle.loads(pickle.dumps(model[1])), copy.deepcopy(model[1])):
        assert torch.equal(clone(x[:, :5]), model[1](x[:, :5]))
    q = pickle.loads(pickle.dumps(quantizer("e4m3", "e5m2")))
    assert torch.equal(q(x), quantizer("e4m3", "e5m2")(x))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_quantizer_keeps_the_input_dtype_forward_and_backward(dtype):
    # a bf16 Sequential(Linear, Quantizer, Linear) failed: the quantizer returned float32
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), Quantizer("e4m3", "e5m2"),
                                torch.nn.Linear(16, 2)).to(dtype)
    x = torch.randn(5, 8).to(dtype)
    h = model[0](x)
    out = model(x)
    assert out.dtype == dtype
    assert torch.equal(model[1](h), torch.from_numpy(lpsim.quantize(
        h.detach().float().numpy(), "e4m3")).to(dtype))
    out.float().sum().backward()
    assert model[0].weight.grad.dtype == dtype
    # the gradient at the quantizer: round_b of the incoming one, exactly, in the dtype
    hq = h.detach().requires_grad_()
    c = torch.randn(5, 16).to(dtype)
    (model[1](hq) * c).float().sum().backward()
    assert hq.grad.dtype == dtype
    assert torch.equal(hq.grad, torch.from_numpy(lpsim.quantize(c.float().numpy(),
                                                                "e5m2")).to(dtype))


def test_quantizer_refuses_values_the_input_dtype_cannot_hold():
    # fp16 input rounded to bf16: 65504 -> 65536, beyond float16; never a second rounding
    x = torch.tensor([1.0, 65504.0], dtype=torch.float16)
    with pytest.raises(ValueError, match=r"quantizer forward: torch.float16 input rounded to "
                                         r"bf16 gives 65536.0, which torch.float16 cannot hold"):
        Quantizer("bf16")(x)
    xb = torch.tensor([1.0, 3.0], dtype=torch.bfloat16)
    assert Quantizer("fp16")(xb).dtype == torch.bfloat16      # values bf16 holds: taken
    # the refused call leaves the counters and the generator as they were; one that fits
    # counts and advances
    g, stats = lpsim.Generator(0), lpsim.RoundingStats()
    q = Quantizer("bf16", None, "stochastic", generator=g, forward_stats=stats)
    with pytest.raises(ValueError, match="cannot hold"):
        q(torch.full((16,), 65504.0, dtype=torch.float16))   # up with probability 7/8 each
    assert g.get_state() == (0, 0) and stats == lpsim.RoundingStats()
    q(xb)
    assert g.get_state() == (0, 1) and stats.elements == 2


@pytest.mark.parametrize("x", [torch.tensor([2 ** 24 + 1]), torch.tensor([1.1 + 2.7j]),
                               torch.tensor([True])])
def test_a_quantizer_refuses_integer_bool_and_complex_tensors(x):
    """They were cast to float32 (2**24 + 1 rounded twice, an imaginary part dropped) and
    back, silently."""
    with pytest.raises(TypeError, match=f"the quantizer's input has dtype {x.dtype}"):
        quantizer("fp32", None, "up")(x)
    assert quantizer(None, None)(x) is not None          # the identity takes anything
