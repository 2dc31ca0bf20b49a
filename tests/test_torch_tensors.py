"""lpsim.quantize / lpsim.torch.quantize on torch tensors: autograd, version counter, dtypes."""

import os
import re

import numpy as np
import pytest

import lpsim

torch = pytest.importorskip("torch")
import lpsim.torch as lt  # noqa: E402


def _np(t):
    return t.detach().cpu().numpy()


def test_issue_repro_in_place_on_a_leaf_that_requires_grad_raises():
    w = torch.tensor([1.1, 2.3, 3.7], requires_grad=True)
    y = (w * w).sum()
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        lpsim.quantize(w, "e4m3fn", out=w)
    y.backward()                                 # nothing was written: the true gradient
    assert torch.equal(w.grad, torch.tensor([2.2, 4.6, 7.4]))


def test_in_place_under_no_grad_bumps_the_version_so_backward_refuses_stale_values():
    w = torch.tensor([1.1, 2.3, 3.7], requires_grad=True)
    y = (w * w).sum()
    before = w._version
    with torch.no_grad():
        assert lpsim.quantize(w, "e4m3fn", out=w) is w
    assert w._version > before
    assert np.array_equal(_np(w), lpsim.quantize(np.array([1.1, 2.3, 3.7], np.float32),
                                                 "e4m3fn"))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_requires_grad_input_keeps_a_straight_through_graph():
    x = torch.tensor([0.3, -1.7, 5.01], dtype=torch.float64, requires_grad=True)
    y = lt.quantize(x, "e5m2")
    assert y.requires_grad and y.grad_fn is not None
    assert np.array_equal(_np(y), lpsim.quantize(_np(x), "e5m2"))
    c = torch.tensor([0.5, -2.0, 3.25], dtype=torch.float64)
    (y * c).sum().backward()
    assert torch.equal(x.grad, c)                 # d round(x)/dx := 1, documented
    with torch.no_grad():
        assert not lt.quantize(x, "e5m2").requires_grad
    assert not lt.quantize(x.detach(), "e5m2").requires_grad


def test_in_place_on_a_non_leaf_goes_through_autograd():
    w = torch.tensor([1.1, 2.3, 3.7], requires_grad=True)
    a = w * 2
    version = a._version
    lpsim.quantize(a, "bf16", "nearest", out=a)
    assert a._version > version
    assert np.array_equal(_np(a), lpsim.quantize(_np(w * 2), "bf16"))
    c = torch.tensor([1.0, -1.0, 0.5])
    (a * c).sum().backward()
    assert torch.equal(w.grad, 2 * c)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs_upcast_exactly(dtype):
    x = (torch.randn(257, generator=torch.Generator().manual_seed(0)) * 30).to(dtype)
    y = lt.quantize(x, "e4m3", "stochastic", seed=5)
    assert y.dtype == torch.float32
    ref = lpsim.quantize(x.float().numpy(), "e4m3", "stochastic", seed=5)
    assert np.array_equal(y.numpy(), ref)


@pytest.mark.parametrize("fmt", ["e5m2", "mxfp8_e4m3"])
def test_every_float16_code_rounds_as_numpys_float16_array(fmt):
    """All 65536 float16 codes: a torch tensor's values are its codes widened exactly, NaN
    signs and payloads kept, as numpy widens them (torch's own conversion turns the 1022
    signalling NaNs into its default NaN)."""
    codes = np.arange(-2 ** 15, 2 ** 15).astype(np.int16)
    expected = lpsim.quantize(codes.view(np.float16), fmt).view(np.int32)
    got = lpsim.quantize(torch.from_numpy(codes).view(torch.float16), fmt)
    assert np.array_equal(_np(got).view(np.int32), expected)


def test_half_precision_out_takes_exact_values_only():
    x = torch.tensor([1.1, -3.3, 300.0], dtype=torch.bfloat16)
    lpsim.quantize(x, "e4m3", out=x)
    assert x.dtype == torch.bfloat16
    assert np.array_equal(x.float().numpy(), lpsim.quantize(
        torch.tensor([1.1, -3.3, 300.0], dtype=torch.bfloat16).float().numpy(), "e4m3"))
    h = torch.tensor([65504.0], dtype=torch.float16)      # bf16 rounds it up to 65536
    stats = lpsim.RoundingStats()
    with pytest.raises(ValueError, match="do not all fit out's dtype torch.float16"):
        lpsim.quantize(h, "bf16", out=h, stats=stats)
    assert h.item() == 65504.0
    assert stats == lpsim.RoundingStats()                 # a refused call counts nothing
    blocks = lpsim.blocks.BlockStats()
    with pytest.raises(ValueError, match="do not all fit out's dtype torch.float16"):
        lpsim.quantize(torch.full((1, 32), 1e6), "mxfp8_e4m3",
                       out=torch.zeros(1, 32, dtype=torch.float16), stats=blocks)
    assert blocks == lpsim.blocks.BlockStats()
    lpsim.quantize(torch.tensor([1.1, 3.0]), "e4m3", out=torch.zeros(2, dtype=torch.bfloat16),
                   stats=stats)                           # a call that fits counts
    assert stats.elements == 2 and stats.inexact == 1


