"""Simulated sum/dot/matmul against an exact reference that rounds every step (Fractions)."""

import zlib
from fractions import Fraction

import numpy as np
import pytest

import lpsim
import lpsim.ops as ops
from lpsim.ops import reductions
from lpsim.philox import random_words
from lpsim.reference import round_exact
from lpsim.rounding import STOCHASTIC_MODES


def _rounder(seed, stream, o, K):
    """fl(x) of slot s of output o, as lpsim.ops documents the counters."""
    def rnd(x, slot, fmt, mode):
        u = None
        if mode in STOCHASTIC_MODES:
            u = Fraction(random_words(1, 4, seed, stream, offset=o * 2 * K + slot)[0], 2 ** 32)
        value = round_exact(x, fmt, mode, uniform=u).value
        return Fraction(value)      # tests keep clear of inf/nan
    return rnd


def reference_dot(a, b, *, acc, out, acc_mode, out_mode, fused, order, seed, stream, o):
    """The documented steps, one exact rounding each."""
    K = len(a)
    P = [Fraction(float(x)) * Fraction(float(y)) for x, y in zip(a, b)]
    r = _rounder(seed, stream, o, K)
    if order == "pairwise":
        stack = []   # [start, level, value or None (a fused leaf not yet rounded)]

        def combine():
            right, left = stack.pop(), stack.pop()
            lv = left[2] if left[2] is not None else r(P[left[0]], left[0], acc, acc_mode)
            h = right[0]
            rv = P[h] if right[2] is None else right[2]
            stack.append([left[0], left[1] + 1, r(lv + rv, K + h, acc, acc_mode)])
        for t in range(K):
            stack.append([t, 0, None if fused else r(P[t], t, acc, acc_mode)])
            while len(stack) >= 2 and stack[-1][1] == stack[-2][1]:
                combine()
        while len(stack) >= 2:
            combine()
        total = stack[0][2] if stack[0][2] is not None else r(P[0], 0, acc, acc_mode)
    else:
        k = K if order == "sequential" else order[1]
        for h in range(0, K, k):
            v = r(P[h], h, acc, acc_mode)
            for t in range(h + 1, min(h + k, K)):
                p = P[t] if fused else r(P[t], t, acc, acc_mode)
                v = r(v + p, K + t, acc, acc_mode)
            total = v if h == 0 else r(total + v, K + h, acc, acc_mode)
    return r(total, K, out, out_mode)


CASES = [
    # in, acc, out, acc_rounding, out_rounding
    ("bf16", "fp16", "bf16", "nearest", "nearest"),
    ("e4m3", "bf16", "e5m2", "stochastic", "nearest"),
    ("fp16", "fp(5,6,0)", "fp16", "toward_zero", "stochastic"),
    ("bf16", "e5m2", "fp32", "stochastic", "stochastic"),
    ("fp16", "fp32", "bf16", "up", "nearest_away"),
]
ORDERS = ["sequential", "pairwise", ("blocked", 3), ("blocked", 1)]
#: an fp32 accumulator with nearest rounding on the per-step path (an order is given)
FP32_NEAREST = ("fp32", "fp32", "fp32", "nearest", "nearest")


def _assert_matches_reference(got, pairs, fmts, order, fused, seed=1234, stream=7):
    """got.flat[o] == reference_dot(*pairs[o]) for every output o (C order)."""
    _, acc, out, acc_mode, out_mode = fmts
    assert got.size == len(pairs)
    for o, (x, y) in enumerate(pairs):
        want = reference_dot(x, y, acc=acc, out=out, acc_mode=acc_mode, out_mode=out_mode,
                             fused=fused, order=order, seed=seed, stream=stream, o=o)
        assert Fraction(float(got.flat[o])) == want, (o, got.flat[o], float(want))


