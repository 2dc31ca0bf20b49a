"""A user's own property test, under hypothesis' default settings (200 ms deadline), after
the documented ``lpsim.warmup`` call: no kernel compiles or loads inside an example."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import lpsim
from lpsim.testing import assert_rounded, representable

lpsim.warmup(["nearest", "stochastic"], ["float32"], ops=False, progress=False)


@settings(settings.get_profile("default"))
@given(x=hnp.arrays(np.float32, st.integers(0, 64), elements=st.floats(width=32)),
       seed=st.integers(0, 2 ** 64 - 1))
def test_a_user_style_property_meets_the_default_deadline(x, seed):
    y = lpsim.quantize(x, "bf16")
    assert_rounded(y, x, "bf16")
    z = lpsim.quantize(x, "bf16", "stochastic", seed=seed)
    assert_rounded(z, x, "bf16", "stochastic", seed=seed)
    assert np.array_equal(lpsim.quantize(y, "bf16"), y, equal_nan=True)


@settings(settings.get_profile("default"))
@given(v=representable("bf16", dtype=np.float32))
def test_representable_values_are_fixed_points(v):
    assert lpsim.quantize(np.float32(v), "bf16") == v
