"""lpsim_cuda's fused optimizer step against the CPU kernel, bit for bit.

Under NUMBA_ENABLE_CUDASIM=1 (conftest) the kernel runs in numba's simulator on a few dozen
elements; with LPSIM_TEST_GPU=1 on a GPU machine the same tests run on the device, and
test_gpu_optimizer_matches_cpu steps torch CUDA tensors through the optimizer.
"""

import os

import numpy as np
import pytest
import torch
from numba import cuda, njit
from numba.extending import register_jitable

from lpsim.optim import SGD, AdamW, cpu, keys
from lpsim.optim import step as core
from lpsim.optim.setup import resolve
from lpsim.philox import split_key
import lpsim_cuda.optim as cuda_optim
from lpsim_cuda import launch, vector
from lpsim_cuda.optim import aligned, rebind, step_arrays
from conftest import without_simulator

GPU = os.environ.get("LPSIM_TEST_GPU") == "1"

CONFIGS = [
    (AdamW, torch.bfloat16, dict(update_rounding="stochastic", state_rounding="stochastic")),
    (AdamW, torch.bfloat16, dict(update_rounding="remainder")),
    (SGD, torch.float16, dict(update_rounding="kahan", momentum=0.9, nesterov=True,
                              weight_decay=0.1)),
    (AdamW, torch.float32, dict(update_rounding="stochastic", weight_format="fp(5,6)",
                                sr_bits=5)),
]


def inputs(cls, dtype, kw, n, offset, t=3, specials=()):
    """The kernel arguments of one parameter at step t, as numpy bit arrays; ``specials``:
    gradient values put at its elements 3, 4, ..."""
    gen = torch.Generator().manual_seed(n + offset)
    p = torch.nn.Parameter(torch.randn(n, generator=gen).to(dtype))
    opt = cls([p], lr=0.05, seed=77, **kw)
    group = opt.param_groups[0]
    setup = resolve(group, p, dtype)
    state = opt._init_state(p, p, group, setup)
    for name in state:
        if torch.is_tensor(state[name]) and state[name].dtype != torch.int16:
            state[name].copy_(torch.rand(n, generator=gen).to(state[name].dtype) * 0.1)
        elif torch.is_tensor(state[name]):
            state[name].copy_(torch.randint(-2 ** 15, 2 ** 15, (n,), generator=gen))
    grad = torch.randn(n, generator=gen)
    grad[3:3 + len(specials)] = torch.tensor(specials)
    grad = grad.to(dtype)
    names = opt._state_names(group)
    sdummy = np.zeros(1, np.int16 if setup.state_dtype != torch.float32 else np.int32)
    arrays = [cpu.bits_view(p), cpu.bits_view(grad)] + \
        [cpu.bits_view(state[x] if x in state else None, sdummy)
         for x in (names + (None,) * (2 - len(names)))[:2] + ("kahan_comp",)] + \
        [cpu.bits_view(state.get("remainder"))]
    streams = tuple(keys.stream(t, 0, slot) for slot in range(3))
    ints = (opt._algo, setup.update, setup.wmode, setup.wk, setup.smode, setup.sk,
            int(group.get("nesterov", False)), 0)
    kargs = (setup.kinds, opt._hyper(group, t), ints, split_key(77, "seed") + streams, offset)
    return [a.copy() for a in arrays], kargs, setup


def stepped_as_cpu(arrays, kargs, setup):
    """Step copies of ``arrays`` with the CPU kernel and on the device; assert the codes
    and counters equal; return (the CPU's arrays, its counters)."""
    host = [a.copy() for a in arrays]
    counts_cpu = cpu.step(*host, *kargs, setup)
    device = [cuda.to_device(a) for a in arrays]
    counts = cuda.to_device(np.zeros(core.NCOUNTS, np.int64))
    step_arrays(*device, *kargs, setup, counts)
    for want, got in zip(host, device):
        np.testing.assert_array_equal(got.copy_to_host(), want)
    np.testing.assert_array_equal(counts.copy_to_host(), counts_cpu)
    return host, counts_cpu


