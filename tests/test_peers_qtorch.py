"""Cross-check against qtorch's float_quantize (CPU).

qtorch JIT-compiles a C++ extension on its first import (~30 s, needs ninja); torch caches the
build under TORCH_EXTENSIONS_DIR (default ~/.cache/torch_extensions), so later runs start fast.

Finding this test pins down: qtorch's rounding="nearest" rounds ties *away from zero*, so it
equals lpsim's "nearest_away" (not "nearest", ties to even) over each format's normal range.
"""

import numpy as np
import pytest

import lpsim

pytestmark = pytest.mark.qtorch
torch = pytest.importorskip("torch")
quant = pytest.importorskip("qtorch.quant")


@pytest.fixture(scope="module")
def samples():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(1 << 18) * 10.0 ** rng.integers(-6, 6, 1 << 18)
    ties = (np.arange(1, 4097, dtype=np.float32) + np.float32(0.5)) * np.float32(2.0 ** -8)
    return np.concatenate([x.astype(np.float32), ties, -ties])


@pytest.mark.parametrize("e, m", [(8, 7), (5, 10), (5, 2), (4, 3), (6, 9)])
def test_qtorch_nearest_is_lpsim_nearest_away_in_the_normal_range(samples, e, m):
    fmt = lpsim.fp(e, m)
    theirs = quant.float_quantize(torch.from_numpy(samples), e, m, rounding="nearest").numpy()
    ours = lpsim.quantize(samples, fmt, "nearest_away")
    normal = (np.abs(samples) >= fmt.min_normal) & (np.abs(ours) <= fmt.max_finite)
    assert normal.sum() > samples.size // 4
    assert np.array_equal(theirs[normal], ours[normal])
    ties_to_even = lpsim.quantize(samples, fmt, "nearest")
    assert not np.array_equal(theirs[normal], ties_to_even[normal])  # the difference is real
