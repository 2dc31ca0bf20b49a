"""CA-SGD on the GPU (``casgd(..., backend="cuda")``): data resident in u_A's storage format,
GEMMs on cuBLAS through torch, the inner recurrence and the sampler as numba.cuda kernels.

Per outer iteration (Algorithm 1; Section 6): draw s*b rows on the device (counter-based,
:mod:`.sampling`), gather them (dense rows, or CSR rows densified by a kernel), margins
r = Y x and Gram G = Y Y^T with u_A inputs and FP32 accumulation and output (``torch.mm``
with ``out_dtype``; TF32 only where a slot says ``t``), the casts of the grouped AllReduce,
the inner recurrence (:mod:`lpsim_cuda.casgd`, the simulator's own jitted steps), and the
outer gradient GEMM fused with the update, x = x + (eta/b) Y^T delta (addmm, beta = 1).
With ``graphs=True`` an outer iteration is captured once as a CUDA graph and replayed.

The contract with the simulator (``casgd(...)`` with the same seed on the same data; its
default sampler, "philox", is this path's): the same rows; the inner recurrence
bit-identical for the same r and G; r, G and the gradient are reductions in cuBLAS's order,
so iterates agree within the local error bound.
Under ``NUMBA_ENABLE_CUDASIM=1`` the driver runs on CPU torch tensors (``device="cpu"``), the
kernels in numba's simulator: the path CI runs end to end.
"""

from __future__ import annotations

import contextlib
import time

import numpy as np

from ..formats import parse_format
from ..quantize import quantize
from .inner import inner_args, jitted_recipe
from .losses import LOSSES, get_loss
from .recipes import Recipe, as_recipe
from .sampling import SAMPLE_STREAM
from .common import (Result, check_block_size, check_data, check_eta, check_int,
                     check_sample_weight, check_seed, check_sparse, check_x0, diverged,
                     is_sparse, record_points, report)
from ..philox import split_key

