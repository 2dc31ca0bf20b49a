"""The random Hadamard transform along the tokens, transposed, in one pass on the device.

Why: a recipe's weight gradient on a GPU quantizes the transposes of dY and X (K the tokens
along their rows) after the RHT along the tokens (:mod:`lpsim.torch.hadamard`).  In torch
operations that is a transposing copy, a product and log2(n) butterfly stages, each a pass
over memory and a launch or three.  Here each thread takes one feature's run of n tokens:
n loads (consecutive threads, consecutive features: coalesced), the factors and the butterfly
in registers, n stores to the transpose's row.  The arithmetic is
:func:`lpsim.blocks.hadamard_rows.hadamard_rows`' (each element times its factor, then for
h = n/2 .. 1 the pairs (i, i+h) become (a + b, a - b), each rounded once in float32: its
:func:`lpsim.blocks.hadamard_rows.butterfly`, on the run in registers), with
the products made by ``fmul_rn``, which NVVM never fuses with the sums that follow (a fused
multiply-add would round once where the CPU rounds twice): the same bits as the CPU.
"""

from __future__ import annotations

import functools

import numba
import numpy as np
from numba import cuda

from lpsim.blocks.hadamard_rows import butterfly

from . import launch, specialised
from .arrays import _numba_array
from .launch import SIMULATOR

#: the run lengths the kernel is compiled for (the recipes' RHT sizes and their divisors)
SIZES = (2, 4, 8, 16, 32)

if SIMULATOR:
    @cuda.jit(device=True)
    def _times(a, b):
        return a * b
else:                                                      # pragma: no cover (GPU only)
    from numba.cuda import libdevice

    @cuda.jit(device=True)
    def _times(a, b):
        return libdevice.fmul_rn(a, b)


