"""scikit-learn estimators over CA-SGD: CASGDClassifier (logistic), CASGDRegressor, with
scikit-learn's conventions: fit_intercept, sample_weight, partial_fit, verbose, sparse X.

With scikit-learn installed they are ``BaseEstimator`` subclasses (clone, pipelines,
cross-validation, ``check_estimator``); scikit-learn is optional, and without it they keep
the same get_params / set_params / fit / predict / score interface.
"""

from __future__ import annotations

import functools
import inspect
import math
import warnings

import numpy as np

from .data import normalize_rows
from .losses import get_loss
from .recipes import as_recipe
from .solvers import (casgd, check_data, check_eta, check_finite, check_int,
                      check_sample_weight, check_seed, check_sparse, diverged, is_sparse)

try:
    from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
    from sklearn.utils.multiclass import check_classification_targets, type_of_target
    from sklearn.utils.validation import check_is_fitted, validate_data
except ImportError:        # scikit-learn is an optional dependency (the "test" extra)
    validate_data = None

    class BaseEstimator:
        """Stand-in for sklearn.base.BaseEstimator: parameters are the __init__ keywords."""

        @classmethod
        def _get_param_names(cls):
            return sorted(p for p in inspect.signature(cls.__init__).parameters
                          if p != "self")

        def get_params(self, deep=True):
            return {key: getattr(self, key) for key in self._get_param_names()}

        def set_params(self, **params):
            for key, value in params.items():
                if key not in self._get_param_names():
                    raise ValueError(f"unknown parameter {key!r}; accepted: "
                                     f"{', '.join(self._get_param_names())}")
                setattr(self, key, value)
            return self

    class ClassifierMixin:
        def score(self, X, y, sample_weight=None):
            """Mean accuracy, weighted by sample_weight: sklearn.metrics.accuracy_score."""
            pred = self.predict(X)
            y, weights = _score_targets(y, pred, sample_weight)
            return float(np.average(y == pred, weights=weights))

    class RegressorMixin:
        def score(self, X, y, sample_weight=None):
            """Coefficient of determination R^2, weighted by sample_weight, as
            sklearn.metrics.r2_score (force_finite=True) computes it."""
            pred = self.predict(X)
            y, weights = _score_targets(_float_targets(y), pred, sample_weight)
            return _r2_score(y, pred, weights)


def _first(arr: np.ndarray):
    """The first entry of ``arr`` (None if empty), for error messages."""
    return (arr.reshape(-1)[:1].tolist() or [None])[0]


def _fallback_X(X):
    """X as validate_data makes it without scikit-learn: an array-like (a list, a DataFrame)
    as a 2-D float array (bool, int and object entries as float64); sparse X is left to
    check_sparse."""
    if is_sparse(X):
        return X
    X = np.asarray(X)
    if np.iscomplexobj(X):
        raise ValueError(f"X has dtype {X.dtype} (first entry {_first(X)!r}); accepted: real "
                         "numbers (complex data is not supported)")
    if X.dtype not in (np.float32, np.float64):
        try:
            X = X.astype(np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"X has dtype {X.dtype} (first entry {_first(X)!r}); accepted: "
                             "real numbers (float, int or bool entries)") from None
    if X.ndim != 2 or 0 in X.shape:
        raise ValueError(f"X has shape {X.shape}; accepted: a 2-D array (m samples x n "
                         "features) with m >= 1 and n >= 1; reshape one feature with "
                         "X.reshape(-1, 1), one sample with X.reshape(1, -1)")
    check_finite("X", X, "finite values (drop or impute missing entries first)")
    return X


def _float_targets(y):
    """y as float64 where it converts (y_numeric: object entries), else unchanged for
    check_data to name its dtype."""
    y = np.asarray(y)
    if y.dtype == object:
        try:
            return y.astype(np.float64)
        except (TypeError, ValueError):
            pass
    return y


def _fallback_y(y, m: int, estimator: str, numeric: bool):
    """y as validate_data makes it without scikit-learn: a 1-D array (a column is
    flattened), one finite label per row of X; numeric: object entries as float64."""
    if y is None:
        raise ValueError(f"{estimator} requires y to be passed, but the target y is None; "
                         "accepted: one label per row of X")
    y = _float_targets(y) if numeric else np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y.reshape(-1)
    if y.ndim != 1:
        raise ValueError(f"y has shape {y.shape}; accepted: a 1-D array, one label per row "
                         "of X")
    if y.shape[0] != m:
        raise ValueError(f"y has {y.shape[0]} labels for {m} rows of X; accepted: one label "
                         "per row")
    if np.iscomplexobj(y):
        raise ValueError(f"y has dtype {y.dtype} (first entry {_first(y)!r}); accepted: real "
                         "labels (complex data is not supported)")
    if y.dtype.kind == "f":
        check_finite("y", y, "finite labels")
    return y


