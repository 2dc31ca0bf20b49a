"""CASGDClassifier / CASGDRegressor as scikit-learn estimators (and without scikit-learn)."""

import importlib.util
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import scipy.sparse as sp

from lpsim.casgd import (CASGDClassifier, CASGDRegressor, casgd, load_dataset, make_synth,
                         normalize_rows)

sklearn = pytest.importorskip("sklearn")
from sklearn.base import clone  # noqa: E402
from sklearn.metrics import accuracy_score, r2_score  # noqa: E402
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


#: scikit-learn shuffles the weighted rows against the repeated ones: CA-SGD samples rows at
#: random, so the two fits draw other rows (unshuffled they are the same run, bit for bit:
#: test_integer_weights_are_repeated_rows)
SHUFFLED = "the weighted rows are shuffled against the repeated ones: other random rows"
EXPECTED = {"check_sample_weight_equivalence_on_dense_data": SHUFFLED,
            "check_sample_weight_equivalence_on_sparse_data": SHUFFLED}


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.SkipTestWarning")
@pytest.mark.parametrize("estimator", [CASGDClassifier(**SMALL), CASGDRegressor(**SMALL),
                                       CASGDRegressor(loss="poisson", **SMALL)],
                         ids=["classifier", "regressor", "poisson"])
def test_check_estimator(estimator):
    results = check_estimator(estimator, on_fail=None, expected_failed_checks=EXPECTED)
    failed = [(r["check_name"], r["exception"]) for r in results if r["status"] == "failed"]
    assert failed == []
    status = {r["check_name"]: r["status"] for r in results}
    assert {name: status[name] for name in EXPECTED} == dict.fromkeys(EXPECTED, "xfail")
    for name in ("check_sample_weights_shape", "check_estimator_sparse_matrix",
                 "check_estimators_partial_fit_n_features", "check_sample_weights_list"):
        assert status[name] == "passed", name          # the conventions are checked, not skipped


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
        try:                    # once a ZeroDivisionError from numpy's average
            clf.score(A, y, sample_weight=np.zeros(200))
        except ValueError as err:
            print(err)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ), check=True).stdout.splitlines()
    assert out[0] == "None 1.0 True (200,)"      # the stand-in base classes ran
    assert out[1].startswith("unknown parameter 'gamma'; accepted: P, b, device, eta, "
                             "fit_intercept, intercept_scaling, n_iter")
    assert out[2] == ("sample_weight: every weight is 0; accepted: at least one non-zero "
                      "weight (as scikit-learn's metrics)")


# --- issue 16: scikit-learn's conventions -------------------------------------------------
@pytest.fixture(scope="module")
def offset():
    """Linear data whose optimum needs an intercept (y = margin + 2), and a threshold
    classification (x_0 > 1, 16% positive) that no line through the origin separates."""
    A, y, _ = make_synth(1000, 10, loss="linear", seed=2, noise=0.1)
    X = np.random.default_rng(0).standard_normal((1000, 5))
    return A, y + 2.0, X, np.where(X[:, 0] > 1.0, "yes", "no")


def test_fit_intercept_beats_no_intercept(offset):
    A, y, X, labels = offset
    kw = dict(n_iter=60, b=16, s=4, eta=0.5)
    with_, without = (CASGDRegressor(fit_intercept=f, **kw).fit(A, y) for f in (True, False))
    assert with_.score(A, y) > 0.95 and without.score(A, y) < 0
    assert abs(with_.intercept_ - 2.0) < 0.1 and without.intercept_ == 0.0
    assert isinstance(with_.intercept_, float)                 # a scalar, as sklearn's
    kw = dict(n_iter=60, b=16, s=4, eta=2.0, normalize=False)
    with_, without = (CASGDClassifier(fit_intercept=f, **kw).fit(X, labels) for f in (True, False))
    assert with_.score(X, labels) > 0.97 and without.score(X, labels) < 0.84   # < majority
    assert with_.intercept_ < -1