def test_out_kinds_must_match():
    t = torch.ones(3)
    with pytest.raises(TypeError, match="x is a torch tensor but out is a ndarray"):
        lpsim.quantize(t, "bf16", out=np.ones(3, np.float32))
    with pytest.raises(TypeError, match="out is a torch tensor but x is a ndarray"):
        lpsim.quantize(np.ones(3, np.float32), "bf16", out=t)
    with pytest.raises(TypeError, match="dtype torch.int32"):
        lpsim.quantize(torch.ones(3, dtype=torch.int32), "bf16")
    with pytest.raises(ValueError, match="shape"):
        lpsim.quantize(t, "bf16", out=torch.ones(4))
    with pytest.raises(TypeError, match="rounds torch tensors"):
        lt.quantize(np.ones(3), "bf16")


def test_strided_tensors_and_stats():
    x = torch.arange(24, dtype=torch.float32).reshape(4, 6).t() * 0.37
    stats = lpsim.RoundingStats()
    y = lt.quantize(x, "e4m3", stats=stats)
    assert np.array_equal(y.numpy(), lpsim.quantize(np.ascontiguousarray(x.numpy()), "e4m3"))
    assert stats.elements == 24 and stats.inexact > 0
    out = torch.empty(6, 4)
    lpsim.quantize(x, "e4m3", out=out)
    assert torch.equal(out, y)


def test_generator_with_tensors_matches_numpy_bits():
    g = lpsim.Generator(11)
    x = torch.linspace(1, 2, 50)
    a = lt.quantize(x, "e4m3", "stochastic", generator=g)
    b = lt.quantize(x, "e4m3", "stochastic", generator=g)
    assert np.array_equal(a.numpy(), lpsim.quantize(x.numpy(), "e4m3", "stochastic", seed=11))
    assert np.array_equal(b.numpy(), lpsim.quantize(x.numpy(), "e4m3", "stochastic", seed=11,
                                                    offset=52))


@pytest.mark.skipif(os.environ.get("LPSIM_TEST_GPU") != "1" or not torch.cuda.is_available(),
                    reason="needs a CUDA GPU and LPSIM_TEST_GPU=1 (torch CUDA tensors)")
def test_cuda_tensors_match_the_cpu_path():
    x = torch.randn(4099, generator=torch.Generator().manual_seed(1)) * 100
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        xc = x.to(dtype)
        cpu = lt.quantize(xc, "e4m3", "stochastic", seed=3)
        gpu = lt.quantize(xc.cuda(), "e4m3", "stochastic", seed=3)
        assert torch.equal(gpu.cpu(), cpu)
    w = x.cuda().requires_grad_()
    with pytest.raises(RuntimeError, match="leaf Variable"):
        lpsim.quantize(w, "bf16", out=w)
    v = w._version
    with torch.no_grad():
        lpsim.quantize(w, "bf16", out=w)
    assert w._version > v
    assert torch.equal(w.detach().cpu(), lt.quantize(x, "bf16"))


def test_a_torch_out_is_refused_on_the_cached_path_too():
    """The same error whether or not the numpy request was cached by an earlier call."""
    x = np.ones(3, np.float32)
    lpsim.quantize(x, "e5m2")                      # caches the route
    with pytest.raises(TypeError, match="out is a torch tensor but x is a ndarray"):
        lpsim.quantize(x, "e5m2", out=torch.ones(3))