def _check_labels(y: np.ndarray):
    """check_classification_targets' refusals without scikit-learn: bytes, object labels
    that are not all strings (None, mixed types), continuous (non-integral float) labels."""
    if y.dtype.kind == "S":
        raise TypeError(f"y has bytes labels (first {_first(y)!r}); accepted: strings, "
                        "integers or bools (decode the bytes first)")
    if y.dtype == object:
        bad = [v for v in y.reshape(-1) if not isinstance(v, str)][:1]
        if bad:
            bad = bad[0]
            raise ValueError(f"y has the label {bad!r} of type {type(bad).__name__} in an "
                             "object array; accepted: labels of one kind, numbers (a numeric "
                             "array) or strings")
    if y.dtype.kind == "f":
        with np.errstate(invalid="ignore"):      # as type_of_target: y != y.astype(int)
            continuous = y != y.astype(int)
        if continuous.any():
            i = int(np.argmax(continuous))
            raise ValueError(f"y[{i}] = {float(y.reshape(-1)[i])!r} is not a class label (y "
                             "is continuous); accepted: class labels (integers, integral "
                             "floats, strings, bools); use CASGDRegressor for real targets")


def _score_targets(y, pred: np.ndarray, sample_weight):
    """(y, sample_weight) for score without scikit-learn: one finite label per prediction
    and one weight per row, as the metrics check them."""
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y.reshape(-1)
    if y.shape != pred.shape:
        raise ValueError(f"y has shape {y.shape} for {pred.shape[0]} rows of X; accepted: "
                         "one label per row")
    if y.dtype.kind == "f":
        check_finite("y", y, "finite labels")
    if sample_weight is not None:
        sample_weight = np.asarray(sample_weight, np.float64)
        if sample_weight.shape != pred.shape:
            raise ValueError(f"sample_weight has shape {sample_weight.shape}; accepted: "
                             f"{pred.shape}, one weight per row of X")
        check_finite("sample_weight", sample_weight, "finite weights")
        if pred.size and not np.any(sample_weight):     # an average of no weight
            raise ValueError("sample_weight: every weight is 0; accepted: at least one "
                             "non-zero weight (as scikit-learn's metrics)")
    return y, sample_weight


def _r2_score(y: np.ndarray, pred: np.ndarray, weights) -> float:
    """sklearn.metrics.r2_score(y, pred, sample_weight=weights) with force_finite=True, the
    same operations on the same (m, 1) columns: 1.0 for a perfect prediction (constant y
    included), 0.0 for an imperfect one of constant y, NaN (and a warning) for m < 2."""
    if y.shape[0] < 2:
        warnings.warn("R^2 score is not well-defined with less than two samples.",
                      UserWarning, stacklevel=3)
        return float("nan")
    y, pred = y.reshape(-1, 1), pred.astype(np.float64).reshape(-1, 1)
    weight = 1.0 if weights is None else weights[:, None]
    numerator = float(np.sum(weight * (y - pred) ** 2, axis=0)[0])
    denominator = float(np.sum(weight * (y - np.average(y, axis=0, weights=weights)) ** 2,
                               axis=0)[0])
    if numerator == 0:
        return 1.0
    if denominator == 0:
        return 0.0
    return 1 - numerator / denominator


#: _validate's y when there is none (predict): fit passes its y, None included
_NO_Y = object()
#: what fit and partial_fit change before they can still refuse (validation sets the first
#: two, the classifier classes_, _fit the weights it continues from)
_FIT_STATE = ("n_features_in_", "feature_names_in_", "classes_", "_w", "_calls", "_seed")


def _refusal_changes_nothing(method):
    """fit / partial_fit that, when they raise, leave the estimator as it was (a fitted one
    keeps predicting with what it had)."""
    @functools.wraps(method)
    def wrapped(self, *args, **kwargs):
        saved = {name: self.__dict__[name] for name in _FIT_STATE if name in self.__dict__}
        try:
            return method(self, *args, **kwargs)
        except BaseException:
            for name in _FIT_STATE:
                self.__dict__.pop(name, None)
            self.__dict__.update(saved)
            raise
    return wrapped