@pytest.mark.parametrize("normalize", [False, True])
def test_decision_function_is_coef_and_intercept(offset, normalize):
    A, y, X, labels = offset
    clf = CASGDClassifier(n_iter=10, b=16, s=4, normalize=normalize).fit(X, labels)
    Xn = normalize_rows(X) if normalize else X
    np.testing.assert_array_equal(clf.decision_function(X), Xn @ clf.coef_ + clf.intercept_)
    # the intercept is the weight of a constant feature c t, the features scaled by t
    # (t = 1/sqrt(1 + c^2) with normalize, else 1): the same run as casgd on those rows
    c = 3.0
    clf = CASGDClassifier(n_iter=10, b=16, s=4, normalize=normalize, intercept_scaling=c,
                          random_state=5).fit(X, labels)
    t = 1 / np.sqrt(1 + c * c) if normalize else 1.0
    Z = np.c_[Xn * t, np.full(len(X), c * t)]
    x = casgd(Z, np.where(labels == "yes", 1.0, -1.0), eta=0.5, b=16, s=4, H=10, seed=5).x
    np.testing.assert_array_equal(clf.coef_, x[:-1] * t)
    assert clf.intercept_ == np.float64(x[-1]) * (c * t)
    if normalize:
        np.testing.assert_allclose(np.linalg.norm(Z, axis=1), 1, rtol=1e-15)   # unit rows
    off = CASGDClassifier(n_iter=10, b=16, s=4, normalize=False, fit_intercept=False,
                          random_state=5).fit(X, labels)
    np.testing.assert_array_equal(off.coef_, casgd(X, np.where(labels == "yes", 1.0, -1.0),
                                                   eta=0.5, b=16, s=4, H=10, seed=5).x)
    for bad in (0, -1.0, np.inf, "1", True, 1e200):    # 1e200: every row scaled to zero
        with pytest.raises(ValueError,
                           match=re.escape(f"intercept_scaling={bad!r} is not accepted")):
            CASGDClassifier(intercept_scaling=bad).fit(X, labels)


def test_sample_weight(offset):
    A, y, X, labels = offset
    kw = dict(n_iter=8, b=8, s=4)
    plain = CASGDClassifier(**kw).fit(X, labels)
    ones = CASGDClassifier(**kw).fit(X, labels, sample_weight=np.ones(len(X)))
    np.testing.assert_array_equal(ones.coef_, plain.coef_)
    assert ones.intercept_ == plain.intercept_
    # integer weights: the fit on each row repeated w_i times in place (zeros: removed)
    w = np.random.default_rng(3).integers(0, 3, len(X))
    weighted = CASGDRegressor(**kw).fit(A, y, sample_weight=w)
    repeated = CASGDRegressor(**kw).fit(np.repeat(A, w, axis=0), np.repeat(y, w))
    np.testing.assert_array_equal(weighted.coef_, repeated.coef_)
    assert weighted.intercept_ == repeated.intercept_
    # zero-weight rows do not influence the fit, whatever they hold
    B, yb = A.copy(), y.copy()
    B[w == 0], yb[w == 0] = 7.0, -100.0
    np.testing.assert_array_equal(CASGDRegressor(**kw).fit(B, yb, sample_weight=w).coef_,
                                  weighted.coef_)
    for bad, match in [(-np.ones(len(A)), r"sample_weight\[0\] = -1\.0 is negative"),
                       (np.ones(3), r"sample_weight has shape \(3,\); accepted: \(1000,\)"),
                       (np.full(len(A), np.nan), r"sample_weight\[0\] = nan")]:
        with pytest.raises(ValueError, match=match):
            CASGDRegressor(**kw).fit(A, y, sample_weight=bad)
        with pytest.raises(ValueError, match=match):
            CASGDRegressor(**kw).partial_fit(A, y, sample_weight=bad)


@pytest.mark.parametrize("fmt", ["csr", "csc", "coo"])
def test_sparse_fit_equals_dense(offset, fmt):
    A, y, X, labels = offset
    X = np.where(np.abs(X) > 0.8, X, 0.0)
    S = sp.csr_matrix(X).asformat(fmt)
    w = np.random.default_rng(4).integers(0, 3, len(X)).astype(float)
    kw = dict(n_iter=6, b=8, s=4, recipe="C")
    dense = CASGDClassifier(**kw).fit(X, labels, sample_weight=w)
    sparse = CASGDClassifier(**kw).fit(S, labels, sample_weight=w)
    np.testing.assert_array_equal(sparse.coef_, dense.coef_)
    assert sparse.intercept_ == dense.intercept_
    np.testing.assert_allclose(sparse.decision_function(S), dense.decision_function(X),
                               rtol=1e-13, atol=1e-15)
    assert (sparse.predict(S) == dense.predict(X)).all()


