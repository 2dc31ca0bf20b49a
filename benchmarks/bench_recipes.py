"""A simulated low-precision training step against the plain BF16 step of the same model.

The model is the byte-level transformer of examples/train_lm.py (``--d-model``, ``--layers``,
``--context``, ``--batch``).  One step is zero_grad, forward, cross-entropy, backward and
torch's AdamW step.  Cases, timed in alternating rounds after two untimed steps (medians):

* ``bf16 autocast``: the plain BF16 step (FP32 weights, ``torch.autocast(bfloat16)``), the
  peer the issue's targets are stated against;
* ``fp32``: the same model in FP32;
* ``lpsim <preset>``: the FP32 model with ``lpsim.torch.simulate(model, preset)`` (every
  GEMM of every linear layer quantized, multiplied and rounded as the recipe says;
  telemetry on, as users run it).

Prints milliseconds per step and the ratios to the BF16 and FP32 steps (a CPU without bf16
instructions runs the BF16 step slower than the FP32 one: the FP32 ratio is the sterner);
targets: at most 2x the BF16 step for mxfp8 and nvfp4 on the CPU, 1.5x on a GPU.  The
cases "(no telemetry)" run ``simulate(..., telemetry=False)``; with ``--one-thread`` the
cases "(one lpsim thread)" run each preset's step with lpsim's kernels in the calling thread
alone (``lpsim.pool.limited(1)``), where torch's OpenMP threads spin on the other cores;
with ``--own-pool`` the cases "(own pool)" run them on lpsim's own pool only
(``lpsim.pool.own_threads()``), never on torch's spinning OpenMP team, which lpsim's
threaded kernels take by default (:mod:`lpsim.openmp_team`).

    python benchmarks/bench_recipes.py [--device cpu|cuda] [--d-model 256] [--layers 4]
        [--context 128] [--batch 16] [--rounds 9] [--json out.json] [--one-thread]
        [--own-pool] [--replay] [--profile]

``--replay`` then times, per lpsim case with telemetry, the fake quantizations of one step
alone (recorded, then run again back to back; best of 7), the CPU wgrad's fused RHT and
quantization included (and shown apart): a figure to compare from one commit to the next,
where whole steps on a shared VM vary by about 10%.

``--profile`` then runs one more step of each lpsim case under torch.profiler and prints where
it went: the step's wall time, the device's kernel time, the host's synchronisations and
copies (the calls that stop the host until the device catches up), the host time of lpsim's
parts (each kind of quantization, the GEMMs' products, the RHT; inclusive, a call's average
too) and the operators with the most host time of their own.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))

import lpsim  # noqa: E402
from lpsim.torch import simulate  # noqa: E402
from train_lm import ByteLM  # noqa: E402
from timing import cpu_model, output_file, positive_int, require_cuda, revision  # noqa: E402

PRESETS = ["bf16", "fp8_current", "mxfp8", "mxfp4", "nvfp4"]
#: (case, least ratio to the BF16 step) per device
TARGETS = {"cpu": {"lpsim mxfp8": 2.0, "lpsim nvfp4": 2.0},
           "cuda": {"lpsim mxfp8": 1.5, "lpsim nvfp4": 1.5}}


def make_step(case, args):
    torch.manual_seed(0)
    model = ByteLM(args.d_model, args.layers, args.heads, args.context).to(args.device)
    autocast = case == "bf16 autocast"
    if case.startswith("lpsim "):
        name, _, counted = case.split(" ", 1)[1].partition(" ")
        simulate(model, name, generator=lpsim.Generator(0), telemetry=counted != "(no telemetry)")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 256, (args.batch, args.context + 1), generator=gen).to(args.device)
    x, y = idx[:, :-1], idx[:, 1:]

    threads = (lambda: lpsim.pool.limited(1)) if case.endswith("(one lpsim thread)") else \
        lpsim.pool.own_threads if case.endswith("(own pool)") else contextlib.nullcontext

    def step():
        with threads():
            run()

    def run():
        opt.zero_grad()
        with torch.autocast(args.device, dtype=torch.bfloat16, enabled=autocast):
            logits = model(x)
        loss = F.cross_entropy(logits.float().reshape(-1, 256), y.reshape(-1))
        loss.backward()
        opt.step()
        if args.device == "cuda":
            torch.cuda.synchronize()
    return step


#: CUDA runtime and driver calls that wait for the device or copy through the host
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
         "cuStreamSynchronize", "cuCtxSynchronize")
COPIES = ("cudaMemcpy", "cudaMemcpyAsync", "cuMemcpyDtoH", "cuMemcpyHtoD", "cuMemcpyDtoHAsync",
          "cuMemcpyHtoDAsync")


@contextlib.contextmanager
def labelled():
    """lpsim's parts of a simulated step under torch.profiler labels: each quantization
    ("lpsim quantize <format> <rounding>"), each GEMM's product and the RHT, so that a
    profile gives their host time (inclusive) beside torch's operators."""
    import lpsim.torch.gemms as gemms
    from torch.profiler import record_function
    saved = {name: getattr(gemms, name) for name in ("lp_quantize", "_product", "rht_transposed",
                                                     "rht_tokens", "_rht_columns")}

    def wrap(name, fn):
        def run(*args, **kwargs):
            label = name
            if name == "lp_quantize":
                rounding = args[2] if len(args) > 2 else kwargs.get("rounding", "nearest")
                label = f"lpsim quantize {getattr(args[1], 'name', None) or args[1]} {rounding}"
            with record_function(label):
                return fn(*args, **kwargs)
        return run
    labels = {"lp_quantize": None, "_product": "lpsim product", "rht_transposed": "lpsim rht",
              "rht_tokens": "lpsim rht", "_rht_columns": "lpsim rht and quantize (CPU, wgrad)"}
    for name, fn in saved.items():
        setattr(gemms, name, wrap(labels[name] or name, fn))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(gemms, name, fn)


