"""lpsim.warmup: which modes and containers it accepts, and the errors for the others."""

import numpy as np
import pytest

import lpsim


def test_a_single_name_is_a_list_of_one():
    # a string is not taken letter by letter (modes 'n', 'e', ... or numpy's dtype 'o')
    one = lpsim.warmup(["nearest"], ["float32"], ops=False, progress=False)
    assert lpsim.warmup("nearest", "float32", ops=False, progress=False) == one
    assert lpsim.warmup("up", np.float64, ops=False, progress=False) == 1
    assert lpsim.warmup(["up"], [np.dtype("float32"), "float64"], ops=False,
                        progress=False) == 2


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(modes="nearst"), ValueError, r"unknown rounding modes \['nearst'\]"),
    (dict(modes=["nearest", 3, ["up"]]), ValueError, r"unknown rounding modes \[3, \['up'\]\]"),
    (dict(modes=5), TypeError, "modes=5 is a int"),
    (dict(containers="float16"), ValueError, r"containers \['float16'\] are not accepted"),
    (dict(containers=["float32", "o", 3.5, None]), ValueError,
     r"containers \['o', 3.5, None\] are not accepted; accepted: float32, float64"),
])
def test_bad_entries_are_named(kwargs, error, match):
    with pytest.raises(error, match=match):
        lpsim.warmup(ops=False, progress=False, **kwargs)
