"""Every size threshold of the fast paths gives the same bits and counters as the path next
to it: serial vs thread pool (lpsim.cpu, lpsim.ops.kernels.run), one chunk vs many, the
scalar elementwise call vs the array one, the dot/sum register chain vs the GEMM kernel."""

import importlib
import math
import zlib

import ml_dtypes
import numpy as np
import pytest

import lpsim
from lpsim import RoundingStats, cpu, ops, quantize
from lpsim.ops import kernels
from lpsim.ops.reductions import _setup, resolve
from lpsim.rounding import MODES

quantize_module = importlib.import_module("lpsim.quantize")

P = cpu.PARALLEL_GRAIN
SIZES = [0, 1, 3, 4, 5, 63, 64, 65, cpu.GROUP * 3 + 1, cpu.CHUNK - 1, cpu.CHUNK, cpu.CHUNK + 1,
         cpu.TASK * cpu.CHUNK - 1, cpu.TASK * cpu.CHUNK + 5, 2 * P - 1, 2 * P, 2 * P + 7,
         3 * P + cpu.CHUNK // 2]


def _data(n, dtype, salt=""):
    rng = np.random.default_rng(zlib.crc32(f"{n} {dtype} {salt}".encode()))
    x = rng.standard_normal(n) * np.exp2(rng.integers(-140, 130, n))
    with np.errstate(over="ignore"):
        x = x.astype(dtype)
    x[::97] = np.inf
    x[::89] = 0.0
    return x


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_nearest_bf16_equals_ml_dtypes_at_every_size(dtype):
    for n in SIZES:
        # float64 inputs that are float32 values: ml_dtypes converts float64 through float32
        x = _data(n, np.float32).astype(dtype)
        stats = RoundingStats()
        got = quantize(x, "bf16", stats=stats)
        with np.errstate(over="ignore"):
            want = x.astype(ml_dtypes.bfloat16).astype(dtype)
        assert got.tobytes() == want.tobytes(), n
        assert stats.elements == n and stats.inexact == np.count_nonzero(
            (got != x) & np.isfinite(x)), n


@pytest.mark.parametrize("mode", ["stochastic", "nearest", "odd"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_whole_arrays_equal_their_pieces_at_every_size(dtype, mode):
    """The pieces (at most 1000 elements, with their offsets) run in the calling thread in
    one chunk; the whole array crosses every threshold: chunks, tasks, the thread pool."""
    for n in SIZES:
        x = _data(n, dtype, mode)
        for offset in (0, 3):
            whole_stats, piece_stats = RoundingStats(), RoundingStats()
            whole = quantize(x, "fp(5,4,2)", mode, seed=5, stream=2 ** 63 + 1, offset=offset,
                             stats=whole_stats)
            pieces = np.empty_like(x)
            for lo in range(0, n, 1000):
                quantize(x[lo:lo + 1000], "fp(5,4,2)", mode, seed=5, stream=2 ** 63 + 1,
                         offset=offset + lo, out=pieces[lo:lo + 1000], stats=piece_stats)
            assert whole.tobytes() == pieces.tobytes(), (n, offset)
            assert whole_stats == piece_stats, (n, offset)
            inplace = x.copy()
            quantize(inplace, "fp(5,4,2)", mode, seed=5, stream=2 ** 63 + 1, offset=offset,
                     out=inplace)
            assert inplace.tobytes() == whole.tobytes(), (n, offset)


@pytest.mark.parametrize("mode", list(MODES))
def test_scalar_elementwise_ops_equal_the_array_path(mode):
    fmt = "fp(4,3,4)" if mode != "nearest" else "bf16"
    values = [(1.0, 2.0 ** -9), (3.3, -3.3), (1e-30, 7.0), (240.0, 17.5), (-0.0, 0.0),
              (1.7e308, 1.7e308), (1e-200, 1e-200), (float("nan"), 1.0), (float("inf"), 1.0)]
    for op in (ops.add, ops.sub, ops.mul, ops.div):
        for offset in (0, 5):
            for a, b in values:
                s_scalar, s_array = RoundingStats(), RoundingStats()
                got = op(a, b, fmt, mode, seed=3, stream=9, offset=offset, stats=s_scalar)
                want = op(np.array([a]), np.array([b]), fmt, mode, seed=3, stream=9,
                          offset=offset, stats=s_array)
                assert type(got) is float
                assert np.array([got]).tobytes() == want.tobytes(), (op.__name__, a, b)
                assert s_scalar == s_array, (op.__name__, a, b)


@pytest.mark.parametrize("mode", [m for m in MODES if MODES[m] < MODES["stochastic"]])
def test_repeated_scalar_calls_take_the_cached_route(mode, monkeypatch):
    """A Python-float call to a deterministic mode with nothing else asked runs from the
    route its first call cached (_cached_route is not called again): the array path's bits,
    for every op; a call with anything else asked validates as before."""
    elementwise = importlib.import_module("lpsim.ops.elementwise")
    fmt = "fp(4,3,4)" if mode != "nearest" else "bf16"
    values = [(1.0, 2.0 ** -9, 0.75), (3.3, -3.3, 0.1), (1e-30, 7.0, -2.0),
              (240.0, 17.5, 1e-3), (-0.0, 0.0, -0.0), (1.7e308, 1.7e308, 1.0),
              (float("nan"), 1.0, 1.0), (float("inf"), 1.0, -1.0), (2.0, 0.0, 0.0)]
    calls = [(ops.add, 2), (ops.sub, 2), (ops.mul, 2), (ops.div, 2), (ops.fma, 3),
             (ops.sqrt, 1)]
    for op, arity in calls:
        op(*values[0][:arity], fmt, mode)                    # validated, cached
    route = elementwise._cached_route
    monkeypatch.setattr(elementwise, "_cached_route", None)  # a call would raise
    for op, arity in calls:
        for v in values:
            with np.errstate(all="ignore"):
                args = (v[0], 0.5, v[2]) if op is ops.fma else v[:arity]   # exact a*b
                if any(not 0.0 < abs(a) < 1e300 for a in args) or \
                        (op is ops.sqrt and args[0] < 0):
                    continue       # NaN, inf, zeros, float64 overflow: the array path, below
                got = op(*args, fmt, mode)
            monkeypatch.setattr(elementwise, "_cached_route", route)
            want = op(*(np.array([a]) for a in args), fmt, mode)
            monkeypatch.setattr(elementwise, "_cached_route", None)
            assert type(got) is float and np.array([got]).tobytes() == want.tobytes(), \
                (op.__name__, args)
    monkeypatch.setattr(elementwise, "_cached_route", route)
    for op, arity in calls:                      # special values: the same bits either way
        for v in values:
            args = (v[0], 0.5, v[2]) if op is ops.fma else v[:arity]
            with np.errstate(all="ignore"):
                got = op(*args, fmt, mode)
                want = op(*(np.array([a]) for a in args), fmt, mode)
            assert np.array([got]).tobytes() == want.tobytes(), (op.__name__, args)
    with pytest.raises(ValueError, match="offset"):
        ops.add(1.0, 2.0, fmt, mode, offset=-1)
    with pytest.raises(TypeError, match="a format is an lpsim.Format or a string"):
        ops.add(1.0, 2.0, [fmt], mode)
    with pytest.raises((TypeError, ValueError), match="rounding"):
        ops.add(1.0, 2.0, fmt, [mode])
    with pytest.raises(TypeError, match="stats"):
        ops.add(1.0, 2.0, fmt, mode, stats=3)


def _chain_and_gemm(x, y, model, seed):
    """The register chain and the GEMM kernel on the same single-column problem."""
    m = resolve(model, np.float32)
    setup = _setup(m, np.dtype(np.float32), True, "dot")
    K = x.shape[-1]
    X = np.ascontiguousarray(x, np.float64).reshape(-1, K)
    Y = np.ascontiguousarray(y, np.float64).reshape(-1, K)
    blk = K if m.order == "sequential" else m.order[1]
    common = (setup.mode, setup.omode, 32, 32, setup.pva, setup.pvo, seed, 0, 7)
    out_chain = np.empty(X.shape[0])
    c_chain = kernels.run(kernels.chain, X.shape[0], K, 1, X, Y, out_chain, *common, blk,
                          bool(m.fused), setup.hw)
    out_gemm = np.empty((X.shape[0], 1, 1))
    ia = np.arange(X.shape[0], dtype=np.int64)
    c_gemm = kernels.run(kernels.gemm, X.shape[0], K, 1, X[:, None, :].copy(),
                         Y[:, :, None].copy(), ia, ia.copy(), out_gemm, *common,
                         kernels.ORDER_BLOCKED, blk, bool(m.fused), setup.hw)
    return out_chain, c_chain, out_gemm.reshape(-1), c_gemm


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("order", ["sequential", ("blocked", 5)])
@pytest.mark.parametrize("fused", [True, False])
def test_the_register_chain_equals_the_gemm_kernel(mode, order, fused):
    rng = np.random.default_rng(zlib.crc32(f"{mode} {order} {fused}".encode()))
    K = 77
    x = (rng.standard_normal((6, K)) * np.exp2(rng.integers(-20, 20, (6, K)))).astype(np.float32)
    y = rng.standard_normal((6, K)).astype(np.float32)
    x[0] = np.round(x[0] * 8) / 8              # exact sums: the chain's grid-point fallback
    y[0] = 1.0
    x[1, :2], y[1, :2] = [1032, 4 + 2 ** -21], [1, 1 - 2 ** -23]   # RN64 lands on a midpoint
    x[2] = 1e30                                 # overflow of the accumulator
    x[3, 1::2] = -x[3, 0:K - 1:2]               # cancellation to exact zeros
    y[3] = 1.0
    for acc in ("bf16", "fp16", "fp(5,2,0)", "fp32", "fp64"):
        if acc == "fp64" and mode != "nearest":
            continue
        model = lpsim.ops.AccumulationModel("fp32", acc, "fp32" if acc != "fp64" else "fp64",
                                            fused, order, mode, "nearest")
        got, got_counts, want, want_counts = _chain_and_gemm(x, y, model, seed=11)
        assert got.tobytes() == want.tobytes(), acc
        assert list(got_counts) == list(want_counts), acc


def _veltkamp_cases(m):
    """float64 sums around every kind of point of an m-bit grid: just off midpoints (one
    float64 ulp either side), just off grid points, just below powers of two, random."""
    rng = np.random.default_rng(m)
    n = 1 << 14
    e = rng.integers(-60, 60, n)
    keep = rng.integers(0, 1 << m, n) | (1 << m)            # m + 1 significant bits
    shift = 52 - m
    half = 1 << (shift - 1)
    rem = np.select([rng.random(n) < 0.25, rng.random(n) < 0.5, rng.random(n) < 0.75],
                    [half + rng.integers(-3, 4, n), rng.integers(1, 4, n),
                     (1 << shift) - rng.integers(1, 4, n)],
                    rng.integers(1, 1 << shift, n))
    rem = np.clip(rem, 1, (1 << shift) - 1)
    keep[::7] = (1 << (m + 1)) - 1                         # the top of a binade
    mant = (keep.astype(np.uint64) << np.uint64(shift)) | rem.astype(np.uint64)
    s = np.ldexp(mant.astype(np.float64), e - 52)            # exact: mant < 2**53
    s[rem == half] = np.nextafter(s[rem == half], np.inf)    # never a midpoint itself
    return np.concatenate([s, -s])


@pytest.mark.parametrize("m", [1, 2, 7, 10, 23, 50])
def test_veltkamp_split_is_nearest_off_midpoints(m):
    """The register chain's nearest step (kernels._split_nearest) against round_fast to
    nearest, wherever the chain takes it: round_fast's fast range, off grid points and
    midpoints; on sums one float64 ulp from midpoints, grid points and binade tops."""
    from numba import njit
    from lpsim.ops.exact import f2i, i2f
    from lpsim.rounding import NEAREST, kernel_params, round_fast
    fmt = lpsim.parse_format(f"fp(8,{m})")
    p = kernel_params(fmt, np.float64)
    factor = kernels.veltkamp_factor(p)
    assert factor == 2.0 ** (52 - m) + 1

    @njit
    def check(s, p, factor):
        bad = taken = 0
        for v in s:
            nb, ok = kernels._nearby(0.0, v, NEAREST, 0, p)
            if ok:
                taken += 1
                bad += kernels._split_nearest(v, factor) != i2f(nb)
        return bad, taken

    bad, taken = check(_veltkamp_cases(m), p, factor)
    assert bad == 0 and taken > 20000


def test_veltkamp_split_only_where_it_holds():
    from lpsim.rounding import kernel_params
    for fmt, taken in (("bf16", True), ("fp(5,2,0)", True), ("fp(8,50)", True),
                       ("fp(8,51)", False), ("fp(4,0,7)", False), ("e8m0fnu", False)):
        factor = kernels.veltkamp_factor(kernel_params(lpsim.parse_format(fmt), np.float64))
        assert (factor != 0) == taken, fmt


@pytest.mark.parametrize("acc", ["bf16", "fp(5,1,3)", "fp32", "fp(8,50)"])
def test_long_chains_to_nearest_equal_the_gemm_kernel(acc):
    """Long sequential dots (the chain's Veltkamp step) equal the GEMM kernel bit for bit,
    counters too, from float32 operands as they are and from float64 ones."""
    rng = np.random.default_rng(zlib.crc32(acc.encode()))
    K = 20000
    x = (rng.standard_normal((3, K)) * np.exp2(rng.integers(-12, 12, (3, K)))).astype(np.float32)
    y = rng.standard_normal((3, K)).astype(np.float32)
    x[1] = np.abs(x[1])                                   # growth: every binade upward
    x[2, 1::2] = -x[2, 0:K - 1:2]                          # cancellation
    model = lpsim.ops.AccumulationModel("fp32", acc, "fp64", True, "sequential", "nearest",
                                        "nearest")
    got, got_counts, want, want_counts = _chain_and_gemm(x, y, model, seed=3)
    assert got.tobytes() == want.tobytes()
    assert list(got_counts) == list(want_counts)
    # the chain compiled for float32 operands (ops.dot's path for float32 vectors)
    setup = _setup(resolve(model, np.float32), np.dtype(np.float32), True, "dot")
    out = np.empty(3)
    counts = kernels.run(kernels.chain, 3, K, 1, x, y, out, setup.mode, setup.omode, 32, 32,
                         setup.pva, setup.pvo, 3, 0, 7, K, True, setup.hw)
    assert out.tobytes() == want.tobytes()
    assert list(counts) == list(want_counts)
    readonly = x[0].copy()
    readonly.flags.writeable = False
    strided = np.repeat(x[0], 2)[::2]
    for row in range(3):
        for a, b in ((x[row], y[row]), (x[row].astype(np.float64), y[row].astype(np.float64)),
                     (x[row], y[row].astype(np.float64))):
            assert np.float64(ops.dot(a, b, model=model)).tobytes() == want[row].tobytes()
    kw = dict(acc_fmt=acc, out_fmt="fp64", order="sequential")    # a cached product
    for a in (x[0], readonly, strided):     # float32 copies where the chain needs them
        for _ in range(2):                  # the general path, then the cached one
            assert np.float64(ops.dot(a, y[0], **kw)).tobytes() == want[0].tobytes()


@pytest.mark.parametrize("mode", ["nearest", "stochastic"])
def test_thread_pool_products_equal_the_serial_ones(mode, monkeypatch):
    rng = np.random.default_rng(4)
    a = rng.standard_normal((9, 300)).astype(np.float32)
    b = rng.standard_normal((300, 70)).astype(np.float32)
    v = rng.standard_normal((5, 4000)).astype(np.float32)
    kw = dict(acc_fmt="bf16", acc_rounding=mode, seed=8)
    results = []
    for steps in (1, 1 << 62):          # every call on the pool / none
        monkeypatch.setattr(kernels, "PARALLEL_STEPS", steps)
        monkeypatch.setattr(lpsim.ops.reductions, "PARALLEL_STEPS", steps)
        stats = RoundingStats()
        results.append((ops.matmul(a, b, stats=stats, **kw).tobytes(),
                        ops.dot(v, v[::-1], order="sequential", stats=stats, **kw).tobytes(),
                        ops.sum(v, -1, order=("blocked", 64), stats=stats, **kw).tobytes(),
                        stats.as_dict()))
    assert results[0] == results[1]


@pytest.mark.parametrize("M, N, K", [
    (1, kernels.LANES_MAX - 1, 2),          # one item, one row
    (3, 86, 5),                             # 258 outputs: an item ends inside row 2
    (kernels.LANES_MAX + 1, 1, 4),          # one column: each item spans many rows
    (2, 129, 300),                          # K = 300: fewer lanes (gemm_lanes(300) = 218)
    (5, 7, 2049),                           # K > 2048: the fewest lanes (TILE)
])
@pytest.mark.parametrize("order", ["sequential", "pairwise", ("blocked", 2)], ids=str)
def test_gemm_work_items_across_rows_and_lane_counts(M, N, K, order):
    """Every output of the GEMM kernel, whose items are runs of gemm_lanes(K) outputs in C
    order, equals the exact per-step reference (tests/test_ops_reductions.py), stochastic
    accumulator included, at item ends inside rows, single columns and every lane count."""
    from test_ops_reductions import reference_dot
    rng = np.random.default_rng(zlib.crc32(repr((M, N, K, order)).encode()))
    a = lpsim.quantize(rng.standard_normal((M, K)), "bf16")
    b = lpsim.quantize(rng.standard_normal((K, N)), "bf16")
    for mode in ("nearest", "stochastic"):
        stats = RoundingStats()
        got = ops.matmul(a, b, in_fmt="bf16", acc_fmt="fp(5,6,0)", out_fmt="bf16",
                         acc_rounding=mode, order=order, fused=order != "pairwise", seed=3,
                         stats=stats)
        assert stats.elements > 0
        # the first and last outputs of every item, and a few inside
        L = kernels.gemm_lanes(K)
        checks = sorted({o for s in range(0, M * N, L) for o in (s, s + 1, s + L - 1)
                         if o < M * N} | {M * N - 1})
        for o in checks[:2] if K > 1000 else checks:
            i, j = divmod(o, N)
            want = reference_dot(a[i], b[:, j], acc="fp(5,6,0)", out="bf16", acc_mode=mode,
                                 out_mode="nearest", fused=order != "pairwise", order=order,
                                 seed=3, stream=0, o=o)
            assert got[i, j] == float(want), (mode, o)


QUICK_FORMATS = ["bf16", "fp16", "e4m3fn", "e5m2", "e2m1fn", "fp(5,4,2)", "tf32",
                 "fp(4,3,0, saturate=True)"]


def _patterns():
    """About 2**20 float32 bit patterns: a stride through all 2**32 (every binade, NaN
    payloads, subnormals) and ties at every bit position of random values."""
    rng = np.random.default_rng(77)
    stride = np.arange(0, 2 ** 32, 4099, dtype=np.uint64).astype(np.uint32)
    ties = rng.integers(0, 2 ** 32, 2 ** 18, dtype=np.uint64).astype(np.uint32)
    cut = rng.integers(1, 24, ties.size).astype(np.uint32)
    ties = ((ties >> cut) << cut) | (np.uint32(1) << (cut - 1))
    return np.concatenate([stride, ties]).view(np.float32)


def _general_kernel(x, fmt, offset=0):
    """(values, counts) of lpsim.cpu's general nearest kernel on the float32 array x."""
    request = quantize_module.plan(fmt, "nearest", np.float32)
    out, counts = np.empty_like(x), np.zeros(cpu.NCOUNTS, np.int64)
    kernel = cpu.entry(MODES["nearest"], np.dtype(np.float32))
    kernel(x, out, np.array(request.params, np.int64), request.k, 0, 0, 0, offset, 0,
           cpu.ntasks(x.size, offset), counts)
    return out, counts


@pytest.mark.parametrize("fmt", QUICK_FORMATS)
def test_float32_nearest_kernel_equals_the_general_kernel(fmt):
    """lpsim.quantize without stats rounds float32 to nearest with lpsim.cpu.round_nearest32
    (one float32 add per element); with stats, the general kernel.  Against the general
    kernel called alone: the same bits (and counters) on every float32 binade and tie, in
    place and not, at every size threshold (serial and threaded), with offsets; and
    ml_dtypes where it has the format."""
    route = quantize_module._route(lpsim.parse_format(fmt), "nearest", np.dtype(np.float32),
                                   None)
    assert route.quick is cpu.nearest32_entry() and route.kernel is not route.quick
    x = _patterns()
    want, want_counts = _general_kernel(x, fmt)
    stats = RoundingStats()
    for got in (quantize(x, fmt), quantize(x, fmt, stats=stats)):
        assert got.view(np.uint32).tobytes() == want.view(np.uint32).tobytes()
    assert np.array_equal(stats.counts, want_counts)
    inplace = x.copy()
    quantize(inplace, fmt, out=inplace)
    assert inplace.tobytes() == want.tobytes()
    ml = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16, "e4m3fn": ml_dtypes.float8_e4m3fn,
          "e5m2": ml_dtypes.float8_e5m2}.get(fmt)
    if ml is not None:
        with np.errstate(over="ignore", invalid="ignore"):
            theirs = x.astype(ml).astype(np.float32)
        assert np.array_equal(want, theirs, equal_nan=True)
    grain = cpu.NEAREST32_GRAIN             # the nearest kernel's own threshold for threads
    for n in SIZES + [2 * grain - 1, 2 * grain + 7]:
        y = _data(n, np.float32, fmt)
        for offset in (0, 3):
            ref, ref_counts = _general_kernel(y, fmt, offset)
            stats = RoundingStats()
            for got in (quantize(y, fmt, offset=offset),
                        quantize(y, fmt, offset=offset, stats=stats)):
                assert got.tobytes() == ref.tobytes(), (n, offset)
            assert np.array_equal(stats.counts, ref_counts), (n, offset)
            z = y.copy()
            quantize(z, fmt, offset=offset, out=z)
            assert z.tobytes() == ref.tobytes(), (n, offset)


@pytest.mark.parametrize("fmt", ["e4m3fnuz", "fp(4,3,0, subnormals=False)", "fp(8,23)"])
def test_formats_the_float32_nearest_kernel_does_not_take(fmt):
    """Unsigned zero, no subnormals, a format as wide as float32: the general kernel."""
    route = quantize_module._route(lpsim.parse_format(fmt), "nearest", np.dtype(np.float32),
                                   None)
    assert route.quick is route.kernel


def test_small_calls_take_the_three_argument_kernel(monkeypatch):
    """A small C-contiguous float32 call to nearest with nothing else asked runs lpsim.cpu's
    whole-array nearest32 kernel from lpsim.quantize itself (_round_array is never called);
    the same bits as the general kernel, out of place, into ``out`` and in place, 1-D, 2-D
    and 0-d; every other call falls back to the general path with its bits and errors."""
    fmt = "bf16"
    quantize(np.ones(4, np.float32), fmt)                       # the route, validated
    assert quantize_module._SMALL[fmt, "nearest"][0] is cpu.nearest32_all_entry()
    general = quantize_module._round_array
    with monkeypatch.context() as m:
        m.setattr(quantize_module, "_round_array", None)        # a call would raise
        for n in [s for s in SIZES if s < quantize_module.SMALL_BELOW] + [
                quantize_module.SMALL_BELOW - 1]:
            y = _data(n, np.float32, "small")
            ref, _ = _general_kernel(y, fmt)
            assert quantize(y, fmt).tobytes() == ref.tobytes(), n
            out = np.full_like(y, np.nan)
            assert quantize(y, fmt, out=out) is out and out.tobytes() == ref.tobytes(), n
            z = y.copy()
            assert quantize(z, fmt, out=z) is z and z.tobytes() == ref.tobytes(), n
            if n % 3 == 0 and n:
                two = quantize(y.reshape(3, -1), fmt)
                assert two.shape == (3, n // 3) and two.tobytes() == ref.tobytes(), n
        y = np.array(3.0 + 2.0 ** -10, np.float32)
        got = quantize(y, fmt)
        assert got.shape == () and got == np.float32(3.0)
    calls = []
    monkeypatch.setattr(quantize_module, "_round_array",
                        lambda *args: calls.append(1) or general(*args))
    y = _data(1000, np.float32, "fallback")
    ref, _ = _general_kernel(y, fmt)
    readonly = y.copy()
    readonly.flags.writeable = False
    fallbacks = [
        lambda: quantize(y.reshape(100, 10).T, fmt).T.reshape(-1),    # Fortran order
        lambda: quantize(readonly, fmt),                               # read-only x
        lambda: quantize(np.repeat(y, 2)[::2], fmt),                   # strided x
        lambda: quantize(y, fmt, out=np.empty(2 * y.size, np.float32)[::2]),  # strided out
        lambda: quantize(y, fmt, stream=1),
        lambda: quantize(y, fmt, seed=7),
        lambda: quantize(y, fmt, stats=RoundingStats()),
        lambda: quantize(y.astype(np.float64), fmt).astype(np.float32),      # float64
    ]
    for i, call in enumerate(fallbacks):
        before = len(calls)
        assert call().tobytes() == ref.tobytes(), i
        assert len(calls) == before + 1, i
    both = np.concatenate([y, y[:1]])                                  # out overlaps x
    quantize(both[:-1], fmt, out=both[1:])
    assert both[1:].tobytes() == ref.tobytes()
    shifted = _data(1000, np.float32, "fallback")
    assert quantize(shifted, fmt, offset=5).tobytes() == ref.tobytes()
    with pytest.raises(TypeError, match="a format is an lpsim.Format or a string"):
        quantize(y, ["bf16"])                   # unhashable: named, as on the general path
    with pytest.raises((TypeError, ValueError), match="rounding"):
        quantize(y, fmt, ["nearest"])
    bad_out = readonly.copy()
    bad_out.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        quantize(y, fmt, out=bad_out)
    with pytest.raises(ValueError, match="dtype float32"):
        quantize(y, fmt, out=np.empty(y.size, np.float64))
    with pytest.raises(ValueError, match="shape"):
        quantize(y, fmt, out=np.empty(y.size - 1, np.float32))
