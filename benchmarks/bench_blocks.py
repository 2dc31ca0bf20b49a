"""Block-scaled fake-quantize throughput: lpsim against the copy ceiling, gfloat and torchao.

Fake-quantizes n float32 values (rows of 4096, blocks along the last axis) to MXFP8 (E4M3),
MXFP4 and NVFP4, nearest and stochastic, and prints million elements per second next to,
measured in the same run: a copy (``np.copyto``; on the GPU ``torch.clone``), gfloat's
``quantize_block`` (OCP floor rule; timed on a slice, it runs in Python per element) and
torchao's cast plus dequantize (``to_mx`` + ``to_dtype``, ``nvfp4_quantize`` and unpacking:
the fake-quantize torchao users run).  Median of several runs after a warm-up.

    python benchmarks/bench_blocks.py [--log2n 22 (26 on cuda)] [--repeats 5] [--device cpu|cuda]
                                      [--json out.json] [--png out.png]
    python benchmarks/bench_blocks.py --scaled-mm   # GPU: hopper-fp8 vs torch._scaled_mm
    python benchmarks/bench_blocks.py --counted [--shape 2048 1024] [--repeats 15]
    python benchmarks/bench_blocks.py --columns [--shape 2048 1024] [--repeats 15]
    python benchmarks/bench_blocks.py --moved [--shape 2048 1024] [--repeats 15]
    python benchmarks/bench_blocks.py --hadamard [--shape 2048 1024] [--repeats 15]

``--counted``: the CPU cost of counting (``stats=BlockStats()``, what simulated training's
telemetry asks for) on a float32 array: ``lpsim.quantize`` without stats (the word kernel),
with stats (its counted variant) and with stats through the general float64-step kernel
that such calls took before (forced here by refusing the word kernel counters), every case
timed in each round, minimum over the rounds, and the ratios.

``--columns``: blocks down the columns (``axis=0``) of a 2-D float32 array, MX and NVFP4,
to nearest and stochastically: ``lpsim.quantize`` of the numpy array
(``lpsim.blocks.columns``: bands of rows read as they lie), the general route (a tiled
transposing copy and the row kernel, forced here), torch's transposing copy followed by
the row kernel (what ``lpsim.torch``'s wgrad ran before), the two with stats, and the row
kernel alone on a transposed copy made beforehand; each case in each round, minimum over
the rounds, values and counts checked equal.

``--hadamard``: a recipe's wgrad operand (RHT of 16 along the tokens, then blocks down the
columns), with stats as simulated training's telemetry asks: the transform
(``lpsim.torch.hadamard.rht_tokens``) then ``lpsim.quantize`` along axis 0, against
``lpsim.blocks.quantize_hadamard_columns`` (each band transformed in the cache before it is
quantized); minimum over alternating rounds, values and counts checked equal.

``--moved``: blocks along axis 0 of a 2-D float32 array by the general route, which arrays
the column route does not take run (other shapes and dtypes; forced here):
``lpsim.quantize`` (a tiled copy with the axis last, ``lpsim.blocks.layout``), the same
with numpy's copy, the kernel alone on a transposed copy made beforehand, and the copies
alone (numpy's, the tiled one, torch's); minimum over the rounds, values checked equal.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # benchmarks/timing.py

CASES = [("mxfp8_e4m3", "nearest"), ("mxfp8_e4m3", "stochastic"), ("mxfp4", "nearest"),
         ("mxfp4", "stochastic"), ("nvfp4", "nearest"), ("nvfp4", "stochastic")]
#: the issue's targets: (peer, least ratio lpsim / peer) on the CPU
TARGETS = {"copy": 0.5, "gfloat": 20.0}


# lpsim's threads, read without starting numba's threading layer (which would set the
# OpenMP thread count that torch shares)
from lpsim.cpu import threads as lpsim_threads  # noqa: E402
from timing import int_in, output_file, positive_int, require_cuda, revision  # noqa: E402


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def median_seconds(fn, repeats: int, sync=None) -> float:
    return timed(fn, repeats, sync)[0]


def timed(fn, repeats: int, sync=None) -> tuple[float, float]:
    """Median wall seconds and median CPU seconds of this process (all its threads) per
    call: on a shared machine the CPU time says what the work costs, the wall time what
    this run got."""
    fn()
    sync and sync()
    walls, cpus = [], []
    for _ in range(repeats):
        start, cpu = time.perf_counter(), time.process_time()
        fn()
        sync and sync()
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    return float(np.median(walls)), float(np.median(cpus))


def paired(fn, reference, repeats: int) -> tuple[float, float, float]:
    """(fn's median wall seconds, its median CPU seconds, reference's median wall seconds),
    the two timed in alternation: on a shared machine whose speed drifts by tens of percent
    from minute to minute, a ratio of the two is then measured under the same conditions."""
    fn()
    reference()
    walls, cpus, refs = [], [], []
    for _ in range(repeats):
        start = time.perf_counter()
        reference()
        refs.append(time.perf_counter() - start)
        start, cpu = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    return float(np.median(walls)), float(np.median(cpus)), float(np.median(refs))


def machine(device: str) -> str:
    import numba
    import torch
    from timing import cpu_model
    model = cpu_model()
    if device == "cuda":
        model = torch.cuda.get_device_name() + f" (host {model})"
    return (f"{model}, {os.cpu_count()} cores (numba threads {lpsim_threads()}); "
            f"numpy {np.__version__}, numba {numba.__version__}, torch {torch.__version__}")


def torchao_fake_quantize(name):
    """torchao's cast and dequantize for a preset, or None where torchao has none."""
    import torch
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx
    if name == "nvfp4":
        from torchao.prototype.mx_formats.kernels import f4_unpacked_to_f32, unpack_uint4
        from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize

        def run(t):
            scales, data = nvfp4_quantize(t, 16)
            q = f4_unpacked_to_f32(unpack_uint4(data)).reshape(t.shape[0], -1, 16)
            return (q * scales.float().reshape(t.shape[0], -1, 1)).reshape(t.shape)
        return run
    dtype = {"mxfp8_e4m3": torch.float8_e4m3fn, "mxfp4": torch.float4_e2m1fn_x2}[name]

    def run(t):
        scale, data = to_mx(t, dtype, 32, ScaleCalculationMode.FLOOR)
        return to_dtype(data, scale, dtype, 32, torch.float32)
    return run


