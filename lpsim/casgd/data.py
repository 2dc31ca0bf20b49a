"""Data for the GLMs: Table 4 synthetic generators, LIBSVM files (sparse), scikit-learn datasets."""

from __future__ import annotations

import os

import numpy as np

from .._extras import require
from .losses import get_loss
from .solvers import check_finite, check_int, check_sparse, is_sparse, real_array


def normalize_rows(A, copy: bool = True):
    """Rows scaled to unit l2 norm (zero rows kept): Assumption 5.1, Section 7.1.

    copy=True returns a new array (float64 for integer input); copy=False scales a
    float32/float64 array in place.  A scipy.sparse A gives a CSR matrix with the same
    values as the dense result, bit for bit, and is never densified whole (its norms are
    summed over dense blocks of rows in the dense order).
    """
    if is_sparse(A):
        return _normalize_sparse(A, copy)
    X = real_array("A", A)
    if X.ndim != 2:
        raise ValueError(f"A has shape {X.shape}; accepted: a 2-D array (rows to normalise)")
    if X.dtype not in (np.float32, np.float64):
        if not copy:
            raise TypeError(f"normalize_rows(copy=False) cannot scale a {X.dtype} array in "
                            "place; accepted: a float32/float64 array, or copy=True")
        X = X.astype(np.float64)
    check_finite("A", X, "finite values")
    if copy and isinstance(A, np.ndarray) and np.may_share_memory(X, A):
        X = np.array(X, copy=True)              # a view of A (a memmap, a matrix) is A too
    X /= _row_norms(X)[:, None].astype(X.dtype)
    return X


def _row_norms(X) -> np.ndarray:
    """l2 norms of the rows of a dense float array, 1 for zero rows (summed in C order, so a
    row's norm does not depend on the array's layout or on the rows around it)."""
    X = np.ascontiguousarray(X)
    norms = np.sqrt(np.einsum("ij,ij->i", X, X, dtype=np.float64))
    # rows whose squares overflow or underflow float64: summed again scaled by a power of
    # two near their largest magnitude (exact), so 1e160 * a normalises as a does
    far = np.flatnonzero(~(norms <= 2.0 ** 480) | ((norms < 2.0 ** -480) & (norms > 0)))
    zero = np.flatnonzero(norms == 0)               # all squares underflowed, or a zero row
    for i in np.concatenate((far, zero[np.any(X[zero] != 0, axis=1)])):
        _, k = np.frexp(np.max(np.abs(X[i])))
        row = np.ldexp(X[i].astype(np.float64), -k)
        norms[i] = np.ldexp(np.sqrt(np.dot(row, row)), k)
    norms[norms == 0] = 1.0
    return norms


#: entries of one dense block of rows while a sparse matrix's norms are summed
_NORM_BLOCK = 1 << 20