try:      # scikit-learn's own class where it is installed, so its handlers catch ours
    from sklearn.utils._param_validation import InvalidParameterError
except ImportError:
    class InvalidParameterError(ValueError, TypeError):
        """A constructor parameter of the wrong type or value (scikit-learn's class)."""


def _is_bool(value) -> bool:
    return isinstance(value, (bool, np.bool_))


def _check_flag(owner: str, name: str, value):
    """The boolean parameters (scikit-learn's "boolean" constraint: bool or numpy.bool)."""
    if not _is_bool(value):
        raise InvalidParameterError(f"{owner}({name}={value!r}): {name} is not accepted; "
                                    "accepted: True or False")


def _check_verbose(owner: str, value):
    """verbose as scikit-learn's "verbose" constraint: an integer >= 0 or a bool."""
    if not (isinstance(value, (int, np.integer, np.bool_)) and value >= 0):
        raise InvalidParameterError(f"{owner}(verbose={value!r}): verbose is not accepted; "
                                    "accepted: an integer >= 0 or a bool (0: silent)")


def _check_device(owner: str, device):
    """device: None (the simulator) or a torch device, named here rather than by torch."""
    if device is None:
        return
    try:
        import torch
        torch.device(device)
        ok = isinstance(device, (str, torch.device))
    except ImportError:               # casgd_native names the missing torch
        ok = isinstance(device, str)
    except (RuntimeError, TypeError, ValueError):
        ok = False
    if not ok:
        raise InvalidParameterError(f"{owner}(device={device!r}): device is not accepted; "
                                    "accepted: None (the CPU simulator) or a torch device "
                                    "such as 'cuda' or 'cuda:1' (the native GPU path)")


def _call_seed(base: int, call: int) -> int:
    """The Philox/numpy seed of fit call ``call`` (0: ``base`` itself; later partial_fit calls
    a seed derived from (base, call), so each call draws fresh rows and rounding bits)."""
    if call == 0:
        return base
    return int(np.random.SeedSequence([base, call]).generate_state(1, np.uint64)[0])


def _base_seed(random_state) -> int:
    """An integer seed from scikit-learn's ``random_state`` conventions: an int is the seed
    itself; None, a RandomState or a Generator draw one."""
    if random_state is None:
        return int(np.random.randint(0, 2 ** 31))     # numpy's global RandomState
    if isinstance(random_state, np.random.RandomState):
        return int(random_state.randint(0, 2 ** 31))
    if isinstance(random_state, np.random.Generator):
        return int(random_state.integers(0, 2 ** 63))
    return check_seed(random_state, "random_state")


