"""CA-SGD solvers, recipes, data, estimators and cost model (lpsim.casgd)."""

import re

import numpy as np
import pytest

import lpsim
from lpsim.casgd import (RECIPES, SLOTS, Recipe, Slot, casgd, cost_model, make_synth,
                         normalize_rows, sgd)
from lpsim.casgd.recipes import Rounder, _slot_matmul


@pytest.fixture(scope="module")
def data():
    return {loss: make_synth(600, 40, loss=loss, seed=5)[:2]
            for loss in ("logistic", "linear", "poisson")}


@pytest.mark.parametrize("loss", ["logistic", "linear", "poisson"])
@pytest.mark.parametrize("b,s", [(1, 5), (4, 3), (8, 8), (3, 1)])
def test_fp64_casgd_equals_sgd(data, loss, b, s):
    A, y = data[loss]
    H = 4
    ca = casgd(A, y, loss=loss, eta=0.7, b=b, s=s, H=H, recipe="fp64", seed=11, P=2).x
    ref = sgd(A, y, loss=loss, eta=0.7, b=b, steps=H * s, recipe="fp64", seed=11).x
    assert np.linalg.norm(ca - ref) <= 1e-12 * np.linalg.norm(ref)
    assert np.linalg.norm(ref) > 1e-3   # the run moved


def test_different_samples_differ(data):
    A, y = data["logistic"]
    a = casgd(A, y, eta=0.7, b=4, s=4, H=3, recipe="fp64", seed=1).x
    b = casgd(A, y, eta=0.7, b=4, s=4, H=3, recipe="fp64", seed=2).x
    assert np.linalg.norm(a - b) > 1e-6 * np.linalg.norm(a)


def test_table3_recipes():
    sym = {"f": "fp32", "t": "tf32", "h": "fp16", "b": "bf16"}
    table = {"u_A": "fbbbhhfhb", "u_c": "ffffffthb", "u_sigma": "fffffffhb",
             "u_AR_r": "ffbbhhfhb", "u_AR_G": "fffbfffhb", "u_x": "fffffffhb"}
    for slot, column in table.items():
        for key, symbol in zip("ABCDEFGHI", column):
            assert getattr(RECIPES[key], slot).fmt == lpsim.parse_format(sym[symbol]), (key, slot)
    kernels = {"A": ("fp32", "fp32"), "C": ("bf16", "fp32"), "E": ("fp16", "fp32"),
               "F": ("fp16", "fp16"), "G": ("tf32", "fp32"), "H": ("fp16", "fp16"),
               "I": ("bf16", "fp32")}
    for key, (fin, acc) in kernels.items():
        for slot in ("u_G", "u_r", "u_g"):
            s = getattr(RECIPES[key], slot)
            assert (str(s.fmt), str(s.acc_fmt)) == (str(lpsim.parse_format(fin)),
                                                    str(lpsim.parse_format(acc)))
    assert RECIPES["B"].u_G.fmt == lpsim.parse_format("fp32")
    assert len(SLOTS) == 9
    # Table 3 caption: u_c is a unit roundoff (every correction operation in its format), not
    # a kernel row; Table 1: the margin r leaves its kernel in the 16-bit input format
    margin_out = {"A": "fp32", "C": "bf16", "D": "bf16", "E": "fp16", "F": "fp16",
                  "G": "fp32", "H": "fp16", "I": "bf16"}
    for key, out in margin_out.items():
        recipe = RECIPES[key]
        assert recipe.u_c.fmt == recipe.u_c.acc_fmt == recipe.u_c.out_fmt, key
        assert recipe.u_r.out_fmt == lpsim.parse_format(out), key
        for slot in (recipe.u_G, recipe.u_g):
            assert slot.out_fmt == slot.acc_fmt, key      # "FP32 accum/out"


def test_unit_roundoff_rows_reject_accumulators():
    with pytest.raises(ValueError, match=r"u_c=Slot\('bf16', acc='fp32'\).*accepted"):
        RECIPES["C"].replace(u_c=Slot("bf16", acc="fp32"))
    with pytest.raises(ValueError, match="u_x=.*unit roundoff"):
        RECIPES["C"].replace(u_x=Slot("fp32", out="bf16"))


