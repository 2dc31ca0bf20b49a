"""CA-SGD over torch.distributed (gloo, spawned local processes) vs the single-process run."""

import numpy as np
import pytest

from lpsim.casgd import casgd, make_synth

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def data():
    return make_synth(256, 24, loss="logistic", seed=4)[:2]


def test_fp64_ranks_match_single_process(data):
    from lpsim.casgd.distributed import run_local
    A, y = data
    kw = dict(loss="logistic", eta=0.5, b=4, s=4, H=3, recipe="fp64", seed=3)
    ref = casgd(A, y, **kw).x
    for P in (2, 4):
        x, calls, outer = run_local(A, y, P, **kw)
        assert np.linalg.norm(x - ref) <= 1e-13 * np.linalg.norm(ref)
        assert outer == 3 and calls == [3] * P     # one bucket: [r; G] in one all_reduce


def test_recipe_c_two_buckets(data):
    from lpsim.casgd.distributed import run_local
    A, y = data
    kw = dict(loss="logistic", eta=0.5, b=4, s=4, H=3, recipe="C", seed=3)
    x, calls, outer = run_local(A, y, 2, **kw)
    # bf16 margin and fp32 Gram: two dtype buckets per outer iteration
    assert calls == [2 * outer] * 2 and outer == 3
    # two ranks: gloo's bf16/fp32 sums equal the in-process AllReduce model bit for bit
    np.testing.assert_array_equal(x, casgd(A, y, P=2, **kw).x)


def test_more_ranks_than_features(data):
    from lpsim.casgd.distributed import run_local
    A, y = data
    with pytest.raises(ValueError, match="P=25 ranks for n=24"):
        run_local(A, y, 25, H=1)