def test_partial_fit_continues(offset):
    A, y, X, labels = offset
    kw = dict(b=16, s=4, random_state=3)
    with pytest.raises(ValueError, match="classes must be passed on the first call to "
                                         "partial_fit"):
        CASGDClassifier(**kw).partial_fit(X, labels)
    with pytest.raises(ValueError, match=r"y has labels array\(\['yes'\].*outside classes"):
        CASGDClassifier(**kw).partial_fit(X, labels, classes=["no", "other"])
    clf = CASGDClassifier(**kw).partial_fit(X[:500], labels[:500], classes=["no", "yes"])
    assert clf.n_iter_ == 8 and len(clf.loss_curve_) == 9          # ceil(500 / 64) = 8
    # the first call is fit with n_iter = one pass, bit for bit
    np.testing.assert_array_equal(
        clf.coef_, CASGDClassifier(n_iter=8, **kw).fit(X[:500], labels[:500]).coef_)
    first = clf.coef_.copy()
    clf.partial_fit(X[:500], labels[:500])
    # it starts where the first call ended (same data: F before = F after the first call)...
    assert not np.array_equal(clf.coef_, first)
    again = CASGDClassifier(**kw).partial_fit(X[:500], labels[:500], classes=["no", "yes"])
    assert clf.loss_curve_[0] == again.loss_curve_[-1]
    # ...and is no restart: a fresh fit on the same data does not reach the second call's loss
    assert clf.loss_curve_[-1] < again.loss_curve_[-1]
    clf.partial_fit(X[500:], labels[500:])
    replay = CASGDClassifier(**kw)                                  # reproducible
    for lo, hi in ((0, 500), (0, 500), (500, 1000)):
        replay.partial_fit(X[lo:hi], labels[lo:hi], classes=["no", "yes"])
    np.testing.assert_array_equal(replay.coef_, clf.coef_)
    assert replay.intercept_ == clf.intercept_
    with pytest.raises(ValueError, match=r"classes=array\(\['a', 'no'\]"):
        clf.partial_fit(X, labels, classes=["a", "no"])
    with pytest.raises(ValueError, match=r"y has labels array\(\['maybe'\].*outside classes"):
        clf.partial_fit(X[:2], ["maybe", "no"])
    with pytest.raises(ValueError, match="X has 4 features"):
        clf.partial_fit(X[:, :4], labels)
    # the regressor takes no classes; partial_fit after fit continues from fit's weights
    reg = CASGDRegressor(n_iter=5, b=16, s=4).fit(A, y)
    end = reg.loss_curve_[-1]
    assert reg.partial_fit(A, y).loss_curve_[0] == end and reg.n_iter_ == 16


def test_verbose_and_silence(offset, capsys):
    A, y, X, labels = offset
    CASGDClassifier(n_iter=3, b=8, s=4).fit(X, labels)
    CASGDRegressor(n_iter=3, b=8, s=4).fit(A, y).partial_fit(A, y)
    assert capsys.readouterr() == ("", "")                         # silent by default
    reg = CASGDRegressor(n_iter=3, b=8, s=4, verbose=1).fit(A, y)
    out = capsys.readouterr()
    lines = out.out.splitlines()
    assert len(lines) == 4 and lines[0].startswith("-- Outer iteration 0/3: F(x) = ")
    assert f"F(x) = {reg.loss_curve_[-1]:.8g}" in lines[-1] and out.err == ""