def test_correction_accumulates_at_u_c():
    # 2048 + 1 + 1 stagnates at 2048 with 11-bit TF32/FP16 sums and 256 + 1 + 1 at 256 in
    # BF16, but not in FP32: recipes G, H, I round the whole correction to u_c
    for key, big in (("G", 2048.0), ("H", 2048.0), ("I", 256.0), ("C", None)):
        G = np.array([[big or 2048.0, 1.0, 1.0]], np.float32)
        got = _slot_matmul(G, np.ones(3, np.float32), RECIPES[key].u_c, Rounder())
        np.testing.assert_array_equal(got, [big or 2050.0])


def test_stochastic_kernel_slots_draw_fresh_bits():
    rng = np.random.default_rng(0)
    A = rng.standard_normal((64, 8)).astype(np.float32)
    x = rng.standard_normal(8).astype(np.float32)
    slot = Slot("bf16", "stochastic", acc="fp32", out="bf16")
    rnd = Rounder(seed=11)
    exact = lpsim.quantize(A, "bf16") @ lpsim.quantize(x, "bf16")
    for stream in (1, 2, 3):          # call k rounds with stream k of (seed, stream)
        want = lpsim.quantize(exact, "bf16", "stochastic", seed=11, stream=stream)
        np.testing.assert_array_equal(_slot_matmul(A, x, slot, rnd), want)
    assert rnd.stream == 3
    # 1 + 2^-8 lies halfway between the bf16 neighbours 1 and 1 + 2^-7: 40 calls give both,
    # for the FP32-accumulate kernel and for a single-format (u_c-like) slot.  With a fixed
    # seed this is deterministic; for a random seed it would fail with probability 2^-39.
    half = np.array([[1.0, 2.0 ** -8]], np.float32)
    for stochastic in (slot, Slot("bf16", "stochastic")):
        seen = {float(_slot_matmul(half, np.ones(2, np.float32), stochastic, rnd)[0])
                for _ in range(40)}
        assert seen == {1.0, 1.0 + 2.0 ** -7}


def test_slot_matmul_fp32_accumulator_model():
    rng = np.random.default_rng(0)
    A = rng.standard_normal((5, 7)).astype(np.float32)
    x = rng.standard_normal(7).astype(np.float32)
    got = _slot_matmul(A, x, Slot("bf16", acc="fp32"), Rounder())
    want = lpsim.quantize(A, "bf16") @ lpsim.quantize(x, "bf16")
    np.testing.assert_array_equal(got, want)
    got16 = _slot_matmul(A, x, Slot("bf16", acc="fp32", out="bf16"), Rounder())
    np.testing.assert_array_equal(got16, lpsim.quantize(want, "bf16"))


def test_ha_slot_accumulates_in_fp16():
    # Recipe F's "ha": FP16 products accumulated in FP16, so 2048 + 1 + 1 stagnates at 2048
    A = np.array([[2048.0, 1.0, 1.0]], np.float32)
    got = _slot_matmul(A, np.ones(3, np.float32), RECIPES["F"].u_G, Rounder())
    np.testing.assert_array_equal(got, [2048.0])
    fp32 = _slot_matmul(A, np.ones(3, np.float32), RECIPES["C"].u_G, Rounder())
    np.testing.assert_array_equal(fp32, [2050.0])


def test_any_format_recipe_runs(data):
    A, y = data["logistic"]
    wide = Slot("fp(6,9,0)", acc="fp32")
    odd = Recipe.uniform("fp(6,9,0)").replace(u_G=Slot("fp(5,2,0)", acc="fp32"), u_r=wide,
                                              u_g=wide, u_x=Slot("fp32"), u_c=Slot("fp32"))
    res = casgd(A, y, eta=0.5, b=4, s=4, H=20, recipe=odd, seed=1, record=20)
    assert res.loss_curve[-1] < res.loss_curve[0]
    sr = RECIPES["C"].replace(u_x=Slot("bf16", "stochastic"))
    a = casgd(A, y, eta=0.5, b=4, s=4, H=5, recipe=sr, seed=3).x
    b = casgd(A, y, eta=0.5, b=4, s=4, H=5, recipe=sr, seed=3).x
    np.testing.assert_array_equal(a, b)   # seeded stochastic rounding is reproducible
    assert np.array_equal(lpsim.quantize(a.astype(np.float32), "bf16"), a)