def gfloat_fake_quantize(name):
    from gfloat.block import compute_scale_amax, quantize_block
    from gfloat import formats
    info = {"mxfp8_e4m3": formats.format_info_mxfp8_e4m3,
            "mxfp4": formats.format_info_mxfp4_e2m1}.get(name)
    if info is None:
        return None

    def run(x):
        flat = x.reshape(-1, 32).astype(np.float64)
        return np.concatenate([quantize_block(info, b, compute_scale_amax) for b in flat])
    return run


def cpu_rows(log2n: int, repeats: int):
    import lpsim
    import torch
    from tqdm import tqdm
    n = 1 << log2n
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32).reshape(-1, 4096)
    t = torch.from_numpy(x)
    out = np.empty_like(x)
    rows = []
    wall, cpu = timed(lambda: np.copyto(out, x), repeats)
    copy = n / wall / 1e6
    rows.append(dict(case="np.copyto(out, x)", format="-", mode="-", melems=copy,
                     cpu_melems=n / cpu / 1e6))
    small = x[:2, :].copy()                      # gfloat: 8192 elements, Python per element
    for name, mode in tqdm(CASES, desc="cases", file=sys.stderr):
        wall, cpu, copy_wall = paired(lambda: lpsim.quantize(x, name, mode, seed=1, out=out),
                                      lambda: np.copyto(out, x), repeats)
        ours = n / wall / 1e6
        rows.append(dict(case="lpsim.quantize(x, out=...)", format=name, mode=mode,
                         melems=ours, vs_copy=wall and copy_wall / wall,
                         cpu_melems=n / cpu / 1e6))
        if mode != "nearest":
            continue
        run = gfloat_fake_quantize(name)
        if run is not None:
            g = small.size / median_seconds(lambda: run(small), 1) / 1e6
            rows.append(dict(case="gfloat quantize_block (floor)", format=name, mode=mode,
                             melems=g, vs_copy=g / copy, ratio=ours / g, peer="gfloat"))
        run = torchao_fake_quantize(name)
        wall, cpu = timed(lambda: run(t), repeats)
        ta = n / wall / 1e6
        rows.append(dict(case="torchao cast + dequantize", format=name, mode=mode,
                         melems=ta, vs_copy=ta / copy, ratio=ours / ta, peer="torchao",
                         cpu_melems=n / cpu / 1e6))
    tiny, tiny_out = x[:1, :32].copy(), np.empty((1, 32), np.float32)
    for name in dict.fromkeys(name for name, _ in CASES):   # the fixed cost of one call
        ours = median_seconds(lambda: lpsim.quantize(tiny, name, seed=1, out=tiny_out), 200)
        run = torchao_fake_quantize(name)
        theirs = median_seconds(lambda: run(torch.from_numpy(tiny)), 200)
        rows.append(dict(case="per call, 32 elements (us)", format=name, mode="nearest",
                         us=ours * 1e6, torchao_us=theirs * 1e6))
    return rows, (f"n = 2**{log2n} float32 (rows of 4096), median of {repeats} runs; "
                  "Melem/cpu-s: per second of CPU time summed over threads; lpsim's 'vs copy': "
                  "against a copy timed in alternation with it")