def _normalize_sparse(A, copy: bool):
    if not copy and (A.format != "csr" or A.dtype not in (np.float32, np.float64)):
        raise TypeError(f"normalize_rows(copy=False) cannot scale a {A.format} {A.dtype} matrix "
                        "in place; accepted: a float32/float64 CSR matrix, or copy=True")
    csr, _ = check_sparse(A, np.zeros(A.shape[0]), get_loss("linear"))
    if copy and csr is A:
        csr = csr.copy()
    step = max(1, _NORM_BLOCK // max(1, csr.shape[1]))
    norms = np.empty(csr.shape[0])
    for lo in range(0, csr.shape[0], step):
        norms[lo:lo + step] = _row_norms(csr[lo:lo + step].toarray())
    csr.data /= np.repeat(norms, np.diff(csr.indptr)).astype(csr.dtype)
    return csr


def make_synth(m: int, n: int, *, loss="logistic", seed: int = 0, margin_std: float = 1.0,
               noise: float = 0.1, dtype=np.float32):
    """synth / Poisson-synth of Table 4: Gaussian rows, l2-normalised, planted weights.

    The feature matrix depends only on (m, n, seed), so every loss shares it (Table 4);
    margins a_i^T x_true have standard deviation about ``margin_std``.  Labels: logistic
    y = +-1 with P(+1) = sigmoid(margin), linear y = margin + noise, Poisson y ~ Poisson(e^margin).
    Returns (A, y, x_true).
    """
    m, n = check_int("m", m), check_int("n", n)
    loss = get_loss(loss)
    rng = np.random.default_rng([seed, 0])
    A = np.empty((m, n), dtype)
    for lo in range(0, m, 8192):
        A[lo:lo + 8192] = rng.standard_normal((min(8192, m - lo), n), dtype=np.float32)
    normalize_rows(A, copy=False)
    x_true = rng.standard_normal(n)
    x_true *= margin_std * np.sqrt(n) / np.linalg.norm(x_true)
    margin = (A @ x_true.astype(dtype)).astype(np.float64)
    lab = np.random.default_rng([seed, 1])
    if loss.name == "logistic":
        y = np.where(lab.random(m) < 1 / (1 + np.exp(-margin)), 1.0, -1.0)
    elif loss.name == "linear":
        y = margin + noise * lab.standard_normal(m)
    else:
        y = lab.poisson(np.exp(margin)).astype(np.float64)
    return A, y.astype(np.float32).astype(np.float64), x_true


def load_libsvm(path, n_features: int | None = None, *, zero_based=False, dtype=np.float32,
                dense: bool = False, query_id: bool = False):
    """(A, y) from a LIBSVM/svmlight file ``label [qid:q] index:value ...``: scikit-learn's
    :func:`~sklearn.datasets.load_svmlight_file`, which reads ``.gz``/``.bz2`` files too.

    A is a scipy CSR matrix (``dense=True``: a numpy array) of ``dtype``; y is float64.
    Indices are 1-based unless ``zero_based`` (True, or "auto" to infer as scikit-learn does);
    '#' starts a comment.  ``query_id=True`` returns (A, y, qid).  A file the library cannot
    parse, a NaN/inf value or label, or a file without data lines raises ValueError naming
    the file; a missing file raises FileNotFoundError.  (CA-SGD takes the sparse A as it is.)
    """
    require("sklearn", extra="casgd", feature="lpsim.casgd.load_libsvm")
    from sklearn.datasets import load_svmlight_file
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"LIBSVM file {path!r} does not exist")
    if zero_based not in (True, False, "auto"):
        raise ValueError(f"zero_based={zero_based!r} is not accepted; accepted: True, False, "
                         "'auto'")
    try:
        A, y, *qid = load_svmlight_file(path, n_features=n_features, dtype=dtype,
                                        zero_based=zero_based, query_id=query_id)
    except ValueError as err:
        raise ValueError(f"LIBSVM file {path!r}: {err}; accepted: lines 'label [qid:q] "
                         f"index:value ...' with {'0' if zero_based is True else '1'}-based "
                         "indices, sorted and unique") from None
    if A.shape[0] == 0:
        raise ValueError(f"LIBSVM file {path!r} has no data lines (only blank lines or "
                         "comments); accepted: lines 'label index:value ...'")
    if not np.isfinite(y).all():
        i = int(np.argmax(~np.isfinite(y)))
        raise ValueError(f"LIBSVM file {path!r}: label {float(y[i])!r} of row {i} is not a finite "
                         "number; accepted: finite labels")
    try:
        check_sparse(A, y, get_loss("linear"))
    except ValueError as err:
        raise ValueError(f"LIBSVM file {path!r}: {err}") from None
    A = A.toarray() if dense else A
    return (A, y, qid[0]) if query_id else (A, y)


def load_dataset(name: str, *, m: int = 65536, n: int = 4096, seed: int = 0):
    """(A, y, loss) with l2-normalised rows: "synth", "poisson-synth", "linear-synth",
    or scikit-learn's bundled "breast_cancer" (logistic, y = +-1) and "diabetes" (linear,
    standardised y); the real sets have their columns standardised first."""
    synth = {"synth": "logistic", "poisson-synth": "poisson", "linear-synth": "linear"}
    if name in synth:
        A, y, _ = make_synth(m, n, loss=synth[name], seed=seed)
        return A, y, synth[name]
    if name not in ("breast_cancer", "diabetes"):
        raise ValueError(f"unknown dataset {name!r}; accepted: {', '.join(synth)}, "
                         "breast_cancer, diabetes (or load_libsvm for a file)")
    from sklearn import datasets
    X, y = getattr(datasets, f"load_{name}")(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    A = normalize_rows(X.astype(np.float64))
    if name == "breast_cancer":
        return A, np.where(y == 1, 1.0, -1.0), "logistic"
    return A, (y - y.mean()) / y.std(), "linear"