@pytest.mark.parametrize("loss", ["logistic", "linear", "poisson"])
def test_recipe_c_tracks_a(data, loss):
    A, y = data[loss]
    la = casgd(A, y, loss=loss, eta=0.5, b=8, s=8, H=30, recipe="A", seed=2, record=30)
    lc = casgd(A, y, loss=loss, eta=0.5, b=8, s=8, H=30, recipe="C", seed=2, record=30)
    assert la.loss_curve[-1] < la.loss_curve[0]
    assert abs(lc.loss_curve[-1] - la.loss_curve[-1]) <= 5e-3 * abs(la.loss_curve[-1])


# --- bad input ----------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,match", [
    ({"s": 0}, "s=0"), ({"b": 0}, "b=0"), ({"b": 2.5}, "b=2.5"), ({"eta": 0}, "eta=0"),
    ({"eta": -1.0}, "eta=-1.0"), ({"eta": float("nan")}, "eta=nan"), ({"P": 41}, "P=41"),
    ({"recipe": "Z"}, "'Z'"), ({"loss": "hinge"}, "'hinge'"),
    ({"progress": "no"}, "progress='no'"), ({"verbose": -1}, "verbose=-1"),
    ({"verbose": "loud"}, "verbose='loud'"), ({"graphs": "no"}, "graphs='no'"),
    ({"sampler": "Philox"}, "sampler='Philox'"),
])
def test_bad_parameters(data, kwargs, match):
    A, y = data["logistic"]
    with pytest.raises(ValueError, match=match) as err:
        casgd(A, y, **{"H": 1, **kwargs})
    assert "accepted" in str(err.value)


def test_bad_labels_and_data(data):
    A, y = data["logistic"]
    with pytest.raises(ValueError, match=r"logistic labels .* got 0\.0"):
        casgd(A, np.where(y > 0, 1.0, 0.0), H=1)
    Ap, yp = data["poisson"]
    with pytest.raises(ValueError, match=r"Poisson .* got -1\.0"):
        casgd(Ap, np.r_[-1.0, yp[1:]], loss="poisson", H=1)
    # real targets >= 0 are taken, as scikit-learn's PoissonRegressor takes them
    assert np.isfinite(casgd(Ap, np.r_[0.5, yp[1:]], loss="poisson", H=1).x).all()
    bad = A.copy()
    bad[3, 7] = np.nan
    with pytest.raises(ValueError, match=r"A\[3, 7\] = nan"):
        casgd(bad, y, H=1)
    with pytest.raises(ValueError, match="600 rows"):
        casgd(A, y[:10], H=1)


def test_empty_and_non_numeric_input(data):
    A, y = data["logistic"]
    for empty in (np.zeros((0, 4)), np.zeros((5, 0))):
        with pytest.raises(ValueError, match=re.escape(f"A has shape {empty.shape}; accepted")):
            casgd(empty, np.ones(empty.shape[0]), H=1)
    x0 = np.zeros(A.shape[1])
    x0[2] = np.nan
    with pytest.raises(ValueError, match=r"x0\[2\] = nan: NaN/inf; accepted: finite"):
        casgd(A, y, H=1, x0=x0)
    words = np.where(y > 0, "yes", "no")
    with pytest.raises(ValueError, match=r"y has dtype <U3 \(first entry '(yes|no)'\); "
                                         r"accepted: numeric labels, -1/\+1"):
        casgd(A, words, H=1)
    with pytest.raises(ValueError, match=r"A has dtype <U1 .*accepted: a real numeric"):
        casgd(np.full((3, 2), "a"), np.ones(3), H=1)