@pytest.mark.parametrize("fmts", CASES + [FP32_NEAREST], ids=lambda c: "-".join(c))
@pytest.mark.parametrize("order", ORDERS, ids=str)
@pytest.mark.parametrize("fused", [True, False])
def test_matmul_dot_and_sum_match_exact_per_step_reference(fmts, order, fused):
    """Batched matmul, dot over broadcast leading shapes, and sum: counters o*2K + s."""
    in_fmt, acc, out, acc_mode, out_mode = fmts
    rng = np.random.default_rng(zlib.crc32(repr((fmts, order, fused)).encode()))  # stable
    kw = dict(in_fmt=in_fmt, acc_fmt=acc, out_fmt=out, acc_rounding=acc_mode,
              out_rounding=out_mode, fused=fused, order=order, seed=1234, stream=7)
    a = rng.standard_normal((2, 3, 11)).astype(np.float32)
    b = rng.standard_normal((11, 3)).astype(np.float32)
    got = ops.matmul(a, b, **kw)
    assert got.shape == (2, 3, 3) and got.dtype == np.float32
    assert np.array_equal(got, ops.matmul(a, b, **kw))       # same seed, same bits
    ar, br = lpsim.quantize(a, in_fmt), lpsim.quantize(b, in_fmt)
    _assert_matches_reference(got, [(ar[bt, i], br[:, j]) for bt, i, j in np.ndindex(2, 3, 3)],
                              fmts, order, fused)
    x, y = a[:, :1, :], a[0]                                 # (2, 1, K) with (3, K)
    d, s = ops.dot(x, y, **kw), ops.sum(y, axis=-1, **kw)
    assert d.shape == (2, 3) and s.shape == (3,) and d.dtype == s.dtype == np.float32
    _assert_matches_reference(d, [(ar[i, 0], ar[0, j]) for i, j in np.ndindex(2, 3)], fmts,
                              order, fused)
    _assert_matches_reference(s, [(ar[0, j], np.ones(11)) for j in range(3)], fmts, order,
                              fused)
    assert ops.dot(x[0, 0], y[0], **kw) == d[0, 0]          # 1-D pair: 0-d, output 0


@pytest.mark.parametrize("fmts", CASES, ids=lambda c: "-".join(c))
@pytest.mark.parametrize("order", ["sequential", "pairwise", ("blocked", 3)], ids=str)
@pytest.mark.parametrize("shapes", [((4, 11), (11, 3)), ((2, 5), (5, 1)), ((1, 7), (7, 6))],
                         ids=str)
@pytest.mark.parametrize("dtypes", [("float32", "float32"), ("float64", "float32")], ids=str)
def test_repeated_2d_products_take_the_cached_path_and_keep_their_bits(fmts, order, shapes,
                                                                        dtypes):
    """matmul of 2-D arrays remembers its model and shapes after the first call
    (reductions._PRODUCTS); later calls equal the exact reference and the general path (a
    call with stats= takes the general path), for every shape and dtype mixed in between."""
    in_fmt, acc, out, acc_mode, out_mode = fmts
    rng = np.random.default_rng(zlib.crc32(repr((fmts, order, shapes, dtypes)).encode()))
    kw = dict(in_fmt=in_fmt, acc_fmt=acc, out_fmt=out, acc_rounding=acc_mode,
              out_rounding=out_mode, order=order, seed=1234, stream=7)
    a = rng.standard_normal(shapes[0]).astype(dtypes[0])
    b = rng.standard_normal(shapes[1]).astype(dtypes[1])
    first = ops.matmul(a, b, **kw)
    cached = ops.matmul(a, b, **kw)
    other = ops.matmul(b.T.copy(), a.T.copy(), **kw)         # another shape in between
    general = ops.matmul(a, b, stats=lpsim.RoundingStats(), **kw)
    again = ops.matmul(a, b, **kw)
    for got in (cached, general, again):
        assert got.dtype == first.dtype == np.result_type(a, b)
        assert np.array_equal(got, first, equal_nan=True)
    assert other.shape == (shapes[1][1], shapes[0][0])
    ar, br = lpsim.quantize(a, in_fmt), lpsim.quantize(b, in_fmt)
    _assert_matches_reference(again, [(ar[i], br[:, j]) for i, j in np.ndindex(again.shape)],
                              fmts, order, True)
    if shapes[1][1] > 1 or order == "pairwise":               # the products it caches
        assert ("matmul", a.dtype, b.dtype, a.shape, b.shape) in \
            {k[:5] for k in reductions._PRODUCTS}
    reseeded = {**kw, "seed": 99, "stream": 3}                # the keys are not cached
    assert np.array_equal(ops.matmul(a, b, **reseeded),
                          ops.matmul(a, b, stats=lpsim.RoundingStats(), **reseeded))


