"""lpsim.torch.qtorch_compat against the installed qtorch, bit for bit where qtorch is
deterministic ("nearest"); stochastic modes checked for staying on the two neighbours.

Select with ``-m qtorch``.  qtorch JIT-compiles a C++ extension on its first import (~30 s).
"""

import math

import numpy as np
import pytest

pytestmark = pytest.mark.qtorch
torch = pytest.importorskip("torch")
quant = pytest.importorskip("qtorch.quant")
qnumber = pytest.importorskip("qtorch")
qoptim = pytest.importorskip("qtorch.optim")

import lpsim  # noqa: E402
from lpsim.torch import qtorch_compat as qc  # noqa: E402


def bits(t):
    return t.contiguous().view(torch.int32).numpy()


def f32(a):
    with np.errstate(over="ignore"):          # values beyond float32 become inf on purpose
        return np.asarray(a, np.float64).astype(np.float32)


def nudged(v):
    """v and its float32 neighbours on both sides."""
    v = f32(v)
    return np.concatenate([v, np.nextafter(v, np.float32(np.inf)),
                           np.nextafter(v, np.float32(-np.inf))])


def float_inputs(exp, man, rng):
    min_exp, emax = 2 - 2 ** (exp - 1), 2 ** (exp - 1)
    n = 600
    es = rng.integers(max(min_exp - man - 3, -149), min(emax + 3, 128), n)
    k = rng.integers(0, 2 ** man, n) if man else np.zeros(n, np.int64)
    mids = (1 + (k + 0.5) / 2.0 ** man) * np.exp2(es.astype(np.float64))     # normal midpoints
    ksub = rng.integers(0, 2 ** man + 1, 200) if man else rng.integers(0, 2, 200)
    sub_mids = (ksub + 0.5) * 2.0 ** (min_exp - man)                          # subnormal ones
    top = (2 - 2.0 ** -man) * 2.0 ** emax
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 2.0 ** -149, -2.0 ** -149,
               2.0 ** -126, 2.0 ** min_exp, 2.0 ** (min_exp - man), 3.4028234663852886e38,
               top, top * (1 + 2.0 ** -(man + 2)), top * (1 + 2.0 ** -(man + 1)), 2 * top]
    wide = rng.uniform(1, 3.4, 3000) * 10.0 ** rng.uniform(-45, 38, 3000)
    x = np.concatenate([nudged(mids[mids < 3.4e38]), nudged(sub_mids), f32(special),
                        f32(wide)])
    x = np.concatenate([x, -x])
    return torch.from_numpy(f32(x))


@pytest.mark.parametrize("exp", range(2, 9))
def test_float_quantize_nearest_bit_for_bit(exp):
    rng = np.random.default_rng(exp)
    for man in range(0, 23):
        x = float_inputs(exp, man, rng)
        theirs = quant.float_quantize(x, exp, man, rounding="nearest")
        ours = qc.float_quantize(x, exp, man, rounding="nearest")
        diff = np.flatnonzero(bits(theirs) != bits(ours))
        assert diff.size == 0, (exp, man, x[diff[:5]], theirs[diff[:5]], ours[diff[:5]])


def test_float_quantize_pinned_differences_from_lpsim_quantize():
    # ties away from zero, where lpsim's "nearest" ties to even
    x = torch.tensor([1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8])       # bf16 ties
    assert qc.float_quantize(x, 8, 7, "nearest").tolist() == [1.0078125, 1.015625]
    assert lpsim.quantize(x, "bf16").tolist() == [1.0, 1.015625]
    # the top exponent code is finite and overflow saturates (exp < 8): e5m2's max 114688
    big = torch.tensor([1e6, float("inf"), -1e6])
    assert qc.float_quantize(big, 5, 2, "nearest").tolist() == [114688.0, 114688.0, -114688.0]
    assert quant.float_quantize(big, 5, 2, "nearest").tolist() == [114688.0, 114688.0,
                                                                   -114688.0]
    assert lpsim.quantize(big, "e5m2").tolist() == [math.inf, math.inf, -math.inf]
    # negative values that round to zero and -0 come back as +0
    neg = torch.tensor([-0.0, -2.0 ** -30])
    assert bits(qc.float_quantize(neg, 5, 2, "nearest")).tolist() == [0, 0]
    assert bits(lpsim.quantize(neg, "e5m2")).tolist() == bits(torch.tensor([-0.0, -0.0])).tolist()
    # NaN saturates for exp < 8
    nan = torch.tensor([float("nan")])
    assert qc.float_quantize(nan, 4, 3, "nearest").item() == 480.0
    assert quant.float_quantize(nan, 4, 3, "nearest").item() == 480.0