@pytest.mark.parametrize("cls,dtype,kw", CONFIGS)
@pytest.mark.parametrize("n,offset", [(37, 0), (29, 6)])
def test_cuda_kernel_equals_cpu_kernel(cls, dtype, kw, n, offset):
    _, counts_cpu = stepped_as_cpu(*inputs(cls, dtype, kw, n, offset))
    assert counts_cpu[0] > 0                   # the step did round something


@pytest.mark.parametrize("cls,dtype,kw", CONFIGS)
def test_the_wide_kernel_loading_ahead_equals_the_cpu_kernel(cls, dtype, kw, monkeypatch):
    """The wide kernel that loads each pass's next quad before stepping its own
    (lpsim_cuda.optim.LOAD_AHEAD), on a one-block grid so that each thread makes two or
    three passes (its last loads nothing ahead), with a tail and NaN, inf and huge gradients
    (quads the straight path declines): the CPU kernel's codes and counters."""
    monkeypatch.setattr(cuda_optim, "LOAD_AHEAD", True)
    monkeypatch.setattr(launch, "GRID_LIMIT", 1)
    n = 4 * launch.THREADS * 2 + 37
    stepped_as_cpu(*inputs(cls, dtype, kw, n, 0, specials=(float("nan"), float("inf"),
                                                           -3e38, 1e-40)))
    assert any(key[6] and key[7] for key in cuda_optim.KERNELS)     # wide, loading ahead


def test_aligned_parameters_take_the_wide_kernel():
    """test_cuda_kernel_equals_cpu_kernel's offsets run both kernels: 0 the wide one (quads
    read by one load per array), 6 the element-wise one; so does an array whose data starts
    off a four-element boundary."""
    arrays, _, _ = inputs(AdamW, torch.bfloat16, CONFIGS[0][2], 37, 0)
    device = [cuda.to_device(a) for a in arrays]
    assert aligned(0, device) and not aligned(6, device) and not aligned(2, device)
    shifted = cuda.to_device(np.zeros(9, np.int16))[1:5]
    assert not aligned(0, [shifted] + device[1:])


@pytest.mark.parametrize("cls,dtype,kw", CONFIGS)
def test_cuda_kernel_stores_the_cpu_kernels_nans(cls, dtype, kw):
    """NaN and inf gradients: weights and states stored as the same NaN codes (a GPU's
    arithmetic makes one canonical NaN, a CPU's keeps an operand's; both store QUIET_NAN)."""
    arrays, kargs, setup = inputs(cls, dtype, kw, 37, 0, specials=(
        float("nan"), float("inf"), float("-inf"), -float("nan"), 3e38, -3e38))
    host, _ = stepped_as_cpu(arrays, kargs, setup)
    w = host[0]
    w = w.view(np.float16) if setup.kinds[0] == core.STORE_F16 else \
        (w.astype(np.int32) << (16 if w.itemsize == 2 else 0)).view(np.float32)
    assert np.isnan(w[[3, 6]]).all() and not np.isnan(w[7:]).any()


@pytest.mark.parametrize("cls,dtype,kw", CONFIGS)
def test_cuda_kernel_steps_infinite_weights_as_the_cpu_kernel(cls, dtype, kw):
    """Infinite weights (on the wide kernel's straight path their NaN update is declined,
    the general path decides): the CPU kernel's codes; infinite where torch.optim keeps
    them (AdamW with lr wd < 1, SGD without weight decay)."""
    arrays, kargs, setup = inputs(cls, dtype, kw, 37, 0)
    inf = {core.STORE_F32: (0x7F800000, -0x800000), core.STORE_BF16: (0x7F80, -0x80),
           core.STORE_F16: (0x7C00, -0x400)}[setup.kinds[0]]
    arrays[0][[4, 9, 10, 11]] = inf * 2
    if setup.update == core.REMAINDER:          # the float32 master's low half: inf's
        arrays[5][[4, 9, 10, 11]] = 0
    host, _ = stepped_as_cpu(arrays, kargs, setup)
    if cls is AdamW or kw.get("weight_decay", 0) == 0:
        assert np.array_equal(host[0][[4, 9, 10, 11]], arrays[0][[4, 9, 10, 11]])


