"""lpsim.quantize's interface: containers, scalars, torch tensors, out/in place, reproducibility, errors."""

import numba
import numpy as np
import pytest

import lpsim
from lpsim import RoundingStats, quantize


def test_scalars_keep_their_type():
    assert quantize(0.1, "bf16") == 0.10009765625 and isinstance(quantize(0.1, "bf16"), float)
    value = quantize(np.float32(0.1), "e5m2")
    assert isinstance(value, np.float32) and value == np.float32(0.09375)
    assert np.signbit(quantize(-1e-30, "fp16"))
    assert quantize(-1e-30, "fp16", "down") == -2.0 ** -24
    assert quantize(3, "e4m3") == 3.0 and isinstance(quantize(3, "e4m3"), float)
    assert quantize(17, "e4m3") == 16.0 and quantize(2 ** 70, "bf16") == 2.0 ** 70


def test_shapes_out_and_in_place():
    x = np.random.default_rng(1).standard_normal((3, 5, 7)).astype(np.float32)
    expected = quantize(x, "e4m3")
    assert expected.shape == x.shape
    out = np.empty_like(x)
    assert quantize(x, "e4m3", out=out) is out and np.array_equal(out, expected)
    y = x.copy()
    quantize(y, "e4m3", out=y)
    assert np.array_equal(y, expected)
    strided = x[:, ::2, 1:]
    assert np.array_equal(quantize(strided, "e4m3"), expected[:, ::2, 1:])
    target = np.zeros((7, 5, 3), np.float32).T      # a non-contiguous out
    quantize(x, "e4m3", out=target)
    assert np.array_equal(target, expected)


def test_read_only_and_broadcast_inputs():
    x = np.linspace(-2, 2, 50, dtype=np.float32)
    expected = quantize(x, "e4m3")
    x.setflags(write=False)
    assert np.array_equal(quantize(x, "e4m3"), expected)
    assert np.array_equal(quantize(np.broadcast_to(np.float32(0.3), (4, 5)), "bf16"),
                          np.full((4, 5), 0.30078125, np.float32))


def test_torch_cpu_tensors_round_like_numpy():
    torch = pytest.importorskip("torch")
    t = torch.linspace(-3, 3, 101, dtype=torch.float32)
    got = quantize(t, "fp(4,3,4)", "stochastic", seed=3)
    assert isinstance(got, torch.Tensor)
    assert np.array_equal(got.numpy(), quantize(t.numpy(), "fp(4,3,4)", "stochastic", seed=3))
    quantize(t, "bf16", out=t)
    assert np.array_equal(t.numpy(), t.to(torch.bfloat16).float().numpy())


def test_same_seed_same_bits_whatever_the_split_or_thread_count():
    x = np.random.default_rng(2).standard_normal(300_007).astype(np.float32)  # > 2 grains
    whole = quantize(x, "bf16", "stochastic", seed=42, stream=1)
    parts = [quantize(x[a:b], "bf16", "stochastic", seed=42, stream=1, offset=a)
             for a, b in [(0, 7), (7, 40_000), (40_000, 300_007)]]
    assert np.array_equal(np.concatenate(parts), whole)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        single = quantize(x, "bf16", "stochastic", seed=42, stream=1)
    finally:
        numba.set_num_threads(before)
    assert np.array_equal(single, whole)
    assert not np.array_equal(quantize(x, "bf16", "stochastic", seed=43, stream=1), whole)
    assert not np.array_equal(quantize(x, "bf16", "stochastic", seed=42, stream=2), whole)


def test_stats_accumulate_over_calls():
    x = np.array([1e10, 1e-12, 3.0, np.nan, -np.inf, 1e-6, 1.0], np.float32)
    stats = RoundingStats()
    quantize(x, "fp16", stats=stats)
    quantize(x, "fp16", stats=stats)
    assert stats.as_dict() == {"elements": 14, "inexact": 6, "overflow": 2, "underflow": 2,
                               "subnormal": 2, "nan": 2, "inf": 2}
    stats.reset()
    assert stats.elements == 0 and stats.overflow == 0