def fixed_inputs(wl, fl, rng):
    q = 2.0 ** -fl
    k = rng.integers(-(2 ** (wl - 1)) - 4, 2 ** (wl - 1) + 4, 2000)
    edge = np.concatenate([(k + 0.5) * q, k * q,
                           rng.uniform(-1, 1, 2000) * 2.0 ** (wl - fl),
                           (np.arange(2 ** 23 - 6, 2 ** 23 + 6) * q),
                           (np.arange(2 ** 24 - 6, 2 ** 24 + 6) * q),
                           [0.0, -0.0, np.inf, -np.inf, np.nan, 1e30, -1e30]])
    x = np.concatenate([nudged(edge), -nudged(edge)])
    return torch.from_numpy(f32(x))


@pytest.mark.parametrize("wl, fl", [(8, 4), (4, 2), (16, 8), (24, 12), (26, 4), (32, 16),
                                    (8, 0), (12, 20), (2, 1)])
@pytest.mark.parametrize("clamp, symmetric", [(True, False), (True, True), (False, False)])
def test_fixed_point_quantize_nearest_bit_for_bit(wl, fl, clamp, symmetric):
    rng = np.random.default_rng(wl * 64 + fl)
    x = fixed_inputs(wl, fl, rng)
    theirs = quant.fixed_point_quantize(x, wl, fl, clamp=clamp, symmetric=symmetric,
                                        rounding="nearest")
    ours = qc.fixed_point_quantize(x, wl, fl, clamp=clamp, symmetric=symmetric,
                                   rounding="nearest")
    diff = np.flatnonzero(bits(theirs) != bits(ours))
    assert diff.size == 0, (x[diff[:5]], theirs[diff[:5]], ours[diff[:5]])


def test_fixed_point_pinned_differences():
    # an odd multiple of the quantum in [2^23, 2^24) quanta comes back one quantum up, and
    # a value just above the midpoint 0.5 quanta rounds down (float32 a + 0.5 rounds to 1)
    for a, qt, exact in [(2.0 ** 23 + 1, 2.0 ** 23 + 2, 2.0 ** 23 + 1), (0.5 + 2 ** -24, 0, 1)]:
        x = torch.tensor([a / 16])
        assert quant.fixed_point_quantize(x, 32, 4, rounding="nearest").item() == qt / 16
        assert qc.fixed_point_quantize(x, 32, 4, rounding="nearest").item() == qt / 16
        assert lpsim.quantize(x.double(), lpsim.fixed(32, 4)).item() == exact / 16
    # elsewhere lpsim.fixed's nearest equals qtorch's (here: a has at most 22 bits)
    rng = np.random.default_rng(5)
    xs = torch.from_numpy(f32(rng.integers(-2 ** 12, 2 ** 12, 5000) / 2.0 ** 8))
    assert np.array_equal(bits(quant.fixed_point_quantize(xs, 8, 3, rounding="nearest")),
                          bits(lpsim.quantize(xs, lpsim.fixed(8, 3))))