def test_rebind_compiles_the_same_source_with_another_product():
    """The GPU build's mechanism, checked on the CPU: step_quad rebound to a product that is
    a*b again gives the original's bits."""
    calls = register_jitable(lambda a, b: a * b)
    quad = rebind(core, {"fmul": calls})["step_quad"]

    @njit
    def run(q, n, offset, wb, gb, mb, vb, cb, rb, kinds, hp, ints, ks, pw, pc, ps, sp, counts):
        quad(q, n, offset, wb, gb, mb, vb, cb, rb, kinds, hp, ints, ks, pw, pc, ps, sp, counts)

    arrays, kargs, setup = inputs(*CONFIGS[0], 16, 0)
    host = [a.copy() for a in arrays]
    cpu.step(*host, *kargs, setup)
    kinds, hp, ints, ks, offset = kargs
    counts = np.zeros(core.NCOUNTS, np.int64)
    for q in range(4):
        run(q, 16, 0, *arrays, kinds, hp, ints, ks, setup.pw, setup.pc, setup.ps,
            tuple(setup.sp16), counts)
    for want, got in zip(host, arrays):
        np.testing.assert_array_equal(got, want)


@pytest.mark.skipif(not GPU, reason="needs a GPU: run with LPSIM_TEST_GPU=1 on a CUDA machine")
@pytest.mark.parametrize("cls,dtype,kw", CONFIGS)
def test_gpu_optimizer_matches_cpu(cls, dtype, kw):
    """torch CUDA tensors through the optimizer (fused lpsim_cuda) == the CPU fused kernel,
    on 2**20 + 3 elements over 3 steps, counters included."""
    n = 2 ** 20 + 3
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(n, generator=gen).to(dtype)
    grads = [torch.randn(n, generator=gen).to(dtype) for _ in range(3)]
    out = []
    for device in ("cpu", "cuda"):
        p = torch.nn.Parameter(w.clone().to(device))
        opt = cls([p], lr=0.01, seed=5, **kw)
        for g in grads:
            p.grad = g.to(device)
            opt.step()
        out.append((p.detach().cpu(), opt.update_stats.as_dict(), opt.cancelled_updates,
                    {k: v.cpu() for k, v in opt.state[p].items() if torch.is_tensor(v)}))
    (pa, sa, ca, ta), (pb, sb, cb, tb) = out
    assert torch.equal(pa.view(torch.int16 if dtype != torch.float32 else torch.int32),
                       pb.view(torch.int16 if dtype != torch.float32 else torch.int32))
    assert (sa, ca) == (sb, cb)
    for key in ta:
        assert torch.equal(ta[key], tb[key]), key


