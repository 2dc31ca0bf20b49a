"""lpsim.quantize's short way for torch CUDA tensors (lpsim_cuda.quantize.torch_front), with no
GPU: a CPU tensor that says it is on CUDA stands in for one, and routes that round host memory
with lpsim's CPU kernels stand in for the cached raw launches.  So the front's own work is
held to the general path bit for bit: which calls it takes and which it leaves to the general
path, the generator's counters it takes and gives back, ``out`` and its version, format
names; and a counted block call's route (block_groups.torch_call with stats) to the CPU's
counters.  The raw launches themselves run on a GPU (test_cuda_specialised.py,
test_cuda_block_groups.py with LPSIM_TEST_GPU=1).
"""

import ctypes
import importlib

import numpy as np
import pytest
import torch

import lpsim
import lpsim_cuda.block_groups as block_groups
import lpsim_cuda.specialised as specialised
from lpsim.blocks import BlockStats, as_block_format, quantize_blocks
from lpsim.formats import parse_format
from lpsim.rounding import mode_code
from lpsim_cuda import counters, launch

MX = as_block_format("mxfp8_e4m3")
# the modules (their packages export functions of the same names)
front = importlib.import_module("lpsim.quantize")
cuda_quantize = importlib.import_module("lpsim_cuda.quantize")


class OnDevice(torch.Tensor):
    """A CPU tensor that answers is_cuda as a CUDA one does (torch's operations on it give
    plain tensors, as on a CUDA tensor they give CUDA ones)."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def is_cuda(self):
        return True


def on_device(t):
    return t.as_subclass(OnDevice)


def host(ptr, n):
    return np.ctypeslib.as_array((ctypes.c_float * n).from_address(ptr))


class ElementRoute:
    """specialised.Route's call, made by the CPU kernel on host memory: element i draws from
    Philox block keys[3] + i // 4 of (seed, stream), as the kernel does."""

    torch_dtype, out_bytes, in_bytes = None, 4, 4

    def __init__(self, fmt, rounding, sr_bits):
        self.fmt, self.rounding, self.sr_bits = fmt, rounding, sr_bits
        self.mode, self.calls = mode_code(rounding), 0

    def __call__(self, x_ptr, out_ptr, n, keys, stream, blocks):
        self.calls += 1
        lo, hi, key_stream, block0 = keys
        lpsim.quantize(host(x_ptr, n).copy(), self.fmt, self.rounding, seed=lo | hi << 32,
                       stream=key_stream, offset=4 * block0, sr_bits=self.sr_bits,
                       out=host(out_ptr, n))


class BlockRoute(ElementRoute):
    """block_groups.BlockRoute's call, by the CPU kernel (rows of whole blocks: the flat
    array's blocks are the rows' blocks)."""

    def __init__(self, bfmt, rounding, sr_bits):
        super().__init__(bfmt, rounding, sr_bits)
        self.bfmt = bfmt


