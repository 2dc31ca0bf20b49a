"""scikit-learn style estimators over CA-SGD: CASGDClassifier (logistic), CASGDRegressor."""

from __future__ import annotations

import numpy as np

from .data import normalize_rows
from .losses import get_loss
from .recipes import as_recipe
from .solvers import casgd, check_data, check_eta, check_int


class _CASGD:
    """Shared fit/predict: parameters stored by __init__, validated by fit (Algorithm 1)."""

    loss = "logistic"

    def __init__(self, *, eta=0.5, b=32, s=16, n_iter=100, recipe="A", P=1, normalize=True,
                 random_state=0, progress=None):
        self.eta, self.b, self.s, self.n_iter = eta, b, s, n_iter
        self.recipe, self.P, self.normalize = recipe, P, normalize
        self.random_state, self.progress = random_state, progress

    def get_params(self, deep=True):
        return {k: getattr(self, k) for k in ("eta", "b", "s", "n_iter", "recipe", "P",
                                              "normalize", "random_state", "progress")}

    def set_params(self, **params):
        for key, value in params.items():
            if key not in self.get_params():
                raise ValueError(f"unknown parameter {key!r}; accepted: "
                                 f"{', '.join(self.get_params())}")
            setattr(self, key, value)
        return self

    def _features(self, X):
        X, _ = check_data(X, np.zeros(np.shape(X)[0] if np.ndim(X) == 2 else 0),
                          get_loss("linear"))
        return normalize_rows(X) if self.normalize else X

    def _fit(self, X, y):
        loss = get_loss(self.loss)
        check_eta(self.eta)
        check_int("b", self.b), check_int("s", self.s), check_int("n_iter", self.n_iter)
        X = self._features(X)
        X, y = check_data(X, y, loss)
        progress = self.progress if self.progress is not None else self.n_iter >= 200
        res = casgd(X, y, loss=loss, eta=self.eta, b=self.b, s=self.s, H=self.n_iter,
                    recipe=as_recipe(self.recipe), P=self.P, seed=self.random_state,
                    record=1, progress=progress)
        self.coef_ = np.asarray(res.x, np.float64)
        self.loss_curve_ = res.loss_curve
        self.n_iter_ = res.iterations
        self.n_features_in_ = X.shape[1]
        return self

    def decision_function(self, X):
        """Margins X coef_ (rows normalised as in fit)."""
        if not hasattr(self, "coef_"):
            raise ValueError(f"this {type(self).__name__} is not fitted; call fit(X, y) first")
        X = self._features(X)
        if X.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {X.shape[1]} features; accepted: {self.n_features_in_} "
                             "as in fit")
        return np.asarray(X, np.float64) @ self.coef_


class CASGDClassifier(_CASGD):
    """Binary logistic regression trained by CA-SGD; any two class labels."""

    loss = "logistic"

    def fit(self, X, y):
        y = np.asarray(y)
        classes = np.unique(y)
        if classes.size != 2:
            raise ValueError(f"y has {classes.size} classes ({classes[:5]!r}); accepted: "
                             "exactly two classes")
        self.classes_ = classes
        return self._fit(X, np.where(y == classes[1], 1.0, -1.0))

    def predict(self, X):
        positive = self.decision_function(X) > 0
        return self.classes_[positive.astype(int)]

    def predict_proba(self, X):
        p = get_loss("logistic").mean(self.decision_function(X))
        return np.stack([1 - p, p], axis=1)

    def score(self, X, y):
        """Mean accuracy."""
        return float(np.mean(self.predict(X) == np.asarray(y)))


class CASGDRegressor(_CASGD):
    """Linear (loss="linear") or Poisson (loss="poisson") regression trained by CA-SGD."""

    def __init__(self, *, loss="linear", **params):
        super().__init__(**params)
        self.loss = loss

    def get_params(self, deep=True):
        return {"loss": self.loss, **super().get_params(deep)}

    def fit(self, X, y):
        if get_loss(self.loss).name not in ("linear", "poisson"):
            raise ValueError(f"loss={self.loss!r} is not accepted; accepted: 'linear', "
                             "'poisson' (use CASGDClassifier for logistic)")
        return self._fit(X, y)

    def predict(self, X):
        """Predicted mean: the margin (linear) or exp(margin) (Poisson)."""
        return get_loss(self.loss).mean(self.decision_function(X))

    def score(self, X, y):
        """Coefficient of determination R^2."""
        y = np.asarray(y, np.float64)
        resid = ((y - self.predict(X)) ** 2).sum()
        return float(1 - resid / ((y - y.mean()) ** 2).sum())