def test_synth_and_normalisation():
    A, y, x_true = make_synth(300, 20, loss="logistic", seed=3)
    Ap, yp, _ = make_synth(300, 20, loss="poisson", seed=3)
    np.testing.assert_array_equal(A, Ap)           # Table 4: one shared feature matrix
    np.testing.assert_allclose(np.linalg.norm(A, axis=1), 1, rtol=1e-6)
    assert set(np.unique(y)) == {-1.0, 1.0} and (yp >= 0).all() and (yp == np.round(yp)).all()
    np.testing.assert_array_equal(make_synth(300, 20, seed=3)[0], A)   # seeded
    Z = normalize_rows(np.array([[3.0, 4.0], [0.0, 0.0]]))
    np.testing.assert_array_equal(Z, [[0.6, 0.8], [0, 0]])
    ints = np.array([[3, 4], [0, 0]])
    np.testing.assert_array_equal(normalize_rows(ints), Z)     # a float64 copy
    np.testing.assert_array_equal(ints, [[3, 4], [0, 0]])
    with pytest.raises(TypeError, match=r"copy=False\) cannot scale a int64 array in place; "
                                        r"accepted: a float32/float64 array, or copy=True"):
        normalize_rows(ints, copy=False)
    with pytest.raises(ValueError, match=r"A\[1, 0\] = nan: NaN/inf; accepted: finite"):
        normalize_rows([[1.0, 2.0], [np.nan, 1.0]])
    with pytest.raises(ValueError, match=r"A has dtype <U1 \(first entry 'a'\)"):
        normalize_rows([["a", "b"]])


def test_cost_model_table2():
    c = cost_model(b=8, s=4, P=16, n_loc=256, alpha=1e-5, beta=1e-9, gamma=1e-12)
    assert c["sgd"] == {"flops": 4 * 32 * 256, "words": 32, "messages": 4,
                        "time": c["sgd"]["time"]}
    assert c["casgd"]["flops"] == 2 * 32 ** 2 * 256 + 64 * 12 + 4 * 32 * 256
    assert c["casgd"]["words"] == 32 + 32 ** 2 and c["casgd"]["messages"] == 1
    lo, hi = c["crossover"]
    for s in (max(2, int(lo) + 1), int(hi)):        # inside: CA-SGD cheaper
        cs = cost_model(8, s, 16, 256, 1e-5, 1e-9, 1e-12)
        assert cs["casgd"]["time"] < cs["sgd"]["time"]
    cs = cost_model(8, int(hi) + 1, 16, 256, 1e-5, 1e-9, 1e-12)
    assert cs["casgd"]["time"] > cs["sgd"]["time"]
    with pytest.raises(ValueError, match="gamma=-1"):
        cost_model(8, 4, 16, 256, 1e-5, 1e-9, -1)


