"""Native CA-SGD (backend="cuda") under numba's CUDA simulator: shared jitted steps, kernels
bit-identical to the CPU simulator, device sampling, the driver end to end on CPU tensors."""

import math
import re

import numpy as np
import pytest
from numba import config

import lpsim
from lpsim.casgd import RECIPES, CASGDClassifier, casgd, local_error_bound, make_synth, sgd
from lpsim.casgd import inner
from lpsim.casgd.sampling import SAMPLE_STREAM, PhiloxIndices
from lpsim.casgd.solvers import _numpy_inner
from lpsim.casgd.recipes import Rounder
from lpsim.rounding import kernel_params

torch = pytest.importorskip("torch")
SIM = bool(config.ENABLE_CUDASIM)
needs_sim = pytest.mark.skipif(not SIM, reason="runs the kernels in numba's CUDA simulator "
                               "(NUMBA_ENABLE_CUDASIM=1, set by conftest without LPSIM_TEST_GPU)")
DEVICE = "cpu"      # the simulated kernels take CPU tensors


@pytest.fixture(scope="module")
def data():
    return make_synth(240, 24, seed=1)[:2]


def _inputs(b, s, seed=0, loss="logistic"):
    """Margins and Gram of s*b bf16 rows (as the kernels get them) and labels."""
    rng = np.random.default_rng(seed)
    Y = lpsim.quantize(rng.standard_normal((s * b, 9)).astype(np.float32), "bf16")
    r = lpsim.quantize((Y @ rng.standard_normal(9).astype(np.float32)) * 0.3, "bf16")
    G = (Y @ Y.T).astype(np.float32)
    y = {"logistic": np.where(rng.random(s * b) < 0.5, -1.0, 1.0),
         "linear": rng.standard_normal(s * b),
         "poisson": rng.poisson(1.0, s * b).astype(np.float64)}[loss]
    return r, G, y


def test_exp_fma_within_one_ulp_and_python_equals_njit():
    from numba import njit

    @njit
    def many(xs, out):
        for i in range(xs.size):
            out[i] = inner.exp_fma(xs[i])

    xs = np.concatenate([np.linspace(-700.0, 700.0, 40001),
                         np.random.default_rng(0).standard_normal(4000) * 4])
    got = np.empty_like(xs)
    many(xs, got)
    ref = np.exp(xs)
    assert (np.abs(got - ref) <= np.spacing(ref)).all()      # |error| <= 1 ulp of exp(x)
    assert inner.exp_fma(800.0) == math.inf and inner.exp_fma(-800.0) == 0.0
    assert math.isnan(inner.exp_fma(math.nan))
    # the simulator runs the Python bodies (exact FMA by fractions, numpy bitcasts)
    py = np.array([inner.exp_fma(x) for x in xs[::40]])
    np.testing.assert_array_equal(py, got[::40])


@pytest.mark.parametrize("fmt", ["fp32", "bf16", "tf32", "fp16", "fp64"])
def test_round_nearest_equals_quantize(fmt):
    # the shared steps' rounding (fp32: the hardware conversion) against lpsim.quantize
    from numba import njit

    @njit
    def many(v, out, p):
        for i in range(v.size):
            out[i] = inner.round_nearest(v[i], p)

    rng = np.random.default_rng(1)
    v = np.concatenate([rng.standard_normal(20000) * 10.0 ** rng.integers(-48, 48, 20000),
                        [3.4028235677973366e38, np.nextafter(3.4028235677973366e38, 0), 1e39,
                         -1e39, 1e-46, 7.1e-46, -0.0, 0.0, np.inf, -np.inf, 65520.0, 65519.0],
                        rng.standard_normal(2000).astype(np.float32) * (1 + 2.0 ** -24)])
    want = lpsim.quantize(v, fmt).view(np.int64)
    p = inner.slot_params(lpsim.parse_format(fmt))
    assert (p == inner.FP32_PARAMS) == (fmt == "fp32")
    # fp32 also by the rounding core's own params: both of round_nearest's paths
    params = [p, tuple(kernel_params(lpsim.parse_format(fmt), np.float64))]
    for p in params[:2 if fmt == "fp32" else 1]:
        got = np.empty_like(v)
        many(v, got, p)
        np.testing.assert_array_equal(got.view(np.int64), want)
        py = np.array([inner.round_nearest(x, p) for x in v[::20]])      # the simulator's path
        np.testing.assert_array_equal(py.view(np.int64), got[::20].view(np.int64))