@pytest.mark.parametrize("fmts", CASES, ids=lambda c: "-".join(c))
@pytest.mark.parametrize("order", ["sequential", "pairwise", ("blocked", 3)], ids=str)
@pytest.mark.parametrize("K", [1, 7, 300])
def test_repeated_1d_dots_take_the_cached_path_and_keep_their_bits(fmts, order, K):
    """dot of two vectors (and matmul of (1, K) by (K, 1), the register chain) from the
    cached plan equals the exact reference and the general path, keys not cached."""
    in_fmt, acc, out, acc_mode, out_mode = fmts
    rng = np.random.default_rng(zlib.crc32(repr((fmts, order, K)).encode()))
    kw = dict(in_fmt=in_fmt, acc_fmt=acc, out_fmt=out, acc_rounding=acc_mode,
              out_rounding=out_mode, order=order, seed=1234, stream=7)
    x, y = rng.standard_normal(K).astype(np.float32), rng.standard_normal(K)
    first, cached = ops.dot(x, y, **kw), ops.dot(x, y, **kw)
    assert ("dot", x.dtype, y.dtype, x.shape, y.shape) in {k[:5] for k in reductions._PRODUCTS}
    general = ops.dot(x, y, stats=lpsim.RoundingStats(), **kw)
    assert type(cached) is type(general) is np.float64 and cached == first == general
    _assert_matches_reference(np.array([cached]), [(lpsim.quantize(x, in_fmt),
                                                    lpsim.quantize(y, in_fmt))], fmts, order,
                              True)
    col = ops.matmul(x[None, :], y[:, None], **kw)
    assert col.shape == (1, 1) and ops.matmul(x[None, :], y[:, None], **kw)[0, 0] == cached
    reseeded = {**kw, "seed": 5, "stream": 1}
    assert ops.dot(x, y, **reseeded) == ops.dot(x, y, stats=lpsim.RoundingStats(), **reseeded)


@pytest.mark.parametrize("kw", [dict(order="sequential"), dict(acc_fmt="fp64", order="pairwise"),
                                dict(acc_fmt="fp16", out_fmt="fp32", fused=False)], ids=str)
def test_cached_products_without_in_fmt_equal_the_general_path(kw):
    """in_fmt None (float32 operands as given), the float64 accumulator's plain steps and
    unfused steps on the cached path, next to a call with stats (the general path)."""
    rng = np.random.default_rng(5)
    a, b = (rng.standard_normal(shape).astype(np.float32) for shape in ((6, 9), (9, 4)))
    first, cached = ops.matmul(a, b, **kw), ops.matmul(a, b, **kw)
    assert ("matmul", a.dtype, b.dtype, a.shape, b.shape) in {k[:5] for k in reductions._PRODUCTS}
    assert np.array_equal(first, cached)
    assert np.array_equal(cached, ops.matmul(a, b, stats=lpsim.RoundingStats(), **kw))


@pytest.mark.parametrize("order", ["sequential", "pairwise"])
def test_counters_follow_the_output_index_across_tiles_and_batches(order):
    # N = 37 spans two tiles; batch broadcasting of b; stochastic accumulator
    rng = np.random.default_rng(5)
    a = lpsim.quantize(rng.standard_normal((2, 2, 6)), "bf16")
    b = lpsim.quantize(rng.standard_normal((6, 37)), "bf16")
    got = ops.matmul(a, b, in_fmt="bf16", acc_fmt="bf16", acc_rounding="stochastic",
                     order=order, seed=99)
    assert got.dtype == np.float64
    for o in (0, 31, 32, 36, 37, 100, 147):
        bt, i, j = np.unravel_index(o, got.shape)
        want = reference_dot(a[bt, i], b[:, j], acc="bf16", out="bf16",
                             acc_mode="stochastic", out_mode="nearest", fused=True,
                             order=order, seed=99, stream=0, o=o)
        assert Fraction(float(got[bt, i, j])) == want
    assert not np.array_equal(got, ops.matmul(a, b, in_fmt="bf16", acc_fmt="bf16",
                                              acc_rounding="stochastic", order=order, seed=98))