@pytest.fixture
def routes(monkeypatch):
    """Stand-in routes for bf16 nearest and stochastic, e4m3fn with sr_bits=8, and MXFP8
    nearest and stochastic, keyed as the general path keys them (parsed formats)."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: None)   # a CPU tensor's index
    monkeypatch.setattr(launch, "torch_stream_handle", lambda device: 0)
    monkeypatch.setattr(specialised, "_core_stream", lambda handle: None)
    made = {}
    elements = {(parse_format("bf16"), "nearest", None), (parse_format("bf16"), "stochastic",
                                                          None),
                (parse_format("e4m3fn"), "stochastic", 8)}
    monkeypatch.setattr(specialised, "_ROUTES", {
        (f, r, b, type(b), None, None, 0): made.setdefault((f, r, b), ElementRoute(f, r, b))
        for f, r, b in elements})
    monkeypatch.setattr(block_groups, "_ROUTES", {
        (MX, r, None, type(None), None, 0, False): made.setdefault((MX, r, None),
                                                             BlockRoute(MX, r, None))
        for r in ("nearest", "stochastic")})
    monkeypatch.setattr(front, "_TORCH_TYPES", front._TORCH_TYPES | {(__name__, "OnDevice")})
    monkeypatch.setattr(front, "_TORCH_FRONT", None)
    return made


def values(shape=(4, 64), seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 3


CASES = [("bf16", "nearest", None, -1), ("bf16", "stochastic", None, -1),
         ("e4m3fn", "stochastic", 8, -1), ("mxfp8_e4m3", "nearest", None, -1),
         ("mxfp8_e4m3", "stochastic", None, 1)]


@pytest.mark.parametrize("fmt,rounding,sr_bits,axis", CASES)
def test_the_short_way_equals_the_general_path(routes, fmt, rounding, sr_bits, axis):
    """Through lpsim.quantize, a call its route takes gives the general path's bits, and a
    generator advances as far: three calls in a row, the format by name and parsed, new
    results and out= (in place too)."""
    x = values()
    ga, gb = lpsim.Generator(11), lpsim.Generator(11)
    for spec in (fmt, as_block_format(fmt) or parse_format(fmt)):
        want = lpsim.quantize(x, spec, rounding, sr_bits=sr_bits, generator=ga, axis=axis)
        got = lpsim.quantize(on_device(x), spec, rounding, sr_bits=sr_bits, generator=gb,
                             axis=axis)
        assert torch.equal(got.as_subclass(torch.Tensor), want)
        out = torch.empty_like(x)
        version = out._version
        want = lpsim.quantize(x, spec, rounding, sr_bits=sr_bits, generator=ga, axis=axis,
                              out=torch.empty_like(x))
        assert lpsim.quantize(on_device(x), spec, rounding, sr_bits=sr_bits, generator=gb,
                              axis=axis, out=out) is out
        assert torch.equal(out, want) and out._version > version
        inplace = x.clone()
        want = lpsim.quantize(x.clone(), spec, rounding, sr_bits=sr_bits, generator=ga,
                              axis=axis, out=None)
        lpsim.quantize(on_device(inplace), spec, rounding, sr_bits=sr_bits, generator=gb,
                       axis=axis, out=inplace)
        assert torch.equal(inplace, want)
        assert ga.get_state() == gb.get_state()
    seeded = lpsim.quantize(on_device(x), fmt, rounding, sr_bits=sr_bits, seed=5, stream=2,
                            axis=axis)
    assert torch.equal(seeded, lpsim.quantize(x, fmt, rounding, sr_bits=sr_bits, seed=5,
                                              stream=2, axis=axis))
    taken = sum(route.calls for route in routes.values())
    assert taken == 7                   # every call above took its route


def test_calls_a_route_does_not_cover_are_left_whole_to_the_general_path(routes):
    """None, no launch, and the generator where it was: autograd, negated views, stats, no
    route (another format, rounding or sr_bits), another axis, an out the route refuses, a
    generator inside another call of it, or not an lpsim.Generator."""
    x, g = values(), lpsim.Generator(3)
    state = g.get_state()
    leaf = on_device(values().requires_grad_())

    def call(t=None, fmt="bf16", rounding="stochastic", **kw):
        kw = dict(dict(seed=None, stream=0, sr_bits=None, out=None, offset=0, generator=g,
                       axis=-1), **kw)
        return cuda_quantize.torch_front(on_device(x) if t is None else t, fmt, rounding,
                                         **kw)

    declined = [call(leaf), call(on_device(torch.zeros(4, 64)._neg_view())),
                call(out=torch.zeros(4, 64)._neg_view()), call(fmt="fp16"),
                call(rounding="toward_zero"), call(sr_bits=4), call(fmt="e4m3fn", sr_bits=8.0),
                call(fmt="nope"), call(fmt=MX, rounding="stochastic", axis=0),
                call(fmt=MX, axis=True), call(out=torch.zeros(4, 64, dtype=torch.float64)),
                call(out=torch.zeros(64, 4)), call(out=torch.zeros(4, 128)[:, ::2]),
                call(offset=2), call(generator=np.random.default_rng(0))]
    assert declined == [None] * len(declined)
    assert g.get_state() == state and not any(r.calls for r in routes.values())
    g.begin()                           # inside another call of the same generator
    try:
        assert call() is None
    finally:
        g.end(False)
    assert g.get_state() == state
    with torch.no_grad():               # a leaf under no_grad is rounded, as torch's ops do
        assert call(leaf) is not None
    assert g.get_state() != state


def test_the_general_path_still_names_what_is_wrong(routes):
    """A call the short way leaves keeps the general path's refusal (here: a bad offset, a
    bad seed); nothing is taken from the generator."""
    g = lpsim.Generator(1)
    state = g.get_state()
    with pytest.raises(ValueError, match="offset"):
        lpsim.quantize(on_device(values()), "bf16", "stochastic", generator=g, offset=-4)
    with pytest.raises(ValueError, match="seed"):
        lpsim.quantize(on_device(values()), "bf16", "stochastic", seed=-1)
    assert g.get_state() == state and not any(r.calls for r in routes.values())


class OnDevice0(OnDevice):
    """A stand-in that says it is on cuda:0 (a counted call's accumulator is per device)."""

    @property
    def device(self):
        return torch.device("cuda", 0)


class CountedRoute(BlockRoute):
    """block_groups.CountedBlockRoute's call, by the CPU kernel: the values, and the call's
    nine counters added into the stats object's accumulator array, as the kernel adds
    them."""

    def __init__(self, bfmt, rounding, sr_bits):
        super().__init__(bfmt, rounding, sr_bits)
        self.bounds = block_groups._bounds(bfmt, 1.0, bfmt.tensor_scale)

    def __call__(self, x_ptr, out_ptr, n, keys, stream, blocks, counts):
        self.calls += 1
        lo, hi, key_stream, block0 = keys
        q = quantize_blocks(host(x_ptr, n).copy(), self.bfmt, self.rounding,
                            seed=lo | hi << 32, stream=key_stream, offset=4 * block0,
                            sr_bits=self.sr_bits, want_counts=True)
        host(out_ptr, n)[:] = q.values
        for f, total in enumerate(q.counts.reshape(-1, 9).sum(axis=0)):
            counts[f] += total


@pytest.mark.parametrize("fmt,rounding", [("mxfp8_e4m3", "nearest"),
                                          ("mxfp8_e4m3", "stochastic"), ("nvfp4", "stochastic")])
def test_counted_block_calls_take_their_route_with_the_cpus_counters(routes, monkeypatch,
                                                                     fmt, rounding):
    """A counted MX or NVFP4 call whose request has a counted route (block_groups.torch_call
    with stats) gives the general path's values and counters: two stats objects, three
    calls, a generator; the route adds into each stats object's own accumulator."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(launch, "is_torch", lambda x: isinstance(x, torch.Tensor))
    monkeypatch.setattr(launch, "capturing", lambda x: False)
    bfmt = as_block_format(fmt)
    route = CountedRoute(bfmt, rounding, None)
    monkeypatch.setattr(block_groups, "_COUNTED",
                        {(bfmt, rounding, None, type(None), 0, 0, False): route})
    ga, gb = lpsim.Generator(4), lpsim.Generator(4)
    for calls in (1, 3):
        want, got = BlockStats(), BlockStats()
        for j in range(calls):
            x = values((8, 64), seed=j) * 2.0 ** (8 * j - 12)     # saturated and flushed too
            expected = lpsim.quantize(x, bfmt, rounding, generator=ga, stats=want)
            result = lpsim.quantize(x.as_subclass(OnDevice0), bfmt, rounding, generator=gb,
                                    stats=got)
            assert torch.equal(result.as_subclass(torch.Tensor), expected)
        assert got == want and got.blocks == want.blocks > 0
    assert route.calls == 4 and ga.get_state() == gb.get_state()


class GivenScaleRoute(BlockRoute):
    """block_groups.BlockRoute of NVFP4 with the caller's tensor scale, called with each
    call's (pts, pts_inv), by the CPU kernel at that scale."""

    def __call__(self, x_ptr, out_ptr, n, keys, stream, blocks, counts, scale):
        assert counts is None and scale[1] == np.float32(1 / np.float32(scale[0]))
        self.calls += 1
        lo, hi, key_stream, block0 = keys
        host(out_ptr, n)[:] = quantize_blocks(
            host(x_ptr, n).copy(), self.bfmt, self.rounding, seed=lo | hi << 32,
            stream=key_stream, offset=4 * block0, sr_bits=self.sr_bits,
            tensor_scale=scale[0], want_elements=False).values


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_nvfp4_with_a_given_tensor_scale_takes_its_route(routes, monkeypatch, rounding):
    """NVFP4 with the caller's tensor scale (lpsim_cuda.blocks.quantize): a call its route
    takes (one route for every scale, the scale an argument of each launch) gives the
    general path's bits; a scale the general path refuses is refused by name, the route not
    launched."""
    import lpsim_cuda.blocks
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(launch, "is_torch", lambda x: isinstance(x, torch.Tensor))
    bfmt = as_block_format("nvfp4")
    route = GivenScaleRoute(bfmt, rounding, None)
    monkeypatch.setattr(block_groups, "_ROUTES",
                        {(bfmt, rounding, None, type(None), 0, 0, True): route})
    x = values((8, 64), seed=3)
    for j, scale in enumerate((0.25, 3.0, np.float32(1e-3), 7)):
        want = lpsim.blocks.quantize(x, bfmt, rounding, seed=j, offset=8 * j,
                                     tensor_scale=scale)
        got = lpsim_cuda.blocks.quantize(x.as_subclass(OnDevice0), bfmt, rounding, seed=j,
                                         offset=8 * j, tensor_scale=scale)
        assert torch.equal(got.as_subclass(torch.Tensor), want)
    assert route.calls == 4
    for bad in (float("inf"), 0.0, "2"):
        with pytest.raises((ValueError, TypeError), match="tensor_scale="):
            lpsim_cuda.blocks.quantize(x.as_subclass(OnDevice0), bfmt, rounding, seed=1,
                                       tensor_scale=bad)
    assert route.calls == 4


class CountedElementRoute(ElementRoute):
    """specialised.CountedRoute's call, by the CPU kernel: the values, and the call's six
    counters and element count added into the stats object's accumulator array (SLOTS
    order), as the kernel adds them."""

    def __call__(self, x_ptr, out_ptr, n, keys, stream, blocks, counts):
        self.calls += 1
        lo, hi, key_stream, block0 = keys
        stats = lpsim.RoundingStats()
        lpsim.quantize(host(x_ptr, n).copy(), self.fmt, self.rounding, seed=lo | hi << 32,
                       stream=key_stream, offset=4 * block0, sr_bits=self.sr_bits,
                       out=host(out_ptr, n), stats=stats)
        for slot, value in enumerate((*stats.counts[1:], stats.counts[0])):
            counts[slot] += value


@pytest.mark.parametrize("fmt,rounding,sr_bits", [("bf16", "nearest", None),
                                                  ("e4m3fn", "stochastic", 8)])
def test_counted_element_calls_take_their_route_through_the_short_way(routes, monkeypatch,
                                                                      fmt, rounding,
                                                                      sr_bits):
    """lpsim.quantize with stats= of a torch CUDA tensor whose counted request has a route
    goes to it (the short way, specialised.torch_call with stats): the general path's
    values and counters, two stats objects, a generator; stats that are not a
    RoundingStats are left to the general path."""
    monkeypatch.setattr(launch, "capturing", lambda x: False)
    launch_counts = counters.launch_counts       # the stand-in's device: a CPU tensor's None
    monkeypatch.setattr(counters, "launch_counts",
                        lambda stats, device, *rest: launch_counts(stats, 0, *rest))
    parsed = parse_format(fmt)
    route = CountedElementRoute(parsed, rounding, sr_bits)
    monkeypatch.setattr(specialised, "_COUNTED",
                        {(parsed, rounding, sr_bits, type(sr_bits), None, None, 0): route})
    ga, gb = lpsim.Generator(6), lpsim.Generator(6)
    for calls in (1, 3):
        want, got = lpsim.RoundingStats(), lpsim.RoundingStats()
        for j in range(calls):
            x = values((8, 64), seed=j) * 2.0 ** (70 * j - 140)   # underflows too
            expected = lpsim.quantize(x, fmt, rounding, sr_bits=sr_bits, generator=ga,
                                      stats=want)
            result = lpsim.quantize(on_device(x), fmt, rounding, sr_bits=sr_bits,
                                    generator=gb, stats=got)
            assert torch.equal(result.as_subclass(torch.Tensor), expected)
        assert got == want and got.underflow > 0
    assert route.calls == 4 and ga.get_state() == gb.get_state()
    state = gb.get_state()
    assert cuda_quantize.torch_front(on_device(values()), parsed, rounding, None,
                                     0, sr_bits, None, 0, gb, -1, stats="counts") is None
    assert route.calls == 4 and gb.get_state() == state


class CodesBlockRoute(BlockRoute):
    """block_groups.BlockRoute's call on a bfloat16 tensor's codes (in_bytes 2), by the CPU
    kernel on their float32 values."""

    in_bytes = 2

    def __call__(self, x_ptr, out_ptr, n, keys, stream, blocks):
        codes = np.ctypeslib.as_array((ctypes.c_uint16 * n).from_address(x_ptr))
        values = (codes.astype(np.uint32) << 16).view(np.float32)
        self.calls += 1
        lo, hi, key_stream, block0 = keys
        lpsim.quantize(values, self.fmt, self.rounding, seed=lo | hi << 32, stream=key_stream,
                       offset=4 * block0, out=host(out_ptr, n))


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_a_bfloat16_tensors_block_call_takes_its_codes_route(routes, monkeypatch, rounding):
    """A bfloat16 tensor's MX request has a route of its own (keyed by its kind, 1): the
    front takes it, and the result is float32, the general path's bits; a float32 tensor's
    route is not taken for it, nor its route for a float32 tensor."""
    from lpsim_cuda.arrays import half_kind
    route = CodesBlockRoute(MX, rounding, None)
    monkeypatch.setitem(block_groups._ROUTES,
                        (MX, rounding, None, type(None), None, half_kind(torch.bfloat16), False),
                        route)
    x = values(seed=3).bfloat16()
    ga, gb = lpsim.Generator(5), lpsim.Generator(5)
    for _ in range(2):
        want = lpsim.quantize(x, MX, rounding, generator=ga)
        got = lpsim.quantize(on_device(x), MX, rounding, generator=gb)
        assert got.dtype == torch.float32
        assert torch.equal(got.as_subclass(torch.Tensor), want)
    assert route.calls == 2 and routes[MX, rounding, None].calls == 0
    lpsim.quantize(on_device(x.float()), MX, rounding, generator=gb)
    assert route.calls == 2 and routes[MX, rounding, None].calls == 1