def test_round_to_rounds_once():
    # torch takes float64 -> bf16 through float32: 1 + 2^-8 + 2^-30 would tie and go to 1
    from lpsim.casgd.native import round_to
    x = torch.tensor([1 + 2.0 ** -8 + 2.0 ** -30, 1 + 2.0 ** -8, -3.0, 1 + 2.0 ** -11 + 2.0 ** -40],
                     dtype=torch.float64)
    for fmt in ("bf16", "fp16", "tf32", "fp(5,2,0)"):
        want = lpsim.quantize(x.numpy(), fmt)
        np.testing.assert_array_equal(round_to(x, fmt).double().numpy(), want)
        np.testing.assert_array_equal(round_to(x.float(), fmt).double().numpy(),
                                      lpsim.quantize(x.float().numpy(), fmt))
    assert round_to(x, "bf16").dtype == torch.bfloat16
    assert round_to(x, "tf32").dtype == torch.float32


def test_python_fma_is_exact():
    assert inner.fma(1.0 + 2.0 ** -30, 1.0 - 2.0 ** -30, -1.0) == -(2.0 ** -60)   # a*b inexact
    assert math.copysign(1, inner.fma(-0.0, 1.0, -0.0)) == -1.0
    assert math.copysign(1, inner.fma(1.0, 1.0, -1.0)) == 1.0
    assert inner.fma(1e308, 10.0, 0.0) == math.inf


@pytest.mark.parametrize("key", ["A", "C", "D", "G", "I"])
@pytest.mark.parametrize("loss", ["logistic", "linear", "poisson"])
def test_jitted_steps_track_the_numpy_recurrence(key, loss):
    # the fp64 recipe: both evaluate the same recurrence nearly exactly (within 1e-12); for
    # the others the two differ only by the correction dot's order and the residual's exp:
    # Theorem 5.7 bounds both, here checked as u_c/u_sigma-sized gaps
    b, s = 3, 4
    r, G, y = _inputs(b, s, loss=loss)
    recipe = RECIPES[key]
    delta = np.empty(s * b)
    alpha_c, code, pc, ps = inner.inner_args(recipe, loss, 0.05)
    inner.inner_recurrence_cpu(r, G, y, delta, np.empty(s * b), b, s, alpha_c, code, pc, ps)
    ref = _numpy_inner(r, G, y, recipe, alpha_c, b, s, lpsim.casgd.get_loss(loss), Rounder())
    tol = 64 * max(recipe.u_c.u, recipe.u_sigma.u) * (1 + np.abs(ref))
    assert (np.abs(delta - ref) <= tol).all()
    assert np.array_equal(lpsim.quantize(delta, recipe.u_sigma.fmt), delta)   # on the grid
    r64 = RECIPES["fp64"]
    a64, code, pc, ps = inner.inner_args(r64, loss, 0.05)
    inner.inner_recurrence_cpu(r, G, y, delta, np.empty(s * b), b, s, a64, code, pc, ps)
    ref = _numpy_inner(r.astype(np.float64), G.astype(np.float64), y, r64, 0.05, b, s,
                       lpsim.casgd.get_loss(loss), Rounder())
    np.testing.assert_allclose(delta, ref, rtol=1e-12, atol=1e-14)


@needs_sim
@pytest.mark.parametrize("key,loss,b,s", [("A", "logistic", 3, 4), ("C", "logistic", 5, 2),
                                          ("D", "poisson", 2, 3), ("G", "linear", 3, 3),
                                          ("I", "logistic", 1, 5)])
def test_inner_kernel_bit_identical_to_cpu(key, loss, b, s):
    _check_inner_kernel(key, loss, b, s)