@pytest.mark.parametrize("call, error, words", [
    (lambda: quantize(np.zeros(3), "fp7"), ValueError, "unknown format 'fp7'"),
    (lambda: quantize(np.zeros(3, np.float32), "fp64"), ValueError,
     "does not fit a float32 container"),
    (lambda: quantize(np.array([2 ** 60 + 1]), "bf16"), ValueError,
     "holds the integer 1152921504606846977, which float64 cannot hold exactly"),
    (lambda: quantize(np.array([1, None]), "bf16"), TypeError, "dtype object"),
    (lambda: quantize(np.zeros(3, np.complex64), "bf16"), TypeError, "dtype complex64"),
    (lambda: quantize(["a"], "bf16"), TypeError, "dtype <U1"),
    (lambda: quantize(np.zeros(3), "bf16", "nearest_even"), ValueError,
     "unknown rounding 'nearest_even'; accepted: nearest, nearest_away"),
    (lambda: quantize(np.zeros(3, np.float32), "bf16", "stochastic", sr_bits=33), ValueError,
     "sr_bits=33 is out of range; accepted: an integer 1..32"),
    (lambda: quantize(np.zeros(3), "bf16", "stochastic", sr_bits=0), ValueError,
     "sr_bits=0 is out of range; accepted: an integer 1..62"),
    (lambda: quantize(np.zeros(3), "bf16", "nearest", sr_bits=4), ValueError,
     "applies to rounding='stochastic' only"),
    (lambda: quantize(np.zeros(3), "bf16", "stochastic_equal", sr_bits=4), ValueError,
     "applies to rounding='stochastic' only, not rounding='stochastic_equal'"),
    (lambda: quantize(np.zeros(3), "bf16", "stochastic", sr_bits=2.5), TypeError,
     "sr_bits=2.5 is not an integer; accepted: an integer 1..62"),
    (lambda: quantize(0.5, "bf16", out=np.zeros(1)), TypeError, "out= applies to arrays"),
    (lambda: quantize(True, "bf16"), TypeError, "cannot round a bool"),
    (lambda: quantize(np.zeros(3), "bf16", "stochastic", seed=-1), ValueError, "seed=-1"),
    (lambda: quantize(np.zeros(3), "bf16", "stochastic", seed=1.5), TypeError, "seed=1.5"),
    (lambda: quantize(np.zeros(3), "bf16", offset=-2), ValueError, "offset=-2"),
    (lambda: quantize(np.zeros(3), "bf16", out=np.zeros(4)), ValueError, "out must be"),
])
def test_bad_input_names_the_value(call, error, words):
    with pytest.raises(error, match=words):
        call()


def test_fp64_and_fp32_are_identities_in_their_containers():
    x = np.random.default_rng(3).standard_normal(1000)
    assert np.array_equal(quantize(x, "fp64"), x)
    y = x.astype(np.float32)
    assert np.array_equal(quantize(y, "fp32", "up"), y)
    assert np.array_equal(quantize(x, "fp32"), x.astype(np.float32).astype(np.float64))


def test_repeated_requests_take_the_cached_path(monkeypatch):
    """After its first call, a request (format as given, mode, dtype, sr_bits) reaches the
    kernel without the general path's validation (the fixed cost of a small call)."""
    import importlib
    module = importlib.import_module("lpsim.quantize")
    x = np.ones(4, np.float32)
    for fmt in ("bf16", lpsim.parse_format("e4m3fn")):
        quantize(x, fmt, "stochastic", seed=1, sr_bits=5)
    calls = []
    monkeypatch.setattr(module, "_quantize_other", lambda *args: calls.append(args))
    for fmt in ("bf16", lpsim.parse_format("e4m3fn")):
        assert quantize(x, fmt, "stochastic", seed=1, sr_bits=5) is not None
    assert calls == []


def test_integer_arrays_at_the_dtypes_top_are_refused_without_a_cast_warning():
    """2**63 - 1 and 2**64 - 1 become 2**63 and 2**64 in float64, past the dtype's top, whose
    cast back is undefined (it saturates on aarch64): refused by name, no RuntimeWarning;
    -2**63 and 2**63 (unsigned) are float64 values and round exactly."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for array in (np.int64([1, 2 ** 63 - 1]), np.uint64([2 ** 64 - 1])):
            with pytest.raises(ValueError, match=r"\bx holds the integer "):
                lpsim.quantize(array, "bf16")
        np.testing.assert_array_equal(lpsim.quantize(np.int64([-2 ** 63]), "bf16"),
                                      [-2.0 ** 63])
        np.testing.assert_array_equal(lpsim.quantize(np.uint64([2 ** 63]), "bf16"), [2.0 ** 63])


@pytest.mark.parametrize("fmt", ["e8m0fnu", "fp(8,3,0,fnu)", "bf16", "e4m3fn"])
def test_a_list_of_big_ints_counts_each_once(fmt):
    """Each int float64 cannot hold stood in as 0 while the rest was rounded, and an fnu
    format (no zero) rounds 0 to NaN, flagged inexact: the int was counted twice."""
    stats, alone = lpsim.RoundingStats(), lpsim.RoundingStats()
    lpsim.quantize([2 ** 70 + 1, 1.0], fmt, stats=stats)
    lpsim.quantize(2 ** 70 + 1, fmt, stats=alone)
    lpsim.quantize(1.0, fmt, stats=alone)
    assert stats.as_dict() == alone.as_dict()
