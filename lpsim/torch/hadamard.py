"""The random Hadamard transform (RHT) of a recipe's wgrad operands, in a defined order.

Each run of n consecutive elements (n a power of two) becomes ``H diag(d) x / sqrt(n)``, H
the n x n Sylvester Hadamard matrix and d random signs.  The arithmetic is fixed, so every
device and library gives the same bits: first each element times its factor
``c_j = d_j * fl(1/sqrt(n))`` (exact for n a power of four, barring subnormals), then the
butterfly: for h = n/2, n/4, ..., 1, within each group of 2h elements each pair (i, i+h)
becomes (a + b, a - b), every operation rounded once in the tensor's dtype.  Each output is
so a sum of n terms in a tree of depth log2(n): its error is at most gamma(log2 n) times the
sum of the terms' magnitudes.  (A matrix product would leave the order to the BLAS of each
machine.)

:func:`rht` runs it with torch operations on any device; :func:`rht_tokens` transforms a 2-D
tensor's columns (a weight gradient's operands, K the tokens) where they lie, on the CPU in
one threaded pass (:func:`_token_runs`); :func:`rht_transposed` gives them as the
transpose's rows, as a GPU's kernels quantize them.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from numba import njit

from ..blocks.hadamard_rows import hadamard_rows
from ..philox import random_words
from ..pool import deal, pieces, threads

#: the Philox stream of a layer's Hadamard signs is RHT_STREAM + the layer's index
RHT_STREAM = 1 << 40
#: an RHT's size (the signs :func:`rht_signs` draws for one step) is below it
RHT_SIZE_LIMIT = 1 << 32


def hadamard(n: int) -> np.ndarray:
    """The n x n Sylvester Hadamard matrix (entries +-1), n a power of two (another n is
    refused: the recursion would give a matrix of the next power of two)."""
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"hadamard: n={n!r} is not accepted; accepted: an integer, a power "
                        "of two >= 1")
    if n < 1 or int(n) & (int(n) - 1):
        raise ValueError(f"hadamard: n={n} is not accepted; accepted: a power of two >= 1")
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


def rht_signs(seed: int, layer: int, step: int, n: int, steps: int | None = None):
    """The random signs (+-1) of a layer's RHT at a step: the top bits of Philox words
    (seed, stream RHT_STREAM + layer, counters step*n .. step*n + n - 1).  ``steps``: the
    signs of that many steps from ``step`` on, one step's a row (one draw)."""
    if steps is not None and (isinstance(steps, (bool, np.bool_))
                              or not isinstance(steps, (int, np.integer)) or steps < 1):
        raise ValueError(f"steps={steps!r} is not accepted; accepted: None (one step) or an "
                         "integer >= 1")
    rows = 1 if steps is None else int(steps)
    n = _checked_index("n", n, 1, RHT_SIZE_LIMIT)
    # the stream and the counters are 64-bit: past them two layers (or steps) would share
    # their signs
    layer = _checked_index("layer", layer, 0, (1 << 64) - RHT_STREAM)
    step = _checked_index("step", step, 0, ((1 << 64) - 1) // n - rows + 1)
    words = random_words(n * rows, 4, seed, RHT_STREAM + layer, step * n)
    signs = np.where(np.array(words, dtype=np.uint64) >> np.uint64(31), -1.0, 1.0)
    return signs if steps is None else signs.reshape(rows, n)


def _checked_index(name: str, value, least: int, limit: int) -> int:
    """``value`` as an int in least .. limit - 1, or an error naming it."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"rht_signs: {name}={value!r} is not accepted; accepted: an integer")
    if not least <= int(value) < limit:
        raise ValueError(f"rht_signs: {name}={value} is not accepted; accepted: {least} <= "
                         f"{name} < {limit}")
    return int(value)


def factors(signs, dtype: torch.dtype, device) -> torch.Tensor:
    """The per-element factors ``c = d * fl(1/sqrt(n))`` in ``dtype`` on ``device`` (d: a
    numpy array or a tensor of +-1, n its length): a sign changes no rounding of the
    scale, so these are exact multiples of it."""
    if isinstance(signs, torch.Tensor) and signs.dtype == dtype == torch.float32 \
            and signs.device.type == "cpu" and torch.device(device).type == "cpu":
        # the same products in numpy (+-1 times a float32 scale is exact either way): a
        # wgrad's call right after torch's operations spent about 50 us in torch's
        return torch.from_numpy(signs.numpy() * np.float32(_scale(len(signs), dtype)))
    return torch.as_tensor(signs, dtype=dtype, device=device) * _scale(len(signs), dtype)


@functools.lru_cache(maxsize=64)
def _scale(n: int, dtype: torch.dtype) -> float:
    """fl(1/sqrt(n)) in ``dtype``, as a float, made once per size and dtype (a torch
    tensor's round trip for each step's factors otherwise)."""
    return float(torch.tensor(1.0 / np.sqrt(n), dtype=dtype))


def _checked_run(n: int, length: int) -> None:
    if n < 1 or n & (n - 1) or length % n:
        raise ValueError(f"an RHT of size {n} is not accepted along an axis of {length}; "
                         "accepted: a power of two that divides it")


def rht(t: torch.Tensor, signs) -> torch.Tensor:
    """``t`` (any device, a float dtype) with each run of n = len(signs) consecutive elements
    along its last axis transformed (the module's order), in t's dtype.  ``signs``: a numpy
    array, or a tensor (on t's device: a GPU's host then waits for no copy)."""
    n = len(signs)
    _checked_float(t)
    if t.ndim == 0:
        raise ValueError("a 0-d tensor is not accepted; accepted: a tensor whose last axis "
                         "holds runs of len(signs) elements")
    _checked_run(n, t.shape[-1])
    v = t.reshape(-1, n) * factors(signs, t.dtype, t.device)
    h = n // 2
    while h >= 1:
        v = v.reshape(-1, n // (2 * h), 2, h)
        a, b = v[:, :, 0], v[:, :, 1]
        v = torch.stack((a + b, a - b), dim=2)
        h //= 2
    return v.reshape(t.shape)


@njit(cache=True, nogil=True)
def _token_runs(x, c, out, r0, r1):
    """out[r*n:(r+1)*n] = the transform along the tokens of x[r*n:(r+1)*n] (n = c.size) for
    runs r0 .. r1-1 (:func:`lpsim.blocks.hadamard_rows.hadamard_rows`: each step a vector
    operation along the features on rows the cache holds; a run of 16 rows of 1024 float32
    features is 64 KB)."""
    features = x.shape[1]
    n = c.size
    xf, of = x.reshape(-1), out.reshape(-1)
    for r in range(r0, r1):
        t0 = r * n * features
        hadamard_rows(xf, t0, features, of, t0, features, c, n, features)


def _keeps_graph(t: torch.Tensor) -> bool:
    """Whether autograd records an operation on ``t``: then the transforms take torch's
    operations, whose graph gives the gradient (the fast passes detach)."""
    return t.requires_grad and torch.is_grad_enabled()


def _checked_2d(t: torch.Tensor) -> None:
    if t.ndim != 2:
        raise ValueError(f"a tensor of shape {tuple(t.shape)} is not accepted; accepted: a "
                         "2-D tensor (tokens, features)")
    _checked_float(t)


def _checked_float(t: torch.Tensor) -> None:
    # an integer tensor's factor fl(1/sqrt(n)) would be 0
    if not t.is_floating_point():
        raise TypeError(f"a tensor of dtype {t.dtype} is not accepted; accepted: a floating "
                        "point tensor (the RHT's factors are fractions)")


def rht_tokens(t: torch.Tensor, signs) -> torch.Tensor:
    """The transform of each column of the 2-D ``t`` (tokens, features): runs of n =
    len(signs) tokens, the same bits as ``rht(t.t().contiguous(), signs).t()``, in t's
    layout, a tensor apart from t.  Why: a weight gradient's K is the tokens, and its
    operands are quantized down their columns as they lie (:mod:`lpsim.blocks.columns`), so
    nothing is transposed.  A float32 CPU tensor takes one threaded pass over runs of
    rows (:func:`_token_runs`: a fifth of the time of a transposing pass); others, and a
    tensor autograd records, torch's operations (a transposed view)."""
    n = len(signs)
    _checked_2d(t)
    if t.device.type != "cpu" or t.dtype != torch.float32 or _keeps_graph(t):
        return rht(t.t(), signs).t()
    _checked_run(n, t.shape[0])
    x = t.detach().contiguous().numpy()
    c = factors(signs, torch.float32, "cpu").numpy()
    # numpy's memory: it asks the kernel for huge pages, so a new 8 MB result faults in 4
    # pages where torch's empty faults in 2048 (a few microseconds each)
    out = np.empty(x.shape, np.float32)
    result = torch.from_numpy(out)
    runs = x.shape[0] // n
    workers = min(threads(), runs)
    deal(lambda r0, r1: _token_runs(x, c, out, r0, r1), pieces(runs, workers), workers)
    return result


def rht_transposed(t: torch.Tensor, signs) -> torch.Tensor:
    """``rht(t.t().contiguous(), signs)`` of a 2-D ``t`` (tokens, features), the same bits: a
    contiguous (features, tokens) tensor, the RHT along the tokens (a GPU's kernels quantize
    rows).  A float32 CPU tensor takes :func:`rht_tokens` and torch's transposing copy; a
    float32 CUDA tensor one pass of lpsim_cuda's kernel (:mod:`lpsim_cuda.hadamard`: the
    transform in registers, where torch's operations make a pass and a launch or more per
    butterfly stage).  A tensor autograd records takes torch's operations."""
    _checked_2d(t)
    if _keeps_graph(t):
        return rht(t.t().contiguous(), signs)
    if t.device.type == "cuda" and t.dtype == torch.float32:   # pragma: no cover (GPU only)
        from lpsim_cuda.hadamard import SIZES, transposed_rht
        if len(signs) in SIZES and t.shape[0] % len(signs) == 0:
            x = t.detach().contiguous()
            out = torch.empty((x.shape[1], x.shape[0]), dtype=torch.float32, device=x.device)
            transposed_rht(x, factors(signs, torch.float32, x.device), out)
            return out
    if t.device.type != "cpu" or t.dtype != torch.float32:
        return rht(t.t().contiguous(), signs)
    return rht_tokens(t, signs).t().contiguous()
