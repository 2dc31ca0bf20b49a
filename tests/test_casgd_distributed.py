"""CA-SGD over torch.distributed (gloo) vs the single-process run, and the torchrun CLI."""

import numpy as np
import pytest

from lpsim.casgd import casgd, higham_gamma, make_synth

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def data():
    return make_synth(256, 24, loss="logistic", seed=4)[:2]


KW = dict(loss="logistic", eta=0.5, b=4, s=4, H=3, seed=3)


def test_fp64_ranks_match_single_process(data):
    from lpsim.casgd.distributed import run_threads
    A, y = data
    ref = casgd(A, y, recipe="fp64", **KW).x
    for P in (2, 4):
        run = run_threads(A, y, P, recipe="fp64", **KW)
        assert np.linalg.norm(run.x - ref) <= 1e-13 * np.linalg.norm(ref)
        assert run.outer == 3 and run.calls == [3] * P    # one bucket: [r; G] in one call


@pytest.mark.parametrize("key,buckets", [("C", 2), ("D", 1)])
def test_low_precision_four_ranks_equal_simulation_given_the_allreduce(data, key, buckets):
    """P = 4 gloo ranks against the single-process P = 4 simulation.

    gloo adds the four rank parts in its own order, so its bf16 sums may differ from the
    simulation's rank-order sums.  Tolerance: each reduced entry must lie within
    gamma_{P-1}(u_AR) sum_p |v_p| of the exact sum of the cast parts v_p (Higham's bound for
    any summation order in the collective's format, Assumption 5.4 with C(P) = P - 1).
    Replaying those sums, the simulation must then give the ranks' weights bit for bit.
    """
    from lpsim.casgd.distributed import run_threads
    A, y = data
    P = 4
    run = run_threads(A, y, P, recipe=key, **KW)
    assert run.outer == 3 and run.calls == [buckets * 3] * P   # one call per dtype bucket
    history = iter(run.history)

    def gloo_sums(r_parts, G_parts, recipe, rnd):
        r, G = next(history)
        for got, parts, slot in ((r, r_parts, recipe.u_AR_r), (G, G_parts, recipe.u_AR_G)):
            cast = np.array([rnd.slot(part, slot) for part in parts], np.float64)
            bound = higham_gamma(P - 1, slot.u) * np.abs(cast).sum(axis=0)
            assert (np.abs(got - cast.sum(axis=0)) <= bound).all()
        return r, G

    replay = casgd(A, y, P=P, recipe=key, reduce=gloo_sums, **KW).x
    np.testing.assert_array_equal(run.x, replay)
    assert next(history, None) is None


def test_recipe_c_two_buckets_in_processes(data):
    from lpsim.casgd.distributed import run_local
    A, y = data
    run = run_local(A, y, 2, recipe="C", **KW)
    # bf16 margin and fp32 Gram: two dtype buckets per outer iteration
    assert run.calls == [2 * run.outer] * 2 and run.outer == 3
    # two ranks: gloo's bf16/fp32 sums equal the in-process AllReduce model bit for bit
    np.testing.assert_array_equal(run.x, casgd(A, y, P=2, recipe="C", **KW).x)


def test_more_ranks_than_features(data):
    from lpsim.casgd.distributed import run_local, run_threads
    A, y = data
    for runner in (run_local, run_threads):
        with pytest.raises(ValueError, match="P=25 ranks for n=24"):
            runner(A, y, 25, H=1)


def test_torchrun_command_line():
    from torch.distributed.run import get_args_parser

    from lpsim.casgd.distributed import cli_parser
    ours = ["--rows", "1024", "--features", "64", "--batch", "8", "--inner", "4", "--outer",
            "3", "--eta", "0.25", "--loss", "linear", "--recipe", "D", "--seed", "7", "--native"]
    launch = get_args_parser().parse_args(
        ["--nproc-per-node", "4", "-m", "lpsim.casgd.distributed", *ours])
    assert launch.module and launch.training_script == "lpsim.casgd.distributed"
    assert launch.training_script_args == ours
    assert vars(cli_parser().parse_args(launch.training_script_args)) == dict(
        rows=1024, features=64, batch=8, inner=4, outer=3, eta=0.25, loss="linear",
        recipe="D", seed=7, native=True)
    # torchrun rejects any argument that abbreviates two of its options ("--m": --master-addr,
    # --max-restarts, ...), wherever it stands: none of ours may abbreviate one of its options
    theirs = {o for action in get_args_parser()._actions for o in action.option_strings}
    for action in cli_parser()._actions:
        for option in set(action.option_strings) - {"-h", "--help"}:
            assert not [o for o in theirs if o.startswith(option)], option
    with pytest.raises(SystemExit):
        cli_parser().parse_args(["--row", "5"])     # no abbreviations of our own either