@pytest.mark.parametrize("wl", [1, 2, 4, 8, 12, 22])
@pytest.mark.parametrize("dim, shape", [(-1, (300,)), (0, (6, 50)), (1, (5, 7, 9))])
def test_block_quantize_nearest_bit_for_bit(wl, dim, shape):
    rng = np.random.default_rng(wl)
    x = rng.standard_normal(shape) * 10.0 ** rng.uniform(-3, 3, shape)
    x.reshape(-1)[:3] = [0.0, -0.0, 1e-42]
    xt = torch.from_numpy(f32(x))
    theirs = quant.block_quantize(xt, wl, dim=dim, rounding="nearest")
    ours = qc.block_quantize(xt, wl, dim=dim, rounding="nearest")
    assert np.array_equal(bits(theirs), bits(ours))
    sub = torch.from_numpy(f32(rng.standard_normal(40) * 1e-40))       # a subnormal block
    assert np.array_equal(bits(quant.block_quantize(sub, wl, rounding="nearest")),
                          bits(qc.block_quantize(sub, wl, rounding="nearest")))


def test_stochastic_modes_stay_on_the_two_neighbours_and_replay():
    g = lpsim.Generator(0)
    x = torch.linspace(-3, 3, 1001)
    lo = qc.float_quantize(x, 5, 2, "nearest")
    st = g.get_state()
    y = qc.float_quantize(x, 5, 2, "stochastic", generator=g)
    down = lpsim.quantize(x, "fp(5,2,0,saturate)", "down")
    up = lpsim.quantize(x, "fp(5,2,0,saturate)", "up")
    assert bool(((y == down) | (y == up)).all()) and not torch.equal(y, lo)
    g.set_state(st)
    assert torch.equal(y, qc.float_quantize(x, 5, 2, "stochastic", generator=g))
    f = qc.fixed_point_quantize(x, 8, 4, rounding="stochastic", generator=g)
    assert bool(((f * 16 - torch.floor(x * 16)).abs() <= 1).all())
    b = qc.block_quantize(x, 6, rounding="stochastic", generator=g)
    bn = qc.block_quantize(x, 6, rounding="nearest")
    assert bool(((b - bn).abs() <= 2.0 ** (2 - 6 + 2)).all())


def test_quantizer_module_and_optim_match_qtorch():
    fwd, bwd = qnumber.FloatingPoint(4, 3), qnumber.FixedPoint(8, 4)
    x = torch.linspace(-9, 9, 97, requires_grad=True)
    c = torch.linspace(-2, 2, 97)
    grads = []
    for q in (quant.quantizer(fwd, bwd, "nearest", "nearest"),
              qc.quantizer(fwd, bwd, "nearest", "nearest"),
              qc.Quantizer(qc.FloatingPoint(4, 3), qc.FixedPoint(8, 4), "nearest", "nearest")):
        x.grad = None
        y = q(x)
        (y * c).sum().backward()
        grads.append((bits(y.detach()), bits(x.grad)))
    for g in grads[1:]:
        assert np.array_equal(g[0], grads[0][0]) and np.array_equal(g[1], grads[0][1])
    # clamping_grad_zero: gradient zeroed where the forward clamped
    for make in (quant.quantizer, qc.quantizer):
        x.grad = None
        make(qnumber.FixedPoint(6, 2), qnumber.FloatingPoint(8, 7), "nearest", "nearest",
             clamping_grad_zero=True)(x).sum().backward()
        grads.append(bits(x.grad))
    assert np.array_equal(grads[-1], grads[-2]) and (grads[-1] == 0).any()

    def train(optlp_cls, quantizer_fn):
        torch.manual_seed(0)
        w = torch.nn.Parameter(torch.linspace(-1, 1, 33))
        base = torch.optim.SGD([w], lr=0.1, momentum=0.9)
        q = quantizer_fn(qnumber.FloatingPoint(5, 4), None, "nearest", "nearest")
        opt = optlp_cls(base, weight_quant=q, grad_quant=q, momentum_quant=q, acc_quant=q,
                        grad_scaling=2.0)
        for step in range(5):
            opt.zero_grad()
            ((w - 0.3 * step) ** 2).sum().backward()
            opt.step()
        return bits(w.detach())

    assert np.array_equal(train(qoptim.OptimLP, quant.quantizer), train(qc.OptimLP, qc.quantizer))


