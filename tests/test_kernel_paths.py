"""The CPU kernel's paths equal the scalar decision, element by element.

Every path of :mod:`lpsim.quantize`'s kernel (serial and parallel, a nonzero offset, in place,
a non-contiguous input) must give exactly the bits and the six counters of a plain Python
loop that calls :func:`lpsim.rounding.round_bits` (its pure-Python body) on each element,
with the element's random word from :func:`lpsim.philox.random_words`.  The offsets cross
the kernel's chunk and task boundaries and misalign the Philox blocks.
"""

import functools
import zlib

import numpy as np
import pytest

import lpsim
from lpsim import RoundingStats, quantize
from lpsim.philox import random_words
from lpsim import cpu
from lpsim.cpu import CHUNK, PARALLEL_GRAIN, TASK, ntasks
from lpsim.quantize import SMALL_BELOW, plan
from lpsim.rounding import round_bits

N = 2000
SEED, STREAM = 20240607, 3
OFFSETS = (0, 3, TASK * CHUNK - N // 2)   # aligned; odd; straddling a chunk and a task
FORMATS = {
    "bf16": "bf16", "fp16": "fp16", "e5m2": "e5m2", "e4m3fn": "e4m3fn",
    "fp(4,3,4)": "fp(4,3,4)", "fp(6,9,0)": "fp(6,9,0)", "fp(8,7,4)": "fp(8,7,4)",
    "e5m2-nosub": lpsim.fp(5, 2, subnormals=False),
    "e4m3-saturate": lpsim.fp(4, 3, specials="saturate"),
    "fp(3,0,1)": "fp(3,0,1)",   # m = 0 with an even bias: ties look at the exponent code
    "fp(3,0,0)": "fp(3,0,0)",   # and an odd one: the even code is the odd power of two
}
MODES = [(name, None) for name in lpsim.rounding.MODES] + [("stochastic", 4)]
DTYPES = {np.float32: np.int32, np.float64: np.int64}


@functools.cache
def values(dtype, key):
    """About N values for the format: random bit patterns, its whole range, ties, specials."""
    fmt = lpsim.parse_format(FORMATS[key])
    bits_dtype = DTYPES[dtype]
    info = np.iinfo(bits_dtype)
    rng = np.random.default_rng(zlib.crc32(f"{dtype.__name__} {key}".encode()))
    patterns = rng.integers(info.min, info.max, 500, dtype=bits_dtype, endpoint=True)
    # the format's range and a little beyond: underflow, subnormals, normals, overflow
    exponents = rng.integers(fmt.emin - fmt.m - 4, fmt.emax + 3, 900)
    spread = (rng.random(900) + 1) * np.exp2(exponents.astype(float))
    # representable values, and their midpoints (ties) and near-ties
    quantum = np.exp2(np.maximum(exponents[:300], fmt.emin) - fmt.m)
    grid = np.floor(spread[:300] / quantum) * quantum
    ties = grid + quantum / 2
    near = grid + quantum * rng.choice([1 / 4, 3 / 4, 1 / 1024], 300)
    with np.errstate(over="ignore"):                                   # beyond float32
        finite = np.concatenate([spread, grid, ties, near]).astype(dtype)
    finite *= rng.choice(np.array([-1, 1], dtype), finite.size)
    tiny = np.array([1, 2, 3, 0x7FFFF], bits_dtype).view(dtype)       # container subnormals
    specials = np.array([0.0, np.inf, np.nan, fmt.max_finite, fmt.min_normal,
                         fmt.min_subnormal, fmt.max_finite * (1 + 2.0 ** -(fmt.m + 2)),
                         fmt.min_subnormal / 2, fmt.min_subnormal * 0.75], dtype)
    payload = np.array([info.max, -1], bits_dtype).view(dtype)        # NaNs with payloads
    x = np.concatenate([tiny, specials, -specials, payload, patterns.view(dtype), finite])[:N]
    return rng.permutation(x)


@functools.cache
def words(itemsize, offset):
    return tuple(random_words(N, itemsize, SEED, STREAM, offset))


@functools.cache
def expected(dtype, key, mode, sr_bits, offset):
    """(bits, counters) from the Python loop over round_bits."""
    request = plan(FORMATS[key], mode, dtype, seed=SEED, stream=STREAM, sr_bits=sr_bits,
                   offset=offset)
    itemsize = np.dtype(dtype).itemsize
    r = words(itemsize, offset) if mode.startswith("stochastic") else (0,) * N
    out = np.empty(N, np.int64)
    counts = np.zeros(6, np.int64)
    for i, b in enumerate(values(dtype, key).view(DTYPES[dtype])):
        bits, flags = round_bits(int(b), request.mode, r[i], request.k, request.params)
        out[i] = bits
        counts += [(int(flags) >> f) & 1 for f in range(6)]
    return out.astype(DTYPES[dtype]), counts


def _round_serial(x, out, request):
    """All tasks in one call of the compiled entry point."""
    counts = np.zeros(cpu.NCOUNTS, np.int64)
    kernel = cpu.entry(request.mode, x.dtype)
    assert kernel(x, out, np.array(request.params, np.int64), request.k, request.seed_lo,
                  request.seed_hi, request.stream, request.offset, 0,
                  ntasks(x.size, request.offset), counts) == 0
    assert counts[0] == x.size
    return counts[1:]


def _round_split(x, out, request):
    """One call per task, as the thread pool deals them out."""
    counts = np.zeros(cpu.NCOUNTS, np.int64)
    kernel = cpu.entry(request.mode, x.dtype)
    for t in range(ntasks(x.size, request.offset)):
        assert kernel(x, out, np.array(request.params, np.int64), request.k, request.seed_lo,
                      request.seed_hi, request.stream, request.offset, t, t + 1, counts) == 0
    assert counts[0] == x.size
    return counts[1:]


def _round_parallel(x, out, request):
    """lpsim.cpu.run: the thread pool for large arrays."""
    counts = np.zeros(cpu.NCOUNTS, np.int64)
    assert cpu.run(x, out, request.mode, np.array(request.params, np.int64), request.k,
                   request.seed_lo, request.seed_hi, request.stream, request.offset,
                   counts) == 0
    assert counts[0] == x.size
    return counts[1:]


def run_kernel(kernel, x, out, request):
    return kernel(x, out, request)


@pytest.mark.parametrize("mode, sr_bits", MODES, ids=[f"{m}-{k}" if k else m for m, k in MODES])
@pytest.mark.parametrize("key", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_every_path_equals_the_scalar_decision(dtype, key, mode, sr_bits):
    x = values(dtype, key)
    bits_dtype = DTYPES[dtype]
    plans = {offset: plan(FORMATS[key], mode, dtype, seed=SEED, stream=STREAM,
                          sr_bits=sr_bits, offset=offset) for offset in OFFSETS}

    def check(got, counts, offset, what):
        want, want_counts = expected(dtype, key, mode, sr_bits, offset)
        bad = np.flatnonzero(got.view(bits_dtype) != want)
        assert bad.size == 0, (f"{what}: {bad.size} elements differ, first x={x[bad[0]]!r} "
                               f"got={got[bad[0]]!r} want={want.view(dtype)[bad[0]]!r}")
        assert list(counts) == list(want_counts), what

    for kernel, offsets in ((_round_serial, OFFSETS[:2]), (_round_split, OFFSETS[::2])):
        for offset in offsets:
            out = np.full_like(x, 7.0)
            counts = run_kernel(kernel, x, out, plans[offset])
            check(out, counts, offset, f"{kernel.__name__} offset={offset}")
        y = x.copy()
        counts = run_kernel(kernel, y, y, plans[offsets[-1]])
        check(y, counts, offsets[-1], f"{kernel.__name__} in place offset={offsets[-1]}")

    # the public entry points: in place, a non-contiguous input and output, stats
    offset = OFFSETS[1]
    y = x.copy()
    stats = RoundingStats()
    quantize(y, FORMATS[key], mode, seed=SEED, stream=STREAM, sr_bits=sr_bits, out=y,
             stats=stats, offset=offset)
    check(y, [getattr(stats, f) for f in lpsim.stats.COUNTERS], offset, "quantize in place")
    strided = np.zeros((N, 3), dtype)
    strided[:, 1] = x
    target = np.zeros((2, N), dtype)[:, ::-1][1]
    for out in (None, target):
        stats = RoundingStats()
        got = quantize(strided[:, 1], FORMATS[key], mode, seed=SEED, stream=STREAM,
                       sr_bits=sr_bits, offset=offset, out=out, stats=stats)
        assert out is None or got is out
        check(got, [getattr(stats, f) for f in lpsim.stats.COUNTERS], offset,
              f"non-contiguous input, out={'strided' if out is not None else None}")


@pytest.mark.parametrize("key", FORMATS)
def test_calls_without_stats_equal_the_scalar_decision(key):
    """The routes a call without stats takes (float32 to nearest: lpsim.rounding.nearest32's
    whole-array kernel below quantize.SMALL_BELOW elements, its threaded kernel above) give
    round_bits' bits; they once rounded m = 0 ties by the power of two's parity, and float32
    subnormals with the quantum of 2**-127 in formats whose normals reach below it."""
    x = values(np.float32, key)
    want = expected(np.float32, key, "nearest", None, 0)[0]
    n = SMALL_BELOW + 5
    for y, w in ((x, want), (np.resize(x, n), np.resize(want, n))):
        got = quantize(y, FORMATS[key]).view(np.int32)
        bad = np.flatnonzero(got != w)
        assert bad.size == 0, (y.size, y[bad[0]], got[bad[0]], w[bad[0]])


@pytest.mark.parametrize("mode", ["nearest", "stochastic"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_thread_pool_split_equals_the_serial_kernel(dtype, mode):
    """An array of several tasks, large enough for the pool (N values above are one task)."""
    n = max(3 * TASK * CHUNK, 2 * PARALLEL_GRAIN) + 5
    x = np.resize(values(dtype, "e5m2"), n)            # the edge cases, repeated
    bits_dtype = DTYPES[dtype]
    for offset in (0, 3):
        assert ntasks(n, offset) > 1
        request = plan("e5m2", mode, dtype, seed=SEED, stream=STREAM, offset=offset)
        want, got = np.empty_like(x), np.empty_like(x)
        want_counts = run_kernel(_round_serial, x, want, request)
        got_counts = run_kernel(_round_parallel, x, got, request)
        assert np.array_equal(got.view(bits_dtype), want.view(bits_dtype)), offset
        assert list(got_counts) == list(want_counts), offset
        y = x.copy()
        got_counts = run_kernel(_round_parallel, y, y, request)
        assert np.array_equal(y.view(bits_dtype), want.view(bits_dtype)), ("in place", offset)
        assert list(got_counts) == list(want_counts), ("in place", offset)


def test_values_cover_the_fast_and_the_slow_path():
    """The data must exercise both round_fast and round_bits, so a path cannot hide."""
    for dtype in DTYPES:
        for key in ("bf16", "e4m3fn", "fp(3,0,1)"):
            x = values(dtype, key)
            p = plan(FORMATS[key], "nearest", dtype).params
            biased = (x.view(DTYPES[dtype]).astype(np.int64) & p.MAG) >> p.M
            fast = (biased >= p.fast_lo) & (biased <= p.fast_hi)
            assert fast.sum() >= 100 and (~fast).sum() >= 100, (dtype, key, fast.sum())


@functools.lru_cache(maxsize=None)
def _round_one_and_bits():
    """A kernel writing round_one's and round_bits' results element by element: made once,
    so that every format and container shares its compiles (the parameters are one type)."""
    from numba import njit

    from lpsim.rounding import round_one

    @njit
    def both(xb, mode, rs, k, p, one, ones, bits, flags):
        for i in range(xb.size):
            one[i], ones[i] = round_one(xb[i], mode, rs[i], k, p)
            bits[i], flags[i] = round_bits(xb[i], mode, rs[i], k, p)
    return both


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: d.__name__)
@pytest.mark.parametrize("name", list(FORMATS))
def test_round_one_equals_round_bits(name, dtype):
    """round_one (round_fast, round_bits where it declines: the GPU kernels' and the
    optimizer's per-element decision) gives round_bits' bits and flags on every element of
    values() (random bit patterns, the format's range, ties, specials), every mode, full and
    few-bit SR."""
    from lpsim.rounding import MODES, kernel_params

    both = _round_one_and_bits()
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    p = kernel_params(lpsim.parse_format(FORMATS[name]), dtype)
    xb = values(dtype, name).view(DTYPES[dtype]).astype(np.int64)  # ranges, ties, specials
    rs = rng.integers(0, 2 ** p.W, xb.size, dtype=np.uint64).astype(np.int64)
    for mode in MODES.values():
        for k in (p.W, 3):
            out = [np.empty(xb.size, np.int64) for _ in range(4)]
            both(xb, mode, rs, k, p, *out)
            one, ones, bits, flags = out
            assert np.array_equal(one, bits), (mode, k)
            assert np.array_equal(ones, flags), (mode, k)


#: elements a group of the fast pass leaves for the rest of the kernel, group by group:
#: none, one at a time (lpsim.cpu.SUB_SCALAR and below), and the vector pass above it
LEFT_PER_GROUP = (0, 1, 2, cpu.SUB_SCALAR, cpu.SUB_SCALAR + 1, 8, 33, cpu.GROUP)


@functools.cache
def grouped_values(dtype, key):
    """Groups of GROUP elements: values round_fast takes (the format's normals below its
    top binade), with LEFT_PER_GROUP[g % 8] of them swapped for values it leaves (subnormal
    results, underflow, overflow, NaN, inf, container subnormals)."""
    fmt = lpsim.parse_format(FORMATS[key])
    rng = np.random.default_rng(zlib.crc32(f"grouped {dtype.__name__} {key}".encode()))
    groups = 3 * len(LEFT_PER_GROUP)
    x = (rng.random(groups * cpu.GROUP) + 1) * np.exp2(
        rng.integers(fmt.emin, fmt.emax, groups * cpu.GROUP).astype(float))
    x *= rng.choice([-1.0, 1.0], x.size)
    with np.errstate(over="ignore"):
        left = np.concatenate([
            (rng.random(64) + 0.01) * float(fmt.min_normal),          # subnormal results
            rng.random(16) * float(fmt.min_subnormal),               # underflow
            (rng.random(16) + 1) * float(fmt.max_finite),            # overflow
            [np.inf, -np.inf, np.nan], np.array([1, 5], DTYPES[dtype]).view(dtype)])
        x, left = x.astype(dtype), left.astype(dtype)
    for g in range(groups):
        n = LEFT_PER_GROUP[g % len(LEFT_PER_GROUP)]
        at = g * cpu.GROUP + rng.choice(cpu.GROUP, n, replace=False)
        x[at] = rng.choice(left, n)
    return x


@pytest.mark.parametrize("mode, sr_bits", [("nearest", None), ("stochastic", None),
                                           ("stochastic", 4), ("up", None),
                                           ("toward_zero", None)])
@pytest.mark.parametrize("key", ["bf16", "e4m3fn", "fp(4,3,4)", "e5m2-nosub",
                                 "e4m3-saturate"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_groups_with_few_and_many_left_equal_the_scalar_decision(dtype, key, mode, sr_bits):
    x = grouped_values(dtype, key)
    request = plan(FORMATS[key], mode, dtype, seed=SEED, stream=STREAM, sr_bits=sr_bits)
    r = random_words(x.size, x.itemsize, SEED, STREAM, 0) if mode.startswith("stochastic") \
        else np.zeros(x.size, np.int64)
    want = np.empty(x.size, np.int64)
    want_counts = np.zeros(6, np.int64)
    for i, b in enumerate(x.view(DTYPES[dtype])):
        bits, flags = round_bits(int(b), request.mode, int(r[i]), request.k, request.params)
        want[i] = bits
        want_counts += [(int(flags) >> f) & 1 for f in range(6)]
    out = np.empty_like(x)
    counts = _round_serial(x, out, request)
    bad = np.flatnonzero(out.view(DTYPES[dtype]) != want.astype(DTYPES[dtype]))
    assert bad.size == 0, f"{bad.size} differ, first x={x[bad[0]]!r} got {out[bad[0]]!r}"
    assert list(counts) == list(want_counts)


#: formats at the edges of what a float32 container's fast paths take: 22 mantissa bits
#: (nearest32's add rounds at twice the quantum there), normals starting below float32's
#: (round_fast_sub's 32-bit lanes and round_fast's range bounds went negative), a top binade
#: below float32's normals, a smallest subnormal above 2**104 (nearest32's c saturates)
EDGE_FORMATS = ["fp(8,22)", "fp(2,1,140)", "fp(2,1,128)", "fp(8,8,12, specials='saturate')",
                "fp(7,3,84, specials='saturate')", "fp(3,5,-117, specials='fn')",
                "fp(2,9,-118)"]


@pytest.mark.parametrize("mode", ["nearest", "stochastic", "toward_zero", "up"])
@pytest.mark.parametrize("fmt", EDGE_FORMATS)
def test_edge_formats_equal_the_scalar_decision(fmt, mode):
    """Every float32 path (the small-call and threaded nearest32 kernels, the general kernel
    with its fast, vector and slow passes) on formats at the edges of their preconditions
    gives round_bits' bits and counters."""
    f = lpsim.parse_format(fmt)
    rng = np.random.default_rng(zlib.crc32(fmt.encode()))
    lo, hi = max(f.emin - f.m - 3, -149), min(f.emax + 2, 127)
    x = ((rng.random(640) + 1) * np.exp2(rng.integers(lo, hi + 1, 640).astype(float)))
    x[::7] = float(f.max_finite) * (1 + rng.random(92))            # the top binade and above
    with np.errstate(over="ignore"):                                  # beyond float32: inf
        x = (x * rng.choice([-1.0, 1.0], x.size)).astype(np.float32)
    request = plan(fmt, mode, np.float32, seed=SEED, stream=STREAM)
    r = random_words(x.size, 4, SEED, STREAM, 0) if mode == "stochastic" \
        else np.zeros(x.size, np.int64)
    want = np.empty(x.size, np.int64)
    want_counts = np.zeros(6, np.int64)
    for i, b in enumerate(x.view(np.int32)):
        bits, flags = round_bits(int(b), request.mode, int(r[i]), request.k, request.params)
        want[i] = bits
        want_counts += [(int(flags) >> j) & 1 for j in range(6)]
    want = want.astype(np.int32)
    cases = [(x, want)]
    if mode != "stochastic":          # repeated values round alike without random words
        cases.append((np.resize(x, SMALL_BELOW + 640), np.resize(want, SMALL_BELOW + 640)))
    for y, w in cases:
        got = quantize(y, fmt, mode, seed=SEED, stream=STREAM).view(np.int32)
        assert np.array_equal(got, w), (y.size, y[np.flatnonzero(got != w)[:3]])
    stats = RoundingStats()
    got = quantize(x, fmt, mode, seed=SEED, stream=STREAM, stats=stats).view(np.int32)
    assert np.array_equal(got, want)
    assert [getattr(stats, c) for c in lpsim.stats.COUNTERS] == list(want_counts)


def test_nearest_bf16_is_round_to_nearest_even_on_every_bfloat16_binade():
    """lpsim.rounding.nearest_bf16 (the bfloat16 state rounding of lpsim.optim's step) equals
    ml_dtypes' float32 -> bfloat16 conversion on every high half (sign, exponent, kept
    mantissa: every binade, subnormals, both parities) with the low halves that decide
    (0, 1, below, at and above the tie, the largest) and random ones, wherever the value is
    finite and below bfloat16's largest (the step leaves the rest to round_bits)."""
    import ml_dtypes
    from numba import njit
    from lpsim.rounding import nearest_bf16
    from lpsim.word32 import as_int64, word

    @njit
    def rounded(bits, out):
        for i in range(bits.size):
            out[i] = as_int64(nearest_bf16(word(bits[i])))

    highs = np.arange(1 << 16, dtype=np.uint64) << np.uint64(16)
    lows = np.array([0, 1, 0x7FFE, 0x7FFF, 0x8000, 0x8001, 0xFFFE, 0xFFFF]
                    + list(np.random.default_rng(3).integers(0, 1 << 16, 8)), np.uint64)
    bits = (highs[:, None] | lows[None, :]).reshape(-1).astype(np.uint32)
    x = bits.view(np.float32)
    keep = np.isfinite(x) & (np.abs(x) < float(ml_dtypes.finfo(ml_dtypes.bfloat16).max))
    bits, x = bits[keep], x[keep]
    got = np.empty(bits.size, np.int64)
    rounded(bits.view(np.int32), got)
    want = x.astype(ml_dtypes.bfloat16).astype(np.float32).view(np.uint32)
    assert bits.size > 900_000
    assert np.array_equal(got.astype(np.uint32), want)


@functools.cache
def _round_one_word_kernel():
    from numba import njit
    from lpsim.rounding import round_one_word

    @njit
    def rounded(bits, words, mode, k, p, sub, out, flags):
        for i in range(bits.size):
            out[i], flags[i] = round_one_word(bits[i], mode, words[i], k, p, sub)
    return rounded


@pytest.mark.parametrize("fmt", ["bf16", "e4m3fn", "e2m1fn", "fp(6,9,0)"] + EDGE_FORMATS[:3])
def test_round_one_word_is_round_bits_in_32_bit_words(fmt):
    """lpsim.rounding.round_one_word (the specialised CUDA kernels' decision: the straight
    path in 32-bit words, round_bits elsewhere), compiled, gives round_bits' bits and flags
    for both straight paths, four modes, full and few-bit SR, on values of every binade,
    subnormals, zeros, infs and NaNs."""
    f = lpsim.parse_format(fmt)
    rng = np.random.default_rng(zlib.crc32(fmt.encode()) + 1)
    lo, hi = max(f.emin - f.m - 3, -149), min(f.emax + 2, 127)
    x = (rng.random(1500) + 1) * np.exp2(rng.integers(lo, hi + 1, 1500).astype(float))
    with np.errstate(over="ignore"):
        x = (x * rng.choice([-1.0, 1.0], x.size)).astype(np.float32)
    x[:6] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45]
    bits = x.view(np.int32)
    words = rng.integers(0, 2 ** 32, x.size).astype(np.int64)
    rounded = _round_one_word_kernel()
    for mode, sr_bits in [("nearest", None), ("toward_zero", None), ("up", None),
                          ("stochastic", None), ("stochastic", 5)]:
        request = plan(fmt, mode, np.float32, seed=SEED, sr_bits=sr_bits)
        want = [round_bits(int(b), request.mode, int(r), request.k, request.params)
                for b, r in zip(bits, words)]
        for sub in (False, True):
            out, flags = np.empty(x.size, np.int64), np.empty(x.size, np.int64)
            rounded(bits, words, request.mode, request.k, request.params, sub, out, flags)
            assert [(int(o), int(g)) for o, g in zip(out, flags)] == \
                [(int(o), int(g)) for o, g in want], (fmt, mode, sr_bits, sub)


@functools.cache
def _round_fast_sub_kernel():
    from numba import njit
    from lpsim.rounding import round_fast_sub
    from lpsim.word32 import as_int64, as_signed64, word

    @njit
    def rounded(bits, words, mode, k, p, as_words, out, oks):
        for i in range(bits.size):
            if as_words:
                o, ok, _ = round_fast_sub(word(bits[i]), mode, word(words[i]), k, p)
                out[i], oks[i] = as_signed64(o), as_int64(ok)
            else:
                out[i], oks[i], _ = round_fast_sub(bits[i], mode, words[i], k, p)
    return rounded


@pytest.mark.parametrize("container, word_bits", [(np.float32, None), (np.float64, None),
                                                  (np.float64, 32)],
                         ids=["f32", "f64", "f64-words32"])
@pytest.mark.parametrize("fmt", ["e4m3fn", "e2m1fn", "e5m2", "fp(3,2,6)", "fp(6,9,0)"])
def test_stochastic_rounding_below_min_subnormal_at_its_threshold_words(fmt, container,
                                                                        word_bits):
    """round_fast_sub's SR of |x| = F min_subnormal (0 < F < 1) rounds up exactly for the
    random words below its threshold, worked out here with exact integers: R < ceil(F 2**W)
    at full width, R_k < floor(F 2**k) with k bits; each word next to the threshold, on
    either side (which random words almost never hit), for 64-bit lanes and 32-bit words
    (float32 containers), and float64 containers with 32-bit words (the block kernels'
    elements).  round_bits agrees on every one."""
    from fractions import Fraction
    from lpsim.rounding import MODES, kernel_params

    f = lpsim.parse_format(fmt)
    p = kernel_params(f, container)
    if word_bits:
        p = p._replace(W=word_bits)
    W, tiny = p.W, Fraction(2) ** (f.emin - f.m)
    rng = np.random.default_rng(zlib.crc32(f"{fmt} {container.__name__} {W}".encode()))
    digits = 53 if container is np.float64 else 24
    # F with a full significand, shifted by 0 to 40 binades: sticky bits below bit W too
    sig = rng.integers(2 ** (digits - 1), 2 ** digits, 240)
    shift = rng.integers(0, 41, 240)
    fractions = [Fraction(int(s), 2 ** (digits + int(d))) for s, d in zip(sig, shift)]
    fractions += [Fraction(1, 2), Fraction(1, 2 ** 30), 1 - Fraction(1, 2 ** (digits - 2))]
    cases = []                              # (value, word, k, rounds up)
    for F in fractions:
        for k in (W, 3):
            scaled = F * 2 ** k
            t = -(-scaled.numerator // scaled.denominator) if k == W else int(scaled)
            step = 2 ** (W - k)             # words with the same top k bits
            for top in {max(t - 1, 0), t}:
                if top < 2 ** k:
                    word = top * step + int(rng.integers(0, step))
                    cases += [(F * tiny * sign, word, k, top < t) for sign in (1, -1)]
    x = np.array([float(v) for v, *_ in cases], container)
    assert all(Fraction(float(a)) == v for a, (v, *_) in zip(x, cases))   # exact values
    bits = x.view(DTYPES[container]).astype(np.int64)
    words = np.array([w for _, w, *_ in cases], np.int64)
    mode = MODES["stochastic"]
    rounded = _round_fast_sub_kernel()
    for as_words in ([False, True] if container is np.float32 else [False]):
        for k in (W, 3):
            sel = np.array([c[2] == k for c in cases])
            out, oks = np.empty(sel.sum(), np.int64), np.empty(sel.sum(), np.int64)
            rounded(bits[sel], words[sel], mode, k, p, as_words, out, oks)
            got = out.astype(DTYPES[container]).view(container)
            want = [np.copysign(float(tiny) if up else 0.0, float(v))
                    for (v, _, _, up), s in zip(cases, sel) if s] if sel.any() else []
            assert oks.all() and np.array_equal(got, np.array(want, container)), (k, as_words)
            assert np.array_equal(np.signbit(got), np.signbit(np.array(want, container)))
            reference = [round_bits(int(b), mode, int(r), k, p)[0]
                         for b, r in zip(bits[sel], words[sel])]
            assert out.tolist() == reference, (k, as_words)


@functools.cache
def _round_sr_word_mismatches():
    from numba import njit
    from lpsim.rounding import (STOCHASTIC, round_fast_sub_conditions, round_sr_word,
                                round_sr_word_conditions)
    from lpsim.word32 import as_int64, word

    @njit
    def mismatches(start, stop, step, p, words):
        """(magnitudes in start..stop-1 by step, both signs, each with ``words`` and the
        three words around its decision point: where round_sr_word's ok or, where ok, its
        bits or round_sr_word_conditions' bits or flags differ from
        round_fast_sub_conditions', how many; round_fast_sub's ok count)."""
        bad = taken = 0
        for a in range(start, stop, step):
            lo = p.emin + p.EB
            s = min(p.M - p.m + (lo - min(a >> p.M, lo)), p.M)
            point = (a << (32 - s)) & 0xFFFFFFFF
            for sign in range(2):
                bits = np.int32(np.uint32(a | (sign << 31)))
                for j in range(words.size + 3):
                    r = words[j] if j < words.size else (point + j - words.size - 1) & 0xFFFFFFFF
                    w = word(np.uint32(r))
                    o1, ok1, i1, v1, u1, s1 = round_fast_sub_conditions(word(bits), STOCHASTIC,
                                                                        w, 32, p)
                    o2, ok2 = round_sr_word(word(bits), w, p)
                    o3, ok3, i3, v3, u3, s3 = round_sr_word_conditions(word(bits), w, p)
                    k1, k2 = as_int64(ok1), as_int64(ok2)
                    bad += np.int64(k1 != k2 or k1 != as_int64(ok3) or (k1 == 1 and (
                        as_int64(o1) != as_int64(o2) or as_int64(o1) != as_int64(o3)
                        or i1 != i3 or v1 != v3 or u1 != u3 or s1 != s3)))
                    taken += k1
        return bad, taken
    return mismatches


@pytest.mark.parametrize("fmt", ["e4m3fn", "e4m3", "e2m1fn", "e3m2fn", "e2m3fn", "fp(6,9,0)"])
def test_round_sr_word_is_round_fast_sub_with_full_words(fmt):
    """lpsim.rounding.round_sr_word (the specialised and block CUDA kernels' full-word SR)
    gives round_fast_sub's ok and, where ok, its bits, and round_sr_word_conditions its
    flags too: every 65537th float32 magnitude (both signs), every magnitude around the
    smallest subnormal, the smallest normal and the largest finite value, each with six
    random words and the three words at its decision point (the discarded bits as a
    fraction of 2**32, and one either side)."""
    p = plan(fmt, "stochastic", np.float32, seed=SEED).params
    words = np.array([0, 1, 2 ** 31, 2 ** 32 - 1, 123456789, 3000000000], np.int64)
    mismatches = _round_sr_word_mismatches()
    taken = 0
    for start, stop, step in [(0, 1 << 31, 65537), (0, 2 * p.tiny, max(1, p.tiny // 20000)),
                              (p.tiny - 3000, p.tiny + 3000, 1),
                              (p.minnorm - 3000, p.minnorm + 3000, 1),
                              (p.maxb - 3000, p.maxb + 3000, 1)]:
        bad, ok = mismatches(start, stop, step, p, words)
        assert bad == 0, (fmt, start, stop, step)
        taken += ok
    assert taken > 100_000          # most of what was tried is on the straight path
