"""CASGDClassifier / CASGDRegressor as scikit-learn estimators (and without scikit-learn)."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from lpsim.casgd import CASGDClassifier, CASGDRegressor, load_dataset

sklearn = pytest.importorskip("sklearn")
from sklearn.base import clone  # noqa: E402
from sklearn.model_selection import cross_val_score  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402
from sklearn.utils.estimator_checks import check_estimator  # noqa: E402

SMALL = dict(n_iter=10, s=4, b=8)       # keeps check_estimator's ~100 fits near a second


@pytest.fixture(scope="module")
def cancer():
    A, y, _ = load_dataset("breast_cancer")
    return A, np.where(y > 0, "malignant", "benign")


def test_estimators_on_sklearn_datasets(cancer):
    A, labels = cancer
    clf = CASGDClassifier(eta=2.0, b=16, s=8, n_iter=40, recipe="C", progress=False)
    assert clf.fit(A, labels) is clf
    assert clf.score(A, labels) > 0.9
    assert len(clf.loss_curve_) == 41 and clf.loss_curve_[-1] < clf.loss_curve_[0]
    assert clf.coef_.shape == (A.shape[1],)
    A, y, loss = load_dataset("diabetes")
    reg = CASGDRegressor(eta=1.0, b=16, s=8, n_iter=60, progress=False).fit(A, y)
    assert reg.score(A, y) > 0.2
    with pytest.raises(ValueError, match="s=0"):
        CASGDRegressor(s=0).fit(A, y)
    with pytest.raises(ValueError, match="3 classes"):
        CASGDClassifier().fit(A[:3], [0, 1, 2])
    with pytest.raises(ValueError, match="not fitted"):
        CASGDClassifier().predict(A)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.SkipTestWarning")
@pytest.mark.parametrize("estimator", [CASGDClassifier(**SMALL), CASGDRegressor(**SMALL)],
                         ids=["classifier", "regressor"])
def test_check_estimator(estimator):
    failed = [(r["check_name"], r["exception"]) for r in check_estimator(estimator, on_fail=None)
              if r["status"] == "failed"]
    assert failed == []


def test_clone_cross_validation_and_pipeline(cancer):
    A, labels = cancer
    clf = CASGDClassifier(eta=2.0, b=16, s=8, n_iter=20, recipe="C").fit(A, labels)
    copy = clone(clf)                   # same parameters, not fitted
    assert copy.get_params() == clf.get_params() and not hasattr(copy, "coef_")
    np.testing.assert_array_equal(copy.fit(A, labels).coef_, clf.coef_)   # seeded
    scores = cross_val_score(clf, A, labels, cv=3)
    assert scores.shape == (3,) and scores.min() > 0.85
    raw = A * np.linspace(1, 50, A.shape[1])      # unscaled columns: the scaler matters
    pipe = make_pipeline(StandardScaler(), CASGDClassifier(eta=2.0, b=16, s=8, n_iter=20))
    assert pipe.fit(raw, labels).score(raw, labels) > 0.9
    X, y, _ = load_dataset("diabetes")
    reg = make_pipeline(StandardScaler(), CASGDRegressor(eta=1.0, b=16, s=8, n_iter=30))
    assert cross_val_score(reg, X, y, cv=3).mean() > 0.1


def test_diverging_fit_names_eta():
    X, y, _ = load_dataset("diabetes")
    with pytest.raises(ValueError, match=r"diverged with eta=10000\.0: .*accepted: a smaller "
                                         r"step size, e\.g\. eta=2500"):
        CASGDRegressor(eta=1e4, b=16, s=8, n_iter=20).fit(X, y)


def test_progress_bar_on_and_off(cancer, capsys):
    A, labels = cancer
    fits = {}
    for progress in (True, False):
        fits[progress] = CASGDClassifier(b=16, s=4, n_iter=15, progress=progress).fit(A, labels)
        fits[progress].stderr = capsys.readouterr().err
    assert "logistic A" in fits[True].stderr and fits[False].stderr == ""
    np.testing.assert_array_equal(fits[True].coef_, fits[False].coef_)
    assert fits[True].loss_curve_ == fits[False].loss_curve_


def test_estimators_without_sklearn():
    # scikit-learn is optional: blocking its import must leave lpsim.casgd usable
    code = textwrap.dedent("""
        import sys
        sys.modules["sklearn"] = None
        import numpy as np
        from lpsim.casgd import CASGDClassifier, estimators, make_synth
        A, y, _ = make_synth(200, 8, seed=1)
        clf = CASGDClassifier(n_iter=5, s=4, b=8).set_params(eta=1.0)
        print(estimators.validate_data, clf.get_params()["eta"],
              clf.fit(A, y).score(A, y) > 0.5, clf.predict(A).shape)
        try:
            CASGDClassifier().set_params(gamma=1)
        except ValueError as err:
            print(err)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ), check=True).stdout.splitlines()
    assert out[0] == "None 1.0 True (200,)"      # the stand-in base classes ran
    assert out[1].startswith("unknown parameter 'gamma'; accepted: P, b, device, eta")