def test_compat_errors():
    with pytest.raises(TypeError, match="torch.float64"):
        qc.float_quantize(torch.ones(2, dtype=torch.float64), 5, 2)
    with pytest.raises(ValueError, match="invalid rounding mode 'up'"):
        qc.float_quantize(torch.ones(2), 5, 2, "up")
    for exp, man in [(5, 24), (0, 3), (32, 3), (5, -1), (9.0, 3)]:
        with pytest.raises(ValueError, match=rf"float_quantize\(exp={exp!r}, man={man!r}\): "
                                             r"accepted 1 <= exp <= 31, 0 <= man <= 23"):
            qc.float_quantize(torch.ones(2), exp, man)
    for exp, man in [(9, 3), (8, 24), (8, 0)]:             # qtorch.FloatingPoint's ranges
        with pytest.raises(ValueError, match=rf"FloatingPoint\(exp={exp}, man={man}\)"):
            qc.FloatingPoint(exp, man)
    with pytest.raises(TypeError, match="SGD or Adam"):
        qc.OptimLP(torch.optim.RMSprop([torch.nn.Parameter(torch.ones(1))]))


# --- issue 35: what qtorch takes, with qtorch's results ---------------------------------
@pytest.mark.parametrize("exp", [9, 10, 12, 16, 24, 31])
def test_float_quantize_wide_exponents_bit_for_bit(exp):
    # qtorch's own test_device.py::test_floating_point calls float_quantize(x, exp=9, man=6):
    # exp > 8 has no subnormal step and no clip (qtorch's C++ is defined up to exp = 31)
    rng = np.random.default_rng(100 + exp)
    for man in range(0, 23):
        x = float_inputs(8, man, rng)                  # float32's range, subnormals, specials
        theirs = quant.float_quantize(x, exp, man, rounding="nearest")
        ours = qc.float_quantize(x, exp, man, rounding="nearest")
        diff = np.flatnonzero(bits(theirs) != bits(ours))
        assert diff.size == 0, (man, x[diff[:5]], theirs[diff[:5]], ours[diff[:5]])
    x = torch.rand(20, generator=torch.Generator().manual_seed(exp))   # test_device's inputs
    assert torch.equal(qc.float_quantize(x, exp=exp, man=6, rounding="nearest"),
                       quant.float_quantize(x, exp=exp, man=6, rounding="nearest"))
    neg = torch.tensor([-0.0, -2.0 ** -140])          # the sign is kept above exp = 8
    assert bits(qc.float_quantize(neg, exp, 2, "nearest")).tolist() == \
        bits(quant.float_quantize(neg, exp, 2, "nearest")).tolist() == \
        bits(torch.tensor([-0.0, -0.0])).tolist()


@pytest.mark.parametrize("exp", [1, 2, 4, 5, 7, 8, 9])
def test_man_23_keeps_every_bit_as_qtorch_stochastic_does(exp):
    # FloatingPoint(8, 23) was accepted, then its quantizer refused man=23.  qtorch's
    # stochastic rounding adds no random bit at man = 23, so its result is deterministic:
    # the value, with the exponent clipped (exp < 8) and its subnormal step; both modes
    # here give it (qtorch's "nearest" shifts by -1 there, undefined in C)
    x = float_inputs(min(exp, 8), 22, np.random.default_rng(exp))
    theirs = bits(quant.float_quantize(x, exp, 23, rounding="stochastic"))
    for mode in ("nearest", "stochastic"):
        assert np.array_equal(bits(qc.float_quantize(x, exp, 23, mode)), theirs)
    if exp == 8:                                        # float32 itself: x, -0 aside
        finite = torch.isfinite(x) & (x != 0)
        assert torch.equal(qc.float_quantize(x, 8, 23, "nearest")[finite], x[finite])