@functools.cache
def transposed_kernel(n: int):
    """The kernel for runs of ``n`` tokens (a constant of its body, so that its loops unroll
    and the run stays in registers): out[f, r*n + i] = the transform of x[r*n + i, f]."""
    @cuda.jit
    def kernel(x, c, out):
        tokens, features = x.shape
        runs = tokens // n
        # work item i is (run i // features, feature i % features); the grid-stride loop
        # steps both by the stride's quotient and remainder (no division in the loop: a
        # 64-bit one is a subroutine of about a hundred instructions)
        i, stride = cuda.grid(1), cuda.gridsize(1)
        r, f = i // features, i % features
        dr, df = stride // features, stride % features
        while r < runs:
            t0 = r * n
            v = cuda.local.array(n, np.float32)
            for j in range(n):
                v[j] = _times(x[t0 + j, f], c[j])
            butterfly(v, 0, 1, n, n, 1, n // 2)
            for j in range(n):
                out[f, t0 + j] = v[j]
            r += dr
            f += df
            if f >= features:
                f -= features
                r += 1
    return kernel


def transposed_rht(x, c, out) -> None:
    """Write into ``out`` (features x tokens, float32) the RHT along the tokens of ``x``
    (tokens x features, float32), runs of n = len(c) tokens with factors ``c`` (float32):
    ``rht(x.t().contiguous(), signs)`` of :mod:`lpsim.torch.hadamard`, the same bits.  Each
    a C-contiguous CUDA array (a numba device array or a CUDA-array-interface object such as
    a torch tensor); the launch goes on x's stream (torch's current one for a tensor).
    Torch tensors take their run length's cached route once it is made (:class:`Route`)."""
    if launch.is_torch(x) and _torch_call(x, c, out):
        return
    with launch.device_of(x):
        _transposed_rht(x, c, out)


class Route(specialised.Route):
    """One run length's kernel as a raw launch for torch tensors: the flat arguments numba
    builds for the three arrays (each wrapped in a numba array on every call before), from
    the tensors' addresses and shapes; checked once against numba's own (recipes with an
    RHT make two of these calls a linear layer and step)."""

    def __init__(self, kern, kinds):
        super().__init__(kern, 0, 4, kinds)

    @staticmethod
    def arguments(x_ptr, tokens, features, c_ptr, n, out_ptr) -> list:
        size = tokens * features
        return ([0, 0, size, 4, x_ptr, tokens, features, features * 4, 4]
                + [0, 0, n, 4, c_ptr, n, 4]
                + [0, 0, size, 4, out_ptr, features, tokens, tokens * 4, 4])

    def check(self, xa, ca, oa, stream) -> bool:
        """Whether the route's flat arguments are numba's own for the same launch."""
        (tokens, features), n = xa.shape, ca.size
        mine = self.arguments(launch.address(xa), tokens, features, launch.address(ca), n,
                              launch.address(oa))
        return specialised._same(mine, specialised._numba_arguments(self.compiled,
                                                                    (xa, ca, oa), stream))

    def __call__(self, x_ptr, tokens, features, c_ptr, n, out_ptr, blocks, stream):
        """Launch on ``blocks`` blocks (the base class's call takes another kernel's
        arguments)."""
        self.launch(stream, blocks, self.arguments(x_ptr, tokens, features, c_ptr, n, out_ptr))


#: (run length, device) -> Route, or None where numba's flat arguments differed
_ROUTES: dict = {}
#: route key -> why it has no raw route
ROUTE_ERRORS: dict = {}


def _torch_call(x, c, out) -> bool:
    """Launch a torch call through its run length's route: True, or False where the call
    needs the general path (no route yet; anything a route does not cover, which the
    general path checks and names)."""
    import torch
    if not _ROUTES or not (type(c) is torch.Tensor and type(out) is torch.Tensor):
        return False
    n = c.numel()
    if x.ndim != 2 or c.ndim != 1 or out.ndim != 2:
        return False
    tokens, features = x.shape
    device = x.device.index
    route = _ROUTES.get((n, device))
    if (route is None or not x.is_cuda or tokens == 0 or features == 0 or tokens % n
            or any(t.dtype is not torch.float32 or t.device != x.device
                   or not t.is_contiguous() for t in (x, c, out))
            or tuple(out.shape) != (features, tokens)
            or device != torch.cuda.current_device()
            or _written_over(out.data_ptr(), out.numel(), ((x.data_ptr(), x.numel()),
                                                           (c.data_ptr(), n)))):
        return False
    route(x.data_ptr(), tokens, features, c.data_ptr(), n, out.data_ptr(),
          launch.grid_size(tokens * features // n, device),
          specialised._core_stream(launch.torch_stream_handle(device)))
    return True


def _written_over(out_ptr: int, out_n: int, reads) -> bool:
    """Whether ``out_n`` float32 at ``out_ptr`` share memory with any of the (address,
    count) float32 ranges ``reads`` (in place included: the transpose's threads race)."""
    return any(ptr < out_ptr + 4 * out_n and out_ptr < ptr + 4 * n for ptr, n in reads)


def _transposed_rht(x, c, out) -> None:
    xa, stream = _numba_array(x, "x")
    if launch.is_torch(x):
        stream = launch.torch_stream(x.device)
    ca, _ = _numba_array(c, "c")
    oa, _ = _numba_array(out, "out")
    n = ca.size
    tokens, features = xa.shape if xa.ndim == 2 else (0, 0)
    if (xa.ndim != 2 or ca.ndim != 1 or n not in SIZES or tokens % n
            or xa.dtype != np.float32 or ca.dtype != np.float32 or oa.dtype != np.float32
            or tuple(oa.shape) != (features, tokens)):
        raise ValueError(
            f"transposed_rht: x {xa.dtype} {tuple(xa.shape)}, factors {ca.dtype} "
            f"{tuple(ca.shape)}, out {oa.dtype} {tuple(oa.shape)} are not accepted; accepted: "
            f"x float32 (tokens, features), n in {SIZES} float32 factors (a 1-D array) with n "
            "dividing tokens, out float32 (features, tokens)")
    if xa.size == 0:
        return
    if _written_over(launch.address(oa), oa.size, ((launch.address(xa), xa.size),
                                                   (launch.address(ca), n))):
        raise ValueError("transposed_rht: out shares memory with x or the factors, which "
                         "its threads would write while others still read them; accepted: "
                         "an out of its own")
    device = launch.current_device()
    kern = transposed_kernel(n)
    launch.configured(kern, launch.grid_size(xa.size // n, device), stream)(xa, ca, oa)
    if launch.is_torch(x):
        def build():
            route = Route(kern, tuple(numba.typeof(a) for a in (xa, ca, oa)))
            return route, route.check(xa, ca, oa, stream)
        specialised.keep_route(_ROUTES, ROUTE_ERRORS, (n, x.device.index), build)


__all__ = ["SIZES", "transposed_kernel", "transposed_rht", "Route"]
