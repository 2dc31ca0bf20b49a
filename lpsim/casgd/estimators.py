"""scikit-learn estimators over CA-SGD: CASGDClassifier (logistic), CASGDRegressor.

With scikit-learn installed they are ``BaseEstimator`` subclasses (clone, pipelines,
cross-validation, ``check_estimator``); scikit-learn is optional, and without it they keep
the same get_params / set_params / fit / predict / score interface.
"""

from __future__ import annotations

import inspect

import numpy as np

from .data import normalize_rows
from .losses import get_loss
from .recipes import as_recipe
from .solvers import casgd, check_data, check_eta, check_int, diverged

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
        def score(self, X, y):
            """Mean accuracy."""
            return float(np.mean(self.predict(X) == np.asarray(y)))

    class RegressorMixin:
        def score(self, X, y):
            """Coefficient of determination R^2."""
            y = np.asarray(y, np.float64)
            return float(1 - ((y - self.predict(X)) ** 2).sum() / ((y - y.mean()) ** 2).sum())


class _CASGD(BaseEstimator):
    """Shared fit/predict: __init__ stores the parameters, fit validates them (Algorithm 1).

    progress: a tqdm bar over the outer iterations (None: on when n_iter >= 200); it does
    not change the result.  device: None runs the simulator; a torch device ("cuda", "cuda:1")
    runs the native GPU path (:mod:`lpsim.casgd.native`).
    """

    def __init__(self, *, eta=0.5, b=32, s=16, n_iter=100, recipe="A", P=1, normalize=True,
                 random_state=0, progress=None, device=None):
        self.eta, self.b, self.s, self.n_iter = eta, b, s, n_iter
        self.recipe, self.P, self.normalize = recipe, P, normalize
        self.random_state, self.progress, self.device = random_state, progress, device

    def _validate(self, X, y=None, reset=True):
        """(X with rows normalised as configured, y) after scikit-learn's and our checks;
        reset=True in fit (X and y), False in predict (X only, fitted width)."""
        if validate_data is not None:     # scikit-learn's messages, n_features_in_
            kwargs = dict(reset=reset, dtype=(np.float64, np.float32))
            if reset:
                X, y = validate_data(self, X, y, y_numeric=not isinstance(
                    self, ClassifierMixin), **kwargs)
            else:
                X = validate_data(self, X, **kwargs)
        elif not reset and not hasattr(self, "coef_"):
            raise ValueError(f"this {type(self).__name__} is not fitted; call fit(X, y) first")
        X, _ = check_data(X, np.zeros(np.shape(X)[0] if np.ndim(X) == 2 else 0),
                          get_loss("linear"))
        if reset:
            self.n_features_in_ = X.shape[1]
        elif X.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {X.shape[1]} features, but {type(self).__name__} is "
                             f"expecting {self.n_features_in_} features as input")
        return (normalize_rows(X) if self.normalize else X), y

    def _fit(self, X, y, loss):
        """Run :func:`casgd` on validated X; raise if it diverged instead of storing NaN."""
        loss, eta = get_loss(loss), check_eta(self.eta)
        check_int("b", self.b), check_int("s", self.s), check_int("n_iter", self.n_iter)
        X, y = check_data(X, y, loss)
        progress = self.progress if self.progress is not None else self.n_iter >= 200
        with np.errstate(over="ignore", invalid="ignore"):
            res = casgd(X, y, loss=loss, eta=eta, b=self.b, s=self.s, H=self.n_iter,
                        recipe=as_recipe(self.recipe), P=self.P, seed=self.random_state,
                        record=1, progress=progress,
                        backend="cpu" if self.device is None else "cuda", device=self.device)
            curve = np.append(res.loss_curve, np.linalg.norm(res.x))
        if not np.isfinite(curve).all():
            h = min(int(np.argmax(~np.isfinite(curve))), self.n_iter)
            raise diverged(eta, h, self.n_iter, "F(x)")
        self.coef_ = np.asarray(res.x, np.float64)
        self.loss_curve_ = res.loss_curve
        self.n_iter_ = res.iterations
        return self

    def _margins(self, X):
        """Margins X coef_ (rows normalised as in fit)."""
        if validate_data is not None:
            check_is_fitted(self, "coef_")
        X, _ = self._validate(X, reset=False)
        return np.asarray(X, np.float64) @ self.coef_


class CASGDClassifier(ClassifierMixin, _CASGD):
    """Binary logistic regression trained by CA-SGD; any two class labels."""

    def fit(self, X, y):
        """Fit on features X (m x n) and two-class labels y."""
        X, y = self._validate(X, y)
        y = np.asarray(y)
        if validate_data is not None:
            check_classification_targets(y)
            kind = type_of_target(y, input_name="y")
            if kind != "binary":
                raise ValueError("Only binary classification is supported. The type of the "
                                 f"target is {kind} ({np.unique(y).size} classes); accepted: "
                                 "exactly two classes")
        classes = np.unique(y)
        if classes.size != 2:
            raise ValueError(f"y has {classes.size} classes ({classes[:5]!r}); accepted: "
                             "exactly two classes")
        self.classes_ = classes
        return self._fit(X, np.where(y == classes[1], 1.0, -1.0), "logistic")

    def decision_function(self, X):
        """Margins X coef_ (rows normalised as in fit); positive means classes_[1]."""
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
                 normalize=True, random_state=0, progress=None):
        super().__init__(eta=eta, b=b, s=s, n_iter=n_iter, recipe=recipe, P=P,
                         normalize=normalize, random_state=random_state, progress=progress)
        self.loss = loss

    def fit(self, X, y):
        """Fit on features X (m x n) and real (linear) or count (Poisson) targets y."""
        if self.loss not in ("linear", "poisson"):
            raise ValueError(f"loss={self.loss!r} is not accepted; accepted: 'linear', "
                             "'poisson' (use CASGDClassifier for logistic)")
        X, y = self._validate(X, y)
        return self._fit(X, y, self.loss)

    def predict(self, X):
        """Predicted mean: the margin (linear) or exp(margin) (Poisson)."""
        return get_loss(self.loss).mean(self._margins(X))

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.positive_only = self.loss == "poisson"
        return tags
