"""lpsim_cuda on a real GPU: torch tensors, streams, CUDA graphs, packed storage, 2**24 elements.

Runs only with LPSIM_TEST_GPU=1 on a machine with a CUDA device (conftest then leaves the
CUDA simulator off).  Every check is bit for bit against the CPU simulator, counters included.
"""

import os

import numpy as np
import pytest
import torch
from numba import cuda

import lpsim
import lpsim_cuda
import lpsim_cuda.blocks
from lpsim.rounding import MODES
from lpsim.storage import pack
from lpsim_cuda.launch import SIMULATOR
from test_cuda_quantize import FORMATS, POLICIES, check_same, edge_cases

pytestmark = pytest.mark.skipif(
    os.environ.get("LPSIM_TEST_GPU") != "1" or SIMULATOR or not torch.cuda.is_available(),
    reason="needs a real GPU (LPSIM_TEST_GPU=1)")

LARGE_FORMATS = FORMATS + ["fp(6,9,0)", "fp16"]
PACKED = [("bfloat16", "bf16"), ("float16", "fp16"), ("float8_e5m2", "e5m2"),
          ("float8_e4m3fn", "e4m3fn")]


def in_range(fmt, n, dtype, seed):
    """n random values across fmt's range: exponents uniform from 3 binades below its smallest
    subnormal to 2 above max_finite, random container mantissas and signs; then a few
    thousand raw random bit patterns (NaN, inf, huge, tiny) and fmt's edge cases."""
    fmt = lpsim.parse_format(fmt)
    rng = np.random.default_rng(seed)
    exponents = rng.integers(fmt.emin - fmt.m - 3, fmt.emax + 3, n)
    signs = rng.choice([-1.0, 1.0], n)
    with np.errstate(over="ignore"):
        values = (np.ldexp(1 + rng.random(n), exponents) * signs).astype(dtype)
    raw = rng.integers(0, 2 ** 64, 4096, dtype=np.uint64)
    raw = raw.astype(np.uint32).view(dtype) if dtype == np.float32 else raw.view(dtype)
    return np.concatenate([values, raw, edge_cases(fmt, dtype)])


def host_bits(tensor):
    array = tensor.detach().cpu().numpy()
    return array.view(np.int32 if array.dtype == np.float32 else np.int64)


def numpy_dtype(dtype):
    return np.float32 if dtype == torch.float32 else np.float64


