"""Step-size sweep (lpsim.casgd.sweep_eta, Section 7.1's eta*)."""

import math

import numpy as np
import pytest

from lpsim.casgd import make_synth, sgd, sweep_eta


@pytest.fixture(scope="module")
def linear():
    return make_synth(400, 24, loss="linear", seed=3)[:2]


def test_sweep_picks_lowest_mean_final_loss(linear):
    A, y = linear
    etas, seeds = (0.05, 0.5, 2.0, 400.0), (1, 2)
    res = sweep_eta(A, y, loss="linear", etas=etas, steps=40, seeds=seeds, b=8)
    for eta in etas[:3]:      # each entry is the mean of the same SGD runs done directly
        direct = [sgd(A, y, loss="linear", eta=eta, b=8, steps=40, seed=s, record=[40])
                  .loss_curve[-1] for s in seeds]
        assert res.final_loss[eta] == pytest.approx(np.mean(direct), rel=0, abs=0)
    assert res.final_loss[400.0] == math.inf          # 400/8 per step diverges on unit rows
    assert res.best == min(etas[:3], key=res.final_loss.__getitem__)
    assert res.final_loss[0.5] < res.final_loss[0.05]  # the sweep has a real choice to make
    assert "<- eta*" in res.table()


def test_sweep_ties_go_to_smaller_step(linear):
    A, y = linear
    res = sweep_eta(A, np.zeros_like(y), loss="linear", etas=(0.5, 0.1), steps=3, seeds=(0,))
    assert res.final_loss[0.1] == res.final_loss[0.5] == 0.0   # x stays 0 on zero labels
    assert res.best == 0.1


@pytest.mark.parametrize("kwargs,match", [
    ({"etas": ()}, "etas is empty"), ({"etas": (0.1, -1.0)}, "eta=-1.0"),
    ({"seeds": ()}, "seeds is empty"), ({"steps": 0}, "steps=0")])
def test_sweep_bad_input(linear, kwargs, match):
    A, y = linear
    with pytest.raises(ValueError, match=match):
        sweep_eta(A, y, loss="linear", **kwargs)
