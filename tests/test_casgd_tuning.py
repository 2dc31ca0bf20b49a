"""Step-size sweep (lpsim.casgd.sweep_eta, Section 7.1's eta*)."""

import math
import re

import numpy as np
import pytest

from lpsim.casgd import make_synth, sgd, sweep_eta, tuning


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


def test_sweep_progress_counts_every_step(linear, capsys):
    """The bar ends at its total (etas x seeds x steps), and progress=False is silent."""
    A, y = linear
    quiet = sweep_eta(A, y, loss="linear", etas=(0.1, 0.5, 1e4), steps=7, seeds=(1, 2), b=8,
                      progress=False)
    assert capsys.readouterr().err == ""
    shown = sweep_eta(A, y, loss="linear", etas=(0.1, 0.5, 1e4), steps=7, seeds=(1, 2), b=8,
                      progress=True)
    err = capsys.readouterr().err
    counts = re.findall(r"eta sweep \(3 x 2 seeds\):.*?(\d+)/(\d+)", err)
    assert counts[0] == ("0", "42") and counts[-1] == ("42", "42")   # diverged runs count too
    assert shown == quiet                                             # the same sweep


def test_sweep_default_progress_follows_its_size(linear, capsys, monkeypatch):
    A, y = linear
    sweep_eta(A, y, loss="linear", etas=(0.1,), steps=5, seeds=(1,))
    assert capsys.readouterr().err == ""                          # 5 steps: below the threshold
    monkeypatch.setattr(tuning, "PROGRESS_STEPS", 5)
    sweep_eta(A, y, loss="linear", etas=(0.1,), steps=5, seeds=(1,))
    assert re.search(r"eta sweep.*5/5", capsys.readouterr().err)
    with pytest.raises(TypeError, match="progress='yes'"):
        sweep_eta(A, y, loss="linear", progress="yes")