# --- issue 11: clear errors at every entry ------------------------------------------------
def test_diverging_step_size_raises_naming_eta(data):
    import warnings
    A, y = data["linear"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # no numpy RuntimeWarning on the way
        with pytest.raises(ValueError, match=r"diverged with eta=1000000\.0: x is not finite "
                                                r"after outer iteration \d+ of 50; accepted: "
                                                r"a smaller step size, e\.g\. eta=250000"):
            casgd(A, y, loss="linear", eta=1e6, b=4, s=4, H=50)
        with pytest.raises(ValueError, match=r"diverged with eta=1000000\.0"):
            sgd(A, y, loss="linear", eta=1e6, b=4, steps=200)


@pytest.mark.parametrize("seed", [-1, 2 ** 64, 1.5, True])
def test_bad_seed_names_the_parameter(data, seed):
    from lpsim.casgd import casgd_step
    A, y = data["logistic"]
    match = re.escape(f"seed={seed!r} is not accepted; accepted: an integer 0 <= seed < 2**64")
    with pytest.raises(ValueError, match=match):
        casgd(A, y, H=1, seed=seed)
    with pytest.raises(ValueError, match=match):
        casgd_step(A[:4], y[:4], np.zeros(A.shape[1]), 0.5, 2, 2, seed=seed)
    assert casgd(A, y, H=1, b=2, s=2, seed=2 ** 64 - 1).iterations == 1


def test_gram_too_large_for_memory_is_refused(data):
    from lpsim.casgd.solvers import check_block_size
    A, y = data["logistic"]
    with pytest.raises(ValueError, match=r"b\*s = 1048576\*1048576 = 1099511627776 rows per "
                                         r"outer iteration: the s\*b x s\*b Gram matrix needs "
                                         r"4\.504e\+15 GiB .*accepted: smaller b or s"):
        casgd(A, y, H=1, b=2 ** 20, s=2 ** 20)
    # the limit is the memory given: 64 x 64 fp32 Gram (16 KiB) + 64 x 40 rows (10 KiB)
    check_block_size(8, 8, 40, RECIPES["A"], memory=16384 + 10240)
    with pytest.raises(ValueError, match=r"8\*8 = 64 rows"):
        check_block_size(8, 8, 40, RECIPES["A"], memory=16384 + 10239)


def test_casgd_step_checks_x(data):
    from lpsim.casgd import casgd_step
    A, y = data["logistic"]
    Y, yI = A[:8], y[:8]
    with pytest.raises(ValueError, match=r"x has shape \(39,\); accepted: \(40,\), one weight "
                                         r"per column of Y"):
        casgd_step(Y, yI, np.zeros(39), 0.5, 4, 2)
    with pytest.raises(ValueError, match=r"x has shape \(40, 1\)"):
        casgd_step(Y, yI, np.zeros((40, 1)), 0.5, 4, 2)
    bad = np.zeros(40)
    bad[5] = np.inf
    with pytest.raises(ValueError, match=r"x\[5\] = inf: NaN/inf"):
        casgd_step(Y, yI, bad, 0.5, 4, 2)
    x = casgd_step(Y, yI, np.zeros(40), 0.5, 4, 2, recipe="fp64")
    ref = casgd(Y, yI, eta=0.5, b=4, s=2, H=0, recipe="fp64").x   # same checks pass through
    assert x.shape == ref.shape == (40,) and np.linalg.norm(x) > 0


@pytest.mark.parametrize("scale", [1e160, 1e-170, 2.0 ** 600, 1e-300])
def test_rows_of_huge_or_tiny_values_normalise_as_their_scaled_rows(scale):
    """Their squares overflow or underflow float64: rows of 1e160 * a became zeros and rows
    of 1e-170 * a were left unscaled; now they normalise as a does (scaling by a power of
    two is exact, so the results agree to a few ulps)."""
    from lpsim.casgd import normalize_rows
    a = np.random.default_rng(4).standard_normal((6, 5))
    want = normalize_rows(a)
    got = normalize_rows(a * scale)
    np.testing.assert_allclose(got, want, rtol=4e-16 * 8, atol=0)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-15)


def test_normalize_rows_copies_a_view_of_its_input():
    """copy=True on an ndarray subclass (a memmap, a matrix): np.asarray's view of it was
    scaled in place."""
    from lpsim.casgd import normalize_rows
    for a in (np.matrix([[3.0, 4.0], [1.0, 0.0]]), np.array([[3.0, 4.0], [1.0, 0.0]]).view(
            np.recarray)):
        normalize_rows(a)
        assert np.asarray(a).tolist() == [[3.0, 4.0], [1.0, 0.0]]


@pytest.mark.parametrize("fmt,up", [("fp32", 1 + 2.0 ** -23), ("bf16", 1 + 2.0 ** -7)])
def test_directed_u_x_rounds_the_exact_update(fmt, up):
    # x0 = 1 and a positive update far below half an ulp: up gives the next number above 1,
    # down and nearest give 1 (the update is not first rounded to nearest in float32)
    Y, x0, y = np.full((1, 16), 0.25), np.ones(16), np.array([1.0])
    got = {mode: lpsim.casgd.casgd_step(Y, y, x0, 1e-6, 1, 1, RECIPES["A"].replace(
        u_x=Slot(fmt, rounding=mode))) for mode in ("up", "down", "toward_zero", "nearest")}
    assert (got["up"] == up).all()
    assert all((got[mode] == 1.0).all() for mode in ("down", "toward_zero", "nearest"))