# --- the fallback path (no scikit-learn) against the scikit-learn path, in one process ------
@pytest.fixture(scope="module")
def fallback():
    """A private copy of lpsim.casgd.estimators run with scikit-learn's imports blocked: the
    fallback path beside the scikit-learn one, with no other module reloaded or replaced."""
    from lpsim.casgd import estimators
    spec = importlib.util.spec_from_file_location("lpsim.casgd._estimators_without_sklearn",
                                                  estimators.__file__)
    module = importlib.util.module_from_spec(spec)
    with pytest.MonkeyPatch.context() as mp:
        for name in ["sklearn"] + [n for n in sys.modules if n.startswith("sklearn.")]:
            mp.setitem(sys.modules, name, None)          # `from sklearn... import` fails
        spec.loader.exec_module(module)
    assert module.validate_data is None and estimators.validate_data is not None
    return module


TINY = dict(n_iter=3, s=2, b=4)


@pytest.fixture(scope="module")
def tiny():
    X = np.random.default_rng(0).standard_normal((20, 3))
    return X, np.where(X[:, 0] > 0, "yes", "no"), X @ [1.0, 2.0, 3.0]


def test_fallback_accepts_array_likes(fallback, tiny):
    # lists (and bool / object entries) are array-likes to validate_data: the same fits
    X, labels, y = tiny
    for module in (fallback, sys.modules["lpsim.casgd.estimators"]):
        clf = module.CASGDClassifier(**TINY).fit(X.tolist(), labels.tolist())
        reg = module.CASGDRegressor(**TINY).fit(X.tolist(), y.tolist())
        ref_clf = CASGDClassifier(**TINY).fit(X, labels)
        ref_reg = CASGDRegressor(**TINY).fit(X, y)
        np.testing.assert_array_equal(clf.coef_, ref_clf.coef_)
        np.testing.assert_array_equal(reg.coef_, ref_reg.coef_)
        np.testing.assert_array_equal(clf.predict(X.tolist()), ref_clf.predict(X))
        np.testing.assert_array_equal(clf.decision_function(X.tolist()),
                                      ref_clf.decision_function(X))
        np.testing.assert_array_equal(reg.predict(X.tolist()), ref_reg.predict(X))
        assert clf.score(X.tolist(), labels.tolist()) == ref_clf.score(X, labels)
        assert reg.score(X.tolist(), y.tolist()) == ref_reg.score(X, y)
        for other in (X > 0, (X > 0).astype(object)):
            np.testing.assert_array_equal(module.CASGDRegressor(**TINY).fit(other, y).coef_,
                                          CASGDRegressor(**TINY).fit(other, y).coef_)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_fallback_refuses_non_finite_labels(fallback, tiny, bad):
    # scikit-learn refuses NaN/inf in y; the fallback took NaN for a third class
    X, labels, y = tiny
    yc = (labels == "yes").astype(float)
    yc[3] = bad
    with pytest.raises(ValueError, match="Input y contains"):
        CASGDClassifier(**TINY).fit(X, yc)
    match = re.escape(f"y[3] = {bad!r}: NaN/inf; accepted: finite labels")
    with pytest.raises(ValueError, match=match):
        fallback.CASGDClassifier(**TINY).fit(X, yc)
    with pytest.raises(ValueError, match=match):
        fallback.CASGDClassifier(**TINY).partial_fit(X, yc, classes=[0.0, 1.0])


def test_fallback_r2_is_r2_score(fallback, tiny):
    # r2_score (force_finite=True): constant y gives 1.0 predicted exactly, 0.0 otherwise
    # (the fallback gave NaN and -inf); fewer than two samples give NaN and a warning
    X, labels, y = tiny
    const = np.full(len(X), 2.5)
    w = np.arange(len(X), dtype=float)
    for module in (fallback, sys.modules["lpsim.casgd.estimators"]):
        reg = module.CASGDRegressor(**TINY).fit(X, y)
        assert reg.score(X, const) == r2_score(const, reg.predict(X)) == 0.0
        assert reg.score(X, y) == r2_score(y, reg.predict(X))
        assert reg.score(X, y, sample_weight=w) == r2_score(y, reg.predict(X), sample_weight=w)
        with pytest.warns(UserWarning, match="less than two samples"):
            assert np.isnan(reg.score(X[:1], y[:1]))
        reg.coef_, reg.intercept_ = np.zeros(3), 2.5          # predicts 2.5 exactly
        assert reg.score(X, const) == r2_score(const, reg.predict(X)) == 1.0
        clf = module.CASGDClassifier(**TINY).fit(X, labels)
        assert clf.score(X, labels, sample_weight=w) == accuracy_score(
            labels, clf.predict(X), sample_weight=w)


