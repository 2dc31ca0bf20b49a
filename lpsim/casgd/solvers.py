"""Mini-batch SGD and CA-SGD for GLMs with the nine precision slots (Algorithm 1)."""

from __future__ import annotations

import time

import numpy as np
from tqdm.auto import tqdm

# the checks and Result the native driver shares, re-exported where users import them
from .common import (DivergedError, Result, check_block_size, check_data,  # noqa: F401
                     check_eta, check_finite, check_flags, check_int, check_sample_weight,
                     check_seed, check_sparse, check_x0, diverged, is_sparse,
                     physical_memory, real_array, record_points, report)
from .inner import (DOT_LANES, LOSS_CODES, inner_args, inner_recurrence_cpu, jitted_recipe,
                    residuals)
from .losses import LOSSES, Loss, get_loss
from ..ops import add, fma, mul
from ..quantize import quantize
from ..rounding import STOCHASTIC_MODES
from .recipes import Recipe, Rounder, _slot_matmul, as_recipe, container


class SampledRows:
    """Rows of A stored at u_A, handed out as dense blocks: ``rows(idx)`` is ``At[idx]``.

    Dense A is rounded to u_A once.  Sparse A is never densified: its stored values are
    rounded once (round to nearest acts elementwise), and only each sampled block of s*b rows
    is densified.  A stochastic u_A rounds each densified row i with counter offset i*n, so
    every entry gets the random word it gets in the dense run: the same bits either way.
    """

    def __init__(self, A, slot, rnd: Rounder):
        self.sparse, self.slot, self.rnd = is_sparse(A), slot, rnd
        if not self.sparse:
            self.At = rnd.slot(A, slot)
        elif slot.rounding in STOCHASTIC_MODES:
            self.At, self.stream = A, rnd.next_stream()    # the stream the dense run takes
        else:                                            # new values, the same structure
            self.At = type(A)((rnd.slot(A.data, slot), A.indices, A.indptr), shape=A.shape)

    def __call__(self, idx) -> np.ndarray:
        if not self.sparse:
            return self.At[idx]
        block = self.At[idx].toarray()
        if self.slot.rounding not in STOCHASTIC_MODES:
            return block
        fmt, n = self.slot.out_fmt, self.At.shape[1]
        if not fmt.fits(block.dtype)[0]:
            block = block.astype(np.float64)
        out = np.empty(block.shape, container(fmt))
        for i, row in enumerate(idx):          # Rounder's stochastic branch, row by row
            out[i] = quantize(block[i], fmt, self.slot.rounding, seed=self.rnd.seed,
                              stream=self.stream, offset=int(row) * n)
        return out