@contextlib.contextmanager
def general_counting():
    """Counted calls take the general kernel (the route before the word kernel counted):
    :func:`lpsim.blocks.kernels.takes_words` refuses counters while this is open, and no
    call takes a plan an earlier call cached (``quantize_cached``, which runs the word
    kernel without asking takes_words)."""
    import lpsim.blocks
    from lpsim.blocks import fake_quantize, kernels
    real, cached = kernels.takes_words, fake_quantize.quantize_cached

    def takes_words(x2, bp, want_q, want_counts):
        return real(x2, bp, want_q, want_counts) and not want_counts
    fake_quantize.takes_words = kernels.takes_words = takes_words
    fake_quantize.quantize_cached = lpsim.blocks.quantize_cached = lambda *a, **k: None
    try:
        yield
    finally:
        fake_quantize.takes_words = kernels.takes_words = real
        fake_quantize.quantize_cached = lpsim.blocks.quantize_cached = cached


def alternating_best(cases: dict, repeats: int):
    """Each case of ``cases`` (name: a function of no arguments) once a round, in order, for
    ``repeats`` rounds after one that warms up: (the least seconds per case, what each
    returned in the last round)."""
    best = dict.fromkeys(cases, float("inf"))
    values = {}
    for _ in range(repeats + 1):
        for case, fn in cases.items():
            start = time.perf_counter()
            values[case] = fn()
            best[case] = min(best[case], time.perf_counter() - start)
    return best, values


def counted_rows(shape, repeats: int):
    """Per (format, mode): the minimum over ``repeats`` rounds of lpsim.quantize's time
    without stats, with stats, and with stats on the general kernel, each case once a
    round; checks that both counted routes give the same values and stats."""
    import lpsim
    from lpsim.blocks import BlockStats
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    rows = []
    for name in ("mxfp8_e4m3", "mxfp4", "nvfp4"):
        for mode in ("nearest", "stochastic"):
            stats = {"word": BlockStats(), "general": BlockStats()}
            values = {}

            def counted(route):
                stats[route].reset()
                values[route] = lpsim.quantize(x, name, mode, seed=1, stats=stats[route])

            def general():
                with general_counting():
                    counted("general")
            cases = {"uncounted": lambda: lpsim.quantize(x, name, mode, seed=1),
                     "counted": lambda: counted("word"), "general counted": general}
            best, _ = alternating_best(cases, repeats)
            assert values["word"].tobytes() == values["general"].tobytes(), (name, mode)
            assert stats["word"].as_dict() == stats["general"].as_dict(), (name, mode)
            rows.append(dict(format=name, mode=mode, **{k: v * 1e3 for k, v in best.items()}))
    return rows