def test_floating_point_8_23_quantizer_runs():
    x = torch.linspace(-3, 3, 41, requires_grad=True)
    for make in (quant.quantizer, qc.quantizer):
        x.grad = None
        make(qnumber.FloatingPoint(8, 23), qnumber.FloatingPoint(8, 23), "stochastic",
             "stochastic")(x).sum().backward()
        assert torch.equal(x.grad, torch.ones(41))
    q = qc.Quantizer(qc.FloatingPoint(8, 23), qc.FloatingPoint(8, 23), "nearest", "nearest")
    assert torch.equal(q(x), x)


def test_compat_quantizers_pickle_and_load_with_the_same_outputs(tmp_path):
    # torch.save of a model holding a compat Quantizer failed: "Can't pickle local object"
    import pickle
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(6, 5),
        qc.Quantizer(qc.FloatingPoint(5, 2), qc.FixedPoint(8, 4), "nearest", "nearest"),
        torch.nn.Linear(5, 3),
        qc.Quantizer(qc.BlockFloatingPoint(6), qnumber.FloatingPoint(4, 3), "stochastic",
                     "nearest", generator=lpsim.Generator(3)))
    path = tmp_path / "model.pt"
    torch.save(model, path)
    loaded = torch.load(path, weights_only=False)
    x = torch.randn(4, 6)
    for m in (model, loaded):
        out = m(x)
        out.sum().backward()
        m.out = bits(out.detach())
    assert np.array_equal(model.out, loaded.out)
    for p, q in zip(model.parameters(), loaded.parameters()):
        assert np.array_equal(bits(p.grad), bits(q.grad))
    q = pickle.loads(pickle.dumps(qc.quantizer(qc.FixedPoint(6, 2), qc.FloatingPoint(8, 7),
                                               "nearest", "nearest", clamping_grad_zero=True)))
    xg = torch.linspace(-9, 9, 37, requires_grad=True)
    q(xg).sum().backward()
    want = torch.linspace(-9, 9, 37, requires_grad=True)
    quant.quantizer(qnumber.FixedPoint(6, 2), qnumber.FloatingPoint(8, 7), "nearest",
                    "nearest", clamping_grad_zero=True)(want).sum().backward()
    assert np.array_equal(bits(xg.grad), bits(want.grad))


def test_numpy_integer_widths_are_taken_as_qtorch_takes_them():
    """qtorch accepts numpy integers for its widths; the drop-in refused them with a range
    error that named an in-range value."""
    x = torch.tensor(np.random.default_rng(3).standard_normal(256).astype(np.float32))
    five, two, eight, four = np.int64(5), np.int32(2), np.uint8(8), np.int64(4)
    assert np.array_equal(bits(qc.float_quantize(x, five, two, "nearest")),
                          bits(quant.float_quantize(x, five, two, "nearest")))
    assert np.array_equal(bits(qc.fixed_point_quantize(x, eight, four, rounding="nearest")),
                          bits(quant.fixed_point_quantize(x, eight, four, rounding="nearest")))
    assert np.array_equal(bits(qc.block_quantize(x, eight, np.int64(-1), "nearest")),
                          bits(quant.block_quantize(x, eight, -1, "nearest")))
    assert repr(qc.FloatingPoint(five, two)) == repr(qc.FloatingPoint(5, 2))
    assert repr(qc.FixedPoint(eight, four)) == repr(qc.FixedPoint(8, 4))
    assert repr(qc.BlockFloatingPoint(eight, np.int64(0))) == repr(qc.BlockFloatingPoint(8, 0))
    with pytest.raises(ValueError, match=r"exp=5\.0"):
        qc.float_quantize(x, 5.0, 2, "nearest")


def test_bool_widths_are_taken_as_qtorch_takes_them():
    """qtorch takes True as 1 (a bool is a Python int); the drop-in's range check let it
    through and fp() then refused it in another function's words."""
    x = torch.tensor(np.random.default_rng(4).standard_normal(64).astype(np.float32))
    assert np.array_equal(bits(qc.float_quantize(x, 5, True, "nearest")),
                          bits(quant.float_quantize(x, 5, True, "nearest")))
    assert np.array_equal(bits(qc.block_quantize(x, True, rounding="nearest")),
                          bits(quant.block_quantize(x, True, rounding="nearest")))