@needs_sim
def test_inner_kernel_reading_delta_c_from_global_memory(monkeypatch):
    # past SHARED_ROWS the kernel reads delta_c where it writes it (recipe G: u_c is tf32, so
    # delta_c is not delta); the lane sums' four-at-a-time path is the CPU's own
    # (test_numpy_inner_equals_jitted_steps_bit_for_bit at 312 columns) and a GPU's
    # (test_casgd_native_gpu.py at bench_casgd's sizes)
    import lpsim_cuda.casgd as kernels
    monkeypatch.setattr(kernels, "SHARED_ROWS", 0)
    _check_inner_kernel("G", "logistic", 3, 5)


def _check_inner_kernel(key, loss, b, s):
    from lpsim_cuda.casgd import inner_recurrence
    r, G, y = _inputs(b, s, seed=b * s, loss=loss)
    alpha_c, code, pc, ps = inner.inner_args(RECIPES[key], loss, 0.07)
    want, want_c = np.empty(s * b), np.empty(s * b)
    inner.inner_recurrence_cpu(r, G, y, want, want_c, b, s, alpha_c, code, pc, ps)
    got, got_c = torch.zeros(s * b, dtype=torch.float64), torch.zeros(s * b, dtype=torch.float64)
    inner_recurrence(torch.from_numpy(r), torch.from_numpy(G), torch.from_numpy(y), got, got_c,
                     b, s, alpha_c, code, pc, ps)
    np.testing.assert_array_equal(got.numpy().view(np.int64), want.view(np.int64))
    np.testing.assert_array_equal(got_c.numpy().view(np.int64), want_c.view(np.int64))
    assert np.abs(want).min() > 0          # every row was written


def test_philox_sampler_uniform_and_replayable():
    rows = PhiloxIndices(10, seed=3)
    first, second = rows.take(20000), rows.take(5)
    again = PhiloxIndices(10, seed=3).take(20005)
    np.testing.assert_array_equal(np.r_[first, second], again)    # draw t depends on (seed, t)
    counts = np.bincount(first, minlength=10)
    chi2 = ((counts - 2000) ** 2 / 2000).sum()
    assert chi2 < 44.3          # chi-square, 9 dof: false alarm 1e-6 (fixed seed: deterministic)
    assert not np.array_equal(PhiloxIndices(10, seed=4).take(50), first[:50])


@needs_sim
def test_device_sampler_equals_host_replay():
    from lpsim_cuda.casgd import sample_rows
    idx = torch.empty(70, dtype=torch.int64)
    first = torch.tensor([33], dtype=torch.int64)
    lo, hi = 7, 1
    sample_rows(idx, first, 1000, lo, hi, SAMPLE_STREAM)
    host = PhiloxIndices(1000, seed=lo | (hi << 32))
    host.take(33)
    np.testing.assert_array_equal(idx.numpy(), host.take(70))


@needs_sim
@pytest.mark.parametrize("key", ["A", "C", "D", "G"])
def test_native_outer_iteration_within_local_error_bound(data, key):
    # one outer iteration from x = 0 on the same rows: native and simulator are both within
    # the bound of the exact iterate, so within twice the bound of each other
    A, y = data
    b, s, eta = 4, 3, 0.5
    nat = casgd(A, y, eta=eta, b=b, s=s, H=1, recipe=key, seed=9, backend="cuda", device=DEVICE)
    sim = casgd(A, y, eta=eta, b=b, s=s, H=1, recipe=key, seed=9, sampler="philox")
    idx = PhiloxIndices(A.shape[0], 9).take(s * b)
    bound = local_error_bound(A[idx], np.zeros(A.shape[1]), y[idx], eta, b, s, 1, key)
    gap = np.linalg.norm(nat.x - sim.x)
    assert gap <= 2 * bound.total and np.linalg.norm(sim.x) > 0.01


