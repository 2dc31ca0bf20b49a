"""lpsim.transpose: the threaded transposing copy equals numpy's, for every shape, stripe
remainder, dtype and thread split; other arrays go through numpy."""

import numpy as np
import pytest

from lpsim import transpose


@pytest.mark.parametrize("shape", [(0, 5), (5, 0), (1, 1), (7, 3), (8, 8), (13, 1000),
                                   (1000, 13), (257, 129)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_equals_numpy(shape, dtype, monkeypatch):
    x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(dtype)
    want = np.ascontiguousarray(x.T)
    for grain, threads in ((transpose.PARALLEL_GRAIN, 1), (1, 3)):
        monkeypatch.setattr(transpose, "PARALLEL_GRAIN", grain)
        monkeypatch.setattr(transpose, "threads", lambda: threads)
        got = transpose.transposed(x)
        assert got.dtype == x.dtype and got.flags.c_contiguous
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8))   # bits, NaN included


def test_read_only_views_and_other_dtypes():
    x = np.arange(60, dtype=np.float32).reshape(6, 10)
    x[2, 3] = np.nan
    x.setflags(write=False)
    assert np.array_equal(transpose.transposed(x), x.T, equal_nan=True)
    view = np.arange(60.0).reshape(6, 10)[:, ::2]            # not contiguous: numpy's copy
    assert np.array_equal(transpose.transposed(view), view.T)
    ints = np.arange(12, dtype=np.int16).reshape(3, 4)
    got = transpose.transposed(ints)
    assert got.dtype == np.int16 and np.array_equal(got, ints.T)