_TORCH = {"fp64": "float64", "fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
#: GEMM input formats the native path runs (tf32: fp32 tensors with TF32 tensor cores)
_GEMM_INPUTS = ("fp32", "tf32", "bf16", "fp16", "fp64")


def _name(fmt) -> str | None:
    return parse_format(fmt).preset_name


def native_recipe(recipe: Recipe) -> str | None:
    """None when the native path runs ``recipe``, else the reason (naming the slot)."""
    why = jitted_recipe(recipe)
    if why:
        return why
    for name, slot in recipe.slots().items():
        if slot.rounding != "nearest":
            return f"{name}={slot!r} rounds {slot.rounding!r} (the native path rounds to nearest)"
    for name in ("u_G", "u_r", "u_g"):
        slot = getattr(recipe, name)
        if _name(slot.fmt) not in _GEMM_INPUTS or _name(slot.acc_fmt) not in ("fp32", "fp64"):
            return (f"{name}={slot!r}: cuBLAS runs fp32/tf32/bf16/fp16 inputs with an fp32 "
                    "(or fp64) accumulator")
    return None


def _torch():
    import torch
    return torch


def _dtype(fmt):
    """The torch dtype holding ``fmt``'s values: its own, else its float container."""
    torch = _torch()
    name = _name(fmt)
    if name in _TORCH:
        return getattr(torch, _TORCH[name])
    return torch.float32 if parse_format(fmt).fits(np.float32)[0] else torch.float64


def round_to(t, fmt):
    """Tensor ``t`` rounded to nearest in ``fmt``, held in :func:`_dtype` (a cast for torch's
    own formats, lpsim's rounding core otherwise)."""
    torch = _torch()
    fmt = parse_format(fmt)
    dtype = _dtype(fmt)
    if _name(fmt) in _TORCH and not (t.dtype == torch.float64 and dtype.itemsize < 4):
        return t.to(dtype)              # one IEEE round to nearest even
    # torch takes float64 -> bf16/fp16 through float32 (two roundings): round here first
    if t.dtype not in (torch.float32, torch.float64):
        t = t.to(torch.float32)          # bf16/fp16 values: exact
    if t.dtype == torch.float32 and not fmt.fits(np.float32)[0]:
        t = t.to(torch.float64)
    t = t.contiguous()                   # rounded once, in its own container, then cast
    if t.is_cuda:
        import lpsim_cuda
        out = lpsim_cuda.quantize(t, fmt)
    else:
        out = quantize(t, fmt)
    return out.to(dtype)


@contextlib.contextmanager
def _tf32(allowed: bool):
    """TF32 tensor cores on only where a slot asks for them (no silent TF32)."""
    torch = _torch()
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = allowed
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def slot_mm(a, b, slot, beta_c=None, alpha: float = 1.0):
    """fl_out(a @ b) at a GEMM slot: inputs in the slot's format, fp32 (fp64) accumulation
    and output; with ``beta_c``, the fused beta_c + alpha (a @ b) of cuBLAS's epilogue."""
    torch = _torch()
    from ..tensors import autocast_off
    in_name = _name(slot.fmt)
    acc = torch.float64 if _name(slot.acc_fmt) == "fp64" else torch.float32
    if in_name == "tf32" and not a.is_cuda:          # no TF32 units: round the inputs
        a, b = round_to(a, "tf32"), round_to(b, "tf32")
    with _tf32(in_name == "tf32"), autocast_off(a.device.type):   # the slot's arithmetic
        res = None
        if a.dtype in (torch.bfloat16, torch.float16) and a.is_cuda and acc == torch.float32:
            res = _mixed_mm(a, b, beta_c, alpha)
        if res is None:                               # exact products, fp32/fp64 sums
            a, b = a.to(acc), b.to(acc)
            res = torch.mm(a, b) if beta_c is None else torch.addmm(beta_c, a, b, alpha=alpha)
    return res if _name(slot.out_fmt) == _name(slot.acc_fmt) else round_to(res, slot.out_fmt)


#: whether this torch runs 16-bit-input GEMMs with fp32 output (mm/addmm ``out_dtype``);
#: learnt on first use, so a torch without it takes the fp32-input path instead
_OUT_DTYPE = {"mm": None, "addmm": None}


def _mixed_mm(a, b, beta_c, alpha):
    """a @ b (or beta_c + alpha a @ b) from bf16/fp16 inputs with fp32 accumulation and
    output on cuBLAS, or None where torch lacks ``out_dtype``."""
    torch = _torch()
    op = "mm" if beta_c is None else "addmm"
    if _OUT_DTYPE[op] is False:
        return None
    try:
        res = torch.mm(a, b, out_dtype=torch.float32) if beta_c is None else \
            torch.addmm(beta_c, a, b, alpha=alpha, out_dtype=torch.float32)
    except (RuntimeError, TypeError, NotImplementedError):
        if _OUT_DTYPE[op]:
            raise
        _OUT_DTYPE[op] = False
        return None
    _OUT_DTYPE[op] = True
    return res


class DeviceData:
    """A (dense or CSR) and y resident on ``device``: A in u_A's storage, y in float64."""

    def __init__(self, A, y, recipe: Recipe, device):
        torch = _torch()
        self.device = torch.device(device)
        self.m, self.n = A.shape
        store = _dtype(recipe.u_A.fmt)
        self.sparse = is_sparse(A)
        if self.sparse:
            csr = A.tocsr()
            self.crow = torch.as_tensor(csr.indptr.astype(np.int64), device=self.device)
            self.col = torch.as_tensor(csr.indices.astype(np.int64), device=self.device)
            vals = torch.as_tensor(np.asarray(csr.data, np.float64))
            self.val = round_to(vals, recipe.u_A.fmt).to(store).to(self.device)
        else:
            dense = torch.as_tensor(np.ascontiguousarray(A, np.float64))
            self.A = round_to(dense, recipe.u_A.fmt).to(store).to(self.device).contiguous()
        self.store = store
        self.y = torch.as_tensor(np.asarray(y, np.float64), device=self.device)

    @classmethod
    def resident(cls, A, y):
        """Data already on the device: A a dense tensor in u_A's storage dtype (its values in
        the format), y a float64 tensor; nothing is copied (benchmarks build synth there)."""
        self = cls.__new__(cls)
        self.device, (self.m, self.n), self.store = A.device, tuple(A.shape), A.dtype
        self.sparse, self.A, self.y = False, A.contiguous(), y
        return self

    def gather(self, idx, out):
        """out[i] = row idx[i] of A (dense rows in the storage dtype)."""
        if not self.sparse:
            return _torch().index_select(self.A, 0, idx, out=out)
        from lpsim_cuda.casgd import gather_csr
        out.zero_()
        gather_csr(self.crow, self.col, self.val, idx, out)
        return out


def objective(loss, A, y, x, weights=None) -> float:
    """F(x) in float64 for dense or sparse A (weighted with ``weights``)."""
    return loss.objective(A, y, x, weights=weights)


class NativeRun:
    """The buffers and steps of one native run; ``step()`` is one outer iteration."""

    def __init__(self, data: DeviceData, loss, recipe: Recipe, eta: float, b: int, s: int,
                 seed: int, x0, reduce=None, sample_weight=None):
        torch = _torch()
        dev = data.device
        self.data, self.loss, self.recipe, self.b, self.s = data, loss, recipe, b, s
        self.alpha = eta / b
        self.alpha_c, self.code, self.pc, self.ps = inner_args(recipe, loss.name, self.alpha)
        self.seed_lo, self.seed_hi = split_key(seed, "seed")
        sb = s * b
        self.reduce = reduce
        self.counter = torch.zeros(1, dtype=torch.int64, device=dev)   # draws so far
        self.idx = torch.empty(sb, dtype=torch.int64, device=dev)
        self.Y = torch.empty((sb, data.n), dtype=data.store, device=dev)
        self.delta = torch.empty(sb, dtype=torch.float64, device=dev)
        self.delta_c = torch.empty(sb, dtype=torch.float64, device=dev)
        self.G_empty = torch.zeros((1, 1), dtype=torch.float32, device=dev)
        ux = _dtype(recipe.u_x.fmt)
        self.x = round_to(torch.as_tensor(np.asarray(x0, np.float64)), recipe.u_x.fmt) \
            .to(ux).to(dev).reshape(-1, 1).contiguous()
        self.fused = ux == torch.float32 and _name(recipe.u_g.out_fmt) == "fp32"
        self.graph = None
        # weighted rows: the inversion of lpsim.casgd.sampling.WeightedIndices, on the device
        self.span, self.cum = data.m, None
        if sample_weight is not None:
            from .sampling import WeightedIndices
            rows = WeightedIndices(sample_weight, lambda k: None)
            self.span, self.scale, self.last = rows.span, rows.scale, rows.last
            self.cum = torch.as_tensor(rows.cum, device=dev)

    # the two halves around the grouped AllReduce
    def pre(self):
        """Sample, gather, margins and Gram: the local [r; G] at their collective formats."""
        from lpsim_cuda.casgd import sample_rows
        rc = self.recipe
        sample_rows(self.idx, self.counter, self.span, self.seed_lo, self.seed_hi,
                    SAMPLE_STREAM)
        if self.cum is not None:
            t = self.idx.to(_torch().float64)
            t = t if self.scale is None else t * self.scale
            _torch().searchsorted(self.cum, t, right=True, out=self.idx)
            self.idx.clamp_(max=self.last)
        self.counter.add_(self.s * self.b)
        Y = self.data.gather(self.idx, self.Y)
        Yr = round_to(Y, rc.u_r.fmt)
        r = slot_mm(Yr, round_to(self.x, rc.u_r.fmt), rc.u_r).reshape(-1)
        r = round_to(r, rc.u_AR_r.fmt)
        if self.s > 1:
            YG = round_to(Y, rc.u_G.fmt)
            G = round_to(slot_mm(YG, YG.T, rc.u_G), rc.u_AR_G.fmt)
        else:
            G = None
        return r, G

    def post(self, r, G):
        """The inner recurrence and the fused gradient GEMM + update."""
        from lpsim_cuda.casgd import inner_recurrence
        torch = _torch()
        rc = self.recipe
        yI = self.data.y.index_select(0, self.idx)
        Gk = self.G_empty if G is None else G.contiguous()
        wide = (torch.float32, torch.float64)
        r = r if r.dtype in wide else r.float()        # bf16/fp16 values, exactly
        Gk = Gk if Gk.dtype in wide else Gk.float()
        inner_recurrence(r.contiguous(), Gk.contiguous(), yI, self.delta, self.delta_c, self.b,
                         self.s, self.alpha_c, self.code, self.pc, self.ps)
        d = round_to(self.delta, rc.u_g.fmt).reshape(-1, 1)
        Yg = round_to(self.Y, rc.u_g.fmt)
        if self.fused:
            new = slot_mm(Yg.T, d, rc.u_g, beta_c=self.x, alpha=float(np.float32(self.alpha)))
        else:
            g = slot_mm(Yg.T, d, rc.u_g).to(self.x.dtype)
            # a Python scalar: torch multiplies in x's dtype, as the simulator does
            new = round_to(self.x + g * self.alpha, rc.u_x.fmt)
        self.x.copy_(new)

    def eager_step(self):
        r, G = self.pre()
        if self.reduce is not None:
            r, G = self.reduce(r, G, self.recipe)
        self.post(r, G)

    def step(self, graphs: bool = False):
        """One outer iteration; with ``graphs`` its halves replay as CUDA graphs (captured on
        first use: that iteration runs eagerly, then the capture records the next ones)."""
        if not graphs:
            return self.eager_step()
        if self.graph is None:
            self.graph = self.capture()
            return None
        pre, post, r_s, G_s, r_in, G_in = self.graph
        if self.reduce is None:
            return pre.replay()          # one graph: nothing runs between the halves
        pre.replay()
        r, G = self.reduce(r_s, G_s, self.recipe)
        r_in.copy_(r)
        if G_in is not None:
            G_in.copy_(G)
        post.replay()

    def capture(self):
        """The outer iteration as CUDA graphs after one eager iteration (which compiles the
        kernels and warms the allocator): one graph for a single process, else the pre- and
        post-collective halves, with the grouped AllReduce between them."""
        torch = _torch()
        self.eager_step()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            pre = torch.cuda.CUDAGraph()
            if self.reduce is None:
                with torch.cuda.graph(pre, stream=stream):
                    self.post(*self.pre())
                graphs = (pre, None, None, None, None, None)
            else:
                with torch.cuda.graph(pre, stream=stream):
                    r_s, G_s = self.pre()
                r_in = torch.empty_like(r_s)
                G_in = None if G_s is None else torch.empty_like(G_s)
                post = torch.cuda.CUDAGraph()
                with torch.cuda.graph(post, stream=stream):
                    self.post(r_in, G_in)
                graphs = (pre, post, r_s, G_s, r_in, G_in)
        torch.cuda.current_stream().wait_stream(stream)
        return graphs

    def weights(self) -> np.ndarray:
        return self.x.reshape(-1).to("cpu", _torch().float64).numpy()


class NativeAllReduce:
    """The grouped AllReduce of [r; G] on device tensors: one all_reduce per datatype bucket
    of {u_AR_r, u_AR_G} (one call when they share a dtype, as in Recipes A and D), in the
    recipe's torch dtypes (NCCL on GPUs, gloo on CPU tensors); counts its calls."""

    def __init__(self, group=None):
        self.group, self.calls, self.outer = group, 0, 0

    def __call__(self, r, G, recipe: Recipe):
        import torch.distributed as dist
        torch = _torch()
        self.outer += 1
        items = [("r", r, recipe.u_AR_r)] + ([("G", G, recipe.u_AR_G)] if G is not None else [])
        buckets: dict = {}
        for name, part, slot in items:
            buckets.setdefault(_dtype(slot.out_fmt), []).append((name, part, slot))
        out = {}
        for dtype, members in buckets.items():
            flat = torch.cat([part.reshape(-1).to(dtype) for _, part, _ in members])
            dist.all_reduce(flat, group=self.group)
            self.calls += 1
            start = 0
            for name, part, slot in members:
                piece = flat[start:start + part.numel()].reshape(part.shape)
                out[name] = piece if _name(slot.out_fmt) in _TORCH else \
                    round_to(piece, slot.out_fmt)
                start += part.numel()
        return out["r"], out.get("G")


def casgd_native(A, y, *, loss="logistic", eta=0.5, b=32, s=16, H=100, recipe="C", seed=0,
                 x0=None, record=None, progress=False, device="cuda", graphs=False,
                 reduce=None, sample_weight=None, verbose=0) -> Result:
    """:func:`lpsim.casgd.casgd` on the GPU (see the module docstring); same result type.

    A: dense array or scipy.sparse matrix; device: a torch CUDA device ("cpu" only under
    NUMBA_ENABLE_CUDASIM=1).  The simulator, ``casgd(...)`` with the same seed, draws the
    same rows (its default sampler, "philox").  reduce: a :class:`NativeAllReduce` when A holds this
    rank's block columns of a torch.distributed run (every rank draws the same rows).
    sample_weight, verbose: as in :func:`lpsim.casgd.casgd` (the weighted rows are the
    simulator's rows with the same weights).
    """
    from tqdm.auto import tqdm
    from numba import config
    torch = _torch()
    loss, recipe = get_loss(loss), as_recipe(recipe)
    b, s, H, eta = check_int("b", b), check_int("s", s), check_int("H", H, 0), check_eta(eta)
    seed = check_seed(seed)
    if LOSSES.get(loss.name) is not loss:
        raise ValueError(f"loss={loss!r}: the native path runs the built-in losses "
                         f"{', '.join(LOSSES)}")
    why = native_recipe(recipe)
    if why:
        raise ValueError(f"backend='cuda' cannot run recipe {recipe.name!r}: {why}; accepted: "
                         "recipes A-D, G and others with nearest slots of those formats (or "
                         "backend='cpu', the simulator, for any recipe)")
    device = torch.device(device)
    if device.type != "cuda" and not config.ENABLE_CUDASIM:
        raise ValueError(f"device={str(device)!r}: backend='cuda' needs a CUDA device (a CPU "
                         "device runs only under NUMBA_ENABLE_CUDASIM=1, the kernel simulator)")
    if device.type == "cuda" and config.ENABLE_CUDASIM:
        raise ValueError("device='cuda' with NUMBA_ENABLE_CUDASIM=1: the simulated kernels "
                         "take CPU tensors; accepted: device='cpu' under the simulator")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={str(device)!r}: torch sees no CUDA device here (a CPU-only "
                         "torch, or no GPU); accepted: a machine with one, or backend='cpu'")
    if graphs and device.type != "cuda":
        raise ValueError("graphs=True needs a CUDA device (CUDA graphs)")
    if graphs and reduce is not None and not isinstance(reduce, NativeAllReduce):
        raise ValueError("graphs=True with a custom reduce: accepted: a NativeAllReduce")
    A, y = check_sparse(A, y, loss) if is_sparse(A) else check_data(A, y, loss)
    weights = check_sample_weight(sample_weight, A.shape[0])
    check_block_size(b, s, A.shape[1], recipe)
    x0 = check_x0(x0, A.shape[1])
    record = record_points(record, H)
    run = NativeRun(DeviceData(A, y, recipe, device), loss, recipe, eta, b, s, seed, x0, reduce,
                    weights)
    result = Result(run.weights())
    start = time.perf_counter()

    def note(h):
        if record and h == record[0]:
            record.pop(0)
            x = run.weights()
            with np.errstate(over="ignore", invalid="ignore"):
                result.loss_curve.append(objective(loss, A, y, x, weights))
            result.recorded_at.append(h)
            if verbose:
                report(h, H, result.loss_curve[-1], x, start)

    note(0)
    for h in tqdm(range(1, H + 1), disable=not progress, desc=f"{loss.name} {recipe.name} gpu",
                  leave=False):
        run.step(graphs)
        if record and h == record[0] or h == H:
            x = run.weights()
            if not np.isfinite(x).all():
                raise diverged(eta, h, H)
        note(h)
    result.x = run.weights()
    result.iterations = H
    return result