def profile_step(case, step, device, top=8):
    """One step of ``case`` under torch.profiler: printed lines (a few; see the docstring)."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    start = time.perf_counter()
    with labelled(), profile(activities=activities) as prof:
        step()
    wall = 1e3 * (time.perf_counter() - start)
    events = prof.key_averages()
    count = {e.key: e.count for e in events}
    syncs = sum(count.get(k, 0) for k in SYNCS)
    copies = sum(count.get(k, 0) for k in COPIES)
    device_ms = 1e-3 * sum(getattr(e, "self_device_time_total", 0) or 0 for e in events)
    lines = [f"# profile {case}: one step {wall:.1f} ms under the profiler, device kernels "
             f"{device_ms:.1f} ms, {syncs} synchronisations, {copies} copies"]
    ours = sorted((e for e in events if e.key.startswith("lpsim ")),
                  key=lambda e: e.cpu_time_total, reverse=True)
    lines += [f"#   {e.key[:60]:<60} host {e.cpu_time_total / 1e3:8.1f} ms  x{e.count}  "
              f"({e.cpu_time_total / e.count:.0f} us a call, inclusive)" for e in ours]
    ops = sorted((e for e in events if not e.key.startswith(("cuda", "cu", "lpsim "))),
                 key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    lines += [f"#   {e.key[:60]:<60} host {e.self_cpu_time_total / 1e3:8.1f} ms  x{e.count}"
              for e in ops]
    return lines


def replay_quantizations(step, repeats=7):
    """The time of the fake quantizations of one step of a simulated model alone: every
    ``lpsim.quantize`` call a step makes through :mod:`lpsim.torch.gemms`, and every fused
    RHT and quantization of a CPU wgrad operand (``_rht_columns``), is recorded (its input
    copied), then all are run again back to back ``repeats`` times; (calls, best ms, the
    fused calls' share of it).  The same figure from one commit to the next, where whole
    steps vary by 10% on a VM."""
    import lpsim.torch.gemms as gemms
    saved, calls = {name: getattr(gemms, name) for name in ("lp_quantize", "_rht_columns")}, []

    def recorder(name):
        def record(values, *args, **kwargs):
            calls.append((name, values.clone(), args,
                          {k: v for k, v in kwargs.items() if k != "out"}))
            return saved[name](values, *args, **kwargs)
        return record
    for name in saved:
        setattr(gemms, name, recorder(name))
    try:
        step()
    finally:
        for name, fn in saved.items():
            setattr(gemms, name, fn)
    best = (float("inf"), 0.0)
    for _ in range(repeats):
        fused, start = 0.0, time.perf_counter()
        for name, values, args, kwargs in calls:
            begun = time.perf_counter()
            saved[name](values, *args, **kwargs)
            if name == "_rht_columns":
                fused += time.perf_counter() - begun
        best = min(best, (time.perf_counter() - start, fused))
    return len(calls), 1e3 * best[0], 1e3 * best[1]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="where the steps run (cuda: lpsim_cuda's kernels)")
    parser.add_argument("--d-model", type=positive_int, default=256,
                        help="the model's width (a multiple of 32 and of --heads)")
    parser.add_argument("--layers", type=positive_int, default=4, help="transformer layers")
    parser.add_argument("--heads", type=positive_int, default=4, help="attention heads")
    parser.add_argument("--context", type=positive_int, default=128, help="tokens a sequence")
    parser.add_argument("--batch", type=positive_int, default=16, help="sequences a step")
    parser.add_argument("--rounds", type=positive_int, default=9,
                        help="timed rounds, each a step of every case in turn (medians)")
    parser.add_argument("--presets", nargs="+", default=PRESETS, choices=PRESETS,
                        help="the recipes timed (default: all)")
    parser.add_argument("--json", type=output_file, default=None,
                        help="also write the table as JSON to this path")
    parser.add_argument("--one-thread", action="store_true",
                        help="also each preset with lpsim's kernels in the calling thread "
                             "alone (lpsim.pool.limited(1)), telemetry on")
    parser.add_argument("--own-pool", action="store_true",
                        help="also each preset with lpsim's kernels on its own pool only, "
                             "never on torch's spinning OpenMP threads "
                             "(lpsim.pool.own_threads()), telemetry on")
    parser.add_argument("--replay", action="store_true",
                        help="then time each lpsim case's fake quantizations of one step "
                             "alone (replay_quantizations)")
    parser.add_argument("--profile", action="store_true",
                        help="then profile one step of each lpsim case (torch.profiler)")
    args = parser.parse_args(argv)
    if args.device == "cuda":
        require_cuda("bench_recipes --device cuda")
    cases = ["bf16 autocast", "fp32"] + [f"lpsim {p}" for p in args.presets] + \
        [f"lpsim {p} (no telemetry)" for p in args.presets] + \
        [f"lpsim {p} (one lpsim thread)" for p in args.presets if args.one_thread] + \
        [f"lpsim {p} (own pool)" for p in args.presets if args.own_pool]
    steps = {}
    for case in cases:
        steps[case] = make_step(case, args)
        for _ in range(2):                    # compiles, caches, allocator
            steps[case]()
    times = {case: [] for case in cases}
    for _ in range(args.rounds):
        for case, step in steps.items():
            start = time.perf_counter()
            step()
            times[case].append(time.perf_counter() - start)
    ms = {case: 1e3 * float(np.median(t)) for case, t in times.items()}
    # ratios as the median over rounds of each round's own ratio: the VM's speed drifts
    # between rounds by more than the cases differ, and a round's cases share its state
    ratio = {base: {case: float(np.median(np.array(t) / np.array(times[base])))
                    for case, t in times.items()} for base in ("bf16 autocast", "fp32")}
    device = torch.cuda.get_device_name() if args.device == "cuda" else cpu_model()
    commit = revision()
    print(f"# bench_recipes: device {device} ({os.cpu_count()} CPUs, torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads), "
          f"{datetime.date.today()}, commit {commit}")
    print(f"# command: python benchmarks/bench_recipes.py {' '.join(argv or sys.argv[1:])}")
    print(f"# ByteLM d_model {args.d_model}, {args.layers} layers, context {args.context}, "
          f"batch {args.batch}: {args.batch * args.context} tokens a step; median of "
          f"{args.rounds} rounds (ratios: the median of each round's own)")
    print(f"{'case':<36} {'ms/step':>9} {'x bf16 step':>12} {'x fp32 step':>12}  target")
    for case in cases:
        target = TARGETS[args.device].get(case)
        to_bf16, to_fp32 = ratio["bf16 autocast"][case], ratio["fp32"][case]
        verdict = "" if target is None else \
            f"<= {target}x: {'met' if to_bf16 <= target else 'NOT met'}"
        print(f"{case:<36} {ms[case]:>9.1f} {to_bf16:>12.2f} {to_fp32:>12.2f}  {verdict}")
    if args.replay:
        for case, step in steps.items():
            if case.startswith("lpsim ") and not case.endswith(")"):
                calls, best, fused = replay_quantizations(step)
                print(f"# replay {case}: {calls} quantizations of one step, {best:.1f} ms "
                      f"alone (best of 7; the CPU wgrad's fused RHT and quantization "
                      f"{fused:.1f} of it)", flush=True)
    if args.profile:
        for case, step in steps.items():
            if case.startswith("lpsim "):
                print("\n".join(profile_step(case, step, args.device)), flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"device": device, "date": str(datetime.date.today()), "commit": commit,
                       "platform": platform.platform(), "ms": ms,
                       "ratio_to_bf16": ratio["bf16 autocast"],
                       "ratio_to_fp32": ratio["fp32"]}, handle, indent=1)


if __name__ == "__main__":
    main()
