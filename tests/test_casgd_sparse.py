"""CA-SGD data conventions: LIBSVM files through scikit-learn, scipy.sparse input (the same
bits as dense), and sample_weight as weighted row sampling."""

import bz2
import gzip

import numpy as np
import pytest
import scipy.sparse as sp
from scipy import stats

from lpsim.casgd import RECIPES, Slot, casgd, load_libsvm, make_synth, normalize_rows, sgd
from lpsim.casgd.sampling import PhiloxIndices, WeightedIndices
from lpsim.casgd.solvers import IndexStream

pytest.importorskip("sklearn")

TEXT = "# a comment\n+1 qid:3 1:0.5 3:-2\n-1 qid:3 2:1e-1  # tail\n\n1 qid:4 4:3\n"
DENSE = np.array([[0.5, 0, -2, 0], [0, 0.1, 0, 0], [0, 0, 0, 3]])


@pytest.fixture(scope="module")
def data():
    A, y, _ = make_synth(200, 24, seed=3)
    A = np.where(np.abs(A) > 0.25, A, 0).astype(np.float32)     # ~70% zeros
    return A, y


# --- LIBSVM files ---------------------------------------------------------------------------
@pytest.mark.parametrize("opener,suffix", [(open, ".svm"), (bz2.open, ".svm.bz2"),
                                           (gzip.open, ".svm.gz")])
def test_libsvm_plain_and_compressed_with_qid(tmp_path, opener, suffix):
    path = tmp_path / ("data" + suffix)
    with opener(path, "wt") as fh:
        fh.write(TEXT)
    A, y = load_libsvm(path)
    assert sp.issparse(A) and A.format == "csr" and A.dtype == np.float32
    np.testing.assert_array_equal(A.toarray(), DENSE.astype(np.float32))
    np.testing.assert_array_equal(y, [1, -1, 1])
    A, y, qid = load_libsvm(path, query_id=True, dense=True, dtype=np.float64)
    assert isinstance(A, np.ndarray) and A.dtype == np.float64
    np.testing.assert_array_equal(A, DENSE)
    np.testing.assert_array_equal(qid, [3, 3, 4])
    assert load_libsvm(path, n_features=6)[0].shape == (3, 6)


def test_libsvm_zero_and_one_based(tmp_path):
    path = tmp_path / "zero.svm"
    path.write_text("1 0:2 2:5\n-1 1:1\n")
    A, _ = load_libsvm(path, zero_based=True)
    np.testing.assert_array_equal(A.toarray(), [[2, 0, 5], [0, 1, 0]])
    np.testing.assert_array_equal(load_libsvm(path, zero_based="auto")[0].toarray(),
                                  A.toarray())
    with pytest.raises(ValueError, match=r"zero\.svm'.*index 0.*1-based"):
        load_libsvm(path)                        # LIBSVM's own convention: 1-based
    one = tmp_path / "one.svm"
    one.write_text("1 1:2 3:5\n-1 2:1\n")
    np.testing.assert_array_equal(load_libsvm(one)[0].toarray(), A.toarray())
    with pytest.raises(ValueError, match=r"zero_based='yes' is not accepted; accepted: True"):
        load_libsvm(one, zero_based="yes")


@pytest.mark.parametrize("text,match", [
    ("1 1:0.5\n-1 2:x\n", r"could not convert"),
    ("yes 1:1\n", r"could not convert"),
    ("1 3:1 1:2\n", r"sorted and unique"),
    ("1 1:nan\n", r"A\[0, 0\] = nan: NaN/inf"),
    ("1 1:1\n1 2:inf\n", r"A\[1, 1\] = inf: NaN/inf"),
    ("nan 1:1\n", r"label nan of row 0 is not a finite number"),
    ("# only a comment\n\n", r"has no data lines.*accepted: lines"),
])
def test_libsvm_errors_name_the_file(tmp_path, text, match):
    bad = tmp_path / "bad.svm"
    bad.write_text(text)
    with pytest.raises(ValueError, match=match) as err:
        load_libsvm(bad)
    assert str(bad) in str(err.value)
    with pytest.raises(FileNotFoundError, match="missing.svm"):
        load_libsvm(tmp_path / "missing.svm")


def test_libsvm_file_trains_sparse(tmp_path, data):
    from sklearn.datasets import dump_svmlight_file
    A, y = data
    path = tmp_path / "train.svm"
    dump_svmlight_file(A, y, str(path), zero_based=False)
    As, ys = load_libsvm(path)
    kw = dict(eta=0.5, b=4, s=4, H=3, recipe="C", seed=1)
    np.testing.assert_array_equal(casgd(As, ys, **kw).x, casgd(As.toarray(), ys, **kw).x)


# --- sparse input: the same bits as dense ---------------------------------------------------
STOCHASTIC_A = RECIPES["C"].replace(u_A=Slot("bf16", "stochastic"))


