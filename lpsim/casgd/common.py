"""What the CA-SGD drivers share: argument checks, the :class:`Result`, divergence and the
``verbose`` report.

:mod:`lpsim.casgd.solvers` (the CPU simulator, which dispatches ``backend="cuda"``) and
:mod:`lpsim.casgd.native` (the GPU driver) both import these; the solvers re-export them
where users import them.  Held here, below both, so that the solvers import the native
driver and never the reverse (docs/architecture.rst).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field

import numpy as np

from .losses import Loss
from .recipes import Recipe


# --- validation -------------------------------------------------------------------------
def check_int(name: str, value, low: int = 1) -> int:
    """``value`` as an int >= ``low``, or a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name}={value!r} is not accepted; accepted: an integer >= {low}")
    return int(value)


def check_eta(eta) -> float:
    if isinstance(eta, bool) or not isinstance(eta, (int, float, np.floating, np.integer)) \
            or not math.isfinite(eta) or eta <= 0:
        raise ValueError(f"eta={eta!r} is not accepted; accepted: a finite step size > 0")
    return float(eta)


def check_seed(seed, name: str = "seed") -> int:
    """``seed`` as an int in [0, 2**64) (the Philox key of the samples and slot roundings)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or \
            not 0 <= seed < 2 ** 64:
        raise ValueError(f"{name}={seed!r} is not accepted; accepted: an integer "
                         "0 <= seed < 2**64")
    return int(seed)


def check_flags(progress, verbose, graphs=False):
    """The switches of a run: ``progress`` and ``graphs`` booleans, ``verbose`` an integer
    >= 0 (or a bool), each refused by name (a string such as "no" is truthy)."""
    for name, value in (("progress", progress), ("graphs", graphs)):
        if not isinstance(value, (bool, np.bool_)):
            raise ValueError(f"{name}={value!r} is not accepted; accepted: True or False")
    if not (isinstance(verbose, (int, np.integer, np.bool_)) and verbose >= 0):
        raise ValueError(f"verbose={verbose!r} is not accepted; accepted: an integer >= 0 or "
                         "a bool (0: silent)")


class DivergedError(ValueError):
    """The iterate left the finite numbers: the step size is too large for the data."""


def diverged(eta: float, h: int, H: int, what: str = "x") -> DivergedError:
    """The error every CA-SGD entry raises when ``what`` is not finite after iteration h."""
    return DivergedError(f"CA-SGD diverged with eta={eta!r}: {what} is not finite after outer "
                         f"iteration {h} of {H}; accepted: a smaller step size, e.g. "
                         f"eta={eta / 4:g}")


def physical_memory() -> int:
    """Bytes of physical memory of this machine (0 when the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def check_block_size(b: int, s: int, n: int, recipe: Recipe, memory: int | None = None):
    """A ValueError when one outer iteration's s*b x s*b Gram matrix and s*b x n sampled rows
    cannot fit in ``memory`` bytes (default: this machine's physical memory)."""
    sb = s * b
    gram = sb * sb * recipe.u_G.dtype.itemsize
    rows = sb * n * recipe.u_A.dtype.itemsize
    memory = physical_memory() if memory is None else memory
    if memory and gram + rows > memory:
        raise ValueError(f"b*s = {b}*{s} = {sb} rows per outer iteration: the s*b x s*b Gram "
                         f"matrix needs {gram / 2 ** 30:.4g} GiB and the sampled rows "
                         f"{rows / 2 ** 30:.4g} GiB, more than this machine's "
                         f"{memory / 2 ** 30:.4g} GiB; accepted: smaller b or s")


def real_array(name: str, value, accepted: str = "a real numeric (int or float) array"):
    """``value`` as a real numeric array, or a ValueError naming its dtype."""
    arr = np.asarray(value)
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.number) or \
            np.issubdtype(arr.dtype, np.complexfloating):
        first = (arr.reshape(-1)[:1].tolist() or [None])[0]
        raise ValueError(f"{name} has dtype {arr.dtype} (first entry {first!r}); accepted: "
                         f"{accepted}")
    return arr


def check_finite(name: str, arr: np.ndarray, what: str):
    """A ValueError naming the first NaN/inf entry of ``arr`` unless all entries are finite."""
    if not np.isfinite(arr).all():
        idx = tuple(int(i) for i in np.argwhere(~np.isfinite(arr))[0])
        where = ", ".join(map(str, idx))
        raise ValueError(f"{name}[{where}] = {float(arr[idx])!r}: NaN/inf; accepted: {what}")