def columns_rows(shape, repeats: int):
    """Per format: the minimum over ``repeats`` rounds of lpsim.quantize along axis 0 by the
    columns, by the general route, and of torch's transposing copy plus the row kernel,
    each also with stats (a BlockStats: simulated training's telemetry), and of the row
    kernel alone on a transposed copy made beforehand (the floor: one pass over memory);
    checks that they give the same values and counts."""
    import torch
    import lpsim
    from lpsim.blocks import BlockStats, fake_quantize
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    t = torch.from_numpy(x)
    xt = np.ascontiguousarray(x.T)
    rows = []

    def general(name, mode):
        with general_route(fake_quantize):
            return lpsim.quantize(x, name, mode, axis=0, seed=1)
    for name, mode in (("mxfp8_e4m3", "nearest"), ("mxfp4", "nearest"), ("nvfp4", "nearest"),
                       ("mxfp4", "stochastic"), ("nvfp4", "stochastic")):
        stats = {"columns, stats": BlockStats(), "torch copy + rows, stats": BlockStats()}
        cases = {"columns": lambda: lpsim.quantize(x, name, mode, axis=0, seed=1),
                 "general": lambda: general(name, mode),
                 "torch copy + rows": lambda: lpsim.quantize(t.t().contiguous(), name, mode,
                                                             seed=1).t(),
                 "columns, stats": lambda: lpsim.quantize(x, name, mode, axis=0, seed=1,
                                                          stats=stats["columns, stats"]),
                 "torch copy + rows, stats": lambda: lpsim.quantize(
                     t.t().contiguous(), name, mode, seed=1,
                     stats=stats["torch copy + rows, stats"]).t(),
                 "rows alone": lambda: lpsim.quantize(xt, name, mode, seed=1).T}
        best, values = alternating_best(cases, repeats)
        want = np.asarray(values["general"])
        for case in cases:
            assert np.array_equal(np.asarray(values[case]).view(np.int32), want.view(np.int32))
        a, b = stats.values()
        assert np.array_equal(a.counts, b.counts) and a.blocks == b.blocks \
            and a.clipped_scales == b.clipped_scales and a.flushed_blocks == b.flushed_blocks
        rows.append(dict(format=name, mode=mode, **{k: v * 1e3 for k, v in best.items()}))
    return rows


def hadamard_rows_table(shape, repeats: int):
    """Per format and rounding: the minimum over ``repeats`` alternating rounds of the RHT
    then the column quantization, and of the two made band by band; each with stats, values
    and counts checked equal."""
    import torch
    import lpsim
    from lpsim.blocks import BlockStats, quantize_hadamard_columns
    from lpsim.blocks.counters import add_counts
    from lpsim.torch.hadamard import factors, rht_signs, rht_tokens
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    t = torch.from_numpy(x)
    signs = rht_signs(0, 0, 0, 16)
    c = factors(signs, torch.float32, "cpu").numpy()
    rows = []
    for name, mode in (("mxfp8_e4m3", "nearest"), ("nvfp4", "nearest"),
                       ("nvfp4", "stochastic")):
        stats = {"rht then columns": BlockStats(), "band by band": BlockStats()}

        def fused():
            q = quantize_hadamard_columns(x, c, name, mode, seed=1, want_counts="totals")
            add_counts(stats["band by band"], q.counts, x.size, q.scales.size)
            return q.values
        cases = {"rht then columns": lambda: lpsim.quantize(
                     rht_tokens(t, signs).numpy(), name, mode, axis=0, seed=1,
                     stats=stats["rht then columns"]),
                 "band by band": fused}
        best, values = alternating_best(cases, repeats)
        a, b = (np.asarray(values[k]) for k in cases)
        assert np.array_equal(a.view(np.int32), b.view(np.int32))
        a, b = stats.values()
        assert np.array_equal(a.counts, b.counts) and a.blocks == b.blocks \
            and a.clipped_scales == b.clipped_scales and a.flushed_blocks == b.flushed_blocks
        rows.append(dict(format=name, mode=mode, **{k: v * 1e3 for k, v in best.items()}))
    return rows


@contextlib.contextmanager
def general_route(fake_quantize):
    """lpsim.quantize along axis 0 by the general route (the column route refused)."""
    taken = fake_quantize.takes_columns
    fake_quantize.takes_columns = lambda *a: False
    try:
        yield
    finally:
        fake_quantize.takes_columns = taken