@needs_sim
def test_native_driver_end_to_end(data):
    A, y = data
    kw = dict(eta=0.5, b=4, s=4, H=6, recipe="C", seed=2, record=6)
    nat = casgd(A, y, backend="cuda", device=DEVICE, **kw)
    sim = casgd(A, y, sampler="philox", **kw)
    assert nat.loss_curve[-1] < nat.loss_curve[0]
    assert abs(nat.loss_curve[-1] - sim.loss_curve[-1]) <= 5e-3 * sim.loss_curve[-1]  # 0.5%
    # CSR data: the sampled rows densified on the device, the same bits as dense storage
    import scipy.sparse as sp
    As = np.where(np.abs(A) > 0.15, A, 0.0)
    dense = casgd(As, y, backend="cuda", device=DEVICE, **kw)
    csr = casgd(sp.csr_matrix(As), y, backend="cuda", device=DEVICE, **kw)
    np.testing.assert_array_equal(csr.x, dense.x)
    assert csr.loss_curve == dense.loss_curve
    # the FP32 SGD baseline on the same path: s = 1, no Gram
    base = sgd(A, y, eta=0.5, b=8, steps=3, seed=2, backend="cuda", device=DEVICE)
    ref = sgd(A, y, eta=0.5, b=8, steps=3, seed=2, sampler="philox")
    np.testing.assert_allclose(base.x, ref.x, rtol=0, atol=1e-6)


@needs_sim
def test_estimator_device(data):
    A, y = data
    clf = CASGDClassifier(b=4, s=2, n_iter=3, device=DEVICE, normalize=False,
                          fit_intercept=False).fit(A, y)
    res = casgd(A, y, eta=0.5, b=4, s=2, H=3, seed=0, backend="cuda", device=DEVICE)
    np.testing.assert_array_equal(clf.coef_, res.x)


@pytest.mark.parametrize("kwargs,match", [
    (dict(recipe="F"), r"recipe 'F': u_G=.*accepted: recipes A-D, G"),
    (dict(recipe=RECIPES["C"].replace(u_x=lpsim.casgd.Slot("bf16", "stochastic"))),
     r"u_x=.*rounds 'stochastic'"),
    (dict(P=2), r"P=2, reduce=None: backend='cuda' runs one process"),
    (dict(sampler="numpy"), r"sampler='numpy': backend='cuda' draws its rows on the device"),
    (dict(backend="tpu"), r"backend='tpu' is not accepted; accepted: 'cpu'"),
    (dict(backend="cpu", device="cuda"), r"device='cuda', graphs=False apply to backend='cuda'"),
    (dict(loss="hinge"), r"unknown loss 'hinge'"),
    (dict(seed=-1), r"seed=-1 is not accepted"),
])
def test_native_bad_input(data, kwargs, match):
    A, y = data
    kwargs = {"backend": "cuda", "device": DEVICE, **kwargs}
    with pytest.raises(ValueError, match=match):
        casgd(A, y, H=1, **kwargs)


@needs_sim
def test_native_device_checks(data):
    A, y = data
    with pytest.raises(ValueError, match=r"device='cuda' with NUMBA_ENABLE_CUDASIM=1"):
        casgd(A, y, H=1, backend="cuda", device="cuda")
    with pytest.raises(ValueError, match=r"graphs=True needs a CUDA device"):
        casgd(A, y, H=1, backend="cuda", device=DEVICE, graphs=True)
    with pytest.raises(ValueError, match=r"diverged with eta=1000000.0"):
        casgd(A, y, loss="linear", eta=1e6, b=4, s=2, H=8, backend="cuda", device=DEVICE)


@needs_sim
@pytest.mark.parametrize("key,calls", [("C", 2), ("D", 1)])
def test_native_grouped_allreduce_on_gloo(data, key, calls):
    # two gloo ranks (threads, CPU tensors): one all_reduce per datatype of [r; G] per outer
    # iteration (C: bf16 r + fp32 G, D: both bf16), within the P = 2 bound of the simulator
    from lpsim.casgd.distributed import run_native_threads
    A, y = data
    b, s, eta = 3, 3, 0.5
    run = run_native_threads(A, y, 2, eta=eta, b=b, s=s, H=1, recipe=key, seed=5,
                             device=DEVICE)
    sim = casgd(A, y, eta=eta, b=b, s=s, H=1, recipe=key, seed=5, P=2, sampler="philox")
    assert run.calls == [calls, calls] and run.outer == 1
    idx = PhiloxIndices(A.shape[0], 5).take(s * b)
    bound = local_error_bound(A[idx], np.zeros(A.shape[1]), y[idx], eta, b, s, 2, key)
    assert np.linalg.norm(run.x - sim.x) <= 2 * bound.total and np.linalg.norm(sim.x) > 0.01