def test_fp32_sequential_unfused_equals_a_float32_loop():
    rng = np.random.default_rng(11)
    a = rng.standard_normal((17, 300)).astype(np.float32)
    b = rng.standard_normal((300, 23)).astype(np.float32)
    acc = a[:, :1] * b[:1, :]
    for t in range(1, 300):
        acc = acc + a[:, t:t + 1] * b[t:t + 1, :]      # float32 multiply, then float32 add
    got = ops.matmul(a, b, in_fmt="fp32", acc_fmt="fp32", fused=False, order="sequential")
    assert got.dtype == np.float32
    assert np.array_equal(got, acc)
    fused = ops.matmul(a, b, model="fp32", order="sequential")
    assert not np.array_equal(fused, acc)     # one rounding per step differs somewhere


def test_fp32_sequential_fused_default_equals_an_fma_loop():
    """The default fused=True is acc = fma(a_t, b_t, acc) in float32: one exact rounding."""
    rng = np.random.default_rng(12)
    a = rng.standard_normal((3, 200)).astype(np.float32)
    b = rng.standard_normal((200, 4)).astype(np.float32)
    got = ops.matmul(a, b, model="fp32", order="sequential")
    for i, j in np.ndindex(3, 4):
        acc = Fraction(0)
        for t in range(200):        # a float32 FMA: the exact a*b + acc rounded once
            exact = Fraction(float(a[i, t])) * Fraction(float(b[t, j])) + acc
            acc = Fraction(round_exact(exact, "fp32", "nearest").value)
        assert Fraction(float(got[i, j])) == acc


def test_blas_path_bf16_fp32_is_within_the_bound_and_agrees_with_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    K = 256
    a = rng.standard_normal((20, K)).astype(np.float32)
    b = rng.standard_normal((K, 30)).astype(np.float32)
    ar = lpsim.quantize(a, "bf16").astype(np.float64)
    br = lpsim.quantize(b, "bf16").astype(np.float64)
    exact = ar @ br      # within 2**-50 relative of exact: negligible here
    scale = np.abs(ar) @ np.abs(br)
    gam = ops.gamma(K, 2.0 ** -24)
    theirs = torch.matmul(torch.from_numpy(a).bfloat16(), torch.from_numpy(b).bfloat16())
    theirs = theirs.float().numpy()
    for kw in (dict(order=None), dict(order="sequential"), dict(order="pairwise")):
        ours = ops.matmul(a, b, model="bf16-fp32", out_fmt="bf16", **kw)
        bound = 2.0 ** -8 * np.abs(exact) + (1 + 2.0 ** -8) * gam * scale + 1e-12
        assert np.all(np.abs(ours - exact) <= bound)
        assert np.all(np.abs(theirs - exact) <= bound)
        assert np.all(np.abs(ours - theirs) <= 2 * bound)
    acc32 = ops.matmul(a, b, model="bf16-fp32")            # fp32 out: gamma bound alone
    assert np.all(np.abs(acc32 - exact) <= gam * scale + 1e-12)
    assert ops.input_cast_factor(K, 2.0 ** -8, 2.0 ** -24) == 2 * 2.0 ** -8 + gam