# ---------------------------------------------------------------- torch tensors


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_torch_tensors_in_place_and_out_of_place(dtype, rounding):
    host = in_range("e4m3fn", 4 * 5000, numpy_dtype(dtype), 1)
    host = host[:host.size // 4 * 4].reshape(-1, 4)                      # a 2-D tensor
    cpu_stats = lpsim.RoundingStats()
    expected = lpsim.quantize(host, "e4m3fn", rounding, seed=5, stats=cpu_stats)
    x = torch.from_numpy(host).cuda()
    stats = lpsim.RoundingStats()
    fresh = lpsim_cuda.quantize(x, "e4m3fn", rounding, seed=5, stats=stats)
    assert fresh.dtype == dtype and fresh.shape == x.shape and fresh.device == x.device
    out = torch.empty_like(x)
    assert lpsim_cuda.quantize(x, "e4m3fn", rounding, seed=5, stats=stats, out=out) is out
    via_lpsim = lpsim.quantize(x, "e4m3fn", rounding, seed=5, stats=stats)  # dispatches here
    assert np.array_equal(host_bits(x), host.view(host_bits(x).dtype))      # x untouched
    lpsim_cuda.quantize(x, "e4m3fn", rounding, seed=5, stats=stats, out=x)
    for got in (fresh, out, via_lpsim, x):
        assert np.array_equal(host_bits(got), expected.view(host_bits(got).dtype))
    assert stats.as_dict() == {k: 4 * v for k, v in cpu_stats.as_dict().items()}


@pytest.mark.parametrize("source", [torch.float32, torch.float64])
@pytest.mark.parametrize("storage, fmt", PACKED)
def test_packed_storage_equals_cpu_rounding_then_an_exact_torch_cast(storage, fmt, source):
    host = in_range(fmt, 1 << 16, numpy_dtype(source), 2)
    rounded = lpsim.quantize(host, fmt, "stochastic", seed=9)
    target = getattr(torch, storage)
    expected = torch.from_numpy(rounded).to(target)      # exact: the storage holds fmt
    ints = torch.int16 if expected.element_size() == 2 else torch.int8
    nan = torch.from_numpy(np.isnan(rounded))
    x = torch.from_numpy(host).cuda()
    out = torch.empty(x.shape, dtype=target, device="cuda")
    for got in (lpsim_cuda.quantize(x, fmt, "stochastic", seed=9, storage=storage),
                lpsim_cuda.quantize(x, fmt, "stochastic", seed=9, storage=target, out=out)):
        assert got.dtype == target
        got = got.cpu()
        assert torch.equal(got.view(ints)[~nan], expected.view(ints)[~nan])
        assert torch.isnan(got.float()[nan]).all()      # NaN codes differ between encoders


def test_torch_errors_name_the_problem():
    x = torch.zeros(8, device="cuda")
    assert lpsim_cuda.quantize(x.bfloat16(), "bf16").dtype == torch.float32   # read as float32
    with pytest.raises(TypeError, match="x has dtype torch.float8_e4m3fn"):
        lpsim_cuda.quantize(x.to(torch.float8_e4m3fn), "e4m3fn")
    with pytest.raises(ValueError, match="non-contiguous CUDA tensor"):
        lpsim_cuda.quantize(x[::2], "bf16")
    with pytest.raises(ValueError, match="out has dtype torch.float16; storage='bfloat16'"):
        lpsim_cuda.quantize(x, "bf16", storage="bfloat16", out=x.half())
    with pytest.raises(ValueError, match="drop storage="):
        lpsim_cuda.quantize(x, "bf16", storage="bfloat16", out=x)


@pytest.mark.parametrize("fmt", ["bf16", "fp(4,3,4)", "mxfp8_e4m3", "nvfp4"])
def test_a_lazily_negated_view_is_refused_by_name_or_rounded_as_its_values(fmt):
    """A contiguous view whose memory holds the negatives (torch._neg_view) is refused by
    lpsim_cuda, even after its request took a cached route, and rounded as its values by
    lpsim.quantize; so is an out that is such a view."""
    blocks = fmt in ("mxfp8_e4m3", "nvfp4")
    entry = lpsim_cuda.blocks.quantize if blocks else lpsim_cuda.quantize
    x = torch.randn(64, device="cuda") * 3
    negated = torch._neg_view(x)
    assert negated.is_neg() and negated.is_contiguous()
    for _ in range(2):                                  # the second call has its route
        entry(x, fmt)
        with pytest.raises(ValueError, match="lazily negated view"):
            entry(negated, fmt)
        with pytest.raises(ValueError, match="lazily negated view"):
            entry(x, fmt, out=torch._neg_view(torch.empty_like(x)))
    want = lpsim.quantize(-x.cpu().numpy(), fmt)
    assert np.array_equal(lpsim.quantize(negated, fmt).cpu().numpy(), want)


# ---------------------------------------------------------------- streams and graphs


def hold(stream):
    """Keep ``stream`` busy for a while, so work that skips its queue would run first."""
    with torch.cuda.stream(stream):
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(200_000_000)                 # ~0.1 s of GPU cycles


def test_launch_and_stats_order_with_a_side_torch_stream():
    host = in_range("bf16", 1 << 22, np.float32, 3)
    cpu_stats = lpsim.RoundingStats()
    expected = lpsim.quantize(host, "bf16", "stochastic", seed=4, stats=cpu_stats)
    source = torch.from_numpy(host).cuda()
    x = torch.zeros_like(source)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    stats = lpsim.RoundingStats()
    hold(side)
    with torch.cuda.stream(side):
        x.copy_(source)                                     # queued behind the sleep
        y = lpsim_cuda.quantize(x, "bf16", "stochastic", seed=4, stats=stats)
        # a torch op that reads the result (not y + 0.0: that turns -0 into +0)
        after = y.clone()
        counted = stats.as_dict()                           # read before anyone synchronises
    torch.cuda.current_stream().wait_stream(side)
    assert counted == cpu_stats.as_dict()
    assert np.array_equal(host_bits(after), expected.view(np.int32))


class Interface:
    """A CUDA array known only by its __cuda_array_interface__ v3 with a stream, as CuPy's."""

    def __init__(self, tensor, stream):
        self.tensor, self.stream = tensor, stream

    @property
    def __cuda_array_interface__(self):
        return {**self.tensor.__cuda_array_interface__, "version": 3,
                "stream": self.stream.cuda_stream}


def test_cuda_array_interface_arrays_launch_on_their_stream():
    host = in_range("e5m2", 1 << 22, np.float32, 4)
    expected = lpsim.quantize(host, "e5m2", "nearest")
    source = torch.from_numpy(host).cuda()
    x, out = torch.zeros_like(source), torch.zeros_like(source)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    hold(side)
    with torch.cuda.stream(side):
        x.copy_(source)
    # called from the default stream: the interface's stream is where x becomes ready
    lpsim_cuda.quantize(Interface(x, side), "e5m2", out=Interface(out, side))
    side.synchronize()
    assert np.array_equal(host_bits(out), expected.view(np.int32))


def test_cuda_graph_replays_the_eager_bits_and_counts():
    fmt, kw = "e4m3fn", {"seed": 21, "sr_bits": 6}
    first, second = in_range(fmt, 1 << 16, np.float32, 5), in_range(fmt, 1 << 16, np.float32, 6)
    stats = lpsim.RoundingStats()
    lpsim_cuda.warmup(stats=stats)
    static_x = torch.from_numpy(first).cuda()
    static_out = torch.empty_like(static_x)
    eager = lpsim_cuda.quantize(static_x, fmt, "stochastic", **kw)
    side = torch.cuda.Stream()                       # torch's recipe: warm up off the default
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        lpsim_cuda.quantize(static_x, fmt, "stochastic", out=static_out, stats=stats, **kw)
    torch.cuda.current_stream().wait_stream(side)
    stats.reset()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        lpsim_cuda.quantize(static_x, fmt, "stochastic", out=static_out, stats=stats, **kw)
    cpu_stats = lpsim.RoundingStats()
    for host in (first, second, second):              # a replay draws the captured bits again
        static_x.copy_(torch.from_numpy(host))
        graph.replay()
        expected = lpsim.quantize(host, fmt, "stochastic", stats=cpu_stats, **kw)
        assert np.array_equal(host_bits(static_out), expected.view(np.int32))
        if host is first:
            assert torch.equal(static_out.view(torch.int32), eager.view(torch.int32))
    assert stats == cpu_stats


# ---------------------------------------------------------------- large random inputs


def large(dtype):
    return 1 << 24 if dtype == np.float32 else 1 << 22


@pytest.mark.slow
@pytest.mark.parametrize("fmt, dtype", [(f, np.float32) for f in LARGE_FORMATS]
                         + [(f, np.float64) for f in LARGE_FORMATS + ["fp32"]])
def test_large_random_matches_cpu(fmt, dtype):
    x = in_range(fmt, large(dtype), dtype, 7)
    for rounding in MODES:
        check_same(x, fmt, rounding, seed=1234, stream=5, offset=11)
    check_same(x, fmt, "stochastic", seed=99, sr_bits=7 if dtype == np.float32 else 13)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("policy", list(POLICIES))
def test_large_policies_and_sr_bits_match_cpu(policy, dtype):
    fmt = lpsim.fp(5, 2, 3, **POLICIES[policy])
    x = in_range(fmt, large(dtype), dtype, 9)
    for rounding in MODES:
        check_same(x, fmt, rounding, seed=77)
    for sr_bits in (1, 4, 20):
        check_same(x, fmt, "stochastic", seed=78, sr_bits=sr_bits)


def test_a_small_grid_runs_the_grid_stride_loop_many_times(monkeypatch):
    monkeypatch.setattr(lpsim_cuda.launch, "GRID_LIMIT", 3)      # 384 threads for 2**18 blocks
    x = in_range("e4m3fn", (1 << 20) + 5, np.float32, 10)
    for rounding in ("nearest", "stochastic", "odd"):
        check_same(x, "e4m3fn", rounding, seed=8, offset=7)
    packed = lpsim_cuda.quantize(cuda.to_device(x), "e4m3fn", "stochastic", seed=8,
                                 storage="float8_e4m3fn").copy_to_host()
    assert np.array_equal(packed, pack(lpsim.quantize(x, "e4m3fn", "stochastic", seed=8),
                                       "float8_e4m3fn", "e4m3fn"))