@pytest.mark.parametrize("quantize", [
    lambda x: qc.float_quantize(x, 5, 2, "nearest"),
    lambda x: qc.fixed_point_quantize(x, 8, 4, rounding="nearest"),
    lambda x: qc.block_quantize(x, 8, rounding="nearest")])
def test_a_lazily_negated_view_is_rounded_as_its_values(quantize):
    """x.conj().imag is negated lazily: float_quantize once failed reading its bits."""
    z = torch.complex(torch.ones(64), torch.linspace(-3, 3, 64)).conj().imag
    assert z.is_neg()
    assert np.array_equal(bits(quantize(z)), bits(quantize(z.resolve_neg())))


@pytest.mark.parametrize("acc", [False, True])
def test_optimlp_quantizes_the_gradients_a_closure_makes(acc):
    """OptimLP.step(closure) evaluates the closure first and quantizes the gradients it
    made: the step equals one whose gradients were made before it (qtorch's, which never
    calls a closure), and the closure's loss comes back.  The wrapped step once called the
    closure after the quantization, whose backward pass put the unquantized gradients back
    (with acc_quant, at the accumulators' weights)."""
    q = qc.quantizer(qc.FloatingPoint(3, 1), None, "nearest", "nearest")
    target = torch.tensor([1.0, -2.0, 0.5])

    def run(use_closure):
        w = torch.nn.Parameter(torch.tensor([1.0, 3.7, 0.1]))
        opt = qc.OptimLP(torch.optim.SGD([w], lr=1.0), grad_quant=q,
                         acc_quant=q if acc else None, weight_quant=q if acc else None)
        seen = []

        def closure():
            opt.zero_grad()
            seen.append(w.detach().clone())
            loss = ((w - target) ** 2).sum() * 0.9
            loss.backward()
            return loss
        losses = []
        for _ in range(2):
            if use_closure:
                losses.append(float(opt.step(closure)))
            else:
                losses.append(float(closure()))
                assert opt.step() is None
        return w.detach(), losses, seen
    got, want = run(True), run(False)
    assert torch.equal(got[0], want[0]) and got[1] == want[1]
    for a, b in zip(got[2], want[2]):           # the closure saw the model's own weights
        assert torch.equal(a, b)


@pytest.mark.parametrize("call", [
    lambda x, v: qc.fixed_point_quantize(x, 4, 0, clamp=v, rounding="nearest"),
    lambda x, v: qc.fixed_point_quantize(x, 4, 0, symmetric=v, rounding="nearest"),
    lambda x, v: qc.FixedPoint(4, 1, clamp=v),
    lambda x, v: qc.FixedPoint(4, 1, symmetric=v)])
def test_a_string_flag_is_refused_by_name(call):
    """clamp="False" (a config file's or argparse's value) was taken by its truth: clamped;
    qtorch refuses a string there too."""
    x = torch.tensor([-9.0, -8.0, 3.3, 9.0])
    with pytest.raises(TypeError, match=r"(clamp|symmetric)='False' is not a bool"):
        call(x, "False")


def test_flags_qtorch_converts_are_taken_as_it_takes_them():
    """qtorch's binding converts numbers, None and numpy bools by their truth; its
    FixedPoint asserts a bool symmetric (numpy's bool taken here too)."""
    x = torch.tensor([-9.0, -8.0, 3.3, 9.0])
    for v in (1, 0, 2.5, None, np.bool_(True), np.int64(0)):
        assert np.array_equal(
            bits(qc.fixed_point_quantize(x, 4, 0, clamp=v, symmetric=v, rounding="nearest")),
            bits(quant.fixed_point_quantize(x, 4, 0, clamp=v, symmetric=v, rounding="nearest")))
    assert qc.FixedPoint(4, 1, clamp=1).clamp is True
    assert qc.FixedPoint(4, 1, symmetric=np.bool_(True)).symmetric is True
    with pytest.raises(TypeError, match="symmetric=1 is not a bool; accepted: True or False$"):
        qc.FixedPoint(4, 1, symmetric=1)
