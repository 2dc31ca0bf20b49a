"""lpsim_cuda's one-pass RHT of a wgrad operand (``lpsim_cuda.hadamard.transposed_rht``) gives
the bits of ``lpsim.torch.hadamard.rht_transposed`` on the CPU: under numba's CUDA simulator
in CI, on a GPU with LPSIM_TEST_GPU=1 (where ``rht_transposed`` of a CUDA tensor takes it)."""

import numpy as np
import pytest
import torch
from numba import cuda

from lpsim.torch.hadamard import factors, rht, rht_signs, rht_transposed
from lpsim_cuda import hadamard, launch
from lpsim_cuda.hadamard import SIZES, transposed_rht
from lpsim_cuda.launch import SIMULATOR
from conftest import without_simulator


def _data(tokens, features, seed):
    x = np.random.default_rng(seed).standard_normal((tokens, features)).astype(np.float32)
    x[0, 0], x[1, 1], x[2, 2] = np.nan, np.inf, 1e-40       # NaN, inf, a subnormal
    return x


def same_bits(got, want) -> bool:
    """Bit for bit, except that a NaN may carry any payload: a GPU's float32 sums give its
    canonical NaN (0x7FFFFFFF), where the CPU's carry an operand's (0x7FC00000)."""
    nan = np.isnan(want)
    return np.array_equal(np.isnan(got), nan) and np.array_equal(
        got[~nan].view(np.uint32), want[~nan].view(np.uint32))


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("runs, features, blocks", [(2, 5, None), (16, 7, 1)])
def test_equals_the_cpu_transform_bit_for_bit(n, runs, features, blocks, monkeypatch):
    """blocks=1: one block of threads takes several work items each, stepping its run and
    feature by the grid's stride (the feature wrapping around)."""
    monkeypatch.setattr(launch, "GRID_LIMIT", blocks)
    x = _data(runs * n, features, n)
    signs = rht_signs(7, 2, 3, n)
    want = rht_transposed(torch.from_numpy(x), signs).numpy()
    out = cuda.device_array((features, runs * n), np.float32)
    transposed_rht(cuda.to_device(x), cuda.to_device(factors(signs, torch.float32, "cpu")
                                                    .numpy()), out)
    assert same_bits(out.copy_to_host(), want)


@pytest.mark.parametrize("x, n, out_shape, why", [
    (np.zeros((12, 4), np.float32), 8, (4, 12), "runs that do not divide the tokens"),
    (np.zeros((16, 4), np.float32), 64, (4, 16), "a size the kernel is not compiled for"),
    (np.zeros((16, 4), np.float64), 16, (4, 16), "float64"),
    (np.zeros((16, 4), np.float32), 16, (16, 4), "out not transposed"),
])
def test_refusals_name_what_is_accepted(x, n, out_shape, why):
    out = cuda.device_array(out_shape, np.float32)
    with pytest.raises(ValueError, match="accepted: x float32 .tokens, features."):
        transposed_rht(cuda.to_device(x), cuda.to_device(np.ones(n, np.float32)), out)


def test_a_two_dimensional_factor_array_is_refused_by_name():
    out = cuda.device_array((8, 16), np.float32)
    with pytest.raises(ValueError, match=r"factors float32 \(2, 2\).*a 1-D array"):
        transposed_rht(cuda.to_device(np.zeros((16, 8), np.float32)),
                       cuda.to_device(np.ones((2, 2), np.float32)), out)


@pytest.mark.parametrize("where", ["x", "part of x", "factors"])
def test_an_out_sharing_memory_with_what_it_reads_is_refused(where):
    """Threads write out[f, t] while others still read x[t, f]: an out that is x (square x),
    overlaps it or holds the factors once gave wrong values silently."""
    x = _data(16, 16, 1)
    c = factors(rht_signs(7, 2, 3, 16), torch.float32, "cpu").numpy()
    buf = cuda.to_device(np.concatenate([x.reshape(-1), c, np.zeros(256, np.float32)]))
    xd, cd = buf[:256].reshape(16, 16), buf[256:272]
    out = {"x": xd, "part of x": buf[8:264].reshape(16, 16),
           "factors": buf[256:512].reshape(16, 16)}[where]
    before = buf.copy_to_host()
    with pytest.raises(ValueError, match="out shares memory with x or the factors"):
        transposed_rht(xd, cd, out)
    assert np.array_equal(buf.copy_to_host().view(np.uint32), before.view(np.uint32))
    out = buf[272:528].reshape(16, 16)          # beside them: taken
    transposed_rht(xd, cd, out)
    want = rht_transposed(torch.from_numpy(x), rht_signs(7, 2, 3, 16)).numpy()
    assert same_bits(out.copy_to_host(), want)


@pytest.mark.skipif(SIMULATOR or not torch.cuda.is_available(),
                    reason="a torch CUDA tensor: needs a GPU (run with LPSIM_TEST_GPU=1)")
@pytest.mark.parametrize("n", [16, 32])
def test_a_cuda_tensor_takes_the_kernel_and_gives_torchs_bits(n):  # pragma: no cover
    x = torch.from_numpy(_data(64 * n, 96, n)).cuda()
    signs = rht_signs(1, 0, 5, n)
    want = rht(x.t().contiguous(), signs)                   # torch's operations
    for _ in range(2):                              # the second call takes the raw route
        got = rht_transposed(x, signs)
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert hadamard._ROUTES[n, x.device.index] is not None, hadamard.ROUTE_ERRORS
    cpu = rht_transposed(x.cpu(), signs)        # a GPU's NaN is its own canonical one
    assert torch.equal(got.isnan().cpu(), cpu.isnan())
    assert torch.equal(got.cpu().nan_to_num().view(torch.int32), cpu.nan_to_num().view(torch.int32))


ROUTE_CHECK = r"""
import sys
import numpy as np
sys.path.insert(0, "tests")
from flat_stand_ins import Device, flatten, typeof
from lpsim_cuda import hadamard, specialised

x, c = Device((64, 48), np.float32, 0x7F0000001000), Device(16, np.float32, 0x7F0000002000)
out = Device((48, 64), np.float32, 0x7F0000003000)
mine = hadamard.Route.arguments(x.ptr, 64, 48, c.ptr, 16, out.ptr)
print("same", specialised._same(mine, flatten(typeof((x, c, out)), (x, c, out))), len(mine))
# called as lpsim_cuda.hadamard._torch_call calls it, the launch takes those arguments
route, launched = hadamard.Route.__new__(hadamard.Route), []
route.launch = lambda stream, blocks, flat: launched.append((stream, blocks, flat))
route(x.ptr, 64, 48, c.ptr, 16, out.ptr, 7, "stream")
print("called", launched == [("stream", 7, mine)])
"""


def test_the_torch_route_flattens_as_numba_does():
    """The raw route of a torch call (lpsim_cuda.hadamard.Route) builds the flat arguments
    numba's launch builds for x, the factors and out (numba's flattening run on stand-ins of
    device arrays, no GPU); on a GPU the route checks the same once against the real
    launch."""
    out = without_simulator(ROUTE_CHECK)
    assert out.split() == ["same", "True", "25", "called", "True"], out