@pytest.mark.parametrize("fmt,up", [("fp32", 1 + 2.0 ** -23), ("bf16", 1 + 2.0 ** -7)])
def test_directed_allreduce_rounds_the_exact_sum(fmt, up):
    from lpsim.casgd.solvers import simulated_allreduce
    parts = [np.ones(3, np.float32), np.full(3, 2.0 ** -30, np.float32)]
    for mode, want in (("up", up), ("down", 1.0), ("toward_zero", 1.0), ("nearest", 1.0)):
        got = simulated_allreduce(parts, Slot(fmt, rounding=mode), Rounder())
        assert (got == want).all(), mode


def test_stochastic_fp32_u_x_rounds_the_exact_update():
    # an update of half an fp32 ulp at 1: each seed rounds it to 1 or 1 + 2**-23
    Y, x0, y = np.array([[1.0]]), np.ones(1), np.array([1.0])
    eta = 2.0 ** -24 / float(1 / (1 + np.exp(np.float32(1.0))))
    recipe = RECIPES["A"].replace(u_x=Slot("fp32", rounding="stochastic"))
    seen = {float(lpsim.casgd.casgd_step(Y, y, x0, eta, 1, 1, recipe, seed=k)[0])
            for k in range(20)}
    assert seen == {1.0, 1 + 2.0 ** -23}


@pytest.mark.parametrize("row", ["u_G", "u_r", "u_g", "u_c"])
def test_fp64_slot_runs_and_tracks_fp64(data, row):
    A, y = data["logistic"]
    kw = dict(eta=0.5, b=4, s=4, H=3, seed=2)
    ref = casgd(A, y, recipe="fp64", **kw).x
    x = casgd(A, y, recipe=RECIPES["C"].replace(**{row: "d"}), **kw).x
    assert np.all(np.isfinite(x)) and np.max(np.abs(x - ref)) < 0.05


@pytest.mark.parametrize("spec,row", [
    (dict(u_r="fp(11,30)"), "u_r"), (dict(u_G="fp(8,30)"), "u_G"),
    (dict(u_c=Slot("fp(11,30)")), "u_c"), (dict(u_g=Slot("fp64", acc="fp32")), "u_g"),
    (dict(u_x=Slot("fp64", rounding="up")), "u_x"),
    (dict(u_AR_r=Slot("fp64", rounding="stochastic")), "u_AR_r")])
def test_slots_that_cannot_be_simulated_are_refused_by_row(spec, row):
    with pytest.raises(ValueError, match=f"^{row}=Slot"):
        RECIPES["A"].replace(**spec)


@pytest.mark.parametrize("fmt", ["fp(11,40)", "fp(8,30)"])
def test_wide_uniform_recipe_is_refused_when_made(fmt):
    with pytest.raises(ValueError, match=re.escape(f"recipe={fmt!r}: u_G=")):
        lpsim.casgd.as_recipe(fmt)
    with pytest.raises(ValueError, match="u_G="):
        lpsim.casgd.CASGDClassifier(recipe=fmt, n_iter=1).fit(np.eye(8), [0, 1] * 4)


def test_a_bad_slot_value_is_refused_naming_the_slot():
    with pytest.raises(ValueError, match=r"^u_AR_G='bf61': unknown format; accepted") as err:
        RECIPES["C"].replace(u_AR_G="bf61")
    assert len(str(err.value)) < 200
    with pytest.raises(ValueError, match=r"^u_sigma=None is not a slot; accepted"):
        RECIPES["C"].replace(u_sigma=None)
    with pytest.raises(ValueError, match=r"^u_x='zz': unknown format"):
        Recipe(*"f f f f f f f f zz".split())
    with pytest.raises(ValueError, match=r"^u_A='e8m0fnu': fmt=e8m0fnu holds no negative"):
        RECIPES["C"].replace(u_A="e8m0fnu")


def test_cost_model_crossover_without_flop_or_word_costs():
    # latency only: CA-SGD is cheaper for every s > 1 (one message instead of s)
    for s in (2, 4, 16):
        c = cost_model(b=32, s=s, P=16, n_loc=256, alpha=1e-6, beta=0.0, gamma=0.0)
        assert c["crossover"] == (1.0, np.inf) and c["speedup"] == s
    # one rank and no costs but latency: nothing to save
    assert cost_model(32, 4, 1, 256, 1e-6, 0.0, 0.0)["crossover"] is None