@pytest.mark.parametrize("cls,dtype,kw", CONFIGS)
def test_step_with_its_configuration_as_constants_equals_the_cpu_kernel(cls, dtype, kw):
    """lpsim_cuda compiles one step kernel per configuration, its options and formats as
    constants; compiled so on the CPU, LLVM folds the same branches.  Float16's Kahan step
    once stored garbage compensations on an H100, where a constant shift of 125 in
    lpsim.storage.pack_bits was folded (test_storage holds that one on the CPU)."""
    arrays, kargs, setup = inputs(cls, dtype, kw, 4099, 3)
    kinds, hp, ints, ks, offset = kargs
    KINDS, INTS, PW, PC, PS, SP = (tuple(kinds), tuple(ints), setup.pw, setup.pc, setup.ps,
                                   tuple(setup.sp16))

    @njit
    def baked(nquads, n, wb, gb, mb, vb, cb, rb, hp, ks, counts):
        for q in range(nquads):
            core.step_quad(offset // 4 + q, n, offset, wb, gb, mb, vb, cb, rb, KINDS, hp, INTS,
                           ks, PW, PC, PS, SP, counts)

    host = [a.copy() for a in arrays]
    counts_cpu = cpu.step(*host, *kargs, setup)
    counts = np.zeros(core.NCOUNTS, np.int64)
    baked((offset + 4099 + 3) // 4 - offset // 4, 4099, *arrays, hp, ks, counts)
    for want, got in zip(host, arrays):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(counts, counts_cpu)


def _set_of(cls, dtype, kw, sizes, t, unaligned=()):
    """Per-tensor kernel arguments of tensors of ``sizes`` (positions 0, 1, ... of one
    optimizer) and a lpsim_cuda.optim.Table over device copies of them; the tensors at
    ``unaligned`` positions start one element into their buffers.  (table, device arrays,
    host arrays, kargs of each, setup)."""
    rows, device, host, kargs_all = [], [], [], []
    for index, n in enumerate(sizes):
        arrays, kargs, setup = inputs(cls, dtype, kw, max(n, 1), 0, t=t,
                                      specials=(float("nan"), 3e38) if index == 1 else ())
        arrays = [a[:n] if a.size > 1 else a for a in arrays]
        kinds, hp, ints, ks, offset = kargs
        kargs = (kinds, hp, ints, ks[:2] + tuple(keys.stream(t, index, s) for s in range(3)),
                 offset)
        skip = int(index in unaligned)
        views = [cuda.to_device(np.concatenate([a[:skip], a]))[skip:] for a in arrays]
        present = [v.size == n and n > 0 for v in views]
        rows.append((*(vector.address_of(v) if ok else 0 for v, ok in zip(views, present)),
                     n, 0, *(keys.stream(0, index, s) for s in range(3))))
        device.append(views)
        host.append(arrays)
        kargs_all.append(kargs)
    return cuda_optim.Table(rows, setup), device, host, kargs_all, setup


@pytest.mark.parametrize("cls,dtype,kw", CONFIGS)
def test_a_set_in_one_launch_equals_each_tensor_on_the_cpu(cls, dtype, kw, monkeypatch):
    """One launch over a set's table (lpsim_cuda.optim.Table): tensors of no, 1, 7 and 1303
    elements (several tiles; a one-block grid makes the grid-stride loop take each in turn),
    one holding NaN and huge gradients (quads the straight path declines) and one that starts
    off a four-element boundary (the general path) equal the CPU kernel tensor by tensor,
    counters included, each with its own position's streams."""
    monkeypatch.setattr(launch, "GRID_LIMIT", 1)
    sizes = [37, 1303, 0, 7, 130, 1, 0]
    t = 4
    table, device, host, kargs, setup = _set_of(cls, dtype, kw, sizes, t, unaligned=(4,))
    table.refresh([views[1] for views in device])
    assert table.host[:, cuda_optim.WIDE].tolist() == [1, 1, 1, 1, 0, 1, 1]
    assert table.tiles >= 4 and table.elements == sum(sizes)
    counts = cuda.to_device(np.zeros(core.NCOUNTS, np.int64))
    kinds, hp, ints, seed, _ = kargs[0]
    table.step(hp, ints, seed[:2], t, counts)
    want = np.zeros(core.NCOUNTS, np.int64)
    for views, arrays, args, n in zip(device, host, kargs, sizes):
        mine = [a.copy() for a in arrays]
        if n:
            want += cpu.step(*mine, *args, setup)
        for expected, got in zip(mine, views):
            np.testing.assert_array_equal(got.copy_to_host(), expected)
    np.testing.assert_array_equal(counts.copy_to_host(), want)
    assert want[0] > 0


def test_a_table_of_no_tensors_steps_nothing():
    _, kargs, setup = inputs(*CONFIGS[0], 8, 0)
    table = cuda_optim.Table([], setup)
    table.refresh([])
    counts = cuda.to_device(np.zeros(core.NCOUNTS, np.int64))
    table.step(kargs[1], kargs[2], kargs[3][:2], 3, counts)
    assert (table.tiles, table.elements) == (0, 0) and not counts.copy_to_host().any()


def test_the_table_search_finds_each_tiles_tensor():
    """_row_of: the row whose tiles hold a tile, past rows of no tiles."""
    table = np.zeros((5, cuda_optim.COLUMNS), np.int64)
    table[:, cuda_optim.FIRST] = [0, 2, 2, 3, 3]       # rows 1 and 3 have no tiles
    search = njit(cuda_optim._row_of)
    assert [search(table, tile) for tile in range(6)] == [0, 0, 2, 4, 4, 4]


@pytest.mark.skipif(not GPU, reason="needs a GPU: run with LPSIM_TEST_GPU=1 on a CUDA machine")
@pytest.mark.parametrize("cls,dtype,kw", CONFIGS)
def test_gpu_optimizer_sets_match_cpu(cls, dtype, kw):
    """torch CUDA parameters of many sizes (one launch per set, foreach=True) == one launch
    per tensor (foreach=False; from the second step on, raw launches) == the CPU, over 3
    steps, counters included; one parameter
    is a view that starts off a four-element boundary, and the last step's gradients
    are new tensors (the table's gradient addresses change)."""
    gen = torch.Generator().manual_seed(1)
    sizes = [(3, 5), (2 ** 18 + 3,), (1,), (64, 33), (0,), (1000,)]
    base = [torch.randn(s, generator=gen).to(dtype) for s in sizes]
    grads = [[torch.randn(s, generator=gen).to(dtype) for s in sizes] for _ in range(3)]
    out = []
    for device, foreach in (("cpu", True), ("cuda", False), ("cuda", True)):
        flat = torch.zeros(1001, dtype=dtype, device=device)
        params = [torch.nn.Parameter(b.clone().to(device)) for b in base]
        params[5] = torch.nn.Parameter(flat[1:])            # off a four-element boundary
        params[5].data.copy_(base[5])
        opt = cls(params, lr=0.01, seed=5, foreach=foreach, **kw)
        for step in grads:
            for p, g in zip(params, step):
                p.grad = g.to(device)
            opt.step()
        if device == "cuda" and foreach:        # steps 2 and 3 took the raw launch
            tables = [entry[6] for entry in opt._table_cache.values()]
            assert tables and all(any(t._routes.values()) for t in tables), \
                cuda_optim.ROUTE_ERRORS
        if device == "cuda" and not foreach:    # so did each per-tensor kernel's
            assert cuda_optim._STEP_ROUTES and all(cuda_optim._STEP_ROUTES.values()), \
                cuda_optim.ROUTE_ERRORS
        out.append(([p.detach().cpu() for p in params], opt.update_stats.as_dict(),
                     opt.cancelled_updates,
                     [{k: v.cpu() for k, v in opt.state[p].items() if torch.is_tensor(v)}
                      for p in params]))
    for got in out[1:]:
        for a, b in zip(out[0][0], got[0]):
            assert torch.equal(a.view(torch.int16 if dtype != torch.float32 else torch.int32),
                               b.view(torch.int16 if dtype != torch.float32 else torch.int32))
        assert got[1:3] == out[0][1:3]
        for sa, sb in zip(out[0][3], got[3]):
            for key in sa:
                assert torch.equal(sa[key], sb[key]), key


ROUTE_CHECK = r"""
import inspect, sys
import numpy as np
sys.path.insert(0, "tests")
from flat_stand_ins import Device, flatten, typeof
import lpsim_cuda.optim as O
from lpsim.philox import round_keys
from lpsim_cuda import specialised

# the set kernel's own parameters: the table, its placeholders, then six more
kernel = O._make_kernel((), (), None, None, None, (), "set")
protos = len(inspect.signature(kernel.py_func).parameters) - 1 - 6
hp = tuple(np.float32(0.1 * (k + 1)) for k in range(14))
args = (Device((3, 14), np.int64, 0x7F0000001000),
        *(Device((4,), np.int16, 0x7F0000002000 + 256 * k) for k in range(protos)),
        hp, (123, 456, 7 << 24), round_keys(123, 456), Device((7,), np.int64, 0x7F0000003000),
        5, 4)
theirs = flatten(typeof(args), args)
route = O.TableRoute.__new__(O.TableRoute)
route.fix(args)
mine = route.arguments(args[0].ptr, *args[-6:-3])
# the table 9, each placeholder 7, hp 14, keys 3, round keys 20, counts 7, tiles and passes 2
print("same", specialised._same(mine, theirs), len(mine) == len(theirs) == 55 + 7 * protos)
other = route.arguments(0x7F0000009000, hp[::-1], (1, 2, 3), args[-4])
at = 9 + 7 * protos                     # the table's 9 flat arguments, each placeholder's 7
print("moved", other[4] == 0x7F0000009000,
      [v.value for v in other[at:at + 14]] == [float(h) for h in hp[::-1]],
      [v.value for v in other[at + 14:at + 17]] == [1, 2, 3], other[at + 17:] == mine[at + 17:])
"""


def test_the_set_launch_route_flattens_as_numba_does():
    """The set kernel's raw launch (lpsim_cuda.optim.TableRoute) builds the flat arguments
    numba's launch builds for the same table, placeholders, hyperparameters, keys, round
    keys, counters and tile counts (numba's flattening run on stand-ins of device arrays,
    no GPU), and each step's values land in their own places.  On a GPU the route checks
    the same once against the real launch (test_gpu_optimizer_sets_match_cpu)."""
    out = without_simulator(ROUTE_CHECK)
    assert out.split() == ["same", "True", "True", "moved", "True", "True", "True", "True"], \
        out



STEP_ROUTE_CHECK = r"""
import sys
import numpy as np
sys.path.insert(0, "tests")
from flat_stand_ins import Device, flatten, typeof
import lpsim_cuda.optim as O
from lpsim.optim.step import NCOUNTS
from lpsim.philox import round_keys
from lpsim_cuda import specialised

arrays = [Device((1001,), dt, 0x7F0000001000 + 0x10000 * k)
          for k, dt in enumerate((np.int16, np.int16, np.int32, np.int32, np.int16, np.int16))]
hp = tuple(np.float32(0.1 * (k + 1)) for k in range(14))
keys = (123, 456, 7 << 24, 8 << 24, 9 << 24)     # the seed's halves, three streams
counts = Device((NCOUNTS,), np.int64, 0x7F0000009000)
args = (*arrays, hp, keys, round_keys(123, 456), 5, counts)
theirs = flatten(typeof(args), args)
route = O.StepRoute.__new__(O.StepRoute)
route.tail = specialised._array_arguments(counts.ptr, NCOUNTS, 8)
route._ks = None
parts = [(a.ptr, 1001, a.dtype.itemsize) for a in arrays]
mine = route.arguments(parts, hp, keys, 5)
print("same", specialised._same(mine, theirs), len(mine) == len(theirs) == 89)
new = (9, 10, 11, 12, 13)                                   # another seed: its round keys
other = route.arguments(parts, hp, new, 5)
print("reseeded", specialised._same(other, flatten(typeof(args), (*arrays, hp, new,
                                                              round_keys(9, 10), 5, counts))))
# called as lpsim_cuda.optim.step calls it
launched = []
route.launch = lambda stream, blocks, flat: launched.append((stream, blocks, flat))
route(parts, hp, keys, 5, 7, "stream")
print("called", launched[0][:2] == ("stream", 7) and specialised._same(launched[0][2], theirs))
"""


def test_the_per_tensor_step_route_flattens_as_numba_does():
    """A per-tensor step's raw launch (lpsim_cuda.optim.StepRoute) builds the flat arguments
    numba's launch builds for the six arrays, hyperparameters, keys, the seed's round keys,
    offset and counters (numba's flattening on stand-ins of device arrays, no GPU), makes
    another seed's round keys, and takes the arguments lpsim_cuda.optim.step passes.  On a
    GPU the route checks the same once against the real launch."""
    out = without_simulator(STEP_ROUTE_CHECK)
    assert out.split() == ["same", "True", "True", "reseeded", "True", "called", "True"], out