@needs_sim
def test_native_weights_sparse_and_intercept(data):
    # the device inverts the cumulative weights as WeightedIndices does: all-ones weights are
    # the unweighted run and integer weights the run on repeated rows, bit for bit
    A, y = data
    kw = dict(eta=0.5, b=4, s=2, H=3, recipe="C", seed=4, backend="cuda", device=DEVICE)
    plain = casgd(A, y, **kw).x
    np.testing.assert_array_equal(casgd(A, y, sample_weight=np.ones(len(y)), **kw).x, plain)
    w = np.random.default_rng(2).integers(0, 3, len(y))
    weighted = casgd(A, y, sample_weight=w, **kw).x
    np.testing.assert_array_equal(weighted, casgd(np.repeat(A, w, axis=0), np.repeat(y, w),
                                                  **kw).x)
    # real weights (draws below 2**53 scaled by W / 2**53): the rows the simulator replays
    from lpsim.casgd.native import DeviceData, NativeRun
    from lpsim.casgd.sampling import WeightedIndices
    real = w / 3 + 0.125 * (np.arange(len(w)) % 2)
    run = NativeRun(DeviceData(A, y, RECIPES["C"], DEVICE), lpsim.casgd.get_loss("logistic"),
                    RECIPES["C"], 0.5, 4, 2, 4, np.zeros(A.shape[1]), sample_weight=real)
    host = WeightedIndices(real, lambda k: PhiloxIndices(k, 4))
    for _ in range(2):
        run.pre()
        np.testing.assert_array_equal(run.idx.numpy(), host.take(8))
    # the estimators' device path: sparse rows with the intercept column, the same bits as dense
    import scipy.sparse as sp
    As = np.where(np.abs(A) > 0.15, A, 0.0)
    est = dict(b=4, s=2, n_iter=2, device=DEVICE)
    dense = CASGDClassifier(**est).fit(As, y, sample_weight=w)
    sparse = CASGDClassifier(**est).fit(sp.csr_matrix(As), y, sample_weight=w)
    np.testing.assert_array_equal(sparse.coef_, dense.coef_)
    assert sparse.intercept_ == dense.intercept_ != 0


@needs_sim
def test_one_seed_one_run_on_both_backends(data):
    # issue 35: Philox is the default sampler of the simulator and of the native path, so
    # casgd(A, y, seed=3) and casgd(A, y, seed=3, backend="cuda") draw the same rows
    from lpsim.casgd.solvers import index_stream
    from lpsim.philox import split_key
    from lpsim_cuda.casgd import sample_rows
    seed = 3 + (5 << 32)                                # both words of the key
    lo, hi = split_key(seed, "seed")
    idx = torch.empty(40, dtype=torch.int64)
    sample_rows(idx, torch.tensor([0]), 240, lo, hi, SAMPLE_STREAM)
    np.testing.assert_array_equal(index_stream(None, 240, seed).take(40), idx.numpy())
    # the trajectories: fp64 slots make both runs the exact recurrence up to the order of
    # float64 sums (gap ~1e-16); other rows than the device's give a gap of order 0.1
    A, y = data
    kw = dict(eta=0.5, b=4, s=2, H=3, recipe="fp64", seed=3)
    cpu, nat = casgd(A, y, **kw).x, casgd(A, y, backend="cuda", device=DEVICE, **kw).x
    assert np.abs(cpu - nat).max() <= 1e-12
    assert np.abs(casgd(A, y, sampler="numpy", **kw).x - nat).max() > 1e-3
    base = dict(eta=0.5, b=4, steps=3, recipe="fp64", seed=3)
    assert np.abs(sgd(A, y, **base).x - sgd(A, y, backend="cuda", device=DEVICE,
                                              **base).x).max() <= 1e-12