def test_blas_path_of_torch_tensors_is_torch_matmul_bit_for_bit():
    """Tensors on the BLAS path are multiplied by torch.matmul (torch's own threads: numpy's
    BLAS between torch operations shares the cores with torch's spinning pool): equal to it
    bit for bit, transposed views and a bf16 in_fmt included.  K = 4096 sums with
    cancellation, where BLAS libraries' orders differ in the last bits."""
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(3)
    a = torch.randn(64, 4096, generator=g)
    b = torch.randn(48, 4096, generator=g).t()          # column-major, as a layer's weight
    assert torch.equal(ops.matmul(a, b), torch.matmul(a, b))
    ab, bb = (lpsim.quantize(t.contiguous(), "bf16") for t in (a, b))
    got = ops.matmul(a, b, model="bf16-fp32")
    assert isinstance(got, torch.Tensor) and torch.equal(got, torch.matmul(ab, bb))
    wide = ops.matmul(a.double(), b.double())
    assert wide.dtype == torch.float64 and torch.equal(wide, torch.matmul(a.double(),
                                                                          b.double()))
    # a numpy array beside a tensor: read-only and reversed arrays are copied, not refused
    r = b.numpy()[::-1].copy()[::-1]
    r.setflags(write=False)
    assert torch.equal(ops.matmul(a, r), torch.matmul(a, torch.from_numpy(r.copy())))


def test_products_of_tensors_keep_their_arithmetic_under_autocast():
    """Inside ``torch.autocast`` (bfloat16 or float16) lpsim.ops.matmul of float32 tensors is
    still the product its model defines, bit for bit the one outside the region (autocast
    would run torch.matmul in 16 bits), in float32."""
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(4)
    a, b = torch.randn(32, 512, generator=g), torch.randn(512, 24, generator=g)
    want = {m: ops.matmul(a, b, model=m) for m in (None, "bf16-fp32")}
    for low in (torch.bfloat16, torch.float16):
        with torch.autocast("cpu", low):
            for m, w in want.items():
                got = ops.matmul(a, b, model=m)
                assert got.dtype == torch.float32 and torch.equal(got, w), (low, m)


def test_torch_results_have_torch_shapes():
    """1-D tensors give a 0-d tensor, as torch.dot / torch.sum / torch.matmul do (numpy's
    ascontiguousarray made it 1-d), on the BLAS and the per-step paths."""
    torch = pytest.importorskip("torch")
    a, b = torch.arange(1.0, 5.0), torch.arange(2.0, 6.0)
    for got, want in ((ops.matmul(a, b), torch.matmul(a, b)), (ops.dot(a, b), torch.dot(a, b)),
                      (ops.sum(a), torch.sum(a)),
                      (ops.dot(a, b, acc_fmt="bf16", order="sequential"), torch.dot(a, b)),
                      (ops.matmul(a, b, model="bf16-fp32"), torch.matmul(a, b))):
        assert isinstance(got, torch.Tensor) and got.shape == () and torch.equal(got, want)
    assert ops.sum(torch.ones(2, 3), axis=1).shape == (2,)


def test_models_and_overrides():
    assert set(ops.MODELS) >= {"bf16-fp32", "fp16-fp32", "fp16-fp16", "tf32", "fp32"}
    m = ops.MODELS["fp16-fp16"]
    assert (m.in_fmt, m.acc_fmt, m.out_fmt) == (lpsim.fp(5, 10),) * 3
    rng = np.random.default_rng(8)
    a = rng.standard_normal((4, 64)).astype(np.float32)
    b = rng.standard_normal((64, 3)).astype(np.float32)
    explicit = ops.matmul(a, b, in_fmt="fp16", acc_fmt="fp16", out_fmt="fp16", fused=True)
    assert np.array_equal(ops.matmul(a, b, model="fp16-fp16"), explicit)
    assert np.array_equal(ops.matmul(a, b, model=m), explicit)
    tf = ops.matmul(a, b, model="tf32", order="sequential")
    assert np.array_equal(tf, ops.matmul(lpsim.quantize(a, "tf32"), lpsim.quantize(b, "tf32"),
                                         acc_fmt="fp32", order="sequential"))


def test_stats_count_every_rounding():
    s = lpsim.RoundingStats()
    x = np.full((2, 10), 1.0 + 2.0 ** -9, np.float32)     # between bf16 neighbours
    ops.sum(x, acc_fmt="bf16", order="sequential", fused=False, stats=s)
    assert s.elements == 2 * (10 + 9 + 1)       # 10 products, 9 adds, 1 output rounding
    assert s.inexact > 0


