"""Blocks of a Hadamard transform down the columns, transformed band by band in the cache.

``lpsim.blocks.quantize_hadamard_columns(x, factors, ...)`` must equal, bit for bit (values,
scales, tensor scale, counters, random counters), ``quantize_blocks`` of the transformed
array ``rht_tokens(x)`` along axis 0, and simulated training's weight gradient must give
the same gradients and telemetry through it as through the transform and the quantization
one after the other.
"""

import numpy as np
import pytest
import torch
from torch import nn

import lpsim
import lpsim.torch.gemms as gemms
from lpsim.blocks.amax import tensor_amax
from lpsim.blocks.columns import hadamard_amax
from lpsim.blocks.fake_quantize import (quantize_blocks, quantize_hadamard_columns,
                                        takes_hadamard_columns)
from lpsim.pool import limited
from lpsim.torch import simulate
from lpsim.torch.hadamard import factors, rht_signs, rht_tokens


def _data(shape, seed):
    """Normal data with a NaN, an inf, a value far below its block's and zeros."""
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 3
    x[1, 2] = np.nan
    x[min(20, shape[0] - 1), 5] = -np.inf
    x[3, 7] = 1e-30
    x[:16, 9] = 0.0
    return x


def _factors(n=16, step=2):
    return factors(rht_signs(3, 1, step, n), torch.float32, "cpu").numpy()


def _same(a, b):
    return np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8_e4m3", "mxfp4"])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("counts", [False, "totals"])
@pytest.mark.parametrize("shape", [(64, 48), (256, 1100), (32, 2100)])
def test_equals_the_blocks_of_the_transformed_array(fmt, rounding, counts, shape):
    x = _data(shape, len(fmt) + shape[1])
    c = _factors()
    transformed = rht_tokens(torch.from_numpy(x), rht_signs(3, 1, 2, 16)).numpy()
    want = quantize_blocks(transformed, fmt, rounding, axis=0, seed=5, stream=2, offset=8,
                           want_elements=False, want_counts=counts)
    got = quantize_hadamard_columns(x, c, fmt, rounding, seed=5, stream=2, offset=8,
                                    want_counts=counts)
    assert _same(got.values, want.values)
    assert np.array_equal(got.scales, want.scales, equal_nan=True)
    assert got.tensor_scale == want.tensor_scale
    if counts:
        assert np.array_equal(got.counts.sum(axis=(0, 1)), want.counts.sum(axis=(0, 1)))
        assert got.counts.sum() > 0             # the NaN, the inf and the tiny value counted


def test_one_thread_and_two_give_the_same_bits():
    x = _data((512, 640), 3)
    c = _factors(step=5)
    runs = []
    for n in (1, 2):
        with limited(n):
            runs.append(quantize_hadamard_columns(x, c, "nvfp4", "stochastic", seed=1,
                                                  want_counts="totals"))
    assert _same(runs[0].values, runs[1].values)
    assert np.array_equal(runs[0].counts.sum(axis=(0, 1)), runs[1].counts.sum(axis=(0, 1)))


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_the_amax_is_that_of_the_transformed_array(n):
    x = _data((128, 300), n)
    c = factors(rht_signs(0, 0, 0, n), torch.float32, "cpu").numpy()
    transformed = rht_tokens(torch.from_numpy(x), rht_signs(0, 0, 0, n)).numpy()
    assert hadamard_amax(x, c) == tensor_amax(transformed.reshape(-1))
    x[~np.isfinite(x)] = 0
    assert hadamard_amax(x, c) == tensor_amax(rht_tokens(
        torch.from_numpy(x), rht_signs(0, 0, 0, n)).numpy().reshape(-1))


@pytest.mark.parametrize("x, c, why", [
    (np.zeros((64, 32), np.float64), _factors(), "float64"),
    (np.zeros((64, 64), np.float32)[:, ::2], _factors(), "a strided view"),
    (np.zeros((40, 32), np.float32), _factors(), "rows not a multiple of 16"),
    (np.zeros((64, 32), np.float32), np.ones(12, np.float32), "12 is not a power of two"),
    (np.zeros((64, 32), np.float32), np.ones(32, np.float32), "runs longer than the block"),
    (np.zeros(64, np.float32), _factors(), "1-D"),
])
def test_refusals_name_what_is_accepted_and_write_nothing(x, c, why):
    assert not takes_hadamard_columns(x, c.size, "nvfp4", "nearest", False), why
    with pytest.raises(ValueError, match="accepted: a C-contiguous 2-D float32 array"):
        quantize_hadamard_columns(x, c, "nvfp4")


def test_a_counter_offset_the_band_words_cannot_take_is_refused():
    x = np.ones((64, 32), np.float32)
    assert not takes_hadamard_columns(x, 16, "nvfp4", "stochastic", False, offset=6)
    with pytest.raises(ValueError, match="accepted"):
        quantize_hadamard_columns(x, _factors(), "nvfp4", "stochastic", seed=0, offset=6)


@pytest.mark.parametrize("preset", ["nvfp4", "mxfp8"])
def test_training_gives_the_same_gradients_and_telemetry_as_the_two_passes(preset, monkeypatch):
    """A model's weight gradients and telemetry over three steps, with the fused route and
    with it switched off (the RHT, then lpsim.quantize down the columns)."""
    from dataclasses import replace
    # every layer simulated (nvfp4 keeps its first and last in BF16); mxfp8 given an RHT
    recipe = replace(lpsim.torch.PRESETS[preset], rht=16, keep_first_last=False,
                     name=f"{preset} test")
    results, taken = [], []
    route = gemms.quantize_hadamard_columns
    monkeypatch.setattr(gemms, "quantize_hadamard_columns",
                        lambda *a, **k: taken.append(1) or route(*a, **k))
    for fused in (True, False):
        if not fused:
            assert len(taken) == 3 * 2 * 2, taken      # steps x layers x operands
            monkeypatch.setattr(gemms, "_rht_columns", lambda *a: None)
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 96), nn.GELU(), nn.Linear(96, 32))
        simulate(model, recipe, generator=lpsim.Generator(4), skip=())
        x = torch.randn(128, 64) * 2
        grads = []
        for _ in range(3):
            model.zero_grad()
            model(x).square().sum().backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        telemetry = [dict(layer.telemetry) for layer in model if hasattr(layer, "telemetry")]
        results.append((grads, telemetry))
    (g1, t1), (g2, t2) = results
    assert all(torch.equal(a, b) for s1, s2 in zip(g1, g2) for a, b in zip(s1, s2))
    assert t1 == t2
    assert t1[0]["wgrad", "dy"].elements > 0


def test_factors_that_are_not_float32_values_and_non_arrays_are_refused():
    x = np.ones((64, 32), np.float32)
    exact = quantize_hadamard_columns(x, [0.25] * 16, "nvfp4")     # float32 values: taken
    assert _same(exact.values, quantize_hadamard_columns(x, np.full(16, 0.25, np.float32),
                                                         "nvfp4").values)
    for factors in (np.full(16, 0.1), "x", None):
        with pytest.raises(ValueError, match="accepted: a 1-D array of float32 values"):
            quantize_hadamard_columns(x, factors, "nvfp4")
    with pytest.raises(TypeError, match="x of type Tensor is not accepted"):
        quantize_hadamard_columns(torch.ones(64, 32), _factors(), "nvfp4")
