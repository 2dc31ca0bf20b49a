"""Data for the GLMs: Table 4 synthetic generators, LIBSVM files, scikit-learn datasets."""

from __future__ import annotations

import os

import numpy as np

from .losses import get_loss
from .solvers import check_finite, check_int, real_array


def normalize_rows(A, copy: bool = True) -> np.ndarray:
    """Rows scaled to unit l2 norm (zero rows kept): Assumption 5.1, Section 7.1.

    copy=True returns a new array (float64 for integer input); copy=False scales a
    float32/float64 array in place.
    """
    X = real_array("A", A)
    if X.ndim != 2:
        raise ValueError(f"A has shape {X.shape}; accepted: a 2-D array (rows to normalise)")
    if X.dtype not in (np.float32, np.float64):
        if not copy:
            raise TypeError(f"normalize_rows(copy=False) cannot scale a {X.dtype} array in "
                            "place; accepted: a float32/float64 array, or copy=True")
        X = X.astype(np.float64)
    check_finite("A", X, "finite values")
    X = np.array(X, copy=True) if copy and X is A else X
    norms = np.sqrt(np.einsum("ij,ij->i", X, X, dtype=np.float64))
    norms[norms == 0] = 1.0
    X /= norms[:, None].astype(X.dtype)
    return X


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


def load_libsvm(path, n_features: int | None = None, *, zero_based: bool = False,
                dtype=np.float32):
    """(A, y) from a LIBSVM/svmlight text file ``label index:value ...`` (dense A).

    Indices are 1-based unless ``zero_based``; '#' starts a comment.  A line that does not
    parse (non-finite value or label, an index given twice) raises ValueError naming the file,
    the line number and the token; so does a file without data lines.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"LIBSVM file {path!r} does not exist")
    labels, rows, width = [], [], 0
    first = 0 if zero_based else 1
    with open(path) as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            tokens = line.split()
            try:
                label = float(tokens[0])
                if not np.isfinite(label):
                    raise ValueError
            except ValueError:
                raise ValueError(f"{path}:{lineno}: label {tokens[0]!r} is not a finite "
                                 "number; accepted: 'label index:value ...'") from None
            row = {}
            for token in tokens[1:]:
                key, sep, value = token.partition(":")
                try:
                    index, val = int(key), float(value)
                    if not sep or index < first or not np.isfinite(val):
                        raise ValueError
                except ValueError:
                    raise ValueError(
                        f"{path}:{lineno}: cannot parse {token!r}; accepted: index:value with "
                        f"an integer index >= {first} and a finite numeric value") from None
                if n_features is not None and index - first >= n_features:
                    raise ValueError(f"{path}:{lineno}: index {index} exceeds "
                                     f"n_features={n_features}")
                if index - first in row:
                    raise ValueError(f"{path}:{lineno}: index {index} given twice ({token!r} "
                                     "repeats it); accepted: each index at most once per line")
                row[index - first] = val
                width = max(width, index - first + 1)
            labels.append(label)
            rows.append(row)
    if not rows:
        raise ValueError(f"LIBSVM file {path!r} has no data lines (only blank lines or "
                         "comments); accepted: lines 'label index:value ...'")
    A = np.zeros((len(rows), n_features or width), dtype)
    for i, row in enumerate(rows):
        if row:
            A[i, list(row)] = list(row.values())
    return A, np.asarray(labels, np.float64)


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
