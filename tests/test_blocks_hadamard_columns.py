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
    route, cached = gemms.quantize_hadamard_columns, gemms.quantize_hadamard_cached
    monkeypatch.setattr(gemms, "quantize_hadamard_columns",
                        lambda *a, **k: taken.append("planned") or route(*a, **k))

    def from_plan(*args):
        done = cached(*args)
        if done is not None:
            taken.append("cached")
        return done
    monkeypatch.setattr(gemms, "quantize_hadamard_cached", from_plan)
    for fused in (True, False):
        if not fused:
            assert len(taken) == 3 * 2 * 2, taken      # steps x layers x operands
            assert "cached" in taken                    # the later steps from the plan
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
    for bad in (np.full(16, 0.1), "x", None):
        with pytest.raises(ValueError, match="accepted: a 1-D array of float32 values"):
            quantize_hadamard_columns(x, bad, "nvfp4")
    with pytest.raises(TypeError, match="x of type Tensor is not accepted"):
        quantize_hadamard_columns(torch.ones(64, 32), _factors(), "nvfp4")


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8_e4m3", lpsim.blocks.block("e2m1fn", 32)],
                         ids=str)
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_cached_calls_equal_the_general_path(fmt, rounding, monkeypatch):
    """After a first quantize_hadamard_columns call of a (format as given, rounding, sr_bits,
    counting), quantize_hadamard_cached runs from its plan: the general path's values,
    counters (RoundingStats and BlockStats) and generator counters, over two calls, with
    the general path unreachable; what it does not take (no plan, float64, a strided view,
    factors as a list, rows the runs do not divide, stats without counting) it declines
    before anything is drawn or counted."""
    from lpsim.blocks import BlockStats
    from lpsim.blocks import fake_quantize as fq
    from lpsim.blocks.counters import add_counts
    x = _data((128, 96), 7)
    c = _factors(step=4)

    def general(g, stats):
        want = "totals" if stats is not None else False
        seed, stream, offset = lpsim.generator.resolve(g, x, rounding, None, 0, 0)
        q = quantize_hadamard_columns(x, c, fmt, rounding, seed=seed, stream=stream,
                                      offset=offset, want_counts=want)
        add_counts(stats, q.counts, x.size, q.scales.size)
        return q.values

    for stats_type in (None, lpsim.RoundingStats, BlockStats):
        want_counts = "totals" if stats_type else False
        fq._HADAMARD.clear()
        g0 = lpsim.Generator(3)
        s0 = stats_type() if stats_type else None
        wants = [general(g0, s0) for _ in range(2)]         # the second leaves nothing new
        assert len(fq._HADAMARD) == 1
        g1 = lpsim.Generator(3)
        s1 = stats_type() if stats_type else None
        with monkeypatch.context() as m:
            m.setattr(fq, "quantize_hadamard_columns", None)
            gots = [fq.quantize_hadamard_cached(x, c, fmt, rounding, None, want_counts, g1, s1)
                    for _ in range(2)]
        assert all(_same(got, want) for got, want in zip(gots, wants))
        assert g1.get_state() == g0.get_state()
        if stats_type:
            assert s1.as_dict() == s0.as_dict() and s1.elements == 2 * x.size
    general(lpsim.Generator(0), None)                       # a plan without counting too
    assert len(fq._HADAMARD) == 2
    declined = [
        (x.astype(np.float64), c, None, "totals", BlockStats()),
        (np.repeat(x, 2, axis=1)[:, ::2], c, None, "totals", BlockStats()),
        (x, list(c), None, "totals", BlockStats()),
        (x, np.repeat(c, 2)[::2], None, "totals", BlockStats()),    # strided: the kernel
        #                                                   would read every other factor
        (x[:120], c, None, "totals", BlockStats()),
        (x, c, None, False, BlockStats()),                  # stats need counting
        (x, c, 4, "totals", BlockStats()),                  # no plan for sr_bits=4
    ]
    for args in declined:
        g = lpsim.Generator(3)
        stats = args[-1]
        assert fq.quantize_hadamard_cached(args[0], args[1], fmt, rounding, args[2], args[3],
                                           g, stats) is None
        assert g.get_state() == lpsim.Generator(3).get_state() and stats.elements == 0


def test_a_layer_keeps_its_factors_only_for_the_same_unchanged_signs():
    """LinearGemms transforms dy and x of a backward pass with one step's factors made
    once; signs changed in place, or other signs, get their own factors."""
    layer = gemms.LinearGemms("nvfp4", generator=lpsim.Generator(5), index=3)
    signs = layer.rht_signs(16, torch.device("cpu"))
    c = layer._cpu_factors(signs)
    assert _same(c, factors(signs, torch.float32, "cpu").numpy())
    assert layer._cpu_factors(signs) is c
    signs.neg_()                                    # in place: a new version
    assert _same(layer._cpu_factors(signs), -c)
    other = torch.ones(16)
    assert _same(layer._cpu_factors(other), np.full(16, 0.25, np.float32))
    assert layer._cpu_factors(torch.ones(16, dtype=torch.float64)) is None