def moved_rows(shape, repeats: int):
    """Per (format, rounding): the minimum over ``repeats`` rounds of lpsim.quantize along
    axis 0 with the tiled copy and with numpy's, of the kernel alone on a transposed copy,
    and of each copy alone; checks that the quantizations give the same values."""
    import torch
    import lpsim
    from lpsim.blocks import fake_quantize
    from lpsim.blocks.layout import moved_contiguous
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    xt, t = np.ascontiguousarray(x.T), torch.from_numpy(x)

    def tiled(name, mode):
        with general_route(fake_quantize):
            return lpsim.quantize(x, name, mode, axis=0, seed=1)

    def numpys(name, mode):
        fake_quantize.moved_contiguous = lambda a, axis: np.ascontiguousarray(
            np.moveaxis(a, axis, -1))
        try:
            return tiled(name, mode)
        finally:
            fake_quantize.moved_contiguous = moved_contiguous
    rows = []
    for name, mode in (("nvfp4", "nearest"), ("mxfp8_e4m3", "stochastic")):
        cases = {"tiled copy + kernel": lambda: tiled(name, mode),
                 "numpy copy + kernel": lambda: numpys(name, mode),
                 "kernel alone": lambda: lpsim.quantize(xt, name, mode, seed=1).T,
                 "numpy copy": lambda: np.ascontiguousarray(x.T),
                 "tiled copy": lambda: moved_contiguous(x, 0),
                 "torch copy": lambda: t.t().contiguous()}
        best, values = alternating_best(cases, repeats)
        want = np.asarray(values["kernel alone"]).view(np.int32)
        for case in ("tiled copy + kernel", "numpy copy + kernel"):
            assert np.array_equal(np.asarray(values[case]).view(np.int32), want), case
        rows.append(dict(format=name, mode=mode, **{k: v * 1e3 for k, v in best.items()}))
    return rows