@pytest.mark.parametrize("recipe", ["A", "C", "I", STOCHASTIC_A], ids=["A", "C", "I", "C+SR"])
@pytest.mark.parametrize("fmt", ["csr", "csc", "coo"])
def test_sparse_equals_dense(data, recipe, fmt):
    A, y = data
    S = sp.csr_matrix(A).asformat(fmt)
    before = S.copy()
    kw = dict(eta=0.5, b=4, s=4, H=4, recipe=recipe, seed=2, P=2, record=[0, 4])
    dense, sparse = casgd(A, y, **kw), casgd(S, y, **kw)
    np.testing.assert_array_equal(sparse.x, dense.x)
    assert np.linalg.norm(dense.x) > 0.01
    # F(x): sparse products skip the zeros, so the recorded losses agree to float64 rounding
    np.testing.assert_allclose(sparse.loss_curve, dense.loss_curve, rtol=1e-13)
    assert (S != before).nnz == 0                      # the input is left as it was
    step = dict(eta=0.5, b=4, steps=5, recipe=recipe, seed=2, sampler="philox")
    np.testing.assert_array_equal(sgd(S, y, **step).x, sgd(A, y, **step).x)


def test_casgd_step_takes_sparse_rows(data):
    from lpsim.casgd import casgd_step
    A, y = data
    x0 = np.linspace(-1, 1, A.shape[1])
    for recipe in ("C", STOCHASTIC_A):
        np.testing.assert_array_equal(
            casgd_step(sp.csr_matrix(A[:12]), y[:12], x0, 0.5, 4, 3, recipe, seed=3),
            casgd_step(A[:12], y[:12], x0, 0.5, 4, 3, recipe, seed=3))


def test_sparse_input_is_never_densified_whole(data):
    A, y = data
    b, s = 4, 4

    class Guarded(sp.csr_matrix):
        def toarray(self, *args, **kwargs):     # only blocks of sampled rows
            assert self.shape[0] <= s * b, f"densified {self.shape[0]} rows"
            return super().toarray(*args, **kwargs)

    S = Guarded(A)
    kw = dict(eta=0.5, b=b, s=s, H=3, recipe="C", seed=4, record=3)
    np.testing.assert_array_equal(casgd(S, y, **kw).x, casgd(A, y, **kw).x)
    np.testing.assert_array_equal(casgd(S, y, recipe=STOCHASTIC_A, H=2, b=b, s=s).x,
                                  casgd(A, y, recipe=STOCHASTIC_A, H=2, b=b, s=s).x)


def test_sparse_duplicates_integers_and_bad_values(data):
    A, y = data
    coo = sp.coo_matrix(A)                 # every entry split in two: duplicates are summed
    split = sp.coo_matrix((np.r_[coo.data / 2, coo.data / 2], (np.r_[coo.row, coo.row],
                                                               np.r_[coo.col, coo.col])),
                          shape=A.shape)
    kw = dict(eta=0.5, b=4, s=4, H=2, recipe="fp64", seed=5)
    np.testing.assert_array_equal(casgd(split, y, **kw).x, casgd(split.toarray(), y, **kw).x)
    ints = sp.csr_matrix((np.abs(A) > 0.5).astype(np.int64))
    np.testing.assert_array_equal(casgd(ints, y, **kw).x, casgd(ints.toarray(), y, **kw).x)
    bad = sp.csr_matrix(A)
    bad.data[7] = np.nan
    row, col = bad.nonzero()
    with pytest.raises(ValueError, match=rf"A\[{row[7]}, {col[7]}\] = nan: NaN/inf"):
        casgd(bad, y, H=1)
    with pytest.raises(ValueError, match=r"A has shape \(0, 3\)"):
        casgd(sp.csr_matrix((0, 3)), np.zeros(0), H=1)
    with pytest.raises(ValueError, match="200 rows"):
        casgd(sp.csr_matrix(A), y[:5], H=1)


def test_normalize_rows_sparse_equals_dense():
    rng = np.random.default_rng(1)
    for dtype, n in [(np.float32, 37), (np.float64, 300)]:
        X = (rng.standard_normal((60, n)) * 10.0 ** rng.uniform(-3, 3, (60, 1))).astype(dtype)
        X[rng.random(X.shape) < 0.8] = 0
        X[5] = 0                                          # a zero row stays zero
        for S in (sp.csr_matrix(X), sp.csc_array(X)):
            Z = normalize_rows(S)
            assert Z.format == "csr" and Z.dtype == dtype
            np.testing.assert_array_equal(Z.toarray(), normalize_rows(X))
        np.testing.assert_array_equal(S.toarray(), X)        # copy=True left it alone
        S = sp.csr_matrix(X)
        assert normalize_rows(S, copy=False) is S
        np.testing.assert_array_equal(S.toarray(), normalize_rows(X))
    with pytest.raises(TypeError, match=r"copy=False\) cannot scale a csc"):
        normalize_rows(sp.csc_matrix(X), copy=False)