class _CASGD(BaseEstimator):
    """Shared fit/partial_fit/predict: __init__ stores the parameters, fit validates them.

    Each fit runs :func:`lpsim.casgd.casgd` (Algorithm 1) on the rows of X, l2-normalised
    when ``normalize`` (Assumption 5.1), and keeps ``coef_``, ``intercept_``, ``loss_curve_``
    (F(x) after every outer iteration) and ``n_iter_`` (outer iterations of the last call).

    fit_intercept: the intercept is the weight of a constant feature appended to every row,
    as liblinear's ``intercept_scaling`` does, so it is trained by the same recurrence and
    precision slots as every other weight.  With ``normalize`` the rows [a_i / ||a_i||, c] are
    scaled by t = 1/sqrt(1 + c^2) to stay unit vectors (c = intercept_scaling); without it
    the rows are [a_i, c].  With weights w of those rows, ``coef_ = t w[:n]`` and
    ``intercept_ = c t w[n]``, so ``decision_function(X) = X' coef_ + intercept_`` with X'
    the (normalised) rows.  Default True, as scikit-learn's SGD estimators have it.

    sample_weight: rows are sampled with probability w_i / sum(w) (see :func:`casgd`), which
    minimises the weighted loss sum_i w_i L_i / sum(w); with a u_A that rounds
    deterministically, integer weights give exactly the run on repeated rows laid out
    consecutively (a stochastic u_A rounds each copy with its own bits); all-ones weights
    give the unweighted run.

    X may be a scipy.sparse matrix (CSR, CSC, COO, or any format scikit-learn converts):
    only each sampled block of s*b rows is densified, and coef_ is bit-identical to the
    fit on the same matrix dense.

    partial_fit: one pass over the given rows, ceil(m / (s*b)) outer iterations (one epoch
    in expectation, as SGDClassifier.partial_fit runs one epoch), continuing from the
    current weights; call k draws its rows from a seed derived from (random_state, k).
    verbose: 0 prints nothing; > 0 prints F(x) after each outer iteration (stdout).
    progress: a tqdm bar over the outer iterations (stderr; off by default).  device: None
    runs the simulator; a torch device ("cuda", "cuda:1") runs the native GPU path
    (:mod:`lpsim.casgd.native`); both draw the same rows for the same seed (Philox).
    random_state: an int seed, None, or a numpy RandomState or Generator to draw one.
    Every parameter is checked by name when fit, partial_fit or predict starts (an
    ``InvalidParameterError``, a ValueError and TypeError as scikit-learn's), before
    anything changes: normalize, fit_intercept and progress are booleans, verbose an
    integer >= 0.
    """

    def __init__(self, *, eta=0.5, b=32, s=16, n_iter=100, recipe="A", P=1, normalize=True,
                 fit_intercept=True, intercept_scaling=1.0, random_state=0, verbose=0,
                 progress=False, device=None):
        self.eta, self.b, self.s, self.n_iter = eta, b, s, n_iter
        self.recipe, self.P, self.normalize = recipe, P, normalize
        self.fit_intercept, self.intercept_scaling = fit_intercept, intercept_scaling
        self.random_state, self.verbose = random_state, verbose
        self.progress, self.device = progress, device

    def _check_params(self):
        """Every parameter by name (as scikit-learn's parameter validation does in fit),
        before anything changes: fit refuses a bad value with neither n_features_in_ nor
        classes_ nor the weights touched."""
        owner = type(self).__name__
        try:
            check_eta(self.eta)
            for name in ("b", "s", "n_iter", "P"):
                check_int(name, getattr(self, name))
            if not isinstance(self.random_state, (type(None), np.random.RandomState,
                                                  np.random.Generator)):
                check_seed(self.random_state, "random_state")
            as_recipe(self.recipe)
        except ValueError as err:
            raise InvalidParameterError(f"{owner}: {err}") from None
        for name in ("normalize", "fit_intercept", "progress"):
            _check_flag(owner, name, getattr(self, name))
        _check_verbose(owner, self.verbose)
        _check_device(owner, self.device)
        if self.fit_intercept:
            self._intercept_terms()

    def _validate(self, X, y=_NO_Y, reset=True):
        """(X with rows normalised as configured, y) after scikit-learn's and our checks;
        reset=True in fit (X and y), False in predict and later partial_fit calls."""
        self._check_params()
        if validate_data is not None:     # scikit-learn's messages, n_features_in_
            kwargs = dict(reset=reset, dtype=(np.float64, np.float32),
                          accept_sparse=("csr", "csc", "coo"))
            if y is not _NO_Y:
                X, y = validate_data(self, X, y, y_numeric=not isinstance(
                    self, ClassifierMixin), **kwargs)
            else:
                X = validate_data(self, X, **kwargs)
        else:                             # the same conversions and refusals without it
            if not reset and not hasattr(self, "coef_"):
                raise ValueError(f"this {type(self).__name__} is not fitted; call fit(X, y) "
                                 "first")
            X = _fallback_X(X)
            if y is not _NO_Y:
                y = _fallback_y(y, X.shape[0], type(self).__name__,
                                numeric=not isinstance(self, ClassifierMixin))
        m = X.shape[0] if is_sparse(X) or np.ndim(X) == 2 else 0
        X, _ = (check_sparse if is_sparse(X) else check_data)(X, np.zeros(m),
                                                              get_loss("linear"))
        if reset:
            self.n_features_in_ = X.shape[1]
        elif X.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {X.shape[1]} features, but {type(self).__name__} is "
                             f"expecting {self.n_features_in_} features as input")
        return (normalize_rows(X) if self.normalize else X), y

    def _intercept_terms(self):
        """(t, c): rows are [t a_i, c t] (t = 1 without normalize); see the class docstring."""
        c = self.intercept_scaling
        if isinstance(c, (bool, np.bool_)) or \
                not isinstance(c, (int, float, np.integer, np.floating)) or not 0 < c <= 1e150:
            raise InvalidParameterError(f"intercept_scaling={c!r} is not accepted; accepted: "
                                        "a number in (0, 1e150] (rows are scaled by "
                                        "1/sqrt(1 + c**2), which underflows to 0 beyond)")
        c = float(c)
        return (1.0 / math.sqrt(1.0 + c * c) if self.normalize else 1.0), c

    def _design(self, X):
        """The rows CA-SGD trains on: X, or X with the intercept's constant feature."""
        if not self.fit_intercept:
            return X
        t, c = self._intercept_terms()
        if is_sparse(X):
            import scipy.sparse as sp
            X = X.copy() if t != 1.0 else X
            if t != 1.0:
                X.data *= X.dtype.type(t)
            ones = sp.csr_matrix(np.full((X.shape[0], 1), c * t, X.dtype))
            return sp.hstack([X, ones], format="csr")
        Z = np.empty((X.shape[0], X.shape[1] + 1), X.dtype)
        Z[:, :-1] = X if t == 1.0 else X * X.dtype.type(t)
        Z[:, -1] = c * t
        return Z

    def _fit(self, X, y, loss, sample_weight, H, partial=False):
        """Run :func:`casgd` on validated X; raise if it diverged instead of storing NaN."""
        loss, eta = get_loss(loss), check_eta(self.eta)
        check_int("b", self.b), check_int("s", self.s), check_int("n_iter", self.n_iter)
        X, y = (check_sparse if is_sparse(X) else check_data)(X, y, loss)
        weights = check_sample_weight(sample_weight, X.shape[0])
        Z = self._design(X)
        if not partial or getattr(self, "_w", None) is None or self._w.size != Z.shape[1]:
            self._w, self._calls, self._seed = None, 0, _base_seed(self.random_state)
        with np.errstate(over="ignore", invalid="ignore"):
            res = casgd(Z, y, loss=loss, eta=eta, b=self.b, s=self.s, H=H,
                        recipe=as_recipe(self.recipe), P=self.P,
                        seed=_call_seed(self._seed, self._calls), x0=self._w, record=1,
                        progress=bool(self.progress), sample_weight=weights,
                        verbose=self.verbose,
                        backend="cpu" if self.device is None else "cuda", device=self.device)
            curve = np.append(res.loss_curve, np.linalg.norm(res.x))
        if not np.isfinite(curve).all():
            h = min(int(np.argmax(~np.isfinite(curve))), H)
            raise diverged(eta, h, H, "F(x)")
        w = np.asarray(res.x, np.float64)
        self._w, self._calls = w, self._calls + 1
        if self.fit_intercept:
            t, c = self._intercept_terms()
            self.coef_, self.intercept_ = w[:-1] * t, float(w[-1] * (c * t))
        else:
            self.coef_, self.intercept_ = w, 0.0
        self.loss_curve_ = res.loss_curve
        self.n_iter_ = res.iterations
        return self

    def _pass_length(self, m: int) -> int:
        """Outer iterations of one partial_fit pass over m rows: ceil(m / (s*b))."""
        sb = check_int("s", self.s) * check_int("b", self.b)
        return -(-m // sb)

    def _margins(self, X):
        """Margins X' coef_ + intercept_ (X' = rows normalised as in fit)."""
        if validate_data is not None:
            check_is_fitted(self, "coef_")
        X, _ = self._validate(X, reset=False)
        if is_sparse(X):
            return np.asarray(X @ self.coef_, np.float64).reshape(-1) + self.intercept_
        return np.asarray(X, np.float64) @ self.coef_ + self.intercept_

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags


class CASGDClassifier(ClassifierMixin, _CASGD):
    """Binary logistic regression trained by CA-SGD; any two class labels."""

    @_refusal_changes_nothing
    def fit(self, X, y, sample_weight=None):
        """Fit on features X (m x n, dense or scipy.sparse) and two-class labels y, n_iter
        outer iterations from zero weights; sample_weight: one weight >= 0 per row."""
        X, y = self._validate(X, y)
        self.classes_ = self._classes(y)
        return self._fit(X, self._signs(y), "logistic", sample_weight, self.n_iter)

    @_refusal_changes_nothing
    def partial_fit(self, X, y, classes=None, sample_weight=None):
        """One pass over the rows of X (ceil(m / (s*b)) outer iterations), continuing from
        the current weights; ``classes`` (both labels) is required on the first call, as
        scikit-learn's partial_fit requires it."""
        first = not hasattr(self, "classes_")
        if first and classes is None:
            raise ValueError("classes must be passed on the first call to partial_fit; "
                             "accepted: both class labels, e.g. classes=np.unique(y)")
        X, y = self._validate(X, y, reset=first)
        if classes is not None:
            classes = self._classes(np.asarray(classes), "classes")
            if not first and not np.array_equal(classes, self.classes_):
                raise ValueError(f"classes={classes!r} is not the same as on the first call "
                                 f"to partial_fit ({self.classes_!r})")
        classes = classes if first else self.classes_
        unknown = np.setdiff1d(np.asarray(y), classes)
        if unknown.size:
            raise ValueError(f"y has labels {unknown[:5]!r} outside classes={classes!r}; "
                             "accepted: the classes of the first call")
        self.classes_ = classes
        return self._fit(X, self._signs(y), "logistic", sample_weight,
                         self._pass_length(X.shape[0]), partial=not first)

    @staticmethod
    def _classes(y, name="y"):
        y = np.asarray(y)
        if validate_data is not None and name == "y":
            check_classification_targets(y)
            kind = type_of_target(y, input_name="y")
            if kind != "binary":
                raise ValueError("Only binary classification is supported. The type of the "
                                 f"target is {kind} ({np.unique(y).size} classes); accepted: "
                                 "exactly two classes")
        elif name == "y":
            _check_labels(y)
        classes = np.unique(y)
        if classes.size != 2:
            raise ValueError(f"{name} has {classes.size} classes ({classes[:5]!r}); accepted: "
                             "exactly two classes")
        return classes

    def _signs(self, y):
        return np.where(np.asarray(y) == self.classes_[1], 1.0, -1.0)

    def decision_function(self, X):
        """Margins X' coef_ + intercept_ (X' = rows normalised as in fit); positive means
        classes_[1]."""
        return self._margins(X)

    def predict(self, X):
        """The class of each row: classes_[1] where the margin is positive."""
        positive = self._margins(X) > 0
        return self.classes_[positive.astype(int)]

    def predict_proba(self, X):
        """Columns P(classes_[0]), P(classes_[1]) = sigmoid(margin)."""
        p = get_loss("logistic").mean(self._margins(X))
        return np.stack([1 - p, p], axis=1)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_class = False
        return tags


class CASGDRegressor(RegressorMixin, _CASGD):
    """Linear (loss="linear") or Poisson (loss="poisson") regression trained by CA-SGD."""

    def __init__(self, *, loss="linear", eta=0.5, b=32, s=16, n_iter=100, recipe="A", P=1,
                 normalize=True, fit_intercept=True, intercept_scaling=1.0, random_state=0,
                 verbose=0, progress=False, device=None):
        super().__init__(eta=eta, b=b, s=s, n_iter=n_iter, recipe=recipe, P=P,
                         normalize=normalize, fit_intercept=fit_intercept,
                         intercept_scaling=intercept_scaling, random_state=random_state,
                         verbose=verbose, progress=progress, device=device)
        self.loss = loss

    def _check_loss(self):
        if not isinstance(self.loss, str) or self.loss not in ("linear", "poisson"):
            raise InvalidParameterError(f"loss={self.loss!r} is not accepted; accepted: 'linear', "
                             "'poisson' (use CASGDClassifier for logistic)")

    @_refusal_changes_nothing
    def fit(self, X, y, sample_weight=None):
        """Fit on features X (m x n, dense or scipy.sparse) and real (linear) or non-negative
        (Poisson: counts, or any y >= 0) targets y, n_iter outer iterations from zero
        weights."""
        self._check_loss()
        X, y = self._validate(X, y)
        return self._fit(X, y, self.loss, sample_weight, self.n_iter)

    @_refusal_changes_nothing
    def partial_fit(self, X, y, sample_weight=None):
        """One pass over the rows of X (ceil(m / (s*b)) outer iterations), continuing from
        the current weights."""
        self._check_loss()
        first = not hasattr(self, "coef_")
        X, y = self._validate(X, y, reset=first)
        return self._fit(X, y, self.loss, sample_weight, self._pass_length(X.shape[0]),
                         partial=not first)

    def predict(self, X):
        """Predicted mean: the margin (linear) or exp(margin) (Poisson)."""
        self._check_loss()
        return get_loss(self.loss).mean(self._margins(X))

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.positive_only = self.loss == "poisson"
        return tags
