"""Native CA-SGD on a real GPU (LPSIM_TEST_GPU=1): kernels bit-identical to the CPU steps,
iterates within the local error bound of the simulator's, final losses within 0.5%."""

import os

import numpy as np
import pytest

from lpsim.casgd import RECIPES, casgd, casgd_step, local_error_bound, make_synth
from lpsim.casgd import inner
from lpsim.casgd.sampling import SAMPLE_STREAM, PhiloxIndices

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(
    os.environ.get("LPSIM_TEST_GPU") != "1" or not torch.cuda.is_available(),
    reason="needs a CUDA GPU and LPSIM_TEST_GPU=1 (the simulator versions of these tests are "
           "in test_casgd_native.py)")
GPU = "cuda"


@pytest.fixture(scope="module")
def data():
    return make_synth(20000, 512, seed=3)[:2]


@pytest.mark.parametrize("key", ["A", "C", "D", "G"])
@pytest.mark.parametrize("b,s", [(1, 64), (8, 16), (32, 4), (1, 256), (8, 64), (40, 20)])
def test_inner_kernel_bit_identical_on_gpu(key, b, s):
    # (1, 256) and (8, 64): bench_casgd's targets; 40 rows a step: two passes of 32 warps
    _check_inner_kernel(key, b, s)


@pytest.mark.parametrize("key", ["C", "G"])
def test_inner_kernel_reading_delta_c_from_global_memory(monkeypatch, key):
    # past SHARED_ROWS rows the recurrence reads delta_c where it writes it
    import lpsim_cuda.casgd as kernels
    monkeypatch.setattr(kernels, "SHARED_ROWS", 0)
    _check_inner_kernel(key, 8, 64)


def test_inner_kernel_of_a_float64_gram():
    # recipe fp64: a float64 G, whose L1 lines hold 16 values (the prefetch's stride)
    _check_inner_kernel("fp64", 8, 64, np.float64)


def _check_inner_kernel(key, b, s, gram=np.float32):
    from lpsim_cuda.casgd import inner_recurrence
    import lpsim
    rng = np.random.default_rng(b + s)
    Y = lpsim.quantize(rng.standard_normal((s * b, 64)).astype(np.float32), "bf16") / 8
    r = lpsim.quantize(Y @ rng.standard_normal(64).astype(np.float32), "bf16")
    G = (Y.astype(gram) @ Y.T.astype(gram)).astype(gram)
    y = np.where(rng.random(s * b) < 0.5, -1.0, 1.0)
    alpha_c, code, pc, ps = inner.inner_args(RECIPES[key], "logistic", 0.5 / b)
    want, want_c = np.empty(s * b), np.empty(s * b)
    inner.inner_recurrence_cpu(r, G, y, want, want_c, b, s, alpha_c, code, pc, ps)
    dev = [torch.from_numpy(a).to(GPU) for a in (r, G, y)]
    got = torch.empty(s * b, dtype=torch.float64, device=GPU)
    got_c = torch.empty_like(got)
    inner_recurrence(*dev, got, got_c, b, s, alpha_c, code, pc, ps)
    np.testing.assert_array_equal(got.cpu().numpy().view(np.int64), want.view(np.int64))
    np.testing.assert_array_equal(got_c.cpu().numpy().view(np.int64), want_c.view(np.int64))


def test_device_sampler_equals_host_replay():
    from lpsim_cuda.casgd import sample_rows
    idx = torch.empty(100000, dtype=torch.int64, device=GPU)
    first = torch.tensor([12345], dtype=torch.int64, device=GPU)
    sample_rows(idx, first, 999983, 11, 0, SAMPLE_STREAM)
    host = PhiloxIndices(999983, seed=11)
    host.take(12345)
    np.testing.assert_array_equal(idx.cpu().numpy(), host.take(100000))


@pytest.mark.parametrize("key", ["A", "C", "D", "G"])
def test_each_outer_iteration_within_local_error_bound(data, key):
    # the native run and the simulator step from the native's previous iterate, same rows
    from lpsim.casgd.native import DeviceData, NativeRun
    from lpsim.casgd.losses import get_loss
    A, y = data
    b, s, eta = 8, 16, 2.0
    run = NativeRun(DeviceData(A, y, RECIPES[key], GPU), get_loss("logistic"), RECIPES[key],
                    eta, b, s, 7, np.zeros(A.shape[1]))
    rows = PhiloxIndices(A.shape[0], 7)
    for _ in range(5):
        x_prev = run.weights()
        run.step()
        idx = rows.take(s * b)
        sim = casgd_step(A[idx], y[idx], x_prev, eta, b, s, key)
        bound = local_error_bound(A[idx], x_prev, y[idx], eta, b, s, 1, key)
        assert np.linalg.norm(run.weights() - sim) <= bound.total


@pytest.mark.parametrize("key", ["A", "C", "D", "G"])
def test_final_loss_within_half_percent(data, key):
    A, y = data
    kw = dict(eta=2.0, b=8, s=16, H=60, recipe=key, seed=1, record=60)
    nat = casgd(A, y, backend="cuda", device=GPU, **kw)
    sim = casgd(A, y, sampler="philox", **kw)
    assert nat.loss_curve[-1] < 0.9 * nat.loss_curve[0]
    assert abs(nat.loss_curve[-1] - sim.loss_curve[-1]) <= 5e-3 * sim.loss_curve[-1]


def test_cuda_graph_replay_same_bits(data):
    A, y = data
    kw = dict(eta=2.0, b=8, s=16, H=6, recipe="C", seed=4, backend="cuda", device=GPU)
    np.testing.assert_array_equal(casgd(A, y, graphs=True, **kw).x, casgd(A, y, **kw).x)


def test_csr_same_bits_as_dense(data):
    import scipy.sparse as sp
    A, y = data
    As = np.where(np.abs(A) > 0.05, A, 0.0)
    kw = dict(eta=2.0, b=8, s=16, H=4, recipe="D", seed=4, backend="cuda", device=GPU)
    np.testing.assert_array_equal(casgd(sp.csr_matrix(As), y, **kw).x, casgd(As, y, **kw).x)


def test_no_silent_tf32_in_fp32_slots():
    # with TF32 switched on globally, an fp32 slot still accumulates fp32 products of fp32
    # inputs: its error stays within gamma_n(2^-24) (TF32 inputs would err by ~2^-11)
    from lpsim.casgd.native import slot_mm
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        rng = np.random.default_rng(0)
        a = rng.standard_normal((256, 1024)).astype(np.float32)
        got = slot_mm(torch.from_numpy(a).to(GPU), torch.from_numpy(a.T.copy()).to(GPU),
                      RECIPES["A"].u_G).cpu().numpy()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    exact = a.astype(np.float64) @ a.T.astype(np.float64)
    gamma = 1024 * 2.0 ** -24 / (1 - 1024 * 2.0 ** -24)
    assert (np.abs(got - exact) <= gamma * (np.abs(a) @ np.abs(a.T))).all()