def test_block_formats_follow_the_same_tensor_rules():
    """MX and NVFP4 on tensors: half inputs upcast (a raw torch TypeError before), the
    straight-through graph kept (it was detached), an out that cannot hold the values
    refused (nvfp4's were rounded again to bfloat16), a numpy out refused by name."""
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(3)) * 7
    want = lpsim.quantize(x.numpy(), "mxfp4", axis=0)
    half = lt.quantize(x.bfloat16(), "mxfp4")
    assert half.dtype == torch.float32
    assert np.array_equal(half.numpy(), lpsim.quantize(x.bfloat16().float().numpy(), "mxfp4"))
    xg = x.clone().requires_grad_()
    y = lpsim.blocks.quantize(xg, "mxfp4", axis=0)
    assert y.requires_grad and np.array_equal(_np(y), want)
    (y * 3).sum().backward()
    assert torch.equal(xg.grad, torch.full_like(x, 3.0))
    stats = lpsim.blocks.BlockStats()
    out = torch.empty(4, 32)
    assert lt.quantize(x, "nvfp4", "stochastic", seed=2, out=out, stats=stats) is out
    assert np.array_equal(out.numpy(), lpsim.quantize(x.numpy(), "nvfp4", "stochastic", seed=2))
    assert stats.elements == 128
    with pytest.raises(ValueError, match="do not all fit out's dtype torch.bfloat16"):
        lt.quantize(x, "nvfp4", out=torch.empty(4, 32, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="x is a torch tensor but out is a ndarray"):
        lt.quantize(x, "mxfp4", out=np.zeros((4, 32), np.float32))


def test_lazily_negated_tensors_round_and_take_results():
    """x = z.conj().imag is a view with torch's negative bit set, which has no numpy view:
    rounded and written as any tensor (torch's RuntimeError before)."""
    z = torch.tensor([1 + 0.3j, 2 - 2.0j], dtype=torch.complex64)
    x = z.conj().imag
    assert x.is_neg()
    want = lpsim.quantize(x.resolve_neg().numpy(), "bf16")
    assert np.array_equal(lt.quantize(x, "bf16").numpy(), want)
    assert np.array_equal(lpsim.quantize(x, "bf16", "stochastic", seed=3).numpy(),
                          lpsim.quantize(x.resolve_neg().numpy(), "bf16", "stochastic", seed=3))
    lpsim.quantize(torch.tensor([1.1, 1.3]), "e2m1fn", out=x)
    assert x.tolist() == [1.0, 1.5] and z.imag.tolist() == [-1.0, -1.5]


@pytest.mark.parametrize("fmt", ["bf16", "mxfp4", lpsim.fixed(8, 4)])
def test_an_out_whose_elements_share_memory_is_refused_as_torch_refuses_it(fmt):
    """torch.zeros(1).expand(32) has stride 0: every element is one location.  torch's own
    out= refuses it; lpsim wrote it silently (the last element's value won)."""
    x = torch.linspace(-3, 3, 32)
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        torch.add(x, 1, out=torch.zeros(1).expand(32))
    base = torch.zeros(1)
    for x_, out, strides in ((x, base.expand(32), "(0,)"),
                             (x, torch.zeros(8).as_strided((32,), (0,)), "(0,)"),
                             (x.reshape(32, 1).expand(32, 32).T, torch.zeros(1, 32).expand(32, 32),
                              "(0, 1)")):
        before = out.clone()
        with pytest.raises(ValueError, match=r"out has elements that share one memory location"
                                             rf" \(strides {re.escape(strides)}"):
            lpsim.quantize(x_, fmt, "stochastic", seed=1, out=out)
        assert torch.equal(out, before)
    stats = lpsim.RoundingStats() if not isinstance(fmt, str) or fmt != "mxfp4" else None
    with pytest.raises(ValueError, match="share one memory location"):
        lt.quantize(x, fmt, out=base.expand(32), stats=stats)
    assert stats is None or stats.elements == 0
    # distinct elements with strides (a transposed or sliced out) are written as before
    out = torch.zeros(64)[::2]
    assert lt.quantize(x, fmt, out=out) is out and torch.equal(out, lt.quantize(x, fmt))


def test_numpy_out_views_follow_numpy():
    """A broadcast view is read-only: refused, as numpy refuses it; an out overlapping x
    gets the values of rounding x first, as numpy's ufuncs give."""
    x = np.linspace(-3, 3, 32, dtype=np.float32)
    with pytest.raises(ValueError, match="read-only"):
        np.add(x, 1, out=np.broadcast_to(np.zeros(1, np.float32), (32,)))
    with pytest.raises(ValueError, match="out is read-only"):
        lpsim.quantize(x, "bf16", out=np.broadcast_to(np.zeros(1, np.float32), (32,)))
    a = np.concatenate([x, [7.3]]).astype(np.float32)
    want = lpsim.quantize(a[:-1].copy(), "bf16", "up")
    lpsim.quantize(a[:-1], "bf16", "up", out=a[1:])
    assert np.array_equal(a[1:], want)


def test_a_tensor_is_asked_is_cuda_not_its_array_interface():
    """lpsim.request.is_cuda_array asks a torch tensor is_cuda: a CUDA tensor that requires
    grad raises RuntimeError from __cuda_array_interface__, which hasattr lets through
    (stood in for here by a subclass); numpy arrays and CPU tensors are not CUDA arrays."""
    from lpsim.request import is_cuda_array

    class Parameterlike(torch.Tensor):
        is_cuda = True

        @property
        def __cuda_array_interface__(self):
            raise RuntimeError("Can't get __cuda_array_interface__ on Variable that "
                               "requires grad")

    assert is_cuda_array(torch.zeros(2).as_subclass(Parameterlike))
    assert not is_cuda_array(torch.zeros(2, requires_grad=True))
    assert not is_cuda_array(np.zeros(2)) and not is_cuda_array(3.0)


def test_a_plain_cpu_tensor_rounded_in_place_is_the_same_tensor_bumped_as_torch_does():
    """lpsim.quantize(t, fmt, out=t) of a plain CPU float32 tensor (its numpy view's route):
    t itself comes back with the values of a copy's rounding, its version bumped as torch's
    in-place operations do, so autograd refuses a graph that saved it; element and block
    formats, counted, with a generator."""
    for fmt in ("bf16", "nvfp4"):
        g, g_copy = lpsim.Generator(3), lpsim.Generator(3)
        stats, stats_copy = lpsim.blocks.BlockStats(), lpsim.blocks.BlockStats()
        t = torch.randn(32, 64, generator=torch.Generator().manual_seed(1))
        want = lpsim.quantize(t.clone(), fmt, "stochastic", generator=g_copy, stats=stats_copy)
        version = t._version
        assert lpsim.quantize(t, fmt, "stochastic", out=t, generator=g, stats=stats) is t
        assert torch.equal(t, want) and t._version > version
        assert stats.as_dict() == stats_copy.as_dict() and g.get_state() == g_copy.get_state()
    a = torch.randn(8, requires_grad=True)
    b = a.exp()                         # exp's backward reads its saved output
    d = b.detach()
    lpsim.quantize(d, "bf16", out=d)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        b.sum().backward()


def test_an_inference_tensor_out_is_refused_outside_inference_mode():
    """torch refuses to write an inference tensor outside inference mode (copy_, out=):
    lpsim.quantize wrote it silently."""
    with torch.inference_mode():
        made = torch.zeros(3)
    with pytest.raises(RuntimeError, match="out is an inference tensor"):
        lpsim.quantize(torch.full((3,), 1.1), "bf16", out=made)
    assert torch.equal(made, torch.zeros(3))
    with torch.inference_mode():
        assert lpsim.quantize(torch.full((3,), 1.1), "bf16", out=made)[0] == 1.1015625

    for dtype in (torch.float32, torch.float64):   # in place: float32's own fast path too
        with torch.inference_mode():
            made = torch.full((3,), 1.1, dtype=dtype)
        with pytest.raises(RuntimeError, match="out is an inference tensor"):
            lpsim.quantize(made, "e4m3fn", out=made)
        assert torch.equal(made, torch.full((3,), 1.1, dtype=dtype))


class _Tagged(torch.Tensor):
    """A user's tensor subclass (lpsim once took it for a numpy-like array)."""


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_tensor_subclass_is_rounded_as_a_tensor(dtype):
    x = torch.tensor([1.1, -2.3], dtype=dtype).as_subclass(_Tagged)
    for rounded in (lpsim.quantize(x, "e4m3fn"), lt.quantize(x, "e4m3fn")):
        assert isinstance(rounded, torch.Tensor)
        assert torch.equal(rounded, torch.tensor([1.125, -2.25]))
    leaf = torch.tensor([1.1, -2.3], requires_grad=True)
    y = lpsim.quantize(leaf.as_subclass(_Tagged), "e4m3fn")
    y.sum().backward()                  # the straight-through gradient reaches the leaf
    assert torch.equal(leaf.grad, torch.ones(2))


@pytest.mark.parametrize("make", [
    lambda: torch.zeros(2, dtype=torch.uint8).view(torch.float4_e2m1fn_x2),
    lambda: torch.tensor([1.1 + 2.7j]), lambda: torch.tensor([3])])
def test_dtypes_without_one_float_an_element_are_refused_by_name(make):
    """float4_e2m1fn_x2 (two values a byte) once crashed inside torch's copy kernel."""
    x = make()
    with pytest.raises(TypeError, match=f"x has dtype {x.dtype}; accepted: torch.float32"):
        lpsim.quantize(x, "e4m3fn")