def test_fallback_score_checks_y(fallback, tiny):
    # one finite label per row of X, as the metrics check (the fallback broadcast y)
    X, labels, y = tiny
    reg = fallback.CASGDRegressor(**TINY).fit(X, y)
    clf = fallback.CASGDClassifier(**TINY).fit(X, labels)
    for est, target in ((reg, y), (clf, labels)):
        for short in (target[:1], target[:-1]):
            with pytest.raises(ValueError, match=re.escape(
                    f"y has shape ({len(short)},) for 20 rows of X; accepted: one label per "
                    "row")):
                est.score(X, short)
    bad = y.copy()
    bad[2] = np.nan
    with pytest.raises(ValueError, match=r"y\[2\] = nan: NaN/inf; accepted: finite labels"):
        reg.score(X, bad)
    with pytest.raises(ValueError, match=r"sample_weight has shape \(3,\); accepted: \(20,\)"):
        reg.score(X, y, sample_weight=np.ones(3))


def test_fallback_checks_name_X(fallback, tiny):
    # the fallback's messages name X (not check_data's A), as scikit-learn's do
    X, labels, y = tiny
    reg = fallback.CASGDRegressor(**TINY)
    with pytest.raises(ValueError, match=r"X has shape \(20,\); accepted: a 2-D array .*"
                                         r"X\.reshape\(-1, 1\)"):
        reg.fit(X[:, 0], y)
    bad = X.copy()
    bad[1, 2] = np.inf
    with pytest.raises(ValueError, match=r"X\[1, 2\] = inf: NaN/inf; accepted: finite"):
        reg.fit(bad, y)
    with pytest.raises(ValueError, match=r"y has 19 labels for 20 rows of X; accepted: one "
                                         "label per row"):
        reg.fit(X, y[:-1])
    with pytest.raises(ValueError, match=r"X has dtype complex128 .*accepted: real numbers"):
        reg.fit(X + 1j, y)
    with pytest.raises(ValueError, match="CASGDRegressor requires y to be passed, but the "
                                         "target y is None"):
        reg.fit(X, None)
    with pytest.raises(ValueError, match=r"y has shape \(20, 2\); accepted: a 1-D array"):
        reg.fit(X, np.c_[y, y])
    with pytest.raises(ValueError, match=r"X has shape \(3,\); accepted: a 2-D array"):
        reg.fit(X, y).predict(X[0])


def test_fallback_label_types(fallback, tiny):
    # check_classification_targets' refusals: continuous, mixed or non-string object, bytes
    X, labels, y = tiny
    mixed = labels.astype(object)
    mixed[0] = 1
    for module in (fallback, sys.modules["lpsim.casgd.estimators"]):
        clf = module.CASGDClassifier(**TINY)
        with pytest.raises(ValueError, match=r"y\[0\] = 0\.5 is not a class label \(y is "
                                             r"continuous\)|Unknown label type: continuous"):
            clf.fit(X, np.r_[0.5, np.zeros(19)])
        with pytest.raises(ValueError, match=r"y has the label 1 of type int in an object "
                                             r"array|Unknown label type: unknown"):
            clf.fit(X, mixed)
        with pytest.raises(TypeError, match="bytes"):
            clf.fit(X, labels.astype(bytes))
        np.testing.assert_array_equal(clf.fit(X, labels.astype(object)).classes_,
                                      ["no", "yes"])


