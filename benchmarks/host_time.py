"""The host's part of a routed CUDA call, measured on a machine without a GPU.

A torch CUDA call of lpsim (``lpsim.quantize`` of a tensor whose request has a cached route,
:mod:`lpsim_cuda.specialised` and :mod:`lpsim_cuda.block_groups`) spends its host time in
Python: the front's checks, the route's lookup, the keys, the output tensor, the flat launch
arguments and their packing into the driver's buffer (:mod:`lpsim_cuda.raw_launch`).  Issue
31 holds a call to 15 µs of host time on a GPU machine, where ``bench_quantize_gpu.py``
measures it whole.  This script measures the same Python path here: a CPU tensor that says
it is on a CUDA device, routes built as lpsim builds them but whose launch packs the
arguments and stops short of the driver, and the device queries answered by stubs.  The
peer, in the same run on the same tensor: torch's own ``t.add_(0)`` and
``torch.empty_like(t)``.  What the driver's ``cuLaunchKernel`` adds (a few µs) is not here.

    python benchmarks/host_time.py [--calls 20000] [--json PATH] [--out PATH]
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import shlex
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # benchmarks/timing.py
from timing import output_file, positive_int  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class OnDevice(torch.Tensor):
    """A CPU tensor that answers is_cuda as a CUDA tensor does (its device index None, the
    stubbed current device's)."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def is_cuda(self):
        return True


def _packing(route_class, **fields):
    """A route of ``route_class`` made without a kernel: its fields set, its launch the raw
    path's packing of the flat arguments (made once, then a call's values packed) and no
    driver call."""
    from lpsim_cuda import raw_launch

    class Packing(route_class):
        def launch(self, stream, blocks, flat):
            if self._block is None:
                self._block = raw_launch.ParamBlock(flat)
            self._block.pack(flat)
            self.calls += 1

    route = Packing.__new__(Packing)
    route._block, route.calls = None, 0
    for name, value in fields.items():
        setattr(route, name, value)
    if hasattr(route, "fix"):
        route.fix()
    return route


def stand_ins():
    """Stub the device queries and put packing routes where lpsim keeps its routes: the
    bf16 (nearest, stochastic) and MXFP8 requests and NVFP4 at a given tensor scale."""
    import lpsim_cuda.block_groups as block_groups
    import lpsim_cuda.specialised as specialised
    from lpsim.blocks import as_block_format
    from lpsim.blocks.decisions import block_params
    from lpsim.formats import parse_format
    from lpsim.rounding import mode_code
    from lpsim_cuda import launch
    front = importlib.import_module("lpsim.quantize")
    torch.cuda.current_device = lambda: None
    launch.torch_stream_handle = lambda device: 0
    launch._device_sms = lambda device: 132
    specialised._core_stream = lambda handle: None
    bf16, mx, nv = parse_format("bf16"), as_block_format("mxfp8_e4m3"), as_block_format("nvfp4")
    specialised._ROUTES = {
        (bf16, r, None, type(None), None, None, 0): _packing(
            specialised.Route, mode=mode_code(r), in_bytes=4, out_bytes=4, torch_dtype=None)
        for r in ("nearest", "stochastic")}
    # keyed as lpsim keys them: lpsim.quantize's front by the parsed format,
    # lpsim_cuda.blocks.quantize by the format as given
    block_groups._ROUTES = {
        (key, "nearest", None, type(None), None, 0, given): _packing(
            block_groups.BlockRoute, mode=0, bfmt=fmt, in_bytes=4, tail=(),
            scale=_scale(block_params(fmt, 0.25 if given else 1.0)))
        for key, fmt, given in ((mx, mx, False), ("nvfp4", nv, True))}
    front._TORCH_TYPES = front._TORCH_TYPES | {(__name__, "OnDevice")}
    front._TORCH_FRONT = None
    return list(specialised._ROUTES.values()) + list(block_groups._ROUTES.values())


def _scale(bp) -> tuple:
    return bp.pts, bp.pts_inv


def per_call(fn, calls: int) -> float:
    """Best of five runs of ``calls`` calls, in µs a call (after a warm-up)."""
    for _ in range(min(calls, 2000)):
        fn()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=positive_int, default=20000)
    parser.add_argument("--json", type=output_file, help="write the rows here")
    parser.add_argument("--out", type=output_file, help="also write the table here")
    args = parser.parse_args()
    import lpsim
    import lpsim_cuda.blocks
    routes = stand_ins()
    t = torch.randn(1, 32).as_subclass(OnDevice)    # one block: torch's add_ nearly all host
    g = lpsim.Generator(1)
    cases = {
        "lpsim.quantize bf16": lambda: lpsim.quantize(t, "bf16"),
        "lpsim.quantize bf16 SR, generator": lambda: lpsim.quantize(t, "bf16", "stochastic",
                                                                    generator=g),
        "lpsim.quantize mxfp8_e4m3": lambda: lpsim.quantize(t, "mxfp8_e4m3"),
        "lpsim_cuda.blocks.quantize nvfp4, tensor_scale given":
            lambda: lpsim_cuda.blocks.quantize(t, "nvfp4", tensor_scale=0.25),
        "torch t.add_(0) (peer)": lambda: t.add_(0),
        "torch.empty_like(t) (peer)": lambda: torch.empty_like(t),
    }
    got = {name: per_call(fn, args.calls) for name, fn in cases.items()}
    assert all(r.calls > args.calls for r in routes), "a case left its route"
    peer = got["torch t.add_(0) (peer)"]
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "?"
    head = [f"# lpsim host time of a routed CUDA call without a GPU, "
            f"{datetime.date.today()}, {platform.processor() or platform.machine()} "
            f"({os.cpu_count()} CPUs), torch {torch.__version__}, lpsim {commit}",
            "# command: python " + " ".join(shlex.quote(a) for a in sys.argv),
            "# a CPU tensor (1 x 32 float32) standing in for a CUDA one; routes pack their "
            "arguments, no driver call; best of 5 x --calls",
            f"{'case':<55} {'us/call':>8} {'x add_':>7}"]
    lines = head + [f"{name:<55} {us:>8.2f} {us / peer:>7.2f}" for name, us in got.items()]
    print("\n".join(lines))
    if args.out:
        with open(args.out, "w") as handle:
            handle.write("\n".join(lines) + "\n")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"header": head, "us_per_call": got}, handle, indent=1)


if __name__ == "__main__":
    main()