def cuda_rows(log2n: int, repeats: int):
    import torch
    import lpsim
    from tqdm import tqdm
    n = 1 << log2n
    t = torch.randn(n // 4096, 4096, device="cuda")
    sync = torch.cuda.synchronize
    copy = n / median_seconds(lambda: t.clone(), repeats, sync) / 1e6
    rows = [dict(case="torch clone (device copy)", format="-", mode="-", melems=copy)]
    for name, mode in tqdm(CASES, desc="cases", file=sys.stderr):
        ours = n / median_seconds(lambda: lpsim.quantize(t, name, mode, seed=1), repeats,
                                  sync) / 1e6
        rows.append(dict(case="lpsim.quantize (lpsim_cuda)", format=name, mode=mode,
                         melems=ours, vs_copy=ours / copy))
        if mode == "nearest":
            run = torchao_fake_quantize(name)
            ta = n / median_seconds(lambda: run(t), repeats, sync) / 1e6
            rows.append(dict(case="torchao cast + dequantize", format=name, mode=mode,
                             melems=ta, vs_copy=ta / copy, ratio=ours / ta, peer="torchao"))
    # NVFP4 at a given tensor scale: one pass over the data, where a found scale takes two
    # (an amax pass first: 12 bytes an element moved, so at most 2/3 of a copy's speed)
    import lpsim_cuda.blocks
    given = n / median_seconds(lambda: lpsim_cuda.blocks.quantize(t, "nvfp4", "nearest",
                                                                  tensor_scale=0.25),
                               repeats, sync) / 1e6
    rows.append(dict(case="lpsim_cuda.blocks, tensor scale given", format="nvfp4",
                     mode="nearest", melems=given, vs_copy=given / copy))
    # a bfloat16 activation's MXFP8 fake-quantize: lpsim reads its codes, torchao casts it
    tb = t.to(torch.bfloat16)
    ours = n / median_seconds(lambda: lpsim.quantize(tb, "mxfp8_e4m3", "nearest"), repeats,
                              sync) / 1e6
    rows.append(dict(case="lpsim.quantize (lpsim_cuda), bfloat16 in", format="mxfp8_e4m3",
                     mode="nearest", melems=ours, vs_copy=ours / copy))
    run = torchao_fake_quantize("mxfp8_e4m3")
    ta = n / median_seconds(lambda: run(tb), repeats, sync) / 1e6
    rows.append(dict(case="torchao cast + dequantize, bfloat16 in", format="mxfp8_e4m3",
                     mode="nearest", melems=ta, vs_copy=ta / copy, ratio=ours / ta,
                     peer="torchao"))
    # host time of one call: a block of 32 elements, 1000 calls between synchronizations
    # (the routes a request's first call builds: lpsim_cuda.block_groups.BlockRoute, and
    # ScaledBlockRoute for NVFP4, whose tensor scale each call finds on the device)
    # (a bfloat16 source has no route: its call's host time, made as the bfloat16-in row
    # above makes its calls, says how much of that row is the host's)
    # (counted calls and a generator's, as a simulated training step with telemetry makes
    # them: their routes, lpsim_cuda.block_groups.CountedBlockRoute and ScaledBlockRoute)
    tiny = torch.randn(1, 32, device="cuda")
    tiny16 = tiny.to(torch.bfloat16)
    stats, generator = lpsim.blocks.BlockStats(), lpsim.Generator(0)
    for name, fn in (("lpsim.quantize mxfp8_e4m3 (one block)",
                      lambda: lpsim.quantize(tiny, "mxfp8_e4m3", "nearest", out=tiny)),
                     ("lpsim.quantize mxfp8_e4m3 SR, generator, counted (one block)",
                      lambda: lpsim.quantize(tiny, "mxfp8_e4m3", "stochastic",
                                             generator=generator, stats=stats)),
                     ("lpsim.quantize nvfp4 SR, generator, counted (two blocks)",
                      lambda: lpsim.quantize(tiny, "nvfp4", "stochastic",
                                             generator=generator, stats=stats)),
                     ("lpsim.quantize mxfp8_e4m3, bfloat16 in (one block)",
                      lambda: lpsim.quantize(tiny16, "mxfp8_e4m3", "nearest")),
                     ("lpsim.quantize nvfp4 (two blocks)",
                      lambda: lpsim.quantize(tiny, "nvfp4", "nearest", out=tiny)),
                     ("torch t.add_(0)", lambda: tiny.add_(0))):
        fn()
        sync()
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(1000):
                fn()
            sync()
            best = min(best, (time.perf_counter() - start) / 1000)
        rows.append(dict(case=f"host time of a call: {name}", format="-", mode="-",
                         melems=0.0, call_us=best * 1e6))
    return rows, f"n = 2**{log2n} float32 on the GPU, median of {repeats} runs"


def scaled_mm_rows():
    """hopper-fp8 against torch._scaled_mm: outputs equal bit for bit, per K."""
    import torch

    import lpsim
    import lpsim.ops
    rows = []
    for k in (16, 32, 64, 128, 256, 512, 1024, 2048, 4096):
        rng = np.random.default_rng(k)
        a = lpsim.quantize(rng.standard_normal((64, k)).astype(np.float32), "e4m3fn")
        b = lpsim.quantize(rng.standard_normal((k, 64)).astype(np.float32), "e4m3fn")
        ta = torch.from_numpy(a).cuda().to(torch.float8_e4m3fn)
        tb = torch.from_numpy(b).cuda().to(torch.float8_e4m3fn).t().contiguous().t()
        one = torch.ones((), device="cuda")
        # hopper-fp8 stands for use_fast_accum=True, the promoting model for the default
        for name, fast in (("hopper-fp8", True), ("hopper-fp8-promote128", False),
                           ("fp32", False)):
            got = torch._scaled_mm(ta, tb, scale_a=one, scale_b=one, out_dtype=torch.float32,
                                   use_fast_accum=fast).cpu().numpy().astype(np.float64)
            want = lpsim.ops.matmul(a, b, model=name)
            rows.append(dict(k=k, model=name, fast_accum=fast, outputs=got.size,
                             equal=int(np.sum(got == want)),
                             max_rel=float(np.max(np.abs(got - want) / np.maximum(
                                 np.abs(want), 1e-30)))))
    return rows


def plot(rows, header, path: str) -> None:
    """Bars of Melem/s per format (lpsim nearest and stochastic, torchao, gfloat) on a log
    scale, with the copy and the 0.5x-copy target as lines."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    formats = list(dict.fromkeys(r["format"] for r in rows if r["format"] != "-"))
    ours = [r for r in rows if r["case"].startswith("lpsim")]
    series = [("lpsim nearest", lambda r: r in ours and r["mode"] == "nearest"),
              ("lpsim stochastic", lambda r: r in ours and r["mode"] == "stochastic"),
              ("torchao cast", lambda r: r.get("peer") == "torchao"),
              ("gfloat quantize_block", lambda r: r.get("peer") == "gfloat")]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.2
    for k, (label, pick) in enumerate(series):
        values = [next((r["melems"] for r in rows if r["format"] == f and pick(r)), np.nan)
                  for f in formats]
        ax.bar(np.arange(len(formats)) + (k - 1.5) * width, values, width, label=label)
    copy = rows[0]["melems"]
    ax.axhline(copy, color="k", lw=1, label=f"copy ({copy:.0f} Melem/s)")
    ax.axhline(0.5 * copy, color="k", lw=1, ls="--", label="target: 0.5x copy")
    ax.set_yscale("log")
    ax.set_xticks(np.arange(len(formats)), formats)
    ax.set_ylabel("million elements per second")
    ax.set_title(header[0].lstrip("# ").split(";")[0], fontsize=8)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def print_rows(rows: list[dict], columns: list[tuple]) -> None:
    """A table of ``rows`` by format and mode: ``columns`` of (title, width, key), a key a
    row's field or a pair (a, b) for the ratio a / b, each printed to two decimals."""
    print(f"{'format':<11} {'mode':<11} " + " ".join(f"{t:>{w}}" for t, w, _ in columns))
    for r in rows:
        cells = [r[k] if isinstance(k, str) else r[k[0]] / r[k[1]] for _, _, k in columns]
        print(f"{r['format']:<11} {r['mode']:<11} "
              + " ".join(f"{v:>{w}.2f}" for v, (_, w, _) in zip(cells, columns)))


def heading(header: list[str], args, what: str) -> None:
    """Print the header and a line naming the array, what is timed and how."""
    print("\n".join(header + [f"# float32 {args.shape[0]}x{args.shape[1]}, {what}; ms, "
                              f"minimum of {args.repeats} alternating rounds"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log2n", type=int_in(12, 30),
                        help="2**log2n elements, 12 .. 30 (default 22; on the GPU 26: at 2**22 "
                             "each timed call there is mostly its synchronisation)")
    parser.add_argument("--repeats", type=positive_int, default=5,
                        help="timed rounds (each case in turn; the minimum is kept)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where the formats are rounded (cuda: lpsim_cuda's kernels)")
    parser.add_argument("--scaled-mm", action="store_true",
                        help="on a GPU: an MXFP8 GEMM of lpsim's codes and scales by "
                             "torch._scaled_mm against the simulated one")
    parser.add_argument("--counted", action="store_true",
                        help="the cost of counting (stats) on the CPU, before and now")
    parser.add_argument("--columns", action="store_true",
                        help="blocks down the columns (axis=0) on the CPU: the column route, "
                             "the general one and torch's transposing copy")
    parser.add_argument("--moved", action="store_true",
                        help="blocks along axis 0 on the CPU where the column route does not "
                             "apply: the tiled copy against numpy's")
    parser.add_argument("--hadamard", action="store_true",
                        help="a recipe's wgrad operand on the CPU: the RHT then the columns, "
                             "against the two band by band")
    parser.add_argument("--shape", type=positive_int, nargs=2, default=(2048, 1024),
                        help="--counted, --columns, --moved, --hadamard: the float32 array's "
                             "shape")
    parser.add_argument("--json", type=output_file,
                        help="also write the table as JSON to this path")
    parser.add_argument("--png", type=output_file,
                        help="write a bar chart of the throughput table here")
    parser.add_argument("--note", help="a line for the header (e.g. what else ran)")
    args = parser.parse_args()
    if args.device == "cuda" or args.scaled_mm:
        require_cuda("bench_blocks" + (" --scaled-mm" if args.scaled_mm else " --device cuda"))
    log2n = args.log2n if args.log2n is not None else (26 if args.device == "cuda" else 22)
    stamp = datetime.datetime.now().isoformat(timespec="seconds")
    header = [f"# lpsim block-scaled formats, {stamp}, {machine(args.device)}",
              f"# lpsim {revision()}; command: python benchmarks/bench_blocks.py "
              + " ".join(sys.argv[1:])] + ([f"# {args.note}"] if args.note else [])
    if args.counted:
        rows = counted_rows(tuple(args.shape), args.repeats)
        heading(header, args, "lpsim.quantize with and without stats=BlockStats()")
        print_rows(rows, [("uncounted", 10, "uncounted"), ("counted", 9, "counted"),
                          ("general", 9, "general counted"),
                          ("counted/unc", 12, ("counted", "uncounted")),
                          ("general/unc", 12, ("general counted", "uncounted")),
                          ("general/counted", 16, ("general counted", "counted"))])
    elif args.columns:
        rows = columns_rows(tuple(args.shape), args.repeats)
        heading(header, args, "blocks down the columns")
        print("# stats: with a BlockStats (counted); rows alone: the row kernel on a transposed "
              "copy made beforehand (one pass)")
        print(f"{'format':<11} {'mode':<11} {'columns':>8} {'stats':>7} {'general':>8} "
              f"{'torch copy + rows':>18} {'stats':>7} {'rows alone':>11} "
              f"{'torch/columns':>14} {'(stats)':>8} {'columns/rows alone':>19}")
        for r in rows:
            c, cs, g = r["columns"], r["columns, stats"], r["general"]
            tc, ts, ra = r["torch copy + rows"], r["torch copy + rows, stats"], r["rows alone"]
            print(f"{r['format']:<11} {r['mode']:<11} {c:>8.2f} {cs:>7.2f} {g:>8.2f} "
                  f"{tc:>18.2f} {ts:>7.2f} "
                  f"{ra:>11.2f} {tc / c:>14.2f} {ts / cs:>8.2f} {c / ra:>19.2f}")
    elif args.hadamard:
        rows = hadamard_rows_table(tuple(args.shape), args.repeats)
        heading(header, args, "RHT of 16 along axis 0 then blocks down it, with stats")
        print_rows(rows, [("rht then columns", 17, "rht then columns"),
                          ("band by band", 13, "band by band"),
                          ("speed-up", 9, ("rht then columns", "band by band"))])
    elif args.moved:
        rows = moved_rows(tuple(args.shape), args.repeats)
        names = ["tiled copy + kernel", "numpy copy + kernel", "kernel alone", "numpy copy",
                 "tiled copy", "torch copy"]
        heading(header, args, "blocks along axis 0")
        print(f"{'format':<11} {'mode':<11} " + " ".join(f"{n:>19}" for n in names))
        for r in rows:
            print(f"{r['format']:<11} {r['mode']:<11} "
                  + " ".join(f"{r[n]:>19.2f}" for n in names))
    elif args.scaled_mm:
        rows = scaled_mm_rows()
        print("\n".join(header))
        print(f"{'K':>6} {'model':<24} {'equal/outputs':>14} {'max rel diff':>13}")
        for r in rows:
            print(f"{r['k']:>6} {r['model']:<24} {r['equal']:>7}/{r['outputs']:<6} "
                  f"{r['max_rel']:>13.3g}")
    else:
        rows, what = (cuda_rows if args.device == "cuda" else cpu_rows)(log2n,
                                                                       args.repeats)
        load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
        print("\n".join(header + [f"# {what}; load average at the end: {load}"]))
        print(f"{'case':<32} {'format':<11} {'mode':<11} {'Melem/s':>9} {'vs copy':>8} "
              f"{'lpsim/peer':>11} {'Melem/cpu-s':>12}")
        for r in [r for r in rows if "us" not in r and "call_us" not in r]:
            ratio = f"{r['ratio']:.2f}x" if "ratio" in r else ""
            vs = f"{r['vs_copy']:.3f}" if "vs_copy" in r else "1.000"
            per_cpu = f"{r['cpu_melems']:.4g}" if "cpu_melems" in r else ""
            print(f"{r['case']:<32} {r['format']:<11} {r['mode']:<11} {r['melems']:>9.4g} "
                  f"{vs:>8} {ratio:>11} {per_cpu:>12}")
        for r in [r for r in rows if "us" in r]:
            print(f"# fixed cost, {r['format']}: lpsim {r['us']:.1f} us per call on 32 elements, "
                  f"torchao {r['torchao_us']:.1f} us")
        for r in [r for r in rows if "call_us" in r]:
            print(f"# {r['case']}: {r['call_us']:.1f} us")
        if args.device == "cpu":
            print("# targets (issue 14): lpsim >= 0.5x copy and >= 20x gfloat")
            for r in rows:
                if r["case"].startswith("lpsim") and r["mode"] == "nearest":
                    g = next((q for q in rows if q.get("peer") == "gfloat"
                              and q["format"] == r["format"]), None)
                    verdict = [f"vs copy {r['vs_copy']:.2f} "
                               f"({'met' if r['vs_copy'] >= TARGETS['copy'] else 'NOT met'})"]
                    if g:
                        met = "met" if g["ratio"] >= TARGETS["gfloat"] else "NOT met"
                        verdict.append(f"vs gfloat {g['ratio']:.0f}x ({met})")
                    print(f"#   {r['format']}: " + ", ".join(verdict))
    if args.png and not (args.scaled_mm or args.counted or args.columns or args.moved
                         or args.hadamard):      # tables of their own columns
        plot(rows, header, args.png)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"header": header, "rows": rows}, handle, indent=1)


if __name__ == "__main__":
    main()