def check_data(A, y, loss: Loss):
    """A as a non-empty 2-D float32/float64 array without NaN/inf, y as numeric labels in the
    loss's domain (Section 3.1), one per row."""
    A = real_array("A", A)
    if A.ndim != 2 or 0 in A.shape:
        raise ValueError(f"A has shape {A.shape}; accepted: a 2-D array (m samples x n "
                         "features) with m >= 1 and n >= 1")
    if A.dtype not in (np.float32, np.float64):
        A = A.astype(np.float64)
    check_finite("A", A, "finite values (drop or impute missing entries first)")
    labels = {"logistic": "-1/+1 (CASGDClassifier takes any two class labels)",
              "poisson": "counts 0, 1, 2, ..."}.get(loss.name, "real numbers")
    y = real_array("y", np.atleast_1d(y), f"numeric labels, {labels}")
    y = y.astype(np.float64).reshape(-1)
    if y.shape != (A.shape[0],):
        raise ValueError(f"y has {y.size} labels for {A.shape[0]} rows of A; accepted: one "
                         "label per row")
    check_finite("y", y, "finite labels")
    loss.check_labels(y)
    return A, y


def is_sparse(A) -> bool:
    """Whether ``A`` is a scipy.sparse matrix or array (any format)."""
    import scipy.sparse as sp
    return sp.issparse(A)


def check_sparse(A, y, loss: Loss):
    """A scipy sparse matrix (any format) as canonical CSR (duplicates summed, as ``toarray``
    does) with float32/float64 finite values, converted once; y checked as for dense data.

    The matrix itself is never densified; a CSR input in canonical form is not copied.
    """
    csr = A.tocsr()
    if csr.ndim != 2 or 0 in csr.shape:
        raise ValueError(f"A has shape {csr.shape}; accepted: a 2-D array (m samples x n "
                         "features) with m >= 1 and n >= 1")
    data = real_array("A", csr.data)
    if data.dtype not in (np.float32, np.float64) or not csr.has_canonical_format:
        csr = csr.astype(np.float64 if data.dtype not in (np.float32, np.float64)
                         else data.dtype, copy=True)
        csr.sum_duplicates()
    if not np.isfinite(csr.data).all():
        k = int(np.argmax(~np.isfinite(csr.data)))
        row = int(np.searchsorted(csr.indptr, k, side="right")) - 1
        raise ValueError(f"A[{row}, {int(csr.indices[k])}] = {float(csr.data[k])!r}: NaN/inf; "
                         "accepted: finite values (drop or impute missing entries first)")
    _, y = check_data(np.zeros((csr.shape[0], 1)), y, loss)
    return csr, y


def check_sample_weight(sample_weight, m: int):
    """``sample_weight`` as m finite non-negative float64 weights with a positive sum, or
    None; a ValueError naming ``sample_weight`` otherwise."""
    if sample_weight is None:
        return None
    w = real_array("sample_weight", sample_weight, "real non-negative weights, one per row")
    if w.shape != (m,):
        raise ValueError(f"sample_weight has shape {w.shape}; accepted: ({m},), one weight per "
                         "row of A")
    w = w.astype(np.float64)
    check_finite("sample_weight", w, "finite non-negative weights")
    if (w < 0).any():
        i = int(np.argmax(w < 0))
        raise ValueError(f"sample_weight[{i}] = {float(w[i])!r} is negative; accepted: "
                         "weights >= 0")
    with np.errstate(over="ignore"):
        total = float(w.sum())
    if total == 0:
        raise ValueError("sample_weight is zero for every row; accepted: weights >= 0 with at "
                         "least one positive")
    if total == math.inf:
        raise ValueError("sample_weight sums to inf; accepted: weights with a finite sum")
    return w


@dataclass
class Result:
    """Weights after a run, with F(x) recorded after the listed (outer) iterations."""

    x: np.ndarray
    loss_curve: list = field(default_factory=list)
    recorded_at: list = field(default_factory=list)
    iterations: int = 0


def check_x0(x0, n: int) -> np.ndarray:
    """Initial weights as n finite float64 values (zeros when None)."""
    x = np.zeros(n) if x0 is None else real_array("x0", x0).astype(np.float64)
    if x.shape != (n,):
        raise ValueError(f"x0 has shape {x.shape}; accepted: ({n},)")
    check_finite("x0", x, "finite initial weights")
    return x


def record_points(record, H: int) -> list:
    """The sorted iterations 0..H after which F(x) is recorded (an int k: every k)."""
    if record is None:
        return []
    if isinstance(record, (int, np.integer)):
        record = range(0, H + 1, check_int("record", record))
    return sorted(set(int(h) for h in record if 0 <= h <= H))


def report(h: int, H: int, value: float, x, start: float):
    """The ``verbose`` line of outer iteration h, on stdout as scikit-learn's SGD prints."""
    print(f"-- Outer iteration {h}/{H}: F(x) = {value:.8g}, |x| = "
          f"{float(np.linalg.norm(x)):.6g}, {time.perf_counter() - start:.3g} s", flush=True)


__all__ = ["check_int", "check_eta", "check_seed", "check_flags", "DivergedError", "diverged",
           "physical_memory", "check_block_size", "real_array", "check_finite", "check_data",
           "is_sparse", "check_sparse", "check_sample_weight", "Result", "check_x0",
           "record_points", "report"]