# --- sample_weight ----------------------------------------------------------------------
@pytest.mark.parametrize("sampler", ["numpy", "philox"])
def test_unit_weights_are_the_unweighted_run(data, sampler):
    A, y = data
    kw = dict(eta=0.5, b=4, s=4, H=4, recipe="C", seed=6, record=4, sampler=sampler)
    plain, ones = casgd(A, y, **kw), casgd(A, y, sample_weight=np.ones(len(y)), **kw)
    np.testing.assert_array_equal(ones.x, plain.x)
    assert ones.loss_curve == plain.loss_curve


@pytest.mark.parametrize("sampler", ["numpy", "philox"])
def test_integer_weights_equal_repeated_rows(data, sampler):
    A, y = data
    w = np.random.default_rng(7).integers(0, 4, len(y))      # zeros included
    kw = dict(eta=0.5, b=4, s=4, H=4, recipe="C", seed=8, record=4, sampler=sampler)
    weighted = casgd(A, y, sample_weight=w, **kw)
    repeated = casgd(np.repeat(A, w, axis=0), np.repeat(y, w), **kw)
    np.testing.assert_array_equal(weighted.x, repeated.x)
    np.testing.assert_allclose(weighted.loss_curve, repeated.loss_curve, rtol=1e-13)
    keep = w > 0                      # zero weights: the run without those rows, bit for bit
    zero_one = casgd(A, y, sample_weight=keep.astype(float), **kw)
    np.testing.assert_array_equal(zero_one.x, casgd(A[keep], y[keep], **kw).x)
    # the rows without weight never reach the fit: changing them changes nothing
    B, yb = A.copy(), y.copy()
    B[~keep] = 100.0
    yb[~keep] *= -1
    np.testing.assert_array_equal(casgd(B, yb, sample_weight=w, **kw).x, weighted.x)


def test_real_weights_sample_in_proportion():
    # chi-square goodness of fit of 40,000 draws to w / W: false-alarm rate 1e-3 per sampler
    w = np.array([0.5, 1.5, 0.0, 2.25, 0.75, 1e-3])
    for make in (lambda k: IndexStream(k, 3), lambda k: PhiloxIndices(k, 3)):
        rows = WeightedIndices(w, make).take(40000)
        counts = np.bincount(rows, minlength=w.size)
        assert counts[2] == 0
        expected = 40000 * w / w.sum()
        live = w > 0
        assert stats.chisquare(counts[live], expected[live]).pvalue > 1e-3
    # a power-of-two scale of the weights is the same draw (t and the cumulative sums scale
    # exactly), as is any scale of integer weights in the same run
    np.testing.assert_array_equal(WeightedIndices(w * 8, make).take(100),
                                  WeightedIndices(w, make).take(100))
    # so are weights down to the least subnormal: W / 2**53 no longer underflows (equal
    # weights of 5e-324 drew row 0 alone)
    tiny = np.full(40, 5e-324)
    np.testing.assert_array_equal(WeightedIndices(tiny, make).take(400),
                                  WeightedIndices(np.full(40, 0.5), make).take(400))
    assert np.unique(WeightedIndices(tiny, make).take(400)).size == 40
    np.testing.assert_array_equal(WeightedIndices(w * 2.0 ** -1000, make).take(100),
                                  WeightedIndices(w, make).take(100))


@pytest.mark.parametrize("weights,match", [
    (-np.ones(200), r"sample_weight\[0\] = -1\.0 is negative; accepted: weights >= 0"),
    (np.ones(199), r"sample_weight has shape \(199,\); accepted: \(200,\)"),
    (np.ones((200, 1)), r"sample_weight has shape \(200, 1\)"),
    (np.r_[np.ones(199), np.nan], r"sample_weight\[199\] = nan: NaN/inf; accepted: finite"),
    (np.r_[np.inf, np.ones(199)], r"sample_weight\[0\] = inf"),
    (np.zeros(200), r"sample_weight is zero for every row; accepted: weights >= 0 with at"),
    (np.full(200, 1e308), r"sample_weight sums to inf; accepted: weights with a finite sum"),
    (np.full(200, "a"), r"sample_weight has dtype <U1"),
])
def test_bad_sample_weight_is_named(data, weights, match):
    A, y = data
    with pytest.raises(ValueError, match=match):
        casgd(A, y, H=1, sample_weight=weights)
    with pytest.raises(ValueError, match=match):
        sgd(A, y, steps=1, sample_weight=weights)


def test_verbose_prints_recorded_iterations(data, capsys):
    A, y = data
    quiet = casgd(A, y, H=3, b=4, s=4, record=1)
    assert capsys.readouterr() == ("", "")
    loud = casgd(A, y, H=3, b=4, s=4, record=1, verbose=1)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == [f"-- Outer iteration {h}/3"
                                                      for h in range(4)]
    assert f"F(x) = {loud.loss_curve[-1]:.8g}," in lines[-1]
    np.testing.assert_array_equal(quiet.x, loud.x)