# --- issue 35: every parameter checked by name in fit, before anything changes ------------
@pytest.mark.parametrize("params,name", [
    (dict(fit_intercept="no"), "fit_intercept"), (dict(normalize="yes"), "normalize"),
    (dict(fit_intercept=1), "fit_intercept"), (dict(progress="no"), "progress"),
    (dict(verbose=-1), "verbose"), (dict(verbose="loud"), "verbose"),
    (dict(verbose=1.5), "verbose"), (dict(device="gpu0"), "device"),
    (dict(device=3.5), "device"), (dict(b=0), "b"), (dict(n_iter=2.0), "n_iter"),
    (dict(P=0), "P"), (dict(random_state=-1), "random_state"),
    (dict(fit_intercept=True, intercept_scaling="big"), "intercept_scaling"),
])
@pytest.mark.parametrize("module", ["sklearn", "fallback"])
def test_bad_parameters_are_named_before_fit_changes_anything(fallback, tiny, params, name,
                                                              module):
    X, labels, y = tiny
    mod = fallback if module == "fallback" else sys.modules["lpsim.casgd.estimators"]
    for est, target, kw in ((mod.CASGDClassifier, labels, {}), (mod.CASGDRegressor, y, {})):
        model = est(**{**TINY, **params})
        with pytest.raises(ValueError, match=rf"\b{name}={re.escape(repr(params[name]))}"):
            model.fit(X, target)
        assert not hasattr(model, "n_features_in_") and not hasattr(model, "classes_")
        with pytest.raises(TypeError):      # scikit-learn's InvalidParameterError: both
            model.partial_fit(X, target, **({"classes": ["no", "yes"]}
                                            if target is labels else {}))
        assert not hasattr(model, "coef_")


@pytest.mark.parametrize("module", ["sklearn", "fallback"])
def test_a_refused_fit_leaves_a_fitted_estimator_as_it_was(fallback, tiny, module):
    """Data refused after validation began (weights, one class, labels outside classes)
    leaves n_features_in_, classes_ and the weights a later partial_fit continues from."""
    X, labels, y = tiny
    mod = fallback if module == "fallback" else sys.modules["lpsim.casgd.estimators"]
    X3 = np.hstack([X, X[:, :1]])       # another feature count
    for est, target, bad_targets in (
            (mod.CASGDClassifier, labels, (np.array(["a", "b"] * (len(labels) // 2)),
                                           np.zeros(len(labels)))),
            (mod.CASGDRegressor, y, (y,))):
        model = est(**TINY).fit(X, target)
        before = {k: v for k, v in vars(model).items()}
        pred = model.predict(X)
        for bad in bad_targets:
            with pytest.raises(ValueError):
                model.fit(X3, bad[:X3.shape[0]], sample_weight=-np.ones(X3.shape[0]))
            with pytest.raises(ValueError):
                model.partial_fit(X3, bad[:X3.shape[0]])
        assert vars(model).keys() == before.keys()
        for k, v in before.items():
            assert np.array_equal(np.asarray(vars(model)[k], object), np.asarray(v, object)), k
        np.testing.assert_array_equal(model.predict(X), pred)


def test_valid_flags_of_numpy_types_are_taken(tiny):
    X, labels, _ = tiny
    a = CASGDClassifier(**TINY, fit_intercept=np.bool_(False), normalize=np.bool_(True),
                        verbose=np.int64(0), progress=np.bool_(False)).fit(X, labels)
    b = CASGDClassifier(**TINY, fit_intercept=False).fit(X, labels)
    np.testing.assert_array_equal(a.coef_, b.coef_)


def test_predict_checks_the_loss_it_was_given():
    """A loss changed after fit (set_params) once changed predict's mean silently (the
    regressor's predict gave logistic probabilities); predict refuses it by name."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 3))
    reg = CASGDRegressor(**SMALL).fit(X, X[:, 0])
    before = reg.predict(X[:3])
    for bad in ("logistic", "bogus", ["linear"]):
        reg.set_params(loss=bad)
        with pytest.raises(ValueError, match=rf"loss={re.escape(repr(bad))} is not accepted; "
                                             r"accepted: 'linear', 'poisson'"):
            reg.predict(X[:3])
    np.testing.assert_array_equal(reg.set_params(loss="linear").predict(X[:3]), before)


@pytest.mark.parametrize("recipe", ["e8m0fnu", "fp(4,3,0,fnu)"])
def test_an_unsigned_recipe_format_is_refused_by_name(recipe):
    """An unsigned format (no zero, no negatives) made every weight NaN at once and the fit
    blamed the step size; refused when the recipe is made."""
    with pytest.raises(ValueError, match="holds no negative values and no zero"):
        CASGDClassifier(recipe=recipe, **SMALL).fit(np.eye(8), [0, 1] * 4)