def block_columns(n: int, P: int) -> list[slice]:
    """1D block-column partition of n features over P ranks (Section 4.2): n_loc ~ n/P."""
    P = check_int("P", P)
    if P > n:
        raise ValueError(f"P={P} ranks for n={n} features; accepted: 1 <= P <= n (every rank "
                         "needs at least one column)")
    edges = [p * n // P for p in range(P + 1)]
    return [slice(edges[p], edges[p + 1]) for p in range(P)]


# --- sampling ---------------------------------------------------------------------------
class IndexStream:
    """i.i.d. uniform row indices with replacement, drawn in fixed chunks of numpy's
    ``default_rng(seed)``: ``sampler="numpy"``, the sampler before Philox became the default
    (kept to replay runs made with it).

    SGD takes b indices per step and CA-SGD s*b per outer iteration from the same stream, so
    the same seed gives both methods the same samples (Algorithm 1, line 1).
    """

    CHUNK = 1 << 14

    def __init__(self, m: int, seed: int = 0):
        self.m, self.rng, self.buf = m, np.random.default_rng(seed), np.empty(0, np.int64)

    def take(self, k: int) -> np.ndarray:
        while self.buf.size < k:
            self.buf = np.concatenate([self.buf, self.rng.integers(0, self.m, self.CHUNK)])
        out, self.buf = self.buf[:k], self.buf[k:]
        return out


# --- one outer iteration ----------------------------------------------------------------
def simulated_allreduce(parts, slot, rnd: Rounder) -> np.ndarray:
    """Sum of rank-local parts at a collective slot: each cast, then added in rank order.

    The in-process model of the grouped AllReduce (Assumption 5.4): every partial sum is
    rounded to the slot's format; a slot that does not round to nearest rounds the exact
    sum once in its mode.
    """
    total = rnd.slot(parts[0], slot)
    for part in parts[1:]:
        if slot.rounding == "nearest":
            total = rnd.slot(total + rnd.slot(part, slot), slot)
        else:
            total = rnd.exact(add, (total, rnd.slot(part, slot)), slot)
    return total


def _simulated_reduce(r_parts, G_parts, recipe, rnd):
    G = simulated_allreduce(G_parts, recipe.u_AR_G, rnd) if G_parts else None
    return simulated_allreduce(r_parts, recipe.u_AR_r, rnd), G


def outer_iteration(Y, yI, x, blocks, recipe: Recipe, alpha: float, b: int, s: int,
                    loss: Loss, rnd: Rounder, reduce=_simulated_reduce):
    """One CA-SGD outer iteration on stored rows ``Y`` (at u_A); updates x in place.

    Algorithm 1, lines 2-12: margin r = Yx and Gram G = YY^T per column block, one grouped
    AllReduce, the s-step correction z_j = r_j + alpha G_{j,<j} delta_{<j} with every
    operation (products, sums, scaling, AXPY) rounded to the unit roundoff u_c, residuals
    at u_sigma, outer gradient g = Y^T delta at u_g, x += alpha g at u_x (alpha in x's
    container; a u_x that does not round to nearest rounds the exact x + alpha g once in its
    mode, as the AllReduce slots round their exact sums).  ``blocks`` are the
    column slices held here; ``reduce(r_parts, G_parts, recipe, rnd)`` sums them over ranks.
    Returns the residual history delta.  s = 1 is one mini-batch SGD step (no Gram).
    Lines 5-13 run the jitted steps of :mod:`lpsim.casgd.inner` (shared with the GPU kernels)
    when u_c and u_sigma round to nearest in formats they model exactly; else the same steps
    in numpy (:func:`_numpy_inner`), each operation rounded in its slot's mode.
    """
    parts = [np.ascontiguousarray(Y[:, c]) for c in blocks]
    r_parts = [_slot_matmul(Yc, x[c], recipe.u_r, rnd) for Yc, c in zip(parts, blocks)]
    G_parts = [_slot_matmul(Yc, Yc.T, recipe.u_G, rnd) for Yc in parts] if s > 1 else []
    r, G = reduce(r_parts, G_parts, recipe, rnd)
    if jitted_recipe(recipe) is None and LOSSES.get(loss.name) is loss:
        delta = _jitted_inner(r, G, yI, recipe, alpha, b, s, loss)
    else:
        delta = _numpy_inner(r, G, yI, recipe, alpha, b, s, loss, rnd)
    ux = recipe.u_x
    a = ux.dtype.type(alpha)
    for Yc, c in zip(parts, blocks):
        g = _slot_matmul(Yc.T, delta, recipe.u_g, rnd).astype(ux.dtype)
        if ux.rounding == "nearest":
            x[c] = rnd.slot(x[c] + a * g, ux)
        else:        # the exact x + a g (a g is exact in float64) rounded once in ux's mode
            x[c] = rnd.exact(fma, (np.float64(a), g, x[c]), ux)
    return delta


def _jitted_inner(r, G, yI, recipe: Recipe, alpha: float, b: int, s: int, loss: Loss):
    """Lines 5-13 through the shared jitted steps (:mod:`.inner`): the same bits as the GPU."""
    alpha_c, code, pc, ps = inner_args(recipe, loss.name, alpha)
    delta, delta_c = np.empty(s * b), np.empty(s * b)
    G = np.zeros((1, 1), np.float32) if G is None else np.ascontiguousarray(G)
    inner_recurrence_cpu(np.ascontiguousarray(r), G, np.ascontiguousarray(yI, np.float64), delta,
                         delta_c, b, s, alpha_c, code, pc, ps)
    return delta.astype(recipe.u_sigma.dtype)


def _numpy_inner(r, G, yI, recipe: Recipe, alpha: float, b: int, s: int, loss: Loss,
                 rnd: Rounder):
    """Lines 5-13 with numpy and lpsim.ops: any slot rounding or format, any loss.

    The steps of :mod:`.inner` in the same order, each product and sum the exact result
    rounded once in u_c's mode; alpha, r, G and delta are stored at u_c rounded to nearest,
    and the residual is evaluated in float64 and rounded once to u_sigma.  Round-to-nearest
    slots and the built-in losses give the jitted steps' bits.
    """
    uc, us, f64 = recipe.u_c, recipe.u_sigma, np.float64
    alpha_c = f64(quantize(f64(alpha), uc.fmt))
    r_c = quantize(np.asarray(r, f64), uc.fmt)
    G_c = None if G is None else quantize(np.asarray(G, f64), uc.fmt)
    y = np.asarray(yI, f64)
    code = LOSS_CODES[loss.name] if LOSSES.get(loss.name) is loss else None
    delta, delta_c = np.empty(s * b, us.dtype), np.empty(s * b)
    for j in range(s):
        rows = slice(j * b, (j + 1) * b)
        z = r_c[rows]
        if j:
            corr = _lane_dot(G_c[rows, :j * b], delta_c[:j * b], uc, rnd)
            z = rnd.exact(add, (z, rnd.exact(mul, (alpha_c, corr), uc, f64)), uc, f64)
        d = residuals(code, z, y[rows]) if code is not None else loss.residual(z, y[rows])
        delta[rows] = rnd.slot(np.asarray(d, f64), us)
        delta_c[rows] = quantize(delta[rows].astype(f64), uc.fmt)
    return delta


def _lane_dot(G, d, uc, rnd: Rounder) -> np.ndarray:
    """G @ d in the jitted steps' order (:mod:`.inner`): DOT_LANES lane sums, then a
    pairwise tree; every product and sum rounded once at u_c."""
    lanes = np.zeros((G.shape[0], DOT_LANES))
    for t in range(0, G.shape[1], DOT_LANES):
        w = min(DOT_LANES, G.shape[1] - t)
        prod = rnd.exact(mul, (G[:, t:t + w], d[t:t + w]), uc, np.float64)
        lanes[:, :w] = rnd.exact(add, (lanes[:, :w], prod), uc, np.float64)
    width = DOT_LANES // 2
    while width:
        lanes[:, :width] = rnd.exact(add, (lanes[:, :width], lanes[:, width:2 * width]), uc,
                                     np.float64)
        width //= 2
    return lanes[:, 0]


def casgd_step(Y, yI, x, eta: float, b: int, s: int, recipe="A", *, P: int = 1,
               loss="logistic", seed: int = 0):
    """One outer iteration (Algorithm 1) from weights x on the sampled rows Y: x^(s).

    Y (s*b x n, dense or scipy.sparse) and x are rounded to u_A and u_x first; P ranks are
    simulated in process.
    """
    recipe, loss = as_recipe(recipe), get_loss(loss)
    b, s, eta = check_int("b", b), check_int("s", s), check_eta(eta)
    seed = check_seed(seed)
    if is_sparse(Y):                  # s*b sampled rows: densified (a block, never all of A)
        Y, yI = check_sparse(Y, yI, loss)
        Y = Y.toarray()
    Y, yI = check_data(Y, yI, loss)
    if Y.shape[0] != s * b:
        raise ValueError(f"Y has {Y.shape[0]} rows; accepted: s*b = {s * b}")
    x = real_array("x", x).astype(np.float64)
    if x.shape != (Y.shape[1],):
        raise ValueError(f"x has shape {x.shape}; accepted: ({Y.shape[1]},), one weight per "
                         "column of Y")
    check_finite("x", x, "finite weights")
    rnd = Rounder(seed)
    Yt = rnd.slot(Y, recipe.u_A)
    xt = rnd.slot(x, recipe.u_x).copy()
    outer_iteration(Yt, yI, xt, block_columns(Y.shape[1], P), recipe, eta / b, b, s, loss, rnd)
    return xt


# --- drivers ----------------------------------------------------------------------------
#: the row samplers by name; None is the default, "philox" (the rows the GPU path draws)
SAMPLERS = ("philox", "numpy")


def check_sampler(sampler) -> str:
    """``sampler`` as a name of :data:`SAMPLERS` (None: "philox"), or a ValueError naming it."""
    if sampler is None:
        return "philox"
    if not isinstance(sampler, str) or sampler not in SAMPLERS:
        raise ValueError(f"sampler={sampler!r} is not accepted; accepted: 'philox' (the "
                         "default, the rows backend='cuda' draws) or 'numpy' (numpy's "
                         "default_rng, the sampler of runs made before Philox was the default)")
    return sampler


def index_stream(sampler, m: int, seed: int, sample_weight=None):
    """The row sampler named ``sampler``: "philox" or None (the default:
    :class:`lpsim.casgd.sampling.PhiloxIndices`, the rows the GPU path draws, so one seed
    is one run on either backend) or "numpy" (:class:`IndexStream`); with
    ``sample_weight``, rows drawn with probability w_i / sum(w) through that sampler
    (:class:`lpsim.casgd.sampling.WeightedIndices`)."""
    sampler = check_sampler(sampler)

    def uniform(k):
        if sampler == "philox":
            from .sampling import PhiloxIndices
            return PhiloxIndices(k, seed)
        return IndexStream(k, seed)

    if sample_weight is None:
        return uniform(m)
    from .sampling import WeightedIndices
    return WeightedIndices(sample_weight, uniform)


def _run(A, y, loss, eta, b, s, H, recipe, P, seed, x0, record, progress,
         reduce=_simulated_reduce, sampler=None, sample_weight=None, verbose=0):
    loss, recipe = get_loss(loss), as_recipe(recipe)
    b, s, H, eta = check_int("b", b), check_int("s", s), check_int("H", H, 0), check_eta(eta)
    seed = check_seed(seed)
    A, y = check_sparse(A, y, loss) if is_sparse(A) else check_data(A, y, loss)
    weights = check_sample_weight(sample_weight, A.shape[0])
    blocks = block_columns(A.shape[1], P)
    check_block_size(b, s, A.shape[1], recipe)
    rnd = Rounder(seed)
    rows = SampledRows(A, recipe.u_A, rnd)
    x = rnd.slot(check_x0(x0, A.shape[1]), recipe.u_x).copy()
    record = record_points(record, H)
    result = Result(x)
    stream = index_stream(sampler, A.shape[0], seed, weights)
    start = time.perf_counter()

    def note(h):
        if record and h == record[0]:
            record.pop(0)
            with np.errstate(over="ignore", invalid="ignore"):
                result.loss_curve.append(loss.objective(A, y, x, weights=weights))
            result.recorded_at.append(h)
            if verbose:
                report(h, H, result.loss_curve[-1], x, start)

    note(0)
    for h in tqdm(range(1, H + 1), disable=not progress, desc=f"{loss.name} {recipe.name}",
                  leave=False):
        idx = stream.take(s * b)
        with np.errstate(over="ignore", invalid="ignore"):
            outer_iteration(rows(idx), y[idx], x, blocks, recipe, eta / b, b, s, loss, rnd,
                            reduce)
        if not np.isfinite(x).all():
            raise diverged(eta, h, H)
        note(h)
    result.iterations = H
    return result


def casgd(A, y, *, loss="logistic", eta: float = 0.5, b: int = 32, s: int = 16, H: int = 100,
          recipe="A", P: int = 1, seed: int = 0, x0=None, record=None, progress=False,
          reduce=None, sampler=None, backend="cpu", device=None, graphs=False,
          sample_weight=None, verbose=0) -> Result:
    """CA-SGD: H outer iterations of Algorithm 1, each on s*b rows sampled with replacement.

    A: a dense array, or a scipy.sparse matrix in any format (converted to CSR once and never
    densified; each outer iteration densifies only its s*b sampled rows): the same bits as
    the same matrix dense.  sample_weight: non-negative weights w_i; rows are then sampled
    with probability w_i / W (W = sum w), so the updates are unbiased for the weighted loss
    W^-1 sum_i w_i L_i, the objective recorded, and the recurrence itself is unchanged.
    Integer weights draw an integer uniform in [0, W) from the sampler, which makes weight k
    the same run as k consecutive copies of the row when u_A rounds deterministically (a
    stochastic u_A rounds each stored row with bits of its own index, so copies differ);
    all-ones weights give the unweighted run.
    verbose: print F(x) at every recorded iteration (``record``) on stdout.

    recipe: a :class:`Recipe`, "A".."I" (Table 3) or "fp64"; P ranks are simulated in
    process (block columns, AllReduce model of Assumption 5.4).  record: outer iterations
    after which F(x) is evaluated (an int k means every k).  reduce: the grouped AllReduce,
    ``reduce(r_parts, G_parts, recipe, rounder) -> (r, G)`` (default: each part cast to its
    collective slot, summed in rank order).  Equals H*s SGD steps in exact arithmetic
    (Section 2.2).  Raises :class:`DivergedError` (a ValueError naming eta) when x stops
    being finite.

    sampler: "philox" (the default, None) draws row t as a pure function of (seed, t), the
    rows the GPU path draws, so ``casgd(A, y, seed=3)`` and ``casgd(A, y, seed=3,
    backend="cuda")`` sample the same rows; "numpy" replays the numpy ``default_rng(seed)``
    rows of runs made before Philox became the default (CPU only).
    backend="cuda" runs :func:`lpsim.casgd.native.casgd_native` on torch ``device`` (default
    "cuda"; ``graphs=True`` replays each outer iteration as a CUDA graph); the default
    ``backend="cpu"`` is its simulator.
    """
    check_flags(progress, verbose, graphs)
    if backend == "cuda":
        return _native(A, y, loss, eta, b, s, H, recipe, P, seed, x0, record, progress, reduce,
                       sampler, device, graphs, sample_weight, verbose)
    _check_backend(backend, device, graphs)
    return _run(A, y, loss, eta, b, s, H, recipe, P, seed, x0, record, progress,
                reduce or _simulated_reduce, sampler, sample_weight, verbose)


def _check_backend(backend, device, graphs):
    if backend != "cpu":
        raise ValueError(f"backend={backend!r} is not accepted; accepted: 'cpu' (the "
                         "simulator) or 'cuda' (lpsim.casgd.native)")
    if device is not None or graphs:
        raise ValueError(f"device={device!r}, graphs={graphs!r} apply to backend='cuda' only")


def _native(A, y, loss, eta, b, s, H, recipe, P, seed, x0, record, progress, reduce, sampler,
            device, graphs, sample_weight=None, verbose=0):
    from .native import casgd_native
    if check_int("P", P) != 1 or reduce is not None:
        raise ValueError(f"P={P}, reduce={reduce!r}: backend='cuda' runs one process; for "
                         "several GPUs launch lpsim.casgd.native under torchrun")
    if check_sampler(sampler) != "philox":
        raise ValueError(f"sampler={sampler!r}: backend='cuda' draws its rows on the device; "
                         "accepted: 'philox' (or None, the default)")
    return casgd_native(A, y, loss=loss, eta=eta, b=b, s=s, H=H, recipe=recipe, seed=seed,
                        x0=x0, record=record, progress=progress,
                        device="cuda" if device is None else device, graphs=graphs,
                        sample_weight=sample_weight, verbose=verbose)


def sgd(A, y, *, loss="logistic", eta: float = 0.5, b: int = 32, steps: int = 100,
        recipe="A", P: int = 1, seed: int = 0, x0=None, record=None, progress=False,
        sampler=None, backend="cpu", device=None, graphs=False, sample_weight=None,
        verbose=0) -> Result:
    """Mini-batch SGD x += (eta/b) Y_I^T delta(Y_I x, y_I) (Section 2.1), b rows per step.

    Uses the slots u_A, u_r, u_AR_r, u_c, u_sigma, u_g, u_x of ``recipe``; the index stream
    is the one of :func:`casgd` with the same seed and sampler (default "philox", the rows
    of backend="cuda" too).  record counts steps.  backend="cuda" is
    the GPU baseline (data on the device, one CUDA graph per step with graphs=True).  A
    (dense or sparse), sample_weight and verbose: as in :func:`casgd`.
    """
    check_flags(progress, verbose, graphs)
    if backend == "cuda":
        return _native(A, y, loss, eta, b, 1, steps, recipe, P, seed, x0, record, progress,
                       None, sampler, device, graphs, sample_weight, verbose)
    _check_backend(backend, device, graphs)
    return _run(A, y, loss, eta, b, 1, steps, recipe, P, seed, x0, record, progress,
                sampler=sampler, sample_weight=sample_weight, verbose=verbose)