def test_sampler_names_are_checked():
    A, y = make_synth(20, 3, seed=1)[:2]
    for bad in ("Philox", 1, "torch"):
        with pytest.raises(ValueError, match=rf"sampler={re.escape(repr(bad))} is not "
                                             r"accepted; accepted: 'philox' \(the default"):
            casgd(A, y, H=1, b=2, s=2, sampler=bad)
    # the numpy sampler stays reachable by name and is numpy's default_rng draws
    from lpsim.casgd.solvers import index_stream
    np.testing.assert_array_equal(index_stream("numpy", 20, 7).take(9),
                                  np.random.default_rng(7).integers(0, 20, 1 << 14)[:9])


def test_fp32_slots_keep_their_arithmetic_under_autocast():
    """Inside ``torch.autocast`` an fp32 slot still multiplies fp32 inputs with fp32
    accumulation (autocast would run torch.mm in bfloat16): the same bits as outside."""
    from lpsim.casgd.native import slot_mm
    rng = np.random.default_rng(0)
    a = torch.from_numpy(rng.standard_normal((64, 256)).astype(np.float32))
    slot = RECIPES["A"].u_G
    want = slot_mm(a, a.t(), slot)
    with torch.autocast("cpu", torch.bfloat16):
        got = slot_mm(a, a.t(), slot)
        fused = slot_mm(a, a.t(), slot, beta_c=want, alpha=0.5)
    assert got.dtype == torch.float32 and torch.equal(got, want)
    assert torch.equal(fused, torch.addmm(want, a, a.t(), alpha=0.5))


@pytest.mark.skipif(__import__("torch").cuda.is_available(),
                    reason="the refusal is of a machine torch sees no CUDA device on")
def test_a_cuda_device_torch_cannot_see_is_refused_by_name(monkeypatch):
    """torch's AssertionError ("Torch not compiled with CUDA enabled") came from inside the
    run (the simulator set aside, as a user's process runs without it)."""
    monkeypatch.setattr(config, "ENABLE_CUDASIM", False)
    A, y, _ = make_synth(64, 4, loss="linear", seed=0)
    with pytest.raises(ValueError, match=r"device='cuda': torch sees no CUDA device here"):
        casgd(A, y, loss="linear", b=4, s=2, H=1, backend="cuda", device="cuda")


def test_numpy_inner_equals_jitted_steps_on_bf16_margins():
    # recipe I, linear loss, one correction term: alpha and r are stored at u_c on both paths
    from lpsim.casgd.solvers import _jitted_inner
    loss, G, y = lpsim.casgd.get_loss("linear"), np.ones((2, 2), np.float32), np.zeros(2)
    vals = np.unique(lpsim.quantize(np.linspace(0.5, 2.0, 40), "bf16")).astype(np.float32)
    for r0 in vals:
        for r1 in vals:
            r = np.array([r0, r1], np.float32)
            want = _jitted_inner(r, G, y, RECIPES["I"], 0.3, 1, 2, loss)
            got = _numpy_inner(r, G, y, RECIPES["I"], 0.3, 1, 2, loss, Rounder(0))
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), r


@pytest.mark.parametrize("key", ["A", "C", "G", "I"])
@pytest.mark.parametrize("loss", ["logistic", "linear", "poisson"])
@pytest.mark.parametrize("b,s", [(5, 9), (8, 40)])
def test_numpy_inner_equals_jitted_steps_bit_for_bit(key, loss, b, s):
    # the correction dot in the same lane order, the residual with the same exp: same bits;
    # 40 columns in the last step: two lane passes and the tree; 312: lanes take four
    # products at once (lpsim.casgd.inner.lane_sum), then the rest
    from lpsim.casgd.solvers import _jitted_inner
    r, G, y = _inputs(b, s, seed=3, loss=loss)
    want = _jitted_inner(r, G, y, RECIPES[key], 0.05, b, s, lpsim.casgd.get_loss(loss))
    got = _numpy_inner(r, G, y, RECIPES[key], 0.05, b, s, lpsim.casgd.get_loss(loss),
                       Rounder())
    assert got.dtype == want.dtype and np.isfinite(want[:5 * b]).all()
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))    # NaNs as bits