def test_zero_length_and_fp64_accumulator():
    z = ops.matmul(np.zeros((3, 0), np.float32), np.zeros((0, 2), np.float32), acc_fmt="bf16")
    assert z.shape == (3, 2) and not z.any()
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((5, 40)), rng.standard_normal((40, 6))
    seq = ops.matmul(a, b, in_fmt="fp32", acc_fmt="fp64", order="sequential", fused=False)
    a32, b32 = lpsim.quantize(a, "fp32"), lpsim.quantize(b, "fp32")
    acc = a32[:, :1] * b32[:1, :]
    for t in range(1, 40):
        acc = acc + a32[:, t:t + 1] * b32[t:t + 1, :]
    assert np.array_equal(seq, acc)
    assert np.allclose(ops.matmul(a, b, acc_fmt="fp64"), a @ b, rtol=0, atol=1e-12)


def test_numpy_conventions_axis_out_scalars_and_cast_counts():
    """sum takes numpy's axis (None: all), 0-d results are numpy scalars, out= is filled, and
    an input cast is a rounding like any other (its overflow counted)."""
    rng = np.random.default_rng(21)
    x = lpsim.quantize(rng.standard_normal((3, 4, 5)).astype(np.float32), "bf16")
    kw = dict(acc_fmt="bf16", order="sequential", acc_rounding="stochastic", seed=3)
    total = ops.sum(x, **kw)
    assert isinstance(total, np.float32)
    assert total == ops.sum(x.reshape(-1), **kw)
    assert np.array_equal(ops.sum(x, axis=(0, 2), **kw),
                          ops.sum(np.transpose(x, (1, 0, 2)).reshape(4, 15), axis=-1, **kw))
    assert np.array_equal(ops.sum(x, axis=1, **kw),
                          ops.sum(np.moveaxis(x, 1, -1), axis=-1, **kw))
    assert ops.sum(np.float32(2.5), acc_fmt="bf16") == 2.5
    d = ops.dot(x[0, 0], x[1, 0], acc_fmt="bf16")
    assert isinstance(d, np.float32)
    out = np.full((3, 5), 9.0, np.float32)
    assert ops.sum(x, axis=1, out=out, **kw) is out
    assert np.array_equal(out, ops.sum(x, axis=1, **kw))
    c = np.empty((4, 4), np.float32)
    assert ops.matmul(x[0], x[0].T, acc_fmt="bf16", out=c) is c
    assert np.array_equal(c, ops.matmul(x[0], x[0].T, acc_fmt="bf16"))
    e = np.empty(5)
    assert ops.add(np.ones(5), 2.0 ** -9, "bf16", out=e) is e and np.all(e == 1.0)
    stats = lpsim.RoundingStats()
    ops.dot(np.float32([1e5, 1.0]), np.float32([1.0, 1.0]), in_fmt="fp16", acc_fmt="fp32",
            order="sequential", stats=stats)
    # the cast overflows once; inf then enters the first term, the add and the output rounding
    assert stats.overflow == 1 and stats.inf == 3 and stats.elements == 4 + 3
    stats = lpsim.RoundingStats()
    ops.add(np.float32([1e5]), np.float32([1.0]), "fp32", in_fmt="fp16", stats=stats)
    assert stats.elements == 3 and stats.overflow == 1


def test_the_product_cache_starts_afresh_when_full(monkeypatch):
    """More shapes than MAX_CACHED: the cache never holds more, and every call is right."""
    monkeypatch.setattr(reductions, "MAX_CACHED", 3)
    monkeypatch.setattr(reductions, "_PRODUCTS", {})
    rng = np.random.default_rng(2)
    kw = dict(in_fmt="bf16", acc_fmt="fp16", order="sequential")
    for K in (2, 3, 4, 5, 6, 2, 3):
        a, b = rng.standard_normal((3, K)), rng.standard_normal((K, 2))
        got = [ops.matmul(a, b, **kw) for _ in range(2)]
        want = ops.matmul(a, b, stats=lpsim.RoundingStats(), **kw)
        assert all(np.array_equal(g, want) for g in got)
        assert 1 <= len(reductions._PRODUCTS) <= 3
